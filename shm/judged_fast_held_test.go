package shm

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit/strategy"
	"github.com/ratesync/ratelimit/strategy/memory"
)

// TestJudgedFastChurnSealCountsOnce: workers make judged calls (addWindowsFast
// first; a third of them rejected and taken back under the entry's lock,
// some peeks) and lock-free additions (AddOpen) on 12 keys of a table that
// holds 4, with a moving clock (rotations), eviction and expiry churn,
// take-backs of evicted keys (unread entries), a sync loop, and Seal in
// the middle of it. Model: every call that reports open and admitted
// counts its hit once, a call started after Seal returned reports not
// open, and the store ends with exactly the counted hits.
func TestJudgedFastChurnSealCountsOnce(t *testing.T) {
	for _, o := range []Options{{Track: true}, {Track: true, Walk: true}, {Track: true, WriteThrough: true}} {
		t.Run(fmt.Sprintf("walk=%v,wt=%v", o.Walk, o.WriteThrough), func(t *testing.T) {
			o.Sizes, o.MaxKeys, o.MaxRetired = []time.Duration{100 * time.Millisecond, time.Second}, 4, 1<<20
			tb := newTable(t, o)
			st := memory.New()
			const base = int64(1_000_000)
			var clock atomic.Int64
			now := func() int64 { return base + clock.Load()/8 }
			var counted [2]atomic.Int64
			var afterSeal atomic.Int64
			var sealDone atomic.Bool
			var wg sync.WaitGroup
			for wk := range 2 {
				wg.Go(func() {
					for i := 0; i < 40000; i++ {
						late := sealDone.Load()
						n := clock.Add(1)
						at := base + n/8
						key := fmt.Sprintf("k%d", (i*7+wk)%12)
						var open, ok bool
						switch i % 5 {
						case 0: // lock-free addition
							_, _, open = tb.AddOpen(key, i%2, at, 1, false, true)
							if open {
								counted[i%2].Add(1)
							}
							ok = open
						case 4: // the general path: count, then take back (the key may be evicted between)
							var out [2]View
							out, _, _, open = tb.AddWindowsOpen(key, at, 3, [2]int64{1, 1}, false, false, true, nil)
							if open {
								tb.TakeBack(key, at, 3, [2]int64{out[0].Start, out[1].Start}, [2]int64{1, 1})
							}
						case 1: // judged peek
							_, _, _, open = tb.AddWindowsOpen(key, at, 3, [2]int64{1, 1}, true, false, true, func([2]View) bool { return true })
						default: // judged count, every third rejected
							rej := i%3 == 0
							_, ok, _, open = tb.AddWindowsOpen(key, at, 3, [2]int64{1, 1}, false, false, true, func([2]View) bool { return !rej })
							if open && ok {
								counted[0].Add(1) // one hit in each of the two sizes
								counted[1].Add(1)
							}
						}
						if late && open {
							afterSeal.Add(1)
						}
						_ = ok
					}
				})
			}
			stop := syncUntilStopped(t, tb, st, now)
			for clock.Load() < 30000 {
				runtime.Gosched()
			}
			tb.Seal()
			sealDone.Store(true)
			wg.Wait()
			stop()
			var b Batch
			tb.collectAll(now(), false, &b)
			settle(t, tb, st, &b, "final")
			require.Zero(t, afterSeal.Load(), "calls started after Seal returned counted")
			hits, _ := tb.Pending()
			require.Zero(t, hits, "pending after the final push")
			for w, sz := range []time.Duration{100 * time.Millisecond, time.Second} {
				var sum int64
				for k := range 12 {
					for x := base - 10*sz.Milliseconds(); x <= now()+10*sz.Milliseconds(); x += sz.Milliseconds() {
						n, err := st.GetWindow(context.Background(), "ns", strategy.CounterID{Key: fmt.Sprintf("k%d", k), Size: sz, Start: x})
						require.NoError(t, err)
						sum += n
					}
				}
				require.Equal(t, counted[w].Load(), sum, "size %v: the store holds the counted hits", sz)
			}
			t.Logf("counted %d/%d, evictions %d", counted[0].Load(), counted[1].Load(), tb.Evictions())
		})
	}
}

// TestJudgedFastSealWaitsForJudgedCall: Seal, started while a judged call
// on a held key is inside its judge under the entry's gate (judgedHeld,
// without the shard's lock), waits for it: the call's hit is counted, in the
// retired record Seal makes, and a call after Seal is refused. The store ends
// with both hits. Also with the judge rejecting: the take-back lands before
// Seal's retirement, so the store ends with the first hit only.
func TestJudgedFastSealWaitsForJudgedCall(t *testing.T) {
	testHeldOnly = true
	defer func() { testHeldOnly = false }()
	for _, admit := range []bool{true, false} {
		t.Run(fmt.Sprintf("admit=%v", admit), func(t *testing.T) {
			tb := newTable(t, Options{Sizes: []time.Duration{time.Second}, Track: true})
			const now = int64(1_000_500)
			tb.AddWindows("k", now, 1, [2]int64{1, 0}, false)
			var sealed sync.WaitGroup
			var sealReturned atomic.Bool
			judge := func([2]View) bool {
				sealed.Go(func() { tb.Seal(); sealReturned.Store(true) })
				waitBlocked(t, 1) // Seal, on this entry's gate
				require.False(t, sealReturned.Load(), "Seal returned while a judged call held the entry")
				return admit
			}
			v, ok, held, open := tb.AddWindowsOpen("k", now, 1, [2]int64{1, 0}, false, false, true, judge)
			require.True(t, open && held)
			require.Equal(t, admit, ok)
			want := int64(1)
			if admit {
				want = 2
			}
			require.Equal(t, want, v[0].Cur)
			sealed.Wait()
			requireSealedWith(t, tb, now, want)
		})
	}
}

// TestJudgedPendingSealDuringJudge: a judged count without the entry's gate
// (addWindowsFast) holds nothing Seal waits for. Seal, run to its end while
// such a call is inside its judge, moves the gate: the call's swap fails, it
// finds the entry gone and the table sealed, and is refused having counted
// nothing, whatever its judge said. The store ends with the first hit only.
func TestJudgedPendingSealDuringJudge(t *testing.T) {
	for _, admit := range []bool{true, false} {
		t.Run(fmt.Sprintf("admit=%v", admit), func(t *testing.T) {
			tb := newTable(t, Options{Sizes: []time.Duration{time.Second}, Track: true})
			const now = int64(1_000_500)
			tb.AddWindows("k", now, 1, [2]int64{1, 0}, false)
			calls := 0
			judge := func([2]View) bool {
				if calls++; calls == 1 {
					tb.Seal()
				}
				return admit
			}
			_, ok, _, open := tb.AddWindowsOpen("k", now, 1, [2]int64{1, 0}, false, false, true, judge)
			require.False(t, open, "a judged call that Seal overtook")
			require.False(t, ok)
			require.Equal(t, 1, calls, "judged once: the retry found the entry gone")
			requireSealedWith(t, tb, now, 1)
		})
	}
}

// requireSealedWith checks a sealed table that held "k" with want hits in
// the one-second window at now: a lean call is refused, and the final push
// leaves want in the store.
func requireSealedWith(t *testing.T, tb *Table, now, want int64) {
	t.Helper()
	_, _, _, open := tb.AddWindowsOpen("k", now, 1, [2]int64{1, 0}, false, false, true, nil)
	require.False(t, open, "a lean call after Seal")
	hits, _ := tb.Pending()
	require.Equal(t, want, hits)
	st := memory.New()
	var b Batch
	tb.collectAll(now, false, &b)
	settle(t, tb, st, &b, "final")
	got, err := st.GetWindow(context.Background(), "ns", strategy.CounterID{Key: "k", Size: time.Second, Start: 1_000_000})
	require.NoError(t, err)
	require.Equal(t, want, got)
}
