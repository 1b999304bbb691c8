package shm

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit/strategy"
)

// wrapCycle runs one watch cycle's first pass over tb at now: the watches,
// every counter collected in one push, the push acknowledged with totals
// (total) and the watches answered with ch. It returns the push.
func wrapCycle(t *testing.T, tb *Table, now int64, total int64, ch strategy.Changes) *Batch {
	t.Helper()
	ws := tb.Watches(now, nil)
	require.NotEmpty(t, ws)
	tb.Rewind()
	var b Batch
	require.True(t, tb.CollectSome(now, true, &b, 0))
	res := strategy.Result{Totals: make([]int64, len(b.Diffs)), Reads: make([]int64, len(b.Reads))}
	for i := range res.Totals {
		res.Totals[i] = total
	}
	tb.Ack(&b, res)
	for _, w := range ws {
		tb.LoadChanges(w, ch, now)
	}
	tb.PassDone()
	return &b
}

// TestWatchDiffMarkOfAnOldCycle: an entry records which windows the
// current watch cycle pushed a diff for, with the cycle's number modulo
// 2^20 (entry.markDiff): a full read in that cycle skips them (their totals
// came back with the push). Key "k" is pushed once in cycle c and then
// changes no more on this node. 2^20 cycles later (29 hours at a SyncRate
// of 100 ms; sooner with early cycles, or a shorter SyncRate; a day-long
// window keeps "k" held that long) the cycle's number is c again and a
// watch overflows: the full read takes "k"'s stale mark for this cycle's
// diff and skips it. The changes the overflow did not list are never
// learned: "k"'s total stays what it was until "k" changes again.
func TestWatchDiffMarkOfAnOldCycle(t *testing.T) {
	day := 24 * time.Hour
	tb := newTable(t, Options{Sizes: []time.Duration{day}, MaxKeys: 1 << 10, Track: true, Watch: true})
	now := windowStart(time.Now().UnixMilli(), day.Milliseconds()) + 1000
	tb.Add("k", 0, now, 1)
	b := wrapCycle(t, tb, now, 1, strategy.Changes{Cursor: "1"})
	require.Len(t, b.Diffs, 1, "k's hit pushed in cycle %d", tb.cycle)

	// 2^20 - 1 cycles in which k changes nothing on this node (the other
	// nodes' changes listed by the watches meanwhile are not needed here):
	// the counter jumps to the last number before it wraps, and the last
	// of those cycles (numbered 0) runs.
	tb.cycle = 1<<(32-cycleShift) - 1
	wrapCycle(t, tb, now+time.Hour.Milliseconds()/2, 0, strategy.Changes{Cursor: "1"})
	require.Zero(t, tb.cycle)

	// The next cycle's watch overflows: the next pass reads every key held.
	b = wrapCycle(t, tb, now+time.Hour.Milliseconds(), 0, strategy.Changes{Cursor: "2", Overflow: true})
	require.Empty(t, b.Diffs)
	require.Positive(t, tb.FullReads())
	tb.Rewind()
	var full Batch
	require.True(t, tb.CollectSome(now+time.Hour.Milliseconds(), true, &full, 0))
	cur := windowStart(now, day.Milliseconds())
	var read []strategy.CounterID
	for _, r := range full.Reads {
		if r.Key == "k" && r.Start == cur {
			read = append(read, r)
		}
	}
	require.NotEmpty(t, read, "the full read of the current window after the overflow skipped k (reads %+v)", full.Reads)
}
