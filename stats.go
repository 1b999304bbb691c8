package ratelimit

import (
	"sync/atomic"
	"time"
)

// Stats is a snapshot of a namespace's counters, for monitoring.
type Stats struct {
	TrackedKeys      int           // keys held in memory now
	Evictions        int64         // keys evicted by the MaxKeys cap
	Syncs            int64         // background sync cycles run
	SyncErrors       int64         // background sync cycles that failed
	PendingHits      int64         // hits handed to pushes not yet settled
	RetiredWindows   int           // evicted or rotated windows whose hits wait for a push
	UnresolvedPushes int           // pushes whose outcome is unknown, to re-send
	LastSync         time.Time     // when the last cycle ended (zero before the first)
	LastSyncDuration time.Duration // how long the last cycle took
}

type stats struct {
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
	}
	st.PendingHits, st.RetiredWindows = ns.pendingHits()
	ns.unresMu.Lock()
	st.UnresolvedPushes = len(ns.unresolved)
	ns.unresMu.Unlock()
	return st
}
