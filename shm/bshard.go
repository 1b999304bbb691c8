package shm

import "sync"

// bshard is one shard of a Buckets table: an open-addressing hash table of
// *bucket, probed linearly. Each slot holds the bucket's tag (see tagOf) next
// to its pointer, so a lookup reads one line of the slot array and then the
// bucket whose tag matches: no map header, no hashing again, no chain.
type bshard struct {
	mu    sync.RWMutex
	slots []bslot // len is a power of two, or 0
	n     int     // buckets held
	cap   int
	hand  int // the eviction walk's next slot (see Buckets.makeRoom)
	_     [64]byte
}

// bslot is a slot of a bshard: tag 0 is an empty slot.
type bslot struct {
	tag uint32
	bk  *bucket
}

// find returns the bucket of key (hash h), or nil. The caller holds s.mu.
func (s *bshard) find(h uint64, key string) *bucket {
	if len(s.slots) == 0 {
		return nil
	}
	m := uint32(len(s.slots) - 1)
	tag := tagOf(h)
	for i := tag & m; ; i = (i + 1) & m {
		switch sl := &s.slots[i]; sl.tag {
		case 0:
			return nil
		case tag:
			if sl.bk.keyIs(key) {
				return sl.bk
			}
		}
	}
}

// index returns the slot of bk, whose tag is tag, which s holds. The
// caller holds s.mu.
func (s *bshard) index(bk *bucket, tag uint32) uint32 {
	m := uint32(len(s.slots) - 1)
	i := tag & m
	for s.slots[i].bk != bk {
		i = (i + 1) & m
	}
	return i
}

// minBucketSlots is the size of a bucket shard's first index.
const minBucketSlots = 8

// add puts bk, whose tag is tag, in s, growing it to keep the load at most
// 7/8. The caller holds s.mu for writing.
func (s *bshard) add(bk *bucket, tag uint32) {
	if (s.n+1)*8 > len(s.slots)*7 {
		old := s.slots
		s.slots = make([]bslot, max(minBucketSlots, 2*len(old)))
		for _, sl := range old {
			if sl.tag != 0 {
				s.place(sl)
			}
		}
	}
	s.place(bslot{tag: tag, bk: bk})
	s.n++
}

// place puts sl in the first free slot of its probe chain.
func (s *bshard) place(sl bslot) {
	m := uint32(len(s.slots) - 1)
	i := sl.tag & m
	for s.slots[i].tag != 0 {
		i = (i + 1) & m
	}
	s.slots[i] = sl
}

// del takes bk, whose tag is tag, out of s with backward-shift deletion, so
// probe chains stay unbroken without tombstones. The caller holds s.mu for
// writing.
func (s *bshard) del(bk *bucket, tag uint32) {
	m := uint32(len(s.slots) - 1)
	i := s.index(bk, tag)
	s.slots[i] = bslot{}
	s.n--
	for j := (i + 1) & m; s.slots[j].tag != 0; j = (j + 1) & m {
		if movable(i, j, s.slots[j].tag&m) {
			s.slots[i], s.slots[j] = s.slots[j], bslot{}
			i = j
		}
	}
}

// movable reports whether the entry at slot j, whose ideal slot is k, may
// move into the hole at slot i: unless k lies cyclically in (i, j], where the
// hole does not break its chain.
func movable(i, j, k uint32) bool {
	return (j > i && (k <= i || k > j)) || (j < i && k <= i && k > j)
}

// each calls f for every bucket of s. The caller holds s.mu.
func (s *bshard) each(f func(*bucket)) {
	for _, sl := range s.slots {
		if sl.tag != 0 {
			f(sl.bk)
		}
	}
}
