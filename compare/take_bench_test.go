package compare

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-redis/redis_rate/v10"

	"github.com/ratesync/ratelimit/strategy"
)

// BenchmarkTakeVsRedisRate times a synchronous token-bucket check on Redis
// two ways, on the same Redis and the same machine load: strategy/redis's
// Take with one bucket (one script call, exactly once per Take ID, combined
// with concurrent callers' calls into one pipeline) and redis_rate's Allow
// (one script call). Rounds of 1,000 checks of each alternate, run by 1 or
// 16 goroutines, over 10,000 keys, every check admitted (both write). The
// metrics are the mean time per check of each and their ratio (the goal of
// issue #12: take/redis_rate at most 1.3 with 16 callers).
func BenchmarkTakeVsRedisRate(b *testing.B) {
	c := client(b)
	s := store(b, c)
	limiter := redis_rate.NewLimiter(c)
	prefix := unique(b)
	ctx := context.Background()
	const keys = 10_000
	// Generous limits: every check is admitted.
	limit := redis_rate.Limit{Rate: 1_000_000, Burst: 1_000_000, Period: time.Second}
	bucket := []strategy.TakeBucket{{Period: time.Second, Interval: 1000.0 / 1_000_000, Burst: 1_000_000}}
	var seq atomic.Int64
	take := func(i int) error {
		res, err := s.Take(ctx, &strategy.Take{ID: prefix + strconv.FormatInt(seq.Add(1), 10), Namespace: "bench",
			Key: "user-" + strconv.Itoa(i%keys), Now: time.Now().UnixMilli(), Cost: 1, Buckets: bucket})
		if err == nil && !res.Allowed {
			err = fmt.Errorf("take %d rejected", i)
		}
		return err
	}
	allow := func(i int) error {
		res, err := limiter.Allow(ctx, prefix+":user-"+strconv.Itoa(i%keys), limit)
		if err == nil && res.Allowed != 1 {
			err = fmt.Errorf("allow %d rejected", i)
		}
		return err
	}
	for _, workers := range []int{1, 16} {
		b.Run(fmt.Sprintf("Goroutines%d", workers), func(b *testing.B) {
			const perRound = 1000
			round := func(op func(int) error) time.Duration {
				start := time.Now()
				var wg sync.WaitGroup
				var next atomic.Int64
				for range workers {
					wg.Go(func() {
						for i := next.Add(1); i <= perRound; i = next.Add(1) {
							if err := op(int(i)); err != nil {
								b.Error(err)
								return
							}
						}
					})
				}
				wg.Wait()
				return time.Since(start)
			}
			round(take) // connections and scripts
			round(allow)
			var tTake, tAllow time.Duration
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				tTake += round(take)
				tAllow += round(allow)
			}
			n := float64(b.N * perRound)
			b.ReportMetric(float64(tTake.Nanoseconds())/n, "take-ns/op")
			b.ReportMetric(float64(tAllow.Nanoseconds())/n, "redis_rate-ns/op")
			b.ReportMetric(float64(tTake)/float64(tAllow), "ratio")
		})
	}
}
