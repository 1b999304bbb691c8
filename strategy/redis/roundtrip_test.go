package redis

import (
	"context"
	"fmt"
	"net"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit"
	"github.com/ratesync/ratelimit/strategy"
)

// roundTrips counts the client's round trips: single commands and pipelines.
type roundTrips struct{ n atomic.Int64 }

func (r *roundTrips) DialHook(next goredis.DialHook) goredis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) { return next(ctx, network, addr) }
}

func (r *roundTrips) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		r.n.Add(1)

		return next(ctx, cmd)
	}
}

func (r *roundTrips) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		r.n.Add(1)

		return next(ctx, cmds)
	}
}

// One round trip per synchronous-mode Increment, and one per sync cycle
// (the push of every dirty key with the reads of the keys seen, all shards).
func TestOneRoundTrip(t *testing.T) {
	noLeaks(t)
	_, c := miniClient(t)
	require.NoError(t, c.Ping(context.Background()).Err()) // connect before counting
	rt := &roundTrips{}
	c.AddHook(rt)
	s := newStore(t, c, Options{})
	now := time.UnixMilli(base + 30_000)
	clock := func() time.Time { return now }
	ctx := context.Background()

	reg := ratelimit.NewRegistry()
	defer func() { require.NoError(t, reg.Close(ctx)) }()
	sync0, err := reg.New(ratelimit.Config{Namespace: "sync", WindowSizes: []time.Duration{time.Minute},
		SyncRate: 0, Strategy: s, Clock: clock, SyncTimeout: 30 * time.Second}) // a loaded CI machine must not time out
	require.NoError(t, err)
	// The first push meets NOSCRIPT (a fresh server) and re-sends with EVAL.
	_, err = sync0.Increment(ctx, "warm-up", time.Minute, 1)
	require.NoError(t, err)
	for i := range 20 {
		before := rt.n.Load()
		rate, err := sync0.Increment(ctx, fmt.Sprintf("k%d", i%3), time.Minute, 1)
		require.NoError(t, err)
		require.Equal(t, float64(i/3+1), rate)
		require.Equal(t, int64(1), rt.n.Load()-before, "increment %d", i)
	}

	// SyncRate far beyond the test: only the explicit Sync below runs.
	async, err := reg.New(ratelimit.Config{Namespace: "async", WindowSizes: []time.Duration{time.Minute, time.Hour},
		SyncRate: time.Hour, Strategy: s, Clock: clock, SyncTimeout: 30 * time.Second})
	require.NoError(t, err)
	hits := func(round int) {
		for i := range 500 {
			_, err := async.Increment(ctx, fmt.Sprintf("user-%d", i), time.Minute, 1)
			require.NoError(t, err)
			_, err = async.Increment(ctx, fmt.Sprintf("user-%d", i), time.Hour, 2)
			require.NoError(t, err, "round %d", round)
		}
	}
	hits(1)
	require.NoError(t, async.Sync(ctx)) // warm up: go-redis dials its pipeline connection
	hits(2)
	before := rt.n.Load()
	require.NoError(t, async.Sync(ctx))
	require.Equal(t, int64(1), rt.n.Load()-before, "a sync of 1,000 counters and their reads over 64 shards is one round trip")
	n, err := s.GetWindow(ctx, "async", strategy.CounterID{Key: "user-7", Size: time.Hour, Start: strategy.WindowStart(now.UnixMilli(), time.Hour)})
	require.NoError(t, err)
	require.Equal(t, int64(4), n)
}
