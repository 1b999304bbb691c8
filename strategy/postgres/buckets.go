package postgres

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/ratesync/ratelimit/strategy"
)

// bucketRetentionMillis is strategy.BucketRetention in milliseconds.
const bucketRetentionMillis = int64(strategy.BucketRetention / time.Millisecond)

// bucketRows holds token buckets in column form, as the statements take
// them: diffs (with adds, floors and intervals) or reads (without).
type bucketRows struct {
	keys              []string
	periods           []int64
	adds, floors, ivs []float64
}

func (r *bucketRows) len() int { return len(r.keys) }

func (r *bucketRows) slice(lo, hi int) bucketRows {
	out := bucketRows{keys: r.keys[lo:hi], periods: r.periods[lo:hi]}
	if r.adds != nil {
		out.adds, out.floors, out.ivs = r.adds[lo:hi], r.floors[lo:hi], r.ivs[lo:hi]
	}
	return out
}

// join returns r's buckets followed by o's (as reads).
func (r bucketRows) join(o bucketRows) bucketRows {
	if o.len() == 0 {
		return bucketRows{keys: r.keys, periods: r.periods}
	}
	return bucketRows{keys: append(slices.Clip(r.keys), o.keys...), periods: append(slices.Clip(r.periods), o.periods...)}
}

// bucketState decodes a bucket from its TAT's and interval's bits.
func bucketState(tat, interval int64) strategy.BucketState {
	return strategy.BucketState{TAT: math.Float64frombits(uint64(tat)), Interval: math.Float64frombits(uint64(interval))}
}

func compareBucket(a, b *strategy.BucketID) int {
	if c := cmp.Compare(a.Period, b.Period); c != 0 {
		return c
	}
	return cmp.Compare(a.Key, b.Key)
}

// planBuckets sorts b's bucket diffs by identity (the order every push locks
// them in, so concurrent pushes cannot deadlock), and its bucket reads, and
// answers the reads of buckets the batch changes from the diffs' results.
func (p *plan) planBuckets(b *strategy.Batch) error {
	p.now = b.Now
	n := len(b.BucketDiffs)
	if n > 0 {
		p.bdiffIdx = make([]int32, n)
		for i := range p.bdiffIdx {
			p.bdiffIdx[i] = int32(i)
		}
		slices.SortFunc(p.bdiffIdx, func(i, j int32) int {
			return compareBucket(&b.BucketDiffs[i].BucketID, &b.BucketDiffs[j].BucketID)
		})
		p.bdiffs = bucketRows{keys: make([]string, n), periods: make([]int64, n), adds: make([]float64, n),
			floors: make([]float64, n), ivs: make([]float64, n)}
		for u, i := range p.bdiffIdx {
			d := &b.BucketDiffs[i]
			if !wholeMillis(d.Period) {
				return fmt.Errorf("bucket %q: period %v is not a positive whole number of milliseconds", d.Key, d.Period)
			}
			if u > 0 && compareBucket(&b.BucketDiffs[p.bdiffIdx[u-1]].BucketID, &d.BucketID) == 0 {
				// Two diffs of one bucket do not fold into one exactly
				// (the float sums round differently): the contract allows
				// one.
				return fmt.Errorf("bucket %q period %v: two diffs in one batch", d.Key, d.Period)
			}
			p.bdiffs.keys[u] = encodeText(d.Key)
			p.bdiffs.periods[u] = d.Period.Milliseconds()
			p.bdiffs.adds[u], p.bdiffs.floors[u], p.bdiffs.ivs[u] = d.Add, d.Floor, d.Interval
		}
	}
	rperm := make([]int32, 0, len(b.BucketReads))
	for i, r := range b.BucketReads {
		// A bucket that cannot exist reads as full without asking.
		if wholeMillis(r.Period) {
			rperm = append(rperm, int32(i))
		}
	}
	slices.SortFunc(rperm, func(i, j int32) int { return compareBucket(&b.BucketReads[i], &b.BucketReads[j]) })
	u := 0
	for _, i := range rperm {
		r := &b.BucketReads[i]
		for u < n && compareBucket(&b.BucketDiffs[p.bdiffIdx[u]].BucketID, r) < 0 {
			u++
		}
		if u < n && compareBucket(&b.BucketDiffs[p.bdiffIdx[u]].BucketID, r) == 0 {
			p.breadDiffs = append(p.breadDiffs, link{i, int32(u)})
			continue
		}
		p.breads.keys = append(p.breads.keys, encodeText(r.Key))
		p.breads.periods = append(p.breads.periods, r.Period.Milliseconds())
		p.breadIdx = append(p.breadIdx, i)
	}
	return nil
}
