package shm

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit/strategy"
)

func TestHoldsAndAddWindowsIfHeld(t *testing.T) {
	tb := newTable(t, Options{Sizes: []time.Duration{time.Second, time.Minute}, Track: true, Walk: true})
	now := int64(1_700_000_000_500)
	require.False(t, tb.Holds("k"))
	_, ok := tb.AddWindowsIfHeld("k", now, 3, [2]int64{1, 1}, false)
	require.False(t, ok)
	require.False(t, tb.Holds("k"), "AddWindowsIfHeld creates nothing")
	require.Zero(t, tb.Len())

	want := tb.AddWindows("k", now, 3, [2]int64{2, 2}, false)
	require.True(t, tb.Holds("k"))
	got, ok := tb.AddWindowsIfHeld("k", now, 3, [2]int64{3, 3}, false)
	require.True(t, ok)
	for w := range 2 {
		require.Equal(t, want[w].Start, got[w].Start)
		require.Equal(t, int64(5), got[w].Cur)
	}
	peek, ok := tb.AddWindowsIfHeld("k", now, 1, [2]int64{9, 9}, true)
	require.True(t, ok)
	require.Equal(t, int64(5), peek[0].Cur, "a peek counts nothing")
}

// LoadCold sets a window's synced count only while it is unknown: hits
// counted meanwhile count once on top, and a total a push settled is kept.
func TestLoadCold(t *testing.T) {
	tb := newTable(t, Options{Sizes: []time.Duration{time.Minute}, Track: true, Walk: true})
	size := time.Minute.Milliseconds()
	now := int64(1_700_000_040_000) + 10_000
	cur := windowStart(now, size)

	// A fresh key: both windows loaded.
	tb.LoadCold("a", now, 1, [2][2]int64{{7, 3}})
	v := tb.Peek("a", 0, now)
	require.Equal(t, int64(7), v.Cur)
	require.Equal(t, int64(3), v.Prev)

	// Hits counted before the read lands (a caller that stopped waiting)
	// stay on top of the store's total.
	tb.Add("b", 0, now, 2)
	tb.LoadCold("b", now, 1, [2][2]int64{{10, 0}})
	require.Equal(t, int64(12), tb.Peek("b", 0, now).Cur)

	// A push settled first: its total stands, an older read does not
	// replace it.
	tb.Add("c", 0, now, 4)
	var b Batch
	tb.collectAll(now, true, &b)
	res := strategy.Result{Totals: make([]int64, len(b.Diffs)), Reads: make([]int64, len(b.Reads))}
	for i, d := range b.Diffs {
		if d.Key == "c" {
			res.Totals[i] = 24 // 20 from other nodes + these 4
		} else {
			res.Totals[i] = d.Delta
		}
	}
	for i, r := range b.Reads {
		if r.Key == "a" && r.Start == cur {
			res.Reads[i] = 7
		}
	}
	tb.Ack(&b, res)
	tb.LoadCold("c", now, 1, [2][2]int64{{15, 0}})
	require.Equal(t, int64(24), tb.Peek("c", 0, now).Cur)

	// A read of a window the entry has left behind is ignored.
	later := now + size
	tb.Add("d", 0, later, 1)
	tb.LoadCold("d", now, 1, [2][2]int64{{50, 0}})
	require.Equal(t, int64(1), tb.Peek("d", 0, later).Cur)
}

// LoadCold is LoadColdSince for a read that no watch answer raced.
func (t *Table) LoadCold(key string, now int64, mask uint8, counts [2][2]int64) {
	t.LoadColdSince(key, now, mask, counts, t.SkipSeq())
}
