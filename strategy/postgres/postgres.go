// Package postgres is a strategy.Strategy backed by PostgreSQL through a pgx v5
// connection pool: the store for teams whose shared state already lives in the
// PostgreSQL they run (Kong's "cluster" strategy).
//
// # Tables
//
// New creates two tables if they are missing (names from Options):
//
//	CREATE TABLE rl_counters (
//	    namespace    text COLLATE "C" NOT NULL,
//	    key          text COLLATE "C" NOT NULL,
//	    window_size  bigint NOT NULL CHECK (window_size > 0),  -- milliseconds
//	    window_start bigint NOT NULL,                          -- Unix milliseconds
//	    count        bigint NOT NULL,
//	    PRIMARY KEY (window_size, window_start, namespace, key)
//	) WITH (fillfactor = 45);
//
//	CREATE TABLE rl_counters_batches (
//	    id         text COLLATE "C" PRIMARY KEY,
//	    expires_at bigint NOT NULL     -- Unix milliseconds
//	);
//	CREATE INDEX rl_counters_batches_expiry_idx ON rl_counters_batches (expires_at);
//
// The primary key is the only index on the counters, so an upsert maintains
// one index. It serves GetCounters (one range per window size and start,
// narrowed by namespace and, when the fetch scope is "seen", by key) and
// Purge (per window size, the starts up to now - 2*size; the few distinct
// sizes are found by skipping through the index). The fill factor keeps more
// than half of each page free: a push updates every counter of a page once,
// and each new row version must fit in the same page for the update to be a
// HOT update (no index change). At 80 most updates of a large push were not
// HOT, and cost twice as much. The "C" collation
// makes key comparisons byte-wise, as in Go.
//
// Namespaces and keys are stored as they are when PostgreSQL can hold them
// as text; any other Go string (invalid UTF-8, a NUL byte) and any string
// starting with the byte 0x7f is stored as 0x7f followed by its base64url
// encoding. Every key is therefore valid: a client's raw bytes can never make
// a push fail.
//
// # Pushes
//
// A push is one SQL statement in autocommit (one round trip): it inserts the
// batch ID into the batch table (ON CONFLICT DO NOTHING) and, only if that
// insert happened, upserts every diff from unnest'ed arrays (INSERT ... ON
// CONFLICT DO UPDATE SET count = count + EXCLUDED.count), returning the new
// totals, and reads the counters the batch asks for. Rows are sorted by
// counter identity, so concurrent pushes lock shared rows in the same order
// and cannot deadlock. Because the batch ID is recorded in the same
// transaction as the increments, a batch re-sent after a lost reply is not
// applied again; the store then answers with the current totals. Batches of
// more than Options.MaxPushRows diffs are sent as several such statements
// (Options.PushConcurrency at a time, on separate connections), each with its
// own ID derived from the batch ID, as strategy.Strategy allows.
//
// # Errors
//
// A push error wraps strategy.ErrNotApplied when nothing can have been
// written: the context was done before sending, no connection could be
// acquired, pgx reports that the failure happened before anything was sent
// (pgconn.SafeToRetry, except for "conn closed", which pgx 5.12 also reports
// when a reply is lost in simple-protocol mode), the server answered the statement with an ERROR (its
// transaction was rolled back), or the batch named a window size that is not
// a positive whole number of milliseconds. Any other error (connection lost
// or deadline passed after the statement was sent, a FATAL message) leaves the
// outcome unknown; re-sending the same batch is safe. A pooled connection the
// server closed while it was idle looks like a lost reply, so the first push
// after a server restart may report an unknown outcome. The store itself
// re-sends a statement, under the same ID, at most Options.MaxRetries times
// when the connection broke or the server reported a serialization failure
// or a deadlock.
//
// # Retention
//
// Purge deletes counters whose window is older than the previous one
// (window_start + 2*window_size <= now) and batch IDs past their expiry, in
// bounded DELETE statements that skip rows locked by another purger, so every
// node may purge at once. The core's sync loop calls Purge (every cycle, or as
// its own Config.PurgeInterval says); the store does real work at most once
// per Options.PurgeInterval of the now it is given.
package postgres

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ratesync/ratelimit/strategy"
)

// Defaults of Options' zero-valued fields.
const (
	DefaultTable            = "rl_counters"
	DefaultPurgeInterval    = 30 * time.Second
	DefaultPurgeBatchSize   = 5000
	DefaultMaxPushRows      = 10000
	DefaultPushConcurrency  = 2
	DefaultBatchIDRetention = time.Minute
	DefaultMaxRetries       = 2
)

// maxIdentLen is PostgreSQL's identifier limit (NAMEDATALEN - 1); longer names
// are silently truncated by the server, which could make two names collide.
const maxIdentLen = 63

// ErrInvalidOptions is wrapped by New's errors about Options.
var ErrInvalidOptions = errors.New("postgres: invalid options")

// Options configure a Store. The zero value of every field selects its
// documented default.
type Options struct {
	// Schema holds both tables. Default: none, so names resolve through the
	// connection's search_path. The schema must exist.
	Schema string
	// Table is the counters table. Default "rl_counters". Names are quoted,
	// hence case-sensitive, and at most 63 bytes long.
	Table string
	// BatchTable records the IDs of applied batches. Default Table +
	// "_batches". At most 52 bytes, to leave room for its index's suffix
	// "_expiry_idx".
	BatchTable string

	// PurgeInterval is the least time, measured on the now passed to Purge,
	// between two purges that do real work; calls in between return nil at
	// once, so a caller may call Purge every sync cycle. The core's sync loop
	// also spaces its calls by its own Config.PurgeInterval (default 1
	// minute); a shorter interval here lets every one of those calls run.
	// Default 30 seconds.
	PurgeInterval time.Duration
	// PurgeBatchSize is how many rows one DELETE statement removes; Purge
	// repeats it until a statement removes fewer. Default 5000.
	PurgeBatchSize int

	// MaxPushRows is the most diffs (and, separately, reads) sent in one
	// statement; a larger batch is sent as several statements, each applied
	// exactly once under an ID derived from the batch ID. Default 10000.
	MaxPushRows int
	// PushConcurrency is how many statements of one push run at once, each
	// on its own pooled connection. Default 2; 1 sends them one by one.
	PushConcurrency int
	// BatchIDRetention is how long a batch ID is kept after the end of the
	// latest window its batch touched (start + 2*size), as a margin for clocks
	// that disagree between nodes. A batch re-sent after its ID was purged is
	// applied again, but only to windows that are themselves purged. Default
	// 1 minute.
	BatchIDRetention time.Duration
	// Unlogged creates the counters table UNLOGGED (when New creates it):
	// writes skip the write-ahead log, but a server crash empties the table,
	// so every limit restarts from zero, and standbys do not get the
	// counters. The batch table stays logged. Default false.
	Unlogged bool
	// MaxRetries is how many times a push statement is re-sent at once, under
	// the same ID, after the connection broke or the server reported a
	// serialization failure or a deadlock. Default 2; negative means never.
	MaxRetries int
}

// Store is a strategy.Strategy on PostgreSQL. It is safe for concurrent use;
// it does not own the pool, and has nothing to close.
type Store struct {
	pool *pgxpool.Pool
	opts Options

	counters string // quoted, possibly schema-qualified, table names
	batches  string

	pushSQL, pushUnguardedSQL, readSQL, getCountersSQL, getCountersKeysSQL, getWindowSQL string
	purgeSizesSQL, purgeCountersSQL, purgeBatchesSQL                                     string

	// lastPurge is the now of the latest purge that did real work, or noPurge.
	lastPurge atomic.Int64

	// noGuard is a test hook: push without checking the batch ID, to prove
	// the lost-commit test fails without the guard.
	noGuard bool
}

const noPurge = math.MinInt64

var _ strategy.Strategy = (*Store)(nil)

// New returns a Store on pool, creating its tables and indexes if they are
// missing. Several nodes may call New at once: the creation runs in a
// transaction holding a transaction-level advisory lock derived from the table
// names, so only one of them creates anything. When both tables already exist
// New creates nothing, so a role without CREATE privilege can use tables an
// administrator made.
func New(ctx context.Context, pool *pgxpool.Pool, opts Options) (*Store, error) {
	if pool == nil {
		return nil, fmt.Errorf("%w: pool is nil", ErrInvalidOptions)
	}
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	s := &Store{pool: pool, opts: opts}
	s.counters = qualify(opts.Schema, opts.Table)
	s.batches = qualify(opts.Schema, opts.BatchTable)
	s.buildSQL()
	s.lastPurge.Store(noPurge)
	if err := s.createSchema(ctx); err != nil {
		return nil, fmt.Errorf("postgres: create tables %s, %s: %w", s.counters, s.batches, err)
	}
	return s, nil
}

// orDefault sets *v to def when it is zero; a negative *v is an error that
// names field.
func orDefault[T int | time.Duration](field string, v *T, def T) error {
	if *v < 0 {
		return fmt.Errorf("%w: %s: negative (%v)", ErrInvalidOptions, field, *v)
	}
	if *v == 0 {
		*v = def
	}
	return nil
}

func (o Options) withDefaults() (Options, error) {
	bad := func(field, format string, args ...any) (Options, error) {
		return Options{}, fmt.Errorf("%w: %s: %s", ErrInvalidOptions, field, fmt.Sprintf(format, args...))
	}
	if o.Table == "" {
		o.Table = DefaultTable
	}
	batchField := "BatchTable"
	if o.BatchTable == "" {
		o.BatchTable = o.Table + "_batches"
		batchField = "Table" // the derived name is too long only because of Table
	}
	if o.Schema != "" {
		if err := checkIdent(o.Schema, ""); err != nil {
			return bad("Schema", "%v", err)
		}
	}
	if err := checkIdent(o.Table, ""); err != nil {
		return bad("Table", "%v", err)
	}
	if err := checkIdent(o.BatchTable, expirySuffix); err != nil {
		return bad(batchField, "%v (BatchTable %q)", err, o.BatchTable)
	}
	if o.Table == o.BatchTable {
		return bad("BatchTable", "must differ from Table %q", o.Table)
	}
	for _, err := range []error{
		orDefault("PurgeInterval", &o.PurgeInterval, DefaultPurgeInterval),
		orDefault("PurgeBatchSize", &o.PurgeBatchSize, DefaultPurgeBatchSize),
		orDefault("MaxPushRows", &o.MaxPushRows, DefaultMaxPushRows),
		orDefault("PushConcurrency", &o.PushConcurrency, DefaultPushConcurrency),
		orDefault("BatchIDRetention", &o.BatchIDRetention, DefaultBatchIDRetention),
	} {
		if err != nil {
			return Options{}, err
		}
	}
	switch {
	case o.MaxRetries < 0:
		o.MaxRetries = 0
	case o.MaxRetries == 0:
		o.MaxRetries = DefaultMaxRetries
	}
	return o, nil
}

const expirySuffix = "_expiry_idx"

// checkIdent accepts any name PostgreSQL can hold once quoted: valid UTF-8,
// no NUL, and short enough (with suffix) not to be truncated.
func checkIdent(name, suffix string) error {
	switch {
	case !utf8.ValidString(name) || strings.IndexByte(name, 0) >= 0:
		return fmt.Errorf("%q is not valid UTF-8 or contains NUL", name)
	case len(name)+len(suffix) > maxIdentLen:
		return fmt.Errorf("%q is longer than %d bytes", name, maxIdentLen-len(suffix))
	}
	return nil
}

func qualify(schema, name string) string {
	if schema == "" {
		return pgx.Identifier{name}.Sanitize()
	}
	return pgx.Identifier{schema, name}.Sanitize()
}

// Options returns the store's options with defaults filled in.
func (s *Store) Options() Options { return s.opts }

func (s *Store) createSchema(ctx context.Context) error {
	var exists bool
	err := s.pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL AND to_regclass($2) IS NOT NULL`,
		s.counters, s.batches).Scan(&exists)
	if err != nil || exists {
		return err
	}
	h := fnv.New64a()
	h.Write([]byte("github.com/ratesync/ratelimit/strategy/postgres\x00" + s.counters + "\x00" + s.batches))
	lockKey := int64(h.Sum64())

	unlogged := ""
	if s.opts.Unlogged {
		unlogged = "UNLOGGED "
	}
	batchIdx := pgx.Identifier{s.opts.BatchTable + expirySuffix}.Sanitize()
	ddl := []string{
		`CREATE ` + unlogged + `TABLE IF NOT EXISTS ` + s.counters + ` (
			namespace    text COLLATE "C" NOT NULL,
			key          text COLLATE "C" NOT NULL,
			window_size  bigint NOT NULL CHECK (window_size > 0),
			window_start bigint NOT NULL,
			count        bigint NOT NULL,
			PRIMARY KEY (window_size, window_start, namespace, key)
		) WITH (fillfactor = 45)`,
		`CREATE TABLE IF NOT EXISTS ` + s.batches + ` (
			id         text COLLATE "C" PRIMARY KEY,
			expires_at bigint NOT NULL
		)`,
		`CREATE INDEX IF NOT EXISTS ` + batchIdx + ` ON ` + s.batches + ` (expires_at)`,
	}
	// CREATE ... IF NOT EXISTS alone is not enough when nodes start together:
	// two concurrent creations can both pass the existence check and one then
	// fails on a unique violation in pg_type. The advisory lock serialises
	// them; it is released with the transaction.
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, lockKey); err != nil {
			return err
		}
		for _, q := range ddl {
			if _, err := tx.Exec(ctx, q); err != nil {
				return err
			}
		}
		return nil
	})
}

func (s *Store) buildSQL() {
	c, b := s.counters, s.batches
	// $1 batch ID, $2 its expiry, $3 namespace, $4-$7 diffs sorted by
	// identity, $8-$10 reads. The upsert runs only when the batch ID was new
	// (EXISTS over the RETURNING of its insert). The arrays are unnested in
	// the select list (a streaming ProjectSet, in array order, with no
	// materialisation and no join that could reorder rows), so the upsert
	// locks rows in the global order that prevents deadlocks; it returns
	// the new totals in that order with their identity, which the client
	// checks. Each read is one primary-key lookup (a scalar subquery, whatever
	// the planner thinks of the table's size).
	const push = `WITH b AS (
	%[2]s
), up AS (
	INSERT INTO %[1]s AS t (namespace, key, window_size, window_start, count)
	SELECT $3, unnest($4::text[]), unnest($5::bigint[]), unnest($6::bigint[]), unnest($7::bigint[])
	WHERE %[3]s
	ON CONFLICT (window_size, window_start, namespace, key)
	DO UPDATE SET count = t.count + EXCLUDED.count
	RETURNING t.key, t.window_size, t.window_start, t.count
)
SELECT key, window_size, window_start, count FROM up
UNION ALL
SELECT NULL, NULL, r.ord, COALESCE((
	SELECT count FROM %[1]s
	WHERE window_size = r.window_size AND window_start = r.window_start AND namespace = $3 AND key = r.key), 0)
FROM (SELECT unnest($8::text[]) AS key, unnest($9::bigint[]) AS window_size, unnest($10::bigint[]) AS window_start,
	generate_series(1, cardinality($8::text[])) AS ord) r`
	s.pushSQL = fmt.Sprintf(push, c,
		`INSERT INTO `+b+` (id, expires_at) VALUES ($1, $2) ON CONFLICT (id) DO NOTHING RETURNING 1`,
		`EXISTS (SELECT 1 FROM b)`)
	// The unguarded form neither records nor checks the ID: for batches
	// without an ID, and for the test that proves the guard matters.
	s.pushUnguardedSQL = fmt.Sprintf(push, c, `SELECT $1::text, $2::bigint`, `true`)

	s.readSQL = `SELECT r.ord, COALESCE((
	SELECT count FROM ` + c + `
	WHERE window_size = r.window_size AND window_start = r.window_start AND namespace = $1 AND key = r.key), 0)
FROM (SELECT unnest($2::text[]) AS key, unnest($3::bigint[]) AS window_size, unnest($4::bigint[]) AS window_start,
	generate_series(1, cardinality($2::text[])) AS ord) r`

	// One primary-key range per (size, start) pair.
	const get = `SELECT c.key, c.window_size, c.window_start, c.count
FROM unnest($2::bigint[], $3::bigint[]) AS w(window_size, window_start)
JOIN %s c ON c.window_size = w.window_size AND c.window_start = w.window_start AND c.namespace = $1`
	s.getCountersSQL = fmt.Sprintf(get, c)
	s.getCountersKeysSQL = fmt.Sprintf(get, c) + ` AND c.key = ANY($4::text[])`

	s.getWindowSQL = `SELECT count FROM ` + c + ` WHERE window_size = $1 AND window_start = $2 AND namespace = $3 AND key = $4`

	// The distinct window sizes, by skipping through the primary key.
	s.purgeSizesSQL = `WITH RECURSIVE s(size) AS (
	SELECT min(window_size) FROM ` + c + `
	UNION ALL
	SELECT (SELECT min(window_size) FROM ` + c + ` WHERE window_size > s.size) FROM s WHERE s.size IS NOT NULL
) SELECT size FROM s WHERE size IS NOT NULL`
	// ctid = ANY(ARRAY(...)) plans as a TID scan; SKIP LOCKED lets several
	// purgers split the work instead of queueing behind one another.
	s.purgeCountersSQL = `DELETE FROM ` + c + ` WHERE ctid = ANY(ARRAY(
	SELECT ctid FROM ` + c + ` WHERE window_size = $1 AND window_start <= $2
	LIMIT $3 FOR UPDATE SKIP LOCKED))`
	s.purgeBatchesSQL = `DELETE FROM ` + b + ` WHERE ctid = ANY(ARRAY(
	SELECT ctid FROM ` + b + ` WHERE expires_at <= $1
	LIMIT $2 FOR UPDATE SKIP LOCKED))`
}

// escape starts the stored form of a namespace or key that PostgreSQL cannot
// hold as text (not valid UTF-8, or containing NUL) or that itself starts with
// escape: escape followed by the base64url encoding of its bytes. The mapping
// is injective, so any Go string is a valid key, and keys from clients (a
// header's raw bytes, say) can never make a push fail.
const escape = "\x7f"

func encodeText(s string) string {
	if utf8.ValidString(s) && strings.IndexByte(s, 0) < 0 && !strings.HasPrefix(s, escape) {
		return s
	}
	return escape + base64.RawURLEncoding.EncodeToString([]byte(s))
}

func decodeText(s string) (string, error) {
	if !strings.HasPrefix(s, escape) {
		return s, nil
	}
	b, err := base64.RawURLEncoding.DecodeString(s[len(escape):])
	if err != nil {
		return "", fmt.Errorf("stored key %q: %w", s, err)
	}
	return string(b), nil
}
