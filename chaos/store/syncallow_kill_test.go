package store

import (
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit"
)

// TestSyncAllowUnderRedisKills drives synchronous-mode Allow (every decision
// a round trip, a rejected hit taken back in a second one) through a Redis
// that is SIGKILLed and restarted again and again, with its append-only
// file (appendfsync always), under a limit that rejects four hits in
// five. While Redis is down the nodes decide locally (Degraded) and keep
// the hits and take-backs for the retry loop. Once it is back for good, the
// store's tally window must equal the hits admitted, key by key: no hit and
// no take-back lost or counted twice, whichever of the write-through, the
// take-back or its retry a kill cut. Clients keep go-redis's retries (3).
func TestSyncAllowUnderRedisKills(t *testing.T) {
	noLeaks(t)
	kills, every, down := pick(6, 2), pick(1500*time.Millisecond, time.Second), time.Second
	srv := startRedis(t, t.TempDir())
	b := ownRedisBackend(t, srv.addr())
	c := newCluster(t, b, refNodes, ratelimit.Config{SyncRate: 0, SyncTimeout: 500 * time.Millisecond,
		RetryInterval: 50 * time.Millisecond, MaxBackoff: time.Second,
		WindowSizes: []time.Duration{time.Second, tally.Window}})
	// 3 keys, 3 nodes at 300 hits/s: 300 a second per key against 60, so
	// that a decision made locally while Redis is down sees the total it
	// learned at or over the limit and takes its hit back there.
	lim := ratelimit.Limit{Window: time.Second, Max: 60}
	tr := start(c, keysN("user", 3), lim, refRate)
	for range kills {
		time.Sleep(every)
		srv.kill() // SIGKILL
		time.Sleep(down)
		require.True(t, srv.start(), "redis-server did not restart") // loads the append-only file
	}
	time.Sleep(every)
	tr.halt()
	require.Empty(t, tr.errs)

	drained := checkExact(t, b, c, tr, 30*time.Second)
	_, errs, pending, unresolved := c.stats()
	var maxWindow int64
	for _, m := range tr.perWindow {
		for _, n := range m {
			maxWindow = max(maxWindow, n)
		}
	}
	keys := make([]string, 0, len(tr.admitted))
	for k := range tr.admitted {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	result(t, "%d kills every %v, down %v: %d hits admitted (%v), store equal after %v; %d degraded decisions, most admitted in one key's window %d (limit %d); %d failed syncs; %d pending, %d unresolved after",
		kills, every, down, tr.total(), tr.admitted, drained.Round(time.Millisecond), tr.degraded, maxWindow, lim.Max, errs, pending, unresolved)
	require.Positive(t, tr.degraded, "the kills reached the decisions")
	require.NoError(t, c.close(10*time.Second))
}
