package httplimit_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"runtime"
	"testing"
	"time"

	"github.com/ratesync/ratelimit"
	"github.com/ratesync/ratelimit/httplimit"
	"github.com/ratesync/ratelimit/internal/cputime"
	"github.com/ratesync/ratelimit/policy"
)

// BenchmarkPolicyMiddleware compares, in one run, the middleware without a
// policy (New with 500 route rules and a default) and the middleware on a
// policy of 1,000 rules (500 route rules on the same routes, 500 tier rules)
// and 100,000 per-key overrides, 1,000 allow and 1,000 deny entries. Both
// take the key from a header; 50,000 keys rotate, each on one of 500 routes
// and 5 tiers;
// limits are high enough that nothing is rejected. Policy overhead is
// policy minus rules (same routing work), or policy minus default-only (New
// without rules: no routing, no key prefix), or policy minus
// default-only+lookup (default-only after one lookup of the key in a Go map
// of the 100,000 override keys: the least a per-key override can cost), or
// policy minus default-only+lookup+route (also one lookup of the request's
// route in a Go map of the 500 routes: the least route rules add).
func BenchmarkPolicyMiddleware(b *testing.B) {
	const huge = 1 << 40
	lim := []ratelimit.Limit{{Window: time.Minute, Max: huge}}
	plim := []policy.Limit{{Window: policy.Duration(time.Minute), Max: huge}}
	tiers := []string{"", "free", "pro", "t3", "enterprise"}
	doc := &policy.Document{Default: &policy.Target{Limits: plim}, Overrides: map[string]policy.Target{}, Deny: &policy.DenyList{}}
	opts := httplimit.Options{KeyFunc: httplimit.KeyByHeader("X-Key"), Limits: lim}
	for i := range 1000 {
		r := policy.Rule{ID: fmt.Sprintf("r%d", i), Limits: plim, Match: policy.Match{Route: fmt.Sprintf("GET /api/v1/r%d", i/2)}}
		if i%2 == 1 {
			r.Match.Tier = tiers[1+(i/2)%4]
		} else {
			opts.Rules = append(opts.Rules, httplimit.Rule{Pattern: r.Match.Route, Limits: lim})
		}
		doc.Rules = append(doc.Rules, r)
	}
	var keys []string
	for i := range 100_000 {
		k := fmt.Sprintf("sk_ovr_%d", i)
		doc.Overrides[k] = policy.Target{Limits: []policy.Limit{{Window: policy.Duration(time.Minute), Max: huge - int64(i%10)}}}
		if i%10 == 0 {
			keys = append(keys, k)
		}
	}
	for i := range 1000 {
		doc.Allow = append(doc.Allow, fmt.Sprintf("sk_int_%d", i))
		doc.Deny.Keys = append(doc.Deny.Keys, fmt.Sprintf("sk_bad_%d*", i))
	}
	for i := range 40_000 {
		keys = append(keys, fmt.Sprintf("sk_plain_%d", i))
	}
	snap, err := policy.Compile(doc, 1, policy.Options{})
	if err != nil {
		b.Fatal(err)
	}
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusOK) })
	reqs := make([]*http.Request, 500) // each matches a rule of New's too
	for i := range reqs {
		reqs[i] = httptest.NewRequest("GET", fmt.Sprintf("/api/v1/r%d", i), nil)
		reqs[i].Header.Set("X-Key", "")
		reqs[i].Header.Set("X-Tier", "")
	}
	// serve sends request i of the sequence every variant sees to h;
	// serveFrom sends it from the first spread keys only.
	var serveFrom func(b *testing.B, h http.Handler, w *benchWriter, i, spread int)
	serve := func(b *testing.B, h http.Handler, w *benchWriter, i int) { serveFrom(b, h, w, i, len(keys)) }
	serveFrom = func(b *testing.B, h http.Handler, w *benchWriter, i, spread int) {
		clear(w.h)
		// A key always takes the same route and tier, so that every variant
		// counts the same number of counters (50,000).
		k := (i * 7919) % spread
		r := reqs[k%len(reqs)]
		r.Header["X-Key"][0] = keys[k]
		r.Header["X-Tier"][0] = tiers[k%len(tiers)]
		h.ServeHTTP(w, r)
		if w.code != http.StatusOK {
			b.Fatalf("status %d", w.code)
		}
	}
	warm := func(h http.Handler) {
		w := &benchWriter{h: make(http.Header)}
		for i := range 2 * len(reqs) { // the route caches
			h.ServeHTTP(w, reqs[i%len(reqs)])
		}
	}
	newNS := func(b *testing.B) *ratelimit.Namespace {
		reg := ratelimit.NewRegistry()
		b.Cleanup(func() { _ = reg.Close(context.Background()) })
		ns, err := reg.New(ratelimit.Config{WindowSizes: []time.Duration{time.Minute}, SyncRate: -1, MaxKeys: 1 << 20})
		if err != nil {
			b.Fatal(err)
		}
		return ns
	}
	small, err := policy.Compile(&policy.Document{Default: &policy.Target{Limits: plim}}, 1, policy.Options{})
	if err != nil {
		b.Fatal(err)
	}
	withNew := func(rules bool) func(b *testing.B) http.Handler {
		return func(b *testing.B) http.Handler {
			o := opts
			o.Namespace = newNS(b)
			if !rules {
				o.Rules = nil
			}
			mw, err := httplimit.New(o)
			if err != nil {
				b.Fatal(err)
			}
			return mw(handler)
		}
	}
	withPolicy := func(s *policy.Snapshot) func(b *testing.B) http.Handler {
		return func(b *testing.B) http.Handler {
			l, err := httplimit.NewWithPolicy(httplimit.PolicyOptions{
				Options: httplimit.Options{Namespace: newNS(b), KeyFunc: opts.KeyFunc},
				Policy:  policy.NewHolder(s),
				Tier:    func(r *http.Request) string { return r.Header.Get("X-Tier") },
			})
			if err != nil {
				b.Fatal(err)
			}
			return l.Wrap(handler)
		}
	}
	// withLookup is default-only behind the least any per-key override
	// costs: one lookup of the request's key among the 100,000 overrides, in
	// a Go map (its answer is kept, unused).
	overrides := make(map[string]int, len(doc.Overrides))
	for k := range doc.Overrides {
		overrides[k] = len(overrides)
	}
	var found int
	withLookup := func(b *testing.B) http.Handler {
		h := withNew(false)(b)
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			found += overrides[r.Header.Get("X-Key")]
			h.ServeHTTP(w, r)
		})
	}
	// withRoute is withLookup behind the least a route rule costs besides:
	// one lookup of the request's method and path in a Go map of the 500
	// routes (its answer is kept, unused).
	routes := make(map[string]int, len(reqs))
	for i, r := range reqs {
		routes[r.Method+" "+r.URL.Path] = i
	}
	withRoute := func(b *testing.B) http.Handler {
		h := withLookup(b)
		var line []byte
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			line = append(append(append(line[:0], r.Method...), ' '), r.URL.Path...)
			found += routes[string(line)]
			h.ServeHTTP(w, r)
		})
	}
	variants := []struct {
		name string
		make func(*testing.B) http.Handler
	}{
		{"default-only", withNew(false)},
		{"rules", withNew(true)},
		{"policy-default-only", withPolicy(small)},
		{"policy", withPolicy(snap)},
		{"default-only+lookup", withLookup},
		{"default-only+lookup+route", withRoute},
	}
	for _, v := range variants {
		b.Run(v.name, func(b *testing.B) {
			b.ReportAllocs()
			h := v.make(b)
			warm(h)
			w := &benchWriter{h: make(http.Header)}
			runtime.GC()
			for i := 0; b.Loop(); i++ {
				serve(b, h, w, i)
			}
		})
	}
	// paired serves the same request sequence to every variant above, in
	// turns of 16,384 requests, and counts the CPU time of each variant
	// apart (on Linux: the thread's, which does not run while other jobs
	// hold the CPU). Other jobs on a shared machine slow every variant
	// alike, so the differences it reports (ns per request; overhead-* is
	// policy minus the variant) hold better than those of separate runs.
	// paired-cached sends the first 64 keys only (all of them overrides, on
	// 64 routes): every variant's state stays in the caches, so the
	// differences are the CPU work of each, without the memory misses that
	// 100,000 overrides and 50,000 counters cost.
	for _, spread := range []int{len(keys), 64} {
		name := "paired"
		if spread < len(keys) {
			name = "paired-cached"
		}
		b.Run(name, func(b *testing.B) {
			const turn = 1 << 14
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			hs := make([]http.Handler, len(variants))
			for i, v := range variants {
				hs[i] = v.make(b)
				warm(hs[i])
			}
			w := &benchWriter{h: make(http.Header)}
			spent := make([]time.Duration, len(hs))
			runtime.GC()
			n := 0
			for b.Loop() {
				for j, h := range hs {
					start := cputime.Thread()
					for i := n; i < n+turn; i++ {
						serveFrom(b, h, w, i, spread)
					}
					spent[j] += cputime.Thread() - start
				}
				n += turn
			}
			per := func(j int) float64 { return float64(spent[j]) / float64(n) }
			for j, v := range variants {
				b.ReportMetric(per(j), v.name+"-ns/req")
			}
			b.ReportMetric(per(3)-per(0), "overhead-default-only-ns/req")
			b.ReportMetric(per(3)-per(1), "overhead-rules-ns/req")
			b.ReportMetric(per(3)-per(4), "overhead-lookup-ns/req")
			b.ReportMetric(per(3)-per(5), "overhead-lookup-route-ns/req")
			b.ReportMetric(0, "ns/op")
		})
	}
}
