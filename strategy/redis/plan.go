package redis

import (
	"fmt"
	"math"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/ratesync/ratelimit/strategy"
)

type window struct {
	size  time.Duration
	start int64
}

// partWindow is one hash of a part: indices into Batch.Diffs and Batch.Reads.
type partWindow struct {
	window
	diffs []int32
	reads []int32
	// batchDiffs counts the batch's diffs of the window in the part's hash
	// tag, all its parts': a batch that changes at least half of a
	// window's counters there marks its versions instead of logging each
	// counter (see mark in lua/versions.lua).
	batchDiffs int
}

// partWatch is a watch a part answers for its shard: the window (an index
// into part.windows) and the watch (an index into Batch.Watches).
type partWatch struct {
	window int
	watch  int32
	// report: the part only reports its version of the window. A shard
	// the batch writes in several script calls answers its watches in a
	// follow-up call, once all of them ran, which lists the changes of
	// every version but those (excludes): a call answering before the
	// others would list the counters they are about to write.
	report   bool
	excludes []int64
}

// part is what one hash tag's commands carry. A writing part is one script
// call (diffs and bucket diffs of one hash tag, at most scriptPerCall, its
// watches, and its reads when they are few) followed by HMGETs of its other
// reads; a read-only part (chunks == 0, for a hash tag the batch does not
// write) is HMGETs, a watch script call and MGETs of bucket reads.
type part struct {
	shard         int
	chunk, chunks int // chunks == 0: a read-only part
	windows       []partWindow
	watches       []partWatch
	bucketDiffs   []int32 // indices into Batch.BucketDiffs
	bucketReads   []int32 // indices into Batch.BucketReads
	counters      int
	// readsInScript: a writing part's reads are read by its script (a few
	// HGETs cost Redis less there than a command of their own), else by
	// HMGETs in the same pipeline (which cost Redis a quarter of what an
	// HMGET from a script does).
	readsInScript bool

	script *goredis.Cmd // the push script, or a read-only part's watch script
	gets   []readCmd    // HMGETs of reads, MGETs of bucket reads
	args   []any        // the script call's arguments, kept for a NOSCRIPT re-send
	fresh  bool         // the script applied the part (false: a re-send found it applied)
	// mayHaveRun: the script met NOSCRIPT after go-redis may have made
	// several attempts, so an earlier attempt may have run (see run).
	mayHaveRun bool
	err        error
}

// maxScriptReads is the most reads a writing part's script reads itself.
const maxScriptReads = 8

// windowIndex returns the index of w in p.windows, adding it if needed.
func (p *part) windowIndex(w window) int {
	for i := range p.windows {
		if p.windows[i].window == w {
			return i
		}
	}
	p.windows = append(p.windows, partWindow{window: w})
	return len(p.windows) - 1
}

func (p *part) window(w window) *partWindow { return &p.windows[p.windowIndex(w)] }

// plan splits b into parts. The split of what a part writes depends only on
// the batch's content (each diff's key hash and the number of diffs per
// shard), never on its order, so a re-sent batch maps every diff to the same
// batch-part id.
func (s *Store) plan(b *strategy.Batch) ([]part, error) {
	if p, ok, err := s.planOneShard(b); ok || err != nil {
		return p, err
	}
	if err := checkBuckets(b); err != nil {
		return nil, err
	}
	shards := s.opts.Shards
	nd := len(b.Diffs)
	hashes := make([]uint64, nd+len(b.BucketDiffs))
	perShard := make([]int32, shards)
	for i := range b.Diffs {
		d := &b.Diffs[i]
		if err := checkSize(d.Size); err != nil {
			return nil, fmt.Errorf("diff %d (key %q): %w", i, d.Key, err)
		}
		hashes[i] = keyHash(d.Key)
		perShard[s.shardOf(hashes[i])]++
	}
	for i := range b.BucketDiffs {
		hashes[nd+i] = keyHash(b.BucketDiffs[i].Key)
		perShard[s.shardOf(hashes[nd+i])]++
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
	writer := func(h uint64) *part {
		sh := s.shardOf(h)
		return &parts[int(first[sh])+chunkOf(h, parts[first[sh]].chunks)]
	}
	for i := range b.Diffs {
		d := &b.Diffs[i]
		p := writer(hashes[i])
		w := p.window(window{d.Size, d.Start})
		w.diffs = append(w.diffs, int32(i))
		w.batchDiffs++
		p.counters++
	}
	for i := range b.BucketDiffs {
		p := writer(hashes[nd+i])
		p.bucketDiffs = append(p.bucketDiffs, int32(i))
		p.counters++
	}
	for sh := range first {
		if first[sh] >= 0 && parts[first[sh]].chunks > 1 {
			countBatchDiffs(parts[first[sh] : int(first[sh])+parts[first[sh]].chunks])
		}
	}
	// reader returns the part that reads a key of hash h: the writing part
	// of its shard and chunk, or the shard's read-only part.
	reader := func(h uint64) *part {
		sh := s.shardOf(h)
		if first[sh] < 0 {
			first[sh] = int32(len(parts))
			parts = append(parts, part{shard: sh})
		}
		p := &parts[first[sh]]
		if p.chunks > 0 {
			p = &parts[int(first[sh])+chunkOf(h, p.chunks)]
		}
		return p
	}
	for i := range b.Reads {
		r := &b.Reads[i]
		if err := checkSize(r.Size); err != nil {
			return nil, fmt.Errorf("read %d (key %q): %w", i, r.Key, err)
		}
		p := reader(keyHash(r.Key))
		w := p.window(window{r.Size, r.Start})
		w.reads = append(w.reads, int32(i))
		p.counters++
	}
	for i := range b.BucketReads {
		p := reader(keyHash(b.BucketReads[i].Key))
		p.bucketReads = append(p.bucketReads, int32(i))
		p.counters++
	}
	// A watch is answered in every shard, by the shard's first part (or in
	// a follow-up, see partWatch.report).
	for i := range b.Watches {
		w := &b.Watches[i]
		if err := checkSize(w.Size); err != nil {
			return nil, fmt.Errorf("watch %d: %w", i, err)
		}
		for sh := range shards {
			if first[sh] < 0 {
				first[sh] = int32(len(parts))
				parts = append(parts, part{shard: sh})
			}
			p := &parts[first[sh]]
			if p.chunks > 1 {
				for c := range p.chunks {
					q := &parts[int(first[sh])+c]
					q.watches = append(q.watches, partWatch{window: q.windowIndex(window{w.Size, w.Start}), watch: int32(i), report: true})
					q.counters++
				}
				continue
			}
			p.watches = append(p.watches, partWatch{window: p.windowIndex(window{w.Size, w.Start}), watch: int32(i)})
			p.counters++
		}
	}
	for i := range parts {
		p := &parts[i]
		if p.chunks > 0 {
			reads := 0
			for _, w := range p.windows {
				reads += len(w.reads)
			}
			p.readsInScript = reads <= maxScriptReads
		}
	}
	return parts, nil
}

// planOneShard is plan for the common small batch whose counters all share
// one hash tag (a synchronous-mode increment and its previous window): it
// reports false when the batch is not such a batch.
func (s *Store) planOneShard(b *strategy.Batch) ([]part, bool, error) {
	if len(b.Diffs) == 0 || len(b.Diffs) > s.scriptPerCall || len(b.Diffs)+len(b.Reads) > maxScriptReads ||
		len(b.Watches) > 0 || len(b.BucketDiffs) > 0 || len(b.BucketReads) > 0 {
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
	p := part{shard: sh, chunks: 1, counters: len(b.Diffs) + len(b.Reads), readsInScript: true}
	for i := range b.Diffs {
		if err := checkSize(b.Diffs[i].Size); err != nil {
			return nil, false, fmt.Errorf("diff %d (key %q): %w", i, b.Diffs[i].Key, err)
		}
		w := p.window(window{b.Diffs[i].Size, b.Diffs[i].Start})
		w.diffs = append(w.diffs, int32(i))
		w.batchDiffs++
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

// countBatchDiffs sets the batchDiffs of the windows of the parts of one
// shard (counted so far part by part) to their sum over the parts.
func countBatchDiffs(parts []part) {
	sum := map[window]int{}
	for i := range parts {
		for _, w := range parts[i].windows {
			sum[w.window] += w.batchDiffs
		}
	}
	for i := range parts {
		for j := range parts[i].windows {
			w := &parts[i].windows[j]
			w.batchDiffs = sum[w.window]
		}
	}
}

// checkBuckets refuses bucket diffs and reads the store cannot apply: a
// period that is not a positive whole number of milliseconds, an interval
// that is not a positive finite number, an add or floor that is not finite.
func checkBuckets(b *strategy.Batch) error {
	for i := range b.BucketDiffs {
		d := &b.BucketDiffs[i]
		if err := checkSize(d.Period); err != nil {
			return fmt.Errorf("bucket diff %d (key %q): period: %w", i, d.Key, err)
		}
		if !(d.Interval > 0) || math.IsInf(d.Interval, 0) || !finite(d.Add) || !finite(d.Floor) {
			return fmt.Errorf("bucket diff %d (key %q): interval %v, add %v, floor %v: want finite numbers and a positive interval",
				i, d.Key, d.Interval, d.Add, d.Floor)
		}
	}
	for i := range b.BucketReads {
		if err := checkSize(b.BucketReads[i].Period); err != nil {
			return fmt.Errorf("bucket read %d (key %q): period: %w", i, b.BucketReads[i].Key, err)
		}
	}
	return nil
}

func finite(f float64) bool { return !math.IsNaN(f) && !math.IsInf(f, 0) }
