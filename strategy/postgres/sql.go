package postgres

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/ratesync/ratelimit/strategy"
)

// Every statement that answers a push returns rows of one shape,
// (kind, key, a, b, c): kind says what the row answers and how to read the
// other columns.
const (
	rowTotal      = 0 // key, a = window size, b = window start, c = the counter's total after the push
	rowRead       = 1 // a = the read's ordinal (from 1), c = the counter's total
	rowBucket     = 2 // key, a = period, b and c = the bucket's TAT and interval after the push (float8 bits)
	rowBucketRead = 3 // a = ordinal, b and c = TAT and interval (float8 bits; null when the store holds none)
	rowChange     = 4 // key, a = the watch's ordinal, c = the counter's total
	rowCursor     = 5 // key = incarnation, a = the watch's ordinal, b = keys listed (-1: cursor not valid), c = snapshot xmin
	rowXID        = 6 // c = the statement's transaction ID (null when it wrote nothing)
)

// Parameters of the push statement, in order; the read statement takes the
// ones from "ns" on that it uses (readParams).
var pushParams = []string{
	"id", "exp", "ret", "ns",
	"dk", "ds", "dst", "dd", // counter diffs: keys, sizes, starts, deltas
	"bk", "bp", "ba", "bf", "bi", "now", // bucket diffs: keys, periods, adds, floors, intervals; the batch's Now
	"rk", "rs", "rst", // counter reads
	"brk", "brp", // bucket reads
	"ws", "wst", "wfrom", "winc", "wlim", "ownw", "ownx", // watches
}

var readParams = []string{"ns", "rk", "rs", "rst", "brk", "brp", "ws", "wst", "wfrom", "winc", "wlim", "ownw", "ownx"}

var paramRef = regexp.MustCompile(`@[a-z]+`)

// bind replaces every @name in q with $n, n being name's position in params.
func bind(q string, params []string) string {
	return paramRef.ReplaceAllStringFunc(q, func(ref string) string {
		i := slices.Index(params, ref[1:])
		if i < 0 {
			panic("postgres: statement parameter " + ref + " not declared")
		}
		return "$" + strconv.Itoa(i+1)
	})
}

// quoteLiteral returns s as an SQL string literal.
func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// float8BitsSQL returns an expression of the IEEE 754 bits of the double
// precision x, as a bigint: floats cross the wire as their bits, exact
// whatever the session's extra_float_digits and the protocol's format.
func float8BitsSQL(x string) string {
	return `('x' || encode(float8send(` + x + `), 'hex'))::bit(64)::bigint`
}

// convertTATSQL is strategy.ConvertTAT for a held bucket (from > 0), in the
// same order of float8 operations as Go: n + ((tat - n) * to) / from.
func convertTATSQL(tat, from, to, n string) string {
	return fmt.Sprintf(`CASE WHEN %[1]s <= %[4]s OR %[2]s = %[3]s THEN %[1]s ELSE %[4]s + (%[1]s - %[4]s) * %[3]s / %[2]s END`, tat, from, to, n)
}

// applyBucketSQL is strategy.ApplyBucket of the diff (add, floor, interval
// to) to the stored state (tat, from) at n: greatest(tat' + add, floor), tat'
// being minus infinity when the state is not held (from is not positive: the
// result is floor) and the TAT converted to interval to when it is.
func applyBucketSQL(tat, from, to, add, floor, n string) string {
	return fmt.Sprintf(`greatest(CASE WHEN NOT (%[2]s > 0) THEN '-infinity'::float8 ELSE %[6]s END + %[4]s, %[5]s)`,
		tat, from, to, add, floor, convertTATSQL(tat, from, to, n))
}

// ceilMillisSQL is ceil(x) as a bigint, kept within ±maxInstant so that no
// value a node pushed (an infinity, a NaN) can make a statement fail.
func ceilMillisSQL(x string) string {
	return fmt.Sprintf(`least(greatest(ceil(%s), -%[2]d), %[2]d)::bigint`, x, maxInstant)
}

// maxInstant bounds the instants the statements compute with, in Unix
// milliseconds (about 285,000 years), far from overflowing a bigint.
const maxInstant = 1 << 53

// serverMillisSQL is the database server's clock, Unix milliseconds, fixed
// for the statement.
const serverMillisSQL = `floor(extract(epoch FROM statement_timestamp()) * 1000)::bigint`

func (s *Store) buildSQL() {
	n := s.names
	// The incarnation of the counters and their change log: what a watch
	// cursor is valid for. It changes when the tables are dropped and
	// created again, truncated or rewritten (their file nodes), when the
	// server restarts (an unlogged table may have been emptied by a
	// crash), when a standby was promoted or a backup restored to an
	// earlier point (the timeline) and on another cluster (its system
	// identifier).
	incarnation := `(SELECT system_identifier::text || '.' || timeline_id FROM pg_control_system(), pg_control_checkpoint())
		|| '.' || (extract(epoch FROM pg_postmaster_start_time()) * 1000000)::bigint
		|| '.' || pg_relation_filenode(` + quoteLiteral(n.counters) + `::regclass)
		|| '.' || pg_relation_filenode(` + quoteLiteral(n.changes) + `::regclass)`

	// The reads, bucket reads and watches of a batch: common table
	// expressions, and the branches of the statement's UNION ALL.
	//
	// A watch (size, start, wfrom, winc, wlim, and the transaction IDs of the
	// node's own statements, ownw/ownx) lists the keys that the change log
	// holds for the window from transaction wfrom on, except the node's own
	// statements' entries (their totals were in their answers), at most wlim
	// of them, and then their totals; wfrom < 0 lists the window's counters
	// from the start. The cursor is valid on this incarnation only, and not
	// once Purge trimmed entries from wfrom on (a marker: keys is null).
	readCTEs := `i AS (
	SELECT ` + incarnation + ` AS inc,
		pg_snapshot_xmin(s)::text::bigint AS xmin, pg_snapshot_xmax(s)::text::bigint AS xmax
	FROM pg_current_snapshot() s
), w AS (
	SELECT x.ord, x.size, x.start, x.lim, x.wfrom,
		x.wfrom < 0 OR (x.inc = i.inc AND x.wfrom <= i.xmax AND NOT EXISTS (
			SELECT 1 FROM ` + n.changes + ` l WHERE l.window_size = x.size AND l.window_start = x.start AND l.namespace = @ns
			AND l.xid >= x.wfrom AND l.keys IS NULL)) AS valid,
		ARRAY(SELECT o.xid FROM unnest(@ownw::bigint[], @ownx::bigint[]) o(w, xid) WHERE o.w = x.ord) AS own
	FROM (SELECT unnest(@ws::bigint[]) AS size, unnest(@wst::bigint[]) AS start, unnest(@wfrom::bigint[]) AS wfrom,
		unnest(@winc::text[]) AS inc, unnest(@wlim::bigint[]) AS lim, generate_series(1, cardinality(@ws::bigint[])) AS ord) x, i
), wk AS (
	SELECT w.ord, w.size, w.start, w.lim, w.valid, CASE
		WHEN NOT w.valid THEN '{}'::text[]
		WHEN w.wfrom < 0 THEN ARRAY(SELECT c.key FROM ` + n.counters + ` c
			WHERE c.window_size = w.size AND c.window_start = w.start AND c.namespace = @ns LIMIT w.lim)
		ELSE ARRAY(SELECT DISTINCT k FROM ` + n.changes + ` l, unnest(l.keys) k
			WHERE l.window_size = w.size AND l.window_start = w.start AND l.namespace = @ns
			AND l.xid >= w.wfrom AND l.xid <> ALL (w.own) LIMIT w.lim) END AS keys
	FROM w
)`
	// Each read is one primary-key lookup (a scalar subquery, whatever the
	// planner thinks of the table's size).
	readRows := `SELECT 1::bigint, NULL::text, r.ord::bigint, NULL::bigint, COALESCE((
	SELECT c.count FROM ` + n.counters + ` c
	WHERE c.window_size = r.window_size AND c.window_start = r.window_start AND c.namespace = @ns AND c.key = r.key), 0)::bigint
FROM (SELECT unnest(@rk::text[]) AS key, unnest(@rs::bigint[]) AS window_size, unnest(@rst::bigint[]) AS window_start,
	generate_series(1, cardinality(@rk::text[])) AS ord) r
UNION ALL
SELECT 3, NULL, r.ord, ` + float8BitsSQL("b.tat") + `, ` + float8BitsSQL("b.interval") + `
FROM (SELECT unnest(@brk::text[]) AS key, unnest(@brp::bigint[]) AS period, generate_series(1, cardinality(@brk::text[])) AS ord) r
LEFT JOIN LATERAL (SELECT tat, interval FROM ` + n.buckets + ` WHERE period = r.period AND namespace = @ns AND key = r.key) b ON true
UNION ALL
SELECT 4, k.key, wk.ord, NULL, COALESCE((
	SELECT c.count FROM ` + n.counters + ` c
	WHERE c.window_size = wk.size AND c.window_start = wk.start AND c.namespace = @ns AND c.key = k.key), 0)
FROM wk, unnest(wk.keys) k(key) WHERE cardinality(wk.keys) < wk.lim
UNION ALL
SELECT 5, i.inc, wk.ord, CASE WHEN wk.valid THEN cardinality(wk.keys) ELSE -1 END, i.xmin FROM wk, i`

	s.readSQL = bind(`WITH `+readCTEs+`
`+readRows, readParams)

	// The push: the batch ID is inserted first; the upserts run only when
	// that insert happened (EXISTS over its RETURNING). The arrays are
	// unnested in the select list (a streaming ProjectSet, in array order,
	// with no materialisation and no join that could reorder rows), so the
	// upserts lock rows in the global order that prevents deadlocks; they
	// return the new values in that order with their identity, which the
	// client checks. A total saturates at ±strategy.MaxTotal (numeric
	// arithmetic: never an overflow error).
	//
	// The change log gets one row per window the push changed, with the
	// keys, under the transaction's ID, in the same transaction.
	//
	// A bucket diff's add and floor reach the conflict branch through the
	// row's ord, its position in the arrays: EXCLUDED holds only the
	// table's columns.
	//
	// The other branches read the statement's snapshot, from before its own
	// writes; the client answers reads of what the batch changed from the
	// upserts' results.
	const push = `WITH b AS (
	%[1]s
), up AS (
	INSERT INTO %[2]s AS t (namespace, key, window_size, window_start, count)
	SELECT @ns, unnest(@dk::text[]), unnest(@ds::bigint[]), unnest(@dst::bigint[]), unnest(@dd::bigint[])
	WHERE %[3]s
	ON CONFLICT (window_size, window_start, namespace, key)
	DO UPDATE SET count = LEAST(GREATEST(t.count::numeric + EXCLUDED.count, -%[4]d), %[4]d)::bigint
	RETURNING t.key, t.window_size, t.window_start, t.count
), lg AS (
	INSERT INTO %[5]s (window_size, window_start, namespace, xid, keys, logged_at)
	SELECT window_size, window_start, @ns, pg_current_xact_id()::text::bigint, array_agg(key), %[6]s
	FROM up GROUP BY window_size, window_start
), bu AS (
	INSERT INTO %[7]s AS t (namespace, key, period, tat, interval, ord)
	SELECT @ns, d.key, d.period, d.floor, d.iv, d.ord
	FROM (SELECT unnest(@bk::text[]) AS key, unnest(@bp::bigint[]) AS period, unnest(@ba::float8[]) AS add,
		unnest(@bf::float8[]) AS floor, unnest(@bi::float8[]) AS iv, generate_series(1, cardinality(@bk::text[])) AS ord) d
	WHERE %[3]s
	ON CONFLICT (period, namespace, key)
	DO UPDATE SET tat = %[8]s, interval = EXCLUDED.interval, ord = EXCLUDED.ord
	RETURNING t.key, t.period, t.tat, t.interval
), %[9]s
SELECT 0::bigint, key, window_size, window_start, count FROM up
UNION ALL
SELECT 2, key, period, %[10]s, %[11]s FROM bu
UNION ALL
%[12]s
UNION ALL
SELECT 6, NULL, NULL, NULL, pg_current_xact_id_if_assigned()::text::bigint`
	apply := applyBucketSQL("t.tat", "t.interval", "EXCLUDED.interval",
		"(@ba::float8[])[EXCLUDED.ord]", "(@bf::float8[])[EXCLUDED.ord]", "(@now::bigint)::float8")
	build := func(guard, cond string) string {
		return bind(fmt.Sprintf(push, guard, n.counters, cond, strategy.MaxTotal, n.changes, serverMillisSQL,
			n.buckets, apply, readCTEs, float8BitsSQL("tat"), float8BitsSQL("interval"), readRows), pushParams)
	}
	// The batch ID is kept until the windows the batch changed expire (@exp,
	// from the client) and until its buckets may be forgotten
	// (strategy.BucketExpiry of the states it leaves, computed here from
	// the states it finds), and @ret (BatchIDRetention) more.
	expiry := `greatest(@exp::bigint, (
		SELECT max(` + ceilMillisSQL(applyBucketSQL("coalesce(t.tat, 0)", "coalesce(t.interval, 0)", "d.iv", "d.add", "d.floor", "(@now::bigint)::float8")) + ` + d.period)
		FROM unnest(@bk::text[], @bp::bigint[], @ba::float8[], @bf::float8[], @bi::float8[]) d(key, period, add, floor, iv)
		LEFT JOIN ` + n.buckets + ` t ON t.period = d.period AND t.namespace = @ns AND t.key = d.key) + ` + fmt.Sprint(bucketRetentionMillis) + `) + @ret::bigint`
	s.pushSQL = build(`INSERT INTO `+n.batches+` (id, expires_at) VALUES (@id, `+expiry+`) ON CONFLICT (id) DO NOTHING RETURNING 1`,
		`EXISTS (SELECT 1 FROM b)`)
	// The unguarded form neither records nor checks the ID: for batches
	// without an ID, and for the test that proves the guard matters.
	s.pushUnguardedSQL = build(`SELECT @id::text, @exp::bigint, @ret::bigint`, `true`)

	// One primary-key range per (size, start) pair.
	const get = `SELECT c.key, c.window_size, c.window_start, c.count
FROM unnest($2::bigint[], $3::bigint[]) AS w(window_size, window_start)
JOIN %s c ON c.window_size = w.window_size AND c.window_start = w.window_start AND c.namespace = $1`
	s.getCountersSQL = fmt.Sprintf(get, n.counters)
	s.getCountersKeysSQL = fmt.Sprintf(get, n.counters) + ` AND c.key = ANY($4::text[])`

	s.getWindowSQL = `SELECT count FROM ` + n.counters + ` WHERE window_size = $1 AND window_start = $2 AND namespace = $3 AND key = $4`

	s.takeCallSQL = `SELECT * FROM ` + n.takeFn + `($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16)`

	s.buildPurgeSQL()
}
