package redis

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit/internal/faultproxy"
	"github.com/ratesync/ratelimit/strategy"
)

// defaultRetriesClient is a client through addr with go-redis's default
// MaxRetries (3): its retries re-send a script whose reply was lost, which
// is what the lost-reply tests are about.
func defaultRetriesClient(t *testing.T, addr string) *goredis.Client {
	t.Helper()
	c := goredis.NewClient(&goredis.Options{
		Addr:                  addr,
		DialTimeout:           testDialTimeout,
		ReadTimeout:           testReadTimeout,
		WriteTimeout:          testWriteTimeout,
		PoolTimeout:           testPoolTimeout,
		ContextTimeoutEnabled: true,
	})
	t.Cleanup(func() { _ = c.Close() })
	require.Equal(t, 3, c.Options().MaxRetries)
	return c
}

// untilApplied calls op until it succeeds, as the core re-sends a request
// whose outcome is unknown (same ID), and returns how many calls failed.
func untilApplied(t *testing.T, op func() error) int {
	t.Helper()
	for failed := 0; ; failed++ {
		require.Less(t, failed, 100, "never applied")
		if err := op(); err == nil {
			return failed
		}
	}
}

// Takes through a proxy that loses about half of the script replies after
// Redis ran the scripts, with go-redis's default retries: every Take is
// applied once, and a re-sent Take answers its first decision. Without an
// ID (no record) the same run spends twice, which shows the test can fail.
func TestLostRepliesTake(t *testing.T) {
	noLeaks(t)
	target := realAddr(t)
	run := func(t *testing.T, withIDs bool) (takes int, tat float64, count int64) {
		rng := rand.New(rand.NewPCG(3, 4))
		proxy, _ := newScriptDropper(t, target, func() bool { return rng.IntN(2) == 0 })
		s := newStore(t, defaultRetriesClient(t, proxy.Addr()), Options{Shards: 4})
		ctx := context.Background()
		limits := func(tk *strategy.Take) {
			tk.Buckets = []strategy.TakeBucket{{Period: time.Second, Interval: 1000, Burst: 1 << 40}}
			tk.Logs = []strategy.TakeLog{{Window: time.Hour, Max: 1 << 40}}
		}
		failed := 0
		for takes = 0; proxy.Cuts() < 60; takes++ {
			require.Less(t, takes, 600, "too few replies lost")
			tk := &strategy.Take{Namespace: "lost-take", Key: "k", Now: base, Cost: 1}
			if withIDs {
				tk.ID = fmt.Sprintf("take-%s-%d", s.opts.KeyPrefix, takes)
			}
			limits(tk)
			failed += untilApplied(t, func() error {
				res, err := s.Take(ctx, tk)
				if err == nil && withIDs {
					require.True(t, res.Allowed)
					require.Equal(t, float64(base)+float64(takes+1)*1000, res.Buckets[0].TAT, "take %d answers its own decision's state", takes)
					require.Equal(t, int64(takes+1), res.Logs[0].Count)
				}
				return err
			})
		}
		direct := newStore(t, realClient(t), s.opts)
		peek := &strategy.Take{Namespace: "lost-take", Key: "k", Now: base, Cost: 1, Peek: true}
		limits(peek)
		res, err := direct.Take(ctx, peek)
		require.NoError(t, err)
		t.Logf("ids=%v: %d takes, %d replies lost, %d takes failed after the client's retries", withIDs, takes, proxy.Cuts(), failed)
		return takes, res.Buckets[0].TAT, res.Logs[0].Count
	}
	t.Run("ExactlyOnce", func(t *testing.T) {
		takes, tat, count := run(t, true)
		require.Equal(t, float64(base)+float64(takes)*1000, tat)
		require.Equal(t, int64(takes), count)
	})
	t.Run("WithoutIDsItSpendsTwice", func(t *testing.T) {
		takes, tat, count := run(t, false)
		require.Greater(t, tat, float64(base)+float64(takes)*1000)
		require.Greater(t, count, int64(takes))
	})
}

// Bucket diffs pushed through the same proxy: each batch's spends are
// applied once (the batch-part ids), and without them twice.
func TestLostRepliesBuckets(t *testing.T) {
	noLeaks(t)
	target := realAddr(t)
	run := func(t *testing.T, idempotent bool) (want, got map[string]float64) {
		rng := rand.New(rand.NewPCG(5, 6))
		proxy, _ := newScriptDropper(t, target, func() bool { return rng.IntN(2) == 0 })
		s := newStore(t, defaultRetriesClient(t, proxy.Addr()), Options{Shards: 4})
		s.noIdempotent = !idempotent
		ctx := context.Background()
		keys := []string{"a", "b", "c", "d", "e"}
		want = map[string]float64{}
		for _, k := range keys {
			want[k] = float64(base)
		}
		for i := 0; proxy.Cuts() < 60; i++ {
			require.Less(t, i, 600, "too few replies lost")
			b := &strategy.Batch{ID: fmt.Sprintf("lost-bucket-%s-%d", s.opts.KeyPrefix, i), Namespace: "lost-bucket", Now: base}
			for _, k := range keys {
				if rng.IntN(2) == 0 {
					cost := int64(1 + rng.IntN(3))
					b.BucketDiffs = append(b.BucketDiffs, strategy.SpendDiff(strategy.BucketID{Key: k, Period: time.Second}, cost, 250, base))
					want[k] += float64(cost) * 250
				}
			}
			untilApplied(t, func() error { _, err := s.PushDiffs(ctx, b); return err })
		}
		direct := newStore(t, realClient(t), s.opts)
		read := &strategy.Batch{ID: "read", Namespace: "lost-bucket", Now: base}
		for _, k := range keys {
			read.BucketReads = append(read.BucketReads, strategy.BucketID{Key: k, Period: time.Second})
		}
		res, err := direct.PushDiffs(ctx, read)
		require.NoError(t, err)
		got = map[string]float64{}
		for i, k := range keys {
			got[k] = res.BucketReads[i].TAT
		}
		t.Logf("idempotent=%v: %d replies lost", idempotent, proxy.Cuts())
		return want, got
	}
	t.Run("ExactlyOnce", func(t *testing.T) {
		want, got := run(t, true)
		require.Equal(t, want, got)
	})
	t.Run("WithoutIdempotencyItSpendsTwice", func(t *testing.T) {
		want, got := run(t, false)
		require.NotEqual(t, want, got)
	})
}

// A node whose push (with a watch) loses its reply keeps its cursor and
// re-sends the batch: it loses none of the changes other nodes made
// meanwhile, and its view ends equal to the store's totals.
func TestLostWatchAnswers(t *testing.T) {
	noLeaks(t)
	target := realAddr(t)
	rng := rand.New(rand.NewPCG(7, 8))
	proxy, _ := newScriptDropper(t, target, func() bool { return rng.IntN(2) == 0 })
	s := newStore(t, defaultRetriesClient(t, proxy.Addr()), Options{Shards: 4})
	other := newStore(t, realClient(t), s.opts)
	ctx := context.Background()
	ns := "lost-watch"
	key := func() string { return fmt.Sprintf("k%d", rng.IntN(30)) }
	view := map[string]int64{}
	w := strategy.Watch{Size: time.Minute, Start: base, Limit: 1000}
	for i := 0; proxy.Cuts() < 60; i++ {
		require.Less(t, i, 600, "too few replies lost")
		_, err := other.PushDiffs(ctx, &strategy.Batch{ID: fmt.Sprintf("o-%s-%d", s.opts.KeyPrefix, i), Namespace: ns,
			Diffs: []strategy.Diff{diff(key(), time.Minute, base, 1)}})
		require.NoError(t, err)
		b := &strategy.Batch{ID: fmt.Sprintf("w-%s-%d", s.opts.KeyPrefix, i), Namespace: ns, Watches: []strategy.Watch{w}}
		if k := key(); rng.IntN(2) == 0 {
			b.Diffs = []strategy.Diff{diff(k, time.Minute, base, 2)}
		}
		untilApplied(t, func() error {
			res, err := s.PushDiffs(ctx, b)
			if err != nil {
				t.Log(err)
				return err // the cursor stays: the re-send asks from it again
			}
			for j, d := range b.Diffs {
				view[d.Key] = res.Totals[j]
			}
			ch := res.Changes[0]
			require.False(t, ch.Overflow)
			for _, c := range ch.Counters {
				view[c.Key] = c.Count
			}
			w.Cursor = ch.Cursor
			return nil
		})
	}
	want := map[string]int64{}
	for c, err := range other.GetCounters(ctx, strategy.Query{Namespace: ns, Sizes: []time.Duration{time.Minute}, Now: base}) {
		require.NoError(t, err)
		want[c.Key] = c.Count
	}
	res, err := other.PushDiffs(ctx, &strategy.Batch{ID: "last", Namespace: ns, Watches: []strategy.Watch{w}})
	require.NoError(t, err)
	for _, c := range res.Changes[0].Counters {
		view[c.Key] = c.Count
	}
	require.Equal(t, want, view)
	t.Logf("%d replies lost", proxy.Cuts())
}

// A Take whose first attempt was applied and lost its reply, and whose
// go-redis retries were refused, has an unknown outcome: it must not say
// "not applied", and its re-send must not spend twice. With retries off, a
// refused Take is surely not applied.
func TestTakeRefusalAfterLostReplyIsUnknown(t *testing.T) {
	noLeaks(t)
	addr := realAddr(t)
	bucket := []strategy.TakeBucket{{Period: time.Second, Interval: 1000, Burst: 10}}
	for _, refusal := range retriedRefusals {
		code := refusal[:bytes.IndexByte([]byte(refusal), ' ')]
		t.Run(code, func(t *testing.T) {
			px, s := retryingStore(t, addr)
			ctx := context.Background()
			warm := &strategy.Take{ID: "warm", Namespace: "ns", Key: "w", Now: base, Cost: 1, Buckets: bucket}
			_, err := s.Take(ctx, warm) // loads the script: the take below is an EVALSHA
			require.NoError(t, err)

			tk := &strategy.Take{ID: "t-" + code, Namespace: "ns", Key: "k", Now: base, Cost: 3, Buckets: bucket}
			armLostReplyThenRefusal(px, refusal)
			_, err = s.Take(ctx, tk)
			require.Error(t, err)
			require.Equal(t, int64(1), px.Cuts(), "the first attempt's reply was lost")
			require.False(t, errors.Is(err, strategy.ErrNotApplied),
				"an attempt was applied before the refusal, yet the take claims none was: %v", err)

			px.SetMode(faultproxy.Forward)
			res, err := s.Take(ctx, tk)
			require.NoError(t, err)
			require.True(t, res.Allowed)
			require.Equal(t, float64(base)+3000, res.Buckets[0].TAT, "spent once")
		})
	}
	t.Run("no retries", func(t *testing.T) {
		px := newProxy(t, addr)
		opts := clientOptions(px.Addr())
		opts.MaxRetries = -1
		c := goredis.NewClient(opts)
		t.Cleanup(func() { _ = c.Close() })
		s := newStore(t, c, Options{Shards: 4})
		px.SetAnswer(refuseEach("LOADING Redis is loading the dataset in memory"))
		px.SetMode(faultproxy.Answer)
		_, err := s.Take(context.Background(), &strategy.Take{ID: "fresh", Namespace: "ns", Key: "k", Now: base, Cost: 1, Buckets: bucket})
		require.ErrorIs(t, err, strategy.ErrNotApplied, "one attempt, refused: surely not applied")
	})
}
