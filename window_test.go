package ratelimit

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestWeight(t *testing.T) {
	m := time.UnixMilli(1_700_000_040_000)
	require.Equal(t, 1.0, Weight(m, time.Minute))
	require.Equal(t, 0.5, Weight(m.Add(30*time.Second), time.Minute))
	require.Equal(t, 0.25, Weight(m.Add(45*time.Second), time.Minute))
	require.Equal(t, m, WindowStart(m.Add(59999*time.Millisecond), time.Minute))
	// Before 1970 windows still align.
	require.Equal(t, time.UnixMilli(-60_000), WindowStart(time.UnixMilli(-1), time.Minute))
}

func TestUntilRateBelow(t *testing.T) {
	const size = 60_000
	// 10 current, 40 previous, 30 s in: rate 30. At most 20 is reached at 45 s.
	require.Equal(t, 15*time.Second, untilRateBelow(10, 40, 30_000, 0, size, 20))
	require.Zero(t, untilRateBelow(10, 40, 30_000, 0, size, 30))
	// Current alone exceeds the limit: wait into the next window.
	d := untilRateBelow(50, 0, 0, 0, size, 25)
	require.Equal(t, 90*time.Second, d) // next window, rate 50*(60-t)/60 <= 25 at t=30 s
}

// FuzzSlidingRate checks the window arithmetic's invariants for any counts,
// instant and size.
func FuzzSlidingRate(f *testing.F) {
	f.Add(int64(10), int64(40), int64(1_700_000_070_000), int64(60_000), 20.0)
	f.Add(int64(0), int64(0), int64(-1), int64(1), 0.0)
	f.Add(int64(1), int64(1_000_000), int64(123_456_789), int64(999), 0.5)
	f.Fuzz(func(t *testing.T, cur, prev, now, size int64, limit float64) {
		if size <= 0 || size > 1<<40 || cur < 0 || prev < 0 || cur > 1<<40 || prev > 1<<40 ||
			now > 1<<50 || now < -(1<<50) || math.IsNaN(limit) || math.IsInf(limit, 0) || limit < 0 || limit > 1<<41 {
			t.Skip()
		}
		start := windowStart(now, size)
		if now < start || now >= start+size || (start/size)*size != start {
			t.Fatalf("window %d of size %d does not hold %d", start, size, now)
		}
		w := weight(now, start, size)
		if w <= 0 || w > 1 {
			t.Fatalf("weight %v out of (0, 1]", w)
		}
		r := slidingRate(cur, prev, now, start, size)
		if r < float64(cur) || r > float64(cur)+float64(prev) {
			t.Fatalf("rate %v outside [%d, %d]", r, cur, cur+prev)
		}
		d := untilRateBelow(cur, prev, now, start, size, limit)
		if d < 0 {
			t.Fatalf("negative wait %v", d)
		}
		later := now + d.Milliseconds()
		got := rateAt(cur, prev, later, start, size)
		if got > limit+1e-9 {
			t.Fatalf("after waiting %v the rate is %v > %v", d, got, limit)
		}
		if d >= time.Millisecond {
			if before := rateAt(cur, prev, later-1, start, size); before <= limit {
				t.Fatalf("the rate was already %v <= %v a millisecond before the wait ended", before, limit)
			}
		}
	})
}

// rateAt follows a key with no new hits: at t, in the window starting at start,
// or in the windows after it.
func rateAt(cur, prev, t, start, size int64) float64 {
	switch {
	case t < start+size:
		return slidingRate(cur, prev, t, start, size)
	case t < start+2*size:
		return slidingRate(0, cur, t, start+size, size)
	default:
		return 0
	}
}

func windowStart(t, size int64) int64 {
	q := t / size
	if t%size < 0 {
		q--
	}
	return q * size
}
