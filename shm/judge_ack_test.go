package shm

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit/strategy"
	"github.com/ratesync/ratelimit/strategy/memory"
)

// TestJudgeFastAckBetweenJudgementAndSwap: a push settled between
// judgeFast's loads and its swap (synced raised by d, local lowered by d)
// while other calls count exactly d hits brings local back to the value
// judged, so the swap succeeds on a view d short; rejudge catches the
// change of synced and takes the count back. One node, nothing evicted,
// limit 2: without rejudge three calls were admitted (found by review).
func TestJudgeFastAckBetweenJudgementAndSwap(t *testing.T) {
	tb := newTable(t, Options{Sizes: []time.Duration{time.Minute}, Track: true})
	st := memory.New()
	const now = 1_000_000
	const limit = 2
	judge := func(v [2]View) bool { return v[0].Cur <= limit }
	admitted := 0
	allow := func() bool {
		_, ok, _, _ := tb.AddWindowsOpen("k", now, 1, [2]int64{1, 1}, false, false, true, judge)
		if ok {
			admitted++
		}
		return ok
	}
	require.True(t, allow(), "A: creates the entry (locked path), local 1")
	var b Batch
	tb.collectAll(now, false, &b) // A's hit handed to a push, in flight
	onceBeforeFastAdd(t, func() {
		// B judged local 1 -> 2 (view 0+2 <= 2) and is about to swap.
		require.True(t, allow(), "C: swaps 1 -> 2")
		// The push of A's hit is confirmed: synced 1, local 2-1 = 1.
		res, err := st.PushDiffs(context.Background(), &strategy.Batch{ID: "b1", Namespace: "ns", Diffs: b.Diffs, Reads: b.Reads})
		require.NoError(t, err)
		tb.Ack(&b, res)
	})
	allow() // B: its swap 1 -> 2 succeeds
	var b2 Batch
	tb.collectAll(now, false, &b2)
	settle(t, tb, st, &b2, "b2")
	got, err := st.GetWindow(context.Background(), "ns", strategy.CounterID{Key: "k", Size: time.Minute, Start: 960_000})
	require.NoError(t, err)
	t.Logf("admitted %d with limit %d; store holds %d; view %d", admitted, limit, got, tb.Peek("k", 0, now).Cur)
	require.LessOrEqual(t, admitted, limit, "a single node admitted more than the limit")
}
