package ratelimit_test

import (
	"context"
	"fmt"
	"time"

	"github.com/ratesync/ratelimit"
	"github.com/ratesync/ratelimit/strategy/memory"
)

// A client spends its budget on node A, then reaches node B, which has never
// seen it. B's first decision for the key reads it from the store (the
// default in periodic mode, Config.ColdRead), so B does not give the client
// a fresh budget. With ColdReadOff it would admit it until B's next sync.
func ExampleConfig_coldRead() {
	now := time.UnixMilli(1_700_000_050_000) // fixed, so the output does not depend on the time
	store := memory.New()                    // shared by both nodes, as Redis would be
	node := func() *ratelimit.Namespace {
		reg := ratelimit.NewRegistry()
		ns, err := reg.New(ratelimit.Config{Namespace: "api", WindowSizes: []time.Duration{time.Minute},
			SyncRate: time.Second, Strategy: store, Clock: func() time.Time { return now }})
		if err != nil {
			panic(err)
		}
		return ns
	}
	ctx := context.Background()
	a, b := node(), node()
	defer a.Close(ctx)
	defer b.Close(ctx)
	limit := ratelimit.Limit{Window: time.Minute, Max: 5}
	for range 5 {
		a.Allow(ctx, "client", 1, limit)
	}
	a.Sync(ctx) // or wait for A's next sync
	d, _ := b.Allow(ctx, "client", 1, limit)
	fmt.Println("admitted on B:", d.Allowed)
	// Output: admitted on B: false
}
