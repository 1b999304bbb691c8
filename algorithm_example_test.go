package ratelimit_test

import (
	"context"
	"fmt"
	"time"

	"github.com/ratesync/ratelimit"
)

// A token bucket of 3 refilling 2 per second (one token every 500 ms): three
// requests pass at once, the fourth waits for a token.
func ExampleLimit_tokenBucket() {
	now := time.UnixMilli(1_700_000_040_000)
	reg := ratelimit.NewRegistry()
	defer reg.Close(context.Background())
	ns, err := reg.New(ratelimit.Config{WindowSizes: []time.Duration{time.Second}, SyncRate: -1,
		Clock: func() time.Time { return now }})
	if err != nil {
		panic(err)
	}
	l := ratelimit.Limit{Algorithm: ratelimit.TokenBucket, Window: time.Second, Max: 2, Burst: 3}
	for range 4 {
		d, _ := ns.Allow(context.Background(), "client", 1, l)
		fmt.Println(d.Allowed, d.Remaining, d.RetryAfter, d.Reset)
	}
	now = now.Add(500 * time.Millisecond)
	d, _ := ns.Allow(context.Background(), "client", 1, l)
	fmt.Println(d.Allowed)
	// Output:
	// true 2 0s 500ms
	// true 1 0s 1s
	// true 0 0s 1.5s
	// false 0 500ms 1.5s
	// true
}

// A sliding log counts every request of the last window exactly: the fourth
// login attempt within a minute is refused until the first leaves the window.
func ExampleLimit_slidingLog() {
	now := time.UnixMilli(1_700_000_040_000)
	reg := ratelimit.NewRegistry()
	defer reg.Close(context.Background())
	ns, err := reg.New(ratelimit.Config{WindowSizes: []time.Duration{time.Minute}, SyncRate: -1,
		Clock: func() time.Time { return now }})
	if err != nil {
		panic(err)
	}
	l := ratelimit.Limit{Algorithm: ratelimit.SlidingLog, Window: time.Minute, Max: 3, Name: "login"}
	for _, at := range []time.Duration{0, 10 * time.Second, 50 * time.Second, 55 * time.Second, 60 * time.Second} {
		now = time.UnixMilli(1_700_000_040_000).Add(at)
		d, _ := ns.Allow(context.Background(), "alice", 1, l)
		fmt.Println(at, d.Allowed, d.RetryAfter)
	}
	// Output:
	// 0s true 0s
	// 10s true 0s
	// 50s true 0s
	// 55s false 5s
	// 1m0s true 0s
}
