package shm

import (
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestTakeBackFromTheWindowCounted: a rejected call's count is taken back
// from the window it went to, even when a call at a later instant opened
// the next window between the count and the judgement (the judge below).
// Taken back from the newest window instead, the rejected hit stayed in
// the old window and the new one started at -1, so a fixed limit of 2
// admitted 3 there (found by review). A judged call now holds the entry's
// lock from its count to its take-back, so the racing call waits for it
// (see interleave) and the outcome checked is the serial one; the general
// path's TakeBack, which comes after the lock was released, relies on the
// take-back by start. (A judged count without the gate counts nothing
// before it admits: see TestJudgedPendingRotatedDuringJudge.)
func TestTakeBackFromTheWindowCounted(t *testing.T) {
	testHeldOnly = true
	defer func() { testHeldOnly = false }()
	for _, rotateBy := range []int64{1, 2} {
		t.Run(fmt.Sprintf("rotated-by-%d", rotateBy), func(t *testing.T) {
			tb := newTable(t, Options{Sizes: []time.Duration{time.Second, time.Minute}, Track: true})
			const limit = 2
			const x = 1_000_000 // a second window [x, x+1000)
			const now = x + 999
			later := x + rotateBy*1000
			rotate := false
			var wg sync.WaitGroup
			judge := func(v [2]View) bool {
				if rotate {
					rotate = false
					interleave(tb, "k", func() {
						tb.AddWindowsOpen("k", later, 3, [2]int64{0, 0}, true, false, true, nil)
					}, &wg)
				}
				return v[0].Cur <= limit
			}
			allow := func(at int64) bool {
				_, ok, _, _ := tb.AddWindowsOpen("k", at, 3, [2]int64{1, 1}, false, false, true, judge)
				return ok
			}
			require.True(t, allow(now))
			require.True(t, allow(now))
			rotate = true
			require.False(t, allow(now), "the third call in the second")
			wg.Wait()
			hits, _ := tb.Pending()
			require.Equal(t, int64(4), hits, "2 hits in each window size: the rejected one taken back")
			vw := tb.Peek("k", 0, later)
			require.Equal(t, int64(0), vw.Cur, "the new window starts at 0")
			if rotateBy == 1 {
				require.Equal(t, int64(2), vw.Prev, "the second that ended holds the 2 admitted")
			} else {
				// Rotated out since the count: the record holds the 2.
				tb.retMu.Lock()
				r := tb.retired[counterRef{e: tb.lookupEntry("k"), w: 0, start: x}]
				tb.retMu.Unlock()
				require.NotNil(t, r)
				require.Equal(t, int64(2), r.local-r.acked)
			}
			admitted := 0
			for range 5 {
				if allow(later) {
					admitted++
				}
			}
			require.Equal(t, limit, admitted, "the new second admits its limit, no more")
		})
	}
}

// TestJudgedPendingRotatedDuringJudge: a judged count without the entry's
// gate (addWindowsFast) has counted nothing while it judges. A call at a
// later instant that opens the next window in the meantime moves the gate,
// so the first call's views are stale: it is judged again, in the newest
// window (as any call after the rotation is), and admitted there. Each size
// then holds the three admitted hits once, and the new second admits one
// more, to its limit.
func TestJudgedPendingRotatedDuringJudge(t *testing.T) {
	tb := newTable(t, Options{Sizes: []time.Duration{time.Second, time.Minute}, Track: true})
	const limit = 2
	const x = 1_000_000
	const now, later = x + 999, x + 1000
	rotate, judged := false, 0
	judge := func(v [2]View) bool {
		judged++
		if rotate {
			rotate = false
			tb.AddWindowsOpen("k", later, 3, [2]int64{0, 0}, true, false, true, nil)
		}
		return v[0].Cur <= limit
	}
	allow := func(at int64) bool {
		_, ok, _, _ := tb.AddWindowsOpen("k", at, 3, [2]int64{1, 1}, false, false, true, judge)
		return ok
	}
	require.True(t, allow(now))
	require.True(t, allow(now))
	rotate, judged = true, 0
	require.True(t, allow(now), "judged again in the new second")
	require.Equal(t, 2, judged)
	hits, _ := tb.Pending()
	require.Equal(t, int64(6), hits, "3 hits in each window size")
	vw := tb.Peek("k", 0, later)
	require.Equal(t, [2]int64{1, 2}, [2]int64{vw.Cur, vw.Prev})
	require.True(t, allow(later))
	require.False(t, allow(later), "the new second admits its limit, no more")
}

// lookupEntry returns key's entry (tests only).
func (t *Table) lookupEntry(key string) *entry {
	s, e := t.lookup(key)
	if e != nil {
		s.mu.RUnlock()
	}
	return e
}

// TestBoundaryStressAdmitsTheLimitPerWindow: no hooks. Calls with two
// limits (one of them 4 a second) and with one race across a second
// boundary on one key: most at the last millisecond of a second whose
// limit is spent, one goroutine at the first millisecond of the next.
// Each admitted call counts in the window its view started at, and no
// window admits more than the limit (found by review: about 1 round in
// 200 admitted 5). The late goroutine is one window ahead, or two: then
// it rotates the key past the reused slot of the full second (found by a
// later review: 6 rounds in 1,000 admitted 5, see rotate_race_test.go).
func TestBoundaryStressAdmitsTheLimitPerWindow(t *testing.T) {
	for _, c := range []struct {
		mask  uint8
		ahead int64
	}{{3, 1000}, {1, 1000}, {3, 2000}, {1, 2000}} {
		mask := c.mask
		t.Run(fmt.Sprintf("mask%d/ahead%d", mask, c.ahead), func(t *testing.T) {
			const limit, rounds = 4, 1000
			over := 0
			for r := range rounds {
				tb := newTable(t, Options{Sizes: []time.Duration{time.Second, time.Minute}, Track: true})
				x := int64(1_000_000 + r*1000)
				judge := func(v [2]View) bool { return v[0].Cur <= limit }
				for range limit {
					tb.AddWindowsOpen("k", x+999, mask, [2]int64{1, 1}, false, false, true, judge)
				}
				var mu sync.Mutex
				perStart := map[int64]int{x: limit}
				var wg sync.WaitGroup
				for g := range 4 {
					wg.Go(func() {
						for i := range 200 {
							at := x + 999
							if g == 0 && i >= 20 {
								at = x + c.ahead
							}
							if out, ok, _, _ := tb.AddWindowsOpen("k", at, mask, [2]int64{1, 1}, false, false, true, judge); ok {
								mu.Lock()
								perStart[out[0].Start]++
								mu.Unlock()
							}
							if i%16 == 0 {
								runtime.Gosched()
							}
						}
					})
				}
				wg.Wait()
				for s, n := range perStart {
					if n > limit {
						over++
						t.Logf("round %d: window %d admitted %d (limit %d)", r, s, n, limit)
					}
				}
			}
			assert.Zero(t, over, "windows that admitted more than the limit")
		})
	}
}

// TestTakeBackOnEvictedKeyLeavesItCold: a take-back whose key was evicted
// since the count makes the entry again, to hold the correction. The key's
// totals were never read into it, so a namespace that reads cold keys must
// still find it cold: otherwise the next decision skips the read and judges
// this node's correction alone, as if the key were new to the cluster.
// LoadCold then warms it, with the correction on top of the store's total.
func TestTakeBackOnEvictedKeyLeavesItCold(t *testing.T) {
	const x = 1_000_000
	check := func(t *testing.T, tb *Table, takeBack func()) {
		takeBack()
		require.False(t, tb.Holds("k"), "a take-back makes the key held")
		_, held := tb.AddWindowsIfHeld("k", x+500, 1, [2]int64{1, 0}, false)
		require.False(t, held)
		_, held, _ = tb.AddOpen("k", 0, x+500, 1, true, false)
		require.False(t, held, "the lock-free path finds it held")
		tb.LoadCold("k", x+500, 1, [2][2]int64{{5, 0}})
		require.True(t, tb.Holds("k"))
		v, held := tb.AddWindowsIfHeld("k", x+500, 1, [2]int64{}, true)
		require.True(t, held)
		require.Equal(t, int64(4), v[0].Cur, "the store's 5, less the hit taken back")
	}
	t.Run("TakeBack", func(t *testing.T) {
		tb := newTable(t, Options{Sizes: []time.Duration{time.Second}, Track: true})
		check(t, tb, func() { tb.TakeBack("k", x+500, 1, [2]int64{x, 0}, [2]int64{1, 0}) })
	})
	t.Run("TakeBackPending", func(t *testing.T) {
		tb := newTable(t, Options{Sizes: []time.Duration{time.Second}, Track: true, WriteThrough: true})
		var b Batch
		check(t, tb, func() { tb.TakeBackPending("k", 0, x+500, x, 1, &b) })
		tb.Release(&b)
	})
}
