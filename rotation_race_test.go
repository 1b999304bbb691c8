package ratelimit_test

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit"
	"github.com/ratesync/ratelimit/strategy/memory"
)

// TestAllowRacingRotationByTwo (see shm/rotate_race_test.go):
// through the public API, one node, one fixed limit of 4 a second. The
// second of most calls is full; every 40th call reads a clock two seconds
// later. Every call is then rejected in its own second, or counts (behind
// the newest window) in the later second, which admits 4 at most: a round
// admits at most 4 calls. A call that found its window before the
// rotation and counted after it judged a view of 0 and was admitted.
func TestAllowRacingRotationByTwo(t *testing.T) {
	const limit, rounds = 4, 2000
	lim := ratelimit.Limit{Window: time.Second, Max: limit, Algorithm: ratelimit.FixedWindow}
	over := 0
	const x = int64(1_700_000_000_000)
	var calls atomic.Int64
	clock := func() time.Time {
		if calls.Add(1)%40 == 0 {
			return time.UnixMilli(x + 2500)
		}
		return time.UnixMilli(x + 999)
	}
	reg := ratelimit.NewRegistry()
	ns, err := reg.New(ratelimit.Config{Namespace: "rot", WindowSizes: []time.Duration{time.Second},
		SyncRate: time.Hour, Strategy: memory.New(), ColdRead: ratelimit.ColdReadOff, Clock: clock})
	require.NoError(t, err)
	ctx := context.Background()
	defer ns.Close(ctx)
	for r := range rounds {
		key := fmt.Sprint("k", r)
		for range limit {
			calls.Store(1) // the prefill reads x+999
			d, err := ns.Allow(ctx, key, 1, lim)
			require.NoError(t, err)
			require.True(t, d.Allowed)
		}
		var admitted atomic.Int64
		var wg sync.WaitGroup
		for range 4 {
			wg.Go(func() {
				for i := range 100 {
					if d, err := ns.Allow(ctx, key, 1, lim); err == nil && d.Allowed {
						admitted.Add(1)
					}
					if i%16 == 0 {
						runtime.Gosched()
					}
				}
			})
		}
		wg.Wait()
		if n := admitted.Load(); n > limit {
			over++
			if over <= 3 {
				t.Logf("key %s: admitted %d after its full second (limit %d)", key, n, limit)
			}
		}
	}
	require.Zero(t, over, "rounds that admitted more than the limit")
}
