package strategytest

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit/strategy"
)

func bucketPush(t *testing.T, s strategy.Strategy, ns string, now int64, diffs []strategy.BucketDiff, reads ...strategy.BucketID) strategy.Result {
	t.Helper()
	res, err := s.PushDiffs(context.Background(), &strategy.Batch{ID: newID(t), Namespace: ns, Now: now, BucketDiffs: diffs, BucketReads: reads})
	require.NoError(t, err)
	require.Len(t, res.Buckets, len(diffs))
	require.Len(t, res.BucketReads, len(reads))
	return res
}

// runBuckets is the contract of Batch.BucketDiffs and BucketReads
// (Capabilities.Buckets).
func runBuckets(t *testing.T, newStore NewStore) {
	bid := func(key string, p time.Duration) strategy.BucketID { return strategy.BucketID{Key: key, Period: p} }
	const iv = 250.0 // ms per token: a binary fraction, so sums are exact

	t.Run("BucketsApplyAndRead", func(t *testing.T) {
		s := newStore(t)
		ns := "buckets"
		a := bid("a", sec)
		res := bucketPush(t, s, ns, base, nil, a)
		require.False(t, res.BucketReads[0].Held(), "a bucket never spent is full: no state")
		d1 := strategy.SpendDiff(a, 3, iv, base)
		res = bucketPush(t, s, ns, base, []strategy.BucketDiff{d1})
		want := strategy.ApplyBucket(strategy.BucketState{}, d1, base)
		require.Equal(t, want, res.Buckets[0])
		require.Equal(t, strategy.BucketState{TAT: float64(base) + 750, Interval: iv}, want)
		// A composite diff, as a node folds several spends and a refund.
		d2 := strategy.BucketDiff{BucketID: a, Add: 500, Floor: float64(base) + 2000, Interval: iv}
		res = bucketPush(t, s, ns, base+100, []strategy.BucketDiff{d2}, a, bid("a", time.Minute), bid("b", sec))
		want = strategy.ApplyBucket(want, d2, base+100)
		require.Equal(t, want, res.Buckets[0])
		require.Equal(t, float64(base)+2000, want.TAT, "the floor wins")
		require.Equal(t, []strategy.BucketState{want, {}, {}}, res.BucketReads, "periods and keys are separate")
		res = bucketPush(t, s, "buckets-other", base, nil, a)
		require.False(t, res.BucketReads[0].Held(), "namespaces are separate")
		res = bucketPush(t, s, ns, base, []strategy.BucketDiff{strategy.RefundDiff(a, 100, iv, base+200)})
		require.Equal(t, float64(base)+200, res.Buckets[0].TAT, "a refund never goes past full")
	})

	t.Run("BucketFirstPushKeepsTheRefill", func(t *testing.T) {
		// A node spends at base and base+100 on a bucket nobody holds and
		// pushes the two spends folded into one diff at base+900. The bucket
		// was full before the first spend, so the store must end where the
		// spends one after another leave it, not charge it the refill of
		// the 900 ms before the push.
		s := newStore(t)
		a := bid("a", sec)
		first := strategy.SpendDiff(a, 2, iv, base)
		second := strategy.SpendDiff(a, 1, iv, base+100)
		folded := strategy.BucketDiff{BucketID: a, Add: first.Add + second.Add,
			Floor: max(first.Floor+second.Add, second.Floor), Interval: iv}
		res := bucketPush(t, s, "buckets-first", base+900, []strategy.BucketDiff{folded})
		require.Equal(t, strategy.BucketState{TAT: float64(base) + 750, Interval: iv}, res.Buckets[0],
			"sequential: base -> base+500 -> max(base+500, base+100)+250")
	})

	t.Run("BucketsExactlyOnce", func(t *testing.T) {
		s := newStore(t)
		ns := "buckets-once"
		a := bid("a", sec)
		b := &strategy.Batch{ID: newID(t), Namespace: ns, Now: base, BucketDiffs: []strategy.BucketDiff{strategy.SpendDiff(a, 2, iv, base)},
			Diffs: []strategy.Diff{diff("a", sec, base, 2)}}
		for range 3 {
			res, err := s.PushDiffs(context.Background(), b)
			require.NoError(t, err)
			require.Equal(t, float64(base)+500, res.Buckets[0].TAT)
			require.Equal(t, []int64{2}, res.Totals)
		}
	})

	t.Run("BucketsKeepFractionalInstants", func(t *testing.T) {
		// TATs are fractional milliseconds: a store keeps every bit of them.
		s := newStore(t)
		ns := "buckets-fraction"
		a := bid("a", time.Minute)
		interval := 60_000.0 / 7
		var st strategy.BucketState
		now := base + 1
		for range 5 {
			d := strategy.SpendDiff(a, 1, interval, now)
			st = strategy.ApplyBucket(st, d, now)
			res := bucketPush(t, s, ns, now, []strategy.BucketDiff{d}, a)
			require.Equal(t, st, res.Buckets[0])
			require.Equal(t, st, res.BucketReads[0])
			now += 3
		}
	})

	t.Run("BucketsConvertIntervals", func(t *testing.T) {
		// A limit whose rate changed: the tokens owed stay owed.
		s := newStore(t)
		ns := "buckets-convert"
		a := bid("a", sec)
		bucketPush(t, s, ns, base, []strategy.BucketDiff{strategy.SpendDiff(a, 4, 500, base)}) // owes 4 tokens: 2,000 ms
		d := strategy.SpendDiff(a, 1, 125, base)                                               // now 8 per second
		res := bucketPush(t, s, ns, base, []strategy.BucketDiff{d})
		require.Equal(t, strategy.BucketState{TAT: float64(base) + 4*125 + 125, Interval: 125}, res.Buckets[0])
	})

	t.Run("BucketsConcurrentSpends", func(t *testing.T) {
		// Spends at one instant commute: whatever the order, the TAT moves
		// by the sum.
		s := newStore(t)
		ns := "buckets-concurrent"
		a := bid("a", sec)
		const workers, rounds = 8, 25
		var wg sync.WaitGroup
		errs := make(chan error, workers)
		for range workers {
			wg.Go(func() {
				for range rounds {
					_, err := s.PushDiffs(context.Background(), &strategy.Batch{ID: newID(t), Namespace: ns, Now: base,
						BucketDiffs: []strategy.BucketDiff{strategy.SpendDiff(a, 1, iv, base)}})
					if err != nil {
						errs <- err
						return
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err)
		}
		res := bucketPush(t, s, ns, base, nil, a)
		require.Equal(t, float64(base)+workers*rounds*iv, res.BucketReads[0].TAT)
	})

	t.Run("BucketsPurge", func(t *testing.T) {
		s := newStore(t)
		ns := "buckets-purge"
		a, b := bid("a", sec), bid("b", sec)
		bucketPush(t, s, ns, base, []strategy.BucketDiff{strategy.SpendDiff(a, 1, iv, base), strategy.SpendDiff(b, 400, iv, base)})
		// a is full at base+250 and forgettable a second and a minute later;
		// b owes 100 s.
		now := base + 250 + 1000 + strategy.BucketRetention.Milliseconds()
		require.NoError(t, s.Purge(context.Background(), now))
		res := bucketPush(t, s, ns, now, nil, a, b)
		require.Equal(t, float64(base)+100_000, res.BucketReads[1].TAT, "a bucket still owing tokens is kept")
		if res.BucketReads[0].Held() {
			require.Equal(t, float64(base)+250, res.BucketReads[0].TAT, "a store that expires buckets by TTL may keep it a while")
		}
	})
}
