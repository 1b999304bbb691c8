package ratelimit_test

import (
	"context"
	"fmt"
	"time"

	"github.com/ratesync/ratelimit"
	"github.com/ratesync/ratelimit/strategy/memory"
)

// A namespace counting hits locally, with an injected clock: 40 hits in the
// previous minute and 10 in this one, 30 s in, make a sliding rate of 30.
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

// Two nodes sharing one store: each sees its own hits at once, and the
// other's after a sync has pushed them and a later sync (or Fetch) has read
// the store's total back. A fixed clock keeps the example independent of the
// time it runs at.
func ExampleNamespace_Sync() {
	ctx := context.Background()
	now := time.Date(2030, 1, 1, 12, 30, 0, 0, time.UTC) // half an hour into an hour window
	clock := func() time.Time { return now }
	store := memory.New()
	var nodes []*ratelimit.Namespace
	for range 2 {
		reg := ratelimit.NewRegistry()
		defer reg.Close(ctx)
		ns, err := reg.New(ratelimit.Config{
			WindowSizes: []time.Duration{time.Hour},
			SyncRate:    time.Hour, // the loop's first cycle is 30 minutes away: the example syncs by hand
			Strategy:    store,
			Clock:       clock,
		})
		if err != nil {
			panic(err)
		}
		nodes = append(nodes, ns)
	}
	show := func(when string) {
		a, _ := nodes[0].SlidingWindow(ctx, "bob", time.Hour)
		b, _ := nodes[1].SlidingWindow(ctx, "bob", time.Hour)
		fmt.Printf("%-28s node 0 sees %v, node 1 sees %v\n", when+":", a, b)
	}
	nodes[0].Increment(ctx, "bob", time.Hour, 3)
	nodes[1].Increment(ctx, "bob", time.Hour, 4)
	show("before any sync")
	nodes[0].Sync(ctx) // pushes 3, reads back the store's total: 3
	nodes[1].Sync(ctx) // pushes 4, reads back 7
	show("after one sync each")
	nodes[0].Fetch(ctx, now) // or its next Sync
	show("after node 0 fetches")
	// Output:
	// before any sync:             node 0 sees 3, node 1 sees 4
	// after one sync each:         node 0 sees 3, node 1 sees 7
	// after node 0 fetches:        node 0 sees 7, node 1 sees 7
}

func ExampleSlidingRate() {
	t := time.UnixMilli(1_700_000_040_000).Add(45 * time.Second)
	fmt.Println(ratelimit.SlidingRate(10, 40, t, time.Minute))
	// Output: 20
}
