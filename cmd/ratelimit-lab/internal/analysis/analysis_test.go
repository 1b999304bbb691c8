package analysis

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// trace is a hand-checked run of one key under 3 hits per 10 ns.
//
//	t   node says  sliding log (t-10, t]            fixed window [0,10) [10,20) [20,30)
//	0   admit      load 0: ok                       load 0: ok
//	1   admit      load 1: ok                       load 1: ok
//	2   admit      load 2: ok                       load 2: ok
//	3   reject     load 3: right                    load 3: right
//	5   admit      load 3: excess admission         load 3: excess admission
//	9   reject     load 4 (0,1,2,5): right          load 4: right
//	10  reject     load 3 (1,2,5): right            load 0: false rejection
//	11  admit      load 2 (2,5): ok                 load 0: ok
//	12  reject     load 2 (5,11): false rejection   load 1: false rejection
//	25  admit      load 0: ok                       load 0: ok
//
// The exact limiter on its own decisions admits 0, 1, 2, then (sliding) 10,
// 11, 12 (the window (0,10] holds 1 and 2 only) and 25: 7 hits; fixed, the
// same 7. The nodes' largest trailing count is 4, at t=5 (0,1,2,5): an
// over-admission of 1 in the aligned window [0,10).
var trace = []struct {
	t  int64
	ok bool
}{{0, true}, {1, true}, {2, true}, {3, false}, {5, true}, {9, false}, {10, false}, {11, true}, {12, false}, {25, true}}

func traceHits(t *testing.T) []Hit {
	t.Helper()
	var hits []Hit
	for _, h := range trace {
		var f uint8
		if h.ok {
			f = Allowed
		}
		hits = append(hits, Hit{T: h.t, Key: 7, Flags: f})
	}
	// A failed check is left out of every figure but Failed.
	hits = append(hits, Hit{T: 4, Key: 7, Flags: Failed | Allowed})
	rand.New(rand.NewPCG(1, 2)).Shuffle(len(hits), func(i, j int) { hits[i], hits[j] = hits[j], hits[i] })
	return hits
}

func TestAnalyzeSlidingTrace(t *testing.T) {
	r := Analyze(traceHits(t), Options{Limits: []Limit{{Window: 10, Max: 3}}, SeriesKey: 7})
	assert.Equal(t, "sliding-log", r.Reference)
	assert.Equal(t, int64(10), r.Hits)
	assert.Equal(t, int64(1), r.Failed)
	assert.Equal(t, int64(6), r.Admitted)
	assert.Equal(t, int64(1), r.ExcessAdmissions)
	assert.Equal(t, int64(1), r.FalseRejections)
	assert.Equal(t, int64(7), r.RefAdmitted)
	assert.Equal(t, int64(1), r.MaxOver)
	assert.Equal(t, int64(3), r.Windows)
	assert.Equal(t, int64(1), r.WindowsOver)
	assert.InDelta(t, 1.0/3, r.MeanOver, 1e-12)
	assert.InDelta(t, 0.1, r.FalseRejectionRate(), 1e-12)
	want := []WindowPoint{
		{Start: 0, Offered: 6, Admitted: 4, MaxTrailing: 4},
		{Start: 10, Offered: 3, Admitted: 1, MaxTrailing: 3},
		{Start: 20, Offered: 1, Admitted: 1, MaxTrailing: 1},
	}
	assert.Equal(t, want, r.Series)
	assert.Equal(t, want, r.AllKeys)
}

func TestAnalyzeFixedTrace(t *testing.T) {
	r := Analyze(traceHits(t), Options{Limits: []Limit{{Window: 10, Max: 3}}, Fixed: true, SeriesKey: 7})
	assert.Equal(t, "fixed-window", r.Reference)
	assert.Equal(t, int64(6), r.Admitted)
	assert.Equal(t, int64(1), r.ExcessAdmissions)
	assert.Equal(t, int64(2), r.FalseRejections)
	assert.Equal(t, int64(7), r.RefAdmitted)
	assert.Equal(t, int64(1), r.MaxOver)
	assert.Equal(t, int64(1), r.WindowsOver)
	assert.Equal(t, []WindowPoint{
		{Start: 0, Offered: 6, Admitted: 4, MaxTrailing: 4},
		{Start: 10, Offered: 3, Admitted: 1, MaxTrailing: 1},
		{Start: 20, Offered: 1, Admitted: 1, MaxTrailing: 1},
	}, r.Series)
}

// TestAnalyzeKeysAndLimits checks that keys are judged apart and that a hit
// must fit every limit: 2 per 10 and 3 per 100.
func TestAnalyzeKeysAndLimits(t *testing.T) {
	hits := []Hit{
		{T: 0, Key: 1, Flags: Allowed}, {T: 0, Key: 2, Flags: Allowed},
		{T: 1, Key: 1, Flags: Allowed}, {T: 1, Key: 2, Flags: Allowed},
		{T: 20, Key: 1, Flags: Allowed}, // 3rd in 100: fits
		{T: 30, Key: 1},                 // 4th in 100: right to reject
		{T: 40, Key: 2},                 // key 2 has 2 in 100: false rejection
		{T: 50, Key: 2, Flags: Allowed},
		{T: 51, Key: 2, Flags: Allowed}, // 4th in 100: excess
	}
	r := Analyze(hits, Options{Limits: []Limit{{Window: 10, Max: 2}, {Window: 100, Max: 3}}, SeriesKey: 2})
	assert.Equal(t, int64(9), r.Hits)
	assert.Equal(t, int64(7), r.Admitted)
	assert.Equal(t, int64(1), r.FalseRejections)
	assert.Equal(t, int64(1), r.ExcessAdmissions)
	assert.Equal(t, int64(6), r.RefAdmitted) // key 1: 0,1,20; key 2: 0,1,40
	assert.Equal(t, int64(0), r.MaxOver)     // never more than 2 in a 10 ns window
}

func TestAnalyzeEmpty(t *testing.T) {
	r := Analyze(nil, Options{Limits: []Limit{{Window: 10, Max: 1}}})
	assert.Zero(t, r.Hits)
	assert.Zero(t, r.FalseRejectionRate())
}

func TestHistogramSmall(t *testing.T) {
	var h Histogram
	for _, v := range []int64{3, 1, 4, 100, 2, -5} {
		h.Record(v)
	}
	// Sorted: 0 1 2 3 4 100 (the negative value counts as 0).
	assert.Equal(t, uint64(6), h.Count())
	assert.Equal(t, int64(2), h.Quantile(0.5)) // rank 3
	assert.Equal(t, int64(4), h.Quantile(5.0/6))
	assert.Equal(t, int64(100), h.Quantile(0.99))
	assert.Equal(t, int64(0), h.Min())
	assert.Equal(t, int64(100), h.Max())
	assert.InDelta(t, 110.0/6, h.Mean(), 1e-9)
}

func TestHistogramPrecision(t *testing.T) {
	var h, a, b Histogram
	for v := int64(1); v <= 1_000_000; v++ {
		h.Record(v * 1000)
		if v%2 == 0 {
			a.Record(v * 1000)
		} else {
			b.Record(v * 1000)
		}
	}
	a.Merge(&b)
	for _, q := range []float64{0.5, 0.9, 0.99, 0.999, 1} {
		want := float64(q * 1e9)
		got := float64(h.Quantile(q))
		require.InDelta(t, want, got, want/128, "q=%v", q)
		require.Equal(t, h.Quantile(q), a.Quantile(q), "merged q=%v", q)
	}
	assert.Equal(t, int64(1e9), h.Max())
}

func TestHistogramBuckets(t *testing.T) {
	for _, v := range []int64{0, 1, 127, 128, 129, 255, 256, 1 << 40, 1<<62 + 12345} {
		i := bucketOf(v)
		require.GreaterOrEqual(t, bucketHigh(i), v, "v=%d", v)
		if i > 0 {
			require.Less(t, bucketHigh(i-1), v, "v=%d", v)
		}
	}
	var h Histogram
	h.Record(5)
	h.Record(5)
	h.Record(1000)
	assert.Equal(t, []Bucket{{High: 5, Count: 2}, {High: 1003, Count: 1}}, h.Buckets())
}

// TestAnalyzeFrom leaves the first window of the trace out of the counts but
// not out of the reference's state: at t=10 the load is still 3 (1, 2, 5).
func TestAnalyzeFrom(t *testing.T) {
	r := Analyze(traceHits(t), Options{Limits: []Limit{{Window: 10, Max: 3}}, SeriesKey: 7, From: 10})
	assert.Equal(t, int64(4), r.Hits) // 10, 11, 12, 25
	assert.Zero(t, r.Failed)
	assert.Equal(t, int64(2), r.Admitted)
	assert.Equal(t, int64(1), r.FalseRejections) // 12
	assert.Zero(t, r.ExcessAdmissions)
	assert.Equal(t, int64(4), r.RefAdmitted)
	assert.Equal(t, int64(2), r.Windows)
	assert.Zero(t, r.MaxOver)
	assert.Len(t, r.Series, 3) // the series keep the warm-up window
}
