package redis

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit/strategy"
)

// Two nodes whose clocks are off by an hour and by -30 s agree on the time,
// and so on window boundaries, when both read it from Redis.
func TestClockFollowsRedis(t *testing.T) {
	mr, c := miniClient(t)
	server := time.Date(2030, 5, 6, 7, 8, 59, 900_000_000, time.UTC) // 100 ms before a minute ends
	mr.SetTime(server)

	var clocks []*Clock
	for _, skew := range []time.Duration{time.Hour, -30 * time.Second, 0} {
		s := newStore(t, c, Options{})
		s.now = func() time.Time { return time.Now().Add(skew) }
		clk, err := s.Clock(context.Background())
		require.NoError(t, err)
		require.InDelta(t, float64(server.Sub(time.Now().Add(skew))), float64(clk.Offset()), float64(time.Second))
		clocks = append(clocks, clk)
	}
	for i, clk := range clocks {
		now := clk.Now()
		// miniredis's TIME stands still at server; the clocks run on from it.
		require.False(t, now.Before(server.Add(-50*time.Millisecond)), "clock %d: %v", i, now)
		require.True(t, now.Before(server.Add(time.Second)), "clock %d: %v", i, now)
	}
	// Within the same instant, every node names the same one-hour window.
	starts := map[int64]bool{}
	for _, clk := range clocks {
		starts[strategy.WindowStart(clk.Now().UnixMilli(), time.Hour)] = true
	}
	require.Len(t, starts, 1)

	// Refresh follows the server's clock when it moves.
	mr.SetTime(server.Add(10 * time.Minute))
	require.NoError(t, clocks[0].Refresh(context.Background()))
	require.WithinDuration(t, server.Add(10*time.Minute), clocks[0].Now(), time.Second)
}

func TestClockRedis(t *testing.T) {
	noLeaks(t)
	s := newStore(t, realClient(t), Options{})
	clk, err := s.Clock(context.Background())
	require.NoError(t, err)
	// Same host, same clock: the offset is the measurement error only.
	require.Less(t, clk.Offset().Abs(), 100*time.Millisecond)
	require.WithinDuration(t, time.Now(), clk.Now(), 100*time.Millisecond)
}

func TestClockRun(t *testing.T) {
	noLeaks(t)
	mr, c := miniClient(t)
	s := newStore(t, c, Options{})
	clk, err := s.Clock(context.Background())
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	require.ErrorIs(t, clk.Run(ctx, time.Millisecond), context.Canceled)
	require.Error(t, clk.Run(context.Background(), 0))

	mr.Close()
	before := clk.Offset()
	require.Error(t, clk.Refresh(context.Background()), "Redis is gone")
	require.Equal(t, before, clk.Offset(), "a failed refresh keeps the offset")
}
