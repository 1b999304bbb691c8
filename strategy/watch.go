package strategy

import "time"

// Watch asks, in a Batch, for the counters of one window that changed since
// a cursor the store answered before: a node holding many keys learns what
// other nodes changed without reading every key it holds.
type Watch struct {
	Size  time.Duration
	Start int64
	// Cursor is the Cursor of the store's last answer for this window; ""
	// asks for every counter of the window.
	Cursor string
	// Limit caps the counters in the answer: when more changed, the answer
	// is an Overflow. A positive number.
	Limit int
}

// Changes answers a Watch.
type Changes struct {
	// Cursor is the store's position in the window's changes once the
	// batch's diffs were applied: pass it in the next Watch of the window.
	// It is set in every answer, Overflow included.
	Cursor string
	// Counters holds every counter of the window whose total changed after
	// the Watch's cursor was answered (by any node's push, this batch's
	// included), once each, with its total once the batch's diffs were
	// applied. It may hold counters that did not change.
	Counters []Counter
	// Overflow reports that the store does not list the changes: more than
	// the Watch's Limit changed (a store may count a counter that changed
	// twice as two changes), or the cursor is not one of this window's (the
	// store lost the window's data or its log since). Counters is then
	// empty, and the caller reads the counters it needs (Batch.Reads) before
	// it relies on Cursor.
	Overflow bool
}

// Capabilities lists what a store implements beyond the window counters that
// every Strategy keeps.
type Capabilities struct {
	// Watch: PushDiffs answers Batch.Watches.
	Watch bool
	// Buckets: PushDiffs applies Batch.BucketDiffs and reads
	// Batch.BucketReads, Purge forgets expired buckets.
	Buckets bool
	// Take: the store implements Taker, for synchronous token-bucket and
	// sliding-log decisions.
	Take bool
}

// Capable is implemented by stores that keep more than window counters. A
// store that does not implement it has none of the Capabilities.
type Capable interface {
	Capabilities() Capabilities
}

// CapabilitiesOf returns s's capabilities.
func CapabilitiesOf(s Strategy) Capabilities {
	if c, ok := s.(Capable); ok {
		return c.Capabilities()
	}
	return Capabilities{}
}
