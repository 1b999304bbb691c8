package ratelimit

import (
	"context"

	"github.com/ratesync/ratelimit/shm"
)

// decideBucket is decide's path for the most common token-bucket call: one
// limit, decided on this node (local or periodic mode). With cold reads
// (coldread.go) it takes only buckets this node holds, and hands a cold one
// over to decideAny, which reads the store first. It gives the answers of
// the general path (decideAny) without its per-limit bookkeeping: it makes
// the decision in d and returns what decideAny returns. count says the
// request's cost is to be spent.
func (ns *Namespace) decideBucket(ctx context.Context, d *Decision, key string, cost int64, limits []Limit, count bool) (string, int, error) {
	if ns.closed.Load() {
		return "", 0, closedOr(ctx)
	}
	if err := checkCall(ctx, key, cost, 1); err != nil {
		return "", 0, err
	}
	l := &limits[0]
	i, err := ns.checkLimit(cost, l)
	if err != nil {
		return "", 0, err
	}
	stored := ns.storedKey(key)
	var st [1]lstate
	s := &st[0]
	s.kind, s.idx, s.size = kindBucket, i, ns.sizeMS[i]
	s.setBucket(ns, l, i)
	// One try decides and spends: a Penalty spends whether or not the
	// request fits (what the general path's try and charge leave).
	mode := shm.Peek
	switch {
	case count && l.Penalty:
		mode = shm.SpendAlways
	case count:
		mode = shm.SpendIfFits
	}
	now := ns.now()
	var held, open bool
	s.tat0, s.fits, s.spent, held, open = s.bt.TryOpen(stored, now, s.interval, s.burst, cost, mode, ns.cold == nil)
	switch {
	case !open:
		return "", 0, closedOr(ctx)
	case !held:
		return ns.decideEntered(ctx, d, key, cost, limits, count) // cold: read first
	}
	s.afterTry(now, cost)
	decision(d, st[:], limits, now, cost, s.fits, count)
	d.Degraded = ns.storeDown.Load()
	return stored, i, nil
}
