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

// plan is a batch prepared for sending: diffs merged per counter and sorted
// by identity, reads that can exist in the store, and where each answer goes.
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
	readDiffs []struct{ read, diff int32 }
}

// PushDiffs applies b.Diffs exactly once per b.ID and reads b.Reads, in one
// statement (one round trip) per Options.MaxPushRows diffs. See the package
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

	n := s.opts.MaxPushRows
	diffParts := (p.diffs.len() + n - 1) / n
	parts := max(diffParts, (p.reads.len()+n-1)/n)
	type outcome struct {
		maybeApplied bool
		err          error
	}
	out := make([]outcome, parts)
	var failed atomic.Bool
	batchID := encodeText(b.ID)
	run := func(i int) {
		if failed.Load() {
			return // not sent: the batch fails anyway, and a re-send completes it
		}
		dlo, dhi := min(i*n, p.diffs.len()), min((i+1)*n, p.diffs.len())
		rlo, rhi := min(i*n, p.reads.len()), min((i+1)*n, p.reads.len())
		id := batchID
		if diffParts > 1 {
			// Deterministic for a given batch, so a re-sent batch skips the
			// parts already applied and completes the others.
			id += "#" + strconv.Itoa(i) + "/" + strconv.Itoa(diffParts)
		}
		o := &out[i]
		o.maybeApplied, o.err = s.pushPart(ctx, id, b.ID != "", p, dlo, dhi, rlo, rhi, &res)
		switch {
		case o.err != nil:
			failed.Store(true)
		case dhi > dlo:
			o.maybeApplied = true // applied
		}
	}
	if workers := min(s.opts.PushConcurrency, parts); workers <= 1 {
		for i := range parts {
			run(i)
		}
	} else {
		// Parts hold disjoint counters and each locks its rows in the
		// global order, so running them at once cannot deadlock; they
		// write disjoint entries of res.
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
	switch {
	case firstErr == nil:
		for _, rd := range p.readDiffs {
			res.Reads[rd.read] = res.Totals[p.perm[p.first[rd.diff]]]
		}
		return res, nil
	case !maybeApplied:
		// Nothing of this batch can have been written.
		return strategy.Result{}, fmt.Errorf("%w: %w", firstErr, strategy.ErrNotApplied)
	default:
		return strategy.Result{}, firstErr
	}
}

func makePlan(b *strategy.Batch) (*plan, error) {
	for _, d := range b.Diffs {
		if d.Size <= 0 || d.Size%time.Millisecond != 0 {
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
			p.readDiffs = append(p.readDiffs, struct{ read, diff int32 }{i, int32(u)})
			continue
		}
		p.reads.keys = append(p.reads.keys, encodeText(r.Key))
		p.reads.sizes = append(p.reads.sizes, r.Size.Milliseconds())
		p.reads.starts = append(p.reads.starts, r.Start)
		p.readIdx = append(p.readIdx, i)
	}
	return p, nil
}

func compareID(a, b *strategy.CounterID) int {
	if c := cmp.Compare(a.Size, b.Size); c != 0 {
		return c
	}
	if c := cmp.Compare(a.Start, b.Start); c != 0 {
		return c
	}
	return cmp.Compare(a.Key, b.Key)
}

// pushPart sends diffs rows [dlo, dhi) and reads rows [rlo, rhi) as one
// statement, re-sending it up to MaxRetries times when that can help. It
// reports whether the part may have been applied despite an error.
func (s *Store) pushPart(ctx context.Context, id string, hasID bool, p *plan, dlo, dhi, rlo, rhi int, res *strategy.Result) (maybeApplied bool, err error) {
	diffs, reads := p.diffs.slice(dlo, dhi), p.reads.slice(rlo, rhi)
	var expires int64
	for i := range diffs.len() {
		expires = max(expires, diffs.starts[i]+2*diffs.sizes[i])
	}
	expires += s.opts.BatchIDRetention.Milliseconds()

	for attempt := 0; ; attempt++ {
		err = s.execPart(ctx, p.ns, id, hasID, expires, diffs, reads, func(isRead bool, ord int, count int64) {
			if isRead {
				res.Reads[p.readIdx[rlo+ord]] = count
				return
			}
			u := dlo + ord
			for _, i := range p.perm[p.first[u]:p.first[u+1]] {
				res.Totals[i] = count
			}
		})
		if err == nil {
			return false, nil
		}
		unknown := diffs.len() > 0 && !notApplied(err)
		maybeApplied = maybeApplied || unknown
		// Re-sending after an unknown outcome is safe only under an ID.
		if attempt >= s.opts.MaxRetries || !retryable(ctx, err) || (maybeApplied && !hasID) {
			return maybeApplied, err
		}
	}
}

// execPart runs one attempt. set receives each answer: ord is the 0-based row
// within diffs or reads.
func (s *Store) execPart(ctx context.Context, ns, id string, hasID bool, expires int64, diffs, reads rows, set func(isRead bool, ord int, count int64)) error {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		// Nothing was sent for this push on any connection.
		return &acquireError{err}
	}
	defer conn.Release()

	if diffs.len() == 0 {
		return s.read(ctx, conn, ns, reads, rows{}, set)
	}
	sql := s.pushSQL
	if !hasID || s.noGuard {
		sql = s.pushUnguardedSQL
	}
	r, err := conn.Query(ctx, sql, id, expires, ns,
		diffs.keys, diffs.sizes, diffs.starts, diffs.deltas,
		reads.keys, reads.sizes, reads.starts)
	if err != nil {
		return err
	}
	// Raw values: no allocation per row, and the identity check below
	// compares bytes in place.
	fd := r.FieldDescriptions()
	totals, mismatch := 0, false
	for r.Next() {
		v := r.RawValues()
		a, err1 := int8Value(fd[2], v[2])
		count, err2 := int8Value(fd[3], v[3])
		if err := errors.Join(err1, err2); err != nil {
			r.Close()
			return err
		}
		if v[0] == nil { // a read: column 3 is its ordinal
			set(true, int(a-1), count)
			continue
		}
		i := totals
		totals++
		size, err := int8Value(fd[1], v[1])
		if err != nil {
			r.Close()
			return err
		}
		if i >= diffs.len() || string(v[0]) != diffs.keys[i] || size != diffs.sizes[i] || a != diffs.starts[i] {
			mismatch = true
			continue
		}
		set(false, i, count)
	}
	if err := r.Err(); err != nil {
		return err
	}
	switch {
	case totals == 0:
		// The ID was already recorded: the batch was applied before (its
		// reply was lost). Answer with current totals, read in a new
		// statement so that its snapshot includes a first attempt that was
		// still committing when this one started.
		err = s.read(ctx, conn, ns, reads, diffs, set)
	case totals != diffs.len() || mismatch:
		// The server returned the upserted rows in another order than it
		// processed them (it does not today). The batch is applied; answer
		// with the current totals.
		err = s.read(ctx, conn, ns, rows{}, diffs, set)
	}
	if err != nil {
		return &appliedError{err}
	}
	return nil
}

// appliedError is a failure after the batch was surely applied (by this
// statement or an earlier one): never "not applied", whatever caused it.
type appliedError struct{ err error }

func (e *appliedError) Error() string { return "reading totals of an applied batch: " + e.err.Error() }
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

// read answers reads and then the counters of diffs (without changing them).
func (s *Store) read(ctx context.Context, conn queryer, ns string, reads, diffs rows, set func(isRead bool, ord int, count int64)) error {
	n := reads.len()
	keys, sizes, starts := reads.keys, reads.sizes, reads.starts
	if diffs.len() > 0 {
		keys = append(slices.Clip(keys), diffs.keys...)
		sizes = append(slices.Clip(sizes), diffs.sizes...)
		starts = append(slices.Clip(starts), diffs.starts...)
	}
	if len(keys) == 0 {
		return nil
	}
	r, err := conn.Query(ctx, s.readSQL, ns, keys, sizes, starts)
	if err != nil {
		return err
	}
	defer r.Close()
	var ord, count int64
	for r.Next() {
		if err := r.Scan(&ord, &count); err != nil {
			return err
		}
		if i := int(ord - 1); i < n {
			set(true, i, count)
		} else {
			set(false, i-n, count)
		}
	}
	return r.Err()
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
