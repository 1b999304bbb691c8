package node

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/ratesync/ratelimit"
	"github.com/ratesync/ratelimit/strategy/strategytest"
)

const (
	envRedis = "RATELIMIT_TEST_REDIS_ADDR"
	envHeavy = "RATELIMIT_TEST_HEAVY"
)

// heavy reports whether the full-length scenarios were asked for.
func heavy() bool { return os.Getenv(envHeavy) == "1" }

// noLeaks registers the goroutine leak check. Call it first, so its cleanup
// runs after every other one.
func noLeaks(t *testing.T, opts ...goleak.Option) {
	t.Helper()
	t.Cleanup(func() { goleak.VerifyNone(t, opts...) })
}

// ignoreRedisRedial ignores go-redis's background redial goroutine: after
// failed dials its pool retries in a goroutine that sleeps a second between
// attempts and ends at the first wake-up after the client is closed. It is
// the client's, not the rate limiter's.
var ignoreRedisRedial = goleak.IgnoreAnyFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).tryDial")

// uniquePrefix returns a key prefix (and namespace suffix) that no other
// test or run uses, so tests never touch each other's keys on a shared Redis.
func uniquePrefix(t testing.TB) string {
	t.Helper()
	var b [6]byte
	_, err := rand.Read(b[:])
	require.NoError(t, err)
	return "rlchaos-" + hex.EncodeToString(b[:])
}

// redisAddr returns the test Redis's address, or skips (fails, when services
// are required) without one.
func redisAddr(t testing.TB) string {
	t.Helper()
	addr := os.Getenv(envRedis)
	if addr == "" {
		strategytest.SkipOrFail(t, envRedis)
	}
	return addr
}

// redisOptions sets every timeout and retry option explicitly, as the
// strategy's docs ask.
func redisOptions(addr string) *goredis.Options {
	return &goredis.Options{
		Addr:                  addr,
		MaxRetries:            3,
		MinRetryBackoff:       5 * time.Millisecond,
		MaxRetryBackoff:       100 * time.Millisecond,
		DialTimeout:           time.Second,
		ReadTimeout:           time.Second,
		WriteTimeout:          time.Second,
		PoolTimeout:           2 * time.Second,
		ContextTimeoutEnabled: true,
	}
}

func goredisClient(addr string) *goredis.Client { return goredis.NewClient(redisOptions(addr)) }

func newRedisClient(t testing.TB, addr string) *goredis.Client {
	t.Helper()
	c := goredisClient(addr)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// sentinels are every error the public API documents.
var sentinels = []error{
	ratelimit.ErrNamespaceExists, ratelimit.ErrInvalidConfig, ratelimit.ErrUnknownWindow,
	ratelimit.ErrInvalidKey, ratelimit.ErrInvalidValue, ratelimit.ErrNilContext,
	ratelimit.ErrClosed, ratelimit.ErrStoreUnavailable, ratelimit.ErrInvalidLimit,
	ratelimit.ErrInvalidCost,
}

// isSentinel reports whether err matches one of the documented sentinels.
func isSentinel(err error) bool {
	for _, s := range sentinels {
		if errors.Is(err, s) {
			return true
		}
	}
	return false
}

// impossible reports whether no input may produce d: a negative figure, or an
// admitted hit told to retry.
func impossible(d ratelimit.Decision) bool {
	return d.Remaining < 0 || d.RetryAfter < 0 || d.Reset < 0 || (d.Allowed && d.RetryAfter != 0)
}

// closeNS closes ns at cleanup, with a deadline, and requires no error.
func closeNS(t *testing.T, ns *ratelimit.Namespace) {
	t.Helper()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(t, ns.Close(ctx))
	})
}
