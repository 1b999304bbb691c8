package ratelimit_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/ratesync/ratelimit"
	rlredis "github.com/ratesync/ratelimit/strategy/redis"
)

// TestRedisClockEveryAlgorithm takes window time from Redis TIME
// ((*redis.Store).Clock) for every algorithm, in synchronous and periodic
// mode, on a real Redis: a limit is spent, the rejection's RetryAfter is
// waited (real time: it is Redis's clock), and the same request is
// admitted then.
func TestRedisClockEveryAlgorithm(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	ctx := context.Background()
	client := testRedisClient(t)
	store, err := rlredis.New(client, rlredis.Options{KeyPrefix: fmt.Sprintf("clk%d", time.Now().UnixNano())})
	require.NoError(t, err)
	clock, err := store.Clock(ctx)
	require.NoError(t, err)
	limits := map[string]ratelimit.Limit{
		"sliding":     {Window: 300 * time.Millisecond, Max: 3},
		"fixed":       {Window: 300 * time.Millisecond, Max: 3, Algorithm: ratelimit.FixedWindow},
		"tokenbucket": {Window: 300 * time.Millisecond, Max: 3, Algorithm: ratelimit.TokenBucket},
		"slidinglog":  {Window: 300 * time.Millisecond, Max: 3, Algorithm: ratelimit.SlidingLog},
	}
	for _, mode := range []string{"sync", "async"} {
		for name, l := range limits {
			if mode == "async" && l.Algorithm == ratelimit.SlidingLog {
				continue // refused in periodic mode
			}
			t.Run(mode+"/"+name, func(t *testing.T) {
				reg := ratelimit.NewRegistry()
				defer func() { require.NoError(t, reg.Close(ctx)) }()
				cfg := ratelimit.Config{Namespace: mode + name, WindowSizes: []time.Duration{300 * time.Millisecond},
					Strategy: store, Clock: clock.Now}
				if mode == "async" {
					cfg.SyncRate = time.Hour // one node: its own counts decide
				}
				ns, err := reg.New(cfg)
				require.NoError(t, err)
				var d ratelimit.Decision
				for range 10 {
					if d, err = ns.Allow(ctx, "k", 1, l); err != nil || !d.Allowed {
						break
					}
				}
				require.NoError(t, err)
				require.False(t, d.Allowed, "spent")
				require.Positive(t, d.RetryAfter)
				// Wait a hair past RetryAfter on Redis's clock: the Clock's
				// estimate of it moves with the local clock.
				time.Sleep(d.RetryAfter + 2*time.Millisecond)
				d, err = ns.Allow(ctx, "k", 1, l)
				require.NoError(t, err)
				require.True(t, d.Allowed, "admitted once RetryAfter (Redis time) has passed")
			})
		}
	}
}
