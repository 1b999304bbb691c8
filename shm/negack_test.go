package shm

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit/strategy"
	"github.com/ratesync/ratelimit/strategy/memory"
)

// TestViewDuringNegativeAck: a settled push that took hits back (a refund)
// lowers synced and raises local. Stored in that order, a view that loaded
// local before and synced after missed them, and a judged call admitted
// past the limit (found by review; it predates the lock-free paths). Ack
// now raises local first, and view loads local again after synced.
func TestViewDuringNegativeAck(t *testing.T) {
	tb := newTable(t, Options{Sizes: []time.Duration{time.Minute, time.Hour}, Track: true})
	st := memory.New()
	const now = 1_000_000
	const limit = 1
	judge := func(v [2]View) bool { return v[0].Cur <= limit }
	admitted := 0
	allow := func() {
		if _, ok, _, _ := tb.AddWindowsOpen("k", now, 3, [2]int64{1, 1}, false, false, true, judge); ok {
			admitted++
		}
	}
	push := func(b *Batch, id string) {
		res, err := st.PushDiffs(context.Background(), &strategy.Batch{ID: id, Namespace: "ns", Diffs: b.Diffs, Reads: b.Reads})
		require.NoError(t, err)
		tb.Ack(b, res)
	}
	allow() // A: admitted
	var b0 Batch
	tb.collectAll(now, false, &b0)
	push(&b0, "b0")         // synced 1, local 0
	tb.Add("k", 0, now, -1) // A refunded: local -1, the key is at 0
	tb.Add("k", 1, now, -1)
	var b1 Batch
	tb.collectAll(now, false, &b1) // the -1 in flight
	allow()                        // C: view 1 <= 1, admitted (local 0)
	armed := true
	testHookView = func() {
		if armed {
			armed = false
			push(&b1, "b1") // synced 1 -> 0, then local 1 -> 2
		}
	}
	t.Cleanup(func() { testHookView = nil })
	// B: counted, then judged on the view a lock-free addition returns,
	// which reads the slot without the entry's lock (a judged call's own
	// view holds it, so no push settles inside it). Old view: local 1,
	// loaded, then synced 0: view 1, admitted.
	vw, _, _ := tb.AddOpen("k", 0, now, 1, false, false)
	require.False(t, armed, "the lock-free view ran the hook")
	if vw.Cur <= limit {
		admitted++
	} else {
		tb.Add("k", 0, now, -1)
	}
	testHookView = nil
	var b2 Batch
	tb.collectAll(now, false, &b2)
	push(&b2, "b2")
	got, err := st.GetWindow(context.Background(), "ns", strategy.CounterID{Key: "k", Size: time.Minute, Start: 960_000})
	require.NoError(t, err)
	t.Logf("admitted after the refund: %d (limit %d); store holds %d", admitted-1, limit, got)
	require.LessOrEqual(t, got, int64(limit), "over-admitted: the view missed the negative diff being acked")
}
