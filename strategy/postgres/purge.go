package postgres

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// Purge deletes the counters whose window is older than the previous window at
// the cutoff (window_start + 2*window_size <= cutoff), the change log of those
// windows, the batch IDs and Take decisions that expired by the cutoff, the
// token buckets that have been full long enough (strategy.BucketExpiry) and
// the sliding-log entries that left their window, and trims the change log
// of live windows to Options.ChangeRetention. It works in statements of at
// most Options.PurgeBatchSize rows (or, for buckets and sliding logs, which no
// index orders by expiry, a range of the table's pages) that skip rows
// another purger or a push holds. It does real work at most once per
// Options.PurgeInterval of now (and at once when now goes backwards by more
// than that); other calls, including concurrent ones, return nil at once. A
// failed purge is retried by the next call.
//
// The cutoff is the lesser of now and the database server's clock less
// Options.MaxClockSkew, read by each statement. The caller's clock alone
// cannot be trusted: a node whose clock is a day ahead would delete every
// live counter of the cluster. A node's clock that is behind only makes its
// purges delete less.
func (s *Store) Purge(ctx context.Context, now int64) error {
	interval := s.opts.PurgeInterval.Milliseconds()
	last := s.lastPurge.Load()
	if last != noPurge && now-last < interval && last-now < interval {
		return nil
	}
	// Claim this purge; a concurrent caller that loses does nothing.
	if !s.lastPurge.CompareAndSwap(last, now) {
		return nil
	}
	if err := s.purgeAll(ctx, now); err != nil {
		s.lastPurge.CompareAndSwap(now, last)
		return fmt.Errorf("postgres: purge at %d: %w", now, err)
	}
	return nil
}

// purgePages is how many pages of the bucket and sliding-log tables one
// purge statement scans (1 MiB).
const purgePages = 128

// purgeSQL holds Purge's statements.
type purgeSQL struct {
	sizes, changeSizes       string // the distinct window sizes
	counters, changes        string // per size: $1 size, $2 now, $3 skew, $4 limit
	trim                     string // $1 now, $2 skew, $3 retention, $4 limit
	batches                  string // $1 now, $2 skew, $3 limit
	pages                    string // $1 table: its size in pages
	buckets, logs, pruneLogs string // $1 now, $2 skew, $3 first page, $4 page past the last
}

func (s *Store) buildPurgeSQL() {
	n := s.names
	// The distinct window sizes, by skipping through the primary key (or
	// the change log's index, which starts with the size too).
	sizes := func(table string) string {
		return `WITH RECURSIVE s(size) AS (
	SELECT min(window_size) FROM ` + table + `
	UNION ALL
	SELECT (SELECT min(window_size) FROM ` + table + ` WHERE window_size > s.size) FROM s WHERE s.size IS NOT NULL
) SELECT size FROM s WHERE size IS NOT NULL`
	}
	// What is expired is decided by the lesser of the caller's now and the
	// server's clock less MaxClockSkew, so a node whose clock runs ahead
	// cannot delete windows the others still count in.
	// statement_timestamp() is stable within the statement, so the bound is
	// computed once and serves as an index range.
	cutoff := func(now, skew string) string {
		return `LEAST(` + now + `::bigint, ` + serverMillisSQL + ` - ` + skew + `::bigint)`
	}
	// ctid = ANY(ARRAY(...)) plans as a TID scan; SKIP LOCKED lets several
	// purgers split the work instead of queueing behind one another, and a
	// purge never waits for a push.
	bounded := func(table, cond, limit string) string {
		return `DELETE FROM ` + table + ` WHERE ctid = ANY(ARRAY(
	SELECT ctid FROM ` + table + ` WHERE ` + cond + `
	LIMIT ` + limit + ` FOR UPDATE SKIP LOCKED))`
	}
	counted := func(del string) string { return `WITH d AS (` + del + ` RETURNING 1) SELECT count(*) FROM d` }
	window := `window_size = $1 AND window_start <= ` + cutoff("$2", "$3") + ` - 2 * $1`
	pages := `ctid >= ('(' || $3::bigint || ',0)')::tid AND ctid < ('(' || $4::bigint || ',0)')::tid`
	s.purge = purgeSQL{
		sizes:       sizes(n.counters),
		changeSizes: sizes(n.changes),
		counters:    counted(bounded(n.counters, window, "$4")),
		changes:     counted(bounded(n.changes, window, "$4")),
		// Entries past the retention go; a marker (keys null) under the
		// highest transaction ID removed takes their place, so that a
		// cursor from before it is answered with an Overflow. The
		// statement returns how many entries it removed.
		trim: `WITH d AS (` + bounded(n.changes, `logged_at <= `+cutoff("$1", "$2")+` - $3::bigint AND keys IS NOT NULL`, "$4") + `
	RETURNING window_size, window_start, namespace, xid, logged_at
), m AS (
	INSERT INTO ` + n.changes + ` (window_size, window_start, namespace, xid, keys, logged_at)
	SELECT window_size, window_start, namespace, max(xid), NULL, max(logged_at) FROM d GROUP BY window_size, window_start, namespace
) SELECT count(*) FROM d`,
		batches: counted(bounded(n.batches, `expires_at <= `+cutoff("$1", "$2"), "$3")),
		pages:   `SELECT pg_relation_size($1::regclass) / current_setting('block_size')::bigint`,
		buckets: `DELETE FROM ` + n.buckets + ` WHERE ctid = ANY(ARRAY(
	SELECT ctid FROM ` + n.buckets + ` WHERE ` + pages + `
	AND ` + ceilMillisSQL("tat") + ` + period + ` + fmt.Sprint(bucketRetentionMillis) + ` <= ` + cutoff("$1", "$2") + `
	FOR UPDATE SKIP LOCKED))`,
		logs: `DELETE FROM ` + n.logs + ` WHERE ctid = ANY(ARRAY(
	SELECT ctid FROM ` + n.logs + ` WHERE ` + pages + `
	AND (cardinality(ats) = 0 OR ats[cardinality(ats)] <= ` + cutoff("$1", "$2") + ` - window_size)
	FOR UPDATE SKIP LOCKED))`,
		// ats is in ascending order: the entries to drop lead.
		pruneLogs: `UPDATE ` + n.logs + ` l SET ats = l.ats[p.k:], costs = l.costs[p.k:], ids = l.ids[p.k:]
FROM (SELECT ctid, (SELECT count(*) + 1 FROM unnest(ats) x WHERE x <= ` + cutoff("$1", "$2") + ` - window_size)::integer AS k
	FROM ` + n.logs + ` WHERE ` + pages + ` AND ats[1] <= ` + cutoff("$1", "$2") + ` - window_size
	FOR UPDATE SKIP LOCKED) p
WHERE l.ctid = p.ctid`,
	}
}

func (s *Store) purgeAll(ctx context.Context, now int64) error {
	skew := s.opts.MaxClockSkew.Milliseconds()
	for _, t := range []struct{ sizes, del string }{
		{s.purge.sizes, s.purge.counters},
		{s.purge.changeSizes, s.purge.changes},
	} {
		sizes, err := s.windowSizes(ctx, t.sizes)
		if err != nil {
			return err
		}
		for _, size := range sizes {
			// start + 2*size <= cutoff, as a range on the index.
			if err := s.deleteAll(ctx, t.del, size, now, skew); err != nil {
				return err
			}
		}
	}
	if err := s.deleteAll(ctx, s.purge.trim, now, skew, s.opts.ChangeRetention.Milliseconds()); err != nil {
		return err
	}
	if err := s.deleteAll(ctx, s.purge.batches, now, skew); err != nil {
		return err
	}
	for _, t := range []struct {
		table string
		sql   []string
	}{
		{s.names.buckets, []string{s.purge.buckets}},
		{s.names.logs, []string{s.purge.logs, s.purge.pruneLogs}},
	} {
		if err := s.byPages(ctx, t.table, t.sql, now, skew); err != nil {
			return err
		}
	}
	return nil
}

// windowSizes runs a query listing window sizes.
func (s *Store) windowSizes(ctx context.Context, sql string) ([]int64, error) {
	r, err := s.pool.Query(ctx, sql)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(r, pgx.RowTo[int64])
}

// deleteAll runs a bounded statement (its last argument is the bound), which
// returns how many rows it removed, until one removes fewer than the bound:
// nothing unlocked is left.
func (s *Store) deleteAll(ctx context.Context, sql string, args ...any) error {
	args = append(args, s.opts.PurgeBatchSize)
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	for {
		var n int64
		if err := conn.QueryRow(ctx, sql, args...).Scan(&n); err != nil {
			dropIfStale(ctx, conn, err)
			return err
		}
		if n < int64(s.opts.PurgeBatchSize) {
			return nil
		}
	}
}

// byPages runs each of sqls (taking now, skew, and a range of pages) over
// the table's pages, s.purgePages at a time: no index orders those tables by
// expiry, and a scan of a bounded range keeps every statement short.
func (s *Store) byPages(ctx context.Context, table string, sqls []string, now, skew int64) error {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	var pages int64
	if err := conn.QueryRow(ctx, s.purge.pages, table).Scan(&pages); err != nil {
		return err
	}
	for lo := int64(0); lo < pages; lo += s.purgePages {
		for _, sql := range sqls {
			if _, err := conn.Exec(ctx, sql, now, skew, lo, lo+s.purgePages); err != nil {
				dropIfStale(ctx, conn, err)
				return err
			}
		}
	}
	return nil
}
