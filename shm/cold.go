package shm

import "math"

// Holds reports whether the table holds an entry for key. It creates nothing
// and does not mark the entry used: a periodic namespace asks it before a
// decision, to know whether the key is cold (never seen here, or evicted
// since) and its totals must be read from the store first.
//
// An entry a take-back made again after its key was evicted is not held in
// this sense: it holds a correction, but not the key's totals.
func (t *Table) Holds(key string) bool {
	s, e := t.lookup(key)
	if e == nil {
		return false
	}
	held := e.flags.Load()&flagUnread == 0
	s.mu.RUnlock()
	return held
}

// readingAhead reports whether now is within the read-ahead of the end of a
// window of some size of the table.
func (t *Table) readingAhead(now int64) bool {
	if t.readAhead <= 0 {
		return false
	}
	for w := range t.n {
		if size := t.sizeMS[w]; now >= windowStart(now, size)+size-t.readAhead {
			return true
		}
	}
	return false
}

// SkipSeq returns the number of watch answers so far that skipped a key
// this table did not hold: a cold read takes it before it reads the store.
func (t *Table) SkipSeq() uint64 { return t.skipped.Load() }

// LoadColdSince records what the store reported, at now, for a key this
// node did not hold, read when SkipSeq was seq: counts[w] is the total of
// the current window (index 0) and of the previous one (index 1) of size
// index w, for each w whose bit is set in mask. It creates the entry when
// missing, marked used, and moves it to now's window.
//
// A window's synced count is set only while it is still unknown: a sync that
// settled a push of this key meanwhile learned a total at least as recent,
// and the hits it confirmed left local against it. Hits counted while the
// read was in flight are local and unconfirmed, so the view (synced + local)
// counts them once, on top of the store's total.
//
// When a watch answer skipped a key not held since seq, that may have been
// this key's change after the read: the watch's cursor moved past it, so no
// later answer lists it again. The next Collect then reads the entry's
// windows.
func (t *Table) LoadColdSince(key string, now int64, mask uint8, counts [2][2]int64, seq uint64) {
	s, e, excl := t.lock(key, now)
	if t.watch && (t.skipped.Load() != seq || t.readingAhead(now)) {
		// Near a window's end the watches skipped the key's next window
		// too, which a cold read does not read: read it once.
		e.flags.Or(flagReread)
	}
	defer s.unlock(excl)
	// Spare the entry from the next lap of the eviction hand: the decision
	// that waited for this read is about to use it (and then Unref it).
	e.markUsed()
	for w := range t.n {
		if mask&(1<<w) == 0 {
			continue
		}
		size := t.sizeMS[w]
		t.window(e, w, now)
		x := windowStart(now, size)
		// The entry may have moved past now's window since the read was
		// sent: the read's windows it still holds take their totals.
		p := &e.w[w]
		t.lockEntry(e)
		for i, start := range [2]int64{x, x - size} {
			if par, ok := p.held(start, size); ok {
				n := counts[w][i]
				if l := t.slotOf(e, w, par).local(); l < 0 && !t.wt && t.unsettled(counterRef{e: e, w: uint8(w), start: start}) {
					// A take-back in a push not settled yet may be in the
					// total read already, and local holds it until the
					// settle: count it once at most, never twice.
					n -= l
				}
				t.storeSynced(e, w, par, n, true)
			}
		}
		e.unlockEntry()
	}
	if e.flags.Load()&flagUnread != 0 {
		e.flags.And(^flagUnread) // read now: the key is warm
	}
	t.touch(s, e)
}

// Unref clears key's reference bit for the eviction hand, as if the key had
// been seen once: LoadCold creates the entry and the decision that follows
// finds it, which would otherwise count as a second sighting and spare a
// one-hit key (a flood's) from the next lap of the hand.
func (t *Table) Unref(key string) {
	if s, e := t.lookup(key); e != nil {
		e.flags.And(^flagRef)
		s.mu.RUnlock()
	}
}

// AddWindowsIfHeld is AddWindows for a key the table already holds: it
// creates nothing, and reports false (counting nothing) when the key is not
// held. A periodic namespace that reads cold keys first makes its check and
// learns whether the key is cold in one lookup.
func (t *Table) AddWindowsIfHeld(key string, now int64, mask uint8, v [2]int64, peek bool) ([2]View, bool) {
	out, _, held, _ := t.AddWindowsOpen(key, now, mask, v, peek, true, false, nil)
	return out, held
}

// Seal makes the table refuse what the lean calls (AddWindowsOpen and
// AddOpen with sealable) would count from now on. When Seal returns, every
// hit such a call counted is in the table for a Collect to find, and none
// is counted after. A namespace's Close seals its tables before its last
// collection, so that its lean decision paths need not register as calls
// in flight (two atomic writes a call).
//
// Some of those calls count without the shard's lock (see addOpenFast), so
// Seal cannot wait for them: it takes every entry out of the table instead,
// as an eviction does. Each window's local count moves to a retired record
// (which the next Collect pushes) and is swapped for poison, so a lock-free
// addition either came before and is in the record, or sees the poison and
// is refused. The records are not shed, however many: Close's collection
// pushes them all. Entries created after Seal (by calls that Close waits
// for) are marked, and lock-free additions leave them alone.
func (t *Table) Seal() {
	t.sealed.Store(true)
	t.retMu.Lock()
	t.shedAt = math.MaxInt
	t.retMu.Unlock()
	for i := range t.shards {
		s := &t.shards[i]
		s.mu.Lock()
		s.each(func(e *entry) { e.retire(t) })
		s.ix.Store(nil)
		s.count = 0
		s.mu.Unlock()
	}
}

// AddWindowsOpen is AddWindows (with ifHeld, AddWindowsIfHeld: held false
// and nothing done for a key the table does not hold) for a caller that
// judges the views at once: the call counts v only if judge admits the
// views (v added), and the views returned are those after. judge may run
// more than once a call (up to five times) and without the key's entry
// gate (see gate.go), on views that are then discarded; it must be free of
// side effects beyond its answer, and must not call the table on key (under
// the gate, that would spin forever). ok is judge's verdict (a
// nil judge admits). With sealable, a sealed table counts nothing and
// open is false; the lean decision paths, which Close does not wait for,
// pass it. It is the body of AddWindows and AddWindowsIfHeld too, and no
// wrapper of its own: the hot paths call it directly.
func (t *Table) AddWindowsOpen(key string, now int64, mask uint8, v [2]int64, peek, ifHeld, sealable bool, judge func([2]View) bool) (out [2]View, ok, held, open bool) {
	if out, ok, done := t.addWindowsFast(key, now, mask, v, peek, sealable, judge); done {
		return out, ok, true, true
	}
	return t.AddWindowsRest(key, now, mask, v, peek, ifHeld, sealable, judge)
}

// AddWindowsHeld is AddWindowsOpen's first step, for a caller on a hot
// path: for a key the table holds, in windows it has open, it makes the
// whole call (held and open) and reports done. Otherwise it does nothing
// and reports false, and the caller finishes with AddWindowsRest, with the
// same arguments. The two apart spare the caller a call and a copy of the
// views that AddWindowsOpen, the two in one, costs.
func (t *Table) AddWindowsHeld(key string, now int64, mask uint8, v [2]int64, peek, sealable bool, judge func([2]View) bool) (out [2]View, ok, done bool) {
	return t.addWindowsFast(key, now, mask, v, peek, sealable, judge)
}

// AddWindowsRest is AddWindowsOpen after AddWindowsHeld reported false: the
// call through the shard's lock.
func (t *Table) AddWindowsRest(key string, now int64, mask uint8, v [2]int64, peek, ifHeld, sealable bool, judge func([2]View) bool) (out [2]View, ok, held, open bool) {
	var s *shard
	var e *entry
	excl := false
	if !ifHeld {
		s, e, excl = t.lock(key, now)
	} else if s, e = t.lookup(key); e == nil {
		return out, false, false, !sealable || !t.sealed.Load()
	} else if e.flags.Load()&flagUnread != 0 {
		s.mu.RUnlock() // cold: see Holds
		return out, false, false, !sealable || !t.sealed.Load()
	} else {
		e.markUsed()
	}
	if sealable && t.sealed.Load() {
		s.unlock(excl)
		return out, false, true, false
	}
	t.lockEntry(e)
	out, ok = t.countJudged(e, now, mask, v, peek, judge)
	e.unlockEntry()
	t.touch(s, e)
	s.unlock(excl)
	return out, ok, true, true
}

// KeepCold marks key's entry unread: a decision whose cold read failed (or
// was not waited for) made it without the store's totals, so the next
// decision must still read them (see Holds). A LoadCold that landed in
// between costs one more read, whose totals it does not apply twice.
func (t *Table) KeepCold(key string) {
	if s, e := t.lookup(key); e != nil {
		if e.flags.Load()&flagUnread == 0 {
			e.flags.Or(flagUnread)
		}
		s.mu.RUnlock()
	}
}

// Refund takes back v (> 0) from key's window of size index w at now (the
// current window), and returns what it took back. Without a store (the
// table does not track pushes) it takes back no more than the window holds:
// a refund with no hit behind it (a caller's mistake) then cannot take the
// count below zero, which would admit more than the limit. With one, this
// node's view can be below the hits behind a refund (an entry made again
// after an eviction, totals settled out of order), so it takes back v.
// With unread (cold reads on), an entry it makes is unread, as a
// take-back's is, so the key stays cold until LoadCold reads its totals
// (see Holds).
func (t *Table) Refund(key string, w int, now, v int64, unread bool) int64 {
	var s *shard
	var e *entry
	var excl bool
	if unread {
		s, e, excl = t.lockTakeBack(key, now)
	} else {
		s, e, excl = t.lock(key, now)
	}
	t.lockEntry(e) // refunds one at a time: each sees the others' take-backs
	_, par := t.windowLocking(e, w, now, false)
	take := v
	if !t.track {
		take = min(v, max(t.slotOf(e, w, par).view(), 0))
	}
	if take > 0 {
		t.addLocal(e, w, par, -take)
	}
	e.unlockEntry()
	t.touch(s, e)
	s.unlock(excl)
	return take
}
