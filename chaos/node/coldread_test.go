package node

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit"
	"github.com/ratesync/ratelimit/strategy/redis"
)

// The moving client on a real Redis: a client spends its 5 requests
// on node A, A syncs, and the client reaches node B, which never saw it. With
// the cold read (the default) B reads the key before judging it and rejects;
// with ColdReadOff B admits 5 more, as before.
func TestColdReadMovingClientRedis(t *testing.T) {
	noLeaks(t)
	addr := redisAddr(t)
	prefix := uniquePrefix(t)
	ctx := context.Background()
	at := time.Now() // fixed: no window boundary during the test
	clock := func() time.Time { return at }
	node := func(cold ratelimit.ColdRead) *ratelimit.Namespace {
		store, err := redis.New(newRedisClient(t, addr), redis.Options{KeyPrefix: prefix})
		require.NoError(t, err)
		ns, err := ratelimit.NewRegistry().New(ratelimit.Config{Namespace: "cold", WindowSizes: []time.Duration{time.Minute},
			SyncRate: time.Hour, Strategy: store, Clock: clock, ColdRead: cold})
		require.NoError(t, err)
		closeNS(t, ns)
		return ns
	}
	a, b, off := node(ratelimit.ColdReadOn), node(ratelimit.ColdReadOn), node(ratelimit.ColdReadOff)
	lim := ratelimit.Limit{Window: time.Minute, Max: 5}
	for _, key := range []string{"client", "client-off"} {
		for i := range 5 {
			d, err := a.Allow(ctx, key, 1, lim)
			require.NoError(t, err)
			require.True(t, d.Allowed, "%s: hit %d on A", key, i+1)
		}
	}
	require.NoError(t, a.Sync(ctx))

	d, err := b.Allow(ctx, "client", 1, lim)
	require.NoError(t, err)
	require.False(t, d.Allowed, "B read the client's 5 hits on A")
	require.False(t, d.Degraded)
	rate, err := b.SlidingWindow(ctx, "client", time.Minute)
	require.NoError(t, err)
	require.Equal(t, 5.0, rate, "the key stays local on B after its read")

	admitted := 0
	for range 5 {
		d, err := off.Allow(ctx, "client-off", 1, lim)
		require.NoError(t, err)
		if d.Allowed {
			admitted++
		}
	}
	require.Equal(t, 5, admitted, "without the cold read a node that never saw the client gives it a fresh budget")
}
