package strategytest

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit/strategy"
)

func take(t *testing.T, s strategy.Strategy, tk *strategy.Take) strategy.TakeResult {
	t.Helper()
	if tk.ID == "" && !tk.Peek {
		tk.ID = newID(t)
	}
	res, err := s.(strategy.Taker).Take(context.Background(), tk)
	require.NoError(t, err)
	require.Len(t, res.Buckets, len(tk.Buckets))
	require.Len(t, res.Logs, len(tk.Logs))
	return res
}

// runTake is the contract of Taker (Capabilities.Take).
func runTake(t *testing.T, newStore NewStore) {
	bucket := func(burst int64, interval float64) []strategy.TakeBucket {
		return []strategy.TakeBucket{{Period: sec, Interval: interval, Burst: burst}}
	}
	logOf := func(max int64, window time.Duration) []strategy.TakeLog {
		return []strategy.TakeLog{{Window: window, Max: max}}
	}

	t.Run("TakeBucketUntilEmpty", func(t *testing.T) {
		s := newStore(t)
		ns := "take-bucket"
		for i := range 3 {
			res := take(t, s, &strategy.Take{Namespace: ns, Key: "k", Now: base, Cost: 1, Buckets: bucket(3, 1000)})
			require.True(t, res.Allowed, "take %d", i)
			require.Equal(t, strategy.BucketState{TAT: float64(base) + float64(i+1)*1000, Interval: 1000}, res.Buckets[0])
		}
		res := take(t, s, &strategy.Take{Namespace: ns, Key: "k", Now: base + 999, Cost: 1, Buckets: bucket(3, 1000)})
		require.False(t, res.Allowed)
		require.Equal(t, float64(base)+3000, res.Buckets[0].TAT, "a rejection spends nothing")
		res = take(t, s, &strategy.Take{Namespace: ns, Key: "k", Now: base + 1000, Cost: 1, Buckets: bucket(3, 1000)})
		require.True(t, res.Allowed, "one token back after one interval")
		res = take(t, s, &strategy.Take{Namespace: ns, Key: "k", Now: base + 10_000, Cost: 3, Buckets: bucket(3, 1000)})
		require.True(t, res.Allowed, "full again: the whole burst at once")
		require.Equal(t, float64(base)+13_000, res.Buckets[0].TAT)
		res = take(t, s, &strategy.Take{Namespace: ns, Key: "other", Now: base, Cost: 3, Buckets: bucket(3, 1000)})
		require.True(t, res.Allowed, "keys are separate")
	})

	t.Run("TakeFullBucketAdmitsItsWholeBurst", func(t *testing.T) {
		// A full bucket admits a request of its whole burst, whatever the
		// rounding of a TAT of 1.7e12 ms: the fit compares the time the
		// bucket owes, max(tat - now, 0), with (burst - cost) × interval
		// (strategy.BucketFits), never now + cost × interval with now.
		s := newStore(t)
		ns := "take-full-burst"
		b := []strategy.TakeBucket{{Period: time.Minute, Interval: 60_000.0 / 7, Burst: 7}}
		now := base + 123
		res := take(t, s, &strategy.Take{Namespace: ns, Key: "fresh", Now: now, Cost: 7, Buckets: b})
		require.True(t, res.Allowed, "a bucket with no state is full")
		res = take(t, s, &strategy.Take{Namespace: ns, Key: "held", Now: now, Cost: 1, Buckets: b})
		require.True(t, res.Allowed)
		res = take(t, s, &strategy.Take{Namespace: ns, Key: "held", Now: now + 3_600_000, Cost: 7, Buckets: b})
		require.True(t, res.Allowed, "a bucket full again an hour later")
		res = take(t, s, &strategy.Take{Namespace: ns, Key: "held", Now: now + 3_600_000, Cost: 1, Peek: true, Buckets: b})
		require.False(t, res.Allowed, "and empty after it")
	})

	t.Run("TakeLogUntilFull", func(t *testing.T) {
		s := newStore(t)
		ns := "take-log"
		for i, at := range []int64{base, base + 300} {
			res := take(t, s, &strategy.Take{Namespace: ns, Key: "k", Now: at, Cost: 1, Logs: logOf(2, sec)})
			require.True(t, res.Allowed, "take %d", i)
		}
		res := take(t, s, &strategy.Take{Namespace: ns, Key: "k", Now: base + 500, Cost: 1, Logs: logOf(2, sec)})
		require.False(t, res.Allowed)
		require.Equal(t, strategy.LogState{Count: 2, Fits: base + 1000, Empty: base + 1300}, res.Logs[0])
		res = take(t, s, &strategy.Take{Namespace: ns, Key: "k", Now: base + 999, Cost: 1, Logs: logOf(2, sec)})
		require.False(t, res.Allowed, "the entry at base is in the window until base+1000")
		res = take(t, s, &strategy.Take{Namespace: ns, Key: "k", Now: base + 1000, Cost: 1, Logs: logOf(2, sec)})
		require.True(t, res.Allowed)
		require.Equal(t, strategy.LogState{Count: 2, Fits: base + 1300, Empty: base + 2000}, res.Logs[0])
		res = take(t, s, &strategy.Take{Namespace: ns, Key: "k", Now: base + 1000, Cost: 2, Peek: true, Logs: logOf(2, sec)})
		require.False(t, res.Allowed)
		require.Equal(t, base+2000, res.Logs[0].Fits, "a cost of 2 waits for both entries to leave")
	})

	t.Run("TakeIsAtomicOverLimits", func(t *testing.T) {
		s := newStore(t)
		ns := "take-atomic"
		take(t, s, &strategy.Take{Namespace: ns, Key: "k", Now: base, Cost: 2, Logs: logOf(2, sec)})
		res := take(t, s, &strategy.Take{Namespace: ns, Key: "k", Now: base, Cost: 1, Buckets: bucket(5, 100), Logs: logOf(2, sec)})
		require.False(t, res.Allowed)
		require.False(t, res.Buckets[0].Held(), "the bucket admitted, the log did not: nothing spent")
		require.Equal(t, int64(2), res.Logs[0].Count)
	})

	t.Run("TakeExactlyOnce", func(t *testing.T) {
		s := newStore(t)
		ns := "take-once"
		tk := &strategy.Take{ID: newID(t), Namespace: ns, Key: "k", Now: base, Cost: 2, Buckets: bucket(3, 1000), Logs: logOf(3, sec)}
		for range 3 {
			res := take(t, s, tk)
			require.True(t, res.Allowed, "a re-sent take repeats its decision")
			require.Equal(t, float64(base)+2000, res.Buckets[0].TAT)
			require.Equal(t, int64(2), res.Logs[0].Count)
		}
		res := take(t, s, &strategy.Take{Namespace: ns, Key: "k", Now: base, Cost: 2, Buckets: bucket(3, 1000), Logs: logOf(3, sec)})
		require.False(t, res.Allowed, "a new ID decides anew")
		res = take(t, s, tk)
		require.True(t, res.Allowed, "the first decision stands, whatever the state now")
		require.Equal(t, float64(base)+2000, res.Buckets[0].TAT)
	})

	t.Run("TakePeekSpendsNothing", func(t *testing.T) {
		s := newStore(t)
		ns := "take-peek"
		for range 3 {
			res := take(t, s, &strategy.Take{Namespace: ns, Key: "k", Now: base, Cost: 1, Peek: true, Buckets: bucket(1, 1000), Logs: logOf(1, sec)})
			require.True(t, res.Allowed)
			require.False(t, res.Buckets[0].Held())
			require.Zero(t, res.Logs[0].Count)
		}
	})

	t.Run("TakePenalty", func(t *testing.T) {
		s := newStore(t)
		ns := "take-penalty"
		bs := []strategy.TakeBucket{{Period: sec, Interval: 1000, Burst: 1, Penalty: true}, {Period: time.Minute, Interval: 100, Burst: 10}}
		res := take(t, s, &strategy.Take{Namespace: ns, Key: "k", Now: base, Cost: 1, Buckets: bs})
		require.True(t, res.Allowed)
		res = take(t, s, &strategy.Take{Namespace: ns, Key: "k", Now: base, Cost: 1, Buckets: bs})
		require.False(t, res.Allowed)
		require.Equal(t, float64(base)+2000, res.Buckets[0].TAT, "a penalty spends on rejection")
		require.Equal(t, float64(base)+100, res.Buckets[1].TAT, "a limit without one does not")
	})

	t.Run("TakeAnswered", func(t *testing.T) {
		s := newStore(t)
		ns := "take-answered"
		bs := bucket(1, 1000)
		// Never decided by the store: it applies the node's answer.
		res := take(t, s, &strategy.Take{Namespace: ns, Key: "a", Now: base, Cost: 1, Answered: strategy.AnsweredAdmitted, Buckets: bs})
		require.True(t, res.Allowed)
		require.Equal(t, float64(base)+1000, res.Buckets[0].TAT)
		// Rejected by the store, admitted by the node: spent once.
		tk := &strategy.Take{ID: newID(t), Namespace: ns, Key: "a", Now: base, Cost: 1, Buckets: bs}
		require.False(t, take(t, s, tk).Allowed)
		tk.Answered = strategy.AnsweredAdmitted
		for range 2 {
			res = take(t, s, tk)
			require.True(t, res.Allowed)
			require.Equal(t, float64(base)+2000, res.Buckets[0].TAT)
		}
		// Admitted by the store, rejected by the node: taken back once.
		tk = &strategy.Take{ID: newID(t), Namespace: ns, Key: "b", Now: base, Cost: 1, Buckets: bs, Logs: logOf(5, sec)}
		require.True(t, take(t, s, tk).Allowed)
		tk.Answered = strategy.AnsweredRejected
		for range 2 {
			res = take(t, s, tk)
			require.False(t, res.Allowed)
			require.Equal(t, float64(base), res.Buckets[0].TAT)
			require.Zero(t, res.Logs[0].Count)
		}
	})

	t.Run("TakeRefund", func(t *testing.T) {
		s := newStore(t)
		ns := "take-refund"
		take(t, s, &strategy.Take{Namespace: ns, Key: "k", Now: base, Cost: 3, Buckets: bucket(5, 1000), Logs: logOf(5, sec)})
		take(t, s, &strategy.Take{Namespace: ns, Key: "k", Now: base + 10, Cost: 2, Buckets: bucket(5, 1000), Logs: logOf(5, sec)})
		tk := &strategy.Take{ID: newID(t), Namespace: ns, Key: "k", Now: base + 20, Cost: 3, Refund: true, Buckets: bucket(5, 1000), Logs: logOf(5, sec)}
		for range 2 {
			res := take(t, s, tk)
			require.True(t, res.Allowed)
			require.Equal(t, float64(base)+2000, res.Buckets[0].TAT, "3 of 5 tokens back, once")
			require.Equal(t, int64(2), res.Logs[0].Count)
			require.Equal(t, base+1000, res.Logs[0].Empty, "the newest entries give their cost back first")
		}
	})

	t.Run("TakeConcurrentIsExact", func(t *testing.T) {
		s := newStore(t)
		ns := "take-concurrent"
		const workers, rounds = 8, 25
		var admitted atomic.Int64
		var wg sync.WaitGroup
		errs := make(chan error, workers)
		for range workers {
			wg.Go(func() {
				for range rounds {
					res, err := s.(strategy.Taker).Take(context.Background(), &strategy.Take{ID: newID(t), Namespace: ns, Key: "k", Now: base, Cost: 1,
						Buckets: []strategy.TakeBucket{{Period: sec, Interval: 1e9, Burst: 60}}, Logs: logOf(50, time.Hour)})
					if err != nil {
						errs <- err
						return
					}
					if res.Allowed {
						admitted.Add(1)
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err)
		}
		require.Equal(t, int64(50), admitted.Load())
	})

	t.Run("TakeInvalidIsNotApplied", func(t *testing.T) {
		s := newStore(t)
		for _, tk := range []*strategy.Take{
			{Cost: -1, Buckets: bucket(1, 1)},
			{Cost: 1, Buckets: bucket(0, 1)},
			{Cost: 1, Buckets: bucket(1, 0)},
			{Cost: 1, Logs: logOf(0, sec)},
			{Cost: 1, Logs: logOf(1, 0)},
		} {
			tk.ID, tk.Namespace, tk.Key, tk.Now = newID(t), "take-invalid", "k", base
			_, err := s.(strategy.Taker).Take(context.Background(), tk)
			require.Error(t, err, "%+v", tk)
			require.True(t, errors.Is(err, strategy.ErrNotApplied), "%v", err)
		}
	})
}
