package redis

import (
	"errors"
	"fmt"
	"strconv"

	goredis "github.com/redis/go-redis/v9"

	"github.com/ratesync/ratelimit/strategy"
)

// readCmd is a read a part sends outside its script: an HMGET of counters
// (indices into Batch.Reads) or an MGET of buckets (into Batch.BucketReads).
type readCmd struct {
	cmd     *goredis.SliceCmd
	idx     []int32
	buckets bool
}

// cmds returns the part's commands: its script, then its reads. A re-send
// after NOSCRIPT sends the reads again too, so that they still follow the
// script's writes.
func (p *part) cmds() []goredis.Cmder {
	cmds := make([]goredis.Cmder, 0, 1+len(p.gets))
	if p.script != nil {
		cmds = append(cmds, p.script)
	}
	for _, g := range p.gets {
		cmds = append(cmds, g.cmd)
	}
	return cmds
}

// cmdErr is the first error of the part's commands. A read of a key of
// another type is no error: it reads zeros, as the scripts do.
func (p *part) cmdErr() error {
	if p.script != nil {
		if err := p.script.Err(); err != nil {
			return err
		}
	}
	for _, g := range p.gets {
		if err := g.cmd.Err(); err != nil && !goredis.HasErrorPrefix(err, "WRONGTYPE") {
			return err
		}
	}
	return nil
}

// newResult returns b's result to fill, and its watches' accumulators.
func (s *Store) newResult(b *strategy.Batch) (strategy.Result, []watchAcc) {
	res := strategy.Result{Totals: make([]int64, len(b.Diffs)), Reads: make([]int64, len(b.Reads))}
	if len(b.BucketDiffs) > 0 {
		res.Buckets = make([]strategy.BucketState, len(b.BucketDiffs))
	}
	if len(b.BucketReads) > 0 {
		res.BucketReads = make([]strategy.BucketState, len(b.BucketReads))
	}
	acc := make([]watchAcc, len(b.Watches))
	for i := range acc {
		acc[i].versions = make([]int64, s.opts.Shards)
	}
	return res, acc
}

// collect fills res and acc from the parts' replies, or returns the error
// that classifies the batch's outcome.
func (s *Store) collect(b *strategy.Batch, parts []part, res *strategy.Result, acc []watchAcc) error {
	var (
		firstErr, unknownErr       error
		failed, written, unwritten int
	)
	for i := range parts {
		p := &parts[i]
		err := p.err
		if err == nil {
			err = p.cmdErr()
		}
		if err == nil {
			err = s.fill(b, p, res, acc)
		}
		if err == nil {
			if p.chunks > 0 {
				written++
			}
			continue
		}
		failed++
		if firstErr == nil {
			firstErr = err
		}
		if unknownErr == nil && !errors.Is(err, strategy.ErrNotApplied) {
			unknownErr = err
		}
		if p.chunks > 0 {
			if s.surelyNotApplied(err) && !p.mayHaveRun {
				unwritten++
			} else {
				written++ // maybe
			}
		}
	}
	if failed == 0 {
		return nil
	}
	if written == 0 {
		return fmt.Errorf("redis: push %q: %d of %d parts failed, none applied: %w: %w",
			b.Namespace, failed, len(parts), firstErr, strategy.ErrNotApplied)
	}
	// Some part may have been applied: the error must not match
	// ErrNotApplied, even when every failed part's own error does.
	if unknownErr == nil {
		unknownErr = errors.New(firstErr.Error())
	}
	return fmt.Errorf("redis: push %q: %d of %d parts failed (%d surely not applied), outcome unknown: %w",
		b.Namespace, failed, len(parts), unwritten, unknownErr)
}

// reply walks a script's reply.
type reply struct {
	vals []any
	i    int
}

func (r *reply) next() (any, error) {
	if r.i >= len(r.vals) {
		return nil, fmt.Errorf("redis: script returned %d values, want more", len(r.vals))
	}
	v := r.vals[r.i]
	r.i++
	return v, nil
}

func (r *reply) int() (int64, error) {
	v, err := r.next()
	if err != nil {
		return 0, err
	}
	n, ok := v.(int64)
	if !ok {
		return 0, fmt.Errorf("redis: script returned %T, want int64", v)
	}
	return n, nil
}

// fill copies the part's replies into res, and its watch answers into acc.
func (s *Store) fill(b *strategy.Batch, p *part, res *strategy.Result, acc []watchAcc) error {
	if p.script != nil {
		vals, err := p.script.Slice()
		if err != nil {
			return err
		}
		r := &reply{vals: vals}
		if err := p.fillScript(b, r, res, acc); err != nil {
			return err
		}
		if r.i != len(vals) {
			return fmt.Errorf("redis: script returned %d values, want %d", len(vals), r.i)
		}
	}
	for _, g := range p.gets {
		vals := g.cmd.Val() // nil after WRONGTYPE: zeros
		if len(vals) != 0 && len(vals) != len(g.idx) {
			return fmt.Errorf("redis: %s returned %d values, want %d", g.cmd.Name(), len(vals), len(g.idx))
		}
		for j, i := range g.idx {
			var v any
			if len(vals) > 0 {
				v = vals[j]
			}
			if g.buckets {
				res.BucketReads[i] = parseBucket(v)
			} else {
				res.Reads[i] = leniently(v)
			}
		}
	}
	return nil
}

// fillScript reads a script's reply: a writing part's totals, reads and
// bucket states, then any part's watch answers.
func (p *part) fillScript(b *strategy.Batch, r *reply, res *strategy.Result, acc []watchAcc) error {
	p.fresh = true
	if p.chunks > 0 {
		fresh, err := r.int()
		if err != nil {
			return err
		}
		p.fresh = fresh == 1
		for _, w := range p.windows {
			for _, i := range w.diffs {
				if res.Totals[i], err = r.int(); err != nil {
					return err
				}
			}
			if !p.readsInScript {
				continue
			}
			for _, i := range w.reads {
				if res.Reads[i], err = r.int(); err != nil {
					return err
				}
			}
		}
		for _, i := range p.bucketDiffs {
			v, err := r.next()
			if err != nil {
				return err
			}
			res.Buckets[i] = parseBucket(v)
		}
	}
	for _, pw := range p.watches {
		if err := acc[pw.watch].add(b, p, pw, r); err != nil {
			return err
		}
	}
	return nil
}

// leniently reads a counter's value as HMGET returns it: nil when the field
// does not exist, and 0 for a value that is not an integer (as the push
// script reads it: a corrupt field never fails a push).
func leniently(v any) int64 {
	n, err := parseCount(v)
	if err != nil {
		return 0
	}
	return n
}

// parseCount reads a hash field's value as returned by HMGET: nil when the
// field does not exist.
func parseCount(v any) (int64, error) {
	switch v := v.(type) {
	case nil:
		return 0, nil
	case string:
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("redis: counter value %q: %w", v, err)
		}
		return n, nil
	case int64:
		return v, nil
	default:
		return 0, fmt.Errorf("redis: counter value of type %T", v)
	}
}
