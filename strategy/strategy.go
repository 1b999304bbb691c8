// Package strategy defines the contract between the rate limiter's in-memory
// counters and the central store that nodes share (Kong's "strategy").
//
// A counter is identified by (namespace, key, window size, window start). Window
// starts are Unix milliseconds aligned to the window size on the Unix epoch, so
// every node names the same window the same way. Stores keep a 64-bit count per
// counter and never read the clock themselves: every call carries the time it
// is about.
package strategy

import (
	"context"
	"errors"
	"iter"
	"time"

	"github.com/ratesync/ratelimit/internal/floor"
)

// ErrNotApplied is returned (wrapped) by PushDiffs when the store surely
// applied none of the batch: the request was refused before any write, or
// never left this process. The caller may merge the batch's diffs with newer ones and send them
// under a new batch ID. Any push error that does not match ErrNotApplied (with
// errors.Is) means the outcome is unknown, and the caller must re-send the same
// batch, unchanged and under the same ID, until it gets a definite answer.
// Once an attempt's outcome was unknown, only a success settles the batch: a
// later ErrNotApplied speaks for that attempt alone, and an earlier one may
// have been applied.
var ErrNotApplied = errors.New("strategy: batch not applied")

// MaxTotal bounds the magnitude of a counter's total in a store: a push that
// would take a total past ±MaxTotal leaves it at the bound (it saturates)
// instead of overflowing or failing. A node's own counts saturate at half of
// it, so its view of a counter (the store's total plus what it has not
// pushed) never overflows an int64.
const MaxTotal = 1 << 61

// MaxWindow is the longest window size a store must accept: 100 years. A
// store keeps a window for twice its size and more, and 2 × 146 years would
// overflow a time.Duration.
const MaxWindow = 100 * 365 * 24 * time.Hour

// CounterID names one counter within a namespace.
type CounterID struct {
	Key   string
	Size  time.Duration // window size: a positive whole number of milliseconds
	Start int64         // window start, Unix milliseconds, a multiple of Size
}

// Diff is a change to one counter.
type Diff struct {
	CounterID
	Delta int64 // may be negative
}

// Counter is a counter's identity and the store's total for it.
type Counter struct {
	CounterID
	Count int64
}

// Batch is one push: diffs to apply exactly once, and counters to read in the
// same round trip.
type Batch struct {
	// ID is unique per batch across every node and every retry: a store that
	// sees an ID it has already applied must not apply the diffs again, and
	// answers with the current totals instead.
	ID        string
	Namespace string
	// Now is the instant, in Unix milliseconds, the batch is about: bucket
	// diffs recorded at another interval are converted at Now (see
	// ConvertTAT). A re-sent batch keeps its Now. Stores that only count
	// windows may ignore it.
	Now int64
	// Diffs hold at most one entry per counter.
	Diffs []Diff
	// Reads are counters to read without changing them (typically the
	// previous windows and the keys this node saw but did not change).
	Reads []CounterID
	// Watches ask, per window, for the counters changed since a cursor the
	// store gave before (Result.Changes): how a node learns what other
	// nodes changed without reading every key it holds. Only for stores
	// whose Capabilities have Watch.
	Watches []Watch
	// Bulk hints that the batch is one of a cycle changing most of the
	// counters of its windows: a store with change logs may then record the
	// batch's changes as "anything may have changed" instead of listing
	// each, and answer the watches over them with an Overflow. Listing them
	// would cost about what reading them does, twice over.
	Bulk bool
	// PassDiffs, when larger than len(Diffs), is how many diffs the node
	// expects to push in the pass this batch is a chunk of (the core gives
	// its previous pass's count): a store with change logs may scale a
	// window's diffs in the batch by PassDiffs/len(Diffs) when it decides
	// whether they are most of the window, and mark instead of log. The
	// decision stays the store's, against the window's size there: a node
	// churning through a few keys of a large window still logs.
	PassDiffs int
	// BucketDiffs are token-bucket spends to apply exactly once, at most one
	// per bucket; BucketReads are buckets to read. Only for stores whose
	// Capabilities have Buckets.
	BucketDiffs []BucketDiff
	BucketReads []BucketID
}

// Result is a successful push's answer.
type Result struct {
	// Totals[i] is the store's total for Diffs[i] after the batch was applied.
	Totals []int64
	// Reads[i] is the store's total for Reads[i] (0 when it has none).
	Reads []int64
	// Changes[i] answers Watches[i].
	Changes []Changes
	// Buckets[i] is BucketDiffs[i]'s bucket after the batch was applied;
	// BucketReads[i] is BucketReads[i]'s (the zero BucketState when the
	// store holds none: a full bucket).
	Buckets     []BucketState
	BucketReads []BucketState
}

// Query selects the counters GetCounters returns.
type Query struct {
	Namespace string
	Sizes     []time.Duration
	// Now, in Unix milliseconds, selects for each size the window holding Now
	// and the one before it.
	Now int64
	// Keys, when not nil, restricts the answer to these keys; nil means every
	// key of the namespace.
	Keys []string
}

// Strategy is a central store shared by every node. Implementations must be
// safe for concurrent use by many goroutines and many nodes.
//
// What is atomic: PushDiffs applies a batch's diffs exactly once per batch ID,
// even when the same batch is sent again after a lost reply or by a client
// library's own retry. A store may split a batch into parts for transport, as
// long as every part is itself applied at most once (for example with an ID
// derived from the batch ID) and a retry of the batch completes the parts that
// were not applied.
//
// What an error means: the store failed or could not be reached. An error never
// means "denied" and never says anything about rate limits. Implementations
// wrap ErrNotApplied when they know nothing was written, so the caller can
// merge; every other error leaves the outcome unknown and the caller re-sends
// the batch unchanged.
//
// Retention: every counter a store writes must expire by itself or be removed
// by Purge once its window is older than the previous window; a store must not
// grow without bound.
type Strategy interface {
	// PushDiffs applies b.Diffs and reads b.Reads, in one round trip where the
	// store allows it, and returns the totals.
	PushDiffs(ctx context.Context, b *Batch) (Result, error)

	// GetCounters returns the counters of q.Namespace for each size in q.Sizes,
	// in the window holding q.Now and the one before it, restricted to q.Keys
	// when that is not nil. Counters the store does not hold are left out. An
	// error is yielded once, as the last element, and ends the sequence.
	GetCounters(ctx context.Context, q Query) iter.Seq2[Counter, error]

	// GetWindow returns one counter's total, 0 when the store does not hold it.
	GetWindow(ctx context.Context, namespace string, id CounterID) (int64, error)

	// Purge removes the counters whose window is older than the previous
	// window at now (Unix milliseconds): start + 2*size <= now. Stores that
	// expire counters by themselves may do nothing.
	Purge(ctx context.Context, now int64) error
}

// WindowStart returns the start, in Unix milliseconds, of the window of the given
// size that holds the instant t (Unix milliseconds). It floors toward minus
// infinity, so instants before 1970 still map to aligned windows.
func WindowStart(t int64, size time.Duration) int64 {
	s := size.Milliseconds()
	if s <= 0 {
		return t
	}
	return floor.Div(t, s) * s
}
