package ratelimit

import (
	"errors"
	"fmt"
	"math"
)

// Algorithm selects how a Limit counts.
type Algorithm uint8

// The algorithms a Limit can use. The zero value is SlidingWindow.
const (
	// SlidingWindow, the default, is Kong's sliding-window counter: the
	// current window's hits plus the previous window's, weighted by the part
	// of it still within the last Window. Two counters per key; nodes
	// converge within one SyncRate. Smooth over window boundaries, memory
	// independent of Max.
	SlidingWindow Algorithm = iota
	// FixedWindow counts the hits of the current window only (Limit.Fixed
	// says the same). The cheapest, but a client may send 2×Max around a
	// window boundary.
	FixedWindow
	// TokenBucket is a bucket of Burst tokens (Max when Burst is 0) that
	// refills Max tokens per Window, one every Window/Max: a request of cost
	// c is admitted when the bucket holds c tokens. Bursts up to Burst, then
	// a steady Max per Window. Kept as GCRA keeps it, one instant per key.
	TokenBucket
	// SlidingLog keeps every admitted request's instant: a request is
	// admitted when the requests of the last Window, itself included, cost
	// at most Max. Exact, with memory per key bounded by Max; available in
	// local and synchronous modes (a periodic sync cannot be exact).
	SlidingLog
)

// GCRA is the generic cell rate algorithm: the token bucket, kept as a
// theoretical arrival time. It gives exactly TokenBucket's answers.
const GCRA = TokenBucket

// String returns the algorithm's name: "sliding_window", "fixed_window",
// "token_bucket" or "sliding_log".
func (a Algorithm) String() string {
	switch a {
	case SlidingWindow:
		return "sliding_window"
	case FixedWindow:
		return "fixed_window"
	case TokenBucket:
		return "token_bucket"
	case SlidingLog:
		return "sliding_log"
	}
	return fmt.Sprintf("Algorithm(%d)", uint8(a))
}

// ParseAlgorithm returns the algorithm named s: one of String's names
// ("sliding_window", "fixed_window", "token_bucket", "sliding_log"), or
// "gcra" for the token bucket; "" is the default, SlidingWindow.
func ParseAlgorithm(s string) (Algorithm, error) {
	switch s {
	case "", "sliding_window":
		return SlidingWindow, nil
	case "fixed_window":
		return FixedWindow, nil
	case "token_bucket", "gcra":
		return TokenBucket, nil
	case "sliding_log":
		return SlidingLog, nil
	}
	return 0, fmt.Errorf("%w: unknown algorithm %q (sliding_window, fixed_window, token_bucket, gcra, sliding_log)", ErrInvalidLimit, s)
}

// ErrUnsupportedLimit is returned (it also matches ErrInvalidLimit) by Allow,
// Peek, Refund, Wait and CheckLimits for a limit the namespace cannot enforce
// as documented: a sliding log in periodic mode, or an algorithm the store
// does not implement (see strategy.Capabilities).
var ErrUnsupportedLimit = errors.New("ratelimit: limit not supported here")

// unsupported returns an error that is both ErrInvalidLimit and
// ErrUnsupportedLimit, with the message of the latter once.
func unsupported(format string, args ...any) error {
	return &unsupportedError{fmt.Sprintf(format, args...)}
}

type unsupportedError struct{ msg string }

func (e *unsupportedError) Error() string { return ErrUnsupportedLimit.Error() + ": " + e.msg }

// Is reports whether target is ErrInvalidLimit or ErrUnsupportedLimit.
func (e *unsupportedError) Is(target error) bool {
	return target == ErrInvalidLimit || target == ErrUnsupportedLimit
}

// maxLogMax bounds a sliding log's Max: a log keeps up to two entries per
// unit of Max for each key.
const maxLogMax = 1 << 16

// minInterval is the shortest emission interval a token bucket accepts, in
// milliseconds: a thousand tokens per millisecond. A TAT is a float64 of Unix
// milliseconds, precise to a few hundred nanoseconds today; a shorter
// interval would be lost in its rounding.
const minInterval = 1e-3

// algorithm returns the algorithm l counts with: Fixed is FixedWindow.
func (l Limit) algorithm() Algorithm {
	if l.Fixed && l.Algorithm == SlidingWindow {
		return FixedWindow
	}
	return l.Algorithm
}

// fixed reports whether l counts a fixed window.
func (l *Limit) fixed() bool { return l.Fixed || l.Algorithm == FixedWindow }

// burst returns a token bucket's capacity: Burst, or Max.
func (l Limit) burst() int64 {
	if l.Burst > 0 {
		return l.Burst
	}
	return l.Max
}

// interval returns a token bucket's emission interval: Window/Max, in
// milliseconds per token.
func (l Limit) interval() float64 {
	return float64(l.Window.Milliseconds()) / float64(l.Max)
}

// capacity returns the most a request may cost under l: Max, or a bucket's
// Burst.
func (l *Limit) capacity() int64 {
	if l.Algorithm == TokenBucket && l.Burst > 0 {
		return l.Burst
	}
	return l.Max
}

// checkAlgorithm validates l's algorithm and its parameters, and that the
// namespace can enforce it.
func (ns *Namespace) checkAlgorithm(l *Limit) error {
	switch a := l.algorithm(); {
	case a > SlidingLog:
		return fmt.Errorf("%w: %s: unknown algorithm %d", ErrInvalidLimit, l.PolicyName(), uint8(a))
	case l.Fixed && a != FixedWindow:
		return fmt.Errorf("%w: %s: Fixed is for windows, not %s", ErrInvalidLimit, l.PolicyName(), a)
	case l.Burst != 0 && a != TokenBucket:
		return fmt.Errorf("%w: %s: Burst is for token buckets, not %s", ErrInvalidLimit, l.PolicyName(), a)
	case a == TokenBucket:
		if l.Burst < 0 || l.Burst > MaxValue {
			return fmt.Errorf("%w: %s: Burst %d is not in 1..2^53 (0 means Max)", ErrInvalidLimit, l.PolicyName(), l.Burst)
		}
		if iv := l.interval(); iv < minInterval || math.IsInf(iv, 0) {
			return fmt.Errorf("%w: %s: %d tokens per %v refill more than 1,000 per millisecond", ErrInvalidLimit, l.PolicyName(), l.Max, l.Window)
		}
		if ns.mode == modeLocal {
			break
		}
		caps := ns.caps()
		if ns.mode == modeAsync && !caps.Buckets {
			return unsupported("%s: the store does not keep token buckets", l.PolicyName())
		}
		if ns.mode == modeSync && (!caps.Take || !caps.Buckets) {
			// Take decides; bucket diffs carry what a node decided alone
			// while the store failed.
			return unsupported("%s: the store does not decide and keep token buckets (strategy.Taker, Buckets)", l.PolicyName())
		}
	case a == SlidingLog:
		if l.Max > maxLogMax {
			return fmt.Errorf("%w: %s: a sliding log keeps every request; Max %d is above %d (use a sliding window)", ErrInvalidLimit, l.PolicyName(), l.Max, maxLogMax)
		}
		if ns.mode == modeAsync {
			return unsupported("%s: a sliding log cannot be exact with a periodic sync; use local or synchronous mode", l.PolicyName())
		}
		if ns.mode == modeSync && !ns.caps().Take {
			return unsupported("%s: the store does not keep sliding logs (strategy.Taker)", l.PolicyName())
		}
	}
	return nil
}
