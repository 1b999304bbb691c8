package ratelimit_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit"
	"github.com/ratesync/ratelimit/strategy/memory"
)

// Several bucket limits of different window sizes in one decision, with a
// Penalty on one, read in a batch that evicts its own buckets (MaxKeys
// cap): each learned state must go to its own bucket. Node A spends the
// 1-minute bucket (Max 3); the 1-hour one (Max 100) is barely used. B
// must reject every key, and after the burst its 1-hour buckets must
// hold one penalty hit each at most (no minute state learned into them).
func TestLearnedGoesToItsBucket(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const hot, cold = 64, 48
		minute := ratelimit.Limit{Window: time.Minute, Max: 3, Algorithm: ratelimit.TokenBucket}
		hour := ratelimit.Limit{Window: time.Hour, Max: 100, Algorithm: ratelimit.TokenBucket, Penalty: true}
		mem := memory.New()
		store := &coldGate{Strategy: mem, gate: make(chan struct{})}
		cfg := ratelimit.Config{WindowSizes: []time.Duration{time.Minute, time.Hour}, SyncRate: time.Hour, Strategy: mem, MaxKeys: hot}
		a := newNS(t, cfg)
		cfg.Strategy = store
		b := newNS(t, cfg)
		for i := range cold {
			require.Equal(t, 3, allowed(t, a, fmt.Sprintf("cold%d", i), 3, minute))
		}
		require.NoError(t, a.Sync(context.Background()))
		close(store.gate)
		for i := range hot {
			allowed(t, b, fmt.Sprintf("hot%d", i), 2, minute, hour)
		}
		store.gate = make(chan struct{})
		var wg sync.WaitGroup
		wg.Go(func() { _, _ = b.Allow(context.Background(), "first", 1, minute) })
		synctest.Wait()
		var out outcomes
		for i := range cold {
			wg.Go(func() {
				d, err := b.Allow(context.Background(), fmt.Sprintf("cold%d", i), 1, hour, minute)
				require.NoError(t, err)
				if d.Allowed {
					out.admitted.Add(1)
				}
				if d.Degraded {
					out.degraded.Add(1)
				}
			})
		}
		synctest.Wait()
		close(store.gate)
		wg.Wait()
		// What the hour buckets say now: 100 - 1 penalty = 99 left at most.
		low := 0
		for i := range cold {
			d, err := b.Peek(context.Background(), fmt.Sprintf("cold%d", i), 1, hour)
			require.NoError(t, err)
			if d.Remaining < 98 {
				low++
			}
		}
		t.Logf("%d of %d admitted (%d degraded); %d hour buckets below 98 remaining", out.admitted.Load(), cold, out.degraded.Load(), low)
		require.Zero(t, out.admitted.Load())
		require.Zero(t, low)
	})
}
