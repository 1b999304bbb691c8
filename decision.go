package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/ratesync/ratelimit/shm"
	"github.com/ratesync/ratelimit/strategy"
)

// Errors returned by Allow and Peek, besides the namespace's own.
var (
	// ErrInvalidLimit is returned by Allow, Peek, Refund, Wait and
	// CheckLimits when they are given no limits, or a Limit they cannot
	// enforce: Max not in 1..MaxValue, an unknown Algorithm, Fixed on a
	// limit that is not a window, Burst on one that is not a token bucket
	// (or out of range), a bucket refilling more than 1,000 tokens per
	// millisecond, a sliding log whose Max is above 65,536, or a limit the
	// namespace's mode or store cannot keep (then it is also
	// ErrUnsupportedLimit).
	ErrInvalidLimit = errors.New("ratelimit: invalid limit")
	// ErrInvalidCost is returned by Allow, Peek, Refund and CheckLimits when
	// the cost is below 0 or above the Max of a limit (such a request could
	// never be admitted, so no Retry-After could be true).
	ErrInvalidCost = errors.New("ratelimit: invalid cost")
)

// Limit is a policy: at most Max hits per Window for one key, counted with
// an Algorithm (a sliding window by default).
//
// Limits of the same algorithm and Window share their state per key: a hit
// is counted once however many of them name that window. Windows may differ
// in Max; token buckets and sliding logs sharing a window must be equal.
type Limit struct {
	// Window is the window size (for a token bucket, the period over which
	// Max tokens refill); it must be one of the namespace's WindowSizes.
	Window time.Duration
	// Max is the largest load admitted, between 1 and MaxValue: hits per
	// window, or a token bucket's refill per Window.
	Max int64
	// Algorithm selects how the limit counts. Default SlidingWindow.
	Algorithm Algorithm
	// Burst is a token bucket's capacity, in tokens (0 means Max): the most
	// a client that has been idle may send at once. Only for TokenBucket.
	Burst int64
	// Fixed reads the window as a fixed window (the previous window weighs
	// 0), as Kong's "fixed" option. It is Algorithm FixedWindow, kept for
	// compatibility.
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
	// (the floor of Max minus its load, at least 0; for a token bucket, the
	// whole tokens it holds). After an admitted Allow it counts this request
	// as spent.
	Remaining int64
	// Reset is how long, with no new hits, until the binding limit's load
	// falls to 0, i.e. its whole quota is available again. A sliding window
	// forgets a hit when the window after the one it counted in ends, so this
	// can be up to twice the window; for a fixed window it is the end of the
	// current window; for a token bucket, the time until it is full; for a
	// sliding log, until its newest entry leaves the window.
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

// lkind is the kind of state a limit counts in.
type lkind uint8

const (
	kindWindow lkind = iota // sliding and fixed windows: shm.Table
	kindBucket              // token buckets: shm.Buckets
	kindLog                 // sliding logs: shm.Logs
)

// lstate is one limit's working state in a decision.
type lstate struct {
	kind    lkind
	penalty bool  // (owner only) some limit sharing the state counts rejected hits
	others  bool  // (st[0] only) some limit is not a window
	served  bool  // (windows, owner only) applyLocal has reached this counter in the current pass
	spent   bool  // (buckets) the request's cost is in tat
	added   bool  // (logs) the request is in ls
	fits    bool  // (buckets and logs) the request fits
	idx     int   // index of the window in the namespace's WindowSizes
	size    int64 // window size, ms
	owner   int   // the first limit sharing this one's state: it holds the state's view
	// Windows.
	t  *shm.Table
	ti int // index of t in the namespace's tables
	w  int // index of the window in the table's entries
	v  shm.View
	// A write-through's diff and read in its table's part of the push
	// (-1: none); see push.throughView.
	di, ri int32
	// Token buckets (owner only but for bt, interval, burst).
	bt       *shm.Buckets
	learned  *strategy.BucketState // what a cold read of the bucket found, for its try (see shm.Buckets.TryLearning)
	interval float64               // ms per token
	burst    int64                 // a bucket's capacity; a log's Max
	tat      float64               // the bucket's TAT now: with the request's cost when spent
	tat0     float64               // the bucket's TAT before the request
	// Sliding logs (owner only but for lt).
	lt     *shm.Logs
	ls     strategy.LogState // the log now: with the request when added
	ticket shm.LogTicket     // the entry Try added on this node, for Remove
}

// Allow decides whether a request of the given cost may pass for key under
// every limit, and counts it when it does. A request is admitted when every
// limit admits it: a window when the key's load (sliding rate, or the current
// window's count for a fixed window) plus cost is at most Max; a token bucket
// when it holds cost tokens; a sliding log when the requests of the last
// window plus this one cost at most Max. An admitted request is counted in
// every limit; a rejected one is not counted (unless a limit has Penalty, in
// which case it is counted in that limit).
//
// A cost of 0 counts nothing and answers like Peek. Bad arguments return an
// error (ErrInvalidKey, ErrInvalidCost, ErrInvalidLimit, ErrUnsupportedLimit,
// ErrUnknownWindow, ErrNilContext, ErrClosed); a store failure does not: the
// decision is made from this node's state and has Degraded set.
//
// Local and asynchronous modes answer from memory: the hit is counted in each
// limit and taken back when one rejects it, so concurrent requests never
// exceed a limit on this node; a racing request may be rejected because of a
// hit that is then taken back. Across nodes the limit is as exact as the sync
// rate allows. Synchronous mode writes window hits through to the store in
// one round trip for all window limits and, when rejected, takes them back in
// a second one; token buckets and sliding logs are decided by the store in
// one round trip for all of them (strategy.Taker), after the windows. The
// whole call waits at most the namespace's SyncTimeout. Once this node knows
// a key is over a limit (its last view of the store, plus its own hits,
// rejects the request), Allow answers from memory without touching the store
// until enough time has passed: a local circuit breaker that keeps a flood of
// rejected requests off the store.
func (ns *Namespace) Allow(ctx context.Context, key string, cost int64, limits ...Limit) (d Decision, err error) {
	if ns.cfg.Observer != nil {
		return ns.observedDecide(ctx, key, cost, limits)
	}
	err = ns.decide(ctx, &d, key, cost, limits, true) // in place: a Decision is a hundred bytes to copy
	return d, err
}

// Peek answers what Allow would answer for the same request, without counting
// anything. Remaining is what Allow would report, so it counts the peeked cost
// as spent when the request would be admitted. In synchronous mode it reads
// the store (one round trip), unless this node already knows the key is over
// a limit.
func (ns *Namespace) Peek(ctx context.Context, key string, cost int64, limits ...Limit) (d Decision, err error) {
	err = ns.decide(ctx, &d, key, cost, limits, false)
	return d, err
}

// Refund takes back a cost that Allow counted for key, for a request that was
// not served after all (it failed, or a fail-closed route refused it): it
// subtracts cost from each distinct window limit's current window, gives cost
// tokens back to each token bucket (never past full) and takes cost from the
// newest entries of each sliding log. Refund only a cost Allow counted: with
// a store, a refund of a request that was rejected or never seen makes room
// beyond the limit (this node's view cannot bound it: it may be below the
// hits behind a legitimate refund); in local mode it takes back no more than
// the window holds. A refund lands in the current window: one made just
// after the window turned does not lighten a sliding window's previous one,
// where its hit still weighs. It never waits for the store:
// outside local mode the correction is pushed with the next sync (in
// synchronous mode, by the retry loop, within RetryInterval; until then the
// store, which decides token buckets and sliding logs in that mode, does not
// count it). It returns the argument errors Allow returns.
func (ns *Namespace) Refund(ctx context.Context, key string, cost int64, limits ...Limit) error {
	s, open := ns.enter()
	if !open {
		return closedOr(ctx)
	}
	defer leave(s)
	var buf [maxInlineLimits]lstate
	key, st, err := ns.resolve(ctx, key, cost, limits, buf[:0])
	if err != nil || cost == 0 {
		return err
	}
	now := ns.now()
	var logs bool
	for j := range st {
		s := &st[j]
		if s.owner != j {
			continue
		}
		switch s.kind {
		case kindWindow:
			// (A key not held stays cold.)
			s.t.Refund(key, s.w, now, cost, ns.cold != nil)
		case kindBucket:
			s.bt.Refund(key, now, s.interval, cost)
		case kindLog:
			s.lt.TakeBack(key, now, cost)
			logs = true
		}
	}
	if logs && ns.mode == modeSync {
		ns.queueLogRefund(key, st, now, cost)
	}
	return nil
}

// decide makes the decision in d (the zero Decision on error).
func (ns *Namespace) decide(ctx context.Context, d *Decision, key string, cost int64, limits []Limit, count bool) error {
	var idx int // the binding limit's window index
	var err error
	// The lean paths do not register as calls in flight (enter): each
	// counts in one table call that a sealed table refuses (see Close).
	if len(limits) == 1 && limits[0].Algorithm == TokenBucket && ns.mode != modeSync {
		key, idx, err = ns.decideBucket(ctx, d, key, cost, limits, count && cost > 0)
	} else if ns.leanWindows(limits) {
		key, idx, err = ns.decideWindows(ctx, d, key, cost, limits, count && cost > 0)
	} else {
		key, idx, err = ns.decideEntered(ctx, d, key, cost, limits, count && cost > 0)
	}
	if err != nil {
		*d = Decision{}
		return err
	}
	if count { // Allow's answers are counted in Stats, Peek's are not
		ns.stats.recordDecision(key, idx, d.Allowed, d.Degraded)
		if ns.hot != nil {
			ns.hot.record(key, !d.Allowed)
		}
	}
	return nil
}

// decideEntered is decideAny as a call in flight, which Close waits for.
func (ns *Namespace) decideEntered(ctx context.Context, d *Decision, key string, cost int64, limits []Limit, count bool) (string, int, error) {
	s, open := ns.enter()
	if !open {
		return "", 0, closedOr(ctx)
	}
	defer leave(s)
	return ns.decideAny(ctx, d, key, cost, limits, count)
}

// decideAny is decide's general path: any limits, any mode. It makes the
// decision in d and returns the key as stored and the binding limit's window
// index. (The Decision is written in place, not returned: it is 96 bytes,
// which each return level would copy.)
func (ns *Namespace) decideAny(ctx context.Context, d *Decision, key string, cost int64, limits []Limit, count bool) (string, int, error) {
	var st []lstate
	var err error
	if len(limits) <= 2 { // the common case: less state to zero
		var buf [2]lstate
		key, st, err = ns.resolve(ctx, key, cost, limits, buf[:0])
	} else {
		var buf [maxInlineLimits]lstate
		key, st, err = ns.resolve(ctx, key, cost, limits, buf[:0])
	}
	if err != nil {
		return "", 0, err
	}
	bind := ns.decideIn(ctx, d, key, cost, limits, st, count)
	return key, st[bind].idx, nil
}

// decideIn makes the decision for resolved arguments in d and returns the
// index of the binding limit.
func (ns *Namespace) decideIn(ctx context.Context, d *Decision, key string, cost int64, limits []Limit, st []lstate, count bool) int {
	now := ns.now()
	if ns.mode == modeSync {
		return ns.decideSync(ctx, d, key, cost, limits, st, now, count)
	}
	cold, degraded, applied := false, false, false
	if ns.cold != nil { // a cold key is read from the store first (coldread.go)
		if cold, degraded, applied = ns.decideWarm(ctx, key, st, now, cost, !count); cold {
			now = ns.now() // the read may have waited
		}
	}
	if !applied {
		applyLocal(key, st, now, cost, !count, false) // counts cost, or only reads
	}
	others := st[0].others
	if others {
		tryOthers(key, st, now, cost, count)
	}
	ok := admits(st, limits, now, cost, count)
	if count && !ok {
		applyLocal(key, st, now, -cost, false, true)
		if others {
			rollbackOthers(key, st, now, cost)
		}
	}
	if cold {
		unrefLimits(key, st)
		if degraded {
			keepCold(key, st) // no totals read: the next decision reads them
		}
	}
	bind := decision(d, st, limits, now, cost, ok, count)
	d.Degraded = degraded || ns.storeDown.Load() // the cluster's counts are stale while the store fails
	return bind
}

// tryOthers judges the request on the token buckets and sliding logs of st,
// spending its cost on those it fits when count is set.
func tryOthers(key string, st []lstate, now, cost int64, count bool) {
	for j := range st {
		s := &st[j]
		if s.owner != j {
			continue
		}
		switch s.kind {
		case kindBucket:
			s.tryBucket(key, now, cost, count)
		case kindLog:
			s.ls, s.fits, s.ticket = s.lt.Try(key, now, s.maxOf(), cost, count, false)
			if s.added = s.ticket != 0; s.added {
				s.ls = logAfter(s.ls, now, s.size, cost)
			}
		}
	}
}

// rollbackOthers takes back a rejected request's cost from the token buckets
// and sliding logs of st that counted it without a penalty, and counts it in
// those with a penalty that did not count it yet. (The windows' own rollback
// is applyLocal with a negative cost.)
func rollbackOthers(key string, st []lstate, now, cost int64) {
	for j := range st {
		s := &st[j]
		if s.owner != j {
			continue
		}
		switch {
		case s.kind == kindBucket && s.spent && !s.penalty:
			s.bt.Refund(key, now, s.interval, cost)
			s.tat, s.spent = s.tat0, false
		case s.kind == kindBucket && !s.spent && s.penalty:
			s.chargeBucket(key, now, cost)
		case s.kind == kindLog && s.ticket != 0 && !s.penalty:
			s.lt.Remove(key, s.ticket, cost)
			s.ls, _ = s.lt.State(key, now, s.maxOf(), cost)
			s.ticket, s.added = 0, false
		case s.kind == kindLog && s.ticket == 0 && s.penalty:
			_, _, s.ticket = s.lt.Try(key, now, s.maxOf(), cost, true, true)
			s.ls, _ = s.lt.State(key, now, s.maxOf(), cost)
			s.added = true
		}
	}
}

// logAfter returns log state ls (before a request of cost at now) with the
// request added, for a window of size ms. Fits is left as it was: it is read
// only for a rejected request.
func logAfter(ls strategy.LogState, now, size, cost int64) strategy.LogState {
	if cost == 0 {
		return ls // nothing is added
	}
	ls.Count += cost
	ls.Empty = max(ls.Empty, now+size)
	return ls
}

// decideSync is decideIn in synchronous mode.
func (ns *Namespace) decideSync(ctx context.Context, d *Decision, key string, cost int64, limits []Limit, st []lstate, now int64, count bool) int {
	// The circuit breaker: this node's view is the store's state as last
	// learned plus what was counted here since, a lower bound of the
	// cluster's. If it rejects, the store would too.
	peekAll(key, st, now)
	if ns.breakerRejects(key, st, limits, now, cost) {
		if count {
			ns.countPenalties(key, st, now, cost)
		}
		return decision(d, st, limits, now, cost, false, count)
	}
	start := time.Now() // wall time: SyncTimeout bounds the whole call
	value := int64(0)   // a peek reads the counters
	if count {
		value = cost
	}
	var err error
	windows, others := kinds(st)
	ok := true
	if windows {
		err = ns.throughAll(ctx, key, st, now, value)
		ok = admits(st, limits, now, cost, count)
	}
	degraded := err != nil
	if others {
		// When the windows rejected, the store still records the request
		// (as rejected, for the limits with a penalty) and answers the
		// others' states: a truthful RetryAfter needs every limit's.
		terr := ns.takeAll(ctx, key, st, now, cost, count, !ok)
		degraded = degraded || terr != nil
		ok = admits(st, limits, now, cost, count)
	}
	if count && !ok && windows {
		budget := ns.cfg.SyncTimeout - time.Since(start)
		undo := false
		for j := range st {
			undo = undo || (st[j].kind == kindWindow && st[j].owner == j && !st[j].penalty)
		}
		switch {
		case !undo:
		case err != nil || budget <= 0:
			// Take the hit back here, from the window it counted in;
			// the retry loop pushes the correction.
			for j := range st {
				if s := &st[j]; s.kind == kindWindow && s.owner == j && !s.penalty {
					var starts, v [2]int64
					starts[s.w], v[s.w] = s.v.Start, cost
					s.v = s.t.TakeBack(key, now, 1<<s.w, starts, v)[s.w]
				}
			}
		default:
			uctx, cancel := context.WithTimeout(ctx, budget)
			uerr := ns.undoAll(uctx, key, st, now, cost)
			cancel()
			degraded = degraded || uerr != nil
		}
	}
	bind := decision(d, st, limits, now, cost, ok, count)
	d.Degraded = degraded
	return bind
}

// kinds reports whether st has window limits, and limits of other kinds.
func kinds(st []lstate) (windows, others bool) {
	for j := range st {
		if st[j].kind == kindWindow {
			windows = true
		} else {
			others = true
		}
	}
	return windows, others
}

// throughAll writes value through to the store for every window counter of st
// in one round trip (value 0: reads them), then loads the views of the
// windows counted in (see push.throughView).
func (ns *Namespace) throughAll(ctx context.Context, key string, st []lstate, now, value int64) error {
	p := ns.newPush()
	for j := range st {
		if s := &st[j]; s.owner == j && s.kind == kindWindow {
			part := &p.parts[s.ti]
			s.di, s.ri = int32(len(part.Diffs)), int32(len(part.Reads))
			if value == 0 {
				s.di = -1
				s.v = s.t.PeekReads(key, s.w, now, part)
			} else {
				s.v = s.t.AddPending(key, s.w, now, value, part)
			}
		}
	}
	err := ns.sendThrough(ctx, p)
	ns.throughViews(key, st, p, err == nil, false)
	return err
}

// throughViews loads the view of every window counter of st after the
// write-through p (skipping those with a penalty, with undo).
func (ns *Namespace) throughViews(key string, st []lstate, p *push, ok, undo bool) {
	for j := range st {
		if s := &st[j]; s.owner == j && s.kind == kindWindow && !(undo && s.penalty) {
			s.v = p.throughView(s.t, s.ti, s.w, key, s.v, s.di, s.ri, ok)
		}
	}
}

// undoAll takes back cost from every window counter of st without penalty, in
// one round trip: from the windows it was counted in (the views' starts),
// whichever window is newest now.
func (ns *Namespace) undoAll(ctx context.Context, key string, st []lstate, now, cost int64) error {
	p := ns.newPush()
	for j := range st {
		if s := &st[j]; s.owner == j && s.kind == kindWindow && !s.penalty {
			part := &p.parts[s.ti]
			s.di, s.ri = int32(len(part.Diffs)), -1
			s.v.Cur -= cost // the view without the hit, if none is read
			if !s.t.TakeBackPending(key, s.w, now, s.v.Start, cost, part) {
				s.di = -1
			}
		}
	}
	err := ns.sendThrough(ctx, p)
	ns.throughViews(key, st, p, err == nil, true)
	return err
}

// peekAll loads the view of every window counter of st from the tables, and
// this node's view of every bucket and log.
func peekAll(key string, st []lstate, now int64) {
	for j := range st {
		s := &st[j]
		if s.owner != j {
			continue
		}
		switch s.kind {
		case kindWindow:
			s.v = s.t.Peek(key, s.w, now)
		case kindBucket:
			s.tat, _ = s.bt.View(key, now, s.interval)
			s.tat0, s.spent = s.tat, false
			s.fits = bucketFits(s.tat, now, s.interval, s.burst, 0)
		}
	}
}

// applyLocal adds value to the window counter of every owner in st (or only
// reads them, with peek) and stores the views, with one table lookup per
// table: the two window sizes of an entry are served together. With spare
// it takes a rejected request's count back (value is its negation): it
// skips owners with a penalty, and takes from the windows the count went
// to (the starts of the views stored), whichever window is newest now.
func applyLocal(key string, st []lstate, now, value int64, peek, spare bool) {
	for j := range st {
		st[j].served = false
	}
	for j := range st {
		if st[j].kind != kindWindow || st[j].owner != j || st[j].served || (spare && st[j].penalty) {
			continue
		}
		var mask uint8
		var owners [2]int
		for k := j; k < len(st); k++ {
			if st[k].kind == kindWindow && st[k].owner == k && st[k].ti == st[j].ti && !(spare && st[k].penalty) {
				mask |= 1 << st[k].w
				owners[st[k].w] = k
				st[k].served = true
			}
		}
		var views [2]shm.View
		if spare { // a take-back: from the windows the count went to
			var starts [2]int64
			for w := range 2 {
				if mask&(1<<w) != 0 {
					starts[w] = st[owners[w]].v.Start
				}
			}
			views = st[j].t.TakeBack(key, now, mask, starts, [2]int64{-value, -value})
		} else {
			views = st[j].t.AddWindows(key, now, mask, [2]int64{value, value}, peek)
		}
		for w := range 2 {
			if mask&(1<<w) != 0 {
				st[owners[w]].v = views[w]
			}
		}
	}
}

// resolve validates a decision's arguments and fills st, one entry per limit.
func (ns *Namespace) resolve(ctx context.Context, key string, cost int64, limits []Limit, st []lstate) (string, []lstate, error) {
	if err := checkCall(ctx, key, cost, len(limits)); err != nil {
		return "", nil, err
	}
	if cap(st) < len(limits) {
		st = make([]lstate, 0, len(limits))
	}
	st = st[:len(limits)]
	for j := range limits {
		l := &limits[j]
		i, err := ns.checkLimit(cost, l)
		if err != nil {
			return "", nil, err
		}
		kind := kindOf(l)
		owner := j
		for k := range j {
			if lk := &limits[k]; lk.Window == l.Window && kindOf(lk) == kind {
				if kind != kindWindow && (lk.Max != l.Max || lk.burst() != l.burst()) {
					return "", nil, fmt.Errorf("%w: %s and %s: two %s limits of one window share their state and must be equal",
						ErrInvalidLimit, lk.PolicyName(), l.PolicyName(), l.algorithm())
				}
				owner = k
				break
			}
		}
		// Filled in place, field by field: cheaper than a composite
		// literal of the whole struct, and the fields of the other kinds
		// are never read.
		ls := &st[j]
		ls.kind, ls.idx, ls.size, ls.owner, ls.penalty, ls.others = kind, i, ns.sizeMS[i], owner, false, false
		switch kind {
		case kindWindow:
			ls.t, ls.ti, ls.w, ls.served, ls.v = ns.tables[i/2], i/2, i%2, false, shm.View{}
		case kindBucket:
			ls.setBucket(ns, l, i)
		case kindLog:
			ls.lt, ls.burst = ns.logTable(i), l.Max // a log's owner keeps its Max in burst
			ls.ls, ls.added, ls.ticket, ls.fits = strategy.LogState{}, false, 0, false
		}
		if l.Penalty {
			st[owner].penalty = true
		}
		st[0].others = st[0].others || kind != kindWindow
	}
	return ns.storedKey(key), st, nil
}

// callValid is checkCall's verdict for one or more limits, small enough to
// inline into the hot path, which calls checkCall only for the error
// (TestCallValidMatchesCheckCall holds the two together).
func callValid(ctx context.Context, key string, cost int64) bool {
	return ctx != nil && key != "" && cost >= 0
}

// checkCall validates a decision's arguments other than its n limits.
func checkCall(ctx context.Context, key string, cost int64, n int) error {
	switch {
	case ctx == nil:
		return ErrNilContext
	case key == "":
		return ErrInvalidKey
	case n == 0:
		return fmt.Errorf("%w: no limits", ErrInvalidLimit)
	case cost < 0:
		return fmt.Errorf("%w: %d is negative", ErrInvalidCost, cost)
	}
	return nil
}

// maxOf returns a log limit's Max.
func (s *lstate) maxOf() int64 { return s.burst }

// kindOf returns the kind of state l counts in.
func kindOf(l *Limit) lkind {
	switch l.Algorithm {
	case TokenBucket:
		return kindBucket
	case SlidingLog:
		return kindLog
	}
	return kindWindow
}

// checkLimit validates one limit for a request of cost and returns the index
// of its window.
func (ns *Namespace) checkLimit(cost int64, l *Limit) (int, error) {
	if l.Max <= 0 || l.Max > MaxValue {
		return 0, fmt.Errorf("%w: %s: Max %d is not in 1..2^53", ErrInvalidLimit, l.PolicyName(), l.Max)
	}
	if l.Algorithm != SlidingWindow || l.Burst != 0 { // a plain window needs no more checks
		if err := ns.checkAlgorithm(l); err != nil {
			return 0, err
		}
	}
	if c := l.capacity(); cost > c {
		return 0, fmt.Errorf("%w: %d exceeds %s's capacity %d: it could never be admitted", ErrInvalidCost, cost, l.PolicyName(), c)
	}
	return ns.windowIndex(l.Window)
}

// CheckLimits reports whether Allow would accept cost and limits: the errors
// Allow returns for them (ErrInvalidCost, ErrInvalidLimit,
// ErrUnsupportedLimit, ErrUnknownWindow), without touching any counter. Use
// it to validate a configuration once.
func (ns *Namespace) CheckLimits(cost int64, limits ...Limit) error {
	if len(limits) == 0 {
		return fmt.Errorf("%w: no limits", ErrInvalidLimit)
	}
	if cost < 0 {
		return fmt.Errorf("%w: %d is negative", ErrInvalidCost, cost)
	}
	var buf [maxInlineLimits]lstate
	_, _, err := ns.resolve(context.Background(), "check", cost, limits, buf[:0])
	return err
}

// admits reports whether every limit admits a request of cost at now. When
// counted, the window views already include the request's cost.
func admits(st []lstate, limits []Limit, now, cost int64, counted bool) bool {
	for j := range limits {
		o := &st[st[j].owner]
		if o.kind != kindWindow {
			if !o.fits {
				return false
			}
			continue
		}
		v := o.v
		if counted {
			v.Cur -= cost
		}
		// fits, written out: the compiler does not inline it here.
		if l := &limits[j]; load(v, st[j].size, now, cost, l.fixed()) > float64(l.Max) {
			return false
		}
	}
	return true
}

// decision builds in d the Decision from the limits' state after the call.
// counted says the state includes the cost when the request was admitted.
// It returns the index of the binding limit.
func decision(d *Decision, st []lstate, limits []Limit, now, cost int64, ok, counted bool) int {
	*d = Decision{Allowed: ok, Remaining: math.MaxInt64}
	bind := -1
	var bindRetry int64
	for j := range limits {
		l := &limits[j]
		var rem int64
		if o := &st[st[j].owner]; o.kind == kindWindow { // the common case, inline
			v := o.v
			if ok && !counted {
				v.Cur += cost // what Allow would report: this request spent
			}
			rem = remaining(v, st[j].size, now, l)
		} else {
			rem = limitRemaining(st, j, l, now, cost, ok, counted)
		}
		if ok {
			if rem < d.Remaining {
				bind, d.Remaining = j, rem
			}
			continue
		}
		if r := limitRetryAfter(st, j, l, now, cost); r > 0 && (bind < 0 || r > bindRetry) {
			bind, bindRetry, d.Remaining = j, r, rem
		}
	}
	if bind < 0 { // rejected, yet nothing to wait for: a racing hit was taken back
		bind, d.Remaining = 0, limitRemaining(st, 0, &limits[0], now, cost, false, counted)
	}
	d.Limit = limits[bind]
	var reset int64
	if o := &st[st[bind].owner]; o.kind == kindWindow { // the common case, inline
		v := o.v
		if ok && !counted {
			v.Cur += cost
		}
		reset = resetAfter(v, st[bind].size, now, d.Limit.fixed())
	} else {
		reset = limitReset(st, bind, &limits[bind], now, cost, ok, counted)
	}
	d.Reset = time.Duration(reset) * time.Millisecond
	d.RetryAfter = time.Duration(bindRetry) * time.Millisecond
	return bind
}

// limitRemaining returns limits[j]'s Remaining after the call: with the
// request spent when it was admitted (ok), whether or not it was counted.
func limitRemaining(st []lstate, j int, l *Limit, now, cost int64, ok, counted bool) int64 {
	o := &st[st[j].owner]
	switch o.kind {
	case kindBucket:
		tat := o.tat
		if ok && !o.spent {
			tat = bucketAfter(tat, now, o.interval, cost) // what Allow would report
		}
		return bucketRemaining(tat, now, o.interval, o.burst)
	case kindLog:
		n := o.ls.Count
		if ok && !o.added {
			n += cost
		}
		return max(l.Max-n, 0)
	}
	v := o.v
	if ok && !counted {
		v.Cur += cost // what Allow would report: this request spent
	}
	return remaining(v, st[j].size, now, l)
}

// limitRetryAfter returns how many milliseconds after now the request first
// fits limits[j] (0 when it fits now).
func limitRetryAfter(st []lstate, j int, l *Limit, now, cost int64) int64 {
	o := &st[st[j].owner]
	switch o.kind {
	case kindBucket:
		return bucketRetryAfter(o.tat, now, o.interval, o.burst, cost)
	case kindLog:
		return max(o.ls.Fits-now, 0)
	}
	return retryAfter(o.v, st[j].size, now, cost, l)
}

// limitReset returns how many milliseconds after now limits[j]'s whole quota
// is back, with no new requests.
func limitReset(st []lstate, j int, l *Limit, now, cost int64, ok, counted bool) int64 {
	o := &st[st[j].owner]
	switch o.kind {
	case kindBucket:
		tat := o.tat
		if ok && !o.spent {
			tat = bucketAfter(tat, now, o.interval, cost)
		}
		return bucketReset(tat, now)
	case kindLog:
		ls := o.ls
		if ok && !o.added {
			ls = logAfter(ls, now, o.size, cost)
		}
		return max(ls.Empty-now, 0)
	}
	v := o.v
	if ok && !counted {
		v.Cur += cost
	}
	return resetAfter(v, st[j].size, now, l.fixed())
}

// setBucket fills the token-bucket fields of s for limit l, of window index
// i, before any request is judged.
func (s *lstate) setBucket(ns *Namespace, l *Limit, i int) {
	s.bt, s.interval, s.burst = ns.bucketTable(i), l.interval(), l.burst()
	s.tat, s.tat0, s.spent, s.fits = 0, 0, false, false
}

// tryBucket judges the request on the token bucket of s, spending its cost
// when it fits and count is set.
func (s *lstate) tryBucket(key string, now, cost int64, count bool) {
	mode := shm.Peek
	if count {
		mode = shm.SpendIfFits
	}
	s.tat0, s.fits, s.spent = s.bt.TryLearning(key, now, s.learned, s.interval, s.burst, cost, mode)
	s.afterTry(now, cost)
}

// afterTry sets the TAT after a bucket's try from the TAT before it.
func (s *lstate) afterTry(now, cost int64) {
	s.tat = s.tat0
	if s.spent {
		s.tat = bucketAfter(s.tat0, now, s.interval, cost)
	}
}

// chargeBucket spends a rejected request's cost on the token bucket of s,
// whose limit has a penalty.
func (s *lstate) chargeBucket(key string, now, cost int64) {
	s.tat0, _, s.spent = s.bt.TryLearning(key, now, s.learned, s.interval, s.burst, cost, shm.SpendAlways)
	s.tat = bucketAfter(s.tat0, now, s.interval, cost)
}
