package ratelimit

import (
	"math/rand/v2"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
)

// The space-saving summary against exact counts on skewed random streams:
// every count bounds the true count from above, count-err from below, and
// every key whose true count exceeds the stream length / capacity is held.
func TestSpaceSavingGuarantees(t *testing.T) {
	for seed := range uint64(20) {
		rng := rand.New(rand.NewPCG(seed, 7))
		zipf := rand.NewZipf(rng, 1.2, 1, 5000)
		capacity := 8 + int(seed)*3
		var s spaceSaving
		s.init(capacity)
		exact := map[string]int64{}
		n := 2000 + rng.IntN(20000)
		for range n {
			k := strconv.FormatUint(zipf.Uint64(), 10)
			exact[k]++
			s.add(k)
		}
		require.LessOrEqual(t, len(s.items), capacity)
		held := map[string]ssItem{}
		for _, it := range s.items {
			held[it.key] = it
			require.GreaterOrEqual(t, it.count, exact[it.key], "seed %d key %s", seed, it.key)
			require.LessOrEqual(t, it.count-it.err, exact[it.key], "seed %d key %s", seed, it.key)
		}
		for k, c := range exact {
			if c > int64(n/capacity) {
				require.Contains(t, held, k, "seed %d: key %s with %d of %d", seed, k, c, n)
			}
		}
	}
}
