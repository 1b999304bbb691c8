package redis_test

import (
	"context"
	"fmt"
	"time"

	"github.com/alicebob/miniredis/v2"
	goredis "github.com/redis/go-redis/v9"

	"github.com/ratesync/ratelimit"
	"github.com/ratesync/ratelimit/strategy"
	"github.com/ratesync/ratelimit/strategy/redis"
)

// newClient returns a client with every retry and timeout option set, as
// production code should: the Store stays exact with any MaxRetries, but
// these options decide how long a sync may wait for a slow or absent Redis.
func newClient(addr string) *goredis.Client {
	return goredis.NewClient(&goredis.Options{
		Addr:            addr,
		MaxRetries:      3,
		MinRetryBackoff: 8 * time.Millisecond,
		MaxRetryBackoff: 512 * time.Millisecond,
		DialTimeout:     time.Second,
		ReadTimeout:     500 * time.Millisecond,
		WriteTimeout:    500 * time.Millisecond,
		PoolTimeout:     time.Second,
		// Every call returns by its context's deadline (New requires it).
		ContextTimeoutEnabled: true,
	})
}

// A namespace whose counters live in Redis. The example runs against an
// in-process miniredis; give New a client to your Redis, Sentinel
// (goredis.NewFailoverClient) or Cluster (goredis.NewClusterClient) instead.
func Example() {
	mr, err := miniredis.Run()
	if err != nil {
		panic(err)
	}
	defer mr.Close()
	client := newClient(mr.Addr())
	defer client.Close()

	store, err := redis.New(client, redis.Options{})
	if err != nil {
		panic(err)
	}
	now := time.Date(2030, 1, 1, 12, 0, 30, 0, time.UTC) // a fixed clock, 30 s into a minute
	reg := ratelimit.NewRegistry()
	defer reg.Close(context.Background())
	ns, err := reg.New(ratelimit.Config{
		Namespace:   "api",
		WindowSizes: []time.Duration{time.Minute},
		SyncRate:    0, // synchronous: every Increment is one round trip to Redis
		Strategy:    store,
		Clock:       func() time.Time { return now },
	})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	for range 3 {
		rate, err := ns.Increment(ctx, "client-42", time.Minute, 1)
		if err != nil {
			panic(err)
		}
		fmt.Println(rate)
	}
	// Output:
	// 1
	// 2
	// 3
}

// A batch sent twice (as after a reply lost to a dropped connection) is
// applied once; the second answer carries the current totals.
func ExampleStore_PushDiffs() {
	mr, err := miniredis.Run()
	if err != nil {
		panic(err)
	}
	defer mr.Close()
	client := newClient(mr.Addr())
	defer client.Close()
	store, err := redis.New(client, redis.Options{KeyPrefix: "demo", Shards: 16})
	if err != nil {
		panic(err)
	}

	start := strategy.WindowStart(time.Date(2030, 1, 1, 12, 0, 30, 0, time.UTC).UnixMilli(), time.Minute)
	batch := &strategy.Batch{
		ID:        "node-a-1",
		Namespace: "api",
		Diffs: []strategy.Diff{
			{CounterID: strategy.CounterID{Key: "alice", Size: time.Minute, Start: start}, Delta: 3},
			{CounterID: strategy.CounterID{Key: "bob", Size: time.Minute, Start: start}, Delta: 1},
		},
		Reads: []strategy.CounterID{{Key: "alice", Size: time.Minute, Start: start - 60_000}},
	}
	ctx := context.Background()
	for range 2 {
		res, err := store.PushDiffs(ctx, batch)
		if err != nil {
			panic(err)
		}
		fmt.Println(res.Totals, res.Reads)
	}
	// Output:
	// [3 1] [0]
	// [3 1] [0]
}

// Window time from Redis: nodes whose clocks disagree still agree on window
// boundaries.
func ExampleStore_Clock() {
	mr, err := miniredis.Run()
	if err != nil {
		panic(err)
	}
	defer mr.Close()
	mr.SetTime(time.Date(2030, 1, 1, 12, 0, 30, 0, time.UTC)) // the server's clock
	client := newClient(mr.Addr())
	defer client.Close()
	store, err := redis.New(client, redis.Options{})
	if err != nil {
		panic(err)
	}

	clock, err := store.Clock(context.Background())
	if err != nil {
		panic(err)
	}
	// Pass clock.Now as ratelimit.Config.Clock, and refresh the offset now
	// and then: go clock.Run(ctx, time.Minute).
	fmt.Println(ratelimit.WindowStart(clock.Now(), time.Minute).UTC())
	// Output:
	// 2030-01-01 12:00:00 +0000 UTC
}
