package ratelimit_test

import (
	"context"
	"fmt"
	"time"

	"github.com/ratesync/ratelimit"
	"github.com/ratesync/ratelimit/strategy/memory"
)

// A namespace counting hits locally, with an injected clock: the seed's worked
// example (40 hits in the previous minute, 10 in this one, 30 s in).
func ExampleNamespace_Increment() {
	now := time.UnixMilli(1_700_000_040_000) // a minute boundary
	clock := func() time.Time { return now }
	reg := ratelimit.NewRegistry()
	defer reg.Close(context.Background())
	ns, err := reg.New(ratelimit.Config{
		Namespace:   "api",
		WindowSizes: []time.Duration{time.Minute},
		SyncRate:    -1, // local only
		Clock:       clock,
	})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	now = now.Add(-30 * time.Second)
	ns.Increment(ctx, "alice", time.Minute, 40)
	now = now.Add(time.Minute)
	rate, _ := ns.Increment(ctx, "alice", time.Minute, 10)
	fmt.Println(rate)
	// Output: 30
}

// Two nodes sharing one store converge after a sync and a fetch.
func ExampleNamespace_Sync() {
	ctx := context.Background()
	store := memory.New()
	var nodes []*ratelimit.Namespace
	for range 2 {
		reg := ratelimit.NewRegistry()
		defer reg.Close(ctx)
		ns, err := reg.New(ratelimit.Config{
			WindowSizes: []time.Duration{time.Hour},
			SyncRate:    time.Hour, // the example syncs by hand
			Strategy:    store,
		})
		if err != nil {
			panic(err)
		}
		nodes = append(nodes, ns)
	}
	nodes[0].Increment(ctx, "bob", time.Hour, 3)
	nodes[1].Increment(ctx, "bob", time.Hour, 4)
	for _, n := range nodes {
		n.Sync(ctx)
	}
	nodes[0].Fetch(ctx, time.Now())
	rate, _ := nodes[0].SlidingWindow(ctx, "bob", time.Hour)
	// The rate may include part of the previous hour's window: none here.
	fmt.Println(rate >= 7, rate <= 7)
	// Output: true true
}

func ExampleSlidingRate() {
	t := time.UnixMilli(1_700_000_040_000).Add(45 * time.Second)
	fmt.Println(ratelimit.SlidingRate(10, 40, t, time.Minute))
	// Output: 20
}
