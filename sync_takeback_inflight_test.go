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

// afterHookStore is a memory store that runs hook (once, if set) after the
// store applied a push whose diffs are all negative (a take-back), before
// the reply reaches the caller.
type afterHookStore struct {
	*memory.Store
	hook atomic.Pointer[func()]
}

func (h *afterHookStore) PushDiffs(ctx context.Context, b *strategy.Batch) (strategy.Result, error) {
	res, err := h.Store.PushDiffs(ctx, b)
	neg := len(b.Diffs) > 0
	for _, d := range b.Diffs {
		neg = neg && d.Delta < 0
	}
	if neg {
		if f := h.hook.Swap(nil); f != nil {
			(*f)()
		}
	}
	return res, err
}

// A rejected call's take-back (-1) stays in its slot's local count until
// the take-back's push is acknowledged. A call G2 whose push reads that window
// after the store applied the take-back, and is acknowledged before it,
// learns a total that already lacks the rejected hit, and its view (that
// total plus the local count) subtracts the hit a second time.
//
// Limits: sliding 9 a second, fixed 5 a minute; second X is the last of
// minute M. Node B sends 5 in second X (minute M is full). Node A's G1 at
// X+999 is rejected by the minute limit; inside its take-back's push (after
// the store applied it), B sends 4 early in second X+1 (minute M+1) and A's
// G2 comes at X+1010: second X+1 holds 5 with it, and second X's 5 weigh
// 0.99, a load of 9.95 > 9. G2 judged second X at 4 (5 less the take-back
// still local): 8.96, admitted.
func TestSyncAllowDuringTakeBackInFlightCountsOnce(t *testing.T) {
	const m = int64(1_700_000_040_000) // a minute boundary
	require.Zero(t, m%60_000)
	const x = m + 59_000 // the minute's last second
	store := memory.New()
	hs := &afterHookStore{Store: store}
	clockA, clockB := newClock(x+999), newClock(x+100)
	a := syncTestNode(t, hs, clockA, 0, time.Second, time.Minute)
	b := syncTestNode(t, store, clockB, 0, time.Second, time.Minute)
	ctx := context.Background()
	limits := []ratelimit.Limit{{Window: time.Second, Max: 9}, {Window: time.Minute, Max: 5, Algorithm: ratelimit.FixedWindow}}
	for range 5 {
		d, err := b.Allow(ctx, "k", 1, limits...)
		require.NoError(t, err)
		require.True(t, d.Allowed)
	}

	var g2 ratelimit.Decision
	hook := func() {
		clockB.Store(x + 1005)
		for range 4 {
			d, err := b.Allow(ctx, "k", 1, limits...)
			require.NoError(t, err)
			require.True(t, d.Allowed)
		}
		clockA.Store(x + 1010)
		g2, _ = a.Allow(ctx, "k", 1, limits...)
	}
	hs.hook.Store(&hook)
	g1, err := a.Allow(ctx, "k", 1, limits...)
	require.NoError(t, err)
	require.False(t, g1.Allowed, "minute M is full")
	require.NoError(t, a.Sync(ctx))
	cur, err := store.GetWindow(ctx, "synctest", strategy.CounterID{Key: "k", Size: time.Second, Start: x + 1000})
	require.NoError(t, err)
	prev, err := store.GetWindow(ctx, "synctest", strategy.CounterID{Key: "k", Size: time.Second, Start: x})
	require.NoError(t, err)
	require.Equal(t, int64(5), prev, "second X: B's 5, G1 taken back")
	require.False(t, g2.Allowed, "G2 admitted: second X+1 holds %d and second X %d, a load of %.2f under a limit of 9",
		cur, prev, float64(cur)+float64(prev)*0.99)
}
