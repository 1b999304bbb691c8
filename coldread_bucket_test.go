package ratelimit_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit"
	"github.com/ratesync/ratelimit/strategy"
	"github.com/ratesync/ratelimit/strategy/memory"
)

// hangingBucketReads never answers a cold bucket read (a push of bucket
// reads only): it returns when the call's context ends. Other calls work.
type hangingBucketReads struct {
	strategy.Strategy
	reads atomic.Int64
}

func (s *hangingBucketReads) Capabilities() strategy.Capabilities {
	return strategy.CapabilitiesOf(s.Strategy)
}

func (s *hangingBucketReads) PushDiffs(ctx context.Context, b *strategy.Batch) (strategy.Result, error) {
	if len(b.BucketReads) > 0 && len(b.BucketDiffs) == 0 && len(b.Diffs) == 0 {
		s.reads.Add(1)
		<-ctx.Done()
		return strategy.Result{}, ctx.Err()
	}
	return s.Strategy.PushDiffs(ctx, b)
}

// The README: "the wait is bounded by SyncTimeout and fails open; while the
// store fails, callers do not wait and one read at a time probes it", and
// "Concurrent cold keys share one round trip". For token buckets neither
// holds: a failed bucket read does not mark the store down, so every cold
// bucket key waits the whole SyncTimeout (until a sync cycle fails), and
// concurrent cold bucket keys each send a read of their own.
func TestColdBucketOutageWaitsPerKey(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const timeout = 50 * time.Millisecond
		lim := ratelimit.Limit{Window: time.Minute, Max: 5, Algorithm: ratelimit.TokenBucket}
		store := &hangingBucketReads{Strategy: memory.New()}
		reg := ratelimit.NewRegistry()
		defer func() { _ = reg.Close(context.Background()) }()
		ns, err := reg.New(ratelimit.Config{WindowSizes: []time.Duration{time.Minute}, SyncRate: time.Hour,
			Strategy: store, SyncTimeout: timeout})
		require.NoError(t, err)

		start := time.Now()
		d, err := ns.Allow(context.Background(), "k1", 1, lim)
		require.NoError(t, err)
		require.True(t, d.Allowed && d.Degraded)
		require.Equal(t, timeout, time.Since(start), "the first cold key waits SyncTimeout")

		// The store is known to fail now: the next cold key should not wait.
		var wg sync.WaitGroup
		start = time.Now()
		for _, k := range []string{"k2", "k3", "k4", "k5"} {
			wg.Go(func() {
				d, err := ns.Allow(context.Background(), k, 1, lim)
				require.NoError(t, err)
				require.True(t, d.Allowed && d.Degraded)
			})
		}
		wg.Wait()
		took := time.Since(start)
		t.Logf("4 concurrent cold bucket keys after a failed read: waited %v, %d bucket reads in all", took, store.reads.Load())
		require.Zero(t, took, "cold keys wait for a store known to fail")
		require.LessOrEqual(t, store.reads.Load(), int64(2), "one probe at a time")
	})
}

// readBuckets reads at most maxInlineLimits (4) cold token buckets of a
// decision and silently skips the rest: a fifth bucket is created by the
// decision without the store's state, so it grants a fresh budget on this
// node until the next sync, though the read "succeeded" (not Degraded).
func TestColdFifthBucketNotRead(t *testing.T) {
	leakCheck(t)
	sizes := []time.Duration{time.Second, 2 * time.Second, 3 * time.Second, 4 * time.Second, time.Minute}
	store := memory.New()
	clk := &fakeClock{t: minute.Add(10 * time.Second)}
	cfg := ratelimit.Config{WindowSizes: sizes, SyncRate: time.Hour, Strategy: store, Clock: clk.Now}
	a, b := newNS(t, cfg), newNS(t, cfg)
	var lims []ratelimit.Limit
	for _, w := range sizes[:4] {
		lims = append(lims, ratelimit.Limit{Window: w, Max: 1000, Algorithm: ratelimit.TokenBucket})
	}
	lims = append(lims, ratelimit.Limit{Window: time.Minute, Max: 5, Algorithm: ratelimit.TokenBucket})
	for i := range 5 {
		d, err := a.Allow(ctx, "client", 1, lims...)
		require.NoError(t, err)
		require.True(t, d.Allowed, "hit %d", i+1)
	}
	require.NoError(t, a.Sync(ctx))
	admitted := 0
	for range 5 {
		d, err := b.Allow(ctx, "client", 1, lims...)
		require.NoError(t, err)
		require.False(t, d.Degraded)
		if d.Allowed {
			admitted++
		}
	}
	require.Zero(t, admitted, "B admitted %d under a per-minute bucket of 5 that A emptied", admitted)
}
