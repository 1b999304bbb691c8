package shm

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit/strategy"
	"github.com/ratesync/ratelimit/strategy/memory"
)

// TestExactMixedRace: lock-free adds, judged calls of one and two sizes,
// locked adds (negative too), peeks and write-throughs race evictions (64
// entries, 150 keys), rotations, a clock that some callers see behind,
// chunked collects with reads, a faulty store (Release, unknown outcomes
// re-sent) and, in some rounds, Seal. The store must end with exactly what
// the calls reported counted, per key and window size.
func TestExactMixedRace(t *testing.T) {
	sizes := []time.Duration{10 * time.Millisecond, 40 * time.Millisecond}
	for round := range 16 {
		opts := Options{Sizes: sizes, MaxKeys: 64, Track: true, MaxRetired: 1 << 30}
		switch round % 4 {
		case 1:
			opts.Walk = true
		case 2:
			opts.Watch = true
		case 3:
			opts.WriteThrough = true
		}
		tb := newTable(t, opts)
		st := memory.New()
		var faultOn atomic.Bool
		faultOn.Store(true)
		var frng sync.Mutex
		fr := rand.New(rand.NewPCG(uint64(round), 99))
		st.SetFaults(func(op memory.Op) memory.Fault {
			if op != memory.OpPush || !faultOn.Load() {
				return memory.NoFault
			}
			frng.Lock()
			defer frng.Unlock()
			switch fr.IntN(10) {
			case 0:
				return memory.Refuse
			case 1:
				return memory.LoseRequest
			case 2:
				return memory.LoseReply
			}
			return memory.NoFault
		})
		var clock atomic.Int64
		const start = int64(1_000_000)
		clock.Store(start)
		const workers, hits, keys = 3, 4000, 150
		var counted [keys][2]atomic.Int64
		var calls atomic.Int64
		var ids atomic.Int64
		var wg sync.WaitGroup
		for g := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(uint64(round), uint64(g)))
				for range hits {
					k := rng.IntN(keys)
					if rng.IntN(4) == 0 {
						k = rng.IntN(4) // a few hot keys
					}
					key := fmt.Sprint("k", k)
					now := clock.Load()
					switch r := rng.IntN(20); {
					case r == 0:
						now = clock.Add(int64(1 + rng.IntN(6)))
					case r < 3:
						now -= int64(rng.IntN(30)) // a caller whose clock is behind
					}
					w := rng.IntN(2)
					judge := func(v [2]View) bool { return v[0].Cur <= 5 && v[1].Cur <= 12 }
					switch op := rng.IntN(10); {
					case op < 4:
						if _, _, open := tb.AddOpen(key, w, now, 1, false, true); open {
							counted[k][w].Add(1)
						}
					case op < 7:
						mask := uint8(1 + rng.IntN(3))
						if _, ok, _, open := tb.AddWindowsOpen(key, now, mask, [2]int64{1, 1}, false, false, true, judge); ok && open {
							for w := range 2 {
								if mask&(1<<w) != 0 {
									counted[k][w].Add(1)
								}
							}
						}
					case op < 8:
						v := int64(rng.IntN(3) - 1)
						tb.Add(key, w, now, v)
						counted[k][w].Add(v)
					case op < 9:
						tb.Peek(key, w, now)
					default:
						if opts.WriteThrough {
							var b Batch
							tb.AddPending(key, w, now, 1, &b)
							counted[k][w].Add(1)
							settle(t, tb, st, &b, fmt.Sprint("wt", ids.Add(1)))
						} else {
							tb.AddWindowsOpen(key, now, 3, [2]int64{1, 1}, true, false, true, judge)
						}
					}
					calls.Add(1)
				}
			}()
		}
		var b Batch
		stop := loopUntilStopped(func(n int) {
			// A pass in chunks of 1 to 31 counters.
			tb.Rewind()
			for fin := false; !fin; {
				b.Reset()
				fin = tb.CollectSome(clock.Load(), n%2 == 0, &b, 1+n%7*5)
				settle(t, tb, st, &b, fmt.Sprint("c", ids.Add(1)))
			}
		})
		sealed := round%3 == 0
		if sealed {
			for calls.Load() < workers*hits/2 {
				runtime.Gosched()
			}
			tb.Seal()
		}
		wg.Wait()
		stop()
		faultOn.Store(false)
		for range 3 {
			var b Batch
			tb.collectAll(clock.Load(), false, &b)
			settle(t, tb, st, &b, fmt.Sprint("final", ids.Add(1)))
		}
		if round < 4 {
			t.Logf("round %d: evictions %d dropped %d clock +%d", round, tb.Evictions(), tb.DroppedHits(), clock.Load()-start)
		}
		pending, retired := tb.Pending()
		require.Zero(t, pending, "round %d", round)
		require.Zero(t, retired, "round %d", round)
		for k := range keys {
			for w, size := range sizes {
				ms := size.Milliseconds()
				got := int64(0)
				for x := windowStart(start-200, ms); x <= clock.Load(); x += ms {
					n, err := st.GetWindow(context.Background(), "ns", strategy.CounterID{Key: fmt.Sprint("k", k), Size: size, Start: x})
					require.NoError(t, err)
					got += n
				}
				require.Equal(t, counted[k][w].Load(), got, "round %d (%+v) key k%d size %v", round, opts, k, size)
			}
		}
	}
}
