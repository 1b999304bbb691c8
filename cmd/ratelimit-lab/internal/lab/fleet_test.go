package lab

import (
	"context"
	"github.com/ratesync/ratelimit/strategy/strategytest"
	"os"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestParseCPU(t *testing.T) {
	v, err := parseCPU("# CPU\r\nused_cpu_sys:1.250000\r\nused_cpu_user:2.500000\r\nused_cpu_sys_children:9.000000\r\nused_cpu_user_children:9.000000\r\nused_cpu_sys_main_thread:7.0\r\n")
	require.NoError(t, err)
	assert.InDelta(t, 3.75, v, 1e-9)
	_, err = parseCPU("# CPU\r\nused_cpu_sys:1.0\r\n")
	assert.Error(t, err)
	_, err = parseCPU("used_cpu_sys:x\r\nused_cpu_user:1\r\n")
	assert.Error(t, err)
}

// TestFleetMiniredis runs the fleet scenario at a tiny size on miniredis:
// Zipf keys, Poisson, periodic sync, every node's sync cycles recorded. The
// store's CPU cannot be measured there (miniredis has no INFO cpu), so it
// reads as -1; a real Redis gives it (docs/benchmarks.md, §8).
func TestFleetMiniredis(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	mr := miniredis.RunT(t)
	c := Config{Strategy: "redis", RedisAddr: mr.Addr(), SyncRate: 100 * time.Millisecond, Duration: time.Second, Simulated: true}
	FleetDefaults(&c, 2000, 400)
	require.Equal(t, []Limit{{Window: time.Minute, Max: 100}}, c.Limits)
	rs, err := Fleet(context.Background(), c, []int{1, 2}, nil)
	require.NoError(t, err)
	require.Len(t, rs, 2)
	for _, r := range rs {
		n := r.Config.Nodes
		require.NotNil(t, r.Sync, "nodes=%d", n)
		// One cycle per node at each 100 ms boundary before the last hit.
		assert.InDelta(t, float64(9*n), float64(r.Sync.Cycles), float64(n), "nodes=%d", n)
		assert.Zero(t, r.Sync.Errors)
		assert.Positive(t, r.Sync.P99)
		assert.GreaterOrEqual(t, r.Sync.Max, r.Sync.P99)
		assert.Equal(t, -1.0, r.Store.CPUPerSec, "miniredis has no INFO cpu")
		assert.Equal(t, "zipf", r.Config.Dist)
		assert.True(t, r.Config.Poisson)
		assert.InDelta(t, 400, float64(r.Checks), 80) // 400 hits/s for 1 s
		assert.Positive(t, r.Store.Pushes)
		assert.Less(t, r.Store.TrackedKeys, 2000*n, "most keys are idle")
		assert.Zero(t, r.Errors)
	}
	// With 1 node every key is counted in one place: never over.
	assert.Zero(t, rs[0].PrimaryAccuracy().MaxOver)
	assert.Zero(t, rs[0].PrimaryAccuracy().ExcessAdmissions)

	c.SyncRate = 0
	_, err = Fleet(context.Background(), c, []int{1}, nil)
	assert.ErrorContains(t, err, "periodic sync")
}

// TestFleetRedisCPU measures the CPU of a real Redis server over a tiny
// fleet run, at RATELIMIT_TEST_REDIS_ADDR. It checks only that the figures
// are there: on a Redis shared with other tests the CPU includes their
// clients' (the lab's own runs use a Redis of their own).
func TestFleetRedisCPU(t *testing.T) {
	addr := labRedisAddr(t)
	t.Cleanup(func() { goleak.VerifyNone(t) })
	c := Config{Strategy: "redis", RedisAddr: addr, SyncRate: 100 * time.Millisecond, Duration: time.Second}
	FleetDefaults(&c, 5000, 2000)
	rs, err := Fleet(context.Background(), c, []int{2}, nil)
	require.NoError(t, err)
	assert.Positive(t, rs[0].Store.CPUPerSec)
	assert.Positive(t, rs[0].Sync.Cycles)
}

func labRedisAddr(t *testing.T) string {
	t.Helper()
	addr := os.Getenv("RATELIMIT_TEST_REDIS_ADDR")
	if addr == "" {
		strategytest.SkipOrFail(t, "RATELIMIT_TEST_REDIS_ADDR")
	}
	return addr
}
