package ratelimit_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit"
	"github.com/ratesync/ratelimit/strategy"
	"github.com/ratesync/ratelimit/strategy/memory"
)

// newClock returns a test clock (Unix ms) set to ms.
func newClock(ms int64) *atomic.Int64 {
	c := new(atomic.Int64)
	c.Store(ms)
	return c
}

// syncTestNode returns a synchronous-mode node on s whose clock reads clock
// (Unix ms), with MaxKeys maxKeys (0: the default) and the given window
// sizes (default: one second).
func syncTestNode(t *testing.T, s strategy.Strategy, clock *atomic.Int64, maxKeys int, sizes ...time.Duration) *ratelimit.Namespace {
	t.Helper()
	if len(sizes) == 0 {
		sizes = []time.Duration{time.Second}
	}
	ns, err := ratelimit.NewRegistry().New(ratelimit.Config{Namespace: "synctest", WindowSizes: sizes,
		SyncRate: 0, Strategy: s, ColdRead: ratelimit.ColdReadOff, MaxKeys: maxKeys,
		Clock: func() time.Time { return time.UnixMilli(clock.Load()) }})
	require.NoError(t, err)
	t.Cleanup(func() { _ = ns.Close(context.Background()) })
	return ns
}

// A write-through G1 whose key is evicted during its push, and made again by
// a call G2 of the same window on the same node (whose push reaches the store
// first), judges the new entry's view: it has learned the store's total from
// G2's push (without G1's hit, which reached the store after) and holds none
// of G1's hit (which left with the old entry for a retired record). So G1 is
// judged without its own hit: a fixed limit of 1 a second admits 2.
func TestSyncAllowEvictedDuringPushCountsItsOwnHit(t *testing.T) {
	const x = int64(1_700_000_000_000)
	hs := &hookedStore{Store: memory.New()}
	clock := newClock(x + 100)
	a := syncTestNode(t, hs, clock, 1) // MaxKeys 1: a second key evicts the first
	ctx := context.Background()
	lim := ratelimit.Limit{Window: time.Second, Max: 1, Algorithm: ratelimit.FixedWindow}

	var g2 ratelimit.Decision
	hook := func() {
		_, err := a.Allow(ctx, "other", 1, lim) // evicts "k"
		require.NoError(t, err)
		clock.Store(x + 200)
		g2, _ = a.Allow(ctx, "k", 1, lim) // makes "k" again; its push goes first
	}
	hs.hook.Store(&hook)
	g1, err := a.Allow(ctx, "k", 1, lim)
	require.NoError(t, err)
	require.True(t, g2.Allowed, "G2's hit reached the store first")
	require.NoError(t, a.Sync(ctx))
	got, err := hs.Store.GetWindow(ctx, "synctest", strategy.CounterID{Key: "k", Size: time.Second, Start: x})
	require.NoError(t, err)
	admitted := 1
	if g1.Allowed {
		admitted++
	}
	require.Equal(t, int64(admitted), got, "store total against hits admitted")
	require.False(t, g1.Allowed, "G1 reached the store second: 2 hits under a limit of 1")
}

// The same for Increment: G1's rate, judged on the entry made again by G2,
// lacks G1's own hit.
func TestSyncIncrementEvictedDuringPushCountsItsOwnHit(t *testing.T) {
	const x = int64(1_700_000_000_000)
	hs := &hookedStore{Store: memory.New()}
	clock := newClock(x + 100)
	a := syncTestNode(t, hs, clock, 1)
	ctx := context.Background()
	hook := func() {
		_, err := a.Increment(ctx, "other", time.Second, 1) // evicts "k"
		require.NoError(t, err)
		_, err = a.Increment(ctx, "k", time.Second, 1) // makes "k" again; its push goes first
		require.NoError(t, err)
	}
	hs.hook.Store(&hook)
	g1, err := a.Increment(ctx, "k", time.Second, 1)
	require.NoError(t, err)
	require.Equal(t, 2.0, g1, "second X holds both hits when G1's push is applied")
}
