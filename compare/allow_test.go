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

	"github.com/ratesync/ratelimit"
)

// TestAllowMatchesRedisRate drives a synchronous namespace's Allow (a token
// bucket decided by the Redis store, through the whole library: decision
// layer, circuit breaker, Take) and redis_rate's AllowN with the same
// requests, and compares allowed, remaining and retry-after, as
// TestTakeMatchesRedisRate does one level down (read its comment for what
// can be compared at real time and why). This test knows the bucket only
// through the decisions (its TAT is now plus Reset, rounded up to the
// millisecond): a few more milliseconds of slack.
func TestAllowMatchesRedisRate(t *testing.T) {
	noLeaks(t)
	c := client(t)
	limiter := redis_rate.NewLimiter(c)
	prefix := unique(t)
	ctx := context.Background()
	reg := ratelimit.NewRegistry()
	t.Cleanup(func() { require.NoError(t, reg.Close(ctx)) })
	const (
		period   = time.Second
		rate     = 20 // a token every 50 ms
		burst    = 5
		keys     = 6
		requests = 40
	)
	// time.Now, not the default cached clock: a tick goroutine starved on a
	// loaded machine lags by milliseconds, which would make the comparison
	// at real time measure the machine, not the library.
	ns, err := reg.New(ratelimit.Config{Namespace: "diff", WindowSizes: []time.Duration{period}, SyncRate: 0, Strategy: store(t, c),
		Clock: time.Now})
	require.NoError(t, err)
	l := ratelimit.Limit{Algorithm: ratelimit.TokenBucket, Window: period, Max: rate, Burst: burst}
	rl := redis_rate.Limit{Rate: rate, Burst: burst, Period: period}
	interval := float64(period.Milliseconds()) / rate
	type tally struct{ compared, admitted, ambiguous int }
	tallies := make([]tally, keys)
	var wg sync.WaitGroup
	for k := range keys {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(k), 12))
			key := fmt.Sprintf("k%d", k)
			tl := &tallies[k]
			tat := math.Inf(-1) // the bucket's TAT as the decisions tell it (ms)
			drift := 0.0
			for range requests {
				gap := time.Duration(rng.Int64N(int64(3 * interval * float64(time.Millisecond))))
				if rng.IntN(2) == 0 {
					gap = time.Duration(rng.Int64N(int64(5 * time.Millisecond)))
				}
				time.Sleep(gap)
				cost := 1 + rng.Int64N(burst)
				t0 := time.Now()
				theirs, err := limiter.AllowN(ctx, prefix+":"+key, rl, int(cost))
				if !assert.NoError(t, err) {
					return
				}
				d, err := ns.Allow(ctx, key, cost, l)
				t1 := time.Now()
				if !assert.NoError(t, err) || !assert.False(t, d.Degraded) {
					return
				}
				n := float64(t0.UnixMilli())
				slack := float64(t1.Sub(t0).Microseconds())/1000 + 3 + drift
				margin := float64(burst)*interval - (math.Max(tat, n) + float64(cost)*interval - n)
				ours, them := d.Allowed, theirs.Allowed > 0
				if math.Abs(margin) <= slack {
					tl.ambiguous++
					if ours != them {
						// Both fill up; then they start again alike.
						time.Sleep(time.Duration((float64(burst)*interval + slack + 20) * float64(time.Millisecond)))
						tat, drift = math.Inf(-1), 0
						continue
					}
				} else {
					tl.compared++
					if !assert.Equal(t, them, ours, "key %s: cost %d, margin %.3f ms, slack %.3f ms", key, cost, margin, slack) {
						return
					}
					if ours {
						tl.admitted++
						left := margin / interval
						if frac := left - math.Floor(left); frac > slack/interval && 1-frac > slack/interval {
							assert.Equal(t, int64(math.Floor(left)), d.Remaining, "key %s: tokens left", key)
							assert.Equal(t, theirs.Remaining, int(d.Remaining), "key %s: redis_rate's tokens left", key)
						}
					} else {
						assert.InDelta(t, float64(theirs.RetryAfter.Microseconds())/1000, float64(d.RetryAfter.Milliseconds()), slack, "key %s: retry-after", key)
					}
				}
				if ours {
					if tat+drift <= n {
						drift = 0 // full: the TAT restarts from this request
					}
					drift = math.Max(drift, float64(t1.Sub(t0).Microseconds())/1000+1)
					tat = float64(time.Now().UnixMilli()) + float64(d.Reset.Milliseconds()) - float64(time.Since(t1).Milliseconds())
					tat = math.Max(tat, n) // the decision's own instant bounds it from below
				}
			}
		})
	}
	wg.Wait()
	var total tally
	for _, tl := range tallies {
		total.compared += tl.compared
		total.admitted += tl.admitted
		total.ambiguous += tl.ambiguous
	}
	t.Logf("%d requests: %d compared (%d admitted), %d within the slack of the boundary", keys*requests, total.compared, total.admitted, total.ambiguous)
	require.GreaterOrEqual(t, total.compared, keys*requests/2, "too few requests compared")
	require.Positive(t, total.admitted)
	require.Less(t, total.admitted, total.compared, "some rejected too")
}
