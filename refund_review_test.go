package ratelimit_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit"
	"github.com/ratesync/ratelimit/strategy"
	"github.com/ratesync/ratelimit/strategy/memory"
)

// revTotal reads the store's count of key's window of size at t.
func revTotal(t *testing.T, st *memory.Store, ns, key string, size time.Duration, at time.Time) int64 {
	t.Helper()
	n, err := st.GetWindow(context.Background(), ns, strategy.CounterID{Key: key, Size: size, Start: strategy.WindowStart(at.UnixMilli(), size)})
	require.NoError(t, err)
	return n
}

// A hit counted on this node, the key evicted (a flood of other keys)
// before the request fails and is refunded: the hit is in a retired record
// (or already in the store), the entry the refund makes is new, its view 0:
// bounded by that view, the refund took back nothing, and the store kept
// the unserved hit. A refund is bounded only on an entry that knows the
// store's totals.
func TestRefundAfterEviction(t *testing.T) {
	for _, cold := range []ratelimit.ColdRead{ratelimit.ColdReadOn, ratelimit.ColdReadOff} {
		for _, syncFirst := range []bool{false, true} {
			t.Run(fmt.Sprintf("cold=%v/syncFirst=%v", cold, syncFirst), func(t *testing.T) {
				leakCheck(t)
				clk := &fakeClock{t: minute.Add(10 * time.Second)}
				st := memory.New()
				cfg := ratelimit.Config{Namespace: "ev", WindowSizes: []time.Duration{time.Minute}, SyncRate: time.Hour,
					Strategy: st, Clock: clk.Now, ColdRead: cold, MaxKeys: 8, SyncTimeout: 30 * time.Second}
				ns := newNS(t, cfg)
				lim := ratelimit.Limit{Window: time.Minute, Max: 2}
				require.Equal(t, 1, allowed(t, ns, "victim", 1, lim))
				if syncFirst {
					require.NoError(t, ns.Sync(ctx))
				}
				for i := range 256 {
					allowed(t, ns, fmt.Sprint("flood", i), 1, lim)
				}
				require.NoError(t, ns.Refund(ctx, "victim", 1, lim))
				require.NoError(t, ns.Sync(ctx))
				require.EqualValues(t, 0, revTotal(t, st, "ev", "victim", time.Minute, clk.Now()),
					"admitted 1, refunded 1: the store should hold 0")
			})
		}
	}
}

// Synchronous mode: a refund of counted hits reaches the store.
func TestRefundSyncStore(t *testing.T) {
	clk := newDecClock(decEpoch.Add(10 * time.Second))
	ns, st := newDecNS(t, "sync", clk, time.Minute)
	l := ratelimit.Limit{Window: time.Minute, Max: 5}
	admitted := 0
	for range 7 {
		d, err := ns.Allow(ctx, "k", 1, l)
		require.NoError(t, err)
		if d.Allowed {
			admitted++
		}
	}
	require.Equal(t, 5, admitted)
	require.NoError(t, ns.Refund(ctx, "k", 2, l))
	require.NoError(t, ns.Sync(ctx))
	require.EqualValues(t, 3, revTotal(t, st, ns.Name(), "k", time.Minute, clk.Now()))
	require.Equal(t, 2, allowed(t, ns, "k", 9, l))
}
