package shm

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit/strategy"
	"github.com/ratesync/ratelimit/strategy/memory"
)

// Found by review: a judged call (AddWindowsOpen with a
// judge, Allow's lean path) finds its windows (t.window, for every size in
// the mask) before it adds to any of them, holding the shard's read lock
// but not the entry's lock. A call at a later instant may rotate the entry
// by two windows in between: rotate swaps the slot of the window found for
// 0 and retires it, and the judged call's addition then lands in the slot,
// which now holds the window two later. The view it judges (viewAt of the
// window it found, which is no longer held) is 0, and a rejected call's
// take-back looks the window up by its start, finds it retired and takes
// the hit from its record: from a window the hit never went to.
//
// The window with mask 3 is reached deterministically through testHookView:
// it runs in the view of size index 0, after both windows were found and
// before the addition to size index 1. addWindows now holds the entry's
// lock there, so the racing call (which must lock it to rotate) runs after
// A instead (see duringView): the tests then check the serial outcome.

// duringView arms testHookView to run fn from inside the next view of
// key's windows (see interleave); the returned func joins it.
func duringView(t *testing.T, tb *Table, key string, fn func()) (join func()) {
	var wg sync.WaitGroup
	hookOnce(t, &testHookView, func() { interleave(tb, key, fn, &wg) })
	return wg.Wait
}

// interleave runs fn, a racing call, from inside another call on key: inline
// when key's entry lock is free there (fn then interleaves with that call,
// as it could before the lock was held there), else in a goroutine of wg
// that waits for the lock (the outcome is then the serial one).
func interleave(tb *Table, key string, fn func(), wg *sync.WaitGroup) {
	if e := tb.lookupEntry(key); e != nil && !tb.tryLockEntry(e) {
		wg.Go(fn)
		return
	} else if e != nil {
		e.unlockEntry()
	}
	fn()
}

const (
	rvSecond = int64(1_000_000) // a one-second window [rvSecond, rvSecond+1000)
	rvNow    = rvSecond + 500
	rvLater  = rvSecond + 2000 + 500 // two seconds later
)

// TestJudgedAddRacingRotationByTwoOverAdmits: a fixed limit of 1 a
// second on size index 1. The second of A's instant already holds an
// admitted hit, so A must be rejected in either order with B (a call two
// seconds later, admitted): before B, A's second holds 2; after B, A is
// behind the newest window and counts in it, where B's hit is. Racing B
// between finding its window and counting, A is admitted, and the second
// two later holds 2 admitted hits under a limit of 1.
func TestJudgedAddRacingRotationByTwoOverAdmits(t *testing.T) {
	tb := newTable(t, Options{Sizes: []time.Duration{time.Minute, time.Second}, Track: true})
	const limit = 1
	judge := func(v [2]View) bool { return v[1].Cur <= limit }
	allow := func(at int64, mask uint8) ([2]View, bool) {
		out, ok, _, _ := tb.AddWindowsOpen("k", at, mask, [2]int64{1, 1}, false, false, true, judge)
		return out, ok
	}
	_, ok := allow(rvNow, 3)
	require.True(t, ok, "the first hit of A's second")

	var bOK bool
	join := duringView(t, tb, "k", func() {
		_, bOK = allow(rvLater, 2) // B: rotates size index 1 by two windows
	})
	outA, aOK := allow(rvNow, 3) // A
	join()
	require.True(t, bOK, "B, the first hit of its second, is admitted")

	later := tb.Peek("k", 1, rvLater)
	t.Logf("A admitted=%v, A's view %+v; B's second now holds %d (limit %d)", aOK, outA[1], later.Cur, limit)
	require.False(t, aOK, "A is over the limit whichever came first")
	require.LessOrEqual(t, later.Cur, int64(limit), "B's second admitted more than the limit")
}

// TestJudgedTakeBackRacingRotationByTwo: A is rejected by its limit
// on size index 0; racing B as above, its hit on size index 1 landed in
// the second two later, and the take-back took it from A's second's
// retired record instead. The store ends with A's second short of its
// admitted hit and the later second holding the rejected one.
func TestJudgedTakeBackRacingRotationByTwo(t *testing.T) {
	tb := newTable(t, Options{Sizes: []time.Duration{time.Minute, time.Second}, Track: true})
	st := memory.New()
	judge := func(v [2]View) bool { return v[0].Cur <= 1 } // 1 a minute
	_, ok, _, _ := tb.AddWindowsOpen("k", rvNow, 3, [2]int64{1, 1}, false, false, true, judge)
	require.True(t, ok)

	join := duringView(t, tb, "k", func() {
		// B counts on size index 1 only (a call with another limit set).
		tb.AddWindowsOpen("k", rvLater, 2, [2]int64{0, 1}, false, false, true, nil)
	})
	_, ok, _, _ = tb.AddWindowsOpen("k", rvNow, 3, [2]int64{1, 1}, false, false, true, judge) // A
	join()
	require.False(t, ok, "A: the minute's limit is spent")

	collectSettle(t, tb, st, rvLater, "b")
	get := func(start int64) int64 {
		n, err := st.GetWindow(context.Background(), "ns", strategy.CounterID{Key: "k", Size: time.Second, Start: start})
		require.NoError(t, err)
		return n
	}
	aSec, bSec := get(rvSecond), get(rvSecond+2000)
	t.Logf("store: A's second %d (want 1: the admitted hit), the second two later %d (want 1: B's hit)", aSec, bSec)
	require.Equal(t, int64(1), aSec, "the admitted hit of A's second was taken back")
	require.Equal(t, int64(1), bSec, "A's rejected hit stayed counted")
}

// rvWeight is the weight of the previous window (the root package's weight).
func rvWeight(now, start, size int64) float64 {
	elapsed := max(now-start, 0)
	if elapsed >= size {
		return 0
	}
	return float64(size-elapsed) / float64(size)
}

// TestJudgedViewRacingRotationByOneOverAdmits: the one-limit case
// (mask 1), no rotation by two needed. A judged call reads its current
// window's view, then the previous one's (viewAt checks latest each time).
// A call one window later that rotates the entry between the two reads
// makes the previous window no longer held: A judges Prev = 0. With a
// sliding limit of 2, hits 1 in the second before A's and 1 in A's, and B
// counting 1 in the next second, A is rejected in either serial order
// (before B: 2 + 1×0.9 = 2.9; after B, behind the newest window, it counts
// there: 2 + 1×1 = 3), but admitted racing (2 + 0).
func TestJudgedViewRacingRotationByOneOverAdmits(t *testing.T) {
	tb := newTable(t, Options{Sizes: []time.Duration{time.Second, time.Minute}, Track: true})
	const limit = 2.0
	const aNow = rvSecond + 100
	judge := func(v [2]View) bool {
		load := float64(max(v[0].Cur-1, 0)+1) + float64(v[0].Prev)*rvWeight(aNow, v[0].Start, 1000)
		return load <= limit
	}
	tb.Add("k", 0, rvSecond-500, 1) // the second before A's
	tb.Add("k", 0, rvSecond+50, 1)  // A's second
	join := duringView(t, tb, "k", func() {
		tb.Add("k", 0, rvSecond+1500, 1) // B: one second later, rotates by one
	})
	out, ok, _, _ := tb.AddWindowsOpen("k", aNow, 1, [2]int64{1, 1}, false, false, true, judge) // A
	join()
	t.Logf("A admitted=%v with view %+v", ok, out[0])
	require.False(t, ok, "A is over the sliding limit whichever came first")
}

// TestTakeBackOnRecreatedEntry: the general decision path counts
// (AddWindows) and takes back (TakeBack) in two holds of the shard. When
// the entry is evicted in between and a call with an earlier clock (read
// before a second boundary, served after it) recreates it in the window
// before, TakeBack finds the window not held by the new entry and records
// -1 under its ref; its own peek then rotates the new entry into that very
// window. The record and the live slot now share one ref: the record's
// push is acked against the slot (which takes the -1 back into local), and
// when the window rotates out, retire overwrites the record. The rejected
// hit ends up counted.
func TestTakeBackOnRecreatedEntry(t *testing.T) {
	tb := newTable(t, Options{Sizes: []time.Duration{time.Second}, Track: true})
	st := memory.New()
	tb.AddWindows("k", rvNow, 1, [2]int64{1, 0}, false) // admitted
	out := tb.AddWindows("k", rvNow, 1, [2]int64{1, 0}, false)
	// ... judged over the limit; before its take-back, the key is evicted
	dropKey(tb, "k")
	tb.Peek("k", 0, rvSecond-1) // a call whose clock read the second before
	tb.TakeBack("k", rvNow, 1, [2]int64{out[0].Start}, [2]int64{1, 0})
	collectSettle(t, tb, st, rvNow, "c1")
	collectSettle(t, tb, st, rvNow, "c2")
	tb.Peek("k", 0, rvLater) // the key moves on two seconds
	for i := range 4 {
		collectSettle(t, tb, st, rvLater, fmt.Sprintf("d%d", i))
	}
	hits, retired := tb.Pending()
	got, err := st.GetWindow(context.Background(), "ns", strategy.CounterID{Key: "k", Size: time.Second, Start: rvSecond})
	require.NoError(t, err)
	t.Logf("store holds %d for the second (want 1: the admitted hit); pending %d in %d records", got, hits, retired)
	require.Equal(t, int64(1), got, "the rejected hit stayed counted")
	require.Zero(t, hits)
}
