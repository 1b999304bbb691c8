package postgres

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit/strategy"
)

func TestPurge(t *testing.T) {
	pool := newPool(t, testDSN(t))
	s := newStore(t, pool, Options{PurgeInterval: time.Minute, PurgeBatchSize: 7, BatchIDRetention: time.Millisecond})
	ctx := context.Background()
	w, m := 10*time.Second, time.Minute
	now := base + 1
	var diffs []strategy.Diff
	for i := range 50 { // several purge statements' worth
		k := fmt.Sprint("old-", i)
		diffs = append(diffs, diff(k, w, base-20_000, 1), diff(k, w, base-30_000, 1), diff(k, m, base-120_000, 1))
	}
	_, err := s.PushDiffs(ctx, &strategy.Batch{ID: "old", Namespace: "ns", Diffs: diffs})
	require.NoError(t, err)
	keep := []strategy.Diff{
		diff("k", w, base-10_000, 2), // previous
		diff("k", w, base, 3),        // current
		diff("k", m, base-60_000, 4), // previous
		diff("k", m, base, 5),        // current
		diff("k", w, base+10_000, 6), // ahead of now: kept
	}
	_, err = s.PushDiffs(ctx, &strategy.Batch{ID: "keep", Namespace: "ns", Diffs: keep})
	require.NoError(t, err)
	require.Equal(t, int64(155), rowCount(t, pool, s.opts.Table, "true"))

	require.NoError(t, s.Purge(ctx, now))
	require.Equal(t, int64(len(keep)), rowCount(t, pool, s.opts.Table, "true"))
	for _, d := range keep {
		n, err := s.GetWindow(ctx, "ns", d.CounterID)
		require.NoError(t, err)
		require.Equal(t, d.Delta, n, "%v", d.CounterID)
	}
	// The old batch's ID expired with its windows; the other is kept.
	require.Equal(t, int64(0), rowCount(t, pool, s.opts.BatchTable, "id = 'old'"))
	require.Equal(t, int64(1), rowCount(t, pool, s.opts.BatchTable, "id = 'keep'"))

	// Real work at most once per PurgeInterval (one minute here) of now.
	_, err = s.PushDiffs(ctx, &strategy.Batch{ID: "old2", Namespace: "ns", Diffs: []strategy.Diff{diff("x", w, base-60_000, 1)}})
	require.NoError(t, err)
	require.NoError(t, s.Purge(ctx, now+59_999))
	require.Equal(t, int64(len(keep)+1), rowCount(t, pool, s.opts.Table, "true"), "purged again too soon")
	require.NoError(t, s.Purge(ctx, now+60_000))
	// At now+60s the windows ahead of base are old too.
	require.Zero(t, rowCount(t, pool, s.opts.Table, "window_start + 2 * window_size <= $1", now+60_000))
	require.Equal(t, int64(1), rowCount(t, pool, s.opts.Table, "true"), "only the current one-minute window")
	require.Equal(t, int64(1), rowCount(t, pool, s.opts.BatchTable, "true"))
	require.Equal(t, int64(1), rowCount(t, pool, s.opts.BatchTable, "id = 'keep'"), "kept while its latest window lives")

	// A clock that jumps back by more than the interval purges at once.
	_, err = s.PushDiffs(ctx, &strategy.Batch{ID: "old3", Namespace: "ns", Diffs: []strategy.Diff{diff("y", w, base-60_000, 1)}})
	require.NoError(t, err)
	require.NoError(t, s.Purge(ctx, now))
	require.Zero(t, rowCount(t, pool, s.opts.Table, "key = 'y'"))
}

// Several nodes purging a large backlog at once split it without errors.
func TestPurgeConcurrent(t *testing.T) {
	dsn := testDSN(t)
	pool := newPool(t, dsn)
	s := newStore(t, pool, Options{})
	ctx := context.Background()
	var diffs []strategy.Diff
	for i := range 20_000 {
		diffs = append(diffs, diff(fmt.Sprint("k", i), time.Second, base-int64(i%5)*1000-2000, 1))
	}
	diffs = append(diffs, diff("live", time.Second, base, 1))
	_, err := s.PushDiffs(ctx, &strategy.Batch{ID: "backlog", Namespace: "ns", Diffs: diffs})
	require.NoError(t, err)

	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		node := newStore(t, newPool(t, dsn), Options{Table: s.opts.Table, PurgeBatchSize: 500})
		wg.Go(func() { errs[i] = node.Purge(ctx, base) })
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	require.Equal(t, int64(1), rowCount(t, pool, s.opts.Table, "true"))
}
