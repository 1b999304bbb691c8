package lab

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/ratesync/ratelimit"
)

// simConfig is a short simulated run on the memory store: 10 keys under
// 100/1s, 10 s of simulated time.
func simConfig(nodes int, load float64) Config {
	return Config{
		Nodes: nodes, SyncRate: 100 * time.Millisecond, Limits: []Limit{{Window: time.Second, Max: 100}},
		Duration: 10 * time.Second, Keys: 10, Load: load, Simulated: true,
	}
}

func run(t *testing.T, c Config) *Result {
	t.Helper()
	r, err := Run(context.Background(), c)
	require.NoError(t, err)
	require.Zero(t, r.Errors)
	require.Equal(t, c.MaxRecords != 0, r.Accuracy.Partial)
	return r
}

// TestAccuracyEvenLoad is the accuracy goal: at 90% of the limit, perfectly
// even, the sliding window must reject under 0.1% of requests; it should in
// fact reject none, on any number of nodes.
func TestAccuracyEvenLoad(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	for _, nodes := range []int{1, 4} {
		r := run(t, simConfig(nodes, 0.9))
		a := r.Accuracy.Sliding
		require.Equal(t, int64(90*10*10), a.Hits) // 90 hits/s x 10 s x 10 keys
		assert.Less(t, a.FalseRejectionRate(), 0.001, "nodes=%d", nodes)
		assert.Equal(t, a.Hits, r.Admitted, "nodes=%d: every hit fits", nodes)
	}
}

// TestAccuracyOverload checks over-admission at twice the limit against the
// bound nodes x per-node rate x SyncRate. When every node learns every
// node's hits at each boundary (two sync passes), the bound holds. With the
// core's one push-and-read per cycle, a node that syncs before the others at
// a boundary learns their hits one cycle later, so its information can be two
// periods old: the bound doubles.
func TestAccuracyOverload(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	for _, tc := range []struct{ nodes, passes int }{{2, 1}, {4, 1}, {8, 1}, {4, 2}} {
		nodes, passes := tc.nodes, tc.passes
		c := simConfig(nodes, 2)
		c.SyncPasses = passes
		r := run(t, c)
		a := View(&r.Accuracy.Sliding)
		bound := r.Accuracy.Bound
		require.InDelta(t, 20.0, bound, 1e-9) // 4 nodes x 50/s x 0.1 s, for any node count
		if passes == 2 {
			assert.LessOrEqual(t, float64(a.MaxOver), bound, "nodes=%d passes=%d", nodes, passes)
		} else {
			assert.LessOrEqual(t, float64(a.MaxOver), 2*bound, "nodes=%d passes=%d", nodes, passes)
		}
		// Over the run the cluster admits close to what an exact limiter would.
		assert.InDelta(t, 1.0, a.AdmittedRatio, 0.15, "nodes=%d passes=%d", nodes, passes)
		fixed := View(&r.Accuracy.Fixed)
		assert.LessOrEqual(t, float64(fixed.MaxOver), 2*bound, "fixed reference, nodes=%d", nodes)
	}
}

// TestAccuracyFixedMode runs fixed windows: judged against the fixed-window
// reference, the nodes stay within the doubled bound.
func TestAccuracyFixedMode(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	c := simConfig(4, 2)
	c.Fixed = true
	r := run(t, c)
	f := r.PrimaryAccuracy()
	require.Equal(t, "fixed-window", f.Reference)
	assert.LessOrEqual(t, float64(f.MaxOver), 2*r.Accuracy.Bound)
	c.Load = 0.9
	r = run(t, c)
	assert.Zero(t, r.PrimaryAccuracy().FalseRejections)
}

// TestAccuracySynchronous: writing every hit through, the nodes never exceed
// the limit in any trailing window.
func TestAccuracySynchronous(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	c := simConfig(4, 2)
	c.SyncRate = 0
	c.Duration = 5 * time.Second
	r := run(t, c)
	assert.Zero(t, r.Accuracy.Sliding.MaxOver)
	assert.Zero(t, r.Accuracy.Bound)
	assert.LessOrEqual(t, r.Admitted, r.Accuracy.Sliding.RefAdmitted)
}

// TestSimulatedIsDeterministic: the same seed gives the same decisions.
func TestSimulatedIsDeterministic(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	c := simConfig(4, 1.5)
	c.LB, c.Dist, c.Poisson, c.Duration = "random", "zipf", true, 5*time.Second
	a, b := run(t, c), run(t, c)
	assert.Equal(t, a.Checks, b.Checks)
	assert.Equal(t, a.Admitted, b.Admitted)
	assert.Equal(t, a.Accuracy.Sliding, b.Accuracy.Sliding)
	assert.Equal(t, a.NodeChecks, b.NodeChecks)
}

// TestWallClockRun drives a short unpaced run on the wall clock and checks
// the bookkeeping, not the speed.
func TestWallClockRun(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	c := Config{Nodes: 2, SyncRate: 10 * time.Millisecond, Limits: []Limit{{Window: time.Second, Max: 100}, {Window: time.Minute, Max: 1000}},
		Duration: 100 * time.Millisecond, Keys: 50, Unpaced: true, Workers: 2, MaxRecords: 1000}
	r := run(t, c)
	require.Positive(t, r.Checks)
	var sum int64
	for _, n := range r.NodeChecks {
		sum += n
	}
	assert.Equal(t, r.Checks, sum)
	assert.Equal(t, r.Checks, int64(r.Hist.Count()))
	assert.LessOrEqual(t, r.Accuracy.Recorded, int64(1000))
	assert.Positive(t, r.Store.Pushes)
}

func TestParseLimit(t *testing.T) {
	l, err := ParseLimit("100/1s")
	require.NoError(t, err)
	assert.Equal(t, Limit{Window: time.Second, Max: 100}, l)
	assert.Equal(t, "100/1s", l.String())
	for _, bad := range []string{"100", "0/1s", "x/1s", "100/0s", "100/1.5ms"} {
		_, err := ParseLimit(bad)
		assert.Error(t, err, bad)
	}
}

// TestAccuracySparseKeys spreads each key thinly: 16 nodes, SyncRate 100 ms,
// 100 per 10 s at twice the limit, so a node sees a given key about once
// every 8 cycles. A node must still decide with the cluster's total as of at
// most two cycles ago, or the bound (2B, see TestAccuracyOverload) no longer
// holds: a node that stops
// reading a key it has not used for a few cycles decides, when the key comes
// back, on a total many cycles old (with 16 nodes, each admits what it missed).
func TestAccuracySparseKeys(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	c := Config{Nodes: 16, SyncRate: 100 * time.Millisecond, Limits: []Limit{{Window: 10 * time.Second, Max: 100}},
		Duration: time.Minute, Keys: 10, Load: 2, Simulated: true}
	r := run(t, c)
	a := r.Accuracy.Sliding
	bound := r.Accuracy.Bound
	require.InDelta(t, 2.0, bound, 1e-9) // 20 hits/s x 0.1 s
	// 2B, plus one hit for the approximation's rounding (the core before
	// f88a588 gives 3; since, 23).
	assert.LessOrEqual(t, float64(a.MaxOver), 2*bound+1,
		"worst window over-admitted by %d hits (mean %.2f) against 2B+1 = %.0f: nodes decide on stale totals for keys they see rarely", a.MaxOver, a.MeanOver, 2*bound+1)
}

// TestExactAlgorithmsMatchReference: where the library is exact (one local
// node, or synchronous mode, where the store decides), its token bucket and
// sliding log give exactly the reference's decisions, under Poisson bursts
// at twice the limit. A reference that disagrees with the library's rule
// (strategy.BucketFits, the log's (now-W, now] on milliseconds) fails here.
func TestExactAlgorithmsMatchReference(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	for _, tc := range []struct {
		alg   string
		burst int64
		nodes int
		sync  time.Duration
	}{
		{"token_bucket", 0, 1, -1},
		{"gcra", 30, 1, -1},
		{"token_bucket", 30, 4, 0},
		{"sliding_log", 0, 1, -1},
		{"sliding_log", 0, 4, 0},
	} {
		c := simConfig(tc.nodes, 2)
		c.Algorithm, c.Burst, c.SyncRate, c.Poisson, c.Duration = tc.alg, tc.burst, tc.sync, true, 5*time.Second
		r := run(t, c)
		a := r.PrimaryAccuracy()
		name := fmt.Sprintf("%s burst %d, %d nodes, sync-rate %v", tc.alg, tc.burst, tc.nodes, tc.sync)
		want := "sliding-log"
		if tc.alg != "sliding_log" {
			want = "token-bucket"
		}
		require.Equal(t, want, a.Reference, name)
		require.Positive(t, a.Hits-a.Admitted, "%s: the load must make it refuse", name)
		assert.Zero(t, a.ExcessAdmissions, name)
		assert.Zero(t, a.FalseRejections, name)
		assert.Zero(t, a.MaxOver, name)
		assert.Equal(t, a.RefAdmitted, a.Admitted, name)
	}
}

// TestTokenBucketOverload: a token bucket synced every 100 ms at twice its
// rate overdraws by at most 2B tokens, like a sliding window.
func TestTokenBucketOverload(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	for _, nodes := range []int{2, 8} {
		c := simConfig(nodes, 2)
		c.Algorithm, c.Duration = "token_bucket", 5*time.Second
		r := run(t, c)
		a := View(r.Accuracy.Bucket)
		require.Equal(t, "bucket", r.Accuracy.Primary)
		assert.LessOrEqual(t, float64(a.MaxOver), 2*r.Accuracy.Bound, "nodes=%d", nodes)
		assert.InDelta(t, 1.0, a.AdmittedRatio, 0.05, "nodes=%d", nodes)
	}
}

// TestTokenBucketAsyncOneNode: one node with a periodic sync decides alone,
// so its bucket is the exact bucket: the same decisions, whatever the syncs.
// Before e62d2c6 the store started a bucket it held no state for at the
// push's instant (strategy.ApplyBucket), not at the first spend's, so the
// refill between a new bucket's first spend and its first push was lost:
// admitted/exact 0.9952 here, and every later rejection a false one.
func TestTokenBucketAsyncOneNode(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	c := simConfig(1, 2)
	c.Algorithm, c.Duration, c.Poisson = "token_bucket", 20*time.Second, true
	r := run(t, c)
	a := r.Accuracy.Bucket
	require.Positive(t, a.Hits-a.Admitted)
	assert.Zero(t, a.ExcessAdmissions)
	assert.Zero(t, a.FalseRejections)
	assert.Zero(t, a.MaxOver)
	assert.Equal(t, a.RefAdmitted, a.Admitted)
}

// TestSlidingLogPeriodicRefused: the library refuses a sliding log with a
// periodic sync, and the run says so before any traffic.
func TestSlidingLogPeriodicRefused(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	c := simConfig(2, 2)
	c.Algorithm = "sliding_log"
	_, err := Run(context.Background(), c)
	require.Error(t, err)
	assert.ErrorIs(t, err, ratelimit.ErrUnsupportedLimit)
	assert.Contains(t, err.Error(), "sliding_log limits in async mode (sync-rate 100ms) are refused by the library")
}

// TestAlgorithmConfig: names, aliases and the burst's checks.
func TestAlgorithmConfig(t *testing.T) {
	for _, tc := range []struct {
		alg   string
		fixed bool
		burst int64
		want  string
		ok    bool
	}{
		{"", false, 0, "sliding_window", true},
		{"", true, 0, "fixed_window", true},
		{"gcra", false, 5, "token_bucket", true},
		{"sliding_log", false, 0, "sliding_log", true},
		{"leaky", false, 0, "", false},
		{"sliding_window", false, 5, "", false},
		{"token_bucket", true, 0, "", false},
		{"token_bucket", false, -1, "", false},
	} {
		c := simConfig(1, 1)
		c.Algorithm, c.Fixed, c.Burst = tc.alg, tc.fixed, tc.burst
		err := c.Normalize()
		if !tc.ok {
			assert.Error(t, err, "%+v", tc)
			continue
		}
		require.NoError(t, err, "%+v", tc)
		assert.Equal(t, tc.want, c.Algorithm)
		assert.Equal(t, tc.want == "fixed_window", c.Fixed)
	}
}

// TestSimulatedLocal: local nodes (SyncRate < 0) run no sync loop, so a
// simulated run has nothing to park; it used to wait for ever on its first
// check. Each local node counts alone: with round-robin over 2 nodes, each
// admits the limit, so the pair admits twice it.
func TestSimulatedLocal(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	c := simConfig(2, 4)
	c.SyncRate, c.Duration = -1, 3*time.Second
	r := run(t, c)
	assert.Equal(t, int64(4*100*3*10), r.Checks)
	assert.InDelta(t, 2.0, View(&r.Accuracy.Sliding).AdmittedRatio, 0.1)
	assert.Equal(t, -1.0, r.Accuracy.Bound)
}
