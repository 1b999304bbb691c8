package shm

import (
	"fmt"
	"hash/maphash"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// waitBlocked waits until n goroutines wait for a lock: parked on a mutex
// (their stacks show the runtime's semaphore acquire for one) or spinning
// for an entry's gate (lockEntry).
func waitBlocked(t *testing.T, n int) {
	t.Helper()
	buf := make([]byte, 1<<20)
	for deadline := time.Now().Add(30 * time.Second); ; runtime.Gosched() {
		k := runtime.Stack(buf, true)
		waiting := 0
		for _, g := range strings.Split(string(buf[:k]), "\n\n") {
			if strings.Contains(g, "SemacquireMutex") || strings.Contains(g, "SemacquireRWMutex") || strings.Contains(g, "shm.(*Table).lockEntry(") {
				waiting++
			}
		}
		if waiting >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("fewer than %d goroutines wait for a lock:\n%s", n, buf[:k])
		}
	}
}

// TestJudgedFastExpiredDropAfterJudgedCount: dropExpired (a shard growing)
// decides an entry is expired without the entry's lock, then retires it
// under the lock. A judged call on the key, which now runs under the
// entry's lock alone (addWindowsFast), can rotate the entry to now's
// window and count in it between the two: the entry then leaves the table
// with the hit, as "expired", and the next call on the key starts from 0
// (found by review). A judged call that would rotate the entry now takes
// the locked path, whose shard read lock the drop's write lock excludes,
// so the check and the drop are one step again.
func TestJudgedFastExpiredDropAfterJudgedCount(t *testing.T) {
	for _, c := range []struct {
		name            string
		maxKeys, filler int
	}{
		// MaxKeys 63: one shard; its first index (14 slots) holds 12
		// entries, the 13th grows it and dropExpired drops the expired
		// ones first.
		{"dropExpired", 63, 11},
		// MaxKeys 4: one shard at its cap; makeRoom's hand takes the
		// expired entry (the fillers are referenced, so spared a lap).
		{"makeRoom", 4, 3},
	} {
		for _, track := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/track=%v", c.name, track), func(t *testing.T) {
				tb := newTable(t, Options{Sizes: []time.Duration{time.Second}, MaxKeys: c.maxKeys, Track: track})
				const t0 = int64(1_000_000)
				const now = t0 + 5_000 + 500
				tb.AddWindows("a", t0+500, 1, [2]int64{1, 0}, false) // an old window: expired at now
				for i := range c.filler {
					tb.AddWindows(fmt.Sprintf("f%d", i), now, 1, [2]int64{1, 0}, false)
					tb.AddWindows(fmt.Sprintf("f%d", i), now, 1, [2]int64{0, 0}, true) // referenced
				}
				require.Equal(t, c.filler+1, tb.Len())
				const limit = 1
				judge := func(v [2]View) bool { return v[0].Cur <= limit }
				ea := tb.lookupEntry("a")
				tb.lockEntry(ea) // another call on "a" (or a Collect) holds its lock
				var wg sync.WaitGroup
				var ok1 bool
				wg.Go(func() { // the judged call: finds "a" lock-free, waits for its lock
					_, ok1, _, _ = tb.AddWindowsOpen("a", now, 1, [2]int64{1, 0}, false, false, true, judge)
				})
				waitBlocked(t, 1)
				wg.Go(func() { // a new key grows the shard: dropExpired finds "a" expired
					tb.AddWindows("b", now, 1, [2]int64{1, 0}, false)
				})
				waitBlocked(t, 2)
				ea.unlockEntry()
				wg.Wait()
				require.True(t, ok1, "the first call in the window is admitted")
				// An eviction (not expiry) may take "a" legitimately when the
				// hand's second lap reaches it first: that is not this race.
				ev := tb.Evictions()
				_, ok2, _, _ := tb.AddWindowsOpen("a", now, 1, [2]int64{1, 0}, false, false, true, judge)
				if ev == 0 {
					require.False(t, ok2, "a fixed limit of %d admitted 2 in one window: the entry holding the first hit was dropped as expired", limit)
				}
			})
		}
	}
}

// TestJudgedFastUnreadPublishedBeforeFlag: a take-back on an evicted key
// makes its entry again and marks it unread, but the mark comes after the
// entry is placed in the index, where the lock-free finders (findFast,
// addWindowsFast) see it at once: in between they take the key as held.
// Only take-backs make "k" here, so a key found held is the bug.
func TestJudgedFastUnreadPublishedBeforeFlag(t *testing.T) {
	finders := map[string]func(tb *Table, now int64) bool{
		"addWindowsFast": func(tb *Table, now int64) bool {
			_, _, done := tb.addWindowsFast("k", now, 1, [2]int64{}, true, false, nil)
			return done
		},
		"findFast": func(tb *Table, now int64) bool {
			_, _, _, _, ok := tb.findFast("k", 0, now)
			return ok
		},
	}
	for name, find := range finders {
		t.Run(name, func(t *testing.T) { unreadRace(t, find) })
	}
}

func unreadRace(t *testing.T, find func(tb *Table, now int64) bool) {
	tb := newTable(t, Options{Sizes: []time.Duration{time.Second}, MaxKeys: 63, Track: true})
	const x = int64(1_000_000)
	h := maphash.String(tb.seed, "k")
	s := tb.shardOf(h)
	var stop, found atomic.Bool
	var wg sync.WaitGroup
	wg.Go(func() {
		for !stop.Load() {
			if find(tb, x+500) {
				found.Store(true)
				return
			}
		}
	})
	deadline := time.Now().Add(time.Second)
	iters := 0
	for !found.Load() && time.Now().Before(deadline) {
		iters++
		tb.TakeBack("k", x+500, 1, [2]int64{x, 0}, [2]int64{1, 0})
		s.mu.Lock() // evict "k" again
		if ix := s.ix.Load(); ix != nil {
			for i := range ix.slots() {
				if e := ix.slot(i).Load(); e != nil && e.key() == "k" {
					tb.dropEntry(s, i)
					break
				}
			}
		}
		s.mu.Unlock()
	}
	stop.Store(true)
	wg.Wait()
	require.False(t, found.Load(), "the lock-free path found an unread entry held (after %d take-backs)", iters)
}
