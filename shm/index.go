package shm

import (
	"math/bits"
	"sync/atomic"
)

// groupSlots is the number of entries a group of a shard's index holds.
const groupSlots = 7

// minGroups is the size of a shard's first index.
const minGroups = 2

// A key's hash h is split four ways: its low bits pick the shard (see
// shardOf), bits 16 to 31 its favoured slot in a group (slotHint), bits 32
// and up its home group in the shard's index (homeOf), and its top byte its
// tag (entryTag), which a probe compares before it reads an entry's key.

// slotHint returns the slot of its home group a key of hash h takes when
// it is free. A lookup loads that slot's entry without waiting for the
// group's tags: the address depends on the hash only, so the processor
// loads the entry while it checks the tag. (Found by the tags' match
// first, the entry's address waited on it: that wait was 3 ns of a hot-key
// Increment's 41, measured; the hint won back 1.4 to 3 ns.)
func slotHint(h uint64) uint64 { return (h >> 16 & 0xffff) * groupSlots >> 16 }

// homeOf returns the group a key of hash h is placed from.
func homeOf(h uint64) uint32 { return uint32(h >> 32) }

// entryTag returns a key's 8-bit tag, never 0 (0 marks an empty slot).
func entryTag(h uint64) uint64 {
	if tag := h >> 56; tag != 0 {
		return tag
	}
	return 1
}

// group is one cache line of a shard's index: the tags of its slots and the
// entries they hold. ctrl's bytes 0 to 6 are the tags of slots 0 to 6 (0:
// empty); byte 7 counts the entries placed past this group from a home at
// or before it, because it was full (saturating at 255, which then stays): a
// probe goes on to the next group only while it is not 0.
type group struct {
	ctrl  atomic.Uint64
	slots [groupSlots]atomic.Pointer[entry]
}

const (
	lsbs       = 0x0001010101010101 // the low bit of each slot's byte
	msbs       = 0x0080808080808080 // the high bit of each slot's byte
	tagBytes   = 0x00ffffffffffffff
	overShift  = 56
	overMax    = 0xff
	overOne    = uint64(1) << overShift
	byteBits   = 8
	slotsShift = 3 // bits.TrailingZeros64 of a match / 8 is its slot
)

// matches returns a bit set in byte i (i < 7) for each slot whose tag may be
// tag (and, after a match, maybe more: the caller compares keys).
func matches(ctrl, tag uint64) uint64 {
	x := (ctrl ^ tag*lsbs) & tagBytes
	return (x - lsbs) & ^x & msbs
}

// free returns a bit set in the byte of the first empty slot of ctrl, or 0.
func free(ctrl uint64) uint64 {
	x := ctrl & tagBytes
	m := (x - lsbs) & ^x & msbs
	return m & -m
}

// index is a shard's hash index: groups, a power of two of them, probed
// group by group from a key's home. Entries never move within an index (a
// removal leaves its slot empty; growing builds a new index), so a
// lock-free reader that loaded a tag finds its entry, or nil.
type index struct {
	mask   uint32 // len(groups) - 1
	groups []group
}

// slots returns the number of slots of ix.
func (ix *index) slots() uint32 { return uint32(len(ix.groups)) * groupSlots }

// slot returns slot i of ix (group i / 7, place i % 7).
func (ix *index) slot(i uint32) *atomic.Pointer[entry] {
	return &ix.groups[i/groupSlots].slots[i%groupSlots]
}

// size returns the number of slots of s's index.
func (s *shard) size() int {
	if ix := s.ix.Load(); ix != nil {
		return int(ix.slots())
	}
	return 0
}

// groups returns the number of groups of s's index.
func (s *shard) groups() int {
	if ix := s.ix.Load(); ix != nil {
		return len(ix.groups)
	}
	return 0
}

// each calls fn for every entry s holds. The caller holds s.mu.
func (s *shard) each(fn func(e *entry)) {
	ix := s.ix.Load()
	if ix == nil {
		return
	}
	for i := range ix.groups {
		for j := range ix.groups[i].slots {
			if e := ix.groups[i].slots[j].Load(); e != nil {
				fn(e)
			}
		}
	}
}

// find returns the entry for key, of hash h, or nil. The caller holds s.mu,
// or reads without it (addOpenFast): then a lookup racing with a removal or
// with growth may miss the key, never return another key's entry. A lookup
// reads one cache line per group it probes, and an entry only when its tag
// matches.
func (s *shard) find(key string, h uint64) *entry {
	ix := s.ix.Load()
	if ix == nil {
		return nil
	}
	// The common case first: the key's entry is in its favoured slot.
	gr := &ix.groups[homeOf(h)&ix.mask]
	i := slotHint(h)
	if gr.ctrl.Load()>>(i*byteBits)&0xff == entryTag(h) {
		if e := gr.slots[i].Load(); e != nil && e.key() == key {
			return e
		}
	}
	return ix.probe(key, h)
}

// probe is find's whole search: group by group from the key's home.
func (ix *index) probe(key string, h uint64) *entry {
	tag := entryTag(h)
	g := homeOf(h) & ix.mask
	// The bound keeps a lock-free reader racing with writers from going
	// round forever.
	for range len(ix.groups) {
		gr := &ix.groups[g]
		ctrl := gr.ctrl.Load()
		for m := matches(ctrl, tag); m != 0; m &= m - 1 {
			i := bits.TrailingZeros64(m) >> slotsShift
			if e := gr.slots[i].Load(); e != nil && e.key() == key {
				return e
			}
		}
		if ctrl>>overShift == 0 {
			return nil
		}
		g = (g + 1) & ix.mask
	}
	return nil
}

// place puts e, of hash h, in the first empty slot from its home group on,
// counting it in the overflow byte of each full group it passes. The entry
// is stored before its tag: a lock-free reader that sees the tag finds the
// entry. The caller holds s.mu for writing, and the index has an empty slot.
func (ix *index) place(e *entry, h uint64) {
	tag := entryTag(h)
	for g := homeOf(h) & ix.mask; ; g = (g + 1) & ix.mask {
		gr := &ix.groups[g]
		ctrl := gr.ctrl.Load()
		if f := free(ctrl); f != 0 {
			i := bits.TrailingZeros64(f) >> slotsShift
			if hint := slotHint(h); ctrl>>(hint*byteBits)&0xff == 0 {
				i = int(hint) // (see find)
			}
			gr.slots[i].Store(e)
			gr.ctrl.Store(ctrl | tag<<(i*byteBits))
			return
		}
		if ctrl>>overShift != overMax {
			gr.ctrl.Store(ctrl + overOne)
		}
	}
}

// remove empties slot i, whose entry has hash h, and takes the entry out of
// the overflow counts of the groups between its home and its own. The caller
// holds s.mu for writing.
func (ix *index) remove(i uint32, h uint64) {
	g := i / groupSlots
	gr := &ix.groups[g]
	gr.ctrl.Store(gr.ctrl.Load() &^ (uint64(0xff) << (i % groupSlots * byteBits)))
	gr.slots[i%groupSlots].Store(nil)
	for k := homeOf(h) & ix.mask; k != g; k = (k + 1) & ix.mask {
		o := &ix.groups[k].ctrl
		if c := o.Load(); c>>overShift != overMax { // a saturated count stays
			o.Store(c - overOne)
		}
	}
}

// resize replaces s's index by one of n groups holding the same entries,
// hashing their keys again (an index keeps only 8 bits of each hash). It
// fills the new index before publishing it, so a lock-free reader sees
// either index whole. The caller holds s.mu for writing.
func (t *Table) resize(s *shard, n int) {
	ix := &index{mask: uint32(n - 1), groups: make([]group, n)}
	s.each(func(e *entry) { ix.place(e, t.hash(e.key())) })
	s.ix.Store(ix)
}
