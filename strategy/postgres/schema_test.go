package postgres

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit/strategy"
)

// takeSQLHash is the hash of the take function's text at the version
// takeSuffix names. New creates the function only when it is missing, so a
// deployment keeps the body of a version forever: a change to the function
// needs a new version (and this hash updated).
const takeSQLHash = "4456732b8b8c946fb647d3d7764bf1284e4a6c2b70db07f9c5e655d451aa5514"

func TestTakeFunctionVersioned(t *testing.T) {
	o, err := Options{}.withDefaults()
	require.NoError(t, err)
	s := &Store{opts: o, names: makeNames(o)}
	sum := sha256.Sum256([]byte(s.takeFunctionSQL()))
	require.Equal(t, takeSQLHash, hex.EncodeToString(sum[:]),
		"the take function changed: give it a new version (takeSuffix) and update takeSQLHash")
}

// oldLayout creates the tables of the version before watches, buckets and
// Take (as that version's New did), with a counter and a batch ID in them.
func oldLayout(t *testing.T, pool *pgxpool.Pool, table string) {
	t.Helper()
	ctx := context.Background()
	c, b := pgx.Identifier{table}.Sanitize(), pgx.Identifier{table + "_batches"}.Sanitize()
	for _, q := range []string{
		`CREATE TABLE ` + c + ` (
			namespace    text COLLATE "C" NOT NULL,
			key          text COLLATE "C" NOT NULL,
			window_size  bigint NOT NULL CHECK (window_size > 0),
			window_start bigint NOT NULL,
			count        bigint NOT NULL,
			PRIMARY KEY (window_size, window_start, namespace, key)
		) WITH (fillfactor = 45)`,
		`CREATE TABLE ` + b + ` (id text COLLATE "C" PRIMARY KEY, expires_at bigint NOT NULL)`,
		`CREATE INDEX ` + pgx.Identifier{table + "_batches_expiry_idx"}.Sanitize() + ` ON ` + b + ` (expires_at)`,
		`INSERT INTO ` + c + ` VALUES ('ns', 'k', 60000, ` + fmt.Sprint(base) + `, 7)`,
		`INSERT INTO ` + b + ` VALUES ('old-batch', ` + fmt.Sprint(base+10*60_000) + `)`,
	} {
		_, err := pool.Exec(ctx, q)
		require.NoError(t, err)
	}
}

// New upgrades the tables of the previous version in place (nodes starting
// together, each with its own pool): the counters and the batch IDs stay,
// the batch table gains its column, the new objects are created, and every
// capability works on them.
func TestNewUpgradesOldTables(t *testing.T) {
	dsn := testDSN(t)
	pools := make([]*pgxpool.Pool, 6)
	for i := range pools {
		pools[i] = newPool(t, dsn)
		require.NoError(t, pools[i].Ping(context.Background()))
	}
	table := uniqueTable(t)
	oldLayout(t, pools[0], table)
	start := make(chan struct{})
	errs := make(chan error, len(pools))
	stores := make([]*Store, len(pools))
	for i, pool := range pools {
		go func() {
			<-start
			var err error
			stores[i], err = New(context.Background(), pool, Options{Table: table})
			errs <- err
		}()
	}
	close(start)
	for range pools {
		require.NoError(t, <-errs)
	}
	s := stores[0]
	ctx := context.Background()
	n, err := s.GetWindow(ctx, "ns", id("k", time.Minute, base))
	require.NoError(t, err)
	require.Equal(t, int64(7), n, "the counters are kept")
	res, err := s.PushDiffs(ctx, &strategy.Batch{ID: "old-batch", Namespace: "ns", Diffs: []strategy.Diff{diff("k", time.Minute, base, 1)}})
	require.NoError(t, err)
	require.Equal(t, []int64{7}, res.Totals, "a batch applied by the old version is not applied again")
	require.Equal(t, int64(1), rowCount(t, pools[0], table+"_batches", "id = 'old-batch' AND allowed IS NULL"))

	c := watchOnce(t, s, "ns", "", 10, diff("j", time.Minute, base, 2))
	require.Equal(t, map[string]int64{"k": 7, "j": 2}, listed(c))
	tr, err := s.Take(ctx, &strategy.Take{ID: "t", Namespace: "ns", Key: "k", Now: base, Cost: 1,
		Buckets: []strategy.TakeBucket{{Period: time.Second, Interval: 10, Burst: 1}}, Logs: []strategy.TakeLog{{Window: time.Second, Max: 1}}})
	require.NoError(t, err)
	require.True(t, tr.Allowed)

	// Everything exists: New creates nothing more.
	for _, pool := range pools {
		_, err := New(ctx, pool, Options{Table: table})
		require.NoError(t, err)
	}
}

// A role without the right to create can use objects an administrator made
// (New creates nothing when everything exists), and New tells such a role
// what it could not create when something is missing (the tables of an
// earlier version, not upgraded yet).
func TestNewWithoutCreatePrivilege(t *testing.T) {
	dsn := testDSN(t)
	admin := newPool(t, dsn)
	ctx := context.Background()
	role := uniqueTable(t) + "_role"
	ident := pgx.Identifier{role}.Sanitize()
	_, err := admin.Exec(ctx, `CREATE ROLE `+ident+` LOGIN`)
	require.NoError(t, err)
	t.Cleanup(func() {
		for _, q := range []string{`DROP OWNED BY ` + ident, `DROP ROLE ` + ident} {
			_, err := admin.Exec(context.Background(), q)
			require.NoError(t, err)
		}
	})
	ready, old := uniqueTable(t), uniqueTable(t)
	s := newStore(t, admin, Options{Table: ready})
	oldLayout(t, admin, old)
	grant := func(n names) {
		for _, q := range []string{
			`GRANT USAGE ON SCHEMA public TO ` + ident,
			`GRANT SELECT, INSERT, UPDATE, DELETE ON ` + n.counters + `, ` + n.batches + ` TO ` + ident,
		} {
			_, err := admin.Exec(ctx, q)
			require.NoError(t, err)
		}
	}
	grant(s.names)
	for _, q := range []string{
		`GRANT SELECT, INSERT, UPDATE, DELETE ON ` + s.changes + `, ` + s.buckets + `, ` + s.logs + ` TO ` + ident,
		`GRANT EXECUTE ON FUNCTION ` + s.takeFn + `(` + strings.Join(takeArgs, ", ") + `) TO ` + ident,
	} {
		_, err := admin.Exec(ctx, q)
		require.NoError(t, err)
	}
	grant(makeNames(Options{Table: old, BatchTable: old + "_batches"}))

	user := newPool(t, dsn, func(c *pgxpool.Config) { c.ConnConfig.User = role })
	us, err := New(ctx, user, Options{Table: ready})
	require.NoError(t, err)
	c := watchOnce(t, us, "ns", "", 10, diff("a", time.Minute, base, 1))
	require.Equal(t, map[string]int64{"a": 1}, listed(c))
	_, err = us.Take(ctx, &strategy.Take{ID: "t", Namespace: "ns", Key: "k", Now: base, Cost: 1,
		Buckets: []strategy.TakeBucket{{Period: time.Second, Interval: 10, Burst: 1}}})
	require.NoError(t, err)

	_, err = New(ctx, user, Options{Table: old})
	var pe *pgconn.PgError
	require.ErrorAs(t, err, &pe)
	require.Equal(t, "42501", pe.Code, "insufficient privilege: %v", err)
	require.Contains(t, err.Error(), old, "the error names the tables")
}
