package redis

import (
	"context"
	"os"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit/strategy"
)

func TestWaitReplicasOptions(t *testing.T) {
	_, c := miniClient(t)
	_, err := New(c, Options{WaitReplicas: -1})
	require.ErrorContains(t, err, "Options.WaitReplicas")
	_, err = New(c, Options{WaitTimeout: -time.Second})
	require.ErrorContains(t, err, "Options.WaitTimeout")
	s, err := New(c, Options{WaitReplicas: 1})
	require.NoError(t, err)
	require.Equal(t, DefaultWaitTimeout, s.Options().WaitTimeout)

	cc := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}})
	defer cc.Close()
	_, err = New(cc, Options{WaitReplicas: 1})
	require.ErrorContains(t, err, "Options.WaitReplicas")
}

// A Redis without replicas cannot acknowledge a WAIT 1: the push is applied
// but reported as of unknown outcome, and a re-send applies nothing more.
func TestWaitReplicasNoReplica(t *testing.T) {
	noLeaks(t)
	c := realClient(t)
	ctx := context.Background()
	n, err := c.Do(ctx, "wait", 1, 1).Int64()
	require.NoError(t, err)
	if n > 0 {
		t.Skipf("the Redis at %s has replicas (%d)", realAddr(t), n)
	}
	s := newStore(t, c, Options{WaitReplicas: 1, WaitTimeout: 20 * time.Millisecond})
	b := &strategy.Batch{ID: batchID(t), Namespace: "wait", Diffs: []strategy.Diff{diff("k", time.Minute, base, 1), diff("j", time.Minute, base, 1)}}
	for range 2 {
		_, err := s.PushDiffs(ctx, b)
		require.Error(t, err)
		require.NotErrorIs(t, err, strategy.ErrNotApplied)
		require.ErrorContains(t, err, "0 of 1 replicas")
		n, err := s.GetWindow(ctx, "wait", strategy.CounterID{Key: "k", Size: time.Minute, Start: base})
		require.NoError(t, err)
		require.Equal(t, int64(1), n)
	}
	// Reads alone need no replica.
	res, err := s.PushDiffs(ctx, &strategy.Batch{ID: batchID(t), Namespace: "wait", Reads: []strategy.CounterID{{Key: "k", Size: time.Minute, Start: base}}})
	require.NoError(t, err)
	require.Equal(t, []int64{1}, res.Reads)
}

// With a replica (Sentinel's primary), pushes succeed.
func TestWaitReplicasSentinel(t *testing.T) {
	noLeaks(t)
	c := sentinelClient(t)
	waitFailoverReady(t, sentinelFor(t), os.Getenv(envSentinelMaster))
	s := newStore(t, c, Options{WaitReplicas: 1, WaitTimeout: time.Second})
	res, err := s.PushDiffs(context.Background(), &strategy.Batch{ID: batchID(t), Namespace: "wait",
		Diffs: []strategy.Diff{diff("k", time.Minute, base, 3)}})
	require.NoError(t, err)
	require.Equal(t, []int64{3}, res.Totals)
}
