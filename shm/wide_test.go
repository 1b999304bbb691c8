package shm

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit/strategy"
	"github.com/ratesync/ratelimit/strategy/memory"
)

// The flags' diff marks sit above every flag bit.
func TestFlagsBelowMarks(t *testing.T) {
	require.Less(t, flagWide, uint32(1)<<markShift)
}

// wideValue draws an addition that exercises the narrow bounds: small ones,
// ones around maxFast and narrowLocal, and ones far past 32 bits.
func wideValue(rng *rand.Rand) int64 {
	var v int64
	switch rng.IntN(6) {
	case 0, 1:
		v = int64(rng.IntN(9) + 1)
	case 2:
		v = maxFast + int64(rng.IntN(3)) - 1
	case 3:
		v = narrowLocal/2 + int64(rng.IntN(3)) - 1
	case 4:
		v = narrowLocal + int64(rng.IntN(3)) - 1
	default:
		v = 1<<40 + int64(rng.IntN(1000))
	}
	if rng.IntN(4) == 0 {
		v = -v
	}
	return v
}

// TestWideMatchesModel replays seeded histories of one key with values that
// leave the 32-bit counts' range, through the locked and the lock-free
// additions, against the model: an entry that goes wide keeps every count.
func TestWideMatchesModel(t *testing.T) {
	widened := int64(0)
	for seed := range uint64(3000) {
		rng := rand.New(rand.NewPCG(seed, 7))
		tb := newTable(t, Options{Sizes: []time.Duration{100 * time.Millisecond, time.Second}})
		m := &model{sizes: []int64{100, 1000}, latest: map[[2]any]int64{}, count: map[[3]any]int64{}}
		now := int64(1_000_000)
		var trace []string
		for range 16 {
			if rng.IntN(3) == 0 {
				now -= int64(rng.IntN(300))
			} else {
				now += int64(rng.IntN(200))
			}
			w := rng.IntN(2)
			v := wideValue(rng)
			op := rng.IntN(3)
			var got, want View
			switch op {
			case 0:
				got, want = tb.Peek("k", w, now), m.peek("k", w, now)
			case 1:
				got, want = tb.Add("k", w, now, v), m.add("k", w, now, v)
			default:
				got, _, _ = tb.AddOpen("k", w, now, v, false, false)
				want = m.add("k", w, now, v)
			}
			trace = append(trace, fmt.Sprintf("op=%d w=%d now=%d v=%d -> table %+v model %+v", op, w, now, v, got, want))
			if got != want {
				for _, l := range trace {
					t.Log(l)
				}
				t.Fatalf("seed %d diverged", seed)
			}
		}
		widened += tb.widened.Load()
	}
	require.Positive(t, widened, "some histories went wide")
}

// TestWideSyncedTotal: a store total past the narrow synced range (other
// nodes' hits) widens the entry that learns it, and the node's view keeps
// it exactly, before and after its own hits are pushed.
func TestWideSyncedTotal(t *testing.T) {
	st := memory.New()
	a := newTable(t, Options{Sizes: []time.Duration{time.Minute}, Track: true})
	b := newTable(t, Options{Sizes: []time.Duration{time.Minute}, Track: true})
	const now = 1_000_000
	const big = 3 << 30
	for range 3 {
		a.Add("k", 0, now, 1<<30)
	}
	require.Positive(t, a.widened.Load(), "a local count past 2^29 widens")
	collectSettle(t, a, st, now, "a1")
	b.Add("k", 0, now, 2)
	collectSettle(t, b, st, now, "b1")
	require.Positive(t, b.widened.Load(), "a total past 2^30 widens")
	require.Equal(t, View{Start: 960_000, Cur: big + 2}, b.Peek("k", 0, now))
	vw, _, _ := b.AddOpen("k", 0, now, 1, false, false)
	require.Equal(t, View{Start: 960_000, Cur: big + 3}, vw, "a wide entry counts on the locked path")
	collectSettle(t, b, st, now, "b2")
	n, err := st.GetWindow(context.Background(), "ns", strategy.CounterID{Key: "k", Size: time.Minute, Start: 960_000})
	require.NoError(t, err)
	require.Equal(t, int64(big+3), n)
	require.Equal(t, View{Start: 960_000, Cur: big + 3}, b.Peek("k", 0, now))
	// Two windows later the wide entry rotates; evicted, it leaves wides.
	b.Add("k", 0, now+120_000, 1)
	require.Equal(t, View{Start: 1_080_000, Cur: 1}, b.Peek("k", 0, now+120_000))
	e := b.lookupEntry("k")
	_, held := b.wides.Load(e)
	require.True(t, held, "the entry is wide")
	dropKey(b, "k")
	_, held = b.wides.Load(e)
	require.False(t, held, "the evicted entry left wides")
	n = 0
	b.wides.Range(func(any, any) bool { n++; return true })
	require.Zero(t, n, "an evicted wide entry leaves wides")
	collectSettle(t, b, st, now+120_000, "b3")
	hits, retired := b.Pending()
	require.Zero(t, hits)
	require.Zero(t, retired)
}

// TestWideRacesExact races lock-free additions of 1 on one key with locked
// additions that take its count past the narrow range and back (widening
// it), syncs and evictions: every hit reaches the store exactly once.
func TestWideRacesExact(t *testing.T) {
	for round := range 20 {
		st := memory.New()
		tb := newTable(t, Options{Sizes: []time.Duration{time.Minute}, Track: true, MaxKeys: 8, MaxRetired: 1 << 20})
		const now = 1_000_000
		tb.Add("k", 0, now, 1)
		var wg sync.WaitGroup
		var mu sync.Mutex
		total := int64(1)
		count := func(n int64) { mu.Lock(); total += n; mu.Unlock() }
		for g := range 4 {
			wg.Go(func() {
				for i := range 500 {
					if _, held, _ := tb.AddOpen("k", 0, now, 1, false, false); !held {
						t.Error("not held")
					}
					count(1)
					if g == 0 && i%100 == 50 {
						tb.Add("k", 0, now, narrowLocal) // widens
						count(narrowLocal)
					}
					if g == 1 && i%150 == 75 {
						dropKey(tb, "k")
					}
					if g == 2 && i%50 == 0 {
						collectSettle(t, tb, st, now, fmt.Sprintf("r%d-%d", round, i))
					}
				}
			})
		}
		wg.Wait()
		for i := range 3 {
			collectSettle(t, tb, st, now, fmt.Sprintf("r%d-end%d", round, i))
		}
		hits, retired := tb.Pending()
		require.Zero(t, hits)
		require.Zero(t, retired)
		n, err := st.GetWindow(context.Background(), "ns", strategy.CounterID{Key: "k", Size: time.Minute, Start: 960_000})
		require.NoError(t, err)
		require.Equal(t, total, n, "round %d", round)
	}
}
