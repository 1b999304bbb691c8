package postgres

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit"
)

// hourBase is aligned to the hour, so a test that runs for less than a
// minute from hourBase+1s stays in one window of each size.
const hourBase int64 = 1_699_999_200_000

var nodeSizes = []time.Duration{time.Minute, time.Hour}

// testClock runs from hourBase+1s at the speed of the real clock.
func testClock() func() time.Time {
	start := time.Now()
	return func() time.Time { return time.UnixMilli(hourBase + 1000).Add(time.Since(start)) }
}

// newNode starts a registry whose namespace syncs every 50 ms through store
// (retrying every 50 to 100 ms while the store fails).
func newNode(t *testing.T, store *Store, ns string, clock func() time.Time) *ratelimit.Namespace {
	t.Helper()
	reg := ratelimit.NewRegistry()
	n, err := reg.New(ratelimit.Config{Namespace: ns, WindowSizes: nodeSizes, SyncRate: 50 * time.Millisecond,
		MaxBackoff: 100 * time.Millisecond, Strategy: store, Clock: clock})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, reg.Close(context.Background())) })
	return n
}

// hitUntil sends round-robin hits to nodes (both window sizes) until done
// says stop, and returns the hits per key.
func hitUntil(t *testing.T, nodes []*ratelimit.Namespace, want map[string]int64, done func() bool) {
	t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(30 * time.Second)
	for i := 0; ; i++ {
		if i%64 == 0 && (done() || time.Now().After(deadline)) {
			require.True(t, done(), "traffic did not reach its goal in time")
			return
		}
		key := fmt.Sprint("user-", i%17)
		for _, size := range nodeSizes {
			_, err := nodes[i%len(nodes)].Increment(ctx, key, size, 1)
			require.NoError(t, err)
		}
		want[key]++
	}
}

// converged does a final Sync on every node, then a Fetch on every node, and
// checks that every node reports the exact totals.
func converged(t *testing.T, nodes []*ratelimit.Namespace, want map[string]int64, clock func() time.Time) {
	t.Helper()
	ctx := context.Background()
	for _, n := range nodes {
		require.NoError(t, n.Sync(ctx))
	}
	for _, n := range nodes {
		require.NoError(t, n.Fetch(ctx, clock()))
	}
	for i, n := range nodes {
		for key, w := range want {
			for _, size := range nodeSizes {
				r, err := n.SlidingWindow(ctx, key, size)
				require.NoError(t, err)
				require.Equal(t, float64(w), r, "node %d key %s window %v", i, key, size)
			}
		}
	}
}

func syncsAtLeast(nodes []*ratelimit.Namespace, n int64) func() bool {
	return func() bool {
		for _, node := range nodes {
			if node.Stats().Syncs < n {
				return false
			}
		}
		return true
	}
}

// Three nodes, one pool each, sync every 50 ms while hits arrive round-robin;
// after a final sync and fetch every node reports the exact total.
func TestMultiNode(t *testing.T) {
	dsn := testDSN(t)
	table := uniqueTable(t)
	clock := testClock()
	var nodes []*ratelimit.Namespace
	for range 3 {
		s := newStore(t, newPool(t, dsn), Options{Table: table})
		nodes = append(nodes, newNode(t, s, "multi", clock))
	}
	want := map[string]int64{}
	hitUntil(t, nodes, want, syncsAtLeast(nodes, 5)) // several cycles mid-traffic
	converged(t, nodes, want, clock)
}

// One node reaches PostgreSQL through a proxy. Its replies are lost after the
// server committed (the engine re-sends the same batch), then the proxy
// refuses connections for several cycles while hits keep coming. Once it is
// back, no hit is lost and none is counted twice.
func TestMultiNodeOutage(t *testing.T) {
	dsn := testDSN(t)
	table := uniqueTable(t)
	clock := testClock()
	p, proxied := newProxy(t, dsn, func(c *pgxpool.Config) { c.MaxConns = 2 })
	// No retries inside the store: the engine must handle every lost reply.
	flaky := newStore(t, proxied, Options{Table: table, MaxRetries: -1})
	nodes := []*ratelimit.Namespace{newNode(t, flaky, "outage", clock)}
	for range 2 {
		nodes = append(nodes, newNode(t, newStore(t, newPool(t, dsn), Options{Table: table}), "outage", clock))
	}
	want := map[string]int64{}
	hitUntil(t, nodes, want, syncsAtLeast(nodes, 2))

	// Lost replies: the namespace is a parameter of every push, so the
	// proxy cuts the next 10 statements of this namespace after the server
	// answered.
	p.cutAfter("outage", 10, true)
	hitUntil(t, nodes, want, func() bool { return p.cutCount.Load() >= 10 })

	// Refused for several cycles, while traffic goes on.
	p.setDown(true)
	before := nodes[0].Stats().SyncErrors
	hitUntil(t, nodes, want, func() bool { return nodes[0].Stats().SyncErrors >= before+3 })
	for range 3 {
		err := nodes[0].Sync(context.Background())
		require.True(t, errors.Is(err, ratelimit.ErrStoreUnavailable), "%v", err)
	}
	p.setDown(false)
	hitUntil(t, nodes, want, syncsAtLeast(nodes, nodes[0].Stats().Syncs+2))
	converged(t, nodes, want, clock)
}
