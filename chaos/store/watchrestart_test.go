package store

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit/strategy"
	"github.com/ratesync/ratelimit/strategy/redis"
)

// A Redis killed and restarted without persistence (every counter, version
// key, change log and script gone) between two watches of a window: the
// next watch overflows, whether or not another node wrote the window again
// in between, so a node never keeps counts the store lost while believing
// nothing changed; with the answer's cursor, watches list changes again.
func TestWatchAcrossRedisRestart(t *testing.T) {
	noLeaks(t)
	srv := startRedisServer(t)
	ctx := context.Background()
	opts := redis.Options{KeyPrefix: "watch-" + unique(t), Shards: 8}
	newStore := func() *redis.Store {
		s, err := redis.New(redisClient(t, srv.addr()), opts)
		require.NoError(t, err)
		return s
	}
	node, other := newStore(), newStore()
	start := strategy.WindowStart(time.Now().UnixMilli(), time.Minute)
	seq := 0
	// push re-sends b until Redis answers, as the core does after an error
	// of unknown outcome (the first attempts after a restart may fail).
	push := func(s *redis.Store, b *strategy.Batch) strategy.Result {
		t.Helper()
		seq++
		b.ID, b.Namespace, b.Now = fmt.Sprintf("%s-%d", opts.KeyPrefix, seq), "ns", start
		deadline := time.Now().Add(10 * time.Second)
		for {
			res, err := s.PushDiffs(ctx, b)
			if err == nil {
				return res
			}
			require.True(t, time.Now().Before(deadline), "no answer after the restart: %v", err)
			time.Sleep(50 * time.Millisecond) // waiting for the restarted server
		}
	}
	diffs := func(prefix string, n int) []strategy.Diff {
		var ds []strategy.Diff
		for i := range n {
			ds = append(ds, strategy.Diff{CounterID: strategy.CounterID{Key: fmt.Sprintf("%s%d", prefix, i), Size: time.Minute, Start: start}, Delta: 1})
		}
		return ds
	}
	for _, writtenAgain := range []bool{false, true} {
		t.Run(fmt.Sprintf("writtenAgain=%v", writtenAgain), func(t *testing.T) {
			w := strategy.Watch{Size: time.Minute, Start: start, Limit: 1000}
			res := push(node, &strategy.Batch{Diffs: diffs("k", 50), Watches: []strategy.Watch{w}})
			require.False(t, res.Changes[0].Overflow)
			w.Cursor = res.Changes[0].Cursor

			srv.restart()
			if writtenAgain {
				push(other, &strategy.Batch{Diffs: diffs("k", 5)})
			}
			res = push(node, &strategy.Batch{Watches: []strategy.Watch{w}})
			require.True(t, res.Changes[0].Overflow, "the window was lost since the cursor")
			require.Empty(t, res.Changes[0].Counters)

			w.Cursor = res.Changes[0].Cursor
			push(other, &strategy.Batch{Diffs: diffs("x", 3)})
			res = push(node, &strategy.Batch{Watches: []strategy.Watch{w}})
			require.False(t, res.Changes[0].Overflow)
			require.Equal(t, map[string]int64{"x0": 1, "x1": 1, "x2": 1}, counts(res.Changes[0].Counters))
		})
	}
}

func counts(cs []strategy.Counter) map[string]int64 {
	m := map[string]int64{}
	for _, c := range cs {
		m[c.Key] = c.Count
	}
	return m
}
