package redis

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit/internal/faultproxy"
	"github.com/ratesync/ratelimit/strategy"
)

// noScriptAfter answers every request with NOSCRIPT, as a Redis restarted
// since the script was loaded does, after cancelling the caller's context, so
// that the store's EVAL re-send is never sent.
func noScriptAfter(cancel context.CancelFunc) func([]byte) []byte {
	return func(chunk []byte) []byte {
		cancel()
		return bytes.Repeat([]byte("-NOSCRIPT No matching script. Please use EVAL.\r\n"), max(1, respCommands(chunk)))
	}
}

// A push or a Take whose first attempt was applied and lost its reply, whose
// retry met NOSCRIPT (a Redis restarted since the script was loaded) and whose
// EVAL re-send was never sent has an unknown outcome: "not sent" describes only
// the re-send.
func TestNoScriptAfterLostReplyIsUnknown(t *testing.T) {
	noLeaks(t)
	addr := realAddr(t)
	t.Run("push", func(t *testing.T) {
		px, s := retryingStore(t, addr)
		warm := &strategy.Batch{ID: "warm", Namespace: "ns", Diffs: []strategy.Diff{{CounterID: strategy.CounterID{Key: "w", Size: time.Minute}, Delta: 1}}}
		_, err := s.PushDiffs(context.Background(), warm) // loads the script: the push below is an EVALSHA
		require.NoError(t, err)

		id := strategy.CounterID{Key: "k", Size: time.Minute, Start: 60_000}
		b := &strategy.Batch{ID: "b-noscript", Namespace: "ns", Diffs: []strategy.Diff{{CounterID: id, Delta: 5}}}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		armLostReplyThenAnswer(px, noScriptAfter(cancel))
		_, err = s.PushDiffs(ctx, b)
		require.Error(t, err)
		require.Equal(t, int64(1), px.Cuts(), "the first attempt's reply was lost")
		require.False(t, errors.Is(err, strategy.ErrNotApplied),
			"an attempt was applied before NOSCRIPT, yet the push claims none was: %v", err)

		px.SetMode(faultproxy.Forward)
		res, err := s.PushDiffs(context.Background(), b)
		require.NoError(t, err)
		require.Equal(t, []int64{5}, res.Totals, "counted once")
	})
	t.Run("take", func(t *testing.T) {
		px, s := retryingStore(t, addr)
		bucket := []strategy.TakeBucket{{Period: time.Second, Interval: 1000, Burst: 10}}
		_, err := s.Take(context.Background(), &strategy.Take{ID: "warm", Namespace: "ns", Key: "w", Now: base, Cost: 1, Buckets: bucket})
		require.NoError(t, err)

		tk := &strategy.Take{ID: "t-noscript", Namespace: "ns", Key: "k", Now: base, Cost: 3, Buckets: bucket}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		armLostReplyThenAnswer(px, noScriptAfter(cancel))
		_, err = s.Take(ctx, tk)
		require.Error(t, err)
		require.Equal(t, int64(1), px.Cuts(), "the first attempt's reply was lost")
		require.False(t, errors.Is(err, strategy.ErrNotApplied),
			"an attempt was applied before NOSCRIPT, yet the take claims none was: %v", err)

		px.SetMode(faultproxy.Forward)
		res, err := s.Take(context.Background(), tk)
		require.NoError(t, err)
		require.True(t, res.Allowed)
		require.Equal(t, float64(base)+3000, res.Buckets[0].TAT, "spent once")
	})
}
