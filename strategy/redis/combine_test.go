package redis

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit/strategy"
)

// Many concurrent single-diff pushes: combined into pipelines, each applied
// once, each answered with its own total.
func TestCombinedPushes(t *testing.T) {
	noLeaks(t)
	_, c := miniClient(t)
	s := newStore(t, c, Options{})
	const workers, each = 32, 50
	var (
		mu     sync.Mutex
		totals []int64
		wg     sync.WaitGroup
	)
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				res, err := s.PushDiffs(context.Background(), &strategy.Batch{ID: fmt.Sprintf("c-%d-%d", w, i), Namespace: "comb",
					Diffs: []strategy.Diff{diff("hot", time.Minute, base, 1)},
					Reads: []strategy.CounterID{{Key: "hot", Size: time.Minute, Start: base - 60_000}}})
				if !assert.NoError(t, err) {
					return
				}
				mu.Lock()
				totals = append(totals, res.Totals[0])
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	sort.Slice(totals, func(i, j int) bool { return totals[i] < totals[j] })
	require.Len(t, totals, workers*each)
	for i, n := range totals {
		require.Equal(t, int64(i+1), n, "every push saw its own total")
	}
	t.Logf("%d pushes, %d combined pipelines", workers*each, s.combiner.pipelines.Load())
}

// A caller that gives up while queued was never sent: "not applied".
func TestCombinedCancelWhileQueued(t *testing.T) {
	_, c := miniClient(t)
	s := newStore(t, c, Options{})
	s.combiner.mu.Lock()
	s.combiner.leaders = maxRounds // every round busy: the next caller queues
	s.combiner.mu.Unlock()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := s.PushDiffs(ctx, &strategy.Batch{ID: "q", Namespace: "comb", Diffs: []strategy.Diff{diff("k", time.Minute, base, 1)}})
	require.Error(t, err)
	require.ErrorIs(t, err, strategy.ErrNotApplied)
	s.combiner.mu.Lock()
	require.Empty(t, s.combiner.waiting)
	s.combiner.leaders = 0
	s.combiner.mu.Unlock()
	n, err := s.GetWindow(context.Background(), "comb", strategy.CounterID{Key: "k", Size: time.Minute, Start: base})
	require.NoError(t, err)
	require.Zero(t, n)
}

// A round's context outlives the cancellation of any one caller and ends at
// the earliest deadline, so that no caller waits past its own.
func TestRoundContext(t *testing.T) {
	early, cancelEarly := context.WithTimeout(context.Background(), time.Second)
	defer cancelEarly()
	late, cancelLate := context.WithTimeout(context.Background(), time.Hour)
	defer cancelLate()
	ctx, cancel := roundContext([]*combined{{ctx: late}, {ctx: early}})
	defer cancel()
	earlyDeadline, _ := early.Deadline()
	cancelEarly()
	require.NoError(t, ctx.Err())
	d, ok := ctx.Deadline()
	require.True(t, ok)
	require.Equal(t, earlyDeadline, d)

	ctx2, cancel2 := roundContext([]*combined{{ctx: late}, {ctx: context.Background()}})
	defer cancel2()
	d, ok = ctx2.Deadline()
	require.True(t, ok, "the callers that have a deadline bound the round")
	lateDeadline, _ := late.Deadline()
	require.Equal(t, lateDeadline, d)

	ctx3, cancel3 := roundContext([]*combined{{ctx: context.Background()}})
	defer cancel3()
	_, ok = ctx3.Deadline()
	require.False(t, ok, "no caller with a deadline: none")
}
