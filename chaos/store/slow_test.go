package store

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit"
)

// Scenario 2: every round trip to the store takes 500 ms, then 2 s longer.
// The check path must not slow down: its latency is compared with a baseline
// cluster that runs at the same time, with the same traffic, through a store
// path without added latency (so machine load hits both alike). At most one
// sync may be in flight per node, and no hit may be lost.
func TestSlowStore(t *testing.T) {
	// The comparison is between two clusters running at the same time, so
	// the stores' cases may run concurrently: the leak check is the parent's.
	noLeaks(t)
	phase := pick(8*time.Second, time.Second)
	concurrently(t, false,
		namedCase{"memory", func(t *testing.T) {
			slow, _ := memoryBackend(t)
			fast, _ := memoryBackend(t)
			runSlow(t, slow, fast, phase)
		}},
		namedCase{"redis", func(t *testing.T) {
			addr := redisAddr(t)
			runSlow(t, redisBackend(t, addr), redisBackend(t, addr), phase)
		}},
		namedCase{"postgres", func(t *testing.T) {
			slow, _ := postgresBackend(t)
			fast, _ := postgresBackend(t)
			runSlow(t, slow, fast, phase)
		}},
		namedCase{"memory/beyond-timeout", func(t *testing.T) {
			b, _ := memoryBackend(t)
			runBeyondTimeout(t, b, phase)
		}},
		namedCase{"redis/beyond-timeout", func(t *testing.T) {
			runBeyondTimeout(t, redisBackend(t, redisAddr(t)), phase)
		}},
		namedCase{"postgres/beyond-timeout", func(t *testing.T) {
			b, _ := postgresBackend(t)
			runBeyondTimeout(t, b, phase)
		}},
	)
}

func runSlow(t *testing.T, slowB, fastB *backend, phase time.Duration) {
	// SyncTimeout above the added latency: the store is slow, not down.
	cfg := ratelimit.Config{SyncRate: refSyncRate, SyncTimeout: 5 * time.Second}
	slow := newCluster(t, slowB, refNodes, cfg)
	fast := newCluster(t, fastB, refNodes, cfg)
	limit := ratelimit.Limit{Window: refWindow, Max: refLimit}
	keys := keysN("user", 10)
	trSlow := start(slow, keys, limit, refRate)
	trFast := start(fast, keys, limit, refRate)

	time.Sleep(500 * time.Millisecond) // warm up: connections, prepared statements
	latencies := []time.Duration{500 * time.Millisecond, 2 * time.Second}
	syncs := make([]int64, len(latencies))
	for i, d := range latencies {
		s0, _, _, _ := slow.stats()
		trSlow.phase.Store(int32(i + 1))
		trFast.phase.Store(int32(i + 1))
		slowB.latency(d)
		time.Sleep(phase)
		s1, _, _, _ := slow.stats()
		syncs[i] = s1 - s0
	}
	trSlow.halt()
	trFast.halt()
	if !heavy() {
		slowB.latency(0) // saves a round trip of 2 s; the full run flushes through it
	}
	// Close flushes through the slow store (2 s per round trip).
	closeStart := time.Now()
	require.NoError(t, slow.close(20*time.Second), "Close flushes through a slow store")
	closeTook := time.Since(closeStart)
	require.NoError(t, fast.close(10*time.Second))
	slowB.latency(0)
	checkExact(t, slowB, slow, trSlow, 10*time.Second)
	checkExact(t, fastB, fast, trFast, 10*time.Second)
	_, slowErrs, _, _ := slow.stats()

	for i, d := range latencies {
		ls, lf := trSlow.latencies(int32(i+1)), trFast.latencies(int32(i+1))
		require.NotEmpty(t, ls)
		require.NotEmpty(t, lf)
		p99s, p99f := quantile(ls, .99), quantile(lf, .99)
		ratio := float64(p99s) / float64(p99f)
		result(t, "+%v per round trip for %v: Allow p99 %v (max %v, %d checks) vs %v (max %v, %d checks) on the baseline cluster at the same time: ratio %.2f; %d sync cycles completed by 3 nodes",
			d, phase, p99s, ls[len(ls)-1], len(ls), p99f, lf[len(lf)-1], len(lf), ratio, syncs[i])
		// p99 within 20% of the baseline, or under an absolute 1 ms: at
		// tens of microseconds a single preemption of a traffic goroutine
		// on a loaded 2-core machine moves p99 by more than 20%, while a
		// check that waited for the store would take at least d.
		assert.True(t, ratio <= 1.2 || p99s < time.Millisecond,
			"Allow p99 %v with +%v store latency vs %v baseline", p99s, d, p99f)
		// No check waited for the store at all.
		assert.Less(t, ls[len(ls)-1], d/2, "the slowest check with +%v store latency", d)
	}
	result(t, "at most %d PushDiffs in flight per node (baseline cluster: %d); %d failed cycles; Close flushed through the slow store in %v; store totals equal the %d admitted hits",
		slow.maxInflight(), fast.maxInflight(), slowErrs, closeTook.Round(time.Millisecond), trSlow.total())
	assert.Equal(t, int64(1), slow.maxInflight(), "at most one sync in flight per node")
	assert.Equal(t, int64(1), fast.maxInflight())
	assert.Zero(t, slowErrs, "a slow store within SyncTimeout is not a failing one")
	assert.Zero(t, trSlow.degraded, "nor are decisions degraded by it")
	assert.Empty(t, trSlow.errs)
}

// runBeyondTimeout makes the store 2 s slow with the default SyncTimeout of
// 1 s: every push times out with an unknown outcome. Through the proxy a
// delayed request still reaches the server after the node gave up (as on a
// congested network), so the server may apply pushes whose answer nobody
// reads, and the node re-sends them. Such a store counts as down (failed
// cycles, degraded decisions, backoff); when it is fast again every hit is
// in the store exactly once.
func runBeyondTimeout(t *testing.T, b *backend, phase time.Duration) {
	// Long enough for a few timed-out cycles; SyncTimeout is the default 1 s.
	phase = max(phase, 2500*time.Millisecond)
	c := newCluster(t, b, refNodes, ratelimit.Config{SyncRate: refSyncRate})
	tr := start(c, keysN("user", 3), ratelimit.Limit{Window: refWindow, Max: refLimit}, refRate)
	time.Sleep(500 * time.Millisecond)
	_, errs0, _, _ := c.stats()
	tr.phase.Store(1)
	b.latency(2 * time.Second)
	time.Sleep(phase)
	tr.halt()
	_, errs1, _, unresolved := c.stats()
	b.latency(0)
	up := time.Now()
	checkExact(t, b, c, tr, 30*time.Second)
	recovery := time.Since(up)
	require.NoError(t, c.close(10*time.Second))
	lat := tr.latencies(1)
	require.NotEmpty(t, lat)
	result(t, "+2s per round trip with SyncTimeout 1s for %v: %d failed cycles, %d of %d checks degraded (p99 %v), %d pushes of unknown outcome at the end; once fast, the store held exactly the %d admitted hits after %v",
		phase, errs1-errs0, tr.degraded, len(lat), quantile(lat, .99), unresolved, tr.total(), recovery.Round(time.Millisecond))
	assert.Positive(t, errs1-errs0, "a store slower than SyncTimeout fails cycles")
	assert.Positive(t, tr.degraded)
	assert.Equal(t, int64(1), c.maxInflight(), "at most one sync in flight per node")
	assert.Less(t, lat[len(lat)-1], time.Second, "no check waited for the store")
}
