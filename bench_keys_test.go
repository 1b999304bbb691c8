package ratelimit_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/ratesync/ratelimit"
)

// BenchmarkUniformKeys is the uniform serial case of BenchmarkIncrement and
// BenchmarkAllow (two limits, async mode) over 10,000 to 1,000,000 keys,
// each next to the map-plus-atomic baseline on the same keys, and next to
// floor2's bare Increment (floor1: one window counted, the key holding two
// window sizes as the table's entries do) and bare two-window check. Both are
// memory bound, and their ratio depends on where each one's working set
// falls against the processor's caches: the baseline's (a map of pointers to
// counters) is about half the table's (an index and an entry per key), so at
// some key count the baseline still fits in the last-level cache and the
// table no longer does.
func BenchmarkUniformKeys(b *testing.B) {
	ctx := context.Background()
	limits := []ratelimit.Limit{{Window: time.Second, Max: 1 << 40}, {Window: time.Minute, Max: 1 << 40}}
	for _, n := range []int{10_000, 100_000, 300_000, 1_000_000} {
		keys := userKeys(n)
		idx := make([]int, 1<<16)
		rng := rand.New(rand.NewPCG(1, 2))
		for i := range idx {
			idx[i] = rng.IntN(n)
		}
		run := func(b *testing.B, op func(key string)) { runPatternOf(b, keys, false, idx, op) }
		b.Run(fmt.Sprintf("keys=%d/baseline", n), func(b *testing.B) {
			base := newBaselineOf(keys)
			run(b, func(k string) { base.add(k, 1) })
		})
		b.Run(fmt.Sprintf("keys=%d/floor1", n), func(b *testing.B) {
			f := newFloor2(keys)
			run(b, func(k string) { f.increment(k, 1) })
		})
		b.Run(fmt.Sprintf("keys=%d/increment-async", n), func(b *testing.B) {
			ns := benchNamespaceOf(b, "async", keys)
			run(b, func(k string) {
				if _, err := ns.Increment(ctx, k, time.Minute, 1); err != nil {
					b.Fatal(err)
				}
			})
		})
		b.Run(fmt.Sprintf("keys=%d/floor2", n), func(b *testing.B) { benchFloor2(b, keys, false, idx) })
		b.Run(fmt.Sprintf("keys=%d/allow2-async", n), func(b *testing.B) {
			ns := benchNamespaceOf(b, "async", keys)
			run(b, func(k string) {
				if d, err := ns.Allow(ctx, k, 1, limits...); err != nil || !d.Allowed {
					b.Fatal(d, err)
				}
			})
		})
	}
}
