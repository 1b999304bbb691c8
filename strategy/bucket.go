package strategy

// This file is the token bucket's store-side model, the whole of it. A bucket
// is kept as GCRA keeps it: one number, its theoretical arrival time (TAT),
// the instant at which the bucket is full again. At an instant now, a bucket
// of capacity Burst tokens that refills one token per Interval holds
//
//	Burst - (max(TAT, now) - now) / Interval
//
// tokens; a TAT at or before now is a full bucket. Spending c tokens at now
// moves the TAT to max(TAT, now) + c*Interval. Every node counts its spends
// locally between two pushes and sends them as one BucketDiff: the
// composition of all its spends, a map of the store's TAT of the form
//
//	tat -> max(tat + Add, Floor)
//
// Spending and refunding are both maps of that form, and the form is closed
// under composition, so a node's spends fold into one diff whatever their
// number, and applying the diff gives exactly what applying each spend in
// turn would have given. Stores implement Apply (in Lua, SQL or Go) and
// nothing else of the bucket's arithmetic; the decision (how many tokens a
// request needs, whether it fits) is the node's.

import (
	"math"
	"time"
)

// BucketID names a token bucket: a key's bucket for token-bucket limits of
// one period (Limit.Window). Buckets of different periods are distinct.
type BucketID struct {
	Key    string
	Period time.Duration // a positive whole number of milliseconds
}

// BucketState is a bucket as the store holds it. The zero value is a bucket
// the store holds no state for: a full bucket.
type BucketState struct {
	// TAT is the theoretical arrival time, in Unix milliseconds (fractional):
	// the bucket is full at TAT and after.
	TAT float64
	// Interval is the emission interval, in milliseconds per token, that TAT
	// was last advanced with: a node whose limit refills at another rate
	// converts TAT first (ConvertTAT). 0 when the store holds no state.
	Interval float64
}

// Held reports whether the store holds state for the bucket.
func (s BucketState) Held() bool { return s.Interval > 0 }

// BucketDiff is a node's spends on one bucket since its last push: the store's
// state becomes Apply(state, diff, batch's Now).
type BucketDiff struct {
	BucketID
	// Add is the sum of the spends' costs times Interval, in milliseconds
	// (negative when refunds outweigh spends).
	Add float64
	// Floor is a Unix-millisecond instant the TAT is raised to at least.
	Floor float64
	// Interval is the emission interval, milliseconds per token, the spends
	// were counted with.
	Interval float64
}

// ConvertTAT returns tat, kept at interval from, as the TAT at interval to at
// now: the tokens the bucket owes at now stay owed, so a limit whose rate
// changes keeps what a client has spent. A full bucket stays full.
func ConvertTAT(tat, from, to float64, now int64) float64 {
	n := float64(now)
	if tat <= n || from <= 0 || from == to {
		return tat
	}
	return n + (tat-n)*to/from
}

// ApplyBucket returns the state s becomes when d is applied at now (the
// batch's Now): tat -> max(ConvertTAT(tat) + Add, Floor). A bucket the store
// holds no state for has been full since before any of d's spends (its TAT
// is minus infinity) and becomes Floor, what the spends make of a full
// bucket one after another: starting it at now instead would charge it the
// refill between the first spend and the push.
func ApplyBucket(s BucketState, d BucketDiff, now int64) BucketState {
	if !s.Held() {
		return BucketState{TAT: d.Floor, Interval: d.Interval}
	}
	tat := ConvertTAT(s.TAT, s.Interval, d.Interval, now)
	return BucketState{TAT: math.Max(tat+d.Add, d.Floor), Interval: d.Interval}
}

// BucketRetention is how long past its TAT a store keeps a bucket at least:
// until TAT + Period + BucketRetention. By then the bucket has been full for
// longer than any clock skew between nodes, so reading it as full (no state)
// is what every node would conclude anyway.
const BucketRetention = time.Minute

// BucketExpiry returns the Unix-millisecond instant from which a store may
// forget a bucket in state s (s.Held()) of period p.
func BucketExpiry(s BucketState, p time.Duration) int64 {
	return int64(math.Ceil(s.TAT)) + p.Milliseconds() + BucketRetention.Milliseconds()
}

// SpendDiff returns the diff of spending cost tokens at now on a bucket
// refilling one token per interval milliseconds: tat -> max(tat, now) +
// cost*interval.
func SpendDiff(id BucketID, cost int64, interval float64, now int64) BucketDiff {
	add := float64(float64(cost) * interval)
	return BucketDiff{BucketID: id, Add: add, Floor: float64(float64(now) + add), Interval: interval}
}

// RefundDiff returns the diff of giving cost tokens back at now: tat ->
// max(tat - cost*interval, now), never past full.
func RefundDiff(id BucketID, cost int64, interval float64, now int64) BucketDiff {
	return BucketDiff{BucketID: id, Add: -float64(float64(cost) * interval), Floor: float64(now), Interval: interval}
}

// BucketFits reports whether a request of cost tokens fits, at now, a bucket
// in state s that refills one token per interval milliseconds and holds at
// most burst tokens: whether the time the bucket owes,
//
//	max(tat - now, 0) <= (burst - cost) * interval
//
// is within what the request leaves. It is evaluated in this form, in
// float64: tat - now is exact (the two are within a factor of two of each
// other), so a full bucket always admits a request of its whole burst,
// where adding cost*interval to a TAT of 1.7e12 ms first would round. Stores
// that decide (in Lua or SQL) evaluate the same expression, so nodes and
// stores agree to the bit.
func BucketFits(s BucketState, interval float64, burst, cost, now int64) bool {
	if !s.Held() {
		return cost <= burst
	}
	owed := ConvertTAT(s.TAT, s.Interval, interval, now) - float64(now)
	if owed <= 0 {
		return cost <= burst
	}
	return owed <= float64(float64(burst-cost)*interval)
}
