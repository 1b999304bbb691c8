package ratelimit

import (
	"context"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestDecideBucketMatchesGeneralPath: the single-bucket path gives the
// general path's answers (decision, stored key, window index, errors) on two
// namespaces, local or periodic with cold reads (and cold keys with state in
// the store), fed the same random calls: costs (0, over the burst, negative),
// peeks and allows, penalties, refunds, clock gaps, and keys longer than MaxKeyLength.
func TestDecideBucketMatchesGeneralPath(t *testing.T) {
	for _, periodic := range []bool{false, true} {
		t.Run(map[bool]string{false: "local", true: "periodic"}[periodic], func(t *testing.T) {
			testDecideBucketMatches(t, periodic)
		})
	}
}

func testDecideBucketMatches(t *testing.T, periodic bool) {
	ctx := context.Background()
	var now time.Time
	var clk atomic.Int64 // now, for the namespaces' loops too
	clock := func() time.Time { return time.Unix(0, clk.Load()) }
	sizes := []time.Duration{time.Second, time.Minute}
	pair := newLeanPair(t, periodic, clock, sizes...)
	fast, general := pair.fast, pair.general
	rng := rand.New(rand.NewPCG(7, 8))
	now = time.UnixMilli(1_700_000_000_000)
	clk.Store(now.UnixNano())
	keys := leanTestKeys()
	for n := range 200_000 {
		now = now.Add(time.Duration(rng.Int64N(40)) * time.Millisecond)
		clk.Store(now.UnixNano())
		l := Limit{Algorithm: TokenBucket, Window: []time.Duration{time.Second, time.Minute}[rng.IntN(2)],
			Max: 1 + rng.Int64N(20), Burst: rng.Int64N(30), Penalty: rng.IntN(5) == 0}
		if rng.IntN(50) == 0 {
			l.Window = time.Hour // unknown to the namespaces
		}
		key := keys[min(rng.IntN(2*len(keys)), rng.IntN(len(keys)))] // a few keys often, many rarely
		if rng.IntN(50) == 0 && l.Window != time.Hour {
			key = pair.coldKey(t, func(seeder *Namespace, key string) {
				_, err := seeder.Allow(ctx, key, 1+rng.Int64N(5), Limit{Algorithm: TokenBucket, Window: l.Window, Max: l.Max, Burst: 30})
				require.NoError(t, err)
			})
		}
		cost := rng.Int64N(8) - 1
		count := rng.IntN(4) != 0
		limits := []Limit{l}
		if rng.IntN(10) == 0 {
			_ = fast.Refund(ctx, key, max(cost, 0), l)
			_ = general.Refund(ctx, key, max(cost, 0), l)
			continue
		}
		var gotD, wantD Decision
		gotKey, gotIdx, gotErr := fast.decideBucket(ctx, &gotD, key, cost, limits, count && cost > 0)
		wantKey, wantIdx, wantErr := general.decideAny(ctx, &wantD, key, cost, limits, count && cost > 0)
		if wantErr != nil {
			require.EqualError(t, gotErr, wantErr.Error(), "call %d", n)
			continue
		}
		require.NoError(t, gotErr, "call %d", n)
		require.Equal(t, wantD, gotD, "call %d: %+v cost %d count %v", n, l, cost, count)
		require.Equal(t, wantKey, gotKey)
		require.Equal(t, wantIdx, gotIdx)
	}
}
