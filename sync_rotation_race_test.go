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

// hookedStore is a memory store that runs hook (once, if set) at the start of
// a push, before the push reaches the store.
type hookedStore struct {
	*memory.Store
	hook atomic.Pointer[func()]
}

func (h *hookedStore) PushDiffs(ctx context.Context, b *strategy.Batch) (strategy.Result, error) {
	if f := h.hook.Swap(nil); f != nil {
		(*f)()
	}
	return h.Store.PushDiffs(ctx, b)
}

// syncRotationNodes returns two synchronous-mode nodes sharing one memory
// store: a, whose store runs a hook inside its next push, and b. Both read
// their clocks from the returned pointers.
func syncRotationNodes(t *testing.T) (a, b *ratelimit.Namespace, hs *hookedStore, clockA, clockB *atomic.Int64) {
	t.Helper()
	hs = &hookedStore{Store: memory.New()}
	clockA, clockB = newClock(0), newClock(0)
	return syncTestNode(t, hs, clockA, 0), syncTestNode(t, hs.Store, clockB, 0), hs, clockA, clockB
}

// In synchronous mode a call writes its hit through, then judges the view.
// It judged the view at its instant after the push, which a call at a later
// instant on the same node, rotating the key during the push, had made a
// newer window's: the hit was judged on a window it did not count in, and a
// rejected hit was taken back from the newer window (found by review).
//
// Node B spends the limit; node A's call G1 is then over it, while a call
// G2 on node A at a later instant runs inside G1's push:
//   - fixed, 1 a second: B spends second X, G1 comes at its end, G2 in
//     second X+1, or X+2 (which rotates X out of A's entry: G1's count is
//     judged from the store's reply);
//   - sliding, 2 a second: B spends second X-1, G1 comes early in X, and G2
//     in X+1 rotates X-1 out of A's entry (the window before G1's is judged
//     from the store's reply).
func TestSyncAllowRacingRotationJudgesItsWindow(t *testing.T) {
	const x = int64(1_700_000_000_000)
	fixed := ratelimit.Limit{Window: time.Second, Max: 1, Algorithm: ratelimit.FixedWindow}
	sliding := ratelimit.Limit{Window: time.Second, Max: 2}
	for _, c := range []struct {
		name       string
		lim        ratelimit.Limit
		bAt        int64 // B's calls, as many as the limit
		g1At, g2At int64
		want       map[int64]int64 // store totals by window start after G1
	}{
		{"fixed/next", fixed, x + 100, x + 999, x + 1500, map[int64]int64{x: 1, x + 1000: 1}},
		// The store purges the second before the one before G2's by the
		// time the totals are read.
		{"fixed/two-ahead", fixed, x + 100, x + 999, x + 2500, map[int64]int64{x + 2000: 1}},
		{"sliding/next", sliding, x - 900, x + 10, x + 1500, map[int64]int64{x: 0, x + 1000: 1}},
	} {
		t.Run(c.name, func(t *testing.T) {
			a, b, hs, clockA, clockB := syncRotationNodes(t)
			ctx := context.Background()
			clockB.Store(c.bAt)
			for range c.lim.Max {
				d, err := b.Allow(ctx, "k", 1, c.lim)
				require.NoError(t, err)
				require.True(t, d.Allowed)
			}

			clockA.Store(c.g1At)
			var g2 ratelimit.Decision
			var g2err error
			hook := func() {
				clockA.Store(c.g2At)
				g2, g2err = a.Allow(ctx, "k", 1, c.lim)
			}
			hs.hook.Store(&hook)
			g1, err := a.Allow(ctx, "k", 1, c.lim)
			require.NoError(t, err)
			require.NoError(t, g2err)
			require.True(t, g2.Allowed, "G2 is the first call of its second")
			require.False(t, g1.Allowed, "G1 came after B spent the limit")
			require.False(t, g1.Degraded)

			// A take-back from a window rotated out of A's entry is
			// pushed by the next sync.
			require.NoError(t, a.Sync(ctx))
			for start, n := range c.want {
				got, err := hs.Store.GetWindow(ctx, "synctest", strategy.CounterID{Key: "k", Size: time.Second, Start: start})
				require.NoError(t, err)
				require.Equal(t, n, got, "store total of the second at %d", start)
			}
		})
	}
}

// Increment in synchronous mode answers the rate of the window its value
// counted in, racing the same rotation: node B adds 3 in second X, node A's
// G1 adds 1 at its end, and G2 on node A adds 1 in second X+1 inside G1's
// push. G1's rate is second X's 4 (its weight for the second before is
// nearly 0); judged on second X+1 at G1's instant, it read 5.
func TestSyncIncrementRacingRotationAnswersItsWindow(t *testing.T) {
	const x = int64(1_700_000_000_000)
	a, b, hs, clockA, clockB := syncRotationNodes(t)
	ctx := context.Background()
	clockB.Store(x + 100)
	_, err := b.Increment(ctx, "k", time.Second, 3)
	require.NoError(t, err)

	clockA.Store(x + 999)
	var g2 float64
	var g2err error
	hook := func() {
		clockA.Store(x + 1500)
		g2, g2err = a.Increment(ctx, "k", time.Second, 1)
	}
	hs.hook.Store(&hook)
	g1, err := a.Increment(ctx, "k", time.Second, 1)
	require.NoError(t, err)
	require.NoError(t, g2err)
	require.InDelta(t, 1+4*0.5, g2, 1e-9, "G2: its own hit and half of second X, G1's pending hit included")
	require.InDelta(t, 4, g1, 1e-9, "G1: second X's total")
}
