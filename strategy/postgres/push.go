package postgres

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ratesync/ratelimit/strategy"
)

// rows holds counters in column form, as the statements take them.
type rows struct {
	keys          []string
	sizes, starts []int64
	deltas        []int64 // nil for reads
}

func (r *rows) len() int { return len(r.keys) }

func (r *rows) slice(lo, hi int) rows {
	out := rows{keys: r.keys[lo:hi], sizes: r.sizes[lo:hi], starts: r.starts[lo:hi]}
	if r.deltas != nil {
		out.deltas = r.deltas[lo:hi]
	}
	return out
}

// join returns r's rows followed by o's (without deltas).
func (r rows) join(o rows) rows {
	if o.len() == 0 {
		return rows{keys: r.keys, sizes: r.sizes, starts: r.starts}
	}
	return rows{keys: append(slices.Clip(r.keys), o.keys...), sizes: append(slices.Clip(r.sizes), o.sizes...),
		starts: append(slices.Clip(r.starts), o.starts...)}
}

// plan is a batch prepared for sending: diffs merged per counter and sorted
// by identity, bucket diffs sorted, reads that can exist in the store, the
// watches, and where each answer goes.
type plan struct {
	ns    string // encoded
	diffs rows
	// The totals of diffs row u go to Totals[perm[first[u]:first[u+1]]]
	// (several entries when the batch named a counter twice).
	perm, first []int32
	reads       rows
	readIdx     []int32 // reads row r answers Reads[readIdx[r]]
	// Reads of counters the batch also changes are answered from the
	// totals: Reads[r.read] = total of diffs row r.diff.
	readDiffs []link

	bdiffs     bucketRows
	bdiffIdx   []int32 // bdiffs row u answers Buckets[bdiffIdx[u]]
	breads     bucketRows
	breadIdx   []int32
	breadDiffs []link // BucketReads[l.read] = the state of bdiffs row l.diff

	watches []watchPlan

	src *strategy.Batch
	now int64 // the batch's Now
}

type link struct{ read, diff int32 }

// PushDiffs applies b.Diffs and b.BucketDiffs exactly once per b.ID and
// reads b.Reads and b.BucketReads and answers b.Watches, in one statement
// (one round trip) per Options.MaxPushRows diffs. See the package
// documentation for what its errors mean.
func (s *Store) PushDiffs(ctx context.Context, b *strategy.Batch) (strategy.Result, error) {
	if err := ctx.Err(); err != nil {
		return strategy.Result{}, fmt.Errorf("postgres: push %q: %w: %w", b.ID, err, strategy.ErrNotApplied)
	}
	p, err := makePlan(b)
	if err != nil {
		return strategy.Result{}, fmt.Errorf("postgres: push %q: %w: %w", b.ID, err, strategy.ErrNotApplied)
	}
	res := strategy.Result{Totals: make([]int64, len(b.Diffs)), Reads: make([]int64, len(b.Reads))}
	if len(b.BucketDiffs) > 0 {
		res.Buckets = make([]strategy.BucketState, len(b.BucketDiffs))
	}
	if len(b.BucketReads) > 0 {
		res.BucketReads = make([]strategy.BucketState, len(b.BucketReads))
	}

	n := s.opts.MaxPushRows
	writeParts := max(ceilDiv(p.diffs.len(), n), ceilDiv(p.bdiffs.len(), n))
	parts := max(writeParts, ceilDiv(p.reads.len(), n), ceilDiv(p.breads.len(), n))
	// One statement answers the watches with everything else when the
	// batch fits one; a larger batch's watches are answered once all its
	// parts are applied.
	inline := len(p.watches) > 0 && parts <= 1
	if inline {
		parts = 1
	}
	type outcome struct {
		maybeApplied bool
		err          error
		ans          *answer
	}
	out := make([]outcome, parts)
	var failed atomic.Bool
	batchID := encodeText(b.ID)
	run := func(i int) {
		if failed.Load() {
			return // not sent: the batch fails anyway, and a re-send completes it
		}
		pt := p.part(i, n)
		pt.id = batchID
		if writeParts > 1 {
			// Deterministic for a given batch, so a re-sent batch skips the
			// parts already applied and completes the others.
			pt.id += "#" + strconv.Itoa(i) + "/" + strconv.Itoa(writeParts)
		}
		if inline {
			pt.watches = p.watches
		}
		o := &out[i]
		o.ans, o.maybeApplied, o.err = s.pushPart(ctx, b.ID != "", &pt)
		switch {
		case o.err != nil:
			failed.Store(true)
		case pt.writes():
			o.maybeApplied = true // applied
		}
	}
	if workers := min(s.opts.PushConcurrency, parts); workers <= 1 {
		for i := range parts {
			run(i)
		}
	} else {
		// Parts hold disjoint rows and each locks its rows in the global
		// order, so running them at once cannot deadlock.
		var next atomic.Int64
		var wg sync.WaitGroup
		for range workers {
			wg.Go(func() {
				for i := int(next.Add(1) - 1); i < parts; i = int(next.Add(1) - 1) {
					run(i)
				}
			})
		}
		wg.Wait()
	}
	var firstErr error
	maybeApplied := false
	for i, o := range out {
		maybeApplied = maybeApplied || o.maybeApplied
		if o.err != nil && firstErr == nil {
			firstErr = fmt.Errorf("postgres: push %q (part %d of %d): %w", b.ID, i+1, parts, o.err)
		}
	}
	if firstErr != nil {
		if !maybeApplied {
			// Nothing of this batch can have been written.
			return strategy.Result{}, fmt.Errorf("%w: %w", firstErr, strategy.ErrNotApplied)
		}
		return strategy.Result{}, firstErr
	}
	var xids []int64
	for i, o := range out {
		p.fill(&res, i*n, o.ans)
		if o.ans.xid != 0 {
			xids = append(xids, o.ans.xid)
		}
	}
	for _, l := range p.readDiffs {
		res.Reads[l.read] = res.Totals[p.perm[p.first[l.diff]]]
	}
	for _, l := range p.breadDiffs {
		res.BucketReads[l.read] = res.Buckets[p.bdiffIdx[l.diff]]
	}
	if len(p.watches) == 0 {
		return res, nil
	}
	watched := out[0].ans.watches
	if !inline {
		// Every part is committed: one more statement lists the changes,
		// leaving out the parts' own log entries (their totals are known).
		ans, err := s.watchAfter(ctx, p, xids)
		if err != nil {
			return strategy.Result{}, fmt.Errorf("postgres: push %q: answering its watches: %w", b.ID, &appliedError{err})
		}
		watched = ans.watches
	}
	res.Changes = p.changes(watched, res.Totals, xids)
	return res, nil
}

func ceilDiv(a, b int) int { return (a + b - 1) / b }

func makePlan(b *strategy.Batch) (*plan, error) {
	for _, d := range b.Diffs {
		if !wholeMillis(d.Size) {
			return nil, fmt.Errorf("key %q: window size %v is not a positive whole number of milliseconds", d.Key, d.Size)
		}
	}
	p := &plan{ns: encodeText(b.Namespace), perm: make([]int32, len(b.Diffs))}
	for i := range p.perm {
		p.perm[i] = int32(i)
	}
	// One global order for every node, so that concurrent upserts lock shared
	// rows in the same order and cannot deadlock.
	slices.SortFunc(p.perm, func(i, j int32) int {
		return compareID(&b.Diffs[i].CounterID, &b.Diffs[j].CounterID)
	})
	n := len(b.Diffs)
	p.diffs = rows{keys: make([]string, 0, n), sizes: make([]int64, 0, n), starts: make([]int64, 0, n), deltas: make([]int64, 0, n)}
	p.first = make([]int32, 0, n+1)
	for k, i := range p.perm {
		d := &b.Diffs[i]
		if k > 0 && compareID(&b.Diffs[p.perm[k-1]].CounterID, &d.CounterID) == 0 {
			// The contract allows one diff per counter; merge rather than let
			// the upsert fail on "cannot affect row a second time".
			p.diffs.deltas[len(p.diffs.deltas)-1] += d.Delta
			continue
		}
		p.first = append(p.first, int32(k))
		p.diffs.keys = append(p.diffs.keys, encodeText(d.Key))
		p.diffs.sizes = append(p.diffs.sizes, d.Size.Milliseconds())
		p.diffs.starts = append(p.diffs.starts, d.Start)
		p.diffs.deltas = append(p.diffs.deltas, d.Delta)
	}
	p.first = append(p.first, int32(n))

	rperm := make([]int32, 0, len(b.Reads))
	for i, r := range b.Reads {
		// A counter that cannot exist reads as 0 without asking.
		if r.Size > 0 {
			rperm = append(rperm, int32(i))
		}
	}
	// Sorted like the diffs: the lookups walk the primary key in order, and
	// one merge pass finds the reads of counters the batch changes (the
	// statement reads its snapshot, from before its own writes).
	slices.SortFunc(rperm, func(i, j int32) int { return compareID(&b.Reads[i], &b.Reads[j]) })
	u := 0
	for _, i := range rperm {
		r := &b.Reads[i]
		for u < len(p.first)-1 && compareID(&b.Diffs[p.perm[p.first[u]]].CounterID, r) < 0 {
			u++
		}
		if u < len(p.first)-1 && compareID(&b.Diffs[p.perm[p.first[u]]].CounterID, r) == 0 {
			p.readDiffs = append(p.readDiffs, link{i, int32(u)})
			continue
		}
		p.reads.keys = append(p.reads.keys, encodeText(r.Key))
		p.reads.sizes = append(p.reads.sizes, r.Size.Milliseconds())
		p.reads.starts = append(p.reads.starts, r.Start)
		p.readIdx = append(p.readIdx, i)
	}
	if err := p.planBuckets(b); err != nil {
		return nil, err
	}
	p.planWatches(b)
	return p, nil
}

func wholeMillis(d time.Duration) bool { return d > 0 && d%time.Millisecond == 0 }

func compareID(a, b *strategy.CounterID) int {
	if c := cmp.Compare(a.Size, b.Size); c != 0 {
		return c
	}
	if c := cmp.Compare(a.Start, b.Start); c != 0 {
		return c
	}
	return cmp.Compare(a.Key, b.Key)
}

// part is one statement's share of a batch.
type part struct {
	id             string
	ns             string
	diffs, reads   rows
	bdiffs, breads bucketRows
	watches        []watchPlan
	now            int64
}

// writes reports whether the part changes anything.
func (pt *part) writes() bool { return pt.diffs.len() > 0 || pt.bdiffs.len() > 0 }

// part returns part i of p, each part holding at most n rows of each kind.
func (p *plan) part(i, n int) part {
	bound := func(l int) (int, int) { return min(i*n, l), min((i+1)*n, l) }
	dlo, dhi := bound(p.diffs.len())
	rlo, rhi := bound(p.reads.len())
	blo, bhi := bound(p.bdiffs.len())
	brlo, brhi := bound(p.breads.len())
	return part{ns: p.ns, now: p.now, diffs: p.diffs.slice(dlo, dhi), reads: p.reads.slice(rlo, rhi),
		bdiffs: p.bdiffs.slice(blo, bhi), breads: p.breads.slice(brlo, brhi)}
}

// fill copies the answer of the part holding rows from off on into res.
func (p *plan) fill(res *strategy.Result, off int, a *answer) {
	for k, total := range a.totals {
		u := off + k
		for _, i := range p.perm[p.first[u]:p.first[u+1]] {
			res.Totals[i] = total
		}
	}
	for k, n := range a.reads {
		res.Reads[p.readIdx[off+k]] = n
	}
	for k, st := range a.buckets {
		res.Buckets[p.bdiffIdx[off+k]] = st
	}
	for k, st := range a.breads {
		res.BucketReads[p.breadIdx[off+k]] = st
	}
}

// answer is what one statement answered, for the rows of its part.
type answer struct {
	totals  []int64 // per diffs row
	reads   []int64
	buckets []strategy.BucketState // per bucket diffs row
	breads  []strategy.BucketState
	watches []watchAnswer // per watch of the part
	xid     int64         // the statement's transaction, 0 if it wrote nothing (or is not known)
}

func newAnswer(pt *part) *answer {
	return &answer{totals: make([]int64, pt.diffs.len()), reads: make([]int64, pt.reads.len()),
		buckets: make([]strategy.BucketState, pt.bdiffs.len()), breads: make([]strategy.BucketState, pt.breads.len()),
		watches: make([]watchAnswer, len(pt.watches))}
}

// pushPart sends one part, re-sending it up to MaxRetries times when that
// can help. It reports whether the part may have been applied despite an
// error.
func (s *Store) pushPart(ctx context.Context, hasID bool, pt *part) (ans *answer, maybeApplied bool, err error) {
	// The ID is kept until the windows the part changed expire (the
	// statement keeps it longer for its buckets), and BatchIDRetention more.
	var expires int64
	for i := range pt.diffs.len() {
		expires = max(expires, pt.diffs.starts[i]+2*pt.diffs.sizes[i])
	}
	maybeApplied, err = s.retry(ctx, hasID, pt.writes(), func(conn *pgxpool.Conn) error {
		ans = newAnswer(pt)
		return s.execOn(ctx, conn, pt, expires, hasID, ans)
	})
	return ans, maybeApplied, err
}

// retry runs fn on a pooled connection until it succeeds, re-running it up to
// MaxRetries times when that can help, and once more after creating the
// store's objects when it found them gone. writes says whether fn may write;
// safe says whether running it again after an unknown outcome is (it is
// guarded by an ID, or writes nothing). It reports whether fn may have
// written despite the error.
func (s *Store) retry(ctx context.Context, safe, writes bool, fn func(*pgxpool.Conn) error) (maybeApplied bool, err error) {
	recreated := false
	for attempt := 0; ; attempt++ {
		err = s.onConn(ctx, fn)
		if err == nil {
			return maybeApplied, nil
		}
		maybeApplied = maybeApplied || (writes && !notApplied(err))
		if !recreated && undefinedObject(err) && ctx.Err() == nil {
			// The tables (or the function) were dropped under the store
			// (the statement was rolled back): create them again, as New
			// would, and re-send.
			recreated = true
			if cerr := s.createSchema(ctx); cerr != nil {
				return maybeApplied, fmt.Errorf("%w (creating the tables again: %w)", err, cerr)
			}
			continue
		}
		if attempt >= s.opts.MaxRetries || !retryable(ctx, err) || (maybeApplied && !safe) {
			return maybeApplied, err
		}
	}
}

// onConn runs fn on a pooled connection.
func (s *Store) onConn(ctx context.Context, fn func(*pgxpool.Conn) error) error {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		// Nothing was sent on any connection.
		return &acquireError{err}
	}
	defer conn.Release()
	err = fn(conn)
	dropIfStale(ctx, conn, err)
	return err
}

// dropIfStale closes a pooled connection whose session settings made err,
// so that the pool replaces it with one opened under the current settings:
// a statement_timeout or default_transaction_read_only set for the role or
// the database applies to new sessions only, and the store would otherwise
// keep failing on the connections it already has after the setting is lifted
// (or after a failover, on a connection to the old primary).
func dropIfStale(ctx context.Context, conn *pgxpool.Conn, err error) {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return
	}
	switch pe.Code {
	case "57014", // query_canceled: statement_timeout
		"25006": // read_only_sql_transaction: default_transaction_read_only, a standby
		_ = conn.Conn().Close(ctx) // Release then destroys it
	}
}

// execOn runs one attempt of a part on conn.
func (s *Store) execOn(ctx context.Context, conn *pgxpool.Conn, pt *part, expires int64, hasID bool, ans *answer) error {
	if !pt.writes() {
		return s.readInto(ctx, conn, pt, rows{}, bucketRows{}, nil, ans)
	}
	sql := s.pushSQL
	if !hasID || s.noGuard {
		sql = s.pushUnguardedSQL
	}
	wa := watchArgs(pt.watches, nil)
	r, err := conn.Query(ctx, sql, pt.id, expires, s.opts.BatchIDRetention.Milliseconds(), pt.ns,
		pt.diffs.keys, pt.diffs.sizes, pt.diffs.starts, pt.diffs.deltas,
		pt.bdiffs.keys, pt.bdiffs.periods, pt.bdiffs.adds, pt.bdiffs.floors, pt.bdiffs.ivs, pt.now,
		pt.reads.keys, pt.reads.sizes, pt.reads.starts,
		pt.breads.keys, pt.breads.periods,
		wa.sizes, wa.starts, wa.from, wa.inc, wa.lim, wa.ownW, wa.ownX)
	if err != nil {
		return err
	}
	applied, mismatch, err := decode(r, pt, ans, true)
	if err != nil {
		return err
	}
	switch {
	case applied == 0:
		// The ID was already recorded: the batch was applied before (its
		// reply was lost). Answer with the current values, read in a new
		// statement so that its snapshot includes a first attempt that was
		// still committing when this one started. (What this statement
		// listed for the watches is left for what the next one lists.)
		clear(ans.watches)
		err = s.readInto(ctx, conn, pt, pt.diffs, pt.bdiffs, nil, ans)
	case mismatch:
		// The server returned the upserted rows in another order than it
		// processed them (it does not today). The batch is applied; answer
		// with the current values (the watches' answers stand: the values
		// read now are as recent as theirs).
		only := part{ns: pt.ns}
		err = s.readInto(ctx, conn, &only, pt.diffs, pt.bdiffs, nil, ans)
	}
	if err != nil {
		return &appliedError{err}
	}
	return nil
}

// readInto answers pt's reads, bucket reads and watches, and the current
// values of diffs and bdiffs (the batch's own, applied before) into ans, in
// one statement. The watches' listings leave out the transactions own (the
// batch's parts).
func (s *Store) readInto(ctx context.Context, conn queryer, pt *part, diffs rows, bdiffs bucketRows, own []int64, ans *answer) error {
	reads := pt.reads.join(diffs)
	breads := pt.breads.join(bdiffs)
	if reads.len() == 0 && breads.len() == 0 && len(pt.watches) == 0 {
		return nil
	}
	wa := watchArgs(pt.watches, own)
	r, err := conn.Query(ctx, s.readSQL, pt.ns, reads.keys, reads.sizes, reads.starts, breads.keys, breads.periods,
		wa.sizes, wa.starts, wa.from, wa.inc, wa.lim, wa.ownW, wa.ownX)
	if err != nil {
		return err
	}
	// The reads answer pt's reads and then diffs' current totals.
	all := *pt
	all.reads, all.breads = reads, breads
	wide := &answer{reads: make([]int64, reads.len()), breads: make([]strategy.BucketState, breads.len()), watches: ans.watches}
	if _, _, err := decode(r, &all, wide, false); err != nil {
		return err
	}
	n, bn := pt.reads.len(), pt.breads.len()
	copy(ans.reads, wide.reads[:n])
	copy(ans.breads, wide.breads[:bn])
	if diffs.len() > 0 {
		copy(ans.totals, wide.reads[n:])
	}
	if bdiffs.len() > 0 {
		copy(ans.buckets, wide.breads[bn:])
	}
	return nil
}

// decode reads a statement's rows into ans. It returns how many diffs and
// bucket diffs rows the statement applied (and returned), and whether any
// came back in another order than pt holds them. ownFirst says the
// watches' listing is from before the part's own writes (see watchAnswer).
func decode(r pgx.Rows, pt *part, ans *answer, ownFirst bool) (applied int, mismatch bool, err error) {
	defer r.Close()
	// Raw values: no allocation per row, and the identity checks compare
	// bytes in place.
	fd := r.FieldDescriptions()
	totals, buckets := 0, 0
	for r.Next() {
		v := r.RawValues()
		if len(v) != 5 || len(fd) != 5 {
			return 0, false, fmt.Errorf("statement returned %d columns, want 5", len(v))
		}
		kind, err1 := int8Value(fd[0], v[0])
		a, err2 := int8OrZero(fd[2], v[2])
		b, err3 := int8OrZero(fd[3], v[3])
		c, err4 := int8OrZero(fd[4], v[4])
		if err := errors.Join(err1, err2, err3, err4); err != nil {
			return 0, false, err
		}
		switch kind {
		case rowTotal:
			i := totals
			totals++
			if i >= pt.diffs.len() || string(v[1]) != pt.diffs.keys[i] || a != pt.diffs.sizes[i] || b != pt.diffs.starts[i] {
				mismatch = true
				continue
			}
			ans.totals[i] = c
		case rowBucket:
			i := buckets
			buckets++
			if i >= pt.bdiffs.len() || string(v[1]) != pt.bdiffs.keys[i] || a != pt.bdiffs.periods[i] {
				mismatch = true
				continue
			}
			ans.buckets[i] = bucketState(b, c)
		case rowRead:
			ans.reads[a-1] = c
		case rowBucketRead:
			ans.breads[a-1] = bucketState(b, c)
		case rowChange:
			w := &ans.watches[a-1]
			key, err := decodeText(string(v[1]))
			if err != nil {
				return 0, false, err
			}
			w.keys = append(w.keys, key)
			w.counts = append(w.counts, c)
		case rowCursor:
			w := &ans.watches[a-1]
			w.answered, w.inc, w.listed, w.xmin, w.ownFirst = true, string(v[1]), b, c, ownFirst
		case rowXID:
			ans.xid = c
		default:
			return 0, false, fmt.Errorf("statement returned a row of kind %d", kind)
		}
	}
	if err := r.Err(); err != nil {
		return 0, false, err
	}
	if totals+buckets > 0 && (totals != pt.diffs.len() || buckets != pt.bdiffs.len()) {
		mismatch = true
	}
	return totals + buckets, mismatch, nil
}

// int8OrZero decodes a bigint result column that may be null (0).
func int8OrZero(fd pgconn.FieldDescription, v []byte) (int64, error) {
	if v == nil {
		return 0, nil
	}
	return int8Value(fd, v)
}

// appliedError is a failure after the batch was surely applied (by this
// statement or an earlier one): never "not applied", whatever caused it.
type appliedError struct{ err error }

func (e *appliedError) Error() string { return "reading values of an applied batch: " + e.err.Error() }
func (e *appliedError) Unwrap() error { return e.err }

// int8Value decodes a bigint result column in either wire format.
func int8Value(fd pgconn.FieldDescription, v []byte) (int64, error) {
	if fd.Format == pgx.BinaryFormatCode {
		if len(v) != 8 {
			return 0, fmt.Errorf("bigint column %s: %d bytes", fd.Name, len(v))
		}
		return int64(binary.BigEndian.Uint64(v)), nil
	}
	return strconv.ParseInt(string(v), 10, 64)
}

type acquireError struct{ err error }

func (e *acquireError) Error() string { return "acquire connection: " + e.err.Error() }
func (e *acquireError) Unwrap() error { return e.err }

// notApplied reports whether err proves that the statement wrote nothing.
func notApplied(err error) bool {
	if _, applied := errors.AsType[*appliedError](err); applied {
		return false
	}
	var ae *acquireError
	if errors.As(err, &ae) {
		return true
	}
	// pgx 5.12 also reports "conn closed" (SafeToRetry) when the connection
	// broke while the reply was read: in simple-protocol mode,
	// MultiResultReader.NextResult drops the read error and the next read
	// finds the connection closed. So "conn closed" proves nothing.
	if pgconn.SafeToRetry(err) && !errors.Is(err, pgconn.ErrConnClosed) {
		return true
	}
	// An ERROR reply means the server rolled the statement's transaction
	// back. FATAL and PANIC end the session and may come at any point, so
	// they say nothing about the commit.
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Severity == "ERROR"
}

// undefinedObject reports whether err is the server's "relation does not
// exist" (42P01) or "function does not exist" (42883) ERROR: the store's
// objects were dropped.
func undefinedObject(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && (pe.Code == "42P01" || pe.Code == "42883")
}

// retryable reports whether sending the same statement again at once may
// succeed where err failed.
func retryable(ctx context.Context, err error) bool {
	if ctx.Err() != nil {
		return false
	}
	var ae *acquireError
	if errors.As(err, &ae) {
		return false // the server is unreachable: the next sync cycle retries
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		switch pe.Code {
		case "40001", "40P01": // serialization failure, deadlock detected
			return true
		case "0A000": // "cached plan must not change result type": pgx re-prepares
			return true
		}
		class := pe.Code[:min(2, len(pe.Code))]
		return class == "08" || class == "57" // connection exception, operator intervention
	}
	// A broken connection (the pool gives a new one) or a failure before
	// sending.
	return true
}
