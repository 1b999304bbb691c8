package shm

import (
	"math"
	"sync/atomic"
	"unsafe"
)

// noWindow marks a window pair that has not held any window yet.
const noWindow = math.MinInt64

// unknown marks a window's synced count before this node learned the store's
// total for the window; it reads as 0.
const unknown = math.MinInt64

// entry flag bits.
const (
	flagUsed   uint32 = 1 << iota // used (read or written) since the last Collect
	flagListed                    // on its shard's active list, for the next Collect
	flagRef                       // used since the eviction hand last passed
	flagDead                      // removed from the table; its data was retired
	// flagInFlight (without WriteThrough): some window of the entry is in a
	// push not settled yet (there is one such push at a time).
	flagInFlight
	// flagBornSealed: created after Seal, so a lean call, which Seal
	// refuses, must not count in it (see addOpenFast).
	flagBornSealed
	// flagUnread: made again by a take-back after its key was evicted, to
	// hold the correction; the store's totals were never read into it, so
	// the key still counts as cold until LoadCold (see Holds).
	flagUnread
	// flagReread: a cold read loaded totals that may predate a change a
	// watch skipped (the key was not held then): the next Collect reads the
	// entry's windows again (see LoadColdSince).
	flagReread
	// flagWide: some count of the entry left the range of its 32-bit
	// slots; its counts live in 64-bit slots (Table.wides) from then on.
	flagWide
)

// An entry's counts are 32-bit (nslot), which keeps an entry in 64 bytes
// before its key.
// A count that would leave their range moves the entry's counts to 64-bit
// slots (wslot, see Table.widen), under its lock, for good. The bounds:
//
//   - a narrow local count stays within ±narrowLocal, but for lock-free
//     additions in flight: a locked addition that would pass the bound
//     widens the entry first (one that passes it racing a lock-free one
//     takes itself back: under the lock no swap can come in between), and
//     a lock-free addition (at most maxFast) that passed it keeps its hit
//     and widens the entry under its lock; a locked addition adds at most
//     narrowLocal, so no sum wraps around;
//   - a narrow synced count holds a store total within ±narrowSynced, or
//     unknown32;
//   - poison32 is what a narrow local count becomes when the entry leaves
//     the table (retireAll) or goes wide (widen). A lock-free addition that
//     lands on it sees a result below -2^30: its hit was not in the swapped
//     count, so it takes it back and counts it again through the locked
//     path. Legitimate counts stay above -2^30 as long as fewer than 2^17
//     lock-free additions are in flight at once, and the poison, drifting
//     by the additions in flight, stays below it.
const (
	maxFast      = 1 << 12
	narrowLocal  = 1 << 29
	narrowSynced = 1 << 30
	poison32     = -(1<<30 + 1<<29)
	unknown32    = math.MinInt32
)

// poisoned reports whether a narrow local count read or returned by an
// addition is poison (with lock-free additions that landed on it since and
// are being taken back).
func poisoned(n int32) bool { return n < -(1 << 30) }

// The flags' upper bits record which windows of the entry the current watch
// cycle pushed a diff for (see Table.Watches): their totals came back with
// the push, so a full read in the same cycle need not read them again. Bits
// markShift.. are one bit per window slot (size index × 2 + parity), bits
// cycleShift.. the cycle's number, modulo 2^19.
const (
	markShift  = 9
	cycleShift = 13
	markBits   = uint32(0xf) << markShift
)

// markDiff records that the current cycle pushes a diff for the window slot
// bit of e.
func (e *entry) markDiff(cycle uint32, bit uint32) {
	for {
		f := e.flags.Load()
		mark := f & markBits
		if f>>cycleShift != cycle {
			mark = 0
		}
		n := f&(1<<markShift-1) | mark | bit<<markShift | cycle<<cycleShift
		if n == f || e.flags.CompareAndSwap(f, n) {
			return
		}
	}
}

// clearMarks removes every entry's diff marks (see Table.Watches).
func (t *Table) clearMarks() {
	for i := range t.shards {
		s := &t.shards[i]
		s.mu.RLock()
		s.each(func(e *entry) {
			for {
				f := e.flags.Load()
				if f&markBits == 0 || e.flags.CompareAndSwap(f, f&^markBits) {
					return
				}
			}
		})
		s.mu.RUnlock()
	}
}

// diffed reports whether the cycle pushed a diff for e's window slot bit.
func (e *entry) diffed(cycle uint32, bit uint32) bool {
	f := e.flags.Load()
	return f>>cycleShift == cycle && f&(bit<<markShift) != 0
}

// nslot is one window's counts on this node, narrow (see maxFast):
//
//   - local: the hits counted here in the window that the store has not
//     confirmed yet (waiting for a push, or in one);
//   - synced: the store's cluster-wide total, as last learned, which includes
//     every hit of this node it confirmed.
//
// The node's view of the window is synced + local. When a push is confirmed,
// the store's total (which now has the pushed hits) becomes synced first,
// then the pushed hits leave local: in between, a reader counts them twice,
// never zero times.
type nslot struct {
	local  atomic.Int32
	synced atomic.Int32
}

// wslot is nslot with 64-bit counts, for an entry gone wide. Lock-free
// additions never reach it: it is read and written under the entry's lock.
type wslot struct {
	local  atomic.Int64
	synced atomic.Int64
}

// wide is a wide entry's counts, by size index and slot.
type wide [2][2]wslot

// maxLocal bounds the magnitude of a window's count on one node: an addition
// that takes it further saturates at ±maxLocal instead of wrapping around
// (1,024 additions of 2^53 would otherwise wrap to a large negative count,
// and a limit would then admit everything). With a store that saturates its
// totals at ±strategy.MaxTotal, a node's view of a window never overflows.
const maxLocal = 1 << 60

// testHookView, when set (by tests), runs between view's two loads.
var testHookView func()

// view returns synced + local, never less than the count: a settled push
// moves hits between the two (see Table.ack), and a view spanning it may
// read one count from before and the other from after. view loads local,
// then synced, then local again, and takes the larger local:
//
//   - a push of hits (d > 0) raises synced, then lowers local: a synced
//     that holds the pushed hits is read after the local that still held
//     them was, so the view counts them twice, never zero times;
//   - a push that took hits back (d < 0, a refund) raises local, then
//     lowers synced: a synced that lost them is read before the second load
//     of local, which has them back.
func (s *nslot) view() int64 {
	l := s.local.Load()
	if testHookView != nil {
		testHookView()
	}
	return s.viewFrom(l)
}

// viewFrom is view for a caller that loaded local (or had it returned by
// an addition) as l: it loads synced, then local again. Poison, never the
// larger local, is left out.
func (s *nslot) viewFrom(l int32) int64 {
	return known32(s.synced.Load()) + int64(max(l, s.local.Load()))
}

// viewStill is view for a caller that checks afterwards that no holder of
// the entry's gate came between (see addWindowsFast): one load of each
// count, since only a holder moves hits from local to synced.
func (s *nslot) viewStill() int64 {
	return known32(s.synced.Load()) + int64(s.local.Load())
}

// known32 returns a narrow synced count, 0 while unknown.
func known32(sy int32) int64 {
	if sy == unknown32 {
		return 0
	}
	return int64(sy)
}

// fitsNarrow reports whether a local count n stays narrow.
func fitsNarrow(n int64) bool { return n >= -narrowLocal && n <= narrowLocal }

// addView adds v (|v| <= narrowLocal: with the count in range, the sum
// cannot wrap) to a narrow slot of a live entry whose lock the caller holds and returns the view after, or reports false
// (having added nothing) when the result would leave the narrow range:
// the caller then widens the entry.
func (s *nslot) addView(v int64) (int64, bool) {
	if !fitsNarrow(int64(s.local.Load()) + v) {
		return 0, false // (see Table.addLocal)
	}
	n := s.local.Add(int32(v))
	if !fitsNarrow(int64(n)) {
		s.local.Add(-int32(v))
		return 0, false
	}
	return s.viewFrom(n), true
}

// cnt is one window slot's counts, narrow or wide, for a caller that holds
// the entry's lock (see Table.slotOf). Exactly one of n and x is set.
type cnt struct {
	n *nslot
	x *wslot
}

// local returns the slot's local count.
func (c cnt) local() int64 {
	if c.x != nil {
		return c.x.local.Load()
	}
	return int64(c.n.local.Load())
}

// synced returns the slot's synced count, unknown while unknown.
func (c cnt) synced() int64 {
	if c.x != nil {
		return c.x.synced.Load()
	}
	if sy := c.n.synced.Load(); sy != unknown32 {
		return int64(sy)
	}
	return unknown
}

// view returns synced + local (see nslot.view).
func (c cnt) view() int64 {
	if c.x == nil {
		return c.n.view()
	}
	l := c.x.local.Load()
	if testHookView != nil {
		testHookView()
	}
	return known(c.x.synced.Load()) + max(l, c.x.local.Load())
}

// reset empties the slot for a new window and returns the local count it
// held. A wide entry's narrow slot keeps its poison.
func (c cnt) reset() int64 {
	if c.x != nil {
		c.x.synced.Store(unknown)
		return c.x.local.Swap(0)
	}
	// A hit racing with this reset lands in the new window: counted,
	// never lost.
	l := c.n.local.Swap(0)
	c.n.synced.Store(unknown32)
	return int64(l)
}

// wideAdd adds v to a wide slot's local count, saturating at ±maxLocal.
func (x *wslot) add(v int64) {
	n := x.local.Add(v)
	if n > maxLocal || n < -maxLocal {
		x.local.Store(min(max(n, -maxLocal), maxLocal))
	}
}

// pair holds the current and previous window of one size. The window starting
// at x lives in slot[parity(x)], so rotating by one window reuses only the
// slot of the window that just became too old to matter.
type pair struct {
	latest atomic.Int64 // start of the newest window held, or noWindow
	slot   [2]nslot
}

// entry is one key's counters for up to two window sizes, followed in the
// same allocation by the key's bytes (see newEntry). Its size is part of the
// memory budget: 64 bytes and the key, rounded up to the allocator's size
// class (80 bytes for keys of 9 to 16 bytes), checked by a test; its counts
// are 32-bit until one leaves their range (see maxFast). The key sits in
// the entry's own memory, so a lookup reads its bytes from the entry it
// already reads, instead of from a separate allocation (a cache miss of its
// own in a large table). An entry holds no pointers: the allocation is
// never scanned by the garbage collector.
type entry struct {
	flags atomic.Uint32
	klen  uint32        // the key's length
	gate  atomic.Uint64 // the lock for rotation and sync bookkeeping, and judged counts pending (see gate.go); never taken by a plain increment
	w     [2]pair
}

// entryHeader is where an entry's key starts.
const entryHeader = unsafe.Sizeof(entry{})

// newEntry returns an entry for key with no window held. It copies key: the
// caller's string may share a large buffer (a header, a body). The entry and
// the key's bytes are one allocation of words (entry has no pointers, and
// its atomics need 8-byte alignment).
func newEntry(key string) *entry {
	mem := make([]uint64, (int(entryHeader)+len(key)+7)/8)
	e := (*entry)(unsafe.Pointer(unsafe.SliceData(mem)))
	e.klen = uint32(len(key))
	if len(key) > 0 {
		// Never written again, so the key stays immutable.
		copy(unsafe.Slice((*byte)(unsafe.Add(unsafe.Pointer(e), entryHeader)), len(key)), key)
	}
	for w := range e.w {
		e.w[w].latest.Store(noWindow)
		for i := range e.w[w].slot {
			e.w[w].slot[i].synced.Store(unknown32)
		}
	}
	return e
}

// key returns e's key, without copying it.
func (e *entry) key() string {
	if e.klen == 0 {
		return "" // (a pointer past the allocation's end is not valid)
	}
	return unsafe.String((*byte)(unsafe.Add(unsafe.Pointer(e), entryHeader)), int(e.klen))
}

func parity(start, size int64) int {
	return int((start / size) & 1)
}

// held reports whether the pair holds the window starting at x, and its slot
// index.
func (p *pair) held(x, size int64) (int, bool) {
	lat := p.latest.Load()
	if lat == noWindow || (x != lat && x != lat-size) {
		return 0, false
	}
	return parity(x, size), true
}

// slotOf returns the counts of e's slot par of size index w. The caller
// holds e's gate (a narrow entry may go wide otherwise).
func (t *Table) slotOf(e *entry, w, par int) cnt {
	if e.flags.Load()&flagWide != 0 {
		return cnt{x: &t.wideOf(e)[w][par]}
	}
	return cnt{n: &e.w[w].slot[par]}
}

// heldSlot is held with the slot's counts. The caller holds e's gate.
func (t *Table) heldSlot(e *entry, w int, x int64) (cnt, bool) {
	par, ok := e.w[w].held(x, t.sizeMS[w])
	if !ok {
		return cnt{}, false
	}
	return t.slotOf(e, w, par), true
}

// wideOf returns a wide entry's counts. A dead entry's were dropped with it:
// it gets a throwaway (nothing reads a dead entry's counts).
func (t *Table) wideOf(e *entry) *wide {
	if x, ok := t.wides.Load(e); ok {
		return x.(*wide)
	}
	return new(wide)
}

// widen moves e's counts to 64-bit slots. The caller holds e's gate, and e is
// live. Each narrow local count is swapped for poison: a lock-free addition
// either came before and moves with it, or sees the poison and counts again
// through the locked path, which finds the entry wide. The narrow synced
// counts stay as they were: a lock-free view that read a local from before
// the swap reads them as they were then.
func (t *Table) widen(e *entry) {
	if e.flags.Load()&flagWide != 0 {
		return
	}
	x := new(wide)
	for w := range e.w {
		for i := range e.w[w].slot {
			n := &e.w[w].slot[i]
			sy := int64(n.synced.Load())
			if sy == unknown32 {
				sy = unknown
			}
			x[w][i].synced.Store(sy)
		}
	}
	t.wides.Store(e, x)
	for w := range e.w {
		for i := range e.w[w].slot {
			x[w][i].local.Store(int64(e.w[w].slot[i].local.Swap(poison32)))
		}
	}
	e.flags.Or(flagWide)
	t.widened.Add(1)
}

// addLocal adds v to the local count of e's slot par of size index w,
// widening e when the narrow count cannot hold the result, and returns the
// slot's counts. The caller holds e's gate, and e is live.
func (t *Table) addLocal(e *entry, w, par int, v int64) cnt {
	c := t.slotOf(e, w, par)
	if c.n != nil {
		// (The check before adding spares lock-free views a large
		// addition's brief take-back; one racing past it still takes its
		// addition back after.)
		if fitsNarrow(v) && fitsNarrow(int64(c.n.local.Load())+v) {
			n := c.n.local.Add(int32(v))
			if fitsNarrow(int64(n)) {
				return c
			}
			c.n.local.Add(-int32(v))
		}
		t.widen(e)
		c = t.slotOf(e, w, par)
	}
	c.x.add(v)
	return c
}

// storeSynced stores total as the synced count of e's slot par of size
// index w, widening e when a narrow count cannot hold it. With ifUnknown, it
// stores only over an unknown count. The caller holds e's gate, and e is live.
func (t *Table) storeSynced(e *entry, w, par int, total int64, ifUnknown bool) {
	c := t.slotOf(e, w, par)
	if c.n != nil && (total < -narrowSynced || total > narrowSynced) {
		t.widen(e)
		c = t.slotOf(e, w, par)
	}
	if ifUnknown && c.synced() != unknown {
		return
	}
	if c.x != nil {
		c.x.synced.Store(total)
	} else {
		c.n.synced.Store(int32(total))
	}
}

// viewsAt returns the node's counts for the window of size index w starting
// at x, whose parity the caller knows (no division), and for the one
// before it: 0 for a window not held. One load of latest serves both. The
// caller holds e's gate.
func (t *Table) viewsAt(e *entry, w int, x int64, par int) (cur, prev int64) {
	p, size := &e.w[w], t.sizeMS[w]
	lat := p.latest.Load()
	if lat == noWindow {
		return 0, 0
	}
	if x == lat || x == lat-size {
		cur = t.slotOf(e, w, par).view()
	}
	if x-size == lat || x-size == lat-size {
		prev = t.slotOf(e, w, par^1).view()
	}
	return cur, prev
}

// rotate makes cur the newest window held, retiring what the reused slots
// held. The caller holds e's gate. Windows never move backwards.
func (e *entry) rotate(t *Table, w int, cur int64) {
	p := &e.w[w]
	size := t.sizeMS[w]
	lat := p.latest.Load()
	if cur <= lat {
		return
	}
	if lat != noWindow {
		for i := range p.slot {
			old := lat
			if parity(lat, size) != i {
				old = lat - size
			}
			next := cur
			if parity(cur, size) != i {
				next = cur - size
			}
			if old == next {
				continue
			}
			l := t.slotOf(e, w, i).reset()
			if ref := (counterRef{e: e, w: uint8(w), start: old}); l != 0 || t.unsettled(ref) {
				// Even with l == 0, hits in a push in flight may have been
				// taken back since: the record keeps the take-back for when
				// the push settles.
				t.retire(ref, l, 0)
			}
		}
	}
	p.latest.Store(cur)
	t.noteTime(cur)
}

// eachHeld calls fn for each window e holds (the newest and the one before it, of
// each size), with its slot index. The caller holds e's gate.
func (e *entry) eachHeld(t *Table, fn func(w int, start int64, par int)) {
	for w := range t.n {
		p := &e.w[w]
		lat := p.latest.Load()
		if lat == noWindow {
			continue
		}
		size := t.sizeMS[w]
		for _, x := range [2]int64{lat, lat - size} {
			fn(w, x, parity(x, size))
		}
	}
}

// retire is retireAll under e's lock.
func (e *entry) retire(t *Table) {
	t.lockEntry(e)
	e.retireAll(t)
	e.unlockEntry()
}

// retireAll moves every unconfirmed window of e to the retired records and
// marks e dead. The caller holds e's gate and is removing e from its shard (a
// lock-free reader may still hold it). Each narrow local count is swapped
// for poison, the newest window of a size before the one before it: an
// addition made without the lock either came first and is in the record, or
// sees poison and is counted again elsewhere (see addOpenFast). A wide
// entry's narrow counts are poison already, and its wide ones are dropped.
func (e *entry) retireAll(t *Table) {
	isWide := e.flags.Load()&flagWide != 0
	var x *wide
	if isWide {
		x = t.wideOf(e)
		t.wides.Delete(e)
	}
	e.eachHeld(t, func(w int, start int64, par int) {
		l := int64(e.w[w].slot[par].local.Swap(poison32))
		if isWide {
			l = x[w][par].local.Swap(0)
		}
		if ref := (counterRef{e: e, w: uint8(w), start: start}); l != 0 || t.unsettled(ref) {
			t.retire(ref, l, 0)
		}
	})
	e.flags.Or(flagDead)
}

// expired reports whether no window of e is current or previous at now.
func (e *entry) expired(t *Table, now int64) bool {
	for w := range t.n {
		lat := e.w[w].latest.Load()
		if lat != noWindow && lat >= windowStart(now, t.sizeMS[w])-t.sizeMS[w] {
			return false
		}
	}
	return true
}
