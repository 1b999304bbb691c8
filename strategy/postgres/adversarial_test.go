package postgres

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/ratesync/ratelimit/internal/pginstance"
	"github.com/ratesync/ratelimit/strategy"
)

// bulkCaller models a node's sync loop over many keys: a batch whose outcome
// is unknown is re-sent unchanged until it succeeds; the diffs of a batch
// surely not applied are merged into the next one.
type bulkCaller struct {
	s       *Store
	ns      string
	seq     int
	pending *strategy.Batch
	merged  map[string]int64
	total   int64
	outcome struct{ ok, notApplied, unknown int }
	codes   map[string]int // SQLSTATE (or "-") of each failure
}

func newBulkCaller(s *Store, ns string) *bulkCaller {
	return &bulkCaller{s: s, ns: ns, merged: map[string]int64{}, codes: map[string]int{}}
}

// cycle counts one hit on each of keys and pushes.
func (c *bulkCaller) cycle(ctx context.Context, keys int) error {
	for k := range keys {
		c.merged[fmt.Sprint("k", k)]++
	}
	c.total += int64(keys)
	b := c.pending
	if b == nil {
		if len(c.merged) == 0 {
			return nil
		}
		c.seq++
		b = &strategy.Batch{ID: fmt.Sprintf("%s-%d", c.ns, c.seq), Namespace: c.ns}
		for _, k := range slices.Sorted(maps.Keys(c.merged)) {
			b.Diffs = append(b.Diffs, diff(k, time.Minute, base, c.merged[k]))
		}
		clear(c.merged)
	}
	cctx, cancel := ctx, context.CancelFunc(func() {})
	if _, ok := ctx.Deadline(); !ok {
		cctx, cancel = context.WithTimeout(ctx, 2*time.Second)
	}
	_, err := c.s.PushDiffs(cctx, b)
	cancel()
	switch {
	case err == nil:
		c.outcome.ok++
		c.pending = nil
		return nil
	case c.pending == nil && errors.Is(err, strategy.ErrNotApplied):
		c.outcome.notApplied++
		for _, d := range b.Diffs {
			c.merged[d.Key] += d.Delta
		}
	default:
		c.outcome.unknown++
		c.pending = b
	}
	code := "-"
	if pe, ok := errors.AsType[*pgconn.PgError](err); ok {
		code = pe.Code
	}
	c.codes[code]++
	return err
}

// drain pushes until nothing is pending and returns how many cycles it took,
// or fails after limit cycles.
func (c *bulkCaller) drain(t *testing.T, limit int) int {
	t.Helper()
	for n := 1; ; n++ {
		err := c.cycle(context.Background(), 0)
		if err == nil && c.pending == nil && len(c.merged) == 0 {
			return n
		}
		require.Less(t, n, limit, "%s did not drain: %v", c.ns, err)
	}
}

// stored sums the counters of ns in the store.
func stored(t *testing.T, s *Store, ns string) int64 {
	t.Helper()
	var n int64
	for c, err := range s.GetCounters(context.Background(), strategy.Query{Namespace: ns, Sizes: []time.Duration{time.Minute}, Now: base}) {
		require.NoError(t, err)
		n += c.Count
	}
	return n
}

// terminator kills the backends of application app every "every" to 3*every
// until the time until, or until stopped, and counts them. Callers that
// re-send a call until it is answered stop sending new ones at until: the
// killing stops with them, so the last re-sends get through however slow
// the machine (killed every 15 ms forever, a multi-part push on a loaded
// machine never completed, and the test ran into its timeout).
func terminator(t *testing.T, dsn, app string, every time.Duration, until time.Time) (stop func() int64) {
	t.Helper()
	killer := newPool(t, dsn)
	var done atomic.Bool
	var killed atomic.Int64
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 0; !done.Load() && time.Now().Before(until); i++ {
			var n int64
			if err := killer.QueryRow(context.Background(), `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1`, app).Scan(&n); err == nil {
				killed.Add(n)
			}
			time.Sleep(every + time.Duration(i%11)*every/5)
		}
	})
	return func() int64 {
		done.Store(true)
		wg.Wait()
		return killed.Load()
	}
}

// ownServer starts a PostgreSQL server of the test's own (skipped without
// the binaries, failed under RATELIMIT_TEST_REQUIRE_SERVICES=1) and returns
// it with a pool on it.
func ownServer(t *testing.T, configure ...func(*pgxpool.Config)) (*pginstance.Server, *pgxpool.Pool) {
	t.Helper()
	t.Cleanup(func() { goleak.VerifyNone(t) })
	srv := pginstance.Start(t)
	cfg, err := pgxpool.ParseConfig(srv.DSN(""))
	require.NoError(t, err)
	cfg.MaxConns = 4
	for _, f := range configure {
		f(cfg)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return srv, pool
}

// report logs a test's measured outcome in one greppable line.
func report(t *testing.T, callers []*bulkCaller, s *Store, extra string) {
	t.Helper()
	var total, store int64
	var ok, na, unk int
	codes := map[string]int{}
	for _, c := range callers {
		total += c.total
		store += stored(t, s, c.ns)
		ok, na, unk = ok+c.outcome.ok, na+c.outcome.notApplied, unk+c.outcome.unknown
		for k, v := range c.codes {
			codes[k] += v
		}
	}
	t.Logf("RESULT %s: %d hits counted, %d in the store; pushes: %d ok, %d not applied, %d unknown; failures by SQLSTATE %v; %s",
		t.Name(), total, store, ok, na, unk, codes, extra)
	require.Equal(t, total, store, "exactly once")
}

// pg_terminate_backend on the store's connections, every 5-15 ms while four
// callers push 500-key batches: every termination is a FATAL 57P01 or a
// broken connection, the outcome unknown, the batch re-sent under its ID;
// the totals are exact.
func TestTerminateBackendMidPush(t *testing.T) {
	dsn := testDSN(t)
	app := uniqueTable(t)
	pool := newPool(t, dsn, func(cfg *pgxpool.Config) {
		cfg.ConnConfig.RuntimeParams["application_name"] = app
		cfg.MaxConns = 4
	})
	s := newStore(t, pool, Options{Table: app})
	ctx := context.Background()
	deadline := time.Now().Add(3 * time.Second)
	stop := terminator(t, dsn, app, 5*time.Millisecond, deadline)
	var wg sync.WaitGroup
	callers := make([]*bulkCaller, 4)
	for i := range callers {
		callers[i] = newBulkCaller(s, fmt.Sprint("term-", i))
	}
	for i, c := range callers {
		wg.Go(func() {
			for time.Now().Before(deadline) {
				_ = c.cycle(ctx, 500+i)
			}
		})
	}
	wg.Wait()
	killed := stop()
	drained := 0
	for _, c := range callers {
		drained = max(drained, c.drain(t, 10))
	}
	report(t, callers, s, fmt.Sprintf("%d backends terminated; drained in %d cycles", killed, drained))
	require.Positive(t, killed)
}

// PostgreSQL killed (pg_ctl stop -m immediate) and restarted three times
// while four callers push: pushes on the dead server fail (unknown on the
// pooled connections it broke, not applied once connections are refused),
// nothing is lost or counted twice, and every caller drains within a few
// cycles of the restart.
func TestKillRestartMidPush(t *testing.T) {
	srv, pool := ownServer(t)
	s, err := New(context.Background(), pool, Options{})
	require.NoError(t, err)
	ctx := context.Background()
	callers := make([]*bulkCaller, 4)
	for i := range callers {
		callers[i] = newBulkCaller(s, fmt.Sprint("kill-", i))
	}
	var stop atomic.Bool
	var wg sync.WaitGroup
	for i, c := range callers {
		wg.Go(func() {
			for !stop.Load() {
				_ = c.cycle(ctx, 300+i)
				time.Sleep(5 * time.Millisecond)
			}
		})
	}
	for range 3 {
		time.Sleep(300 * time.Millisecond)
		srv.Stop("immediate")
		time.Sleep(200 * time.Millisecond)
		srv.Restart()
	}
	time.Sleep(300 * time.Millisecond)
	stop.Store(true)
	wg.Wait()
	drained := 0
	for _, c := range callers {
		drained = max(drained, c.drain(t, 10))
	}
	report(t, callers, s, fmt.Sprintf("3 kills; drained in %d cycles", drained))
}

// statement_timeout set very low for the database: every push is cancelled
// by the server (ERROR 57014, rolled back: not applied, the hits kept);
// once the setting is lifted, the store recovers within a push or two even
// on connections opened under the old setting (each such connection is
// dropped after the push that failed on it).
func TestStatementTimeout(t *testing.T) {
	srv, pool := ownServer(t)
	s, err := New(context.Background(), pool, Options{})
	require.NoError(t, err)
	c := newBulkCaller(s, "st")
	require.NoError(t, c.cycle(context.Background(), 2000))
	srv.Exec("", `ALTER DATABASE postgres SET statement_timeout = '1ms'`)
	pool.Reset() // new connections take the setting
	for range 5 {
		require.Error(t, c.cycle(context.Background(), 2000))
	}
	require.Equal(t, 5, c.codes["57014"], "%v", c.codes)
	// The admin session starts with no statement timeout (pginstance.Exec);
	// the SET is kept for a server reached some other way.
	srv.Exec("", `SET statement_timeout = 0`, `ALTER DATABASE postgres RESET statement_timeout`)
	drained := c.drain(t, 10)
	report(t, []*bulkCaller{c}, s, fmt.Sprintf("drained in %d cycles after the setting was lifted", drained))
	require.LessOrEqual(t, drained, int(pool.Config().MaxConns)+1)
}

// default_transaction_read_only = on (a standby promoted the wrong way, an
// operator's maintenance mode): pushes fail with ERROR 25006, not applied;
// reads still work; once it is off again the store recovers on the
// connections it already had too: each connection opened under the old
// setting fails one push at most (here the one New and the reads used).
func TestReadOnlyTransactions(t *testing.T) {
	srv, pool := ownServer(t)
	s, err := New(context.Background(), pool, Options{})
	require.NoError(t, err)
	c := newBulkCaller(s, "ro")
	require.NoError(t, c.cycle(context.Background(), 100))
	srv.Exec("", `ALTER DATABASE postgres SET default_transaction_read_only = on`)
	pool.Reset()
	for range 5 {
		err := c.cycle(context.Background(), 100)
		require.ErrorIs(t, err, strategy.ErrNotApplied)
	}
	require.Equal(t, 5, c.codes["25006"], "%v", c.codes)
	require.Equal(t, int64(100), stored(t, s, "ro"), "reads work on a read-only server")
	srv.Exec("", `SET default_transaction_read_only = off`, `ALTER DATABASE postgres SET default_transaction_read_only = off`)
	drained := c.drain(t, 10)
	report(t, []*bulkCaller{c}, s, fmt.Sprintf("drained in %d cycles after read-only was lifted", drained))
	require.LessOrEqual(t, drained, int(pool.Config().MaxConns)+1)
}

// The tables dropped under a running store: the push that finds them gone
// (ERROR 42P01, not applied) makes the store create them again, and the hits
// it carried are applied there. The counters that were in the dropped table
// are gone, as after a TRUNCATE.
func TestTableDropped(t *testing.T) {
	pool := newPool(t, testDSN(t))
	s := newStore(t, pool, Options{})
	c := newBulkCaller(s, "dropped")
	require.NoError(t, c.cycle(context.Background(), 100))
	_, err := pool.Exec(context.Background(), `DROP TABLE `+s.counters+`, `+s.batches)
	require.NoError(t, err)
	before := c.total
	errs := 0
	for range 3 {
		if c.cycle(context.Background(), 100) != nil {
			errs++
		}
	}
	drained := c.drain(t, 10)
	got := stored(t, s, "dropped")
	t.Logf("RESULT %s: %d hits before the drop (lost with the table), %d after; store holds %d; %d failed pushes, drained in %d cycles; failures by SQLSTATE %v",
		t.Name(), before, c.total-before, got, errs, drained, c.codes)
	require.Equal(t, c.total-before, got, "every hit after the drop is in the new table, once")
	require.Zero(t, errs, "the store recreates its tables in the push that found them gone")
}

// Another session holds an exclusive lock on the counters table for a second
// (an operator's ALTER TABLE, a long VACUUM FULL): pushes wait on the lock
// until their 300 ms deadline (outcome unknown; the server may still apply
// them once the lock is released), are re-sent under their IDs, and the
// totals are exact once the lock is gone.
func TestTableLocked(t *testing.T) {
	dsn := testDSN(t)
	pool := newPool(t, dsn)
	s := newStore(t, pool, Options{})
	locker := newPool(t, dsn)
	ctx := context.Background()
	c := newBulkCaller(s, "locked")
	require.NoError(t, c.cycle(ctx, 50))
	tx, err := locker.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `LOCK TABLE `+s.counters+` IN EXCLUSIVE MODE`)
	require.NoError(t, err)
	failed := 0
	for range 3 {
		cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		if c.cycle(cctx, 50) != nil {
			failed++
		}
		cancel()
	}
	require.NoError(t, tx.Rollback(ctx))
	drained := c.drain(t, 10)
	report(t, []*bulkCaller{c}, s, fmt.Sprintf("%d of 3 pushes failed while the table was locked; drained in %d cycles", failed, drained))
	require.Equal(t, 3, failed)
}
