package ratelimit

// This file is the window model, the whole of it, on Unix milliseconds:
//
//   - windows of a size are aligned on the Unix epoch (WindowStart), so
//     every node names the same window the same way;
//   - a sliding window's load at an instant is the current window's count
//     plus the previous window's, weighted by the part of it that still lies
//     within the last window size (Weight, SlidingRate); a fixed window's is
//     the current count alone (load);
//   - a request of some cost fits a limit when the load plus the cost is at
//     most the limit's Max (fits); Remaining is what is left (remaining);
//   - with no new hits, counts only age: the current window becomes the
//     previous one, then both are forgotten (project); the time a request
//     waits (retryAfter) and the time until the load is 0 (resetAfter)
//     follow from that.
//
// The one division by a window size rounds toward minus infinity
// (internal/floor), so instants before 1970 still fall into aligned windows.

import (
	"math"
	"time"

	"github.com/ratesync/ratelimit/shm"
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
// For example, with 10 hits in the current minute and 40 in the previous one,
// SlidingRate(10, 40, t, time.Minute) is 30 when t is 30 s into its minute:
// half of the previous minute still lies within the last 60 s.
func SlidingRate(current, previous int64, t time.Time, size time.Duration) float64 {
	return float64(current) + float64(previous)*Weight(t, size)
}

func slidingRate(current, previous, now, start, size int64) float64 {
	return float64(current) + float64(previous)*weight(now, start, size)
}

// load returns what a limit weighs at now for counts v plus cost: the sliding
// rate, or for a fixed window the current count. Negative counts (refunds
// through Increment) weigh 0.
func load(v shm.View, size, now, cost int64, fixed bool) float64 {
	cur := max(v.Cur, 0) + cost
	if fixed || v.Prev <= 0 {
		return float64(cur)
	}
	// The explicit conversion rounds the product: an architecture that fuses
	// multiply-add (arm64) would otherwise be free to fuse one inlined copy
	// of load and not another, and an admitted call's Remaining reuses the
	// judge's load (see decisionWindows).
	return float64(cur) + float64(float64(v.Prev)*weight(now, v.Start, size))
}

// fits reports whether a request of cost at now fits l given counts v.
func fits(v shm.View, size, now, cost int64, l *Limit) bool {
	return load(v, size, now, cost, l.fixed()) <= float64(l.Max)
}

func remaining(v shm.View, size, now int64, l *Limit) int64 {
	return remainingOf(load(v, size, now, 0, l.fixed()), l)
}

// remainingOf is remaining for a limit whose load is ld.
func remainingOf(ld float64, l *Limit) int64 {
	r := math.Floor(float64(l.Max) - ld)
	if r <= 0 {
		return 0
	}
	return int64(r)
}

// project returns what counts v (held at some earlier instant) become at t if
// no hit arrives: the current window turns into the previous one, then both
// are forgotten.
func project(v shm.View, size, t int64) shm.View {
	switch {
	case t < v.Start+size:
		return v
	case t < v.Start+2*size:
		return shm.View{Start: v.Start + size, Prev: v.Cur}
	default:
		return shm.View{Start: v.Start + (t-v.Start)/size*size}
	}
}

// retryAfter returns how many milliseconds after now, with no new hits, a
// request of cost first fits l given counts v (0 if it fits now). The load
// never grows without hits, so the first instant is found by bisection, with
// the exact predicate Allow uses. A closed form in floating point would be
// shorter, but its rounding can make it a millisecond late or early against
// that predicate.
func retryAfter(v shm.View, size, now, cost int64, l *Limit) int64 {
	ok := func(t int64) bool { return fits(project(v, size, t), size, t, cost, l) }
	if ok(now) {
		return 0
	}
	// Two windows after v's, both counts are forgotten and cost <= Max fits.
	lo, hi := now, max(now+1, v.Start+2*size)
	for hi-lo > 1 {
		mid := lo + (hi-lo)/2
		if ok(mid) {
			hi = mid
		} else {
			lo = mid
		}
	}
	return hi - now
}

// resetAfter returns how many milliseconds after now, with no new hits, a
// limit's load given counts v falls to 0.
func resetAfter(v shm.View, size, now int64, fixed bool) int64 {
	var at int64
	switch {
	case v.Cur > 0 && fixed:
		at = v.Start + size
	case v.Cur > 0:
		at = v.Start + 2*size
	case v.Prev > 0 && !fixed:
		at = v.Start + size
	}
	return max(at-now, 0)
}
