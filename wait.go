package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// ErrWouldExceedDeadline is returned by Wait, at once, when the request
// cannot be admitted before the context's deadline: waiting would only end in
// the deadline.
var ErrWouldExceedDeadline = errors.New("ratelimit: wait would exceed the context's deadline")

// Wait blocks until a request of the given cost is admitted for key under
// every limit, and counts it, like Allow; it shapes traffic instead of
// refusing it. After each wait it decides again, since another request (on
// this node or another) may have taken the room it waited for.
//
// It never sleeps past the context's deadline: when the wait the decision
// reports would end after it, Wait returns at once the rejected Decision and
// an error matching ErrWouldExceedDeadline. When the context is done while
// waiting, it returns the last Decision and the context's error. Arguments
// are checked as Allow checks them, and the namespace's Close ends a wait with
// ErrClosed.
func (ns *Namespace) Wait(ctx context.Context, key string, cost int64, limits ...Limit) (Decision, error) {
	if ctx == nil {
		return Decision{}, ErrNilContext
	}
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		if ns.tick != nil {
			ns.tick.refresh() // decide at the time the wait ended, not a tick before
		}
		d, err := ns.Allow(ctx, key, cost, limits...)
		if err != nil || d.Allowed {
			return d, err
		}
		wait := d.RetryAfter
		if wait <= 0 {
			// Rejected with nothing to wait for: a racing request's hit,
			// taken back since. Decide again after a moment.
			wait = time.Millisecond
		}
		if deadline, ok := ctx.Deadline(); ok && time.Until(deadline) < wait {
			return d, fmt.Errorf("%w: %v to wait, %v left", ErrWouldExceedDeadline, wait, time.Until(deadline).Round(time.Millisecond))
		}
		if timer == nil {
			timer = time.NewTimer(wait)
		} else {
			timer.Reset(wait)
		}
		select {
		case <-timer.C:
		case <-ctx.Done():
			return d, ctx.Err()
		case <-ns.closing.Done():
			return d, ErrClosed
		}
	}
}
