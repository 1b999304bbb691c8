package shm

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit/strategy"
)

// A take-back that finds its window rotated out goes to a retired record
// (adjustRetired). When the rotation kept no record, because the window's
// diffs in flight cancelled out (a hit +1 and a take-back -1: local 0,
// pending 0), the acknowledgements of those diffs land in the record the
// take-back makes: with the +1 acknowledged before it and the -1 after,
// the record reads confirmed (acked == local == -1) and is deleted, and the
// take-back never reaches the store; in the other order it is pushed twice.
func TestTakeBackToRetiredWithDiffsInFlight(t *testing.T) {
	const x = 1_000_000 // a second boundary
	for _, plusFirst := range []bool{true, false} {
		t.Run(map[bool]string{true: "plus-acked-first", false: "minus-acked-first"}[plusFirst], func(t *testing.T) {
			tb := newTable(t, Options{Sizes: []time.Duration{time.Second}, Track: true, WriteThrough: true})
			var plus, minus, took Batch
			tb.AddPending("k", 0, x+100, 1, &plus)                           // G5's hit, in flight
			require.True(t, tb.TakeBackPending("k", 0, x+100, x, 1, &minus)) // G1's take-back, in flight
			tb.Peek("k", 0, x+2100)                                          // two windows on: x rotates out
			ackPlus := func() { tb.Ack(&plus, strategy.Result{Totals: []int64{1}, Reads: []int64{0}}) }
			ackMinus := func() { tb.Ack(&minus, strategy.Result{Totals: []int64{0}}) }
			if plusFirst {
				ackPlus()
			} else {
				ackMinus()
			}
			require.False(t, tb.TakeBackPending("k", 0, x+2100, x, 1, &took)) // G7's take-back: to a record
			if plusFirst {
				ackMinus()
			} else {
				ackPlus()
			}
			var b Batch
			tb.collectAll(x+2100, false, &b)
			var sum int64
			for _, d := range b.Diffs {
				if d.Start == x {
					sum += d.Delta
				}
			}
			require.Equal(t, int64(-1), sum, "plus acknowledged first: %v; G7's take-back, pushed once", plusFirst)
			tb.Release(&b)
		})
	}
}

// TestViewAtBeyondKeepsHitsAndTakeBacksApart: with a hit and another hit's
// take-back both in flight, a reply may hold the take-back and not the hit,
// so what the node adds to it is the hit (and its unpushed counts): the
// pending amounts are kept by sign. Netted, the two cancelled and a judge
// read the reply alone, one short.
func TestViewAtBeyondKeepsHitsAndTakeBacksApart(t *testing.T) {
	const x = 1_000_000
	tb := newTable(t, Options{Sizes: []time.Duration{time.Second}, Track: true, WriteThrough: true})
	var plus, minus Batch
	tb.AddPending("k", 0, x+100, 1, &plus)
	require.True(t, tb.TakeBackPending("k", 0, x+100, x, 1, &minus))
	tb.Add("k", 0, x+100, 2) // unpushed
	require.Equal(t, [2]int64{1 + 2, 0}, beyondAt(tb, x))
	tb.Ack(&minus, strategy.Result{Totals: []int64{0}})
	require.Equal(t, [2]int64{1 + 2, 0}, beyondAt(tb, x))
	tb.Ack(&plus, strategy.Result{Totals: []int64{1}, Reads: []int64{0}})
	require.Equal(t, [2]int64{2, 0}, beyondAt(tb, x))
	hits, _ := tb.Pending()
	require.Equal(t, int64(2), hits)
}

func beyondAt(tb *Table, x int64) [2]int64 {
	_, _, beyond := tb.ViewAt("k", 0, x)
	return beyond
}
