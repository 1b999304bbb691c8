package ratelimit

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"time"
)

// callStripe is a cache line counting calls in flight: each call picks one
// at random, so calls on different cores rarely touch the same line.
type callStripe struct {
	n atomic.Int64
	_ [56]byte
}

// enter registers a call before it checks that the namespace is
// open; it returns the stripe to pass to leave, and false (the call already
// left) when the namespace is closed. Close sets closed first and then waits
// for the stripes to empty (waitCalls), so every call either sees closed or
// is waited for: a hit a call reports counted is in the tables (or in a push
// it settled) before Close's flush collects them.
//
// The lean decision paths (decide_window.go, decide_bucket.go) do not
// enter: each counts in one table call, which Close's seal (Namespace.seal)
// waits for or refuses, so their hits are in the tables before the flush.
//
// In local mode there is no flush to wait for, so a call only checks that the
// namespace is open (and returns a nil stripe): a call racing Close counts in
// tables no sync reads, and losing it loses nothing. This keeps two atomic
// writes, each a full barrier on x86, off the hot path.
func (ns *Namespace) enter() (*callStripe, bool) {
	if ns.mode == modeLocal {
		return nil, !ns.closed.Load()
	}
	// A random stripe, not the key's: calls for one hot key from many cores
	// would otherwise all write one line.
	s := &ns.calls[rand.Uint32()%uint32(len(ns.calls))]
	s.n.Add(1)
	if ns.closed.Load() {
		s.n.Add(-1)
		return nil, false
	}
	return s, true
}

func leave(s *callStripe) {
	if s != nil {
		s.n.Add(-1)
	}
}

// waitCalls waits until no call that entered before Close set closed is in
// flight. In synchronous mode a call may wait on the store (at most
// SyncTimeout), so the wait ends when ctx is done, with an error if calls are
// still in flight: their hits may not reach the store. In the other modes a
// call neither waits on anything nor runs user code, so it is waited for
// whatever ctx says (within microseconds, scheduling delays aside): a call
// that returned nil after Close gave up would be a hit counted and lost.
func (ns *Namespace) waitCalls(ctx context.Context) error {
	done := ctx.Done()
	if ns.mode != modeSync {
		done = nil
	}
	pause := 50 * time.Microsecond
	for {
		busy := false
		for i := range ns.calls {
			if ns.calls[i].n.Load() != 0 {
				busy = true
				break
			}
		}
		if !busy {
			return nil
		}
		t := time.NewTimer(pause)
		select {
		case <-done:
			t.Stop()
			return fmt.Errorf("%w: calls still waiting on the store: %w", ErrStoreUnavailable, ctx.Err())
		case <-t.C:
		}
		pause = min(2*pause, 5*time.Millisecond)
	}
}

// closedOr is the error of a call made after Close: ErrNilContext for a nil
// context (the argument check comes first, as before Close), else ErrClosed.
func closedOr(ctx context.Context) error {
	if ctx == nil {
		return ErrNilContext
	}
	return ErrClosed
}
