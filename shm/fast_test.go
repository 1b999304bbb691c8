package shm

import (
	"context"
	"fmt"
	"hash/maphash"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit/strategy"
	"github.com/ratesync/ratelimit/strategy/memory"
)

// dropKey takes key's entry out of tb, as an eviction does.
func dropKey(tb *Table, key string) {
	h := maphash.String(tb.seed, key)
	s := tb.shardOf(h)
	s.mu.Lock()
	defer s.mu.Unlock()
	ix := s.ix.Load()
	for i := range ix.slots() {
		if e := ix.slot(i).Load(); e != nil && e.key() == key {
			tb.dropEntry(s, i)
			return
		}
	}
	panic("key not held")
}

// onceBeforeFastAdd runs fn once, inside the next lock-free addition, just
// before it adds: the window in which a retirement makes it land on poison.
func onceBeforeFastAdd(t *testing.T, fn func()) {
	t.Helper()
	hookOnce(t, &testHookFast, fn)
}

// TestAddOpenLockFree: a held key in an open window is counted without the
// shard's lock; the view is the locked path's.
func TestAddOpenLockFree(t *testing.T) {
	tb := newTable(t, Options{Sizes: []time.Duration{time.Second, time.Minute}, Track: true})
	const now = 1_000_500
	vw, held, open := tb.AddOpen("k", 1, now, 3, false, true) // new key: locked path
	require.True(t, held && open)
	require.Equal(t, View{Start: 960_000, Cur: 3}, vw)
	fast, ok := tb.addOpenFast("k", 1, now, 2)
	require.True(t, ok, "held, window open: lock-free")
	require.Equal(t, View{Start: 960_000, Cur: 5}, fast)
	require.Equal(t, fast, tb.Peek("k", 1, now))
	_, ok = tb.addOpenFast("k", 1, now+60_000, 1)
	require.False(t, ok, "a new window needs the lock to rotate")
	_, ok = tb.addOpenFast("k", 0, now, 1)
	require.False(t, ok, "a size the entry never opened")
	_, ok = tb.addOpenFast("k", 1, now, maxFast+1)
	require.False(t, ok, "a value over maxFast")
	_, ok = tb.addOpenFast("other", 1, now, 1)
	require.False(t, ok, "a key not held")
	vw, _, _ = tb.AddOpen("k", 1, now-30_000, 1, false, true)
	require.Equal(t, View{Start: 960_000, Cur: 6}, vw, "a clock behind counts in the newest window")
	_, held, open = tb.AddOpen("cold", 1, now, 1, true, true)
	require.True(t, open)
	require.False(t, held, "ifHeld: a key not held is not created")
	hits, _ := tb.Pending()
	require.Equal(t, int64(6), hits)
}

// TestAddOpenRacingEviction: an entry evicted between the lock-free lookup
// and the addition turns the addition away (it lands on poison and is
// taken back), and the hit is counted once, in the key's new entry; the
// evicted entry's hits wait in a retired record.
func TestAddOpenRacingEviction(t *testing.T) {
	tb := newTable(t, Options{Sizes: []time.Duration{time.Minute}, Track: true})
	const now = 1_000_000
	tb.AddOpen("k", 0, now, 4, false, true)
	onceBeforeFastAdd(t, func() { dropKey(tb, "k") })
	vw, held, open := tb.AddOpen("k", 0, now, 1, false, true)
	require.True(t, held && open)
	require.Equal(t, int64(1), vw.Cur, "counted in the new entry")
	hits, retired := tb.Pending()
	require.Equal(t, int64(5), hits, "4 retired with the old entry, 1 in the new one")
	require.Equal(t, 1, retired)

	st := memory.New()
	var b Batch
	tb.collectAll(now, false, &b)
	settle(t, tb, st, &b, "b")
	got, err := st.GetWindow(context.Background(), "ns", strategy.CounterID{Key: "k", Size: time.Minute, Start: 960_000})
	require.NoError(t, err)
	require.Equal(t, int64(5), got)
}

// TestAddOpenRacingSeal: Seal between the lock-free lookup and the
// addition refuses the call, and counts nothing for it; a call that added
// before Seal is in the retired records Seal made.
func TestAddOpenRacingSeal(t *testing.T) {
	tb := newTable(t, Options{Sizes: []time.Duration{time.Minute}, Track: true})
	const now = 1_000_000
	tb.AddOpen("k", 0, now, 4, false, true)
	onceBeforeFastAdd(t, tb.Seal)
	_, _, open := tb.AddOpen("k", 0, now, 1, false, true)
	require.False(t, open, "sealed before it counted")
	hits, _ := tb.Pending()
	require.Equal(t, int64(4), hits)
	_, held, open := tb.AddOpen("k", 0, now, 1, false, true)
	require.False(t, open)
	require.True(t, held)
	_, ok := tb.addOpenFast("k", 0, now, 1)
	require.False(t, ok, "an entry created after Seal is not for lock-free additions")
	hits, _ = tb.Pending()
	require.Equal(t, int64(4), hits)
}

// TestLockFreeAddsExactUnderEvictionAndSeal races lock-free additions, and
// judged calls (at most 6 a window) on the locked path, with evictions (64
// entries for 200 keys), rotations, syncs and, midway, Seal; then checks
// that the store holds, per key, exactly the hits the calls reported
// counted.
func TestLockFreeAddsExactUnderEvictionAndSeal(t *testing.T) {
	for round := range 4 {
		tb := newTable(t, Options{Sizes: []time.Duration{10 * time.Millisecond}, MaxKeys: 64, Track: true,
			Walk: round%2 == 1, MaxRetired: 1 << 30})
		st := memory.New()
		var clock atomic.Int64
		const start = int64(1_000_000)
		clock.Store(start)
		const workers, hits, keys = 4, 4000, 200
		var counted [keys]atomic.Int64
		var calls atomic.Int64
		var wg sync.WaitGroup
		for g := range workers {
			wg.Go(func() {
				for i := range hits {
					if i == 3*hits/4 {
						// The last quarter comes after Seal (which the
						// first half's calls may race with): on a busy
						// machine every call could end before it.
						for !tb.sealed.Load() {
							runtime.Gosched()
						}
					}
					k := (i*7 + g) % keys
					now := clock.Load()
					if i%8 == 0 {
						now = clock.Add(1)
					}
					key := fmt.Sprintf("k%d", k)
					if g%2 == 0 {
						if _, _, open := tb.AddOpen(key, 0, now, 1, false, true); open {
							counted[k].Add(1)
						}
					} else if _, ok, _, open := tb.AddWindowsOpen(key, now, 1, [2]int64{1, 1}, false, false, true,
						func(v [2]View) bool { return v[0].Cur <= 6 }); ok && open {
						counted[k].Add(1)
					}
					calls.Add(1)
				}
			})
		}
		stop := syncUntilStopped(t, tb, st, clock.Load)
		for calls.Load() < workers*hits/2 {
			runtime.Gosched()
		}
		tb.Seal()
		wg.Wait()
		stop()
		var b Batch
		tb.collectAll(clock.Load(), false, &b)
		settle(t, tb, st, &b, "final")
		pending, retired := tb.Pending()
		require.Zero(t, pending)
		require.Zero(t, retired)
		total := int64(0)
		for k := range keys {
			got := int64(0)
			for x := start - start%10; x <= clock.Load(); x += 10 {
				n, err := st.GetWindow(context.Background(), "ns", strategy.CounterID{Key: fmt.Sprintf("k%d", k), Size: 10 * time.Millisecond, Start: x})
				require.NoError(t, err)
				got += n
			}
			require.Equal(t, counted[k].Load(), got, "round %d key k%d", round, k)
			total += got
		}
		require.Less(t, total, int64(workers*hits), "round %d: Seal refused the calls after it", round)
		require.Positive(t, total)
	}
}
