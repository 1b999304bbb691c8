package postgres

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

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
	diffs rows
	// The totals of diffs row u go to Totals[perm[first[u]:first[u+1]]]
	// (several entries when the batch named a counter twice).
	perm, first []int32
	reads       rows
	readIdx     []int32 // reads row r answers Reads[readIdx[r]]
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
	for i := range parts {
		dlo, dhi := min(i*n, p.diffs.len()), min((i+1)*n, p.diffs.len())
		rlo, rhi := min(i*n, p.reads.len()), min((i+1)*n, p.reads.len())
		id := b.ID
		if diffParts > 1 {
			// Deterministic for a given batch, so a re-sent batch skips the
			// parts already applied and completes the others.
			id = b.ID + "#" + strconv.Itoa(i) + "/" + strconv.Itoa(diffParts)
		}
		maybeApplied, err := s.pushPart(ctx, b.Namespace, id, b.ID != "", p, dlo, dhi, rlo, rhi, &res)
		if err != nil {
			err = fmt.Errorf("postgres: push %q (part %d of %d): %w", b.ID, i+1, parts, err)
			if !maybeApplied && dlo == 0 {
				// Nothing of this batch can have been written.
				return strategy.Result{}, fmt.Errorf("%w: %w", err, strategy.ErrNotApplied)
			}
			return strategy.Result{}, err
		}
	}
	return res, nil
}

func makePlan(b *strategy.Batch) (*plan, error) {
	if !validText(b.Namespace) {
		return nil, fmt.Errorf("namespace %q: %w", b.Namespace, ErrInvalidText)
	}
	for _, d := range b.Diffs {
		if !validText(d.Key) {
			return nil, fmt.Errorf("key %q: %w", d.Key, ErrInvalidText)
		}
		if d.Size <= 0 || d.Size%time.Millisecond != 0 {
			return nil, fmt.Errorf("key %q: window size %v is not a positive whole number of milliseconds", d.Key, d.Size)
		}
	}
	p := &plan{perm: make([]int32, len(b.Diffs))}
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
		p.diffs.keys = append(p.diffs.keys, d.Key)
		p.diffs.sizes = append(p.diffs.sizes, d.Size.Milliseconds())
		p.diffs.starts = append(p.diffs.starts, d.Start)
		p.diffs.deltas = append(p.diffs.deltas, d.Delta)
	}
	p.first = append(p.first, int32(n))

	for i, r := range b.Reads {
		// A counter PostgreSQL cannot hold reads as 0 without asking.
		if !validText(r.Key) || r.Size <= 0 {
			continue
		}
		p.reads.keys = append(p.reads.keys, r.Key)
		p.reads.sizes = append(p.reads.sizes, r.Size.Milliseconds())
		p.reads.starts = append(p.reads.starts, r.Start)
		p.readIdx = append(p.readIdx, int32(i))
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
func (s *Store) pushPart(ctx context.Context, ns, id string, hasID bool, p *plan, dlo, dhi, rlo, rhi int, res *strategy.Result) (maybeApplied bool, err error) {
	diffs, reads := p.diffs.slice(dlo, dhi), p.reads.slice(rlo, rhi)
	var expires int64
	for i := range diffs.len() {
		expires = max(expires, diffs.starts[i]+2*diffs.sizes[i])
	}
	expires += s.opts.BatchIDRetention.Milliseconds()

	for attempt := 0; ; attempt++ {
		err = s.execPart(ctx, ns, id, hasID, expires, diffs, reads, func(isRead bool, ord int, count int64) {
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
	var (
		isRead bool
		ord    int64
		count  int64
		totals int
	)
	for r.Next() {
		if err := r.Scan(&isRead, &ord, &count); err != nil {
			r.Close()
			return err
		}
		if !isRead {
			totals++
		}
		set(isRead, int(ord-1), count)
	}
	if err := r.Err(); err != nil {
		return err
	}
	switch totals {
	case diffs.len():
		return nil
	case 0:
		// The ID was already recorded: the batch was applied before (its
		// reply was lost). Answer with current totals, read in a new
		// statement so that its snapshot includes a first attempt that was
		// still committing when this one started.
		return s.read(ctx, conn, ns, reads, diffs, set)
	default:
		return fmt.Errorf("push returned %d totals for %d counters", totals, diffs.len())
	}
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
	var ae *acquireError
	if errors.As(err, &ae) || pgconn.SafeToRetry(err) {
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
