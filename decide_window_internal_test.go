package ratelimit

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestDecideWindowsMatchesGeneralPath: the lean window path gives the general
// path's answers (decision, stored key, window index, errors) on two
// namespaces fed the same random calls: one or two limits (sliding and fixed,
// of one size or two, of one table or two), costs (0, over Max, negative),
// peeks and allows, refunds, clock gaps, unknown windows and keys longer
// than MaxKeyLength.
func TestDecideWindowsMatchesGeneralPath(t *testing.T) {
	ctx := context.Background()
	var now time.Time
	clock := func() time.Time { return now }
	sizes := []time.Duration{time.Second, time.Minute, 10 * time.Second} // two tables
	newNS := func() *Namespace {
		reg := NewRegistry()
		t.Cleanup(func() { _ = reg.Close(ctx) })
		ns, err := reg.New(Config{WindowSizes: sizes, SyncRate: -1, Clock: clock, MaxKeyLength: 64})
		require.NoError(t, err)
		return ns
	}
	fast, general := newNS(), newNS()
	rng := rand.New(rand.NewPCG(9, 10))
	now = time.UnixMilli(1_700_000_000_000)
	keys := []string{"a", "b", "c", "a-key-longer-than-sixty-four-bytes-so-that-the-namespace-stores-its-hash-instead"}
	limit := func() Limit {
		l := Limit{Window: sizes[rng.IntN(len(sizes))], Max: 1 + rng.Int64N(12)}
		if rng.IntN(3) == 0 {
			l.Algorithm = FixedWindow
		}
		if rng.IntN(60) == 0 {
			l.Window = time.Hour // unknown to the namespaces
		}
		if rng.IntN(80) == 0 {
			l.Max = 0 // invalid
		}
		return l
	}
	var lean int
	for n := range 200_000 {
		now = now.Add(time.Duration(rng.Int64N(300)) * time.Millisecond)
		limits := []Limit{limit()}
		if rng.IntN(2) == 0 {
			limits = append(limits, limit())
		}
		key := keys[rng.IntN(len(keys))]
		cost := rng.Int64N(6) - 1
		count := rng.IntN(4) != 0
		if rng.IntN(10) == 0 {
			_ = fast.Refund(ctx, key, max(cost, 0), limits...)
			_ = general.Refund(ctx, key, max(cost, 0), limits...)
			continue
		}
		require.True(t, fast.leanWindows(limits), "call %d", n)
		var gotD, wantD Decision
		gotKey, gotIdx, gotErr := fast.decideWindows(ctx, &gotD, key, cost, limits, count && cost > 0)
		wantKey, wantIdx, wantErr := general.decideAny(ctx, &wantD, key, cost, limits, count && cost > 0)
		if wantErr != nil {
			require.EqualError(t, gotErr, wantErr.Error(), "call %d", n)
			continue
		}
		require.NoError(t, gotErr, "call %d", n)
		require.Equal(t, wantD, gotD, "call %d: %+v cost %d count %v", n, limits, cost, count)
		require.Equal(t, wantKey, gotKey)
		require.Equal(t, wantIdx, gotIdx)
		if !wantD.Allowed {
			lean++
		}
	}
	require.Greater(t, lean, 10_000, "rejections exercised")
}

// TestLeanWindowsTakesOnlyItsCalls: penalties, other algorithms, three
// limits, synchronous mode and cold reads keep the general path.
func TestLeanWindowsTakesOnlyItsCalls(t *testing.T) {
	ctx := context.Background()
	reg := NewRegistry()
	t.Cleanup(func() { _ = reg.Close(ctx) })
	ns, err := reg.New(Config{WindowSizes: []time.Duration{time.Second}, SyncRate: -1})
	require.NoError(t, err)
	w := Limit{Window: time.Second, Max: 5}
	require.True(t, ns.leanWindows([]Limit{w}))
	require.True(t, ns.leanWindows([]Limit{w, w}))
	require.False(t, ns.leanWindows(nil))
	require.False(t, ns.leanWindows([]Limit{w, w, w}))
	require.False(t, ns.leanWindows([]Limit{w, {Window: time.Second, Max: 5, Penalty: true}}))
	require.False(t, ns.leanWindows([]Limit{{Window: time.Second, Max: 5, Algorithm: TokenBucket}}))
	require.False(t, ns.leanWindows([]Limit{{Window: time.Second, Max: 5, Algorithm: SlidingLog}}))
	require.False(t, ns.leanWindows([]Limit{{Window: time.Second, Max: 5, Algorithm: Algorithm(99)}}))
	mode := ns.mode
	ns.mode = modeSync
	defer func() { ns.mode = mode }() // Close would flush a synchronous namespace
	require.False(t, ns.leanWindows([]Limit{w}))
}
