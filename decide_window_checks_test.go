package ratelimit

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestPlainIndexAgreesWithCheckLimit: the lean path's inlined check
// (plainIndex) accepts only limits that checkLimit accepts, with the same
// window index. checkLimit defines the rules; a rule added there that
// plainIndex does not know fails here instead of being skipped on the hot
// path.
func TestPlainIndexAgreesWithCheckLimit(t *testing.T) {
	reg := NewRegistry()
	t.Cleanup(func() { _ = reg.Close(context.Background()) })
	ns, err := reg.New(Config{WindowSizes: []time.Duration{time.Second, time.Minute, time.Hour}, SyncRate: -1})
	require.NoError(t, err)
	rng := rand.New(rand.NewPCG(3, 4))
	windows := []time.Duration{time.Second, time.Minute, time.Hour, 10 * time.Second, 0, -time.Second}
	maxes := []int64{-1, 0, 1, 5, MaxValue - 1, MaxValue, MaxValue + 1}
	accepted, refused := 0, 0
	for n := range 200_000 {
		l := Limit{
			Window:    windows[rng.IntN(len(windows))],
			Max:       maxes[rng.IntN(len(maxes))],
			Algorithm: Algorithm(rng.IntN(int(SlidingLog) + 2)), // one past the last: unknown
			Fixed:     rng.IntN(4) == 0,
			Penalty:   rng.IntN(4) == 0,
		}
		if rng.IntN(2) == 0 {
			l.Algorithm = SlidingWindow // the limit plainIndex takes, half the time
		}
		if rng.IntN(3) == 0 {
			l.Burst = rng.Int64N(3) - 1
		}
		if rng.IntN(2) == 0 {
			l.Max = 1 + rng.Int64N(10)
		}
		cost := rng.Int64N(12) - 1
		i := ns.plainIndex(cost, &l)
		if i < 0 {
			refused++
			continue // checkLimit decides, whatever it says
		}
		accepted++
		want, err := ns.checkLimit(cost, &l)
		require.NoError(t, err, "case %d: plainIndex took %+v cost %d", n, l, cost)
		require.Equal(t, want, i, "case %d: %+v", n, l)
	}
	require.Greater(t, accepted, 10_000)
	require.Greater(t, refused, 10_000)
}

// TestCallValidMatchesCheckCall: the lean path's inlined argument check
// (callValid) says what checkCall says, for one or two limits.
func TestCallValidMatchesCheckCall(t *testing.T) {
	for _, ctx := range []context.Context{nil, context.Background()} {
		for _, key := range []string{"", "k"} {
			for _, cost := range []int64{-1, 0, 1} {
				for _, n := range []int{1, 2} {
					require.Equal(t, checkCall(ctx, key, cost, n) == nil, callValid(ctx, key, cost),
						"ctx %v key %q cost %d limits %d", ctx, key, cost, n)
				}
			}
		}
	}
}
