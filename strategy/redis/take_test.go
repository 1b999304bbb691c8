package redis

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit/strategy"
	"github.com/ratesync/ratelimit/strategy/memory"
)

// randomTake returns a Take on one of three keys with random limits (the
// same bucket's interval changes between takes, so TATs are converted),
// cost, mode and instant; re-sends of earlier takes (as they are, or with
// the node's answer) are among them.
func randomTake(rng *rand.Rand, now int64, earlier []*strategy.Take, seq int) *strategy.Take {
	if len(earlier) > 0 && rng.IntN(8) == 0 {
		old := *earlier[rng.IntN(len(earlier))]
		if rng.IntN(2) == 0 && !old.Peek && !old.Refund {
			old.Answered = strategy.Answer(1 + rng.IntN(2))
		}
		return &old
	}
	t := &strategy.Take{ID: fmt.Sprintf("take-%d", seq), Namespace: "ns", Key: fmt.Sprintf("k%d", rng.IntN(3)), Now: now, Cost: rng.Int64N(5)}
	switch r := rng.IntN(20); {
	case r < 2:
		t.Peek = true
	case r < 4:
		t.Refund = true
	case r < 6:
		t.Answered = strategy.Answer(1 + rng.IntN(2))
	case r < 7:
		t.ID = "" // decided, not recorded
	}
	periods := []time.Duration{time.Second, time.Minute}
	for _, i := range rng.Perm(2)[:rng.IntN(3)] {
		t.Buckets = append(t.Buckets, strategy.TakeBucket{Period: periods[i],
			Interval: []float64{250, 1000.0 / 3, 100, 60_000.0 / 7}[rng.IntN(4)], Burst: 1 + rng.Int64N(5), Penalty: rng.IntN(4) == 0})
	}
	windows := []time.Duration{time.Second, 10 * time.Second}
	for _, i := range rng.Perm(2)[:rng.IntN(3)] {
		t.Logs = append(t.Logs, strategy.TakeLog{Window: windows[i], Max: 1 + rng.Int64N(6), Penalty: rng.IntN(4) == 0})
	}
	if len(t.Buckets)+len(t.Logs) == 0 || rng.IntN(3) == 0 {
		// The common shape, which the take script answers on a path of its own.
		t.Buckets = []strategy.TakeBucket{{Period: time.Second, Interval: 250, Burst: 1 + rng.Int64N(5), Penalty: rng.IntN(4) == 0}}
		t.Logs = nil
	}
	return t
}

// The take script follows the memory store (the reference) to the bit: the
// same random takes (modes, penalties, re-sends, answers, refunds, clocks
// going back a little) get the same decisions, bucket states and log
// states from both.
func testTakeMatchesMemory(t *testing.T, c goredis.UniversalClient) {
	s := newStore(t, c, Options{Shards: 4})
	ref := memory.New()
	ctx := context.Background()
	for seed := range uint64(4) {
		rng := rand.New(rand.NewPCG(seed, 99))
		ns := fmt.Sprintf("ns-%d", seed)
		now := base
		var earlier []*strategy.Take
		for i := range 400 {
			now += rng.Int64N(400) - 40                           // sometimes back a little
			tk := randomTake(rng, now, earlier, int(seed)*1000+i) // IDs unique across seeds
			tk.Namespace = ns
			want, err := ref.Take(ctx, tk)
			require.NoError(t, err)
			got, err := s.Take(ctx, tk)
			require.NoError(t, err)
			require.Equal(t, want, got, "seed %d take %d: %+v", seed, i, tk)
			earlier = append(earlier, tk)
		}
	}
}

func TestTakeMatchesMemoryMiniredis(t *testing.T) {
	_, c := miniClient(t)
	testTakeMatchesMemory(t, c)
}

func TestTakeMatchesMemoryRedis(t *testing.T) {
	noLeaks(t)
	testTakeMatchesMemory(t, realClient(t))
}

// Bucket diffs pushed to Redis and to the memory store, with random adds,
// floors and intervals, at instants going back and forth: the same states
// after each push, to the bit.
func testBucketsMatchMemory(t *testing.T, c goredis.UniversalClient) {
	s := newStore(t, c, Options{Shards: 4})
	ref := memory.New()
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(1, 2))
	now := base
	ids := []strategy.BucketID{{Key: "a", Period: time.Second}, {Key: "b", Period: time.Second}, {Key: "a", Period: time.Minute}}
	intervals := []float64{250, 1000.0 / 3, 60_000.0 / 7, 0.1}
	for i := range 300 {
		now += rng.Int64N(300) - 50
		b := &strategy.Batch{ID: fmt.Sprintf("b-%d", i), Namespace: "ns", Now: now, BucketReads: ids}
		for _, j := range rng.Perm(len(ids))[:rng.IntN(len(ids)+1)] {
			iv := intervals[rng.IntN(len(intervals))]
			var d strategy.BucketDiff
			switch rng.IntN(3) {
			case 0:
				d = strategy.SpendDiff(ids[j], 1+rng.Int64N(4), iv, now)
			case 1:
				d = strategy.RefundDiff(ids[j], 1+rng.Int64N(4), iv, now)
			default: // a node's folded spends
				d = strategy.BucketDiff{BucketID: ids[j], Add: rng.Float64() * 1000, Floor: float64(now) + rng.Float64()*500, Interval: iv}
			}
			b.BucketDiffs = append(b.BucketDiffs, d)
		}
		want, err := ref.PushDiffs(ctx, b)
		require.NoError(t, err)
		got, err := s.PushDiffs(ctx, b)
		require.NoError(t, err)
		require.Equal(t, want.Buckets, got.Buckets, "push %d", i)
		require.Equal(t, want.BucketReads, got.BucketReads, "push %d", i)
	}
}

func TestBucketsMatchMemoryMiniredis(t *testing.T) {
	_, c := miniClient(t)
	testBucketsMatchMemory(t, c)
}

func TestBucketsMatchMemoryRedis(t *testing.T) {
	noLeaks(t)
	testBucketsMatchMemory(t, realClient(t))
}

// TestTakeReadsListLogs: a sliding log that an earlier version wrote as a
// list of "<at> <cost> <id>" entries is read as such by the next take,
// which rewrites it as a sorted set; entries that are not entries are
// dropped.
func TestTakeReadsListLogs(t *testing.T) {
	for name, c := range map[string]goredis.UniversalClient{"redis": realClient(t), "miniredis": func() goredis.UniversalClient { _, c := miniClient(t); return c }()} {
		t.Run(name, func(t *testing.T) {
			s := newStore(t, c, Options{KeyPrefix: uniquePrefix(t), Shards: 1})
			ctx := context.Background()
			const now = 1_700_000_000_000
			key := logKey(s.shardPrefixes("ns")[0], "k", time.Minute)
			require.NoError(t, c.RPush(ctx, key, fmt.Sprint(now-2000, " 2 a"), "junk", fmt.Sprint(now-1000, " 3 b")).Err())
			logs := []strategy.TakeLog{{Window: time.Minute, Max: 10}}
			res, err := s.Take(ctx, &strategy.Take{ID: "c", Namespace: "ns", Key: "k", Now: now, Cost: 1, Logs: logs})
			require.NoError(t, err)
			require.True(t, res.Allowed)
			require.Equal(t, int64(6), res.Logs[0].Count)
			require.Equal(t, "zset", c.Type(ctx, key).Val())
			// The entries keep their instants: the oldest leaves the window first.
			res, err = s.Take(ctx, &strategy.Take{Namespace: "ns", Key: "k", Now: now - 2000 + time.Minute.Milliseconds(), Peek: true, Logs: logs})
			require.NoError(t, err)
			require.Equal(t, int64(4), res.Logs[0].Count)
		})
	}
}

// TestTakeLogOrderWithinAnInstant: entries of one instant are taken back
// newest first, as the memory store does, however their members sort.
func TestTakeLogOrderWithinAnInstant(t *testing.T) {
	s := newStore(t, realClient(t), Options{KeyPrefix: uniquePrefix(t), Shards: 1})
	ctx := context.Background()
	const now = 1_700_000_000_000
	logs := []strategy.TakeLog{{Window: time.Minute, Max: 100}}
	// IDs and costs that sort against the order of arrival.
	for i, id := range []string{"z", "y", "x", "w"} {
		_, err := s.Take(ctx, &strategy.Take{ID: id, Namespace: "ns", Key: "k", Now: now, Cost: int64(9 - i), Logs: logs})
		require.NoError(t, err)
	}
	// A refund of 7 empties w (6) and takes 1 from x (7 -> 6); the node's
	// answer "rejected" for x then removes what x holds.
	_, err := s.Take(ctx, &strategy.Take{Namespace: "ns", Key: "k", Now: now, Cost: 7, Refund: true, Logs: logs})
	require.NoError(t, err)
	res, err := s.Take(ctx, &strategy.Take{ID: "x", Namespace: "ns", Key: "k", Now: now, Cost: 7, Answered: strategy.AnsweredRejected, Logs: logs})
	require.NoError(t, err)
	require.Equal(t, int64(9+8), res.Logs[0].Count)
}
