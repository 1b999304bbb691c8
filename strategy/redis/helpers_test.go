package redis

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/ratesync/ratelimit/strategy/strategytest"
)

// Environment variables naming the test servers.
const (
	envRedis          = "RATELIMIT_TEST_REDIS_ADDR"
	envCluster        = "RATELIMIT_TEST_REDIS_CLUSTER_ADDRS"
	envSentinel       = "RATELIMIT_TEST_REDIS_SENTINEL_ADDR"
	envSentinelMaster = "RATELIMIT_TEST_REDIS_SENTINEL_MASTER"
)

// noLeaks registers the goroutine leak check; call it first in a test, so
// that its cleanup runs after every other one (clients, servers).
func noLeaks(t *testing.T) {
	t.Helper()
	t.Cleanup(func() { goleak.VerifyNone(t) })
}

// uniquePrefix returns a key prefix no other test (or run) uses.
func uniquePrefix(t testing.TB) string {
	t.Helper()
	var b [6]byte
	_, err := rand.Read(b[:])
	require.NoError(t, err)
	return "rlt-" + hex.EncodeToString(b[:])
}

// Every timeout and retry option is set, so a test never depends on the
// library's defaults (except the lost-reply test, which wants them).
const (
	testMaxRetries      = 3
	testMinRetryBackoff = 5 * time.Millisecond
	testMaxRetryBackoff = 100 * time.Millisecond
	testDialTimeout     = 2 * time.Second
	testReadTimeout     = 3 * time.Second
	testWriteTimeout    = 3 * time.Second
	testPoolTimeout     = 4 * time.Second
)

func clientOptions(addr string) *goredis.Options {
	return &goredis.Options{
		Addr:                  addr,
		MaxRetries:            testMaxRetries,
		MinRetryBackoff:       testMinRetryBackoff,
		MaxRetryBackoff:       testMaxRetryBackoff,
		DialTimeout:           testDialTimeout,
		DialerRetries:         2,
		DialerRetryTimeout:    50 * time.Millisecond,
		ReadTimeout:           testReadTimeout,
		WriteTimeout:          testWriteTimeout,
		PoolTimeout:           testPoolTimeout,
		ContextTimeoutEnabled: true,
	}
}

func newClient(t testing.TB, addr string) *goredis.Client {
	t.Helper()
	c := goredis.NewClient(clientOptions(addr))
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// miniClient starts a miniredis and returns it with a client to it.
func miniClient(t testing.TB) (*miniredis.Miniredis, *goredis.Client) {
	t.Helper()
	mr := miniredis.RunT(t)
	return mr, newClient(t, mr.Addr())
}

// realAddr returns the real Redis's address, or skips (or fails) t.
func realAddr(t testing.TB) string {
	t.Helper()
	addr := os.Getenv(envRedis)
	if addr == "" {
		strategytest.SkipOrFail(t, envRedis)
	}
	return addr
}

// realClient returns a client to the real Redis, or skips (or fails) t.
func realClient(t testing.TB) *goredis.Client {
	t.Helper()
	c := newClient(t, realAddr(t))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	require.NoError(t, c.Ping(ctx).Err(), "real Redis at %s", os.Getenv(envRedis))
	return c
}

func clusterAddrs(t testing.TB) []string {
	t.Helper()
	v := os.Getenv(envCluster)
	if v == "" {
		strategytest.SkipOrFail(t, envCluster)
	}
	return strings.Split(v, ",")
}

func clusterOptions(addrs []string) *goredis.ClusterOptions {
	return &goredis.ClusterOptions{
		Addrs:                 addrs,
		MaxRedirects:          8,
		MaxRetries:            testMaxRetries,
		MinRetryBackoff:       testMinRetryBackoff,
		MaxRetryBackoff:       testMaxRetryBackoff,
		DialTimeout:           testDialTimeout,
		DialerRetries:         2,
		DialerRetryTimeout:    50 * time.Millisecond,
		ReadTimeout:           testReadTimeout,
		WriteTimeout:          testWriteTimeout,
		PoolTimeout:           testPoolTimeout,
		ContextTimeoutEnabled: true,
	}
}

// clusterClient returns a client to the real Redis Cluster, or skips (or fails) t.
func clusterClient(t testing.TB) *goredis.ClusterClient {
	t.Helper()
	c := goredis.NewClusterClient(clusterOptions(clusterAddrs(t)))
	t.Cleanup(func() { _ = c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	require.NoError(t, c.ForEachShard(ctx, func(ctx context.Context, n *goredis.Client) error {
		return n.Ping(ctx).Err()
	}), "real Redis Cluster at %s", os.Getenv(envCluster))
	return c
}

func sentinelConfig(t testing.TB) (addr, master string) {
	t.Helper()
	addr, master = os.Getenv(envSentinel), os.Getenv(envSentinelMaster)
	if addr == "" {
		strategytest.SkipOrFail(t, envSentinel)
	}
	if master == "" {
		strategytest.SkipOrFail(t, envSentinelMaster)
	}
	return addr, master
}

func failoverOptions(addr, master string) *goredis.FailoverOptions {
	return &goredis.FailoverOptions{
		MasterName:            master,
		SentinelAddrs:         []string{addr},
		MaxRetries:            testMaxRetries,
		MinRetryBackoff:       testMinRetryBackoff,
		MaxRetryBackoff:       testMaxRetryBackoff,
		DialTimeout:           testDialTimeout,
		DialerRetries:         2,
		DialerRetryTimeout:    50 * time.Millisecond,
		ReadTimeout:           testReadTimeout,
		WriteTimeout:          testWriteTimeout,
		PoolTimeout:           testPoolTimeout,
		ContextTimeoutEnabled: true,
	}
}

// sentinelClient returns a Sentinel failover client, or skips (or fails) t.
func sentinelClient(t testing.TB) *goredis.Client {
	t.Helper()
	c := goredis.NewFailoverClient(failoverOptions(sentinelConfig(t)))
	t.Cleanup(func() { _ = c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	require.NoError(t, c.Ping(ctx).Err(), "real Sentinel at %s", os.Getenv(envSentinel))
	return c
}

func newStore(t testing.TB, c goredis.UniversalClient, opts Options) *Store {
	t.Helper()
	if opts.KeyPrefix == "" {
		opts.KeyPrefix = uniquePrefix(t)
	}
	s, err := New(c, opts)
	require.NoError(t, err)
	return s
}

type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}

// TestMain silences go-redis's log (the fault tests make it report hundreds
// of broken connections) unless RATELIMIT_TEST_REDIS_LOG=1.
func TestMain(m *testing.M) {
	if os.Getenv("RATELIMIT_TEST_REDIS_LOG") != "1" {
		goredis.SetLogger(quietLogger{})
	}
	os.Exit(m.Run())
}
