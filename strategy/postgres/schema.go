package postgres

import (
	"context"
	_ "embed"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/ratesync/ratelimit/strategy"
)

// Suffixes of the names derived from Options.Table.
const (
	changesSuffix = "_changes" // the longest: Options.Table leaves room for it
	bucketsSuffix = "_buckets"
	logsSuffix    = "_logs"
	takeSuffix    = "_take_v3" // a new version with every change of take.sql (TestTakeFunctionVersioned)
)

// fillFactor keeps more than half of each page of the tables that pushes
// update free, so that an update's new row version fits in its page: a HOT
// update, which changes no index (see the package documentation).
const fillFactor = "45"

// names are the store's objects, quoted and schema-qualified as SQL needs
// them.
type names struct {
	counters, batches, changes, buckets, logs, takeFn string
}

func makeNames(o Options) names {
	return names{
		counters: qualify(o.Schema, o.Table),
		batches:  qualify(o.Schema, o.BatchTable),
		changes:  qualify(o.Schema, o.Table+changesSuffix),
		buckets:  qualify(o.Schema, o.Table+bucketsSuffix),
		logs:     qualify(o.Schema, o.Table+logsSuffix),
		takeFn:   qualify(o.Schema, o.Table+takeSuffix),
	}
}

// takeArgs are the take function's argument types, in order: its identity
// for to_regprocedure.
var takeArgs = []string{"text", "text", "text", "bigint", "bigint", "boolean", "boolean", "integer",
	"bigint[]", "double precision[]", "bigint[]", "boolean[]", "bigint[]", "bigint[]", "boolean[]", "bigint"}

//go:embed take.sql
var takeSQL string

// missing says which of the store's objects do not exist.
type missing struct {
	counters, batches, allowed, batchIndex, changes, buckets, logs, takeFn bool
}

func (m missing) any() bool {
	return m.counters || m.batches || m.allowed || m.batchIndex || m.changes || m.buckets || m.logs || m.takeFn
}

// findMissing looks the store's objects up.
func (s *Store) findMissing(ctx context.Context, q queryer) (missing, error) {
	n := s.names
	r, err := q.Query(ctx, `SELECT to_regclass($1) IS NULL, to_regclass($2) IS NULL,
	NOT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass($2) AND attname = 'allowed' AND NOT attisdropped),
	to_regclass($3) IS NULL, to_regclass($4) IS NULL, to_regclass($5) IS NULL, to_regclass($6) IS NULL,
	to_regprocedure($7) IS NULL`,
		n.counters, n.batches, qualify(s.opts.Schema, s.opts.BatchTable+expirySuffix), n.changes, n.buckets, n.logs,
		n.takeFn+"("+strings.Join(takeArgs, ",")+")")
	if err != nil {
		return missing{}, err
	}
	var m missing
	_, err = pgx.ForEachRow(r, []any{&m.counters, &m.batches, &m.allowed, &m.batchIndex, &m.changes, &m.buckets, &m.logs, &m.takeFn}, func() error { return nil })
	return m, err
}

// createSchema creates whatever of the store's objects is missing, and
// upgrades tables an earlier version created (the batch table's allowed
// column). It runs no statement on an object that exists: a role without
// CREATE privilege can use objects an administrator made, and fails only on
// one that is missing. Creation runs in one transaction under an advisory
// lock derived from the table names, so nodes starting together (of this
// version or an earlier one) do not collide.
func (s *Store) createSchema(ctx context.Context) error {
	if m, err := s.findMissing(ctx, s.pool); err != nil || !m.any() {
		return err
	}
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	// CREATE ... IF NOT EXISTS alone is not enough when nodes start
	// together: two concurrent creations can both pass the existence check
	// and one then fails on a unique violation in pg_type. An advisory lock
	// serialises them. It is a session lock, taken before the transaction
	// begins: a transaction begun after it reads the catalog as the previous
	// holder left it (within a transaction that began earlier, to_regclass
	// may answer from a catalog cache that has not seen that commit). It
	// conflicts with the transaction-level lock earlier versions took on the
	// same key.
	key := s.lockKey()
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock($1)`, key); err != nil {
		return err
	}
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		m, err := s.findMissing(ctx, tx)
		if err != nil {
			return err
		}
		for _, q := range s.ddl(m) {
			if _, err := tx.Exec(ctx, q); err != nil {
				return fmt.Errorf("%s: %w", firstLine(q), err)
			}
		}
		return nil
	})
	if _, uerr := conn.Exec(ctx, `SELECT pg_advisory_unlock($1)`, key); uerr != nil {
		// Closing the session releases the lock.
		_ = conn.Conn().Close(ctx)
	}
	return err
}

// lockKey is the advisory lock key under which createSchema runs.
func (s *Store) lockKey() int64 {
	h := fnv.New64a()
	h.Write([]byte("github.com/ratesync/ratelimit/strategy/postgres\x00" + s.counters + "\x00" + s.batches))
	return int64(h.Sum64())
}

// takeLockSeed seeds the hash of the advisory lock a Take holds on its key,
// so that stores on other tables lock other keys.
func (s *Store) takeLockSeed() int64 { return s.lockKey() ^ 0x5a17 }

// ddl returns the statements that create the objects m says are missing.
// The change log's indexes are named by the server (a name derived from the
// table's could exceed PostgreSQL's identifier limit); so are the primary
// keys.
func (s *Store) ddl(m missing) []string {
	n, o := s.names, s.opts
	unlogged := ""
	if o.Unlogged {
		unlogged = "UNLOGGED "
	}
	var q []string
	add := func(cond bool, stmts ...string) {
		if cond {
			q = append(q, stmts...)
		}
	}
	add(m.counters, `CREATE `+unlogged+`TABLE `+n.counters+` (
			namespace    text COLLATE "C" NOT NULL,
			key          text COLLATE "C" NOT NULL,
			window_size  bigint NOT NULL CHECK (window_size > 0),
			window_start bigint NOT NULL,
			count        bigint NOT NULL,
			PRIMARY KEY (window_size, window_start, namespace, key)
		) WITH (fillfactor = `+fillFactor+`)`)
	add(m.batches, `CREATE TABLE `+n.batches+` (
			id         text COLLATE "C" PRIMARY KEY,
			expires_at bigint NOT NULL,
			allowed    boolean
		)`)
	// Tables of earlier versions have no decisions of Takes.
	add(m.allowed && !m.batches, `ALTER TABLE `+n.batches+` ADD COLUMN allowed boolean`)
	add(m.batchIndex, `CREATE INDEX `+pgx.Identifier{o.BatchTable + expirySuffix}.Sanitize()+` ON `+n.batches+` (expires_at)`)
	add(m.changes, `CREATE `+unlogged+`TABLE `+n.changes+` (
			window_size  bigint NOT NULL,
			window_start bigint NOT NULL,
			namespace    text COLLATE "C" NOT NULL,
			xid          bigint NOT NULL,
			keys         text[] COLLATE "C",
			logged_at    bigint NOT NULL
		)`,
		`CREATE INDEX ON `+n.changes+` (window_size, window_start, namespace, xid)`,
		`CREATE INDEX ON `+n.changes+` (logged_at) WHERE keys IS NOT NULL`)
	add(m.buckets, `CREATE `+unlogged+`TABLE `+n.buckets+` (
			namespace text COLLATE "C" NOT NULL,
			key       text COLLATE "C" NOT NULL,
			period    bigint NOT NULL CHECK (period > 0),
			tat       double precision NOT NULL,
			interval  double precision NOT NULL,
			ord       integer NOT NULL,
			PRIMARY KEY (period, namespace, key)
		) WITH (fillfactor = `+fillFactor+`)`)
	add(m.logs, `CREATE `+unlogged+`TABLE `+n.logs+` (
			namespace   text COLLATE "C" NOT NULL,
			key         text COLLATE "C" NOT NULL,
			window_size bigint NOT NULL CHECK (window_size > 0),
			ats         bigint[] NOT NULL,
			costs       bigint[] NOT NULL,
			ids         text[] COLLATE "C" NOT NULL,
			PRIMARY KEY (window_size, namespace, key)
		) WITH (fillfactor = `+fillFactor+`)`)
	add(m.takeFn, s.takeFunctionSQL())
	return q
}

// takeFunctionSQL returns the CREATE FUNCTION statement of take.sql with the
// store's names and the bucket model's constants filled in.
func (s *Store) takeFunctionSQL() string {
	return strings.NewReplacer(
		"{{fn}}", s.names.takeFn,
		"{{buckets}}", s.names.buckets,
		"{{logs}}", s.names.logs,
		"{{batches}}", s.names.batches,
		"{{seed}}", strconv.FormatInt(s.takeLockSeed(), 10),
		"{{retention}}", strconv.FormatInt(strategy.BucketRetention.Milliseconds(), 10),
		"{{take_record_min}}", strconv.FormatInt(takeRecordMin.Milliseconds(), 10),
		"{{apply}}", applyBucketSQL("t.tat", "t.interval", "p_intervals[i]", "v_add", "v_floor", "v_n"),
		"{{convert}}", convertTATSQL("v_tat", "v_iv", "p_intervals[i]", "v_n"),
		"{{bits_tat}}", float8BitsSQL("v_tat"),
		"{{ceil_tat}}", ceilMillisSQL("v_tat"),
		"{{bits_iv}}", float8BitsSQL("v_iv"),
	).Replace(takeSQL)
}

func firstLine(q string) string {
	q = strings.TrimSpace(q)
	if i := strings.IndexByte(q, '\n'); i >= 0 {
		q = q[:i]
	}
	return q
}
