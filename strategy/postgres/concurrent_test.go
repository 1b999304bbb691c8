package postgres

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit/strategy"
)

// concurrentPushFor is how long the nodes push: long enough for lock waits
// between concurrent pushes to show.
const concurrentPushFor = 5 * time.Second

// Eight nodes, each with its own pool, push overlapping counters in random
// orders for five seconds, half of them in parts sent two at a time: no
// deadlock (the store does not retry, so one would surface), and the totals
// are exact.
func TestConcurrentPush(t *testing.T) {
	dsn := testDSN(t)
	const nodes, nkeys, perBatch = 8, 40, 20
	table := uniqueTable(t)
	sizes := []time.Duration{time.Second, time.Minute}
	type ck struct {
		key  string
		size time.Duration
	}
	stores := make([]*Store, nodes)
	for i := range stores {
		opts := Options{Table: table, MaxRetries: -1}
		if i%2 == 1 {
			opts.MaxPushRows = 7 // batches in parts, two at a time
		}
		stores[i] = newStore(t, newPool(t, dsn, func(c *pgxpool.Config) { c.MaxConns = 2 }), opts)
	}
	deadline := time.Now().Add(concurrentPushFor)
	sums := make([]map[ck]int64, nodes)
	errs := make([]error, nodes)
	pushes := make([]int, nodes)
	var wg sync.WaitGroup
	for n := range nodes {
		sums[n] = map[ck]int64{}
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(n), 42))
			for seq := 0; time.Now().Before(deadline); seq++ {
				var diffs []strategy.Diff
				var reads []strategy.CounterID
				for _, k := range rng.Perm(nkeys)[:perBatch] {
					size := sizes[rng.IntN(len(sizes))]
					c := ck{fmt.Sprint("key-", k), size}
					if _, dup := sums[n][c]; dup && rng.IntN(4) == 0 {
						reads = append(reads, id(c.key, size, base))
						continue
					}
					d := rng.Int64N(10) + 1
					diffs = append(diffs, diff(c.key, size, base, d))
					sums[n][c] += d
				}
				b := &strategy.Batch{ID: fmt.Sprintf("%s-n%d-%d", table, n, seq), Namespace: "concurrent", Diffs: diffs, Reads: reads}
				if _, err := stores[n].PushDiffs(context.Background(), b); err != nil {
					errs[n] = err
					return
				}
				pushes[n]++
			}
		})
	}
	wg.Wait()
	want := map[ck]int64{}
	total := 0
	for n := range nodes {
		require.NoError(t, errs[n], "node %d", n)
		total += pushes[n]
		for c, d := range sums[n] {
			want[c] += d
		}
	}
	got := map[ck]int64{}
	for c, err := range stores[0].GetCounters(context.Background(), strategy.Query{Namespace: "concurrent", Sizes: sizes, Now: base}) {
		require.NoError(t, err)
		got[ck{c.Key, c.Size}] = c.Count
	}
	require.Equal(t, want, got)
	t.Logf("%d nodes, %d pushes in %v", nodes, total, concurrentPushFor)
}
