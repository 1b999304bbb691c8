package shm

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit/strategy"
	"github.com/ratesync/ratelimit/strategy/memory"
)

// TestAckGroupedMatchesPlain feeds two tables the same hits, reads and remote
// traffic (some of it in windows ahead, which read-ahead follows), and syncs
// them in the same steps: one settles batches per entry run (Ack's grouped
// walk), the other diffs first and then reads, one lock hold per counter.
// Their views, pending hits and stores must agree throughout.
func TestAckGroupedMatchesPlain(t *testing.T) {
	for seed := range uint64(40) {
		rng := rand.New(rand.NewPCG(seed, 11))
		opts := Options{Sizes: []time.Duration{100 * time.Millisecond, 400 * time.Millisecond}, Track: true,
			Walk: seed%2 == 0, ReadAhead: 60 * time.Millisecond, Settle: time.Duration(seed%3) * 50 * time.Millisecond}
		type node struct {
			tb *Table
			st *memory.Store
		}
		nodes := [2]node{{newTable(t, opts), memory.New()}, {newTable(t, opts), memory.New()}}
		sizes := []int64{100, 400}
		now := int64(1_000_000)
		keys := 12
		batches := 0
		sync := func() {
			batches++
			for n, nd := range nodes {
				var b Batch
				for part := 0; ; part++ {
					done := nd.tb.CollectSome(now, true, &b, 1+int(seed%5)*3)
					res, err := nd.st.PushDiffs(context.Background(), &strategy.Batch{ID: fmt.Sprint(batches, "-", part),
						Namespace: "ns", Diffs: b.Diffs, Reads: b.Reads})
					require.NoError(t, err)
					if n == 1 {
						ackPlain(nd.tb, &b, res)
					} else {
						nd.tb.Ack(&b, res)
					}
					b.Reset()
					if done {
						break
					}
				}
			}
		}
		for step := range 400 {
			key := fmt.Sprint("k", rng.IntN(keys))
			w := rng.IntN(2)
			switch r := rng.IntN(10); {
			case r < 4:
				v := int64(rng.IntN(5) + 1)
				for _, nd := range nodes {
					nd.tb.Add(key, w, now, v)
				}
			case r < 5:
				for _, nd := range nodes {
					nd.tb.Peek(key, w, now)
				}
			case r < 7: // another node's hits, sometimes in the next window
				start := windowStart(now, sizes[w]) + int64(rng.IntN(2))*sizes[w]
				d := strategy.Diff{CounterID: strategy.CounterID{Key: key, Size: time.Duration(sizes[w]) * time.Millisecond, Start: start}, Delta: 2}
				for _, nd := range nodes {
					_, err := nd.st.PushDiffs(context.Background(), &strategy.Batch{ID: fmt.Sprint("remote-", step), Namespace: "ns", Diffs: []strategy.Diff{d}})
					require.NoError(t, err)
				}
			case r < 9:
				sync()
			default:
				now += int64(rng.IntN(150))
			}
			for k := range keys {
				key := fmt.Sprint("k", k)
				for w := range 2 {
					va, vb := viewOf(nodes[0].tb, key, w, now), viewOf(nodes[1].tb, key, w, now)
					require.Equal(t, vb, va, "seed %d step %d key %s w %d", seed, step, key, w)
				}
			}
			ha, ra := nodes[0].tb.Pending()
			hb, rb := nodes[1].tb.Pending()
			require.Equal(t, [2]any{hb, rb}, [2]any{ha, ra}, "seed %d step %d", seed, step)
		}
		sync()
		for k := range keys {
			for w, size := range sizes {
				for _, start := range []int64{windowStart(now, size) - size, windowStart(now, size), windowStart(now, size) + size} {
					id := strategy.CounterID{Key: fmt.Sprint("k", k), Size: time.Duration(size) * time.Millisecond, Start: start}
					a, err := nodes[0].st.GetWindow(context.Background(), "ns", id)
					require.NoError(t, err)
					b, err := nodes[1].st.GetWindow(context.Background(), "ns", id)
					require.NoError(t, err)
					require.Equal(t, b, a, "seed %d %+v w %d", seed, id, w)
				}
			}
		}
	}
}

// ackPlain is the reference for Ack: every diff of b, then every read, one
// lock hold per counter.
func ackPlain(t *Table, b *Batch, res strategy.Result) {
	for i := range b.diffRefs {
		ref := &b.diffRefs[i]
		t.lockEntry(ref.e)
		t.ack(ref, b.Diffs[i].Delta, res.Totals[i])
		ref.e.unlockEntry()
	}
	for i := range b.readRefs {
		ref := &b.readRefs[i]
		t.lockEntry(ref.e)
		t.setSynced(ref, res.Reads[i])
		ref.e.unlockEntry()
	}
	t.settleFlags(b)
	t.settled(b)
}

// viewOf returns the table's view of key without creating or moving anything.
func viewOf(tb *Table, key string, w int, now int64) [3]int64 {
	s, e := tb.lookup(key)
	if e == nil {
		return [3]int64{}
	}
	defer s.mu.RUnlock()
	tb.lockEntry(e)
	defer e.unlockEntry()
	lat := e.w[w].latest.Load()
	cur, prev := tb.viewsAt(e, w, lat, parity(lat, tb.sizeMS[w]))
	return [3]int64{lat, cur, prev}
}
