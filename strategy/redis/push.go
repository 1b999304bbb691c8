package redis

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/ratesync/ratelimit/strategy"
)

// pushScript applies one batch part: the diffs and reads of one hash tag.
//
//	KEYS[1]     the batch-part id
//	KEYS[2..]   one hash per window
//	ARGV[1]     the batch-part id's TTL in ms; "0" skips the id (test hook)
//	then per window (KEYS[2], KEYS[3], ...):
//	            ttl ms, number of diffs nd, number of reads nr,
//	            nd pairs (field, delta), nr fields
//
// It returns the total of every diff, then of every read, window by window.
// SET NX comes first, so a refusal of the first write (OOM, READONLY, ...)
// leaves nothing behind. A hash gets its TTL right after an increment that
// may have created it (its total equals the delta), so no error later in the
// script can leave a hash without one. An increment of a field that already
// held a total does not refresh the TTL: the hash it is in was given its TTL
// when it was created, and nothing removes a TTL. Skipping that PEXPIRE
// saves a quarter of a synchronous-mode push's work in Redis.
const pushScript = `
local fresh = true
if ARGV[1] ~= '0' then
  fresh = redis.call('SET', KEYS[1], '1', 'NX', 'PX', ARGV[1])
end
local out, n, a = {}, 0, 2
for k = 2, #KEYS do
  local key = KEYS[k]
  local ttl, nd, nr = ARGV[a], tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  a = a + 3
  if fresh then
    for i = 1, nd do
      n = n + 1
      local total = redis.call('HINCRBY', key, ARGV[a], ARGV[a + 1])
      out[n] = total
      if total == tonumber(ARGV[a + 1]) then
        -- The field may be new, and so may the hash: give it its TTL now.
        redis.call('PEXPIRE', key, ttl)
      end
      a = a + 2
    end
  else
    for i = 1, nd do
      n = n + 1
      out[n] = tonumber(redis.call('HGET', key, ARGV[a])) or 0
      a = a + 2
    end
  end
  for i = 1, nr do
    n = n + 1
    out[n] = tonumber(redis.call('HGET', key, ARGV[a])) or 0
    a = a + 1
  end
end
return out
`

var script = goredis.NewScript(pushScript)

// maxInFlight bounds the pipelines of one push or fetch in flight at once.
const maxInFlight = 3

type window struct {
	size  time.Duration
	start int64
}

// partWindow is one hash of a part: indices into Batch.Diffs and Batch.Reads.
type partWindow struct {
	window
	diffs []int32
	reads []int32
}

// part is what one command carries: a script call (diffs and reads of one
// hash tag, at most scriptPerCall diffs) or, for a hash tag the batch does not
// write, HMGETs.
type part struct {
	shard         int
	chunk, chunks int // chunks == 0: a read-only part
	windows       []partWindow
	counters      int

	script *goredis.Cmd        // the script call of a writing part
	gets   []*goredis.SliceCmd // HMGETs of a read-only part, one per window
	args   []any               // the script call's arguments, kept for a NOSCRIPT re-send
	err    error
}

func (p *part) window(w window) *partWindow {
	for i := range p.windows {
		if p.windows[i].window == w {
			return &p.windows[i]
		}
	}
	p.windows = append(p.windows, partWindow{window: w})
	return &p.windows[len(p.windows)-1]
}

// plan splits b into parts. The split depends only on the batch's content
// (each diff's key hash and the number of diffs per shard), never on its
// order, so a re-sent batch maps every diff to the same batch-part id.
func (s *Store) plan(b *strategy.Batch) ([]part, error) {
	if p, ok, err := s.planOneShard(b); ok || err != nil {
		return p, err
	}
	shards := s.opts.Shards
	hashes := make([]uint64, len(b.Diffs))
	perShard := make([]int32, shards)
	for i := range b.Diffs {
		d := &b.Diffs[i]
		if err := checkSize(d.Size); err != nil {
			return nil, fmt.Errorf("diff %d (key %q): %w", i, d.Key, err)
		}
		hashes[i] = keyHash(d.Key)
		perShard[s.shardOf(hashes[i])]++
	}
	// first[shard] is the index of the shard's first part, -1 if none yet.
	first := make([]int32, shards)
	var parts []part
	for sh := range first {
		first[sh] = -1
		if perShard[sh] == 0 {
			continue
		}
		n := (int(perShard[sh]) + s.scriptPerCall - 1) / s.scriptPerCall
		first[sh] = int32(len(parts))
		for c := range n {
			parts = append(parts, part{shard: sh, chunk: c, chunks: n})
		}
	}
	for i := range b.Diffs {
		d := &b.Diffs[i]
		sh := s.shardOf(hashes[i])
		p := &parts[int(first[sh])+chunkOf(hashes[i], parts[first[sh]].chunks)]
		w := p.window(window{d.Size, d.Start})
		w.diffs = append(w.diffs, int32(i))
		p.counters++
	}
	for i := range b.Reads {
		r := &b.Reads[i]
		if err := checkSize(r.Size); err != nil {
			return nil, fmt.Errorf("read %d (key %q): %w", i, r.Key, err)
		}
		h := keyHash(r.Key)
		sh := s.shardOf(h)
		if first[sh] < 0 {
			first[sh] = int32(len(parts))
			parts = append(parts, part{shard: sh})
		}
		p := &parts[first[sh]]
		if p.chunks > 0 {
			p = &parts[int(first[sh])+chunkOf(h, p.chunks)]
		}
		w := p.window(window{r.Size, r.Start})
		w.reads = append(w.reads, int32(i))
		p.counters++
	}
	return parts, nil
}

// planOneShard is plan for the common small batch whose counters all share
// one hash tag (a synchronous-mode increment and its previous window): it
// reports false when the batch is not such a batch.
func (s *Store) planOneShard(b *strategy.Batch) ([]part, bool, error) {
	if len(b.Diffs) == 0 || len(b.Diffs) > s.scriptPerCall || len(b.Diffs)+len(b.Reads) > 8 {
		return nil, false, nil
	}
	sh := s.shardOf(keyHash(b.Diffs[0].Key))
	for i := range b.Diffs {
		if i > 0 && s.shardOf(keyHash(b.Diffs[i].Key)) != sh {
			return nil, false, nil
		}
	}
	for i := range b.Reads {
		if s.shardOf(keyHash(b.Reads[i].Key)) != sh {
			return nil, false, nil
		}
	}
	p := part{shard: sh, chunks: 1, counters: len(b.Diffs) + len(b.Reads)}
	for i := range b.Diffs {
		if err := checkSize(b.Diffs[i].Size); err != nil {
			return nil, false, fmt.Errorf("diff %d (key %q): %w", i, b.Diffs[i].Key, err)
		}
		w := p.window(window{b.Diffs[i].Size, b.Diffs[i].Start})
		w.diffs = append(w.diffs, int32(i))
	}
	for i := range b.Reads {
		if err := checkSize(b.Reads[i].Size); err != nil {
			return nil, false, fmt.Errorf("read %d (key %q): %w", i, b.Reads[i].Key, err)
		}
		w := p.window(window{b.Reads[i].Size, b.Reads[i].Start})
		w.reads = append(w.reads, int32(i))
	}
	return []part{p}, true, nil
}

func chunkOf(h uint64, chunks int) int { return int((h >> 32) % uint64(chunks)) }

// scriptArgs returns the EVALSHA arguments of a writing part.
func (s *Store) scriptArgs(b *strategy.Batch, batchID string, prefix string, p *part) []any {
	n := 4 + len(p.windows) + 1 + 3*len(p.windows)
	for _, w := range p.windows {
		n += 2*len(w.diffs) + len(w.reads)
	}
	args := make([]any, 0, n)
	args = append(args, "evalsha", script.Hash(), strconv.Itoa(1+len(p.windows)),
		prefix+"b:"+batchID+":"+strconv.Itoa(p.chunk)+":"+strconv.Itoa(p.chunks))
	var idTTL int64
	for _, w := range p.windows {
		args = append(args, hashKey(prefix, w.size, w.start))
		idTTL = max(idTTL, s.ttl(w.size))
	}
	idTTL = max(1, min(idTTL, s.opts.BatchIDTTL.Milliseconds())) // "0" would skip the id
	if s.noIdempotent {
		idTTL = 0
	}
	args = append(args, idTTL)
	for _, w := range p.windows {
		args = append(args, s.ttl(w.size), len(w.diffs), len(w.reads))
		// Pointers into the batch: go-redis writes *string and *int64
		// without the allocation that boxing the values would cost.
		for _, i := range w.diffs {
			args = append(args, &b.Diffs[i].Key, &b.Diffs[i].Delta)
		}
		for _, i := range w.reads {
			args = append(args, &b.Reads[i].Key)
		}
	}
	return args
}

// PushDiffs applies b.Diffs exactly once per b.ID and reads b.Reads, in one
// pipelined round trip per Options.BatchSize counters. An error wraps
// strategy.ErrNotApplied only when nothing of the batch was written; after any
// other error the caller must re-send the batch unchanged (see the package
// documentation).
func (s *Store) PushDiffs(ctx context.Context, b *strategy.Batch) (strategy.Result, error) {
	if err := ctx.Err(); err != nil {
		return strategy.Result{}, fmt.Errorf("redis: push %q: %w: %w", b.Namespace, err, strategy.ErrNotApplied)
	}
	parts, err := s.plan(b)
	if err != nil {
		return strategy.Result{}, fmt.Errorf("redis: push %q: %w: %w", b.Namespace, err, strategy.ErrNotApplied)
	}
	batchID := b.ID
	if batchID == "" {
		batchID = newBatchID() // no id: this call alone is applied once
	}
	prefixes := s.shardPrefixes(b.Namespace)
	for i := range parts {
		p := &parts[i]
		prefix := prefixes[p.shard]
		if p.chunks > 0 {
			p.args = s.scriptArgs(b, batchID, prefix, p)
			p.script = goredis.NewCmd(ctx, p.args...)
			continue
		}
		for _, w := range p.windows {
			for lo := 0; lo < len(w.reads); lo += s.scriptPerCall {
				idx := w.reads[lo:min(lo+s.scriptPerCall, len(w.reads))]
				args := make([]any, 0, 2+len(idx))
				args = append(args, "hmget", hashKey(prefix, w.size, w.start))
				for _, j := range idx {
					args = append(args, &b.Reads[j].Key)
				}
				p.gets = append(p.gets, goredis.NewSliceCmd(ctx, args...))
			}
		}
	}
	s.exec(ctx, parts)
	for i := range parts {
		if p := &parts[i]; p.chunks > 0 && p.err == nil && isNoScript(p.script.Err()) {
			// NOSCRIPT: the script did not run. Send it again with its source,
			// which also caches it for the next EVALSHA.
			args := append([]any{"eval", pushScript}, p.args[2:]...)
			p.script = goredis.NewCmd(ctx, args...)
			p.err = errRetry
		}
	}
	s.exec(ctx, parts, errRetry)
	return s.collect(b, parts)
}

// errRetry marks parts exec must send (again).
var errRetry = errors.New("redis: re-send")

// exec sends the commands of parts (only those whose err is only[0], when
// given) in pipelines of at most BatchSize counters, up to maxInFlight
// pipelines at a time so that Redis works while this process encodes the next
// one, and records in each part's err why it was not sent. After a pipeline
// failed in transport it starts no more, so a flaky connection does not
// receive more.
func (s *Store) exec(ctx context.Context, parts []part, only ...error) {
	var sel []int
	for i := range parts {
		if len(only) == 0 || parts[i].err == only[0] {
			sel = append(sel, i)
		}
	}
	if len(sel) == 0 {
		return
	}
	if p := &parts[sel[0]]; len(sel) == 1 && (p.script != nil || len(p.gets) == 1) {
		// One command: no pipeline needed.
		p.err = nil
		if p.script != nil {
			s.combiner.do(ctx, s.send, p.script)
		} else {
			s.combiner.do(ctx, s.send, p.gets[0])
		}
		return
	}
	// Cut sel into pipelines of at most BatchSize counters (at least one part).
	var groups [][]int
	for lo := 0; lo < len(sel); {
		hi, counters := lo, 0
		for hi < len(sel) && (hi == lo || counters+parts[sel[hi]].counters <= s.opts.BatchSize) {
			counters += parts[sel[hi]].counters
			hi++
		}
		groups = append(groups, sel[lo:hi])
		lo = hi
	}
	var broken atomic.Bool
	run := func(group []int) {
		err := ctx.Err()
		if err == nil && broken.Load() {
			err = errors.New("an earlier pipeline failed")
		}
		if err != nil {
			for _, i := range group {
				parts[i].err = fmt.Errorf("not sent: %w: %w", err, strategy.ErrNotApplied)
			}
			return
		}
		var cmds []goredis.Cmder
		for _, i := range group {
			p := &parts[i]
			p.err = nil
			if p.script != nil {
				cmds = append(cmds, p.script)
			}
			for _, c := range p.gets {
				cmds = append(cmds, c)
			}
		}
		s.send(ctx, cmds)
		for _, i := range group {
			if err := parts[i].cmdErr(); err != nil && !isRedisError(err) {
				broken.Store(true)
			}
		}
	}
	if len(groups) == 1 {
		run(groups[0])
		return
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(maxInFlight, len(groups)) {
		wg.Go(func() {
			for g := next.Add(1) - 1; g < int64(len(groups)); g = next.Add(1) - 1 {
				run(groups[g])
			}
		})
	}
	wg.Wait()
}

// send executes cmds in one round trip: one command alone, several in a
// pipeline. With Options.WaitReplicas a pipeline that runs scripts ends with
// WAIT, and when too few replicas acknowledged, the scripts that succeeded get
// an error that leaves their outcome unknown.
func (s *Store) send(ctx context.Context, cmds []goredis.Cmder) {
	wait := s.opts.WaitReplicas > 0 && slices.ContainsFunc(cmds, isScript)
	if len(cmds) == 1 && !wait {
		_ = s.client.Process(ctx, cmds[0])
		return
	}
	pipe := s.client.Pipeline()
	for _, c := range cmds {
		_ = pipe.Process(ctx, c)
	}
	var w *goredis.IntCmd
	if wait {
		w = goredis.NewIntCmd(ctx, "wait", s.opts.WaitReplicas, s.opts.WaitTimeout.Milliseconds())
		_ = pipe.Process(ctx, w)
	}
	_, _ = pipe.Exec(ctx)
	if w == nil {
		return
	}
	n, err := w.Result()
	if err == nil && n >= int64(s.opts.WaitReplicas) {
		return
	}
	if err == nil {
		err = fmt.Errorf("redis: %d of %d replicas acknowledged the push within %v: outcome unknown",
			n, s.opts.WaitReplicas, s.opts.WaitTimeout)
	} else {
		err = fmt.Errorf("redis: WAIT: %w: outcome unknown", err)
	}
	for _, c := range cmds {
		if isScript(c) && c.Err() == nil {
			c.SetErr(err)
		}
	}
}

func isScript(c goredis.Cmder) bool { n := c.Name(); return n == "evalsha" || n == "eval" }

// cmdErr is the first error of the part's commands.
func (p *part) cmdErr() error {
	if p.script != nil {
		return p.script.Err()
	}
	for _, c := range p.gets {
		if err := c.Err(); err != nil {
			return err
		}
	}
	return nil
}

// collect fills the result from the parts' replies, or returns the error that
// classifies the batch's outcome.
func (s *Store) collect(b *strategy.Batch, parts []part) (strategy.Result, error) {
	res := strategy.Result{Totals: make([]int64, len(b.Diffs)), Reads: make([]int64, len(b.Reads))}
	var (
		firstErr                   error
		failed, written, unwritten int
	)
	for i := range parts {
		p := &parts[i]
		err := p.err
		if err == nil {
			err = p.cmdErr()
		}
		if err == nil {
			err = p.fill(&res)
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
		if p.chunks > 0 {
			if s.surelyNotApplied(err) {
				unwritten++
			} else {
				written++ // maybe
			}
		}
	}
	if failed == 0 {
		return res, nil
	}
	if written == 0 {
		return strategy.Result{}, fmt.Errorf("redis: push %q: %d of %d parts failed, none applied: %w: %w",
			b.Namespace, failed, len(parts), firstErr, strategy.ErrNotApplied)
	}
	return strategy.Result{}, fmt.Errorf("redis: push %q: %d of %d parts failed (%d surely not applied), outcome unknown: %w",
		b.Namespace, failed, len(parts), unwritten, firstErr)
}

// fill copies the part's replies into res.
func (p *part) fill(res *strategy.Result) error {
	if p.chunks > 0 {
		vals, err := p.script.Slice()
		if err != nil {
			return err
		}
		if len(vals) != p.counters {
			return fmt.Errorf("redis: script returned %d values, want %d", len(vals), p.counters)
		}
		n := 0
		for _, w := range p.windows {
			for _, i := range w.diffs {
				v, ok := vals[n].(int64)
				if !ok {
					return fmt.Errorf("redis: script returned %T, want int64", vals[n])
				}
				res.Totals[i] = v
				n++
			}
			for _, i := range w.reads {
				v, ok := vals[n].(int64)
				if !ok {
					return fmt.Errorf("redis: script returned %T, want int64", vals[n])
				}
				res.Reads[i] = v
				n++
			}
		}
		return nil
	}
	g := 0
	for _, w := range p.windows {
		for lo := 0; lo < len(w.reads); g++ {
			vals := p.gets[g].Val()
			idx := w.reads[lo:min(lo+len(vals), len(w.reads))]
			for j, i := range idx {
				n, err := parseCount(vals[j])
				if err != nil {
					return err
				}
				res.Reads[i] = n
			}
			lo += len(vals)
			if len(vals) == 0 {
				return errors.New("redis: empty HMGET reply")
			}
		}
	}
	return nil
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
