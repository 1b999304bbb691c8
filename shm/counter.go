package shm

import (
	"hash/maphash"

	"github.com/ratesync/ratelimit/internal/floor"
)

// lock returns key's entry with its shard locked: read-locked when the entry
// existed, write-locked when this call created it. Release with s.unlock.
//
// An entry found existing is marked used for the eviction hand; a new one is
// not, so keys seen once (a flood of one-hit keys) are evicted before keys
// seen again, which the hand spares for one more lap.
func (t *Table) lock(key string, now int64) (s *shard, e *entry, excl bool) {
	s, e, excl, _ = t.lockMade(key, now, 0)
	return s, e, excl
}

// lockMade is lock, and reports whether this call made the entry; an entry
// it makes carries flags from the start, before lock-free finders can see
// it.
func (t *Table) lockMade(key string, now int64, flags uint32) (s *shard, e *entry, excl, made bool) {
	h := maphash.String(t.seed, key)
	s = t.shardOf(h)
	s.mu.RLock()
	if e = s.find(key, h); e != nil {
		e.markUsed()
		return s, e, false, false
	}
	s.mu.RUnlock()
	s.mu.Lock()
	if e = s.find(key, h); e == nil {
		e, made = t.insert(s, key, h, now, flags), true // copies key
	} else {
		e.markUsed()
	}
	return s, e, true, made
}

// lockTakeBack is lock for a take-back: an entry it makes (the key was
// evicted since the count) is marked unread, so the key stays cold.
func (t *Table) lockTakeBack(key string, now int64) (s *shard, e *entry, excl bool) {
	// Marked before it is placed in the index: a lock-free finder
	// (findFast, addWindowsFast) that saw it unmarked would take the key
	// as held.
	s, e, excl, _ = t.lockMade(key, now, flagUnread)
	return s, e, excl
}

// use is markUsed and touch, for a count that needs both: one load of the
// flags skips them when every mark is already set, as on a hot key (2% of a
// hot two-limit Allow's instructions, measured).
func (t *Table) use(s *shard, e *entry) {
	if e.flags.Load()&(flagRef|flagUsed|flagListed) != flagRef|flagUsed|flagListed {
		t.markAndTouch(s, e)
	}
}

// markAndTouch is use when a mark is missing.
func (t *Table) markAndTouch(s *shard, e *entry) {
	e.markUsed()
	t.touch(s, e)
}

// markUsed sets the entry's reference bit for the eviction hand.
func (e *entry) markUsed() {
	if e.flags.Load()&flagRef == 0 {
		e.flags.Or(flagRef)
	}
}

// lookup returns key's entry read-locked, or nil with nothing locked.
func (t *Table) lookup(key string) (*shard, *entry) {
	h := maphash.String(t.seed, key)
	s := t.shardOf(h)
	s.mu.RLock()
	if e := s.find(key, h); e != nil {
		return s, e
	}
	s.mu.RUnlock()
	return nil, nil
}

func (s *shard) unlock(excl bool) {
	if excl {
		s.mu.Unlock()
	} else {
		s.mu.RUnlock()
	}
}

// window returns the start of the window of size index w that a hit at now
// counts in, and its parity, rotating e forward when now has entered a new
// window. A clock that went backwards never moves windows back: a hit or read
// behind the newest window counts in the newest one, so a clock jumping back
// never lets a key gain (the caller's weight for an instant before the window
// is 1). One division on the common path.
func (t *Table) window(e *entry, w int, now int64) (int64, int) {
	return t.windowLocking(e, w, now, true)
}

// windowLocking is window; lock says whether it takes e's gate to rotate (a
// caller that holds it passes false).
func (t *Table) windowLocking(e *entry, w int, now int64, lock bool) (int64, int) {
	p := &e.w[w]
	x, par := t.windowOf(w, now)
	lat := p.latest.Load()
	if x > lat {
		if lock {
			t.lockEntry(e)
		}
		e.rotate(t, w, x)
		if lock {
			e.unlockEntry()
		}
		lat = p.latest.Load()
	}
	if x < lat {
		return lat, parity(lat, t.sizeMS[w])
	}
	return x, par
}

// windowOf returns the start of the window of size index w that holds now,
// and its parity. The table remembers the window of the last call, so the
// common case (now in the same window as the last call) costs no division.
// Racing calls may store each other's windows; the cache is only a hint.
func (t *Table) windowOf(w int, now int64) (int64, int) {
	if x, par, ok := t.lastWindow(w, now); ok {
		return x, par
	}
	return t.newWindow(w, now)
}

// newWindow is windowOf when now has left the window of the last call: it
// works the window out and remembers it.
func (t *Table) newWindow(w int, now int64) (int64, int) {
	q := floor.Div(now, t.sizeMS[w])
	t.lastQ[w].Store(q)
	return q * t.sizeMS[w], int(q & 1)
}

// lastWindow is windowOf's common case, small enough to inline where
// windowOf's call would count (the judged count without the gate: 3% of a
// hot two-limit Allow's instructions, measured): the window of the last
// call and its parity, and whether now is in it.
func (t *Table) lastWindow(w int, now int64) (int64, int, bool) {
	size := t.sizeMS[w]
	q := t.lastQ[w].Load()
	// No subtraction: now - x can overflow. Where x+size overflows, the
	// test fails and the window is worked out afresh.
	x := q * size
	return x, int(q & 1), now >= x && now < x+size
}

// touch marks e used since the last Collect when tracking, and puts it on its
// shard's active list if it is not there yet: the next Collect pushes its hits
// and reads its windows, and so does the one after (see Collect).
func (t *Table) touch(s *shard, e *entry) {
	if !t.track || t.walk {
		return
	}
	for {
		f := e.flags.Load()
		if f&(flagUsed|flagListed) == flagUsed|flagListed {
			return
		}
		if e.flags.CompareAndSwap(f, f|flagUsed|flagListed) {
			if f&flagListed == 0 {
				s.dirtyMu.Lock()
				if len(s.dirty) >= 2*s.cap+8 {
					s.dropDeadDirty()
				}
				s.dirty = append(s.dirty, e)
				s.dirtyMu.Unlock()
			}
			return
		}
	}
}

// dropDeadDirty removes evicted entries from the dirty list, so that a flood of
// keys between two syncs does not keep them alive: their hits are in retired
// records, which Collect reads anyway. The caller holds s.dirtyMu; the list
// grows past twice the shard's cap between two calls, so the cost is amortised.
func (s *shard) dropDeadDirty() {
	live := s.dirty[:0]
	for _, e := range s.dirty {
		if e.flags.Load()&flagDead == 0 {
			live = append(live, e)
		}
	}
	clear(s.dirty[len(live):])
	s.dirty = live
}

// View is the node's view of one key and window size at an instant.
type View struct {
	Start int64 // start of the window the instant counts in, Unix ms
	Cur   int64 // count in that window
	Prev  int64 // count in the window before it
}

// Add adds v to key's window of size index w at now (Unix ms) and returns the
// view after the addition.
func (t *Table) Add(key string, w int, now, v int64) View {
	s, e, excl := t.lock(key, now)
	t.lockEntry(e)
	x, par := t.windowLocking(e, w, now, false)
	t.addLocal(e, w, par, v)
	vw := View{Start: x}
	vw.Cur, vw.Prev = t.viewsAt(e, w, x, par)
	e.unlockEntry()
	t.touch(s, e)
	s.unlock(excl)
	return vw
}

// Peek returns key's view at now without counting anything. It creates the
// entry when missing and moves it to now's window, so the key counts as seen
// by this node and the next sync reads it.
func (t *Table) Peek(key string, w int, now int64) View {
	s, e, excl := t.lock(key, now)
	t.lockEntry(e)
	x, par := t.windowLocking(e, w, now, false)
	vw := View{Start: x}
	vw.Cur, vw.Prev = t.viewsAt(e, w, x, par)
	e.unlockEntry()
	t.touch(s, e)
	s.unlock(excl)
	return vw
}

// AddPending is Add for a write-through (the table needs WriteThrough): it appends to b the hit, recorded as
// pending so no sync pushes it again, and a read of the previous window. Settle
// b with Ack or Release.
func (t *Table) AddPending(key string, w int, now, v int64, b *Batch) View {
	s, e, excl := t.lock(key, now)
	t.lockEntry(e)
	x, _ := t.windowLocking(e, w, now, false)
	p := &e.w[w]
	size := t.sizeMS[w]
	par, ok := p.held(x, size)
	if !ok {
		x = p.latest.Load() // rotated past x since window(): count in the newest
		par = parity(x, size)
	}
	t.addLocal(e, w, par, v)
	t.addDiff(b, counterRef{e: e, w: uint8(w), start: x}, e.key(), v)
	vw := View{Start: x}
	vw.Cur, vw.Prev = t.viewsAt(e, w, x, par)
	e.unlockEntry()
	t.addRead(b, counterRef{e: e, w: uint8(w), start: x - size}, e.key())
	t.touch(s, e)
	s.unlock(excl)
	return vw
}

// PeekReads is Peek for a read-through: it appends to b reads of key's current
// and previous window at now, and returns the view before them. Settle b
// with Ack.
func (t *Table) PeekReads(key string, w int, now int64, b *Batch) View {
	s, e, excl := t.lock(key, now)
	x, par := t.window(e, w, now)
	size := t.sizeMS[w]
	t.addRead(b, counterRef{e: e, w: uint8(w), start: x}, e.key())
	t.addRead(b, counterRef{e: e, w: uint8(w), start: x - size}, e.key())
	t.touch(s, e)
	vw := View{Start: x}
	t.lockEntry(e)
	vw.Cur, vw.Prev = t.viewsAt(e, w, x, par)
	e.unlockEntry()
	s.unlock(excl)
	return vw
}

// ViewAt returns key's view of the window of size index w starting at x
// (and of the one before it), whatever window now is: a write-through judges
// the window its hit counted in, which a call at a later instant may have
// rotated away from the newest during the push. A window the entry does
// not hold reads 0. For the window and the one before, learned reports
// whether the node knows the store's total for it, and beyond what this
// node counts there that a store's reply to one of its pushes may lack:
// its counts in no push (a refund, a hit counted while the store failed),
// and the hits of pushes still in flight (counted even if the store
// applied them before the reply: twice, never zero times). The take-backs
// in flight are left out of beyond: the store may have applied them before
// the reply, which then lacks the hits already. It reads all under the
// entry's lock, so no rotation comes in between, and creates nothing.
func (t *Table) ViewAt(key string, w int, x int64) (v View, learned [2]bool, beyond [2]int64) {
	v.Start = x
	s, e := t.lookup(key)
	if e == nil {
		return v, learned, beyond
	}
	size := t.sizeMS[w]
	t.lockEntry(e)
	for k, n := range [2]*int64{&v.Cur, &v.Prev} {
		start := x - int64(k)*size
		if sl, ok := t.heldSlot(e, w, start); ok {
			*n = sl.view()
			learned[k] = sl.synced() != unknown
			beyond[k] = sl.local() - t.pendNeg(counterRef{e: e, w: uint8(w), start: start})
		}
	}
	e.unlockEntry()
	s.mu.RUnlock()
	return v, learned, beyond
}

// TakeBackPending is TakeBack for a write-through, one window size: it takes
// v back from key's window of size index w starting at start (the window a
// write-through counted it in, whatever window is newest now) and, when the
// entry still holds that window, appends the correction to b as pending,
// and reports true. A window rotated out since had the count retired with
// it: the correction goes to the retired record, which the next sync
// pushes, and TakeBackPending reports false. Settle b with Ack or Release.
func (t *Table) TakeBackPending(key string, w int, now, start, v int64, b *Batch) bool {
	s, e, excl := t.lockTakeBack(key, now)
	defer s.unlock(excl)
	defer t.touch(s, e)
	t.lockEntry(e)
	defer e.unlockEntry()
	if start > e.w[w].latest.Load() {
		e.rotate(t, w, start) // re-created since the count (see takeBackLocked)
	}
	ref := counterRef{e: e, w: uint8(w), start: start}
	par, ok := e.w[w].held(start, t.sizeMS[w])
	if !ok {
		t.adjustRetired(ref, -v)
		return false
	}
	t.addLocal(e, w, par, -v)
	t.addDiff(b, ref, e.key(), -v)
	return true
}

// AddWindows is Add for several window sizes of one key at once: for each
// size index w whose bit is set in mask (bit 0 for index 0, bit 1 for index
// 1), it adds v[w] (none when peek is set) and returns the view. One lookup
// serves both sizes, which is what a check against several limits needs.
// Unused indexes get a zero View.
func (t *Table) AddWindows(key string, now int64, mask uint8, v [2]int64, peek bool) [2]View {
	out, _, _, _ := t.AddWindowsOpen(key, now, mask, v, peek, false, false, nil)
	return out
}

// addWindowsLocked is AddWindows on the entry e, with its shard locked and
// e's gate held by the caller.
//
// The caller holds e's gate throughout, so that no rotation comes between finding a
// window, counting in it and reading the views a caller judges: a call at a
// later instant rotating the entry by two windows in between made the count
// land in the slot reused for the newer window while the view read the
// older one as not held (0), and one rotating it by one window between the
// current and the previous view made the previous window read 0 (both found
// by review: a fixed limit of 4 a second admitted 5, a sliding limit of 2
// admitted a load of 3). Lock-free additions (addOpenFast) never rotate, and
// may still land beside it.
func (t *Table) addWindowsLocked(e *entry, now int64, mask uint8, v [2]int64, peek bool) [2]View {
	var out [2]View
	var pars [2]int
	// Find every window before counting in any: the atomic adds are full
	// barriers, so reading both sizes' windows first lets the CPU fetch
	// their cache lines in parallel rather than one after the other.
	for w := range t.n {
		if mask&(1<<w) != 0 {
			out[w].Start, pars[w] = t.windowLocking(e, w, now, false)
		}
	}
	for w := range t.n {
		if mask&(1<<w) == 0 {
			continue
		}
		x, par := out[w].Start, pars[w]
		if !peek {
			t.addLocal(e, w, par, v[w])
		}
		out[w].Cur, out[w].Prev = t.viewsAt(e, w, x, par)
	}
	return out
}

// TakeBack takes v[w] back from key's window of size index w that starts at
// starts[w], for each w whose bit is set in mask: a count a caller made
// (AddWindows) and then rejected. It returns the views after, at now.
//
// Adding -v at now would take it from the newest window, which is another
// one if a call at a later instant rotated the key since the count: the
// rejected hit would stay in its window, and the next would start below
// zero and admit one more (found by review: 9 admitted across two seconds
// under a fixed limit of 4 a second). TakeBack finds the window by its
// start instead (see takeBackLocked).
func (t *Table) TakeBack(key string, now int64, mask uint8, starts, v [2]int64) [2]View {
	s, e, excl := t.lockTakeBack(key, now)
	t.lockEntry(e)
	out := t.takeBackViews(e, now, mask, starts, v)
	e.unlockEntry()
	t.touch(s, e)
	s.unlock(excl)
	return out
}

// takeBackLocked takes v[w] back from e's window of size index w starting at
// starts[w], for each w in mask, under e's lock so that no rotation comes
// between finding the window and taking from it. A window the entry no
// longer holds (rotated out since: the call stalled for a whole window)
// had the count retired with it, so it is taken from the retired record.
// The caller holds e's shard's lock and e's gate.
func (t *Table) takeBackLocked(e *entry, mask uint8, starts, v [2]int64) {
	for w := range t.n {
		if mask&(1<<w) == 0 || v[w] == 0 {
			continue
		}
		if starts[w] > e.w[w].latest.Load() {
			// The entry was evicted after the count and made again by a
			// call behind the count's window (found by review): the count
			// is in the old entry's record, under another ref. Open the
			// window here and take the count from its slot: a record of
			// this entry for a window it then opens would share the
			// slot's ref, and the slot's ack and retirement would
			// swallow it, leaving the rejected hit counted.
			e.rotate(t, w, starts[w])
		}
		if par, ok := e.w[w].held(starts[w], t.sizeMS[w]); ok {
			t.addLocal(e, w, par, -v[w])
		} else {
			t.adjustRetired(counterRef{e: e, w: uint8(w), start: starts[w]}, -v[w])
		}
	}
}
