package shm

import (
	"encoding/binary"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"unsafe"
)

// noWindow marks a window pair that has not held any window yet.
const noWindow = math.MinInt64

// unknown marks a slot's synced count before this node learned the store's
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
)

// poison is what a window's local count becomes when its entry leaves the
// table (retireAll swaps it in). A lock-free addition (addOpenFast) that
// lands on it sees a result near poison: its hit was not in the swapped
// count, so it takes it back and counts it again through the locked path.
// Legitimate counts stay within ±(maxLocal + 2^53), far from it.
const poison = math.MinInt64 / 2

// poisoned reports whether a local count read or returned by an addition
// is a retired window's poison (with lock-free additions that landed on it
// since and are being taken back).
func poisoned(n int64) bool { return n < poison/2 }

// The flags' upper bits record which windows of the entry the current watch
// cycle pushed a diff for (see Table.Watches): their totals came back with
// the push, so a full read in the same cycle need not read them again. Bits
// markShift.. are one bit per window slot (size index × 2 + parity), bits
// cycleShift.. the cycle's number, modulo 2^20.
const (
	markShift  = 8
	cycleShift = 12
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

// slot is one window's counts on this node.
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
type slot struct {
	local  atomic.Int64
	synced atomic.Int64
}

// maxLocal bounds the magnitude of a window's count on one node: an addition
// that takes it further saturates at ±maxLocal instead of wrapping around
// (1,024 additions of 2^53 would otherwise wrap to a large negative count,
// and a limit would then admit everything). With a store that saturates its
// totals at ±strategy.MaxTotal, a node's view of a window never overflows.
const maxLocal = 1 << 60

// add adds v to the local count, saturating at ±maxLocal. The common case is
// one atomic add and a comparison.
func (s *slot) add(v int64) {
	if n := s.local.Add(v); n > maxLocal || n < -maxLocal {
		s.clamp()
	}
}

// addView is add followed by view, for a caller that holds the entry's
// lock (no retirement can swap poison in): the addition's result stands
// for view's first load of local.
func (s *slot) addView(v int64) int64 {
	n := s.local.Add(v)
	if n > maxLocal || n < -maxLocal {
		s.clamp()
		n = min(max(n, -maxLocal), maxLocal)
	}
	return s.viewFrom(n)
}

// clamp brings a local count that went past ±maxLocal back to the bound.
// It leaves a poisoned count alone: clamping it would revive a retired
// window.
func (s *slot) clamp() {
	for {
		n := s.local.Load()
		if poisoned(n) {
			return
		}
		c := min(max(n, -maxLocal), maxLocal)
		if c == n || s.local.CompareAndSwap(n, c) {
			return
		}
	}
}

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
func (s *slot) view() int64 {
	l := s.local.Load()
	if testHookView != nil {
		testHookView()
	}
	return s.viewFrom(l)
}

// viewFrom is view for a caller that loaded local (or had it returned by
// an addition) as l: it loads synced, then local again.
func (s *slot) viewFrom(l int64) int64 {
	return known(s.synced.Load()) + max(l, s.local.Load())
}

// pair holds the current and previous window of one size. The window starting
// at x lives in slot[parity(x)], so rotating by one window reuses only the
// slot of the window that just became too old to matter.
type pair struct {
	latest atomic.Int64 // start of the newest window held, or noWindow
	slot   [2]slot
}

// inlineKey is the longest key an entry holds in its own memory.
const inlineKey = 27

// entry is one key's counters for up to two window sizes. Its size is part of
// the memory budget: 128 bytes, two cache lines (the allocator's 128-byte
// class keeps it aligned to them), checked by a test. A key of up to inlineKey
// bytes is stored inside the entry, so a lookup reads the key's bytes from the
// cache line it already reads, instead of from a separate allocation (a cache
// miss of its own in a large table). A longer key is a separate copy that
// long points to, its length in the first bytes of buf: no string header
// is kept, which leaves 27 bytes inline, room for a policy rule's prefix
// before most client keys.
type entry struct {
	long  *byte // a longer key's bytes, or nil
	flags atomic.Uint32
	mu    sync.Mutex // rotation and sync bookkeeping; never taken by a plain increment
	klen  uint8      // the key's length, or longKey (as a bucket's)
	buf   [inlineKey]byte
	w     [2]pair
}

// newEntry returns an entry for key with no window held. It copies key: the
// caller's string may share a large buffer (a header, a body).
func newEntry(key string) *entry {
	e := &entry{}
	if len(key) <= inlineKey {
		// e.buf is never written again, so the key stays immutable.
		e.klen = uint8(copy(e.buf[:], key))
	} else {
		e.long = unsafe.StringData(strings.Clone(key))
		e.klen = longKey
		binary.LittleEndian.PutUint32(e.buf[:], uint32(len(key)))
	}
	for w := range e.w {
		e.w[w].latest.Store(noWindow)
		for i := range e.w[w].slot {
			e.w[w].slot[i].synced.Store(unknown)
		}
	}
	return e
}

// key returns e's key, without copying it.
func (e *entry) key() string {
	switch e.klen {
	case longKey:
		return unsafe.String(e.long, int(binary.LittleEndian.Uint32(e.buf[:])))
	case 0:
		return ""
	}
	return unsafe.String(&e.buf[0], int(e.klen))
}

func parity(start, size int64) int {
	return int((start / size) & 1)
}

// held reports whether the pair holds the window starting at x, and its slot.
func (p *pair) held(x, size int64) (*slot, bool) {
	lat := p.latest.Load()
	if lat == noWindow || (x != lat && x != lat-size) {
		return nil, false
	}
	return &p.slot[parity(x, size)], true
}

// view returns the node's count for the window starting at x, 0 if not held.
func (p *pair) view(x, size int64) int64 {
	if s, ok := p.held(x, size); ok {
		return s.view()
	}
	return 0
}

// viewsAt returns the node's counts for the window starting at x, whose
// parity the caller knows (no division), and for the one before it: 0 for
// a window not held. One load of latest serves both.
func (p *pair) viewsAt(x, size int64, par int) (cur, prev int64) {
	lat := p.latest.Load()
	if lat == noWindow {
		return 0, 0
	}
	if x == lat || x == lat-size {
		cur = p.slot[par].view()
	}
	if x-size == lat || x-size == lat-size {
		prev = p.slot[par^1].view()
	}
	return cur, prev
}

// rotate makes cur the newest window held, retiring what the reused slots
// held. The caller holds e.mu. Windows never move backwards.
func (e *entry) rotate(t *Table, w int, cur int64) {
	p := &e.w[w]
	size := t.sizeMS[w]
	lat := p.latest.Load()
	if cur <= lat {
		return
	}
	if lat != noWindow {
		for i := range p.slot {
			s := &p.slot[i]
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
			// A hit racing with this reset lands in the new window: counted,
			// never lost.
			l := s.local.Swap(0)
			s.synced.Store(unknown)
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
// each size), with its slot. The caller holds e.mu.
func (e *entry) eachHeld(t *Table, fn func(w int, start int64, s *slot)) {
	for w := range t.n {
		p := &e.w[w]
		lat := p.latest.Load()
		if lat == noWindow {
			continue
		}
		size := t.sizeMS[w]
		for _, x := range [2]int64{lat, lat - size} {
			fn(w, x, &p.slot[parity(x, size)])
		}
	}
}

// retire is retireAll under e's lock.
func (e *entry) retire(t *Table) {
	e.mu.Lock()
	e.retireAll(t)
	e.mu.Unlock()
}

// retireAll moves every unconfirmed window of e to the retired records and
// marks e dead. The caller holds e.mu and is removing e from its shard (a
// lock-free reader may still hold it). Each local count is swapped for
// poison, the newest window of a size before the one before it: an
// addition made without the lock either came first and is in the record, or
// sees poison and is counted again elsewhere (see addOpenFast).
func (e *entry) retireAll(t *Table) {
	e.eachHeld(t, func(w int, x int64, s *slot) {
		l := s.local.Swap(poison)
		if ref := (counterRef{e: e, w: uint8(w), start: x}); l != 0 || t.unsettled(ref) {
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
