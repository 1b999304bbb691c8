package shm

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit/strategy"
	"github.com/ratesync/ratelimit/strategy/memory"
)

// TestColdLoadDuringNegativePush: a key's entry made again by a take-back
// (unread: the key is cold) holds a correction of -1, which a push carries
// to the store. The store applies it; before the push settles, the cold
// read answers the new total and LoadCold sets it as the window's synced
// count while local still holds the -1: the view subtracts the take-back
// twice (3 where the cluster holds 4), and a limit of 4 admits a fifth hit.
// The view's rule (README, TestViewDuringNegativeAck) is that a settled push
// moves hits so that a view counts them twice, never zero times; a take-back
// counted twice is a hit counted zero times.
func TestColdLoadDuringNegativePush(t *testing.T) {
	tb := newTable(t, Options{Sizes: []time.Duration{time.Minute}, Track: true})
	st := memory.New()
	const now = 1_000_000
	const x = 960_000
	// The cluster's total: 5 hits, one of them this node's, counted before
	// its entry was evicted and pushed from the retired record.
	_, err := st.PushDiffs(context.Background(), &strategy.Batch{ID: "other", Namespace: "ns",
		Diffs: []strategy.Diff{{CounterID: strategy.CounterID{Key: "k", Size: time.Minute, Start: x}, Delta: 5}}})
	require.NoError(t, err)
	// That hit is taken back now: the entry made for it is unread.
	tb.TakeBack("k", now, 1, [2]int64{x, 0}, [2]int64{1, 0})
	require.False(t, tb.Holds("k"), "the key is still cold")
	var b Batch
	tb.collectAll(now, false, &b) // the -1 in flight
	require.Len(t, b.Diffs, 1)
	res, err := st.PushDiffs(context.Background(), &strategy.Batch{ID: "b", Namespace: "ns", Diffs: b.Diffs})
	require.NoError(t, err) // applied; its reply not settled yet
	// The cold read answers now: the store holds 4.
	total, err := st.GetWindow(context.Background(), "ns", strategy.CounterID{Key: "k", Size: time.Minute, Start: x})
	require.NoError(t, err)
	require.Equal(t, int64(4), total)
	tb.LoadCold("k", now, 1, [2][2]int64{{total, 0}})
	v := tb.Peek("k", 0, now)
	tb.Ack(&b, res)
	after := tb.Peek("k", 0, now)
	require.Equal(t, int64(4), after.Cur, "settled")
	require.GreaterOrEqual(t, v.Cur, int64(4), "between the cold read and the settle the view missed a hit the cluster holds")
}
