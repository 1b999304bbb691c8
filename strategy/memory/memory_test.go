package memory_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit/strategy"
	"github.com/ratesync/ratelimit/strategy/memory"
	"github.com/ratesync/ratelimit/strategy/strategytest"
)

func TestContract(t *testing.T) {
	strategytest.Run(t, func(t *testing.T) strategy.Strategy { return memory.New() })
}

func TestFaults(t *testing.T) {
	ctx := context.Background()
	s := memory.New()
	id := strategy.CounterID{Key: "k", Size: time.Second, Start: 1000}
	b := &strategy.Batch{ID: "b1", Namespace: "ns", Diffs: []strategy.Diff{{CounterID: id, Delta: 1}}}

	s.SetFaults(func(memory.Op) memory.Fault { return memory.Refuse })
	_, err := s.PushDiffs(ctx, b)
	require.ErrorIs(t, err, strategy.ErrNotApplied)
	require.ErrorIs(t, err, memory.ErrInjected)

	s.SetFaults(func(memory.Op) memory.Fault { return memory.LoseRequest })
	_, err = s.PushDiffs(ctx, b)
	require.ErrorIs(t, err, memory.ErrInjected)
	require.False(t, errors.Is(err, strategy.ErrNotApplied), "a lost request has an unknown outcome")

	s.SetFaults(func(memory.Op) memory.Fault { return memory.LoseReply })
	_, err = s.PushDiffs(ctx, b)
	require.ErrorIs(t, err, memory.ErrInjected)
	require.False(t, errors.Is(err, strategy.ErrNotApplied))

	s.SetFaults(nil)
	n, err := s.GetWindow(ctx, "ns", id)
	require.NoError(t, err)
	require.Equal(t, int64(1), n, "only the lost reply applied")
	res, err := s.PushDiffs(ctx, b)
	require.NoError(t, err)
	require.Equal(t, []int64{1}, res.Totals, "re-sending the applied batch does not apply it again")
	require.Equal(t, int64(4), s.Pushes())
}

func TestPurgeForgetsBatchIDs(t *testing.T) {
	ctx := context.Background()
	s := memory.New()
	id := strategy.CounterID{Key: "k", Size: time.Second, Start: 1000}
	b := &strategy.Batch{ID: "b1", Namespace: "ns", Diffs: []strategy.Diff{{CounterID: id, Delta: 1}}}
	_, err := s.PushDiffs(ctx, b)
	require.NoError(t, err)
	require.NoError(t, s.Purge(ctx, 3000))
	require.Zero(t, s.Len())
}
