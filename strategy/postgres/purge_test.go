package postgres

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
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

// serverMillis returns the database server's clock, in Unix milliseconds.
func serverMillis(t testing.TB, pool *pgxpool.Pool) int64 {
	t.Helper()
	var ms int64
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint`).Scan(&ms))
	return ms
}

// A node whose clock is a day ahead purges nothing the cluster still counts
// in: what is expired is decided by the server's clock, less MaxClockSkew
// for nodes that lag it. A node a day behind purges only what is old by its
// own clock too (issue 11, case 5).
func TestPurgeByServerClock(t *testing.T) {
	pool := newPool(t, testDSN(t))
	s := newStore(t, pool, Options{PurgeInterval: time.Millisecond, BatchIDRetention: time.Millisecond})
	ctx := context.Background()
	const day = int64(24 * time.Hour / time.Millisecond)
	w := 10 * time.Second
	now := serverMillis(t, pool)
	cur := strategy.WindowStart(now, w)
	live := []strategy.Diff{
		diff("cur", w, cur, 1),
		diff("prev", w, cur-10_000, 2),
		diff("lagging", w, cur-30_000, 3), // previous window of a node 30 s behind
	}
	old := []strategy.Diff{diff("old", w, cur-10*60_000, 4)}
	ancient := []strategy.Diff{diff("ancient", w, cur-2*day, 5)}
	for id, d := range map[string][]strategy.Diff{"live": live, "old": old, "ancient": ancient} {
		_, err := s.PushDiffs(ctx, &strategy.Batch{ID: id, Namespace: "ns", Diffs: d})
		require.NoError(t, err)
	}
	keys := func() []string {
		var ks []string
		rows, err := pool.Query(ctx, `SELECT key FROM `+s.counters+` ORDER BY key`)
		require.NoError(t, err)
		for rows.Next() {
			var k string
			require.NoError(t, rows.Scan(&k))
			ks = append(ks, k)
		}
		require.NoError(t, rows.Err())
		return ks
	}
	batches := func() int64 { return rowCount(t, pool, s.opts.BatchTable, "true") }

	// A day behind: by its clock everything but the ancient window lies
	// ahead; the ancient one is old by any clock.
	require.NoError(t, s.Purge(ctx, now-day))
	require.Equal(t, []string{"cur", "lagging", "old", "prev"}, keys())
	require.Equal(t, int64(2), batches())

	// A day ahead: only what is old by the server's clock less the margin.
	require.NoError(t, s.Purge(ctx, now+day))
	require.Equal(t, []string{"cur", "lagging", "prev"}, keys())
	require.Equal(t, int64(1), batches(), "the live batch's ID is kept")
	for _, d := range live {
		n, err := s.GetWindow(ctx, "ns", d.CounterID)
		require.NoError(t, err)
		require.Equal(t, d.Delta, n)
	}
	// The live batch re-sent (its reply lost) is still recognised.
	res, err := s.PushDiffs(ctx, &strategy.Batch{ID: "live", Namespace: "ns", Diffs: live})
	require.NoError(t, err)
	require.Equal(t, []int64{1, 2, 3}, res.Totals)
}
