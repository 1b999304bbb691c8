package shm

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit/strategy"
	"github.com/ratesync/ratelimit/strategy/memory"
)

// Past the cap, shed drops the windows too old to matter first, then the
// smallest, keeps what a push has in flight, and counts every dropped hit.
func TestShed(t *testing.T) {
	tb := newTable(t, Options{Sizes: []time.Duration{time.Second}, MaxKeys: 64, Track: true, MaxRetired: 8})
	const now = 100_000
	tb.noteTime(now)
	retire := func(key string, start, hits int64) counterRef {
		ref := counterRef{e: newEntry(key), start: start}
		tb.retire(ref, hits, 0)
		return ref
	}
	// Four stale windows (older than the previous one at now) and four live
	// ones: at the cap, nothing is dropped.
	for i, hits := range []int64{5, 1, 3, 2} {
		retire("stale"+string(rune('a'+i)), now-5_000, hits)
	}
	for i, hits := range []int64{9, 1, 4, 1} {
		retire("live"+string(rune('a'+i)), now, hits)
	}
	require.Zero(t, tb.DroppedHits())
	// One more: the stale ones go (11 hits), which brings the records to 5.
	retire("livee", now-1_000, 6)
	require.Equal(t, int64(11), tb.DroppedHits())
	require.Len(t, tb.retired, 5)

	// Live records only, one of them in a push in flight: the smallest go
	// first, down to 6, and the one in flight stays.
	var b Batch
	inFlight := retire("livef", now, 1)
	tb.addDiff(&b, inFlight, "livef", 1)
	tb.opened(&b)
	for _, hits := range []int64{8, 7, 2} {
		retire("more"+string(rune('0'+hits)), now, hits)
	}
	// 9 records > 8: shed keeps 6 (livea 9, more8, more7, livee 6, ...).
	require.Len(t, tb.retired, 6)
	require.Contains(t, tb.retired, inFlight)
	var kept []int64
	for _, r := range tb.retired {
		kept = append(kept, r.local)
	}
	require.ElementsMatch(t, []int64{9, 8, 7, 6, 4, 1}, kept)
	// Dropped: liveb 1, lived 1, more2 2 = 4 more.
	require.Equal(t, int64(15), tb.DroppedHits())
	tb.Release(&b)
	require.Empty(t, tb.open)
}

// A walk that collects expired entries and then drops them retires windows
// whose hits are in the batch being collected: if that pushes the retired
// records past their cap, shed must not count those hits as dropped, since
// the push delivers them.
func TestShedDoesNotCountCollectedHitsAsDropped(t *testing.T) {
	tb := newTable(t, Options{Sizes: []time.Duration{time.Second}, MaxKeys: 64, Track: true, Walk: true, MaxRetired: 4})
	st := memory.New()
	const hits = 8
	for i := range hits {
		tb.Add("k"+string(rune('a'+i)), 0, 1_000, int64(i+1))
	}
	var b Batch
	// Every entry is expired at 5,000: the walk collects and drops them all.
	tb.collectAll(5_000, false, &b)
	require.Len(t, b.Diffs, hits)
	settle(t, tb, st, &b, "b1")
	var stored int64
	for _, d := range b.Diffs {
		stored += d.Delta
	}
	require.Equal(t, int64(hits*(hits+1)/2), stored, "every hit pushed")
	require.Zero(t, tb.DroppedHits(), "hits the push delivered are counted as dropped")
	h, _ := tb.Pending()
	require.Zero(t, h)
}

// While a push of unknown outcome holds more records than shed may keep (a
// push carries up to the cap's worth, and is kept for re-sending through the
// whole outage), shed can bring the records down only to those it holds. Its
// cost must stay amortised then too: not a pass over every record, with a set
// of the push's refs built, for each record a unique-key flood retires.
func TestShedAmortisedWhileAPushHoldsTheRecords(t *testing.T) {
	const (
		retCap = 1024
		now    = 100_000
	)
	tb := newTable(t, Options{Sizes: []time.Duration{time.Second}, MaxKeys: 64, Track: true, MaxRetired: retCap})
	tb.noteTime(now)
	e := newEntry("flood")
	for i := range retCap {
		tb.retire(counterRef{e: e, start: now + int64(i)*1000}, 1, 0)
	}
	var b Batch
	require.False(t, tb.CollectSome(now, false, &b, retCap), "a chunk of retired records only")
	require.Len(t, b.Diffs, retCap)
	// The flood goes on while that push is in flight.
	next := int64(retCap)
	allocs := testing.AllocsPerRun(2000, func() {
		tb.retire(counterRef{e: e, start: now + next*1000}, 1, 0)
		next++
	})
	require.LessOrEqual(t, len(tb.retired), retCap+retCap/4+1, "memory stays bounded")
	require.Less(t, allocs, 3.0, "each retire beyond the cap sheds again")
	tb.Release(&b)
}

// A hit taken back (Allow's undo, a negative increment) after the hit itself
// went into a push still in flight leaves the slot's local count equal to its
// acked count. If the window then rotates out, the take-back must still be
// pushed once the push settles: the store would otherwise keep the hit.
func TestTakeBackOfHitInFlightSurvivesRotation(t *testing.T) {
	for name, wt := range map[string]bool{"periodic": false, "write-through": true} {
		t.Run(name, func(t *testing.T) {
			tb := newTable(t, Options{Sizes: []time.Duration{time.Second}, MaxKeys: 64, Track: true, WriteThrough: wt})
			st := memory.New()
			var inFlight Batch
			if wt {
				tb.AddPending("k", 0, 1_000, 5, &inFlight)
			} else {
				tb.Add("k", 0, 1_000, 5)
				tb.collectAll(1_000, false, &inFlight)
			}
			require.Len(t, inFlight.Diffs, 1)
			tb.Add("k", 0, 1_500, -5) // taken back while the push is in flight
			tb.Add("k", 0, 3_000, 1)  // the window of the hit rotates out
			settle(t, tb, st, &inFlight, "b1")
			for i := range 3 {
				var b Batch
				tb.collectAll(3_000, false, &b)
				settle(t, tb, st, &b, fmt.Sprint("b", i+2))
			}
			n, err := st.GetWindow(context.Background(), "ns", strategy.CounterID{Key: "k", Size: time.Second, Start: 1_000})
			require.NoError(t, err)
			require.Zero(t, n, "the take-back was lost: the store keeps a hit the node took back")
			h, _ := tb.Pending()
			require.Zero(t, h)
		})
	}
}
