package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/ratesync/ratelimit/shm"
)

// Errors returned by Allow and Peek, besides the namespace's own.
var (
	// ErrInvalidLimit: no limits, or a Limit whose Max is not in 1..MaxValue.
	ErrInvalidLimit = errors.New("ratelimit: invalid limit")
	// ErrInvalidCost: a cost below 0, or above the Max of a limit (such a
	// request could never be admitted, so no Retry-After could be true).
	ErrInvalidCost = errors.New("ratelimit: invalid cost")
)

// Limit is a policy: at most Max hits per Window for one key.
//
// Limits with the same Window share one counter per key: a hit is counted
// once however many of them name that window.
type Limit struct {
	// Window is the window size; it must be one of the namespace's
	// WindowSizes.
	Window time.Duration
	// Max is the largest load admitted, between 1 and MaxValue.
	Max int64
	// Fixed reads the window as a fixed window (the previous window weighs
	// 0), as Kong's "fixed" option. Default: sliding.
	Fixed bool
	// Penalty counts rejected hits too, as Kong does: a client that keeps
	// sending while rejected stays rejected. Default: rejected hits are not
	// counted.
	Penalty bool
	// Name names the policy in headers and problem reports. Default: see
	// PolicyName.
	Name string
}

// PolicyName returns l.Name, or a name derived from the window: "per-second",
// "per-minute", "per-hour", "per-day", else "per-" and the window (for
// example "per-1m30s").
func (l Limit) PolicyName() string {
	if l.Name != "" {
		return l.Name
	}
	switch l.Window {
	case time.Second:
		return "per-second"
	case time.Minute:
		return "per-minute"
	case time.Hour:
		return "per-hour"
	case 24 * time.Hour:
		return "per-day"
	}
	return "per-" + l.Window.String()
}

// Decision is the answer to Allow or Peek.
type Decision struct {
	// Allowed reports whether the request is admitted (and, for Allow with a
	// positive cost, counted).
	Allowed bool
	// Limit is the binding limit: when rejected, the violated limit that
	// takes longest to admit the request; when admitted, the limit with the
	// least Remaining (the first such, in the order given).
	Limit Limit
	// Remaining is how many more hits of cost 1 the binding limit admits now
	// (the floor of Max minus its load, at least 0). After an admitted Allow
	// it counts this request as spent.
	Remaining int64
	// Reset is how long, with no new hits, until the binding limit's load
	// falls to 0, i.e. its whole quota is available again. A sliding window
	// forgets a hit when the window after the one it counted in ends, so this
	// can be up to twice the window; for a fixed window it is the end of the
	// current window.
	Reset time.Duration
	// RetryAfter is 0 when Allowed. When rejected, it is the earliest time,
	// with no other traffic, at which the same request would be admitted: one
	// sent exactly RetryAfter later is admitted, one sent any earlier is not.
	// It is a whole number of milliseconds and assumes the clock moves
	// forward.
	RetryAfter time.Duration
	// Degraded reports that the decision was made from this node's state
	// because the store failed: during the call (synchronous mode), or in the
	// last sync cycle (periodic mode), so the cluster's counts this node knows
	// are a stale lower bound. The hits are kept and pushed later.
	Degraded bool
}

// maxInlineLimits is how many limits Allow handles without allocating.
const maxInlineLimits = 4

// lstate is one limit's working state in a decision.
type lstate struct {
	t       *shm.Table
	ti      int   // index of t in the namespace's tables
	idx     int   // index of the window in the namespace's WindowSizes
	w       int   // index of the window in the table's entries
	size    int64 // window size, ms
	owner   int   // the first limit with the same window: it holds the counter's view
	penalty bool  // (owner only) some limit on this counter counts rejected hits
	served  bool  // (owner only) applyLocal has reached this counter in the current pass
	v       shm.View
}

// Allow decides whether a request of the given cost may pass for key under
// every limit, and counts it when it does. A request is admitted when, for
// every limit, the key's load (sliding rate, or the current window's count
// for a fixed window) plus cost is at most Max. An admitted request is counted
// in every limit's window; a rejected one is not counted (unless a limit has
// Penalty, in which case it is counted in that limit's window).
//
// A cost of 0 counts nothing and answers like Peek. Bad arguments return an
// error (ErrInvalidKey, ErrInvalidCost, ErrInvalidLimit, ErrUnknownWindow,
// ErrNilContext, ErrClosed); a store failure does not: the decision is made
// from this node's state and has Degraded set.
//
// Local and asynchronous modes answer from memory: the hit is added to each
// window and taken back when a limit rejects it, so concurrent requests never
// exceed a limit on this node; a racing request may be rejected because of a
// hit that is then taken back. Across nodes the limit is as exact as the sync
// rate allows. Synchronous mode writes the hit through to the store in one
// round trip for all limits and, when rejected, takes it back in a second one;
// the whole call waits at most the namespace's SyncTimeout. Once this node
// knows a key is over a limit (its last view of the store, plus its own hits,
// rejects the request), Allow answers from memory without touching the store
// until the window has slid far enough: the circuit breaker of seed 001.
func (ns *Namespace) Allow(ctx context.Context, key string, cost int64, limits ...Limit) (Decision, error) {
	return ns.decide(ctx, key, cost, limits, true)
}

// Peek answers what Allow would answer for the same request, without counting
// anything. Remaining is what Allow would report, so it counts the peeked cost
// as spent when the request would be admitted. In synchronous mode it reads
// the store (one round trip), unless this node already knows the key is over
// a limit.
func (ns *Namespace) Peek(ctx context.Context, key string, cost int64, limits ...Limit) (Decision, error) {
	return ns.decide(ctx, key, cost, limits, false)
}

// Refund takes back a cost that Allow counted for key, for a request that was
// not served after all (it failed, or a fail-closed route refused it): it
// subtracts cost from the current window of each distinct window of limits.
// It never waits for the store: outside local mode the correction is pushed
// with the next sync (in synchronous mode, by the retry loop, within
// RetryInterval). It returns the argument errors Allow returns.
func (ns *Namespace) Refund(ctx context.Context, key string, cost int64, limits ...Limit) error {
	var buf [maxInlineLimits]lstate
	key, st, err := ns.resolve(ctx, key, cost, limits, buf[:0])
	if err != nil || cost == 0 {
		return err
	}
	now := ns.now()
	for j := range st {
		if st[j].owner == j {
			st[j].t.Add(key, st[j].w, now, -cost)
		}
	}
	return nil
}

func (ns *Namespace) decide(ctx context.Context, key string, cost int64, limits []Limit, count bool) (Decision, error) {
	var buf [maxInlineLimits]lstate
	key, st, err := ns.resolve(ctx, key, cost, limits, buf[:0])
	if err != nil {
		return Decision{}, err
	}
	d, bind := ns.decideIn(ctx, key, cost, limits, st, count && cost > 0)
	if count { // Allow's answers are counted in Stats, Peek's are not
		ns.stats.recordDecision(key, st[bind].idx, d.Allowed, d.Degraded)
	}
	return d, nil
}

// decideIn makes the decision for resolved arguments and returns it with the
// index of the binding limit.
func (ns *Namespace) decideIn(ctx context.Context, key string, cost int64, limits []Limit, st []lstate, count bool) (Decision, int) {
	now := ns.now()
	if ns.mode == modeSync {
		return ns.decideSync(ctx, key, cost, limits, st, now, count)
	}
	applyLocal(key, st, now, cost, !count, false) // counts cost, or only reads
	ok := admits(st, limits, now, cost, count)
	if count && !ok {
		applyLocal(key, st, now, -cost, false, true)
	}
	d, bind := decision(st, limits, now, cost, ok, count)
	d.Degraded = ns.storeDown.Load() // the cluster's counts are stale while the store fails
	return d, bind
}

// decideSync is decideIn in synchronous mode.
func (ns *Namespace) decideSync(ctx context.Context, key string, cost int64, limits []Limit, st []lstate, now int64, count bool) (Decision, int) {
	// The circuit breaker: this node's view is the store's total as last
	// learned plus the hits counted here since, a lower bound of the
	// cluster's count. If it rejects, the store would too.
	peekAll(key, st, now)
	if !admits(st, limits, now, cost, false) {
		if count {
			for j := range st {
				if st[j].owner == j && st[j].penalty {
					// Counted here; the retry loop pushes it within RetryInterval.
					st[j].v = st[j].t.Add(key, st[j].w, now, cost)
				}
			}
		}
		return decision(st, limits, now, cost, false, count)
	}
	start := time.Now() // wall time: SyncTimeout bounds the whole call
	value := int64(0)   // a peek reads the counters
	if count {
		value = cost
	}
	err := ns.throughAll(ctx, key, st, now, value)
	ok := admits(st, limits, now, cost, count)
	degraded := err != nil
	if count && !ok {
		budget := ns.cfg.SyncTimeout - time.Since(start)
		undo := false
		for j := range st {
			undo = undo || (st[j].owner == j && !st[j].penalty)
		}
		switch {
		case !undo:
		case degraded || budget <= 0:
			// Take the hit back here; the retry loop pushes the correction.
			for j := range st {
				if st[j].owner == j && !st[j].penalty {
					st[j].v = st[j].t.Add(key, st[j].w, now, -cost)
				}
			}
		default:
			uctx, cancel := context.WithTimeout(ctx, budget)
			err = ns.undoAll(uctx, key, st, now, cost)
			cancel()
			degraded = degraded || err != nil
		}
	}
	d, bind := decision(st, limits, now, cost, ok, count)
	d.Degraded = degraded
	return d, bind
}

// throughAll writes value through to the store for every counter of st in one
// round trip (value 0: reads them), then loads the views.
func (ns *Namespace) throughAll(ctx context.Context, key string, st []lstate, now, value int64) error {
	p := ns.newPush()
	for j := range st {
		if s := &st[j]; s.owner == j {
			part := &p.parts[s.ti]
			if value == 0 {
				s.t.PeekReads(key, s.w, now, part)
			} else {
				s.t.AddPending(key, s.w, now, value, part)
			}
		}
	}
	err := ns.sendThrough(ctx, p)
	peekAll(key, st, now)
	return err
}

// undoAll takes back cost from every counter of st without penalty, in one
// round trip.
func (ns *Namespace) undoAll(ctx context.Context, key string, st []lstate, now, cost int64) error {
	p := ns.newPush()
	for j := range st {
		if s := &st[j]; s.owner == j && !s.penalty {
			s.t.AddPending(key, s.w, now, -cost, &p.parts[s.ti])
		}
	}
	err := ns.sendThrough(ctx, p)
	peekAll(key, st, now)
	return err
}

// peekAll loads the view of every counter of st from the tables.
func peekAll(key string, st []lstate, now int64) {
	for j := range st {
		if st[j].owner == j {
			st[j].v = st[j].t.Peek(key, st[j].w, now)
		}
	}
}

// applyLocal adds value to the counter of every owner in st (or only reads
// them, with peek; skipping owners with a penalty, with spare) and stores the
// views, with one table lookup per table: the two window sizes of an entry
// are served together.
func applyLocal(key string, st []lstate, now, value int64, peek, spare bool) {
	for j := range st {
		st[j].served = false
	}
	for j := range st {
		if st[j].owner != j || st[j].served || (spare && st[j].penalty) {
			continue
		}
		var mask uint8
		var owners [2]int
		for k := j; k < len(st); k++ {
			if st[k].owner == k && st[k].ti == st[j].ti && !(spare && st[k].penalty) {
				mask |= 1 << st[k].w
				owners[st[k].w] = k
				st[k].served = true
			}
		}
		views := st[j].t.AddWindows(key, now, mask, [2]int64{value, value}, peek)
		for w := range 2 {
			if mask&(1<<w) != 0 {
				st[owners[w]].v = views[w]
			}
		}
	}
}

// resolve validates a decision's arguments and fills st, one entry per limit.
func (ns *Namespace) resolve(ctx context.Context, key string, cost int64, limits []Limit, st []lstate) (string, []lstate, error) {
	switch {
	case ctx == nil:
		return "", nil, ErrNilContext
	case ns.closed.Load():
		return "", nil, ErrClosed
	case key == "":
		return "", nil, ErrInvalidKey
	case len(limits) == 0:
		return "", nil, fmt.Errorf("%w: no limits", ErrInvalidLimit)
	case cost < 0:
		return "", nil, fmt.Errorf("%w: %d is negative", ErrInvalidCost, cost)
	}
	if cap(st) < len(limits) {
		st = make([]lstate, 0, len(limits))
	}
	for j, l := range limits {
		i, err := ns.checkLimit(cost, l)
		if err != nil {
			return "", nil, err
		}
		owner := j
		for k := range j {
			if limits[k].Window == l.Window {
				owner = k
				break
			}
		}
		// Filled in place: cheaper than appending a composite literal.
		st = st[:j+1]
		ls := &st[j]
		ls.t, ls.ti, ls.idx, ls.w, ls.size, ls.owner = ns.tables[i/2], i/2, i, i%2, ns.sizeMS[i], owner
		ls.penalty, ls.served, ls.v = false, false, shm.View{}
		if l.Penalty {
			st[owner].penalty = true
		}
	}
	return ns.storedKey(key), st, nil
}

// checkLimit validates one limit for a request of cost and returns the index
// of its window.
func (ns *Namespace) checkLimit(cost int64, l Limit) (int, error) {
	if l.Max <= 0 || l.Max > MaxValue {
		return 0, fmt.Errorf("%w: %s: Max %d is not in 1..2^53", ErrInvalidLimit, l.PolicyName(), l.Max)
	}
	if cost > l.Max {
		return 0, fmt.Errorf("%w: %d exceeds %s's Max %d: it could never be admitted", ErrInvalidCost, cost, l.PolicyName(), l.Max)
	}
	return ns.windowIndex(l.Window)
}

// CheckLimits reports whether Allow would accept cost and limits: the errors
// Allow returns for them (ErrInvalidCost, ErrInvalidLimit, ErrUnknownWindow),
// without touching any counter. Use it to validate a configuration once.
func (ns *Namespace) CheckLimits(cost int64, limits ...Limit) error {
	if len(limits) == 0 {
		return fmt.Errorf("%w: no limits", ErrInvalidLimit)
	}
	if cost < 0 {
		return fmt.Errorf("%w: %d is negative", ErrInvalidCost, cost)
	}
	for _, l := range limits {
		if _, err := ns.checkLimit(cost, l); err != nil {
			return err
		}
	}
	return nil
}

// admits reports whether every limit admits a request of cost at now. When
// counted, the views already include the request's cost.
func admits(st []lstate, limits []Limit, now, cost int64, counted bool) bool {
	for j, l := range limits {
		v := st[st[j].owner].v
		if counted {
			v.Cur -= cost
		}
		if !fits(v, st[j].size, now, cost, l) {
			return false
		}
	}
	return true
}

// decision builds the Decision from the counters' state after the call.
// counted says the views include the cost when the request was admitted.
// It also returns the index of the binding limit.
func decision(st []lstate, limits []Limit, now, cost int64, ok, counted bool) (Decision, int) {
	d := Decision{Allowed: ok, Remaining: math.MaxInt64}
	bind := -1
	var bindRetry int64
	for j, l := range limits {
		v := st[st[j].owner].v
		if ok && !counted {
			v.Cur += cost // what Allow would report: this request spent
		}
		rem := remaining(v, st[j].size, now, l)
		if ok {
			if rem < d.Remaining {
				bind, d.Remaining = j, rem
			}
			continue
		}
		if r := retryAfter(v, st[j].size, now, cost, l); r > 0 && (bind < 0 || r > bindRetry) {
			bind, bindRetry, d.Remaining = j, r, rem
		}
	}
	if bind < 0 { // rejected, yet nothing to wait for: a racing hit was taken back
		bind, d.Remaining = 0, remaining(st[st[0].owner].v, st[0].size, now, limits[0])
	}
	v := st[st[bind].owner].v
	d.Limit = limits[bind]
	d.Reset = time.Duration(resetAfter(v, st[bind].size, now, d.Limit.Fixed)) * time.Millisecond
	d.RetryAfter = time.Duration(bindRetry) * time.Millisecond
	return d, bind
}

// load returns what a limit weighs at now for counts v plus cost: the sliding
// rate, or for a fixed window the current count. Negative counts (refunds
// through Increment) weigh 0.
func load(v shm.View, size, now, cost int64, fixed bool) float64 {
	cur := max(v.Cur, 0) + cost
	if fixed || v.Prev <= 0 {
		return float64(cur)
	}
	return float64(cur) + float64(v.Prev)*weight(now, v.Start, size)
}

// fits reports whether a request of cost at now fits l given counts v.
func fits(v shm.View, size, now, cost int64, l Limit) bool {
	return load(v, size, now, cost, l.Fixed) <= float64(l.Max)
}

func remaining(v shm.View, size, now int64, l Limit) int64 {
	r := math.Floor(float64(l.Max) - load(v, size, now, 0, l.Fixed))
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
// the exact predicate Allow uses; the window arithmetic's closed form
// (untilRateBelow) is not used because its float rounding can make it a
// millisecond late or early against that predicate.
func retryAfter(v shm.View, size, now, cost int64, l Limit) int64 {
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
