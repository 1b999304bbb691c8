package shm

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit/strategy"
	"github.com/ratesync/ratelimit/strategy/memory"
)

// Attacks on addOpenFast from a review (no bug found in these
// interleavings). Each races one lock-free addition, inside testHookFast
// (after findFast and the read of the window before, just before the
// addition), with rotations, evictions, resizes, Seal, Collect and Ack,
// then checks that the store holds exactly the hits the calls reported
// counted, summed over the key's windows, and nothing is left pending.

const rfSize = int64(1000)

// rfStoreSum returns the store's total for key over windows of size index
// 0 (one second) from..to.
func rfStoreSum(t *testing.T, st *memory.Store, key string, from, to int64) int64 {
	t.Helper()
	sum := int64(0)
	for x := from - from%rfSize - 4*rfSize; x <= to+4*rfSize; x += rfSize {
		n, err := st.GetWindow(context.Background(), "ns", strategy.CounterID{Key: key, Size: time.Second, Start: x})
		require.NoError(t, err)
		sum += n
	}
	return sum
}

type rfCase struct {
	name string
	v    int64
	// race runs inside the lock-free addition and returns the hits it
	// counted itself.
	race func(tb *Table, st *memory.Store) int64
	// refused: the call is expected not to count (sealed).
	refused bool
}

func rfCases(t *testing.T) []rfCase {
	const now = rvNow
	var cases []rfCase
	for _, by := range []int64{1, 2, 3} {
		cases = append(cases, rfCase{name: fmt.Sprintf("rotate-by-%d", by), v: 1, race: func(tb *Table, _ *memory.Store) int64 {
			tb.Add("k", 0, now+by*rfSize, 10)
			return 10
		}})
		cases = append(cases, rfCase{name: fmt.Sprintf("rotate-by-%d-then-evict", by), v: 1, race: func(tb *Table, _ *memory.Store) int64 {
			tb.Add("k", 0, now+by*rfSize, 10)
			dropKey(tb, "k")
			return 10
		}})
	}
	for _, v := range []int64{1, -1, maxFast, -maxFast, maxFast - 1} {
		cases = append(cases, rfCase{name: fmt.Sprintf("collect-ack/v=%d", v), v: v, race: func(tb *Table, st *memory.Store) int64 {
			collectSettle(t, tb, st, now, "race")
			return 0
		}})
		cases = append(cases, rfCase{name: fmt.Sprintf("collect-evict-ack/v=%d", v), v: v, race: func(tb *Table, st *memory.Store) int64 {
			var b Batch
			tb.collectAll(now, false, &b)
			dropKey(tb, "k")
			settle(t, tb, st, &b, "race")
			return 0
		}})
		cases = append(cases, rfCase{name: fmt.Sprintf("seal/v=%d", v), v: v, refused: true, race: func(tb *Table, _ *memory.Store) int64 {
			tb.Seal()
			return 0
		}})
		cases = append(cases, rfCase{name: fmt.Sprintf("collect-seal-ack/v=%d", v), v: v, refused: true, race: func(tb *Table, st *memory.Store) int64 {
			var b Batch
			tb.collectAll(now, false, &b)
			tb.Seal()
			settle(t, tb, st, &b, "race")
			return 0
		}})
	}
	// A locked addition widens the entry (its count leaves the narrow
	// range) between the lock-free addition's lookup and its add: the add
	// lands on the narrow count's poison and is counted again locked.
	cases = append(cases, rfCase{name: "widen", v: 1, race: func(tb *Table, _ *memory.Store) int64 {
		tb.Add("k", 0, now, narrowLocal)
		return narrowLocal
	}})
	cases = append(cases, rfCase{name: "widen-then-evict", v: 1, race: func(tb *Table, _ *memory.Store) int64 {
		tb.Add("k", 0, now, -narrowLocal-1)
		dropKey(tb, "k")
		return -narrowLocal - 1
	}})
	cases = append(cases, rfCase{name: "resize-and-backward-shift", v: 1, race: func(tb *Table, _ *memory.Store) int64 {
		// Fill k's shard past its size (resizes) and cap (evictions, which
		// backward-shift k's entry or take it).
		for i := range 40 {
			tb.Add(fmt.Sprintf("o%d", i), 0, now, 1)
		}
		return 40
	}})
	cases = append(cases, rfCase{name: "expire-on-grow", v: 1, race: func(tb *Table, _ *memory.Store) int64 {
		// Two windows later every entry has expired: growing drops them.
		for i := range 40 {
			tb.Add(fmt.Sprintf("o%d", i), 0, now+3*rfSize, 1)
		}
		return 40
	}})
	return cases
}

func TestFastAddRaces(t *testing.T) {
	for _, opts := range []Options{
		{Track: true, MaxKeys: 8, MaxRetired: 1 << 20},
		{Track: true, MaxKeys: 8, Walk: true, MaxRetired: 1 << 20},
		{Track: true, MaxKeys: 8, Watch: true, MaxRetired: 1 << 20},
	} {
		for _, c := range rfCases(t) {
			for _, behind := range []int64{0, 2} {
				name := fmt.Sprintf("walk=%v,watch=%v/%s/behind=%d", opts.Walk, opts.Watch, c.name, behind)
				t.Run(name, func(t *testing.T) {
					opts.Sizes = []time.Duration{time.Second}
					tb := newTable(t, opts)
					st := memory.New()
					const now = rvNow
					tb.Add("k", 0, now, 5)
					at := now - behind*rfSize // a clock behind the newest window
					var raced int64
					onceBeforeFastAdd(t, func() { raced = c.race(tb, st) })
					_, ok := tb.addOpenFast("k", 0, at, c.v)
					counted := c.v
					if !ok {
						// Turned away (poison): the caller counts it on the locked path.
						_, held, open := tb.AddOpen("k", 0, at, c.v, false, true)
						require.True(t, held)
						if !open {
							counted = 0
						}
					}
					if c.refused {
						require.False(t, ok)
					}
					for i := range 3 {
						collectSettle(t, tb, st, now+3*rfSize, fmt.Sprintf("f%d", i))
					}
					hits, retired := tb.Pending()
					require.Zero(t, hits)
					require.Zero(t, retired)
					total := rfStoreSum(t, st, "k", at, now+3*rfSize)
					for i := range 40 {
						total += rfStoreSum(t, st, fmt.Sprintf("o%d", i), at, now+3*rfSize)
					}
					require.Equal(t, 5+raced+counted, total)
				})
			}
		}
	}
}
