package redis

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"

	goredis "github.com/redis/go-redis/v9"

	"github.com/ratesync/ratelimit/strategy"
)

// maxTotal is strategy.MaxTotal as a script argument.
var maxTotal = strconv.FormatInt(strategy.MaxTotal, 10)

// maxInFlight bounds the pipelines of one push or fetch in flight at once.
const maxInFlight = 3

// scriptArgs returns the EVALSHA arguments of a writing part (see
// lua/push.lua).
func (s *Store) scriptArgs(b *strategy.Batch, batchID, prefix string, p *part, cursors [][]string, limits []int) []any {
	// A window the part writes or watches comes with its version key, log
	// and markers; one it only reads, alone.
	full := make([]bool, len(p.windows))
	nk := 1 + len(p.bucketDiffs)
	for i, w := range p.windows {
		full[i] = len(w.diffs) > 0
	}
	for _, pw := range p.watches {
		full[pw.window] = true
	}
	for i := range p.windows {
		nk++
		if full[i] {
			nk += 3
		}
	}
	n := 3 + nk + 9 + 5*len(p.windows) + 4*len(p.bucketDiffs) + 3*len(p.watches) // at most
	for _, w := range p.windows {
		n += 2 * len(w.diffs)
		if p.readsInScript {
			n += len(w.reads)
		}
	}
	args := make([]any, 0, n)
	args = append(args, "evalsha", pushScript.Hash(), nk,
		prefix+"b:"+batchID+":"+strconv.Itoa(p.chunk)+":"+strconv.Itoa(p.chunks))
	var idTTL int64
	for i, w := range p.windows {
		h := hashKey(prefix, w.size, w.start)
		args = append(args, h)
		if full[i] {
			args = append(args, h+versionSuffix, h+logSuffix, h+markSuffix)
		}
		if len(w.diffs) > 0 {
			idTTL = max(idTTL, s.ttl(w.size))
		}
	}
	if len(p.bucketDiffs) > 0 {
		idTTL = s.opts.BatchIDTTL.Milliseconds() // buckets live as long as they owe tokens
	}
	for _, i := range p.bucketDiffs {
		args = append(args, bucketKey(prefix, b.BucketDiffs[i].BucketID))
	}
	idTTL = max(1, min(idTTL, s.opts.BatchIDTTL.Milliseconds())) // "0" would skip the id
	if s.noIdempotent {
		idTTL = 0
	}
	args = append(args, idTTL, maxTotal, len(p.windows), len(p.bucketDiffs), len(p.watches))
	if len(p.bucketDiffs) > 0 {
		args = append(args, b.Now, strategy.BucketRetention.Milliseconds(), s.opts.ExpiryMargin.Milliseconds())
	}
	if len(p.watches) > 0 {
		args = append(args, newToken())
	}
	for i, w := range p.windows {
		nr := 0
		if p.readsInScript {
			nr = len(w.reads)
		}
		if full[i] {
			nbatch := w.batchDiffs
			switch n := len(b.Diffs); {
			case b.Bulk && len(w.diffs) > 0:
				// A bulk batch marks its versions rather than logging
				// (see lua/versions.lua: a batch of this many diffs does).
				nbatch = 1 << 30
			case b.PassDiffs > n && n > 0:
				// The window's share of the whole pass: the script marks
				// when that is at least half the window's counters.
				nbatch = int(min(int64(w.batchDiffs)*int64(b.PassDiffs)/int64(n), 1<<30))
			}
			args = append(args, 4, len(w.diffs), nr, s.ttl(w.size), nbatch)
		} else {
			args = append(args, 1, len(w.diffs), nr)
		}
		// Pointers into the batch: go-redis writes *string and *int64
		// without the allocation that boxing the values would cost.
		for _, i := range w.diffs {
			args = append(args, &b.Diffs[i].Key, &b.Diffs[i].Delta)
		}
		if p.readsInScript {
			for _, i := range w.reads {
				args = append(args, &b.Reads[i].Key)
			}
		}
	}
	for _, i := range p.bucketDiffs {
		d := &b.BucketDiffs[i]
		args = append(args, d.Period.Milliseconds(), d.Add, d.Floor, d.Interval)
	}
	for _, pw := range p.watches {
		cursor := cursors[pw.watch][p.shard]
		if pw.report {
			cursor = "="
		}
		args = append(args, pw.window+1, limits[pw.watch], cursor)
	}
	return args
}

// watchArgs returns the EVALSHA arguments of a read-only part's watches
// (see lua/watch.lua).
func (s *Store) watchArgs(prefix string, p *part, cursors [][]string, limits []int) []any {
	n := 3 + 4*len(p.watches) + 2 + 4*len(p.watches)
	for _, pw := range p.watches {
		n += len(pw.excludes)
	}
	args := make([]any, 0, n)
	args = append(args, "evalsha", watchScript.Hash(), 4*len(p.watches))
	for _, pw := range p.watches {
		w := p.windows[pw.window]
		h := hashKey(prefix, w.size, w.start)
		args = append(args, h, h+versionSuffix, h+logSuffix, h+markSuffix)
	}
	args = append(args, newToken(), len(p.watches))
	for _, pw := range p.watches {
		args = append(args, s.ttl(p.windows[pw.window].size), limits[pw.watch], cursors[pw.watch][p.shard], len(pw.excludes))
		for _, v := range pw.excludes {
			args = append(args, v)
		}
	}
	return args
}

// readCmds adds to p the commands of the reads its script does not make:
// HMGETs of counters, MGETs of buckets, at most scriptPerCall fields each.
func (s *Store) readCmds(ctx context.Context, b *strategy.Batch, prefix string, p *part) {
	if !p.readsInScript {
		for _, w := range p.windows {
			for lo := 0; lo < len(w.reads); lo += s.scriptPerCall {
				idx := w.reads[lo:min(lo+s.scriptPerCall, len(w.reads))]
				args := make([]any, 0, 2+len(idx))
				args = append(args, "hmget", hashKey(prefix, w.size, w.start))
				for _, j := range idx {
					args = append(args, &b.Reads[j].Key)
				}
				p.gets = append(p.gets, readCmd{cmd: goredis.NewSliceCmd(ctx, args...), idx: idx})
			}
		}
	}
	for lo := 0; lo < len(p.bucketReads); lo += s.scriptPerCall {
		idx := p.bucketReads[lo:min(lo+s.scriptPerCall, len(p.bucketReads))]
		args := make([]any, 0, 1+len(idx))
		args = append(args, "mget")
		for _, j := range idx {
			args = append(args, bucketKey(prefix, b.BucketReads[j]))
		}
		p.gets = append(p.gets, readCmd{cmd: goredis.NewSliceCmd(ctx, args...), idx: idx, buckets: true})
	}
}

// PushDiffs applies b.Diffs and b.BucketDiffs exactly once per b.ID, reads
// b.Reads and b.BucketReads and answers b.Watches, in one pipelined round
// trip per Options.BatchSize counters. An error wraps
// strategy.ErrNotApplied only when nothing of the batch was written; after
// any other error the caller must re-send the batch unchanged (see the
// package documentation).
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
	cursors := make([][]string, len(b.Watches))
	for i := range b.Watches {
		cursors[i] = s.cursorArgs(b.Watches[i].Cursor)
	}
	limits := s.shardLimits(b)
	for i := range parts {
		p := &parts[i]
		prefix := prefixes[p.shard]
		switch {
		case p.chunks > 0:
			p.args = s.scriptArgs(b, batchID, prefix, p, cursors, limits)
		case len(p.watches) > 0:
			p.args = s.watchArgs(prefix, p, cursors, limits)
		}
		if p.args != nil {
			p.script = goredis.NewCmd(ctx, p.args...)
		}
		s.readCmds(ctx, b, prefix, p)
	}
	s.run(ctx, parts)
	res, acc := s.newResult(b)
	if err := s.collect(b, parts, &res, acc); err != nil {
		return strategy.Result{}, err
	}
	if follow := s.followUps(ctx, b, prefixes, cursors, limits, acc); len(follow) > 0 {
		s.run(ctx, follow)
		for i := range follow {
			p := &follow[i]
			err := p.err
			if err == nil {
				err = p.cmdErr()
			}
			if err == nil {
				err = s.fill(b, p, &res, acc)
			}
			if err != nil {
				// The batch was applied: a re-send applies nothing and
				// answers its watches again.
				return strategy.Result{}, fmt.Errorf("redis: push %q: applied, but its watches failed: outcome unknown: %w", b.Namespace, err)
			}
		}
	}
	if len(b.Watches) > 0 {
		res.Changes = s.changes(b, &res, acc)
	}
	return res, nil
}

// run sends the parts' commands, and sends again with EVAL the scripts that
// met NOSCRIPT.
func (s *Store) run(ctx context.Context, parts []part) {
	s.exec(ctx, parts, allParts(parts))
	for i := range parts {
		if p := &parts[i]; p.script != nil && p.err == nil && isNoScript(p.script.Err()) {
			// NOSCRIPT: the attempt it answers did not run. Send it again
			// with its source, which also caches it for the next EVALSHA.
			// An earlier attempt of a retrying client may have run and lost
			// its reply (a Redis restarted in between has lost its script
			// cache), so a re-send that is never sent proves nothing.
			p.mayHaveRun = p.mayHaveRun || s.mayHaveRetried()
			p.script = goredis.NewCmd(ctx, evalArgs(p.args)...)
			p.err = errRetry
		}
	}
	s.exec(ctx, parts, partsFailedWith(parts, errRetry))
}

// followUps returns the watch parts that answer, once every script call of
// the batch ran, the watches of the shards the batch wrote in several calls
// (see partWatch.report).
func (s *Store) followUps(ctx context.Context, b *strategy.Batch, prefixes []string, cursors [][]string, limits []int, acc []watchAcc) []part {
	var parts []part
	byShard := map[int]int{}
	for i := range acc {
		for sh, own := range acc[i].reported {
			if own == nil {
				continue
			}
			j, ok := byShard[sh]
			if !ok {
				j = len(parts)
				byShard[sh] = j
				parts = append(parts, part{shard: sh})
			}
			p := &parts[j]
			w := &b.Watches[i]
			slices.Sort(own)
			p.watches = append(p.watches, partWatch{window: p.windowIndex(window{w.Size, w.Start}), watch: int32(i), excludes: own})
			p.counters++
		}
	}
	for i := range parts {
		p := &parts[i]
		p.args = s.watchArgs(prefixes[p.shard], p, cursors, limits)
		p.script = goredis.NewCmd(ctx, p.args...)
	}
	return parts
}

// errRetry marks the parts to send again.
var errRetry = errors.New("redis: re-send")

// exec sends the commands of the parts sel selects, and records in each
// part's err why it was not sent. It goes in three steps: a lone command goes
// straight out (through the combiner, which may pipeline it with other
// callers'); otherwise the parts are cut into pipelines of at most BatchSize
// counters, and those are sent up to maxInFlight at a time, so that Redis
// works while this process encodes the next one.
func (s *Store) exec(ctx context.Context, parts []part, sel []int) {
	switch {
	case len(sel) == 0:
	case s.sendAlone(ctx, parts, sel):
	default:
		s.sendPipelines(ctx, parts, s.pipelines(parts, sel))
	}
}

// allParts selects every part.
func allParts(parts []part) []int {
	sel := make([]int, len(parts))
	for i := range sel {
		sel[i] = i
	}
	return sel
}

// partsFailedWith selects the parts whose err is err.
func partsFailedWith(parts []part, err error) []int {
	var sel []int
	for i := range parts {
		if parts[i].err == err {
			sel = append(sel, i)
		}
	}
	return sel
}

// sendAlone sends the selection when it is a single command, and reports
// whether it was.
func (s *Store) sendAlone(ctx context.Context, parts []part, sel []int) bool {
	if len(sel) > 1 {
		return false
	}
	p := &parts[sel[0]]
	cmds := p.cmds()
	if len(cmds) != 1 {
		return false
	}
	p.err = nil
	s.combiner.do(ctx, s.send, cmds[0])
	return true
}

// pipelines cuts the selection into groups of at most BatchSize counters (at
// least one part each), in order.
func (s *Store) pipelines(parts []part, sel []int) [][]int {
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
	return groups
}

// sendPipelines sends each group as one pipeline, up to maxInFlight at once.
// After a pipeline failed in transport it starts no more, so a flaky
// connection does not receive more: the parts not sent get an error that
// says so (and that they surely were not applied).
func (s *Store) sendPipelines(ctx context.Context, parts []part, groups [][]int) {
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
			cmds = append(cmds, p.cmds()...)
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
// pipeline. With Options.WaitReplicas a pipeline that runs scripts that write
// ends with WAIT, and when too few replicas acknowledged, those scripts that
// succeeded get an error that leaves their outcome unknown.
func (s *Store) send(ctx context.Context, cmds []goredis.Cmder) {
	wait := s.opts.WaitReplicas > 0 && slices.ContainsFunc(cmds, writes)
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
		if writes(c) && c.Err() == nil {
			c.SetErr(err)
		}
	}
}
