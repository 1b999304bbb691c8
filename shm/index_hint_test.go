package shm

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
)

// Attacks on find's first guess (a key's hinted slot) and on place's choice
// of it (an adversarial review's tests).

// hintHash builds a hash from a home group, a tag byte (0 and 1 both give tag
// 1), and a hint slot 0..6 (bits 16-31 chosen so slotHint gives it; jitter
// varies the bits within the same hint).
func hintHash(home uint32, tagByte uint8, hint uint64, jitter uint64) uint64 {
	lo := (hint<<16 + groupSlots - 1) / groupSlots // smallest bits giving hint
	hi := ((hint+1)<<16 - 1) / groupSlots          // largest
	hb := lo + jitter%(hi-lo+1)
	h := uint64(tagByte)<<56 | uint64(home)<<32 | hb<<16 | jitter&0xffff
	if slotHint(h) != hint {
		panic(fmt.Sprint("hintHash: hint ", slotHint(h), " want ", hint))
	}
	return h
}

// hintKey returns a key of the given length, unique by n (length 0: "").
func hintKey(n, length int) string {
	if length == 0 {
		return ""
	}
	s := fmt.Sprintf("%d:", n)
	if len(s) >= length {
		return strings.Repeat("x", length-1) + s[:1] // may collide: callers dedupe
	}
	return s + strings.Repeat("k", length-len(s))
}

// hintCheckIndex checks ix against held: every key held is found (the same
// entry) at the slot it was placed in, tags agree with entries, no key not
// held is found, and the overflow counts match.
func hintCheckIndex(t *testing.T, ix *index, held map[string]*entry, hashes map[string]uint64, at map[string]uint32, absent []string, ctx string) {
	t.Helper()
	for key, e := range held {
		require.Same(t, e, findIn(ix, key, hashes[key]), "%s: find(%q)", ctx, key)
		require.Same(t, e, ix.probe(key, hashes[key]), "%s: probe(%q)", ctx, key)
		if i, ok := at[key]; ok {
			require.Same(t, e, ix.slot(i).Load(), "%s: %q moved from slot %d", ctx, key, i)
		}
	}
	n := 0
	for i := range ix.slots() {
		gr := &ix.groups[i/groupSlots]
		tag := gr.ctrl.Load() >> (i % groupSlots * byteBits) & 0xff
		e := ix.slot(i).Load()
		if e == nil {
			require.Zero(t, tag, "%s: slot %d empty with tag", ctx, i)
			continue
		}
		n++
		require.Equal(t, entryTag(hashes[e.key()]), tag, "%s: slot %d tag", ctx, i)
		require.Same(t, held[e.key()], e, "%s: slot %d holds a key not held", ctx, i)
	}
	require.Equal(t, len(held), n, ctx)
	for _, key := range absent {
		if _, ok := held[key]; ok {
			continue
		}
		require.Nil(t, findIn(ix, key, hashes[key]), "%s: absent %q found", ctx, key)
	}
	checkOverflow(t, ix, hashes)
}

// TestIndexHintModel: place/remove/grow with hashes crowding few homes,
// tags (tag byte 0 aliases tag 1) and hints, keys of lengths 0..40 (the
// empty key included), checked against a map after each step, including
// where each key lands (its hinted slot whenever free in the group it
// lands in) and that no entry moves.
func TestIndexHintModel(t *testing.T) {
	for seed := range uint64(12) {
		rng := rand.New(rand.NewPCG(seed, 77))
		ix := &index{mask: 1, groups: make([]group, 2)}
		held := map[string]*entry{}
		hashes := map[string]uint64{}
		at := map[string]uint32{}
		var universe []string
		// Pre-assign every key a hash, so absent keys collide with held ones.
		for n := range 120 {
			key := hintKey(n, rng.IntN(41))
			if _, dup := hashes[key]; dup {
				continue
			}
			homes, tags := 1+int(seed%3), 1+int(seed/3%3)
			hashes[key] = hintHash(uint32(rng.IntN(homes))|uint32(rng.IntN(4))<<20, uint8(rng.IntN(tags)), uint64(rng.IntN(1+int(seed%7))), rng.Uint64())
			universe = append(universe, key)
		}
		for step := range 400 {
			key := universe[rng.IntN(len(universe))]
			ctx := fmt.Sprintf("seed %d step %d", seed, step)
			if e, ok := held[key]; ok && rng.IntN(2) == 0 {
				i := at[key]
				require.Same(t, e, ix.slot(i).Load(), ctx)
				ix.remove(i, hashes[key])
				delete(held, key)
				delete(at, key)
			} else if !ok {
				if (len(held)+1)*8 > int(ix.slots())*7 {
					old := ix
					ix = &index{mask: 2*old.mask + 1, groups: make([]group, 2*len(old.groups))}
					for i := range old.slots() {
						if e := old.slot(i).Load(); e != nil {
							ix.place(e, hashes[e.key()])
						}
					}
					for k := range held {
						at[k], _ = slotOfKey(ix, k)
					}
				}
				h := hashes[key]
				// Where it should land: the first group with a free slot, at
				// its hint when free there.
				g := homeOf(h) & ix.mask
				for free(ix.groups[g].ctrl.Load()) == 0 {
					g = (g + 1) & ix.mask
				}
				e := newEntry(key)
				ix.place(e, h)
				i, ok := slotOfKey(ix, key)
				require.True(t, ok, ctx)
				require.Equal(t, g, i/groupSlots, "%s: %q landed in the wrong group", ctx, key)
				hint := uint32(slotHint(h))
				if i%groupSlots != hint {
					// Only if its hint was taken by another.
					o := ix.groups[g].slots[hint].Load()
					require.NotNil(t, o, "%s: %q not at its free hint", ctx, key)
				}
				held[key], at[key] = e, i
			}
			hintCheckIndex(t, ix, held, hashes, at, universe, ctx)
		}
	}
}

// TestIndexHintTornStates builds the states a lock-free reader of key A can
// see between loading ctrl and loading A's hinted slot while writers remove
// and place: A's tag at the hint with the slot emptied (remove stores ctrl
// first), or holding B, placed since with the same tag and hint, or with
// another tag. find must return A's entry or nil, never B's.
func TestIndexHintTornStates(t *testing.T) {
	for _, keys := range [][2]string{{"A", "B"}, {"", "B"}, {"A", ""}, {"same-len-1", "same-len-2"}, {"k", strings.Repeat("k", 1000)}} {
		a, b := keys[0], keys[1]
		for hint := range uint64(groupSlots) {
			for _, tagByte := range []uint8{0, 1, 200} {
				ha := hintHash(0, tagByte, hint, 1)
				hb := hintHash(0, tagByte, hint, 2) // same home, tag, hint
				ea, eb := newEntry(a), newEntry(b)
				for _, aElsewhere := range []bool{false, true} {
					ix := &index{mask: 1, groups: make([]group, 2)}
					gr := &ix.groups[0]
					tag := entryTag(ha)
					other := (hint + 1) % groupSlots
					if aElsewhere { // A held in another slot, its hint taken by B
						gr.slots[other].Store(ea)
						gr.ctrl.Store(tag << (other * byteBits))
					}
					// Torn 1: tag at hint, slot empty.
					gr.ctrl.Store(gr.ctrl.Load() | tag<<(hint*byteBits))
					if got := findIn(ix, a, ha); got != nil {
						require.Same(t, ea, got)
					}
					// Torn 2: tag at hint, slot holds B (same tag and hint).
					gr.slots[hint].Store(eb)
					got := findIn(ix, a, ha)
					if aElsewhere {
						require.Same(t, ea, got, "A held elsewhere must be found")
					} else {
						require.Nil(t, got, "A not held: got %v", got)
					}
					require.Same(t, eb, findIn(ix, b, hb))
					// Torn 3: the hint's tag cleared (removal under way), B
					// still in the slot: B may be missed, A never confused.
					gr.ctrl.Store(gr.ctrl.Load() &^ (0xff << (hint * byteBits)))
					if got := findIn(ix, a, ha); got != nil {
						require.Same(t, ea, got)
					}
					if got := findIn(ix, b, hb); got != nil {
						require.Same(t, eb, got)
					}
				}
			}
		}
	}
}

// TestIndexHintLockFree: readers without the lock race a writer that keeps
// removing keys and placing others with the same home, tag and hint into
// the freed hinted slots, and grows the index. Keys that stay (some at their
// hint, some pushed off it) must always be found; any entry returned must
// be the key's own. Readers under the shard's read lock must find exactly
// the keys the writer holds.
func TestIndexHintLockFree(t *testing.T) {
	for round := range 2 {
		var s shard
		s.ix.Store(&index{mask: 1, groups: make([]group, 2)})
		hashes := map[string]uint64{}
		type kept struct {
			key string
			h   uint64
			e   *entry
		}
		var stay []kept
		// Churn keys first, so some stay keys find their hint taken.
		var churnKeys []string
		for i := range 48 {
			key := hintKey(1000+i, i%20)
			if _, dup := hashes[key]; dup {
				continue
			}
			hashes[key] = hintHash(uint32(i%2), uint8(i%3), uint64(i%3), uint64(i))
			churnKeys = append(churnKeys, key)
		}
		held := map[string]*entry{} // guarded by s.mu
		for _, key := range churnKeys[:6] {
			e := newEntry(key)
			s.ix.Load().place(e, hashes[key])
			held[key] = e
		}
		for i := range 6 {
			k := kept{key: fmt.Sprintf("stay%d", i), h: hintHash(uint32(i%2), uint8(i%3), uint64(i%3), uint64(100+i))}
			k.e = newEntry(k.key)
			hashes[k.key] = k.h
			stay = append(stay, k)
			s.ix.Load().place(k.e, k.h)
			held[k.key] = k.e
		}
		// Absent probes colliding on home, tag and hint.
		var absent []kept
		for i := range 6 {
			k := kept{key: fmt.Sprintf("never%d", i), h: hintHash(uint32(i%2), uint8(i%3), uint64(i%3), uint64(200+i))}
			absent = append(absent, k)
		}
		churnHash := map[string]uint64{}
		for _, k := range churnKeys {
			churnHash[k] = hashes[k]
		}
		var stop atomic.Bool
		var lookups atomic.Int64
		var wg sync.WaitGroup
		for r := range 3 {
			wg.Go(func() {
				n := int64(0)
				defer func() { lookups.Add(n) }()
				for !stop.Load() {
					lookups.Add(n)
					n = 0
					for _, k := range stay {
						n++
						if got := s.find(k.key, k.h); got != k.e {
							t.Errorf("round %d: lock-free find(%s) = %v", round, k.key, got)
							stop.Store(true)
							return
						}
					}
					for _, k := range absent {
						n++
						if got := s.find(k.key, k.h); got != nil {
							t.Errorf("round %d: absent %s found %q", round, k.key, got.key())
							stop.Store(true)
							return
						}
					}
					for _, key := range churnKeys {
						n++
						if got := s.find(key, churnHash[key]); got != nil && got.key() != key {
							t.Errorf("round %d: find(%q) returned %q's entry", round, key, got.key())
							stop.Store(true)
							return
						}
					}
					if r == 0 { // under the read lock: exact
						s.mu.RLock()
						for _, key := range churnKeys {
							n++
							got := s.find(key, churnHash[key])
							if got != held[key] {
								t.Errorf("round %d: locked find(%q) = %v, held %v", round, key, got, held[key])
								stop.Store(true)
							}
						}
						s.mu.RUnlock()
					}
				}
			})
		}
		wg.Go(func() {
			defer stop.Store(true)
			rng := rand.New(rand.NewPCG(uint64(round), 5))
			for step := 0; (step < 5_000 || lookups.Load() < 200_000) && step < 3_000_000 && !stop.Load(); step++ {
				s.mu.Lock()
				ix := s.ix.Load()
				key := churnKeys[rng.IntN(len(churnKeys))]
				if e, ok := held[key]; ok {
					i, found := slotOfKey(ix, key)
					if !found || ix.slot(i).Load() != e {
						t.Errorf("writer: %q lost", key)
					}
					ix.remove(i, hashes[key])
					delete(held, key)
				} else {
					if (len(held)+1)*8 > int(ix.slots())*7 || rng.IntN(500) == 0 {
						n := len(ix.groups)
						if (len(held)+1)*8 > int(ix.slots())*7 {
							n *= 2
						}
						next := &index{mask: uint32(n - 1), groups: make([]group, n)}
						for i := range ix.slots() {
							if e := ix.slot(i).Load(); e != nil {
								next.place(e, hashes[e.key()])
							}
						}
						s.ix.Store(next)
						ix = next
					}
					e := newEntry(key)
					ix.place(e, hashes[key])
					held[key] = e
				}
				s.mu.Unlock()
			}
		})
		wg.Wait()
		t.Logf("round %d: %d lookups", round, lookups.Load())
	}
}
