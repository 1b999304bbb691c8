package ratelimit

// This file is the token bucket's model as a decision sees it, the whole of
// it, on Unix milliseconds. A bucket is its theoretical arrival time (TAT,
// see strategy/bucket.go): at an instant now, a bucket of capacity burst that
// refills one token per interval holds
//
//	burst - (max(TAT, now) - now) / interval
//
// tokens; a request of cost c fits when that is at least c (fits, evaluated
// exactly as strategy.BucketFits so nodes and stores agree), and spending it
// moves the TAT to max(TAT, now) + c*interval. With no new requests the TAT
// stays where it is and time catches up with it: the bucket is full at TAT
// (bucketReset), and a request of cost c fits from TAT - (burst-c)*interval
// (bucketRetryAfter).

import (
	"math"

	"github.com/ratesync/ratelimit/strategy"
)

// bucketFits reports whether a request of cost fits at now a bucket whose TAT
// is tat.
func bucketFits(tat float64, now int64, interval float64, burst, cost int64) bool {
	return strategy.BucketFits(strategy.BucketState{TAT: tat, Interval: interval}, interval, burst, cost, now)
}

// bucketAfter returns the TAT after spending cost at now.
func bucketAfter(tat float64, now int64, interval float64, cost int64) float64 {
	return float64(math.Max(tat, float64(now)) + float64(float64(cost)*interval))
}

// bucketRemaining returns the whole tokens a bucket whose TAT is tat holds at
// now.
func bucketRemaining(tat float64, now int64, interval float64, burst int64) int64 {
	owed := (math.Max(tat, float64(now)) - float64(now)) / interval
	r := math.Floor(float64(burst) - owed + 1e-9) // a hair of slack: 2.9999999 tokens are 3
	if r <= 0 {
		return 0
	}
	return min(int64(r), burst)
}

// bucketReset returns how many milliseconds after now a bucket whose TAT is
// tat is full again.
func bucketReset(tat float64, now int64) int64 {
	return max(int64(math.Ceil(tat-float64(now))), 0)
}

// bucketRetryAfter returns how many milliseconds after now, with no other
// spends, a request of cost first fits a bucket whose TAT is tat: the
// smallest whole number of milliseconds for which bucketFits holds, found
// from the closed form and settled against the predicate itself, so a client
// that waits exactly that long is admitted and one that comes a millisecond
// earlier is not.
func bucketRetryAfter(tat float64, now int64, interval float64, burst, cost int64) int64 {
	ok := func(d int64) bool { return bucketFits(tat, now+d, interval, burst, cost) }
	if ok(0) {
		return 0
	}
	d := max(int64(math.Ceil(tat-float64(burst-cost)*interval-float64(now))), 1)
	for d > 1 && ok(d-1) {
		d--
	}
	for !ok(d) {
		d++
	}
	return d
}
