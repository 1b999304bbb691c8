package compare

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit/strategy"
)

// Take with one bucket (Interval = Period/Max, Burst) against redis_rate's
// AllowN (Limit{Rate: Max, Burst: Burst, Period: Period}), both GCRA, on the
// same random requests: costs from 1 to Burst+1 (which never fits), some in
// bursts a few milliseconds apart, some after gaps of up to three intervals.
//
// What is compared, and why not everything: redis_rate reads the time from
// Redis TIME inside its script, a Take is given its Now (Unix ms) by the
// caller. Both run at real time: each request reads the local clock (t0),
// calls AllowN, reads it again (t1), and gives t0 to Take; Redis's clock (the
// same machine's) was read between t0 and t1. So the two can disagree only
// when the request sits within that slack of the boundary between admitted
// and rejected: the slack is t1-t0 plus 1 ms (Now's truncation) plus how far
// apart the two TATs may have drifted (each full bucket's TAT restarts from
// its own reading). The test computes each request's margin from the
// boundary with the Take's own state and compares, for every request whose
// margin exceeds the slack: the decision (exactly), the time until a
// rejected request fits (RetryAfter, within the slack) and the tokens left
// after an admitted one (Remaining, when no integer lies within the slack).
// A request within the slack is not compared; when the two decided it
// differently, both buckets are left to fill up before the key goes on.
func TestTakeMatchesRedisRate(t *testing.T) {
	noLeaks(t)
	c := client(t)
	s := store(t, c)
	limiter := redis_rate.NewLimiter(c)
	prefix := unique(t)
	ctx := context.Background()
	const (
		period   = time.Second
		rate     = 20 // tokens per period: a token every 50 ms
		burst    = 5
		keys     = 6
		requests = 40
	)
	interval := float64(period.Milliseconds()) / rate
	limit := redis_rate.Limit{Rate: rate, Burst: burst, Period: period}
	type tally struct{ compared, admitted, ambiguous, resyncs int }
	tallies := make([]tally, keys)
	var wg sync.WaitGroup
	for k := range keys {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(k), 11))
			key := fmt.Sprintf("k%d", k)
			tl := &tallies[k]
			var st strategy.BucketState // the Take's bucket after the last request
			var drift float64           // ms: how far apart the two TATs may be
			for i := range requests {
				gap := time.Duration(rng.Int64N(int64(3 * interval * float64(time.Millisecond))))
				if rng.IntN(2) == 0 {
					gap = time.Duration(rng.Int64N(int64(5 * time.Millisecond)))
				}
				time.Sleep(gap) // real time: redis_rate reads Redis TIME
				cost := 1 + rng.Int64N(burst+1)

				t0 := time.Now()
				theirs, err := limiter.AllowN(ctx, prefix+":"+key, limit, int(cost))
				t1 := time.Now()
				if !assert.NoError(t, err) {
					return
				}
				now := t0.UnixMilli()
				res, err := s.Take(ctx, &strategy.Take{ID: fmt.Sprintf("%s-%s-%d", prefix, key, i), Namespace: "diff", Key: key,
					Now: now, Cost: cost, Buckets: []strategy.TakeBucket{{Period: period, Interval: interval, Burst: burst}}})
				if !assert.NoError(t, err) {
					return
				}
				read := float64(t1.Sub(t0).Microseconds())/1000 + 1
				slack := read + drift
				// The margin from the boundary, from the Take's state before
				// this request: BucketFits's expression, positive when it fits.
				n := float64(now)
				base := n
				if st.Held() {
					base = math.Max(st.TAT, n)
				}
				margin := float64(burst)*interval - (base + float64(cost)*interval - n)
				ours, them := res.Allowed, theirs.Allowed > 0
				if math.Abs(margin) <= slack {
					tl.ambiguous++
					if ours != them {
						// Both fill up; then they start again alike.
						tl.resyncs++
						time.Sleep(time.Duration((float64(burst)*interval + slack + 20) * float64(time.Millisecond)))
						st, drift = strategy.BucketState{}, 0
						continue
					}
				} else {
					tl.compared++
					if !assert.Equal(t, them, ours, "key %s request %d: cost %d, margin %.3f ms, slack %.3f ms", key, i, cost, margin, slack) {
						return
					}
					if ours {
						tl.admitted++
						left := margin / interval
						if frac := left - math.Floor(left); frac > slack/interval && 1-frac > slack/interval {
							assert.Equal(t, int(math.Floor(left)), theirs.Remaining, "key %s request %d: tokens left", key, i)
						}
					} else {
						retry := float64(theirs.RetryAfter.Microseconds()) / 1000
						assert.InDelta(t, -margin, retry, slack, "key %s request %d: time until it fits", key, i)
					}
				}
				if ours {
					if !st.Held() || st.TAT+drift <= n {
						drift = read // both were full: each TAT restarts from its reading
					} else {
						drift = math.Max(drift, read)
					}
				}
				st = res.Buckets[0]
			}
		})
	}
	wg.Wait()
	var total tally
	for _, tl := range tallies {
		total.compared += tl.compared
		total.admitted += tl.admitted
		total.ambiguous += tl.ambiguous
		total.resyncs += tl.resyncs
	}
	t.Logf("%d requests: %d compared (%d admitted), %d within the slack of the boundary (%d decided differently)",
		keys*requests, total.compared, total.admitted, total.ambiguous, total.resyncs)
	require.GreaterOrEqual(t, total.compared, keys*requests*3/4, "too few requests compared")
	require.Positive(t, total.admitted)
	require.Less(t, total.admitted, total.compared, "some rejected too")
}
