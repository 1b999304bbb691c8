// Package postgres is a strategy.Strategy backed by PostgreSQL through a pgx v5
// connection pool: the store for teams whose shared state already lives in the
// PostgreSQL they run (Kong's "cluster" strategy). It implements every part of
// the contract: window counters, watches, token buckets and Take
// (Capabilities).
//
// # Tables
//
// New creates what is missing of five tables and a function (names derive
// from Options.Table; the batch table's from Options.BatchTable):
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
//	    expires_at bigint NOT NULL,    -- Unix milliseconds
//	    allowed    boolean             -- a Take's decision; null for a batch
//	);
//	CREATE INDEX rl_counters_batches_expiry_idx ON rl_counters_batches (expires_at);
//
//	CREATE TABLE rl_counters_changes (  -- the change log, for watches
//	    window_size  bigint NOT NULL,
//	    window_start bigint NOT NULL,
//	    namespace    text COLLATE "C" NOT NULL,
//	    xid          bigint NOT NULL,    -- the writing transaction (xid8)
//	    keys         text[] COLLATE "C", -- null: a marker left by Purge
//	    logged_at    bigint NOT NULL     -- the server's clock, Unix milliseconds
//	);
//	CREATE INDEX ON rl_counters_changes (window_size, window_start, namespace, xid);
//	CREATE INDEX ON rl_counters_changes (logged_at) WHERE keys IS NOT NULL;
//
//	CREATE TABLE rl_counters_buckets (
//	    namespace text COLLATE "C" NOT NULL,
//	    key       text COLLATE "C" NOT NULL,
//	    period    bigint NOT NULL CHECK (period > 0),  -- milliseconds
//	    tat       double precision NOT NULL,           -- Unix milliseconds
//	    interval  double precision NOT NULL,           -- milliseconds per token
//	    ord       integer NOT NULL,  -- the row's position in the push that last wrote it
//	    PRIMARY KEY (period, namespace, key)
//	) WITH (fillfactor = 45);
//
//	CREATE TABLE rl_counters_logs (  -- sliding logs, for Take
//	    namespace   text COLLATE "C" NOT NULL,
//	    key         text COLLATE "C" NOT NULL,
//	    window_size bigint NOT NULL CHECK (window_size > 0),
//	    ats         bigint[] NOT NULL,          -- the entries' instants, oldest first
//	    costs       bigint[] NOT NULL,
//	    ids         text[] COLLATE "C" NOT NULL, -- the Takes that made them
//	    PRIMARY KEY (window_size, namespace, key)
//	) WITH (fillfactor = 45);
//
//	CREATE FUNCTION rl_counters_take_v3(...)  -- take.sql
//
// The primary key is the only index on the counters, so an upsert maintains
// one index. It serves GetCounters (one range per window size and start,
// narrowed by namespace and, when the fetch scope is "seen", by key) and
// Purge (per window size, the starts up to now - 2*size; the few distinct
// sizes are found by skipping through the index). The fill factor keeps more
// than half of each page free: a push updates every counter of a page once,
// and each new row version must fit in the same page for the update to be a
// HOT update (no index change). At 80 most updates of a large push were not
// HOT, and cost twice as much. The same holds for the buckets and the logs.
// The "C" collation makes key comparisons byte-wise, as in Go.
//
// Namespaces and keys are stored as they are when PostgreSQL can hold them
// as text; any other Go string (invalid UTF-8, a NUL byte) and any string
// starting with the byte 0x7f is stored as 0x7f followed by its base64url
// encoding. Every key is therefore valid: a client's raw bytes can never make
// a push fail.
//
// # Upgrading
//
// New checks that every object exists and, when one is missing, creates it
// in one transaction under an advisory lock derived from the table names
// (the lock earlier versions took), so nodes starting together, of this
// version or an earlier one, do not collide. Tables of an earlier version
// are upgraded in place: the batch table gains its allowed column (ALTER
// TABLE ... ADD COLUMN, which takes a brief exclusive lock on it), the other
// objects are created beside them; the counters and the batch IDs stay. When
// everything exists New creates nothing, so a role without CREATE privilege
// can use objects an administrator made (or that a privileged New created);
// such a role's New fails (SQLSTATE 42501) while something is missing.
//
// Nodes of an earlier version write counters without logging the change:
// during a rolling upgrade, a node of this version that watches does not
// learn what they change (until its next Overflow, or the window's end).
//
// # Pushes
//
// A push is one SQL statement in autocommit (one round trip): it inserts the
// batch ID into the batch table (ON CONFLICT DO NOTHING) and, only if that
// insert happened, upserts every diff from unnest'ed arrays (INSERT ... ON
// CONFLICT DO UPDATE SET count = count + EXCLUDED.count), returning the new
// totals, appends the keys it changed to the change log, applies the bucket
// diffs, and reads the counters and buckets the batch asks for and answers
// its watches. Rows are sorted by identity, so concurrent pushes lock shared
// rows in the same order and cannot deadlock. Because the batch ID is
// recorded in the same transaction as the increments, a batch re-sent after a
// lost reply is not applied again; the store then answers with the current
// values. Batches of more than Options.MaxPushRows diffs are sent as several
// such statements (Options.PushConcurrency at a time, on separate
// connections), each with its own ID derived from the batch ID, as
// strategy.Strategy allows; their watches are then answered by one more
// statement once every part is applied.
//
// # Watches
//
// A watch lists the counters of a window that changed since a cursor. Each
// push statement appends to the change log one row per window it changed:
// the keys, under the statement's transaction ID. A watch lists the keys of
// the rows from the cursor's transaction ID on, with their current totals;
// its next cursor is the xmin of the statement's snapshot, the oldest
// transaction still running when it looked. Transaction IDs are assigned at a
// transaction's first write, not in commit order: a cursor moved to the
// highest ID a watch saw would skip a write still in flight with a lower ID.
// From the xmin on, every write the watch did not see is listed next time
// (some are listed twice, which the contract allows). The batch's own
// counters are listed with the totals the batch returned; the node's own
// statement is left out of its next watch (the cursor names it).
//
// The change log is written by the push statement: the counters table keeps
// its one index, and its updates stay HOT (an index on a column the push
// changes, the transaction ID per counter, would make every update non-HOT:
// measured 1.8 times slower for a 1,000,000-row push). The log costs one row
// per window and push statement; BenchmarkChangeLogCost measures what it adds
// to a push.
//
// A cursor is valid on one incarnation of the tables: the server's system
// identifier, its timeline, its start time (an unlogged table may have been
// emptied by a crash) and the file nodes of the counters and the change log
// (changed by DROP and CREATE, TRUNCATE, VACUUM FULL). A cursor of another
// incarnation is answered with an Overflow, as is a cursor older than the
// change log's retention (Options.ChangeRetention: Purge replaces older
// entries by a marker). A transaction left open on the server that wrote
// something holds every cursor's xmin back: watches then list everything
// written since it began, up to their Limit.
//
// # Token buckets
//
// A bucket diff is applied in the push statement as strategy.ApplyBucket
// does, with the same double precision operations in the same order, so the
// store's TATs are the ones Go computes, to the bit (floats cross the wire as
// their IEEE 754 bits, whatever the protocol's format and the session's
// extra_float_digits). The diff's add and floor reach the upsert's conflict
// branch through the row's ord column. Two diffs of one bucket in a batch
// are refused (not applied): the contract allows one.
//
// # Take
//
// Take calls the store's function (take.sql) in one statement: it follows
// the memory store's take and internal/slidelog step by step. A
// transaction-level advisory lock on the key serialises the Takes of one key
// and its bucket and log rows are locked in primary-key order; pushes never
// wait for the advisory lock and purges skip locked rows, so nothing
// deadlocks. The decision is recorded in the batch table (allowed) under the
// Take's ID in the same transaction, so a re-sent Take is decided once, and
// kept as long as one of its limits may hold its cost (a minute at least)
// plus Options.BatchIDRetention. TestTakeMatchesMemory checks every answer
// against the memory store's.
//
// # Errors
//
// A push or Take error wraps strategy.ErrNotApplied when nothing can have
// been written: the context was done before sending, no connection could be
// acquired, pgx reports that the failure happened before anything was sent
// (pgconn.SafeToRetry, except for "conn closed", which pgx 5.12 also reports
// when a reply is lost in simple-protocol mode), the server answered the
// statement with an ERROR (its transaction was rolled back), or the request
// was invalid (a window size or period that is not a positive whole number
// of milliseconds, ErrInvalidTake). Any other error (connection lost or
// deadline passed after the statement was sent, a FATAL message) leaves the
// outcome unknown; re-sending the same batch or Take is safe. A pooled
// connection the server closed while it was idle looks like a lost reply, so
// the first push after a server restart may report an unknown outcome. The
// store itself re-sends a statement, under the same ID, at most
// Options.MaxRetries times when the connection broke or the server reported
// a serialization failure or a deadlock.
//
// # Server faults
//
// A connection whose session makes every write fail, because
// statement_timeout or default_transaction_read_only was set for the role or
// the database (or it reached a standby), is closed after the push that
// failed on it (SQLSTATE 57014, 25006), so the store recovers as soon as the
// setting is lifted instead of failing on the sessions it already holds. A
// statement_timeout shorter than a push of MaxPushRows rows needs makes every
// such push fail (not applied; the core keeps the hits): lower MaxPushRows or
// raise the timeout for the store's role. Tables (or the function) dropped
// under a running store (42P01, 42883) are created again by the push or Take
// that finds them gone, and it is re-sent; the counters they held are lost,
// as after a TRUNCATE, and every watch cursor overflows.
//
// # Waits
//
// Every call returns by its context's deadline, even when the server accepts
// connections and never answers: pgx honours the context while dialling,
// during the startup handshake, while waiting for a pooled connection and
// while waiting for a reply, whatever the pool's ConnectTimeout. New, whose
// context often has no deadline, also stops after Options.SetupTimeout. New
// refuses (ErrInvalidPool) a pool whose ConnConfig.BuildContextWatcherHandler
// builds one of pgx's handlers with a DeadlineDelay, which would keep every
// call waiting that long past its deadline; a handler of another type cannot
// be checked, and bounds the waits as it does.
//
// # Retention
//
// Purge deletes counters whose window is older than the previous one
// (window_start + 2*window_size <= cutoff) and their change log, batch IDs
// and Take decisions past their expiry (expires_at <= cutoff), buckets past
// strategy.BucketExpiry, sliding-log entries that left their window, and
// change-log entries older than Options.ChangeRetention (by the server's
// clock), in bounded statements that skip rows locked by another purger or a
// push, so every node may purge at once. The cutoff is the lesser of the now
// the caller passes and the database server's clock less
// Options.MaxClockSkew: a node whose clock runs a day ahead deletes nothing
// that a node on time, or lagging by up to MaxClockSkew, still reads or
// writes. The core's sync loop calls Purge (every cycle, or as its own
// Config.PurgeInterval says); the store does real work at most once per
// Options.PurgeInterval of the now it is given.
package postgres
