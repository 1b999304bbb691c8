package strategy

import (
	"context"
	"time"
)

// Taker is implemented by stores that decide synchronous-mode requests on
// token buckets and sliding logs themselves, atomically: a node sends the
// request and the limits, the store admits it when every limit admits it and
// then spends it on every limit, in one round trip.
//
// Take applies a request exactly once per Take.ID, as PushDiffs applies a
// batch: a re-sent Take (after a lost reply, or a client library's retry)
// returns the first attempt's decision with the current states, and changes
// nothing, unless Answered asks the store to settle a decision the node made
// without it (see Take.Answered). Errors mean what PushDiffs's mean: an error
// wrapping ErrNotApplied says nothing was applied; any other leaves the
// outcome unknown, and the caller re-sends the same Take.
type Taker interface {
	Take(ctx context.Context, t *Take) (TakeResult, error)
}

// Answer is a decision a node made from its own state while a Take's outcome
// was unknown.
type Answer int8

// The answers a node gives while its store does not answer.
const (
	// NotAnswered: the store decides.
	NotAnswered Answer = iota
	// AnsweredAdmitted: the node admitted the request.
	AnsweredAdmitted
	// AnsweredRejected: the node rejected the request.
	AnsweredRejected
)

// Take is one synchronous-mode request on one key.
type Take struct {
	// ID is unique per request across every node; a re-send keeps it.
	ID        string
	Namespace string
	Key       string
	// Now is the request's instant, Unix milliseconds.
	Now int64
	// Cost is the request's cost, at least 0.
	Cost int64
	// Peek decides without spending anything (and records nothing under ID).
	Peek bool
	// Refund takes Cost back from every bucket and log instead of spending
	// it: buckets move back by Cost tokens (never past full), logs drop
	// their newest entries' cost by Cost in all. Nothing is decided.
	Refund bool
	// Answered is NotAnswered for a request the store decides. A node that
	// answered the request itself while the outcome of its Take was unknown
	// re-sends the Take with the same ID and its answer: the store then
	// makes its state match that answer exactly once (if it had already
	// decided otherwise under ID, it spends or takes back the difference),
	// and reports Allowed as the node answered.
	Answered Answer
	Buckets  []TakeBucket
	Logs     []TakeLog
}

// TakeBucket is one token-bucket limit of a Take: the bucket BucketID{Key,
// Period} refilling one token per Interval milliseconds, holding at most
// Burst tokens.
type TakeBucket struct {
	Period   time.Duration
	Interval float64
	Burst    int64
	// Penalty spends the cost even when the request is rejected.
	Penalty bool
}

// TakeLog is one sliding-log limit of a Take: at most Max cost within any
// Window, counting every admitted request at its instant.
type TakeLog struct {
	Window time.Duration
	Max    int64
	// Penalty records the request even when it is rejected.
	Penalty bool
}

// TakeResult is a successful Take's answer.
type TakeResult struct {
	// Allowed reports whether every limit admitted the request (for a
	// Refund, true).
	Allowed bool
	// Buckets[i] is Take.Buckets[i]'s state after the take.
	Buckets []BucketState
	// Logs[i] is Take.Logs[i]'s state after the take.
	Logs []LogState
}

// LogState is a sliding log as a Take leaves it, at the Take's Now.
type LogState struct {
	// Count is the cost the log holds within (Now - Window, Now].
	Count int64
	// Fits is the first instant (Unix ms, at least Now) at which a request of
	// the Take's cost fits the log if nothing else arrives: Now when it fits
	// already.
	Fits int64
	// Empty is the first instant at which the log holds nothing within its
	// window (Now when it is empty already).
	Empty int64
}
