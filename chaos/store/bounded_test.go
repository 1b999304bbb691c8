package store

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit"
	"github.com/ratesync/ratelimit/internal/faultproxy"
	"github.com/ratesync/ratelimit/strategy/redis"
)

// Case 4 of the hostile-store issue: every wait is bounded, with a client
// that keeps go-redis's default timeouts and retries (ContextTimeoutEnabled
// is the one option the Store requires). Redis accepts connections and never
// answers (black-holed). Before: a synchronous check took 5.0 s with a
// SyncTimeout of 200 ms, and Registry.Close with a 200 ms deadline took 2.8 s
// for one namespace and 6.0 s for ten.
func TestBlackHoledRedisBoundsEveryWait(t *testing.T) {
	noLeaks(t)
	px := newProxy(t, redisAddr(t))
	px.SetMode(faultproxy.BlackHole)
	newStore := func() *redis.Store {
		c := goredis.NewClient(&goredis.Options{Addr: px.Addr(), ContextTimeoutEnabled: true})
		t.Cleanup(func() { _ = c.Close() })
		s, err := redis.New(c, redis.Options{KeyPrefix: "bounded-" + unique(t)})
		require.NoError(t, err)
		return s
	}
	const syncTimeout = 200 * time.Millisecond
	const slack = 300 * time.Millisecond // scheduling on a loaded 2-core machine under -race
	limit := ratelimit.Limit{Window: time.Minute, Max: 1000}

	t.Run("synchronous checks", func(t *testing.T) {
		reg := ratelimit.NewRegistry()
		ns, err := reg.New(ratelimit.Config{WindowSizes: []time.Duration{time.Minute}, SyncRate: 0,
			Strategy: newStore(), SyncTimeout: syncTimeout})
		require.NoError(t, err)
		var mu sync.Mutex
		var slowest time.Duration
		var wg sync.WaitGroup
		for g := range 8 {
			wg.Go(func() {
				for i := range 200 {
					start := time.Now()
					d, err := ns.Allow(context.Background(), fmt.Sprintf("k%d-%d", g, i%10), 1, limit)
					took := time.Since(start)
					if !errors.Is(err, ratelimit.ErrStoreUnavailable) && err != nil {
						t.Errorf("Allow: %v", err)
					}
					if !d.Degraded || !d.Allowed {
						t.Errorf("decision during the outage: %+v", d)
					}
					mu.Lock()
					slowest = max(slowest, took)
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		st := ns.Stats()
		result(t, "black-holed Redis, synchronous mode, 8 callers x 200 checks: slowest %v (SyncTimeout %v), unresolved pushes %d, pending hits %d",
			slowest, syncTimeout, st.UnresolvedPushes, st.PendingHits)
		require.Less(t, slowest, syncTimeout+slack)
		require.LessOrEqual(t, st.UnresolvedPushes, 8+16, "the calls in flight when the store failed, and at most 16 probes")
		require.Equal(t, int64(1600), st.PendingHits, "every hit kept for a later push")

		ctx, cancel := context.WithTimeout(context.Background(), syncTimeout)
		defer cancel()
		start := time.Now()
		err = reg.Close(ctx)
		took := time.Since(start)
		var unpushed *ratelimit.UnpushedError
		require.True(t, errors.As(err, &unpushed), "%v", err)
		require.Equal(t, int64(1600), unpushed.Hits)
		require.Less(t, took, syncTimeout+slack, "Close outlived its deadline")
	})

	t.Run("Close of ten namespaces", func(t *testing.T) {
		reg := ratelimit.NewRegistry()
		st := newStore()
		for i := range 10 {
			ns, err := reg.New(ratelimit.Config{Namespace: fmt.Sprint("ns", i), WindowSizes: []time.Duration{time.Minute},
				SyncRate: 50 * time.Millisecond, Strategy: st, SyncTimeout: time.Second})
			require.NoError(t, err)
			_, err = ns.Increment(context.Background(), "k", time.Minute, 1)
			require.NoError(t, err)
		}
		time.Sleep(100 * time.Millisecond) // let the loops start cycles that hang on the black hole
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		start := time.Now()
		err := reg.Close(ctx)
		took := time.Since(start)
		result(t, "black-holed Redis: Registry.Close of 10 namespaces with a 200 ms deadline took %v", took)
		require.ErrorIs(t, err, ratelimit.ErrStoreUnavailable)
		require.Less(t, took, 200*time.Millisecond+slack, "Close outlived its deadline")
	})
}
