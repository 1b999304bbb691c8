package node

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit"
	"github.com/ratesync/ratelimit/strategy/memory"
	"github.com/ratesync/ratelimit/strategy/redis"
)

// Scenario 5: clock skew. The reference cluster (3 nodes, 1,000 per 10 s,
// SyncRate 100 ms, 300 hits/s per node, B = 90) hammers one key while the
// nodes' clocks disagree. Nothing may panic or report a negative Remaining,
// and the hits admitted in each window of true time stay within
// L·(1 + skew/W) + B, where skew is the largest distance of a node's clock
// from true time.

const (
	refNodes    = 3
	refWindow   = 10 * time.Second
	refMax      = 1000
	refSyncRate = 100 * time.Millisecond
	refRate     = 300 // hits per second per node
)

// refSlack is B = nodes × rate × SyncRate.
func refSlack(nodes, rate int, syncRate time.Duration) int64 {
	return int64(math.Ceil(float64(nodes*rate) * syncRate.Seconds()))
}

// skewBound is L·(1 + skew/W) + B.
func skewBound(l int64, w, skew time.Duration, b int64) int64 {
	return int64(math.Floor(float64(l)*(1+skew.Seconds()/w.Seconds()))) + b
}

// checkDecision checks what every decision must satisfy, whatever the clocks.
func checkDecision(t *testing.T, d ratelimit.Decision) {
	t.Helper()
	if impossible(d) {
		t.Fatalf("impossible decision %+v", d)
	}
}

type skewCase struct {
	name    string
	offsets [refNodes]time.Duration // each node's clock minus true time
	// jumpAt, when positive, is the instant (since the start) at which node
	// jumpNode's clock jumps by jump.
	jumpAt   time.Duration
	jumpNode int
	jump     time.Duration
	skew     time.Duration // for the bound: the largest |offset| at any time
}

func skewCases() []skewCase {
	ms := time.Millisecond
	return []skewCase{
		{name: "in-step"},
		{name: "±500ms", offsets: [refNodes]time.Duration{-500 * ms, 0, 500 * ms}, skew: 500 * ms},
		{name: "±5s", offsets: [refNodes]time.Duration{-5 * time.Second, 0, 5 * time.Second}, skew: 5 * time.Second},
		// Node 2's clock jumps from 40.8 s back to 38.8 s: into the window
		// before the one it last counted in.
		{name: "jump-back-2s", jumpAt: 40_800 * ms, jumpNode: 2, jump: -2 * time.Second, skew: 2 * time.Second},
		{name: "±500ms-and-jump-back-2s", offsets: [refNodes]time.Duration{-500 * ms, 0, 500 * ms},
			jumpAt: 41_000 * ms, jumpNode: 0, jump: -2 * time.Second, skew: 2500 * ms},
	}
}

// TestClockSkewSimulated runs the reference cluster on the memory store in
// simulated time: the test advances every node's injected clock a millisecond
// at a time, spreads each node's 300 hits/s evenly, and calls Sync on every
// node at each 100 ms boundary of that node's clock, as the loop would (the
// loop itself is parked with a SyncRate of an hour). It checks the windows
// after the first: the client has been sending since an earlier window
// (steady state). TestClockSkewOnset checks the first.
func TestClockSkewSimulated(t *testing.T) {
	windows := 3 // the first, then two in steady state
	if heavy() {
		windows = 8
	}
	b := refSlack(refNodes, refRate, refSyncRate)
	for _, c := range skewCases() {
		t.Run(c.name, func(t *testing.T) {
			noLeaks(t)
			perWindow := simulateSkew(t, c, windows)[1:]
			bound := skewBound(refMax, refWindow, c.skew, b)
			t.Logf("skew %v: admitted per 10 s window of true time, after the first: %v; bound L·(1+skew/W)+B = %d (L+B = %d)",
				c.skew, perWindow, bound, refMax+b)
			for i, n := range perWindow {
				assert.LessOrEqual(t, n, bound, "window %d", i+1)
			}
			logResult(t, "skew/steady/"+c.name, fmt.Sprintf("max %d per window (bound %d), all %v", slices.Max(perWindow), bound, perWindow))
		})
	}
}

// TestClockSkewOnset is TestClockSkewSimulated's first window: a client that
// starts sending to an idle key. A node whose clock is behind must not spend a
// whole limit on its own in the window the other nodes have already left
// (before 76321bf it did: 2,503 admitted in the first 10 s with ±5 s).
func TestClockSkewOnset(t *testing.T) {
	b := refSlack(refNodes, refRate, refSyncRate)
	for _, c := range skewCases() {
		t.Run(c.name, func(t *testing.T) {
			noLeaks(t)
			first := simulateSkew(t, c, 1)[0]
			bound := skewBound(refMax, refWindow, c.skew, b)
			t.Logf("skew %v: admitted in the first 10 s of true time: %d; bound L·(1+skew/W)+B = %d", c.skew, first, bound)
			assert.LessOrEqual(t, first, bound)
			logResult(t, "skew/onset/"+c.name, fmt.Sprintf("%d in the first window (bound %d)", first, bound))
		})
	}
}

// simulateSkew runs case c for the given number of windows and returns the
// hits admitted in each window of true time.
func simulateSkew(t *testing.T, c skewCase, windows int) []int64 {
	t.Helper()
	const base int64 = 1_700_000_000_000 // a multiple of the window
	var now atomic.Int64                 // true time, Unix ms
	now.Store(base)
	store := memory.New()
	var offsets [refNodes]atomic.Int64
	nss := make([]*ratelimit.Namespace, refNodes)
	for i := range refNodes {
		offsets[i].Store(c.offsets[i].Milliseconds())
		reg := ratelimit.NewRegistry()
		ns, err := reg.New(ratelimit.Config{
			Namespace:   "skew",
			WindowSizes: []time.Duration{refWindow},
			SyncRate:    time.Hour, // parked: the test calls Sync
			Strategy:    store,
			Clock:       func() time.Time { return time.UnixMilli(now.Load() + offsets[i].Load()) },
		})
		require.NoError(t, err)
		closeNS(t, ns)
		nss[i] = ns
	}
	ctx := context.Background()
	limit := ratelimit.Limit{Window: refWindow, Max: refMax}
	w := refWindow.Milliseconds()
	perWindow := make([]int64, windows)
	total := int64(windows) * w
	step := refSyncRate.Milliseconds()
	for ms := range total {
		now.Store(base + ms)
		if c.jumpAt > 0 && ms == c.jumpAt.Milliseconds() {
			offsets[c.jumpNode].Add(c.jump.Milliseconds())
		}
		for i, ns := range nss {
			// The node's loop fires on SyncRate boundaries of its own clock.
			if (base+ms+offsets[i].Load())%step == 0 {
				require.NoError(t, ns.Sync(ctx))
			}
			// 300 evenly spread hits per second, each node in its own phase.
			phase := int64(i) * 1000 / refNodes / refRate
			if (ms+phase)*refRate/1000 == (ms+phase-1)*refRate/1000 {
				continue
			}
			d, err := ns.Allow(ctx, "client", 1, limit)
			require.NoError(t, err)
			checkDecision(t, d)
			if d.Allowed {
				perWindow[ms/w]++
			}
		}
	}
	return perWindow
}

// TestClockSkewRedisTime runs the reference cluster in wall-clock time
// against the real Redis, each node with its own client, Store and
// redis.Clock (window time from Redis TIME): admitted hits per window stay
// within L + B. Without RATELIMIT_TEST_HEAVY the window is 1 s (limit 100)
// and the run two windows long.
//
// redis.Clock measures its offset against the process clock through an
// unexported hook, so a skewed node clock cannot be injected under it from
// here: the test shows the nodes agree on Redis time, and that the bound
// holds with the network's real sync latency.
func TestClockSkewRedisTime(t *testing.T) {
	noLeaks(t)
	addr := redisAddr(t)
	window, limitMax, windows := time.Second, int64(100), 2
	if heavy() {
		window, limitMax, windows = refWindow, int64(refMax), 2
	}
	prefix := uniquePrefix(t)
	ctx := context.Background()
	nss := make([]*ratelimit.Namespace, refNodes)
	clocks := make([]*redis.Clock, refNodes)
	for i := range refNodes {
		store, err := redis.New(newRedisClient(t, addr), redis.Options{KeyPrefix: prefix})
		require.NoError(t, err)
		clk, err := store.Clock(ctx)
		require.NoError(t, err)
		clocks[i] = clk
		reg := ratelimit.NewRegistry()
		ns, err := reg.New(ratelimit.Config{Namespace: "skew", WindowSizes: []time.Duration{window},
			SyncRate: refSyncRate, Strategy: store, Clock: clk.Now})
		require.NoError(t, err)
		closeNS(t, ns)
		nss[i] = ns
	}
	limit := ratelimit.Limit{Window: window, Max: limitMax}
	w := window.Milliseconds()
	// Start at the next window boundary, count whole windows only.
	first := clocks[0].Now().UnixMilli()/w + 1
	var mu sync.Mutex
	counts := map[int64]int64{}
	var wg sync.WaitGroup
	var failed atomic.Bool
	for i, ns := range nss {
		wg.Go(func() {
			tick := time.NewTicker(time.Second / refRate) // load generation, not a wait for logic
			defer tick.Stop()
			for range tick.C {
				at := clocks[i].Now().UnixMilli() / w
				if at >= first+int64(windows) {
					return
				}
				d, err := ns.Allow(ctx, "client", 1, limit)
				if err != nil || d.Remaining < 0 || d.RetryAfter < 0 {
					failed.Store(true)
					return
				}
				if d.Allowed && at >= first {
					mu.Lock()
					counts[at]++
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	require.False(t, failed.Load(), "an Allow failed or answered a negative figure")
	b := refSlack(refNodes, refRate, refSyncRate)
	var per []int64
	for k := first; k < first+int64(windows); k++ {
		per = append(per, counts[k])
	}
	offs := []time.Duration{clocks[0].Offset(), clocks[1].Offset(), clocks[2].Offset()}
	t.Logf("Redis TIME: window %v, limit %d: admitted per window %v; bound L+B = %d; clock offsets %v",
		window, limitMax, per, limitMax+b, offs)
	for i, n := range per {
		assert.LessOrEqual(t, n, limitMax+b, "window %d", i)
		assert.GreaterOrEqual(t, n, limitMax*9/10, "window %d: the cluster admits close to its limit", i)
	}
	logResult(t, "skew/redis-time", fmt.Sprintf("window %v limit %d: admitted %v (bound %d)", window, limitMax, per, limitMax+b))
}
