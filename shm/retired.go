package shm

import (
	"slices"
)

// retired is the unconfirmed part of a window that left its entry.
type retired struct {
	key          string
	local, acked int64
}

// retire records the unconfirmed part of a window leaving its entry. Past the
// cap on retired records (a store outage while keys rotate or are evicted),
// it first drops what can no longer matter and then the smallest records; see
// shed.
func (t *Table) retire(ref counterRef, local, acked int64) {
	if !t.track {
		return
	}
	t.retMu.Lock()
	t.retired[ref] = &retired{key: ref.e.key(), local: local, acked: acked}
	n := len(t.retired)
	if n > t.shedAt {
		t.shed()
		n = len(t.retired)
		// When a push in flight holds more records than shed may keep, the
		// next shed waits for another quarter of the cap: each shed's pass
		// stays amortised, and memory bounded by that push plus the quarter.
		t.shedAt = max(t.retCap, n+t.retCap/4)
	}
	t.retMu.Unlock()
	if n > t.maxRet && t.pressure != nil {
		t.pressure()
	}
}

// adjustRetired adds d to the unconfirmed hits of the retired window ref,
// creating its record (the window's earlier record may be settled and
// gone), for the next Collect to push.
func (t *Table) adjustRetired(ref counterRef, d int64) {
	if !t.track {
		return
	}
	t.retMu.Lock()
	if r := t.retired[ref]; r != nil {
		r.local += d
	} else {
		// Diffs of ref still in flight belong to no record (rotate
		// keeps none when they cancel out); their acknowledgements will
		// land in this one, so it counts them as unconfirmed too.
		t.retired[ref] = &retired{key: ref.e.key(), local: d + t.pend(ref)}
	}
	t.retMu.Unlock()
}

// shed brings the retired records down to three quarters of their cap, so
// that memory stays bounded however long the store is out. It drops, in
// order:
//
//  1. the records of windows that can no longer weigh in any decision: older
//     than the previous window at the newest time the table has seen;
//  2. then, if that was not enough, the records with the fewest unconfirmed
//     hits, which change the store's counts the least.
//
// Records with hits in a push still in flight are kept. Every dropped hit is
// counted (DroppedHits). The caller holds t.retMu; the cost, a pass over the
// records and a sort of their counts, is amortised over the quarter of the
// cap that retire adds before the next call.
func (t *Table) shed() {
	target := t.retCap * 3 / 4
	now := t.newest.Load()
	busy := t.inFlight()
	for ref, r := range t.retired {
		if size := t.sizeMS[ref.w]; ref.start+2*size <= now && !busy(ref) {
			t.drop(ref, r)
		}
	}
	if len(t.retired) <= target {
		return
	}
	counts := make([]int64, 0, len(t.retired))
	for ref, r := range t.retired {
		if !busy(ref) {
			counts = append(counts, abs(r.local-r.acked))
		}
	}
	slices.Sort(counts)
	// Drop every record whose count is at most the threshold, fewer at the
	// threshold itself if that would drop more than needed.
	excess := min(len(t.retired)-target, len(counts))
	if excess == 0 {
		return
	}
	threshold := counts[excess-1]
	atThreshold := excess - (slices.Index(counts, threshold))
	for ref, r := range t.retired {
		if c := abs(r.local - r.acked); c > threshold || busy(ref) {
			continue
		} else if c == threshold {
			if atThreshold == 0 {
				continue
			}
			atThreshold--
		}
		t.drop(ref, r)
	}
}

// inFlight returns a test for refs with hits in a push not yet settled. With
// WriteThrough the table tracks them per ref (pend); otherwise a pass over
// the open batches (one or two: a periodic sync settles a push before it
// collects the next) finds them. The caller holds t.retMu.
func (t *Table) inFlight() func(counterRef) bool {
	if t.wt {
		return func(ref counterRef) bool { return t.pend(ref) != 0 }
	}
	refs := make(map[counterRef]bool)
	for b := range t.open {
		for _, ref := range b.diffRefs {
			refs[ref] = true
		}
	}
	return func(ref counterRef) bool { return refs[ref] }
}

// drop removes a retired record and counts its unconfirmed hits as dropped.
// The caller holds t.retMu.
func (t *Table) drop(ref counterRef, r *retired) {
	t.dropped.Add(abs(r.local - r.acked))
	delete(t.retired, ref)
}

// noteTime records that some window starting at x is current: a lower bound
// of the time the table's callers have reached, for shed.
func (t *Table) noteTime(x int64) {
	for {
		n := t.newest.Load()
		if x <= n || t.newest.CompareAndSwap(n, x) {
			return
		}
	}
}

// DroppedHits returns how many unconfirmed hits the table dropped to keep its
// retired records within their cap (see Options.MaxRetired).
func (t *Table) DroppedHits() int64 { return t.dropped.Load() }

func abs(v int64) int64 {
	if v < 0 {
		return -v
	}
	return v
}
