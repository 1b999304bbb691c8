package postgres

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
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
	DefaultSetupTimeout     = 10 * time.Second
	DefaultMaxClockSkew     = time.Minute
	DefaultChangeRetention  = 2 * time.Minute
)

// maxIdentLen is PostgreSQL's identifier limit (NAMEDATALEN - 1); longer names
// are silently truncated by the server, which could make two names collide.
const maxIdentLen = 63

// ErrInvalidOptions is returned (wrapped) by New when a field of Options is
// invalid; the message names the field.
var ErrInvalidOptions = errors.New("postgres: invalid options")

// ErrInvalidPool is wrapped by New's error when the pool is configured so
// that calls could outlast their context's deadline (a context watcher
// handler with a DeadlineDelay); the error names the setting to change.
var ErrInvalidPool = errors.New("postgres: pool cannot bound its waits")

// Options configure a Store. The zero value of every field selects its
// documented default.
type Options struct {
	// Schema holds the store's tables and its function. Default: none, so
	// names resolve through the connection's search_path. The schema must
	// exist.
	Schema string
	// Table is the counters table. Default "rl_counters". The names of the
	// change log (Table + "_changes"), the token buckets (+ "_buckets"), the
	// sliding logs (+ "_logs") and the Take function (+ "_take_v3") derive
	// from it. Names are quoted, hence case-sensitive; Table is at most 55
	// bytes long, so that the derived names fit PostgreSQL's 63.
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
	// latest window its batch touched (start + 2*size) and after the buckets
	// it changed may be forgotten (strategy.BucketExpiry), as a margin for
	// clocks that disagree between nodes; a Take's decision is kept as much
	// longer than the memory store keeps it. A batch re-sent after its ID was
	// purged is applied again, but only to windows that are themselves
	// purged. Default 1 minute.
	BatchIDRetention time.Duration
	// Unlogged creates the counters table UNLOGGED (when New creates it),
	// and so the change log, the token buckets and the sliding logs: writes
	// skip the write-ahead log, but a server crash empties the tables, so
	// every limit restarts from zero, and standbys do not get them. The
	// batch table stays logged. Default false.
	Unlogged bool
	// MaxRetries is how many times a push or Take statement is re-sent at
	// once, under the same ID, after the connection broke or the server
	// reported a serialization failure or a deadlock. Default 2; negative
	// means never.
	MaxRetries int
	// SetupTimeout bounds New's work (connecting, checking for the store's
	// objects and creating them) when New's context has no deadline of its own or a
	// later one: a server that accepts connections and never answers makes
	// New fail after SetupTimeout rather than hang. Default 10 seconds.
	SetupTimeout time.Duration
	// MaxClockSkew is how far the nodes' clocks may be behind the database
	// server's. Purge never deletes a window that a node whose clock lags by
	// that much may still read or write (see Purge). Default 1 minute.
	MaxClockSkew time.Duration
	// ChangeRetention is how long the change log keeps a push's entries:
	// Purge replaces older ones by a marker, and a watch whose cursor is
	// older than the marker is answered with an Overflow (the node then
	// reads the counters it holds). Keep it above the longest time a node
	// goes without a successful sync. Default 2 minutes.
	ChangeRetention time.Duration
}

// Store is a strategy.Strategy on PostgreSQL. It is safe for concurrent use;
// it does not own the pool, and has nothing to close.
type Store struct {
	pool *pgxpool.Pool
	opts Options

	names // quoted, possibly schema-qualified

	pushSQL, pushUnguardedSQL, readSQL, getCountersSQL, getCountersKeysSQL, getWindowSQL, takeCallSQL string
	purge                                                                                             purgeSQL

	// lastPurge is the now of the latest purge that did real work, or noPurge.
	lastPurge atomic.Int64

	// purgePages is how many pages of a table without an expiry index one
	// purge statement covers: purgePages, or fewer in tests.
	purgePages int64

	// noGuard is a test hook: push without checking the batch ID, to prove
	// the lost-commit test fails without the guard.
	noGuard bool
}

const noPurge = math.MinInt64

var (
	_ strategy.Strategy = (*Store)(nil)
	_ strategy.Capable  = (*Store)(nil)
	_ strategy.Taker    = (*Store)(nil)
)

// Capabilities reports that the store implements every part of the
// contract: watches, token buckets and Take.
func (s *Store) Capabilities() strategy.Capabilities {
	return strategy.Capabilities{Watch: true, Buckets: true, Take: true}
}

// New returns a Store on pool, creating whatever of its tables, indexes and
// function is missing, and upgrading the tables of an earlier version in
// place (see the package documentation). Several nodes may call New at once:
// the creation runs in one transaction under an advisory lock derived from
// the table names (the one earlier versions took), so only one of them
// creates anything. When everything exists New creates nothing, so a role
// without CREATE privilege can use objects an administrator made. New
// returns by ctx's deadline or after Options.SetupTimeout, whichever comes
// first, even when the server accepts connections and never answers.
func New(ctx context.Context, pool *pgxpool.Pool, opts Options) (*Store, error) {
	if pool == nil {
		return nil, fmt.Errorf("%w: pool is nil", ErrInvalidOptions)
	}
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	if err := checkWatcher(pool); err != nil {
		return nil, err
	}
	s := &Store{pool: pool, opts: opts, names: makeNames(opts), purgePages: purgePages}
	s.buildSQL()
	s.lastPurge.Store(noPurge)
	// pgx honours the context in every step (dialling, the startup
	// handshake, the statements); a pool built with pgxpool's defaults has
	// no connect timeout, so without a deadline New could wait forever.
	ctx, cancel := context.WithTimeout(ctx, opts.SetupTimeout)
	defer cancel()
	if err := s.createSchema(ctx); err != nil {
		return nil, fmt.Errorf("postgres: create tables %s, %s and the objects beside them: %w", s.counters, s.batches, err)
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
	if err := checkIdent(o.Table, changesSuffix); err != nil {
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
		orDefault("SetupTimeout", &o.SetupTimeout, DefaultSetupTimeout),
		orDefault("MaxClockSkew", &o.MaxClockSkew, DefaultMaxClockSkew),
		orDefault("ChangeRetention", &o.ChangeRetention, DefaultChangeRetention),
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
