package ratelimit

import (
	"context"

	"github.com/ratesync/ratelimit/shm"
)

// leanWindows reports whether limits can take decideWindows: one or two
// sliding or fixed windows without Penalty, decided on this node.
func (ns *Namespace) leanWindows(limits []Limit) bool {
	if ns.mode == modeSync || len(limits) == 0 || len(limits) > 2 {
		return false
	}
	for j := range limits {
		if l := &limits[j]; l.Penalty || (l.Algorithm != SlidingWindow && l.Algorithm != FixedWindow) {
			return false
		}
	}
	return true
}

// decideWindows is decide's path for the most common call: one or two window
// limits without Penalty (see leanWindows), decided on this node. It gives
// the answers of the general path (decideAny) with less bookkeeping: the
// limits' window counters are found once (they share the table of their
// window sizes, else it hands over to decideAny), counted in one table call,
// taken back in one when rejected. With cold reads (coldread.go) it takes
// only keys this node holds, and hands a cold key over to decideAny, which
// reads the store first. It makes the decision in d and returns what
// decideAny returns. count says the request's cost is to be spent.
func (ns *Namespace) decideWindows(ctx context.Context, d *Decision, key string, cost int64, limits []Limit, count bool) (string, int, error) {
	if ns.closed.Load() {
		return "", 0, closedOr(ctx)
	}
	if err := checkCall(ctx, key, cost, len(limits)); err != nil {
		return "", 0, err
	}
	var st [2]lstate
	var mask uint8
	for j := range limits {
		i, err := ns.checkLimit(cost, &limits[j])
		if err != nil {
			return "", 0, err
		}
		s := &st[j]
		// Two limits of one window share its counter: the mask counts it
		// once, and each limit reads its view.
		s.kind, s.idx, s.size, s.owner, s.w = kindWindow, i, ns.sizeMS[i], j, i%2
		mask |= 1 << s.w
	}
	ti := st[0].idx / 2
	if len(limits) == 2 && st[1].idx/2 != ti { // two tables: the general path
		return ns.decideEntered(ctx, d, key, cost, limits, count)
	}
	t := ns.tables[ti]
	stored := ns.storedKey(key)
	now := ns.now()
	sts := st[:len(limits)]
	// Counted, judged and (rejected) taken back in one table call, which a
	// sealed table refuses: Close need not wait for this call.
	judge := func(views [2]shm.View) bool {
		for j := range sts {
			sts[j].v = views[sts[j].w]
		}
		return admits(sts, limits, now, cost, count)
	}
	views, ok, held, open := t.AddWindowsOpen(stored, now, mask, [2]int64{cost, cost}, !count, ns.cold != nil, true, judge)
	switch {
	case !open:
		return "", 0, closedOr(ctx)
	case !held:
		return ns.decideEntered(ctx, d, key, cost, limits, count) // cold: read first
	}
	key = stored
	for j := range sts {
		sts[j].v = views[sts[j].w]
	}
	bind := decision(d, sts, limits, now, cost, ok, count)
	d.Degraded = ns.storeDown.Load()
	return key, sts[bind].idx, nil
}
