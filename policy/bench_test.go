package policy_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/ratesync/ratelimit/policy"
)

// BenchmarkResolve measures one resolution on a policy of 1,000 rules and
// 100,000 overrides, over 600 routes, 5 tiers and 50,000 keys (a fifth of
// them with overrides).
func BenchmarkResolve(b *testing.B) {
	doc, keys := bigDocument(1000, 100_000)
	s, err := policy.Compile(doc, 1, policy.Options{})
	if err != nil {
		b.Fatal(err)
	}
	h := policy.NewHolder(s)
	reqs := benchRequests()
	b.Run("serial", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			_ = h.Load().Resolve(reqs[i%len(reqs)], keys[(i*7919)%len(keys)], tiers[i%len(tiers)])
		}
	})
	b.Run("parallel", func(b *testing.B) {
		b.ReportAllocs()
		var seed atomic.Int64
		b.RunParallel(func(pb *testing.PB) {
			i := int(seed.Add(1) * 104729)
			for pb.Next() {
				_ = h.Load().Resolve(reqs[i%len(reqs)], keys[(i*7919)%len(keys)], tiers[i%len(tiers)])
				i++
			}
		})
	})
}

// BenchmarkCompile measures a reload of the same policy (1,000 rules,
// 100,000 overrides): Compile of a decoded document; Load of its text as
// yaml.v3 renders it (8.6 MB) and as encoding/json does (5.8 MB), both read
// by the fast reader; Load of the YAML by yaml.v3 alone, as for a document
// outside the fast reader's subset (and as every document was read before
// it); for reference, the JSON decoded by encoding/json and compiled; and a
// whole reload, what a node does when a version is published: a Watcher on
// a MemoryStore gets the new version, parses, compiles and swaps it in (the
// benchmark waits for OnInstall).
func BenchmarkCompile(b *testing.B) {
	doc, _ := bigDocument(1000, 100_000)
	b.Run("compile", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := policy.Compile(doc, 1, policy.Options{}); err != nil {
				b.Fatal(err)
			}
		}
	})
	yamlText, err := yaml.Marshal(doc)
	if err != nil {
		b.Fatal(err)
	}
	jsonText, err := json.Marshal(doc)
	if err != nil {
		b.Fatal(err)
	}
	// For reference: encoding/json into a Document (strict about unknown
	// fields, not about repeated keys), then Compile.
	stdlib := func(b []byte, v int64, o policy.Options) (*policy.Snapshot, error) {
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.DisallowUnknownFields()
		var d policy.Document
		if err := dec.Decode(&d); err != nil {
			return nil, err
		}
		return policy.Compile(&d, v, o)
	}
	for _, c := range []struct {
		name string
		text []byte
		load func([]byte, int64, policy.Options) (*policy.Snapshot, error)
	}{
		{"load-yaml", yamlText, policy.Load},
		{"load-json", jsonText, policy.Load},
		{"load-yaml-v3", yamlText, func(b []byte, _ int64, _ policy.Options) (*policy.Snapshot, error) { return policy.LoadSlow(b) }},
		{"json-stdlib-compile", jsonText, stdlib},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(c.text)))
			for b.Loop() {
				if _, err := c.load(c.text, 1, policy.Options{}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	b.Run("reload", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(yamlText)))
		// Two versions that differ, so that each one published is new.
		texts := [2][]byte{yamlText, bytes.Replace(yamlText, []byte("max: 100\n"), []byte("max: 101\n"), 1)}
		store := policy.NewMemoryStore()
		ctx := context.Background()
		if _, err := store.Append(ctx, texts[1]); err != nil {
			b.Fatal(err)
		}
		installed := make(chan int64, 1)
		w, err := policy.NewWatcher(ctx, store, policy.WatchOptions{PollInterval: time.Hour, Logger: slog.New(slog.DiscardHandler),
			OnInstall: func(s *policy.Snapshot) { installed <- s.Version() }})
		if err != nil {
			b.Fatal(err)
		}
		defer w.Close()
		<-installed // the version NewWatcher loads
		for i := 0; b.Loop(); i++ {
			n, err := store.Append(ctx, texts[i%2])
			if err != nil {
				b.Fatal(err)
			}
			if v := <-installed; v != n {
				b.Fatalf("installed %d, want %d", v, n)
			}
		}
		if st := w.Stats(); st.SlowParses != 0 {
			b.Fatalf("%d slow parses", st.SlowParses)
		}
	})
}
