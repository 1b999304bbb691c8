package ratelimit

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit/strategy"
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

// FuzzSlidingRate checks the window arithmetic's invariants for any counts,
// instant and size. (decision_test.go fuzzes RetryAfter against a brute-force
// scan.)
func FuzzSlidingRate(f *testing.F) {
	f.Add(int64(10), int64(40), int64(1_700_000_070_000), int64(60_000))
	f.Add(int64(0), int64(0), int64(-1), int64(1))
	f.Add(int64(1), int64(1_000_000), int64(123_456_789), int64(999))
	f.Fuzz(func(t *testing.T, cur, prev, now, size int64) {
		if size <= 0 || size > 1<<40 || cur < 0 || prev < 0 || cur > 1<<40 || prev > 1<<40 ||
			now > 1<<50 || now < -(1<<50) {
			t.Skip()
		}
		start := strategy.WindowStart(now, time.Duration(size)*time.Millisecond)
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
	})
}
