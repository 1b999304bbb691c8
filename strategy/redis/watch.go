package redis

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"

	"github.com/ratesync/ratelimit/strategy"
)

// A window's hash has three companions in its hash tag, with its TTL: its
// version key, its change log and its markers (see lua/versions.lua).
const (
	versionSuffix = ":v"
	logSuffix     = ":l"
	markSuffix    = ":m"
)

// maxVersion bounds the versions a cursor may hold: they are exact in a
// Lua number.
const maxVersion = 1 << 53

// newToken returns a random incarnation for a window a script (re)creates:
// a whole number in [1, 2^28], so that incarnation * 2^24 + count stays
// below 2^53.
func newToken() int64 { return rand.Int64N(1<<28) + 1 }

// cursorArgs returns the script argument of each shard for a Watch's cursor:
// "" (from the start), a version, or "x" for a cursor that is not one of
// this Store's (another Shards count, a corrupt string): Overflow.
//
// A cursor lists one version per shard, in base 36, separated by commas;
// an empty entry is a shard that held nothing of the window when it was
// answered. A cursor whose every entry is empty is "".
func (s *Store) cursorArgs(cursor string) []string {
	out := make([]string, s.opts.Shards)
	if cursor == "" {
		return out
	}
	entries := strings.Split(cursor, ",")
	if len(entries) != len(out) {
		for i := range out {
			out[i] = "x"
		}
		return out
	}
	for i, e := range entries {
		if e == "" {
			continue
		}
		v, err := strconv.ParseUint(e, 36, 64)
		if err != nil || v >= maxVersion {
			out[i] = "x"
			continue
		}
		out[i] = strconv.FormatUint(v, 10)
	}
	return out
}

// shardLimits returns, for each of b's watches, the limit each shard
// answers it with: the watch's limit less the batch's own diffs of the
// window (which count toward it), shared among the shards with room for an
// uneven spread: twice a shard's share, plus 64, is more than eight
// standard deviations above the mean when the changed keys spread as their
// hashes do. A shard past it overflows, and so does the watch, without the
// shards listing up to the whole limit each; a watch whose own diffs are
// past its limit overflows in every shard at once (-1). The answer is
// checked against the watch's exact limit after.
func (s *Store) shardLimits(b *strategy.Batch) []int {
	out := make([]int, len(b.Watches))
	if len(b.Watches) == 0 {
		return out
	}
	own := make(map[window]int, len(b.Watches))
	for i := range b.Watches {
		own[window{b.Watches[i].Size, b.Watches[i].Start}] = 0
	}
	for i := range b.Diffs {
		w := window{b.Diffs[i].Size, b.Diffs[i].Start}
		if n, ok := own[w]; ok {
			own[w] = n + 1
		}
	}
	for i := range b.Watches {
		w := &b.Watches[i]
		left := w.Limit - own[window{w.Size, w.Start}]
		if left < 0 {
			out[i] = -1
			continue
		}
		out[i] = min(left, left/s.opts.Shards*2+64)
	}
	return out
}

// encodeCursor returns the cursor of the shards' versions (0: none).
func encodeCursor(versions []int64) string {
	n := 0
	for _, v := range versions {
		if v != 0 {
			n++
		}
	}
	if n == 0 {
		return ""
	}
	buf := make([]byte, 0, len(versions)*12)
	for i, v := range versions {
		if i > 0 {
			buf = append(buf, ',')
		}
		if v != 0 {
			buf = strconv.AppendInt(buf, v, 36)
		}
	}
	return string(buf)
}

// The statuses of a shard's answer to a watch (see answer in
// lua/versions.lua).
const (
	statusListed   = 0 // the changes since the cursor but the batch's own
	statusOverflow = 1 // more than the limit
	statusLost     = 2 // a cursor of another incarnation, or ahead
	statusReport   = 3 // a part's own version only (partWatch.report)
	statusAll      = 4 // every counter the window holds, the batch's own included
)

// watchAcc gathers the shards' answers to one Watch.
type watchAcc struct {
	versions []int64 // per shard, after the batch (0: no window there)
	overflow bool
	counters []strategy.Counter // listed by the scripts
	// dedupe marks the shards whose listing may hold the batch's own diffs
	// (at a later version, when another node changed them since): a
	// re-sent part, and the shards the batch wrote in several parts.
	dedupe []bool
	// reported holds, for each shard the batch wrote in several parts,
	// the versions those parts reported (none for a re-sent part): a
	// follow-up answers the watch there (see partWatch.report).
	reported [][]int64
}

// add reads one shard's answer (see answer in lua/versions.lua): status,
// version, count, and for status 0 and 4 count (field, total) pairs.
func (a *watchAcc) add(b *strategy.Batch, p *part, pw partWatch, r *reply) error {
	status, err := r.int()
	if err != nil {
		return err
	}
	version, err := r.int()
	if err != nil {
		return err
	}
	count, err := r.int()
	if err != nil {
		return err
	}
	if version < 0 || version >= maxVersion {
		return fmt.Errorf("redis: watch answered version %d", version)
	}
	if pw.report || !p.fresh || status == statusAll {
		if a.dedupe == nil {
			a.dedupe = make([]bool, len(a.versions))
		}
		a.dedupe[p.shard] = true
	}
	if pw.report {
		if status != statusReport || count != 0 {
			return fmt.Errorf("redis: watch answered status %d to a version report", status)
		}
		if a.reported == nil {
			a.reported = make([][]int64, len(a.versions))
		}
		if a.reported[p.shard] == nil {
			a.reported[p.shard] = []int64{}
		}
		if version > 0 && p.fresh {
			a.reported[p.shard] = append(a.reported[p.shard], version)
		}
		return nil
	}
	a.versions[p.shard] = version
	switch status {
	case statusListed, statusAll:
	case statusOverflow, statusLost:
		a.overflow = true
		return nil
	default:
		return fmt.Errorf("redis: watch answered status %d", status)
	}
	w := &b.Watches[pw.watch]
	for range count {
		f, err := r.next()
		if err != nil {
			return err
		}
		key, ok := f.(string)
		if !ok {
			return fmt.Errorf("redis: watch answered a field of type %T", f)
		}
		v, err := r.next()
		if err != nil {
			return err
		}
		if !a.overflow {
			a.counters = append(a.counters, strategy.Counter{CounterID: strategy.CounterID{Key: key, Size: w.Size, Start: w.Start}, Count: leniently(v)})
		}
	}
	return nil
}

// changes answers b's watches from the shards' answers and the batch's own
// totals: the scripts list what changed up to the version before each
// part's own diffs, and the batch's diffs of the window are added from
// their totals (unless a shard's listing may hold them already).
func (s *Store) changes(b *strategy.Batch, res *strategy.Result, acc []watchAcc) []strategy.Changes {
	out := make([]strategy.Changes, len(b.Watches))
	for i := range b.Watches {
		w, a := &b.Watches[i], &acc[i]
		out[i].Cursor = encodeCursor(a.versions)
		if a.overflow {
			out[i].Overflow = true
			continue
		}
		counters := a.counters
		var listed map[string]bool
		for j := range b.Diffs {
			d := &b.Diffs[j]
			if d.Size != w.Size || d.Start != w.Start {
				continue
			}
			if a.dedupe != nil && a.dedupe[s.shardOf(keyHash(d.Key))] {
				if listed == nil {
					listed = make(map[string]bool, len(a.counters))
					for _, c := range a.counters {
						listed[c.Key] = true
					}
				}
				if listed[d.Key] {
					continue // listed at a version after its own
				}
			}
			counters = append(counters, strategy.Counter{CounterID: d.CounterID, Count: res.Totals[j]})
		}
		if len(counters) > w.Limit {
			out[i].Overflow = true
			continue
		}
		out[i].Counters = counters
	}
	return out
}
