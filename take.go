package ratelimit

import (
	"context"
	"errors"
	"fmt"

	"github.com/ratesync/ratelimit/shm"
	"github.com/ratesync/ratelimit/strategy"
)

// In synchronous mode the store decides token buckets and sliding logs itself
// (strategy.Taker): one round trip per request for all of them, exactly once
// per request ID. This node keeps a mirror of what the store answered (each
// bucket's TAT, each log's "full until"), which serves the circuit breaker
// and, while the store fails, local answers.
//
// A Take that fails is answered from local state (Degraded). What the node
// answered must still reach the store, exactly once:
//
//   - when the Take surely was not applied, its bucket spends stay in the
//     local buckets' unpushed spends, which the retry loop pushes as bucket
//     diffs (merged, so an outage costs memory per bucket, not per request);
//     its log entries go to the store by a Take that carries the node's
//     answer (strategy.Take.Answered), queued for the retry loop;
//   - when its outcome is unknown, the whole Take is queued, with the node's
//     answer, under its own ID: the store settles it to match that answer
//     whatever it did with the first attempt. Its bucket spends are not
//     counted locally meanwhile (at most maxProbesKept of them, see
//     probeDue).

// maxPendingTakes bounds the Takes queued for the retry loop; past it the
// oldest are given up and counted in DroppedHits.
const maxPendingTakes = 1 << 14

// pendingTake is a Take to settle with the store.
type pendingTake struct {
	take    strategy.Take
	unknown bool // an attempt's outcome was unknown
}

// takeOf builds the Take of st's buckets and logs for key at now.
func (ns *Namespace) takeOf(key string, st []lstate, now, cost int64, peek bool) (*strategy.Take, []int) {
	tk := &strategy.Take{ID: ns.newBatchID(), Namespace: ns.name, Key: key, Now: now, Cost: cost, Peek: peek}
	var idx []int // idx[k]: the owner in st of the k-th bucket, then of the k-th log
	for j := range st {
		if s := &st[j]; s.owner == j && s.kind == kindBucket {
			tk.Buckets = append(tk.Buckets, strategy.TakeBucket{Period: ns.cfg.WindowSizes[s.idx], Interval: s.interval, Burst: s.burst, Penalty: s.penalty})
			idx = append(idx, j)
		}
	}
	for j := range st {
		if s := &st[j]; s.owner == j && s.kind == kindLog {
			tk.Logs = append(tk.Logs, strategy.TakeLog{Window: ns.cfg.WindowSizes[s.idx], Max: s.maxOf(), Penalty: s.penalty})
			idx = append(idx, j)
		}
	}
	return tk, idx
}

// takeAll has the store decide the request on st's token buckets and sliding
// logs, and loads the answer into st (and this node's mirror). On a store
// failure it decides from local state and queues what must reach the store.
//
// With rejected set, the request is already rejected (by the window limits):
// the store records it as rejected (so the limits with a penalty count it)
// and answers the states, which a truthful RetryAfter needs.
func (ns *Namespace) takeAll(ctx context.Context, key string, st []lstate, now, cost int64, count, rejected bool) error {
	tk, idx := ns.takeOf(key, st, now, cost, !count)
	if rejected && count {
		tk.Answered = strategy.AnsweredRejected
	}
	res, err := ns.sendTake(ctx, tk)
	if err == nil {
		ns.loadTake(key, st, idx, tk, res, now, cost, count)
		return nil
	}
	unknown := !errors.Is(err, strategy.ErrNotApplied)
	if rejected {
		// Judge locally, for the decision's RetryAfter; the penalties go to
		// the store with the settling Take below.
		tryOthers(key, st, now, cost, false)
		for _, j := range idx {
			st[j].fits = false
		}
		if count && hasPenalty(st, idx) {
			tk.Answered = strategy.AnsweredRejected
			ns.queueTake(&pendingTake{take: *tk, unknown: unknown})
		}
		return err
	}
	if !count || unknown {
		// Judge locally without counting: an unknown Take is settled by its
		// re-send below, which must not be counted twice.
		tryOthers(key, st, now, cost, false)
	} else {
		tryOthers(key, st, now, cost, true)
	}
	if !count {
		return err
	}
	ok := true
	for _, j := range idx {
		ok = ok && st[j].fits
	}
	if !ok && !unknown {
		rollbackOthers(key, st, now, cost)
	}
	answer := strategy.AnsweredRejected
	if ok {
		answer = strategy.AnsweredAdmitted
	}
	settle := *tk
	settle.Answered, settle.Peek = answer, false
	if !unknown {
		// The buckets' share is in their unpushed spends already.
		settle.Buckets = nil
		if len(settle.Logs) == 0 {
			return err
		}
	}
	ns.queueTake(&pendingTake{take: settle, unknown: unknown})
	return err
}

// hasPenalty reports whether a limit of st among idx has a penalty.
func hasPenalty(st []lstate, idx []int) bool {
	for _, j := range idx {
		if st[j].penalty {
			return true
		}
	}
	return false
}

// loadTake loads a Take's answer into st and into the mirror.
func (ns *Namespace) loadTake(key string, st []lstate, idx []int, tk *strategy.Take, res strategy.TakeResult, now, cost int64, count bool) {
	for k, j := range idx {
		s := &st[j]
		if k < len(tk.Buckets) {
			b := res.Buckets[k]
			s.bt.Learn(key, now, b, true)
			s.tat = float64(now)
			if b.Held() {
				s.tat = strategy.ConvertTAT(b.TAT, b.Interval, s.interval, now)
			}
			s.spent = count && (res.Allowed || s.penalty)
			s.fits = res.Allowed || (!s.spent && bucketFits(s.tat, now, s.interval, s.burst, cost))
			continue
		}
		l := res.Logs[k-len(tk.Buckets)]
		s.ls = l
		s.added = count && (res.Allowed || s.penalty)
		s.fits = res.Allowed || (!s.added && l.Fits <= now)
		if !s.fits && l.Fits > now {
			s.lt.Block(key, now, cost, l)
		}
	}
	if !res.Allowed {
		// The store rejected: at least one limit does not fit, even where
		// this node's reading of the answer says every one would.
		any := false
		for _, j := range idx {
			any = any || !st[j].fits
		}
		if !any && len(idx) > 0 {
			st[idx[0]].fits = false
		}
	}
}

// sendTake sends a Take, with synchronous mode's probing while the store
// fails (see sendThrough): when a probe is already in flight, the Take is not
// sent and counts as not applied.
func (ns *Namespace) sendTake(ctx context.Context, tk *strategy.Take) (strategy.TakeResult, error) {
	if ns.throughDown.Load() {
		if !ns.probeDue() {
			return strategy.TakeResult{}, fmt.Errorf("%w: the store is failing; answered from local state: %w", ErrStoreUnavailable, strategy.ErrNotApplied)
		}
		defer ns.probing.Store(false)
	}
	cctx, cancel := context.WithTimeout(ctx, ns.cfg.SyncTimeout)
	res, err := ns.store.(strategy.Taker).Take(cctx, tk)
	cancel()
	if err == nil && (len(res.Buckets) != len(tk.Buckets) || len(res.Logs) != len(tk.Logs)) {
		err = fmt.Errorf("store answered %d buckets and %d logs for %d and %d", len(res.Buckets), len(res.Logs), len(tk.Buckets), len(tk.Logs))
	}
	if err != nil {
		ns.throughDown.Store(true)
		return strategy.TakeResult{}, fmt.Errorf("%w: take %s: %w", ErrStoreUnavailable, tk.ID, err)
	}
	ns.throughDown.Store(false)
	return res, nil
}

// breakerRejects reports whether this node's own view rejects the request
// (synchronous mode's circuit breaker); it loads that view into st. A log
// with a penalty always asks the store: its rejected requests must be
// recorded there.
//
// A log whose state this node does not know (the store has not found it
// full for this cost) leaves the decision to the store: its RetryAfter could
// not be told otherwise.
func (ns *Namespace) breakerRejects(key string, st []lstate, limits []Limit, now, cost int64) bool {
	unknownLog := false
	for j := range st {
		s := &st[j]
		if s.owner != j {
			continue
		}
		switch s.kind {
		case kindBucket:
			s.fits = bucketFits(s.tat, now, s.interval, s.burst, cost)
		case kindLog:
			s.fits, s.added = true, false
			s.ls = strategy.LogState{Fits: now, Empty: now}
			if s.penalty {
				unknownLog = true
				continue
			}
			if ls, blocked := s.lt.Blocked(key, now, cost); blocked {
				s.fits, s.ls = false, ls
			} else {
				unknownLog = true
			}
		}
	}
	return !unknownLog && !admits(st, limits, now, cost, false)
}

// countPenalties counts a request the circuit breaker rejected, without the
// store's say, in the limits with a penalty: windows and buckets here, pushed
// by the retry loop; logs by a Take queued for it.
func (ns *Namespace) countPenalties(key string, st []lstate, now, cost int64) {
	var logs bool
	for j := range st {
		s := &st[j]
		if s.owner != j || !s.penalty {
			continue
		}
		switch s.kind {
		case kindWindow:
			// Counted here; the retry loop pushes it within RetryInterval.
			s.v = s.t.Add(key, s.w, now, cost)
		case kindBucket:
			s.tat0, _, s.spent = s.bt.Try(key, now, s.interval, s.burst, cost, shm.SpendAlways)
			s.tat = bucketAfter(s.tat0, now, s.interval, cost)
		case kindLog:
			logs = true
		}
	}
	if logs {
		tk, _ := ns.takeOf(key, st, now, cost, false)
		tk.Buckets, tk.Answered = nil, strategy.AnsweredRejected
		ns.queueTake(&pendingTake{take: *tk})
	}
}

// queueLogRefund queues a Refund of st's logs for the retry loop.
func (ns *Namespace) queueLogRefund(key string, st []lstate, now, cost int64) {
	tk, _ := ns.takeOf(key, st, now, cost, false)
	tk.Buckets, tk.Refund = nil, true
	ns.queueTake(&pendingTake{take: *tk})
}

// queueTake queues p for the retry loop; past maxPendingTakes the oldest
// Take whose outcome is known not to be applied is dropped and counted.
func (ns *Namespace) queueTake(p *pendingTake) {
	ns.takeMu.Lock()
	defer ns.takeMu.Unlock()
	if len(ns.takes) >= maxPendingTakes {
		for i, old := range ns.takes {
			if !old.unknown {
				ns.droppedTakes.Add(old.take.Cost)
				ns.takes[i] = nil
				ns.takes = append(ns.takes[:i], ns.takes[i+1:]...)
				break
			}
		}
	}
	ns.takes = append(ns.takes, p)
}

// settleTakes sends the queued Takes, oldest first, and stops at the first
// that fails: it is sent again by the next cycle. Called by the sync cycle.
func (ns *Namespace) settleTakes(ctx context.Context) error {
	for {
		ns.takeMu.Lock()
		if len(ns.takes) == 0 {
			ns.takeMu.Unlock()
			return nil
		}
		p := ns.takes[0]
		ns.takeMu.Unlock()
		cctx, cancel := context.WithTimeout(ctx, ns.cfg.SyncTimeout)
		_, err := ns.store.(strategy.Taker).Take(cctx, &p.take)
		cancel()
		if err != nil {
			if !errors.Is(err, strategy.ErrNotApplied) {
				p.unknown = true
			}
			return fmt.Errorf("%w: settle take %s: %w", ErrStoreUnavailable, p.take.ID, err)
		}
		ns.takeMu.Lock()
		if len(ns.takes) > 0 && ns.takes[0] == p {
			ns.takes = ns.takes[1:]
		}
		ns.takeMu.Unlock()
	}
}

// pendingTakes returns how many Takes wait to be settled, and the cost they
// carry.
func (ns *Namespace) pendingTakes() (n int, cost int64) {
	ns.takeMu.Lock()
	defer ns.takeMu.Unlock()
	for _, p := range ns.takes {
		cost += p.take.Cost
	}
	return len(ns.takes), cost
}
