package ratelimit

import (
	"math"
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

// untilRateBelow returns how long after now, with no new hits, the sliding rate
// of a window of size starting at start, holding current and previous, first
// becomes at most limit, following the rate across the window boundary. It is
// 0 when the rate already is at most limit. Times are Unix milliseconds.
func untilRateBelow(current, previous, now, start, size int64, limit float64) time.Duration {
	if slidingRate(current, previous, now, start, size) <= limit {
		return 0
	}
	end := start + size
	// Within this window the rate falls linearly as previous's weight shrinks:
	// current + previous*(end-t)/size <= limit  <=>  t >= end - (limit-current)*size/previous.
	if previous > 0 && float64(current) <= limit {
		t := float64(end) - (limit-float64(current))*float64(size)/float64(previous)
		ms := int64(math.Ceil(t))
		// Guard float rounding: step forward until the rate really is at most limit.
		for ms < end && slidingRate(current, previous, ms, start, size) > limit {
			ms++
		}
		if ms < end {
			return time.Duration(max(ms-now, 0)) * time.Millisecond
		}
	}
	// In the next window, current becomes previous: rate = current*(end+size-t)/size.
	if current <= 0 {
		return time.Duration(max(end-now, 0)) * time.Millisecond
	}
	if limit < 0 {
		return time.Duration(max(end+size-now, 0)) * time.Millisecond
	}
	t := float64(end+size) - limit*float64(size)/float64(current)
	ms := max(int64(math.Ceil(t)), end)
	for ms < end+size && slidingRate(0, current, ms, end, size) > limit {
		ms++
	}
	return time.Duration(max(ms-now, 0)) * time.Millisecond
}
