package compare

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/ratesync/ratelimit/strategy/redis"
	"github.com/ratesync/ratelimit/strategy/strategytest"
)

const envRedis = "RATELIMIT_TEST_REDIS_ADDR"

// noLeaks registers the goroutine leak check; call it first in a test, so
// that its cleanup runs after every other one.
func noLeaks(t *testing.T) {
	t.Helper()
	t.Cleanup(func() { goleak.VerifyNone(t) })
}

// client returns a client to the Redis at RATELIMIT_TEST_REDIS_ADDR, with
// every timeout and retry option set, or skips (fails under
// RATELIMIT_TEST_REQUIRE_SERVICES=1).
func client(tb testing.TB) *goredis.Client {
	tb.Helper()
	addr := os.Getenv(envRedis)
	if addr == "" {
		strategytest.SkipOrFail(tb, envRedis)
	}
	c := goredis.NewClient(&goredis.Options{
		Addr:                  addr,
		MaxRetries:            3,
		MinRetryBackoff:       5 * time.Millisecond,
		MaxRetryBackoff:       100 * time.Millisecond,
		DialTimeout:           2 * time.Second,
		ReadTimeout:           3 * time.Second,
		WriteTimeout:          3 * time.Second,
		PoolTimeout:           4 * time.Second,
		PoolSize:              32,
		ContextTimeoutEnabled: true,
	})
	tb.Cleanup(func() { _ = c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	require.NoError(tb, c.Ping(ctx).Err(), "Redis at %s", addr)
	return c
}

// unique returns a key prefix no other test or run uses.
func unique(tb testing.TB) string {
	tb.Helper()
	var b [6]byte
	_, err := rand.Read(b[:])
	require.NoError(tb, err)
	return "cmp-" + hex.EncodeToString(b[:])
}

func store(tb testing.TB, c *goredis.Client) *redis.Store {
	tb.Helper()
	s, err := redis.New(c, redis.Options{KeyPrefix: unique(tb)})
	require.NoError(tb, err)
	return s
}
