package ratelimit

import (
	"time"

	"github.com/ratesync/ratelimit/strategy"
)

// WindowStart returns the start of the window of the given size that holds t.
// Windows are aligned on the Unix epoch, so every node agrees on them.
func WindowStart(t time.Time, size time.Duration) time.Time {
	return time.UnixMilli(strategy.WindowStart(t.UnixMilli(), size))
}

// Weight returns the weight of the previous window at t for windows of the
// given size: (size - (t mod size)) / size, in (0, 1]. It is 1 at the start of
// a window and approaches 0 at its end.
func Weight(t time.Time, size time.Duration) float64 {
	ms := t.UnixMilli()
	return weight(ms, strategy.WindowStart(ms, size), size.Milliseconds())
}

func weight(now, start, size int64) float64 {
	elapsed := now - start
	if elapsed < 0 { // the clock went back behind the window the hit counted in
		elapsed = 0
	}
	if elapsed >= size {
		return 0
	}
	return float64(size-elapsed) / float64(size)
}

// SlidingRate returns the sliding-window rate at t: current + previous * Weight.
// The seed's worked example: SlidingRate(10, 40, t, time.Minute) is 30 when t is
// 30 s into its minute.
func SlidingRate(current, previous int64, t time.Time, size time.Duration) float64 {
	return float64(current) + float64(previous)*Weight(t, size)
}

func slidingRate(current, previous, now, start, size int64) float64 {
	return float64(current) + float64(previous)*weight(now, start, size)
}
