package shm

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit/strategy"
)

// TestBucketsModel runs random spends, refunds, peeks and rate changes on
// short and long keys against a map of TATs, with and without Track, in
// tables small enough to evict: every bucket the table still holds has the
// model's TAT, none is found twice or lost from its probe chain by the
// removals, and the table stays within its cap.
func TestBucketsModel(t *testing.T) {
	for _, track := range []bool{false, true} {
		t.Run(fmt.Sprintf("track=%v", track), func(t *testing.T) {
			const maxKeys = 300
			b, err := NewBuckets(BucketOptions{Period: time.Second, MaxKeys: maxKeys, Track: track})
			require.NoError(t, err)
			rng := rand.New(rand.NewPCG(11, 12))
			keys := make([]string, 700)
			for i := range keys {
				keys[i] = fmt.Sprintf("k%d", i)
				if i%3 == 0 { // past the inline bytes
					keys[i] = fmt.Sprintf("a-key-longer-than-a-bucket-holds-inline-%d", i)
				}
			}
			model := map[string]float64{} // key -> TAT at interval
			intervals := map[string]float64{}
			now := int64(1_700_000_000_000)
			for step := range 60_000 {
				now += rng.Int64N(5)
				key := keys[rng.IntN(len(keys))]
				if b.lookup(key) == nil {
					delete(model, key) // evicted, or never held: a full bucket
					delete(intervals, key)
				}
				tat, ok := model[key]
				if !ok {
					tat = math.Inf(-1)
				}
				interval := []float64{1, 2.5, 10}[rng.IntN(3)]
				if iv, ok := intervals[key]; ok && iv != interval {
					tat = strategy.ConvertTAT(tat, iv, interval, now)
				}
				burst, cost := 1+rng.Int64N(20), rng.Int64N(4)
				switch rng.IntN(4) {
				case 0:
					b.Refund(key, now, interval, cost)
					tat = math.Max(tat-float64(cost)*interval, float64(now))
				default:
					mode := TryMode(rng.IntN(3))
					got, fits, spent := b.Try(key, now, interval, burst, cost, mode)
					require.Equal(t, tat, got, "step %d key %s", step, key)
					want := strategy.BucketFits(strategy.BucketState{TAT: tat, Interval: interval}, interval, burst, cost, now)
					require.Equal(t, want, fits, "step %d", step)
					require.Equal(t, mode == SpendAlways || (mode == SpendIfFits && fits), spent)
					if spent {
						tat = math.Max(tat+float64(cost)*interval, float64(now)+float64(cost)*interval)
					}
				}
				model[key], intervals[key] = tat, interval
				if step%1000 == 0 {
					require.LessOrEqual(t, b.Len(), maxKeys)
					held := 0
					for k, want := range model {
						if got, ok := b.View(k, now, intervals[k]); ok {
							require.Equal(t, want, got, "key %s", k)
							held++
						}
					}
					require.Equal(t, b.Len(), held, "every bucket held is found by its key")
				}
			}
			require.Positive(t, b.Evictions())
		})
	}
}

func TestBucketKeys(t *testing.T) {
	b, err := NewBuckets(BucketOptions{Period: time.Second})
	require.NoError(t, err)
	long := "a-key-longer-than-twenty-four-bytes"
	for _, k := range []string{"", "x", "exactly-24-bytes-long-ok", long} {
		b.Try(k, 0, 1, 1, 1, SpendIfFits)
		require.True(t, b.Holds(k), k)
		bk := b.lookup(k)
		require.Equal(t, k, bk.key())
	}
	require.False(t, b.Holds(long[:len(long)-1]))
	require.False(t, b.Holds("exactly-24-bytes-long-o"))
	require.Equal(t, 4, b.Len())
}

// TestBucketsLocalPendingAndLearn: a table without Track has nothing to push
// and no store state to learn, whatever its keys (inline or long): Pending
// is 0 and leaves every bucket usable, and Learn changes no bucket.
func TestBucketsLocalPendingAndLearn(t *testing.T) {
	b, err := NewBuckets(BucketOptions{Period: time.Second})
	require.NoError(t, err)
	keys := []string{"short", "a-key-longer-than-twenty-four-bytes"}
	for _, k := range keys {
		b.Try(k, 1000, 10, 5, 2, SpendIfFits)
	}
	require.Zero(t, b.Pending())
	for _, k := range keys {
		b.Learn(k, 1000, strategy.BucketState{TAT: 1e9, Interval: 10}, false)
		tat, ok := b.View(k, 1000, 10) // takes the bucket's lock again
		require.True(t, ok)
		require.Equal(t, float64(1020), tat, k)
	}
}
