package postgres_test

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ratesync/ratelimit"
	"github.com/ratesync/ratelimit/strategy/postgres"
)

// A namespace whose nodes share counters through PostgreSQL. It needs a
// server, so it is compiled but not run.
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	defer pool.Close()

	// Creates rl_counters and rl_counters_batches if they are missing.
	store, err := postgres.New(ctx, pool, postgres.Options{})
	if err != nil {
		panic(err)
	}

	reg := ratelimit.NewRegistry()
	defer reg.Close(ctx) // pushes the hits not yet synced
	api, err := reg.New(ratelimit.Config{
		Namespace:   "api",
		WindowSizes: []time.Duration{time.Minute},
		SyncRate:    100 * time.Millisecond, // push and learn totals ten times a second
		Strategy:    store,
	})
	if err != nil {
		panic(err)
	}
	rate, err := api.Increment(ctx, "client-42", time.Minute, 1)
	if err != nil {
		panic(err)
	}
	fmt.Printf("client-42: %.0f requests in the last minute\n", rate)
}
