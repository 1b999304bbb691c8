package postgres

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/ratesync/ratelimit/strategy"
	"github.com/ratesync/ratelimit/strategy/strategytest"
)

const dsnEnv = "RATELIMIT_TEST_POSTGRES_DSN"

// base is an instant aligned to every window size the tests use.
const base int64 = 1_700_000_040_000

// testDSN returns the test server's DSN, or skips (fails under
// RATELIMIT_TEST_REQUIRE_SERVICES=1) when there is none. It registers the
// goroutine leak check, so call it first.
func testDSN(t testing.TB) string {
	t.Helper()
	dsn := os.Getenv(dsnEnv)
	if dsn == "" {
		strategytest.SkipOrFail(t, dsnEnv)
	}
	if _, ok := t.(*testing.T); ok {
		t.Cleanup(func() { goleak.VerifyNone(t.(*testing.T)) })
	}
	return dsn
}

// newPool opens a pool on dsn, closed when the test ends.
func newPool(t testing.TB, dsn string, configure ...func(*pgxpool.Config)) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dsn)
	require.NoError(t, err)
	for _, f := range configure {
		f(cfg)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// uniqueTable returns a fresh table name, and drops the table and its batch
// table when the test ends, over a connection of its own (the test's pools
// may go through a proxy that is down by then).
func uniqueTable(t testing.TB) string {
	t.Helper()
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "rl_test_" + hex.EncodeToString(b[:])
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, os.Getenv(dsnEnv))
		if err != nil {
			t.Errorf("drop %s: %v", name, err)
			return
		}
		defer conn.Close(ctx)
		for _, q := range dropObjects("", name) {
			if _, err := conn.Exec(ctx, q); err != nil {
				t.Errorf("drop %s: %v", name, err)
			}
		}
	})
	return name
}

// dropObjects returns the statements that drop the objects of a store on
// table (with the default batch table) in schema.
func dropObjects(schema, table string) []string {
	n := makeNames(Options{Schema: schema, Table: table, BatchTable: table + "_batches"})
	return []string{
		`DROP TABLE IF EXISTS ` + strings.Join([]string{n.counters, n.batches, n.changes, n.buckets, n.logs}, ", "),
		`DROP FUNCTION IF EXISTS ` + n.takeFn + `(` + strings.Join(takeArgs, ", ") + `)`,
	}
}

// newStore returns a store on pool over a fresh table unless opts names one.
func newStore(t testing.TB, pool *pgxpool.Pool, opts Options) *Store {
	t.Helper()
	if opts.Table == "" {
		opts.Table = uniqueTable(t)
	}
	s, err := New(context.Background(), pool, opts)
	require.NoError(t, err)
	return s
}

func TestContract(t *testing.T) {
	pool := newPool(t, testDSN(t))
	strategytest.Run(t, func(t *testing.T) strategy.Strategy { return newStore(t, pool, Options{}) })
}

func id(key string, size time.Duration, start int64) strategy.CounterID {
	return strategy.CounterID{Key: key, Size: size, Start: start}
}

func diff(key string, size time.Duration, start, delta int64) strategy.Diff {
	return strategy.Diff{CounterID: id(key, size, start), Delta: delta}
}

// rowCount counts the rows of table whose SQL condition cond holds.
func rowCount(t testing.TB, pool *pgxpool.Pool, table, cond string, args ...any) int64 {
	t.Helper()
	var n int64
	err := pool.QueryRow(context.Background(), `SELECT count(*) FROM `+pgx.Identifier{table}.Sanitize()+` WHERE `+cond, args...).Scan(&n)
	require.NoError(t, err)
	return n
}

func TestOptionsValidation(t *testing.T) {
	pool := newPool(t, testDSN(t))
	long := string(make([]byte, 60))
	for _, c := range []struct {
		opts  Options
		field string
	}{
		{Options{PurgeInterval: -time.Second}, "PurgeInterval"},
		{Options{PurgeBatchSize: -1}, "PurgeBatchSize"},
		{Options{MaxPushRows: -1}, "MaxPushRows"},
		{Options{BatchIDRetention: -1}, "BatchIDRetention"},
		{Options{PushConcurrency: -1}, "PushConcurrency"},
		{Options{SetupTimeout: -1}, "SetupTimeout"},
		{Options{MaxClockSkew: -1}, "MaxClockSkew"},
		{Options{ChangeRetention: -1}, "ChangeRetention"},
		{Options{Table: strings.Repeat("t", 56), BatchTable: "b"}, "Table"}, // the derived names would not fit
		{Options{Table: "a\x00b"}, "Table"},
		{Options{Table: "\xff"}, "Table"},
		{Options{Table: long}, "Table"},
		{Options{Table: "rl_counters_long_enough_for_a_batch_suffix_to_overflow"}, "Table"},
		{Options{Table: "t", BatchTable: "t"}, "BatchTable"},
		{Options{Schema: "s\x00"}, "Schema"},
	} {
		_, err := New(context.Background(), pool, c.opts)
		require.ErrorIs(t, err, ErrInvalidOptions, "%+v", c.opts)
		require.Contains(t, err.Error(), c.field, "%+v", c.opts)
	}
	_, err := New(context.Background(), nil, Options{})
	require.ErrorIs(t, err, ErrInvalidOptions)

	o, err := Options{}.withDefaults()
	require.NoError(t, err)
	require.Equal(t, Options{
		Table: DefaultTable, BatchTable: DefaultTable + "_batches",
		PurgeInterval: DefaultPurgeInterval, PurgeBatchSize: DefaultPurgeBatchSize,
		MaxPushRows: DefaultMaxPushRows, PushConcurrency: DefaultPushConcurrency, BatchIDRetention: DefaultBatchIDRetention, MaxRetries: DefaultMaxRetries,
		SetupTimeout: DefaultSetupTimeout, MaxClockSkew: DefaultMaxClockSkew, ChangeRetention: DefaultChangeRetention,
	}, o)
	o, err = Options{MaxRetries: -1}.withDefaults()
	require.NoError(t, err)
	require.Zero(t, o.MaxRetries)
}

// Names are quoted, never spliced: a hostile table name is just a name.
func TestQuotedNamesAndSchema(t *testing.T) {
	pool := newPool(t, testDSN(t))
	ctx := context.Background()
	schema := uniqueTable(t) + `_Sch"ema`
	_, err := pool.Exec(ctx, `CREATE SCHEMA `+pgx.Identifier{schema}.Sanitize())
	require.NoError(t, err)
	t.Cleanup(func() {
		_, err := pool.Exec(context.Background(), `DROP SCHEMA `+pgx.Identifier{schema}.Sanitize()+` CASCADE`)
		require.NoError(t, err)
	})
	s, err := New(ctx, pool, Options{Schema: schema, Table: `Odd "name"; DROP TABLE x; --`})
	require.NoError(t, err)
	res, err := s.PushDiffs(ctx, &strategy.Batch{ID: "q1", Namespace: "ns", Now: base, Diffs: []strategy.Diff{diff("k", time.Second, base, 3)},
		BucketDiffs: []strategy.BucketDiff{strategy.SpendDiff(strategy.BucketID{Key: "k", Period: time.Second}, 1, 100, base)},
		Watches:     []strategy.Watch{{Size: time.Second, Start: base, Limit: 10}}})
	require.NoError(t, err)
	require.Equal(t, []int64{3}, res.Totals)
	require.Equal(t, float64(base+100), res.Buckets[0].TAT)
	require.Equal(t, []strategy.Counter{{CounterID: id("k", time.Second, base), Count: 3}}, res.Changes[0].Counters)
	tr, err := s.Take(ctx, &strategy.Take{ID: "q2", Namespace: "ns", Key: "k", Now: base, Cost: 1,
		Buckets: []strategy.TakeBucket{{Period: time.Second, Interval: 100, Burst: 5}}, Logs: []strategy.TakeLog{{Window: time.Second, Max: 5}}})
	require.NoError(t, err)
	require.True(t, tr.Allowed)
	require.Equal(t, float64(base+200), tr.Buckets[0].TAT)
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE schemaname = $1`, schema).Scan(&n))
	require.Equal(t, 5, n, "counters, batches, change log, buckets, sliding logs")
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_proc WHERE pronamespace = to_regnamespace($1)`, pgx.Identifier{schema}.Sanitize()).Scan(&n))
	require.Equal(t, 1, n, "the take function")

	// Existing tables: New creates nothing and succeeds again.
	_, err = New(ctx, pool, Options{Schema: schema, Table: `Odd "name"; DROP TABLE x; --`})
	require.NoError(t, err)
}

func TestUnlogged(t *testing.T) {
	pool := newPool(t, testDSN(t))
	for _, unlogged := range []bool{false, true} {
		s := newStore(t, pool, Options{Unlogged: unlogged})
		for _, table := range []string{s.counters, s.changes, s.buckets, s.logs} {
			var persistence string
			require.NoError(t, pool.QueryRow(context.Background(), `SELECT relpersistence::text FROM pg_class WHERE oid = to_regclass($1)`, table).Scan(&persistence))
			require.Equal(t, map[bool]string{false: "p", true: "u"}[unlogged], persistence, table)
		}
		var persistence string
		require.NoError(t, pool.QueryRow(context.Background(), `SELECT relpersistence::text FROM pg_class WHERE oid = to_regclass($1)`, s.batches).Scan(&persistence))
		require.Equal(t, "p", persistence, "the batch table stays logged")
		res, err := s.PushDiffs(context.Background(), &strategy.Batch{ID: "u", Namespace: "ns", Diffs: []strategy.Diff{diff("k", time.Second, base, 2)}})
		require.NoError(t, err)
		require.Equal(t, []int64{2}, res.Totals)
	}
}

// Eight nodes starting together on a fresh table, each with its own pool,
// all succeed (five times over).
func TestNewConcurrent(t *testing.T) {
	dsn := testDSN(t)
	pools := make([]*pgxpool.Pool, 8)
	for i := range pools {
		pools[i] = newPool(t, dsn)
		require.NoError(t, pools[i].Ping(context.Background())) // connect before the race
	}
	for range 5 {
		table := uniqueTable(t)
		start := make(chan struct{})
		errs := make(chan error, len(pools))
		for _, pool := range pools {
			go func() {
				<-start
				_, err := New(context.Background(), pool, Options{Table: table})
				errs <- err
			}()
		}
		close(start)
		for range pools {
			require.NoError(t, <-errs)
		}
		require.Zero(t, rowCount(t, pools[0], table, "true"))
	}
}

func TestPushErrors(t *testing.T) {
	pool := newPool(t, testDSN(t))
	s := newStore(t, pool, Options{})
	ctx := context.Background()
	one := []strategy.Diff{diff("k", time.Second, base, 1)}

	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	_, err := s.PushDiffs(cancelled, &strategy.Batch{ID: "e1", Namespace: "ns", Diffs: one})
	require.ErrorIs(t, err, strategy.ErrNotApplied)
	require.ErrorIs(t, err, context.Canceled)

	for _, size := range []time.Duration{0, -time.Second, 1500 * time.Microsecond} {
		_, err = s.PushDiffs(ctx, &strategy.Batch{ID: "e4", Namespace: "ns", Diffs: []strategy.Diff{diff("k", size, base, 1)}})
		require.ErrorIs(t, err, strategy.ErrNotApplied, "size %v", size)
	}
	// Counters that cannot exist read as 0, and so do missing ones.
	res, err := s.PushDiffs(ctx, &strategy.Batch{ID: "e5", Namespace: "ns", Reads: []strategy.CounterID{id("k", 0, base), id("k", time.Second, base)}})
	require.NoError(t, err)
	require.Equal(t, []int64{0, 0}, res.Reads)

	// The server refusing the statement (here: a constraint an operator
	// added) means the transaction rolled back: not applied.
	_, err = pool.Exec(ctx, `ALTER TABLE `+s.counters+` ADD CONSTRAINT small CHECK (count < 100)`)
	require.NoError(t, err)
	_, err = s.PushDiffs(ctx, &strategy.Batch{ID: "e6", Namespace: "ns", Diffs: []strategy.Diff{diff("k", time.Second, base, 1000)}})
	require.ErrorIs(t, err, strategy.ErrNotApplied)
	var pe interface{ SQLState() string }
	require.True(t, errors.As(err, &pe))
	require.Equal(t, "23514", pe.SQLState())
	// Reads of a table that is gone fail (a push would create it again,
	// see TestTableDropped).
	_, err = pool.Exec(ctx, `DROP TABLE `+s.counters)
	require.NoError(t, err)
	_, err = s.GetWindow(ctx, "ns", id("k", time.Second, base))
	require.Error(t, err)
}

// Any Go string is a key or a namespace, even one PostgreSQL cannot hold as
// text: those are stored escaped, and come back as they were.
func TestAnyKey(t *testing.T) {
	pool := newPool(t, testDSN(t))
	s := newStore(t, pool, Options{})
	ctx := context.Background()
	keys := []string{"plain", "a\x00b", "\xff\xfe", "\x7f", "\x7fplain", "é", ""}
	for _, ns := range []string{"ns", "\xffns\x00"} {
		var diffs []strategy.Diff
		var reads []strategy.CounterID
		for i, k := range keys {
			diffs = append(diffs, diff(k, time.Second, base, int64(i+1)))
			reads = append(reads, id(k, time.Second, base))
		}
		res, err := s.PushDiffs(ctx, &strategy.Batch{ID: "any-" + ns, Namespace: ns, Diffs: diffs})
		require.NoError(t, err)
		require.Equal(t, []int64{1, 2, 3, 4, 5, 6, 7}, res.Totals)
		res, err = s.PushDiffs(ctx, &strategy.Batch{ID: "any-reads-" + ns, Namespace: ns, Reads: reads})
		require.NoError(t, err)
		require.Equal(t, []int64{1, 2, 3, 4, 5, 6, 7}, res.Reads)
		for i, k := range keys {
			n, err := s.GetWindow(ctx, ns, id(k, time.Second, base))
			require.NoError(t, err)
			require.Equal(t, int64(i+1), n, "%q", k)
		}
		want := map[string]int64{}
		for i, k := range keys {
			want[k] = int64(i + 1)
		}
		got := map[string]int64{}
		for c, err := range s.GetCounters(ctx, strategy.Query{Namespace: ns, Sizes: []time.Duration{time.Second}, Now: base}) {
			require.NoError(t, err)
			got[c.Key] = c.Count
		}
		require.Equal(t, want, got)
		got = map[string]int64{}
		for c, err := range s.GetCounters(ctx, strategy.Query{Namespace: ns, Sizes: []time.Duration{time.Second}, Now: base, Keys: []string{"\xff\xfe", "\x7fplain", "plain"}}) {
			require.NoError(t, err)
			got[c.Key] = c.Count
		}
		require.Equal(t, map[string]int64{"\xff\xfe": 3, "\x7fplain": 5, "plain": 1}, got)
	}
	// The two namespaces are separate.
	n, err := s.GetWindow(ctx, "\xffns", id("plain", time.Second, base))
	require.NoError(t, err)
	require.Zero(t, n)
}

func TestDuplicateDiffsAreMerged(t *testing.T) {
	pool := newPool(t, testDSN(t))
	s := newStore(t, pool, Options{})
	res, err := s.PushDiffs(context.Background(), &strategy.Batch{ID: "d1", Namespace: "ns", Diffs: []strategy.Diff{
		diff("k", time.Second, base, 1), diff("j", time.Second, base, 5), diff("k", time.Second, base, 2),
	}})
	require.NoError(t, err)
	require.Equal(t, []int64{3, 5, 3}, res.Totals)
}

// A batch larger than MaxPushRows goes out in parts; each part is applied
// once, and a re-sent batch completes the parts that were not.
func TestMultiPartPush(t *testing.T) {
	pool := newPool(t, testDSN(t))
	s := newStore(t, pool, Options{MaxPushRows: 3})
	ctx := context.Background()
	var diffs []strategy.Diff
	var reads []strategy.CounterID
	for i := range 10 {
		diffs = append(diffs, diff(string(rune('a'+i)), time.Minute, base, int64(i+1)))
	}
	for i := range 7 {
		reads = append(reads, id(string(rune('a'+i)), time.Minute, base))
	}
	reads = append(reads, id("zz", time.Minute, base))
	b := &strategy.Batch{ID: "mp", Namespace: "ns", Diffs: diffs, Reads: reads}
	for range 2 {
		res, err := s.PushDiffs(ctx, b)
		require.NoError(t, err)
		require.Equal(t, []int64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, res.Totals)
		require.Equal(t, []int64{1, 2, 3, 4, 5, 6, 7, 0}, res.Reads)
	}
	require.Equal(t, int64(4), rowCount(t, pool, s.opts.BatchTable, "id LIKE 'mp#%/4'"))

	// Reads only: nothing recorded.
	res, err := s.PushDiffs(ctx, &strategy.Batch{ID: "ro", Namespace: "ns", Reads: reads})
	require.NoError(t, err)
	require.Equal(t, []int64{1, 2, 3, 4, 5, 6, 7, 0}, res.Reads)
	require.Zero(t, rowCount(t, pool, s.opts.BatchTable, "id LIKE 'ro%'"))
}

// Breaking out of GetCounters releases its connection.
func TestGetCountersEarlyBreak(t *testing.T) {
	pool := newPool(t, testDSN(t))
	s := newStore(t, pool, Options{})
	ctx := context.Background()
	var diffs []strategy.Diff
	for i := range 50 {
		diffs = append(diffs, diff(string(rune('A'+i)), time.Minute, base, 1))
	}
	_, err := s.PushDiffs(ctx, &strategy.Batch{ID: "eb", Namespace: "ns", Diffs: diffs})
	require.NoError(t, err)
	n := 0
	for _, err := range s.GetCounters(ctx, strategy.Query{Namespace: "ns", Sizes: []time.Duration{time.Minute, time.Minute}, Now: base}) {
		require.NoError(t, err)
		if n++; n == 3 {
			break
		}
	}
	require.Zero(t, pool.Stat().AcquiredConns())
	// Duplicate sizes do not duplicate rows.
	n = 0
	for _, err := range s.GetCounters(ctx, strategy.Query{Namespace: "ns", Sizes: []time.Duration{time.Minute, time.Minute}, Now: base}) {
		require.NoError(t, err)
		n++
	}
	require.Equal(t, 50, n)
}

func TestErrorClassification(t *testing.T) {
	pgErr := func(severity, code string) error { return &pgconn.PgError{Severity: severity, Code: code} }
	live, dead := context.Background(), canceledContext()
	for _, c := range []struct {
		err                  error
		notApplied, retrying bool
	}{
		{&acquireError{errors.New("connection refused")}, true, false},
		{pgErr("ERROR", "42P01"), true, false},                  // undefined table: rolled back, retrying won't help
		{pgErr("ERROR", "40P01"), true, true},                   // deadlock detected: rolled back
		{pgErr("ERROR", "40001"), true, true},                   // serialization failure
		{pgErr("FATAL", "57P01"), false, true},                  // admin shutdown: may come after the commit
		{fmt.Errorf("x: %w", io.ErrUnexpectedEOF), false, true}, // connection lost after sending
		{&appliedError{pgErr("ERROR", "57014")}, false, true},   // a read after the batch was applied
	} {
		require.Equal(t, c.notApplied, notApplied(c.err), "%v", c.err)
		require.Equal(t, c.retrying, retryable(live, c.err), "%v", c.err)
		require.False(t, retryable(dead, c.err), "never once the context is done")
	}
}

func canceledContext() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}

// If the server ever returned the upserted rows in another order than it
// processed them, the identity check notices and the totals are read back.
func TestReturningOrderChecked(t *testing.T) {
	pool := newPool(t, testDSN(t))
	s := newStore(t, pool, Options{})
	const from = `SELECT 0::bigint, key, window_size, window_start, count FROM up`
	require.Contains(t, s.pushSQL, from)
	s.pushSQL = strings.Replace(s.pushSQL, from, `SELECT 0::bigint, key, window_size, window_start, count FROM (SELECT * FROM up ORDER BY key DESC) u`, 1)
	diffs := []strategy.Diff{diff("a", time.Second, base, 1), diff("b", time.Second, base, 2), diff("c", time.Second, base, 3)}
	b := &strategy.Batch{ID: "order", Namespace: "ns", Diffs: diffs, Reads: []strategy.CounterID{id("b", time.Second, base), id("z", time.Second, base)}}
	for range 2 {
		res, err := s.PushDiffs(context.Background(), b)
		require.NoError(t, err)
		require.Equal(t, []int64{1, 2, 3}, res.Totals)
		require.Equal(t, []int64{2, 0}, res.Reads)
	}
}
