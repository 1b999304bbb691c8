package ratelimit_test

import (
	"context"
	"fmt"
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
// held: a failed bucket read did not mark the store down, so every cold
// bucket key waited the whole SyncTimeout (until a sync cycle failed), and
// concurrent cold bucket keys each sent a read of their own (see
// TestColdBucketReadsCoalesce).
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

// Cold token buckets share round trips as cold windows do: while a read of
// a kind is in flight, every other cold key of that kind queues for the
// next read, and callers finding one key cold together read it once. So
// 2 × n callers on n bucket keys and n window keys cost four round trips:
// per kind, the first caller's read, then one for everyone queued behind it.
func TestColdBucketReadsCoalesce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const n = 40
		bucket := ratelimit.Limit{Window: time.Minute, Max: 3, Algorithm: ratelimit.TokenBucket}
		window := ratelimit.Limit{Window: time.Minute, Max: 3}
		mem := memory.New()
		store := &coldGate{Strategy: mem, gate: make(chan struct{})}
		cfg := ratelimit.Config{WindowSizes: []time.Duration{time.Minute}, SyncRate: time.Hour, Strategy: mem}
		a := newNS(t, cfg)
		cfg.Strategy = store
		b := newNS(t, cfg)
		keys := map[string]ratelimit.Limit{}
		for i := range n {
			keys[fmt.Sprintf("bucket%d", i)] = bucket
			keys[fmt.Sprintf("window%d", i)] = window
		}
		// A spends every key's budget.
		for k, l := range keys {
			for range 3 {
				d, err := a.Allow(context.Background(), k, 1, l)
				require.NoError(t, err)
				require.True(t, d.Allowed)
			}
		}
		require.NoError(t, a.Sync(context.Background()))

		var wg sync.WaitGroup
		var out outcomes
		for k, l := range keys {
			for range 2 { // two callers per key
				wg.Go(func() { out.allow(t, b, k, l) })
			}
		}
		synctest.Wait() // one read of each kind in flight, the other callers queued behind them
		require.Equal(t, int64(1), store.winReads.Load())
		require.Equal(t, int64(1), store.bktReads.Load())
		close(store.gate)
		wg.Wait()
		t.Logf("%d window reads for %d keys, %d bucket reads for %d keys", store.winReads.Load(), store.winKeys.Load(),
			store.bktReads.Load(), store.bktKeys.Load())
		require.Equal(t, int64(2), store.winReads.Load(), "two window reads")
		require.Equal(t, int64(2), store.bktReads.Load(), "two bucket reads")
		require.Equal(t, int64(n), store.winKeys.Load(), "each window key read once")
		require.Equal(t, int64(n), store.bktKeys.Load(), "each bucket key read once")
		require.Zero(t, out.admitted.Load(), "every key was spent elsewhere")
		require.Zero(t, out.degraded.Load())
	})
}
