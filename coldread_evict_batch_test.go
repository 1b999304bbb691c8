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

// Coalesced cold bucket reads learned a whole batch of buckets before any of
// their callers decided. In a bucket table that is full (of keys in use),
// learning the batch's later keys makes room by evicting: a bucket a cold
// read just created carries no reference mark (a window's entry does:
// LoadColdSince marks it used), so the eviction hand takes it at first
// sight, and its caller is judged on a fresh bucket: admitted, not Degraded,
// though the store shows the bucket spent (9 to 22 of 48).
func TestColdBucketBatchEvictsItself(t *testing.T) {
	batchEvictsItself(t, ratelimit.Limit{Window: time.Minute, Max: 3, Algorithm: ratelimit.TokenBucket})
}

// The same for windows: LoadColdSince marks the entries it creates used,
// which spares them one lap of the eviction hand, not a batch larger than
// the room left (1 to 4 of 48 admitted before the callers loaded again
// what their batch read).
func TestColdWindowBatchEvictsItself(t *testing.T) {
	batchEvictsItself(t, ratelimit.Limit{Window: time.Minute, Max: 3})
}

// batchEvictsItself: node A spends 48 keys under lim; node B, whose table
// (MaxKeys 64) is full of keys in use, gets one request for each at once,
// read in one batch; B must admit none.
func batchEvictsItself(t *testing.T, lim ratelimit.Limit) {
	synctest.Test(t, func(t *testing.T) {
		const hot, cold = 64, 48
		mem := memory.New()
		store := &coldGate{Strategy: mem, gate: make(chan struct{})}
		cfg := ratelimit.Config{WindowSizes: []time.Duration{time.Minute}, SyncRate: time.Hour, Strategy: mem, MaxKeys: hot}
		a := newNS(t, cfg)
		cfg.Strategy = store
		b := newNS(t, cfg)
		for i := range cold {
			require.Equal(t, 3, allowed(t, a, fmt.Sprintf("cold%d", i), 3, lim))
		}
		require.NoError(t, a.Sync(context.Background()))
		// B's table is full of keys in use (each seen twice).
		close(store.gate)
		for i := range hot {
			allowed(t, b, fmt.Sprintf("hot%d", i), 2, lim)
		}
		store.gate = make(chan struct{})
		var wg sync.WaitGroup
		wg.Go(func() { _, _ = b.Allow(context.Background(), "first", 1, lim) }) // a read in flight
		synctest.Wait()
		var out outcomes
		for i := range cold {
			wg.Go(func() { out.allow(t, b, fmt.Sprintf("cold%d", i), lim) })
		}
		synctest.Wait()
		close(store.gate)
		wg.Wait()
		t.Logf("%d of %d spent cold keys admitted (%d degraded), %d window reads, %d bucket reads", out.admitted.Load(), cold,
			out.degraded.Load(), store.winReads.Load(), store.bktReads.Load())
		require.Zero(t, out.admitted.Load(), "admitted keys the store shows spent")
	})
}
