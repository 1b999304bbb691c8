package analysis

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit/strategy"
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

// bucketTrace is a hand-checked run of one key under a token bucket of burst
// 3 refilling 5 tokens per 10 ms: one token every 2 ms. Times are in ms (some
// with a fraction, which the bucket drops: the library counts whole ms).
//
//	#   t(ms)  node    nodes' bucket (TAT before)        exact bucket on its own
//	1   0      admit   owed 0: ok, TAT 2                 admit, TAT 2
//	2   0      admit   owed 2 <= 4: ok, TAT 4            admit, TAT 4
//	3   0      admit   owed 4 <= 4: ok, TAT 6            admit, TAT 6
//	4   0      admit   owed 6 > 4: excess, TAT 8 (owes 4 > 3: over by 1)
//	                                                     reject
//	5   1.99   reject  owed 7: right                     owed 5: reject
//	6   3.9    reject  owed 5: right                     owed 3: admit, TAT 8
//	7   4      admit   owed 4: ok, TAT 10 (owes 3)       owed 4: admit, TAT 10
//	8   9.5    reject  owed 1: false rejection           owed 1: admit, TAT 11
//	9   10     admit   owed 0: ok, TAT 12                owed 1: admit, TAT 13
//	10  10     admit   owed 2: ok, TAT 14                owed 3: admit, TAT 15
//	11  10     admit   owed 4: ok, TAT 16                owed 5: reject
//	12  10     admit   owed 6: excess, TAT 18 (owes 4: over by 1)
//	                                                     reject
var bucketTrace = []struct {
	ms float64
	ok bool
}{{0, true}, {0, true}, {0, true}, {0, true}, {1.99, false}, {3.9, false}, {4, true}, {9.5, false}, {10, true}, {10, true}, {10, true}, {10, true}}

func TestAnalyzeTokenBucketTrace(t *testing.T) {
	var hits []Hit
	for _, h := range bucketTrace {
		var f uint8
		if h.ok {
			f = Allowed
		}
		hits = append(hits, Hit{T: int64(h.ms * 1e6), Key: 3, Flags: f})
	}
	ms := int64(1e6)
	r := Analyze(hits, Options{Kind: TokenBucket, Limits: []Limit{{Window: 10 * ms, Max: 5, Burst: 3}}, SeriesKey: 3})
	assert.Equal(t, "token-bucket", r.Reference)
	assert.Equal(t, int64(12), r.Hits)
	assert.Equal(t, int64(9), r.Admitted)
	assert.Equal(t, int64(2), r.ExcessAdmissions)
	assert.Equal(t, int64(1), r.FalseRejections)
	assert.Equal(t, int64(8), r.RefAdmitted)
	assert.Equal(t, int64(1), r.MaxOver)
	assert.Equal(t, int64(2), r.Windows)
	assert.Equal(t, int64(2), r.WindowsOver)
	assert.InDelta(t, 1.0, r.MeanOver, 1e-12)
	assert.Equal(t, []WindowPoint{
		{Start: 0, Offered: 8, Admitted: 5, MaxTrailing: 4},
		{Start: 10 * ms, Offered: 4, Admitted: 4, MaxTrailing: 4},
	}, r.Series)

	// Burst 0 is Max: a bucket of 5, so the 4th hit at 0 fits and only the
	// 12th (the 6th owed token at 10 ms, TAT 10 -> 20) goes over... by the
	// nodes' count: at 10 ms they owe 8 ms (TAT 18 before), 4 tokens, and
	// (5-1)*2 = 8 >= 8, so it fits too. Nothing is in excess.
	r = Analyze(hits, Options{Kind: TokenBucket, Limits: []Limit{{Window: 10 * ms, Max: 5}}})
	assert.Zero(t, r.ExcessAdmissions)
	assert.Zero(t, r.MaxOver)
}

// TestTokenBucketMatchesLibraryRule feeds random histories to the reference
// and, step by step, to strategy.BucketFits and the same TAT arithmetic: the
// reference must agree on every decision.
func TestTokenBucketMatchesLibraryRule(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	for trial := range 200 {
		max := int64(1 + rng.IntN(20))
		windowMs := int64(1 + rng.IntN(2000))
		if float64(windowMs)/float64(max) < 1e-3 {
			continue
		}
		burst := int64(rng.IntN(30)) // 0 means Max
		lim := Limit{Window: windowMs * 1e6, Max: max, Burst: burst}
		b := burst
		if b == 0 {
			b = max
		}
		interval := float64(windowMs) / float64(max)
		var hits []Hit
		var now int64 = 1_735_689_600_000 // ms, 2025
		state := strategy.BucketState{}
		var want int64
		for i := range 300 {
			now += int64(rng.IntN(int(windowMs/5 + 2)))
			ns := now*1e6 + int64(i)*3000 // a fraction of a ms, in order
			fits := strategy.BucketFits(state, interval, b, 1, now)
			if fits {
				want++
				state = strategy.ApplyBucket(state, strategy.SpendDiff(strategy.BucketID{Key: "k", Period: time.Duration(windowMs) * time.Millisecond}, 1, interval, now), now)
			}
			var f uint8
			if fits {
				f = Allowed
			}
			hits = append(hits, Hit{T: ns, Flags: f})
		}
		r := Analyze(hits, Options{Kind: TokenBucket, Limits: []Limit{lim}})
		require.Equal(t, want, r.RefAdmitted, "trial %d: %+v", trial, lim)
		require.Zero(t, r.ExcessAdmissions, "trial %d", trial)
		require.Zero(t, r.FalseRejections, "trial %d", trial)
		require.Zero(t, r.MaxOver, "trial %d: %+v", trial, lim)
	}
}

// TestSlidingLogMilliseconds: at a resolution of 1 ms, a hit at 0.5 ms has
// left the window (0, 10] of a hit at 10.4 ms, as in the library's sliding
// log; on nanoseconds it is still in (0.4, 10.4].
func TestSlidingLogMilliseconds(t *testing.T) {
	ms := int64(1e6)
	hits := []Hit{{T: ms / 2, Flags: Allowed}, {T: 5 * ms, Flags: Allowed}, {T: 10*ms + 4*ms/10, Flags: Allowed}, {T: 10*ms + 5*ms/10, Flags: Allowed}}
	lim := []Limit{{Window: 10 * ms, Max: 2}}
	r := Analyze(hits, Options{Limits: lim, Resolution: ms})
	// (0,10]: 5 ms only, so 10.4 fits; then 5 and 10 fill it, so 10.5 is an excess.
	assert.Equal(t, int64(1), r.ExcessAdmissions)
	assert.Equal(t, int64(3), r.RefAdmitted)
	assert.Equal(t, int64(1), r.MaxOver)
	r = Analyze(hits, Options{Limits: lim})
	// (0.4, 10.4] holds 0.5 and 5, and (0.5, 10.5] holds 5 and 10.4: both
	// later hits are excesses. The exact log admits 0.5, 5 and 10.5.
	assert.Equal(t, int64(2), r.ExcessAdmissions)
	assert.Equal(t, int64(3), r.RefAdmitted)
	assert.Equal(t, int64(1), r.MaxOver)
}
