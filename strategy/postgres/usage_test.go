package postgres

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit"
)

// TestUsage is the package's usage example, run against the real server (an
// Example would need one wherever go test runs): two nodes, each a registry
// of its own, share counters through one PostgreSQL table.
func TestUsage(t *testing.T) {
	pool := newPool(t, testDSN(t))
	table := uniqueTable(t)
	ctx := context.Background()
	var out strings.Builder

	// Creates the table and its batch table if they are missing.
	store, err := New(ctx, pool, Options{Table: table})
	require.NoError(t, err)

	now := time.Date(2030, 1, 1, 12, 0, 30, 0, time.UTC) // a fixed clock, 30 s into a minute
	var nodes []*ratelimit.Namespace
	for range 2 {
		reg := ratelimit.NewRegistry()
		defer reg.Close(ctx) // pushes the hits not yet synced
		ns, err := reg.New(ratelimit.Config{
			Namespace:   "api",
			WindowSizes: []time.Duration{time.Minute},
			SyncRate:    0, // synchronous: every Increment is one round trip to PostgreSQL
			Strategy:    store,
			Clock:       func() time.Time { return now },
		})
		require.NoError(t, err)
		nodes = append(nodes, ns)
	}
	for i := range 3 {
		rate, err := nodes[i%2].Increment(ctx, "client-42", time.Minute, 1)
		require.NoError(t, err)
		fmt.Fprintf(&out, "node %d: client-42 made %.0f requests in the last minute\n", i%2, rate)
	}
	rate, err := nodes[1].SlidingWindow(ctx, "client-42", time.Minute)
	require.NoError(t, err)
	fmt.Fprintf(&out, "node 1 reads %.0f\n", rate)

	require.Equal(t, `node 0: client-42 made 1 requests in the last minute
node 1: client-42 made 2 requests in the last minute
node 0: client-42 made 3 requests in the last minute
node 1 reads 3
`, out.String())
}
