package redisstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/ratesync/ratelimit/policy"
	"github.com/ratesync/ratelimit/policy/storetest"
)

const envRedis = "RATELIMIT_TEST_REDIS_ADDR"

// newClient sets every timeout and retry option.
func newClient(t *testing.T, addr string) *goredis.Client {
	c := goredis.NewClient(&goredis.Options{
		Addr:                  addr,
		MaxRetries:            -1, // Append is not idempotent
		MinRetryBackoff:       5 * time.Millisecond,
		MaxRetryBackoff:       100 * time.Millisecond,
		DialTimeout:           2 * time.Second,
		ReadTimeout:           3 * time.Second,
		WriteTimeout:          3 * time.Second,
		PoolTimeout:           4 * time.Second,
		ContextTimeoutEnabled: true,
	})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func uniquePrefix(t *testing.T) string {
	var b [6]byte
	_, err := rand.Read(b[:])
	require.NoError(t, err)
	return "rlt-policy-" + hex.EncodeToString(b[:])
}

func noLeaks(t *testing.T) { t.Cleanup(func() { goleak.VerifyNone(t) }) }

func run(t *testing.T, addr string) {
	storetest.Run(t, func(t *testing.T) storetest.Env {
		prefix := uniquePrefix(t)
		s := New(newClient(t, addr), Options{Prefix: prefix})
		return storetest.Env{
			Store: s,
			// Each node has its own client, as separate processes would.
			NewNodeStore: func(t *testing.T) policy.Store { return New(newClient(t, addr), Options{Prefix: prefix}) },
			AppendQuietly: func(t *testing.T, doc []byte) int64 {
				n, err := s.append(context.Background(), doc, false)
				require.NoError(t, err)
				return n
			},
		}
	})
}

func TestMiniredis(t *testing.T) {
	noLeaks(t)
	m := miniredis.RunT(t)
	run(t, m.Addr())
}

func TestRedis(t *testing.T) {
	noLeaks(t)
	addr := os.Getenv(envRedis)
	if addr == "" {
		storetest.SkipOrFail(t, envRedis)
	}
	run(t, addr)
}

func TestErrors(t *testing.T) {
	noLeaks(t)
	m := miniredis.RunT(t)
	s := New(newClient(t, m.Addr()), Options{})
	ctx := context.Background()
	n, err := s.Current(ctx)
	require.NoError(t, err)
	require.Zero(t, n)
	_, err = s.Get(ctx, 3)
	require.ErrorIs(t, err, policy.ErrNoVersion)
	require.ErrorIs(t, s.SetCurrent(ctx, 3), policy.ErrNoVersion)
	m.Close()
	_, err = s.Current(ctx)
	require.Error(t, err)
	_, err = s.Subscribe(ctx)
	require.Error(t, err)
}
