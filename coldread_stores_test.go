package ratelimit_test

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit"
	"github.com/ratesync/ratelimit/strategy"
	"github.com/ratesync/ratelimit/strategy/postgres"
	rlredis "github.com/ratesync/ratelimit/strategy/redis"
	"github.com/ratesync/ratelimit/strategy/strategytest"
)

// A client spends its token buckets and its windows on node A; A syncs;
// then the client's requests reach node B, which has never seen it, many
// at once. With the real stores, B reads each key once before judging it
// (concurrent callers share the reads) and admits nothing.
func TestColdReadMovingClientRealStores(t *testing.T) {
	stores := realStores("coldmove")
	for name, newStore := range stores {
		t.Run(name, func(t *testing.T) {
			leakCheck(t)
			const keys, callers = 20, 4
			store := newStore(t)
			cfg := ratelimit.Config{WindowSizes: []time.Duration{time.Minute}, SyncRate: time.Hour, Strategy: store,
				SyncTimeout: 5 * time.Second}
			a, b := newNS(t, cfg), newNS(t, cfg)
			limits := map[string]ratelimit.Limit{
				"bucket": {Window: time.Minute, Max: 5, Algorithm: ratelimit.TokenBucket},
				"window": {Window: time.Minute, Max: 5},
			}
			for kind, l := range limits {
				for i := range keys {
					require.Equal(t, 5, allowed(t, a, fmt.Sprintf("%s%d", kind, i), 5, l))
				}
			}
			require.NoError(t, a.Sync(ctx))

			var wg sync.WaitGroup
			var out outcomes
			for kind, l := range limits {
				for i := range keys {
					for range callers {
						wg.Go(func() { out.allow(t, b, fmt.Sprintf("%s%d", kind, i), l) })
					}
				}
			}
			wg.Wait()
			require.Zero(t, out.degraded.Load())
			require.Zero(t, out.admitted.Load(), "B admitted clients A had spent")
		})
	}
}

// realStores returns constructors of a fresh Redis and a fresh PostgreSQL
// store (its own key prefix or tables, named after prefix), for tests that
// run against the real servers.
func realStores(prefix string) map[string]func(t *testing.T) strategy.Strategy {
	return map[string]func(t *testing.T) strategy.Strategy{
		"redis": func(t *testing.T) strategy.Strategy {
			st, err := rlredis.New(testRedisClient(t), rlredis.Options{KeyPrefix: fmt.Sprintf("%s%d", prefix, time.Now().UnixNano()), Shards: 4})
			require.NoError(t, err)
			return st
		},
		"postgres": func(t *testing.T) strategy.Strategy {
			dsn := os.Getenv("RATELIMIT_TEST_POSTGRES_DSN")
			if dsn == "" {
				strategytest.SkipOrFail(t, "RATELIMIT_TEST_POSTGRES_DSN")
			}
			pool, err := pgxpool.New(context.Background(), dsn)
			require.NoError(t, err)
			t.Cleanup(pool.Close)
			table := fmt.Sprintf("rl_%s_%d", prefix, time.Now().UnixNano())
			st, err := postgres.New(context.Background(), pool, postgres.Options{Table: table})
			require.NoError(t, err)
			t.Cleanup(func() {
				_, _ = pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+table+", "+table+"_batches, "+table+"_changes, "+table+"_buckets, "+table+"_logs")
			})
			return st
		},
	}
}
