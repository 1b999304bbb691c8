package policy_test

import (
	"fmt"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit/policy"
)

// TestConcurrentResolve: many goroutines fill and read one snapshot's route cache, with
// more tiers than the inline slots, shadow-only tiers and shadow routes;
// every answer matches the one resolved alone beforehand.
func TestConcurrentResolve(t *testing.T) {
	var doc strings.Builder
	doc.WriteString("default: {limits: [{window: 1m, max: 1}]}\nrules:\n")
	for i := range 12 {
		if i%3 != 0 {
			fmt.Fprintf(&doc, "  - {id: t%d, match: {tier: t%d, route: \"GET /p%d/\"}, limits: [{window: 1m, max: 2}]}\n", i, i, i%4)
		}
		fmt.Fprintf(&doc, "  - {id: t%d-sh, match: {tier: t%d, route: \"GET /p%d/\"}, shadow: true, limits: [{window: 1m, max: 2}]}\n", i, i, (i+1)%4)
	}
	doc.WriteString("  - {id: sh, match: {route: \"GET /p2/\"}, shadow: true, limits: [{window: 1m, max: 2}]}\n")
	doc.WriteString("  - {id: rt, match: {route: \"GET /p3/\", key: \"k*\"}, limits: [{window: 1m, max: 2}]}\n")
	s, err := policy.Load([]byte(doc.String()), 1, policy.Options{})
	require.NoError(t, err)
	type q struct{ path, key, tier string }
	var qs []q
	for p := range 5 {
		for _, k := range []string{"k1", "z"} {
			for tr := range 14 {
				qs = append(qs, q{fmt.Sprintf("/p%d/x%d", p, tr), k, fmt.Sprintf("t%d", tr)})
			}
		}
	}
	str := func(r policy.Resolution) string {
		n := func(e *policy.Entry) string {
			if e == nil {
				return "-"
			}
			return e.ID
		}
		return fmt.Sprint(r.Level, n(r.Entry), n(r.Shadow), r.Index)
	}
	// Expected answers from a snapshot of its own (a cold cache).
	s2, err := policy.Load([]byte(doc.String()), 1, policy.Options{})
	require.NoError(t, err)
	want := make([]string, len(qs))
	for i, c := range qs {
		want[i] = str(s2.Resolve(httptest.NewRequest("GET", c.path, nil), c.key, c.tier))
	}
	var wg sync.WaitGroup
	errs := make(chan string, 100)
	for g := range 8 {
		wg.Go(func() {
			for n := range 2000 {
				i := (n*7 + g*13) % len(qs)
				c := qs[i]
				if got := str(s.Resolve(httptest.NewRequest("GET", c.path, nil), c.key, c.tier)); got != want[i] {
					select {
					case errs <- fmt.Sprintf("%v: %s, want %s", c, got, want[i]):
					default:
					}
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
}
