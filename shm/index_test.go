package shm

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
)

// testHash builds a hash with the given home group and tag byte, and a slot
// hint that varies with them.
func testHash(home uint32, tag uint8) uint64 {
	hint := (home*0x9e3779b1 ^ uint32(tag)*0x85ebca6b) >> 16
	return uint64(tag)<<56 | uint64(home&0xffffff)<<32 | uint64(hint)<<16
}

// TestIndexPlacesAtHint checks that a key placed in a group with its hinted
// slot free takes that slot (find's first guess), and one whose hinted slot
// is taken goes to another and is still found.
func TestIndexPlacesAtHint(t *testing.T) {
	ix := &index{mask: 0, groups: make([]group, 1)}
	for i := range uint64(groupSlots) {
		h := hintHash(0, 5, i, 0)
		key := fmt.Sprint("hint", i)
		e := newEntry(key)
		ix.place(e, h)
		got, ok := slotOfKey(ix, key)
		require.True(t, ok)
		require.Equal(t, uint32(i), got, "key %d not at its hinted slot", i)
		require.Same(t, e, findIn(ix, key, h))
	}
	ix = &index{mask: 1, groups: make([]group, 2)}
	h := testHash(0, 5)
	for i := range groupSlots + 2 { // the same hint: one slot at it, the rest elsewhere
		key := fmt.Sprint("same", i)
		e := newEntry(key)
		ix.place(e, h)
		require.Same(t, e, findIn(ix, key, h))
	}
	for i := range groupSlots + 2 {
		key := fmt.Sprint("same", i)
		require.NotNil(t, findIn(ix, key, h), key)
	}
}

// slotOfKey returns the slot of ix holding key, scanning every slot.
func slotOfKey(ix *index, key string) (uint32, bool) {
	for i := range ix.slots() {
		if e := ix.slot(i).Load(); e != nil && e.key() == key {
			return i, true
		}
	}
	return 0, false
}

// checkOverflow recomputes every group's overflow count from the entries'
// homes and compares it with ix's (a saturated count may only be higher).
func checkOverflow(t *testing.T, ix *index, hashes map[string]uint64) {
	t.Helper()
	want := make([]int, len(ix.groups))
	for i := range ix.slots() {
		e := ix.slot(i).Load()
		if e == nil {
			continue
		}
		g := i / groupSlots
		for k := homeOf(hashes[e.key()]) & ix.mask; k != g; k = (k + 1) & ix.mask {
			want[k]++
		}
	}
	for g := range ix.groups {
		got := int(ix.groups[g].ctrl.Load() >> overShift)
		if got == overMax {
			require.GreaterOrEqual(t, got, min(want[g], overMax), "group %d", g)
			continue
		}
		require.Equal(t, want[g], got, "group %d", g)
	}
}

// TestIndexMatchesMap places and removes keys whose hashes crowd a few homes
// (long overflow chains, tag collisions), and resizes: every key held is
// found, no other is, and the overflow counts match the entries' places.
func TestIndexMatchesMap(t *testing.T) {
	for seed := range uint64(200) {
		rng := rand.New(rand.NewPCG(seed, 3))
		ix := &index{mask: 7, groups: make([]group, 8)}
		hashes := map[string]uint64{}
		held := map[string]*entry{}
		next := 0
		for step := range 300 {
			switch {
			case len(held) < int(ix.slots())*7/8 && rng.IntN(3) != 0:
				key := fmt.Sprintf("k%d", next)
				next++
				// Few homes and tags: chains and collisions.
				h := testHash(uint32(rng.IntN(3)), uint8(rng.IntN(3)+1)) ^ uint64(rng.IntN(4))<<30 // hints vary too
				e := newEntry(key)
				ix.place(e, h)
				hashes[key], held[key] = h, e
			case len(held) > 0:
				for key, e := range held {
					i, ok := slotOfKey(ix, key)
					require.True(t, ok)
					require.Same(t, e, ix.slot(i).Load())
					ix.remove(i, hashes[key])
					delete(held, key)
					break
				}
			}
			if step%97 == 96 { // grow, as resize does: every entry placed again
				old := ix
				ix = &index{mask: 2*old.mask + 1, groups: make([]group, 2*len(old.groups))}
				for i := range old.slots() {
					if e := old.slot(i).Load(); e != nil {
						ix.place(e, hashes[e.key()])
					}
				}
			}
			for key, e := range held {
				require.Same(t, e, findIn(ix, key, hashes[key]), "seed %d step %d: %s", seed, step, key)
			}
			for k := range 5 {
				key := fmt.Sprintf("absent%d", k)
				require.Nil(t, findIn(ix, key, testHash(uint32(k), uint8(k+1))))
			}
			checkOverflow(t, ix, hashes)
		}
	}
}

// findIn is shard.find on an index of its own.
func findIn(ix *index, key string, h uint64) *entry {
	var s shard
	s.ix.Store(ix)
	return s.find(key, h)
}

// TestIndexOverflowSaturates: past 255 entries placed beyond a group, its
// count stays at 255 once they leave (it no longer knows how many are
// left), and lookups of keys not held still end.
func TestIndexOverflowSaturates(t *testing.T) {
	ix := &index{mask: 63, groups: make([]group, 64)}
	hashes := map[string]uint64{}
	for i := range 300 {
		key := fmt.Sprintf("k%d", i)
		hashes[key] = testHash(0, uint8(i%255+1))
		ix.place(newEntry(key), hashes[key])
	}
	require.Equal(t, uint64(overMax), ix.groups[0].ctrl.Load()>>overShift)
	for key, h := range hashes {
		require.NotNil(t, findIn(ix, key, h))
	}
	for key, h := range hashes {
		i, ok := slotOfKey(ix, key)
		require.True(t, ok)
		ix.remove(i, h)
	}
	require.Equal(t, uint64(overMax), ix.groups[0].ctrl.Load()>>overShift, "a saturated count stays")
	require.Nil(t, findIn(ix, "absent", testHash(0, 9)))
	e := newEntry("again")
	ix.place(e, testHash(0, 9))
	require.Same(t, e, findIn(ix, "again", testHash(0, 9)))
}

// TestIndexLockFreeFinds: lock-free lookups racing with a writer that places,
// removes and regrows (publishing a new index, as resize does) always find
// the keys that stay, and never return another key's entry.
func TestIndexLockFreeFinds(t *testing.T) {
	var s shard
	s.ix.Store(&index{mask: 3, groups: make([]group, 4)})
	hashes := map[string]uint64{} // the writer's
	type kept struct {
		key string
		h   uint64
		e   *entry
	}
	var stay []kept // the readers'
	for i := range 8 {
		k := kept{key: fmt.Sprintf("stay%d", i), h: testHash(uint32(i%2), uint8(i%3+1))}
		k.e = newEntry(k.key)
		hashes[k.key] = k.h
		stay = append(stay, k)
		s.ix.Load().place(k.e, k.h)
	}
	var stop atomic.Bool
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			for !stop.Load() {
				for _, k := range stay {
					if got := s.find(k.key, k.h); got != k.e {
						t.Errorf("find(%s) = %v", k.key, got)
						return
					}
				}
				if got := s.find("churn0", testHash(0, 1)); got != nil && got.key() != "churn0" {
					t.Errorf("another key's entry: %s", got.key())
					return
				}
			}
		})
	}
	wg.Go(func() {
		defer stop.Store(true)
		rng := rand.New(rand.NewPCG(1, 2))
		var churn []string
		for step := range 20_000 {
			ix := s.ix.Load()
			count := len(stay) + len(churn)
			if (count+1)*8 > int(ix.slots())*7 {
				next := &index{mask: 2*ix.mask + 1, groups: make([]group, 2*len(ix.groups))}
				for i := range ix.slots() {
					if e := ix.slot(i).Load(); e != nil {
						next.place(e, hashes[e.key()])
					}
				}
				s.ix.Store(next)
				ix = next
			}
			if len(churn) > 0 && (rng.IntN(2) == 0 || len(churn) > 40) {
				key := churn[len(churn)-1]
				churn = churn[:len(churn)-1]
				i, _ := slotOfKey(ix, key)
				ix.remove(i, hashes[key])
				continue
			}
			key := fmt.Sprintf("churn%d", step%64)
			if _, ok := slotOfKey(ix, key); ok {
				continue
			}
			hashes[key] = testHash(uint32(rng.IntN(2)), uint8(rng.IntN(3)+1))
			ix.place(newEntry(key), hashes[key])
			churn = append(churn, key)
		}
	})
	wg.Wait()
}
