package ratelimit

import (
	"sync/atomic"
	"time"
)

// Stats is a snapshot of a namespace's counters, for monitoring.
type Stats struct {
	TrackedKeys    int   // keys held in memory now (in the fullest table: windows, token buckets or sliding logs); window counters leave the table at Close, which hands their hits to its last push
	Evictions      int64 // keys evicted by the MaxKeys cap
	Syncs          int64 // sync cycles run (by the loop or Sync)
	SyncErrors     int64 // sync cycles that failed
	PendingHits    int64 // hits counted here that the store has not confirmed yet
	RetiredWindows int   // evicted or rotated windows whose hits wait for a push (after a Close whose push failed, every window that had unpushed hits)
	// DroppedHits counts unconfirmed hits given up to keep memory bounded
	// during a long store outage: the retired windows past their cap (first
	// those too old to weigh in any decision, then those with the fewest
	// hits), the spent tokens of evicted token buckets past theirs, and the
	// cost of synchronous-mode decisions past maxPendingTakes. They never
	// reach the store.
	DroppedHits      int64
	UnresolvedPushes int // pushes whose outcome is unknown, to re-send
	// UnsettledTakes counts synchronous-mode decisions on token buckets and
	// sliding logs made while the store failed, waiting to be settled with it.
	UnsettledTakes   int
	LastSync         time.Time     // when the last cycle ended (zero before the first)
	LastSyncDuration time.Duration // how long the last cycle took
	// Decisions counts Allow's answers per window size, in WindowSizes order.
	Decisions []WindowDecisions
}

// WindowDecisions counts the decisions Allow made with a limit of one window
// size as the binding limit.
type WindowDecisions struct {
	Window   time.Duration
	Allowed  int64
	Rejected int64
	Degraded int64 // decisions made from local state because the store failed
}

// decisionStripes is how many decisionCounters each window size has: a
// decision counts in the one its key picks, so cores deciding for different
// keys at once rarely write the same cache line (one shared counter would cost
// every decision a cache-line transfer between cores). Stats adds them up.
const decisionStripes = 16

// stripeOf picks key's stripe from a few of its bytes: far cheaper than a
// hash or a random number, and keys that differ anywhere near their end or
// middle (counters, addresses, tokens) spread over the stripes. Decisions for
// one key share a stripe, as they share the key's counters anyway.
func stripeOf(key string) int {
	n := len(key) // > 0: keys are checked first
	return (int(key[n-1]) + 3*int(key[n/2]) + 5*int(key[(n-1)/4*3])) % decisionStripes
}

// decisionCounters are one stripe of one window size's WindowDecisions,
// padded to a cache line of its own.
type decisionCounters struct {
	allowed, rejected, degraded atomic.Int64
	_                           [40]byte
}

type stats struct {
	decisions         []decisionCounters // decisionStripes per window size index
	syncs, syncErrors atomic.Int64
	lastSync          atomic.Int64 // Unix ns
	lastDuration      atomic.Int64
}

func (s *stats) recordSync(start time.Time, err error) {
	end := time.Now()
	s.syncs.Add(1)
	if err != nil {
		s.syncErrors.Add(1)
	}
	s.lastSync.Store(end.UnixNano())
	s.lastDuration.Store(int64(end.Sub(start)))
}

// recordDecision counts one decision for key whose binding limit has window
// index i.
func (s *stats) recordDecision(key string, i int, allowed, degraded bool) {
	c := &s.decisions[i*decisionStripes+stripeOf(key)]
	if allowed {
		c.allowed.Add(1)
	} else {
		c.rejected.Add(1)
	}
	if degraded {
		c.degraded.Add(1)
	}
}

// Stats returns a snapshot of the namespace's counters.
func (ns *Namespace) Stats() Stats {
	st := Stats{
		Syncs:            ns.stats.syncs.Load(),
		SyncErrors:       ns.stats.syncErrors.Load(),
		LastSyncDuration: time.Duration(ns.stats.lastDuration.Load()),
	}
	if n := ns.stats.lastSync.Load(); n != 0 {
		st.LastSync = time.Unix(0, n)
	}
	for _, t := range ns.tables {
		st.TrackedKeys = max(st.TrackedKeys, t.Len())
		st.Evictions += t.Evictions()
		st.DroppedHits += t.DroppedHits()
	}
	for i := range ns.buckets {
		if t := ns.buckets[i].Load(); t != nil {
			st.TrackedKeys = max(st.TrackedKeys, t.Len())
			st.Evictions += t.Evictions()
			st.DroppedHits += t.DroppedTokens()
		}
		if t := ns.logs[i].Load(); t != nil {
			st.TrackedKeys = max(st.TrackedKeys, t.Len())
			st.Evictions += t.Evictions()
		}
	}
	st.DroppedHits += ns.droppedTakes.Load()
	st.PendingHits, st.RetiredWindows = ns.pendingHits()
	ns.unresMu.Lock()
	st.UnresolvedPushes = len(ns.unresolved)
	ns.unresMu.Unlock()
	st.UnsettledTakes, _ = ns.pendingTakes()
	for i, w := range ns.cfg.WindowSizes {
		wd := WindowDecisions{Window: w}
		stripes := ns.stats.decisions[i*decisionStripes : (i+1)*decisionStripes]
		for j := range stripes {
			c := &stripes[j]
			wd.Allowed += c.allowed.Load()
			wd.Rejected += c.rejected.Load()
			wd.Degraded += c.degraded.Load()
		}
		st.Decisions = append(st.Decisions, wd)
	}
	return st
}
