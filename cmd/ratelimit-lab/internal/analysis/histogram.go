// Package analysis holds the lab's measurements that need no store: a
// log-linear latency histogram and the exact reference limiters (sliding log
// and fixed window) that judge every recorded decision.
package analysis

import (
	"math"
	"math/bits"
)

// subBits sets the histogram's precision: each power of two is split into
// 2^subBits buckets, so a recorded value is known to within 1/128 (< 0.8%).
const (
	subBits  = 7
	subCount = 1 << subBits
	buckets  = (64 - subBits) * subCount
)

// Histogram counts non-negative int64 values (nanoseconds, for the lab) in
// log-linear buckets, as HdrHistogram does: values below 128 exactly, larger
// ones to within 1/128 of their value. The zero value is empty and ready to
// use. It is not safe for concurrent use: give each goroutine its own and
// Merge them.
type Histogram struct {
	counts [buckets]uint64
	n      uint64
	sum    float64
	min    int64
	max    int64
}

// bucketOf returns the bucket index of v >= 0.
func bucketOf(v int64) int {
	if v < subCount {
		return int(v)
	}
	shift := bits.Len64(uint64(v)) - subBits - 1
	return (shift+1)*subCount + int(v>>shift) - subCount
}

// bucketHigh returns the largest value bucket i holds.
func bucketHigh(i int) int64 {
	if i < subCount {
		return int64(i)
	}
	shift := i/subCount - 1
	low := int64(i%subCount+subCount) << shift
	return low + (int64(1) << shift) - 1
}

// Record adds one value; negative values count as 0.
func (h *Histogram) Record(v int64) {
	if v < 0 {
		v = 0
	}
	if h.n == 0 || v < h.min {
		h.min = v
	}
	if v > h.max {
		h.max = v
	}
	h.counts[bucketOf(v)]++
	h.n++
	h.sum += float64(v)
}

// Merge adds every value of o to h.
func (h *Histogram) Merge(o *Histogram) {
	if o.n == 0 {
		return
	}
	if h.n == 0 || o.min < h.min {
		h.min = o.min
	}
	h.max = max(h.max, o.max)
	for i, c := range o.counts {
		h.counts[i] += c
	}
	h.n += o.n
	h.sum += o.sum
}

// Count returns how many values were recorded.
func (h *Histogram) Count() uint64 { return h.n }

// Min returns the smallest value recorded (0 when empty).
func (h *Histogram) Min() int64 { return h.min }

// Max returns the largest value recorded (0 when empty).
func (h *Histogram) Max() int64 { return h.max }

// Mean returns the mean of the values recorded (0 when empty).
func (h *Histogram) Mean() float64 {
	if h.n == 0 {
		return 0
	}
	return h.sum / float64(h.n)
}

// Quantile returns the value at quantile q (0 < q <= 1): the smallest bucket
// value v such that at least ceil(q*n) recorded values are <= v, reported as
// the highest value of its bucket but never above Max. It returns 0 when the
// histogram is empty.
func (h *Histogram) Quantile(q float64) int64 {
	if h.n == 0 {
		return 0
	}
	rank := uint64(math.Ceil(q * float64(h.n)))
	rank = min(max(rank, 1), h.n)
	var cum uint64
	for i, c := range h.counts {
		cum += c
		if cum >= rank {
			return min(bucketHigh(i), h.max)
		}
	}
	return h.max
}

// Bucket is one non-empty bucket of a Histogram.
type Bucket struct {
	High  int64  // the largest value the bucket holds
	Count uint64 // values recorded in it
}

// Buckets returns the non-empty buckets in increasing order.
func (h *Histogram) Buckets() []Bucket {
	var out []Bucket
	for i, c := range h.counts {
		if c > 0 {
			out = append(out, Bucket{High: bucketHigh(i), Count: c})
		}
	}
	return out
}
