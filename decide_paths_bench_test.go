package ratelimit

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/ratesync/ratelimit/internal/cputime"
	"github.com/ratesync/ratelimit/strategy/memory"
)

// BenchmarkDecidePaths compares decide's lean paths with the general path
// (decideAny) on the same calls, in turns of 16,384 calls on one OS thread,
// counting each path's thread CPU time apart: other jobs on a shared machine
// slow both alike, so the ratio holds better than that of separate runs. A
// hot key shows the decision's own cost; 100,000 keys add the table's cache
// misses. Local mode, and periodic mode with cold reads (of keys held, so
// none is read). Limits are high: every call is admitted and
// counted.
//
//	go test -run '^$' -bench BenchmarkDecidePaths -benchtime 200x .
func BenchmarkDecidePaths(b *testing.B) {
	ctx := context.Background()
	windows := []Limit{{Window: time.Second, Max: 1 << 40}, {Window: time.Minute, Max: 1 << 40}}
	bucket := []Limit{{Algorithm: TokenBucket, Window: time.Minute, Max: 1_000 * 60_000, Burst: 1 << 40}}
	keys := make([]string, 100_000)
	for i := range keys {
		keys[i] = fmt.Sprintf("client-%d", i)
	}
	cases := []struct {
		name   string
		limits []Limit
		lean   func(ns *Namespace, d *Decision, key string, limits []Limit) error
	}{
		{"windows2", windows, func(ns *Namespace, d *Decision, key string, limits []Limit) error {
			_, _, err := ns.decideWindows(ctx, d, key, 1, limits, true)
			return err
		}},
		{"bucket", bucket, func(ns *Namespace, d *Decision, key string, limits []Limit) error {
			_, _, err := ns.decideBucket(ctx, d, key, 1, limits, true)
			return err
		}},
	}
	for _, c := range cases {
		for _, run := range []struct {
			spread   int
			periodic bool
		}{{1, false}, {len(keys), false}, {1, true}, {len(keys), true}} {
			spread := run.spread
			name := c.name + "/hot"
			if spread > 1 {
				name = c.name + "/100k"
			}
			if run.periodic {
				name += "/periodic"
			}
			b.Run(name, func(b *testing.B) {
				const turn = 1 << 14
				runtime.LockOSThread()
				defer runtime.UnlockOSThread()
				reg := NewRegistry()
				defer func() { _ = reg.Close(ctx) }()
				cfg := Config{WindowSizes: []time.Duration{time.Second, time.Minute}, SyncRate: -1}
				if run.periodic { // with cold reads, as by default; the loop stays out
					cfg.SyncRate, cfg.Strategy = time.Hour, memory.New()
				}
				ns, err := reg.New(cfg)
				if err != nil {
					b.Fatal(err)
				}
				paths := []func(d *Decision, key string) error{
					func(d *Decision, key string) error { return c.lean(ns, d, key, c.limits) },
					func(d *Decision, key string) error {
						_, _, err := ns.decideAny(ctx, d, key, 1, c.limits, true)
						return err
					},
				}
				var spent [2]time.Duration
				var d Decision
				for _, key := range keys[:spread] { // every key held: no cold reads below
					if _, _, err := ns.decideAny(ctx, &d, key, 1, c.limits, true); err != nil {
						b.Fatal(err)
					}
				}
				n, k := 0, 0
				for b.Loop() {
					// The path that goes second finds the turn's keys in the
					// caches: each goes first every other turn.
					for q := range paths {
						p := (q + n/turn) % len(paths)
						call := paths[p]
						start := cputime.Thread()
						for i := range turn {
							if err := call(&d, keys[(k+i*7919)%spread]); err != nil || !d.Allowed {
								b.Fatal(d, err)
							}
						}
						spent[p] += cputime.Thread() - start
					}
					n += turn
					k += turn * 7919
				}
				lean, general := float64(spent[0])/float64(n), float64(spent[1])/float64(n)
				b.ReportMetric(lean, "lean-ns/call")
				b.ReportMetric(general, "general-ns/call")
				b.ReportMetric(lean/general, "lean/general")
				b.ReportMetric(0, "ns/op")
			})
		}
	}
}
