package ratelimit_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit"
	"github.com/ratesync/ratelimit/strategy"
	"github.com/ratesync/ratelimit/strategy/memory"
)

// pushLog is a memory store that records what each push carried.
type pushLog struct {
	*memory.Store
	mu      sync.Mutex
	reads   int
	diffs   int
	watches int
	changes int
	over    int
}

func (p *pushLog) PushDiffs(ctx context.Context, b *strategy.Batch) (strategy.Result, error) {
	res, err := p.Store.PushDiffs(ctx, b)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.reads += len(b.Reads)
	p.diffs += len(b.Diffs)
	p.watches += len(b.Watches)
	for _, c := range res.Changes {
		p.changes += len(c.Counters)
		if c.Overflow {
			p.over++
		}
	}
	return res, err
}

func (p *pushLog) take() (reads, diffs, watches, changes, over int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	reads, diffs, watches, changes, over = p.reads, p.diffs, p.watches, p.changes, p.over
	p.reads, p.diffs, p.watches, p.changes, p.over = 0, 0, 0, 0, 0
	return
}

// TestWatchesFollowChange: in periodic mode over a store with change logs, a
// cycle reads what changed, not every key a node holds, and a node learns
// another's hits on keys it holds without reading them.
func TestWatchesFollowChange(t *testing.T) {
	clk := newDecClock(decEpoch.Add(10 * time.Second)) // far from a minute's end: no read-ahead
	store := &pushLog{Store: memory.New()}
	ctx := context.Background()
	a := newDecNSOn(t, "async", clk, store, time.Minute)
	b := newDecNSOn(t, "async", clk, store, time.Minute)
	const keys = 1000
	for i := range keys {
		_, err := a.Increment(ctx, fmt.Sprint("k", i), time.Minute, 1)
		require.NoError(t, err)
		_, err = b.Increment(ctx, fmt.Sprint("k", i), time.Minute, 1)
		require.NoError(t, err)
	}
	// Settle: the first watches overflow (a thousand keys against a limit
	// of half of them), the cycles after read in full until the changes are
	// few again.
	for range 3 {
		require.NoError(t, a.Sync(ctx))
		require.NoError(t, b.Sync(ctx))
	}
	store.take()

	// Nothing changed: a cycle is the watches alone.
	require.NoError(t, a.Sync(ctx))
	reads, diffs, watches, changes, _ := store.take()
	require.Zero(t, reads)
	require.Zero(t, diffs)
	require.Equal(t, 2, watches, "the current and the previous minute")
	require.Zero(t, changes)

	// b changes 1% of the keys: a learns them from the changes.
	for i := range keys / 100 {
		_, err := b.Increment(ctx, fmt.Sprint("k", i), time.Minute, 5)
		require.NoError(t, err)
	}
	require.NoError(t, b.Sync(ctx))
	store.take()
	require.NoError(t, a.Sync(ctx))
	reads, _, _, changes, _ = store.take()
	require.Zero(t, reads, "no key is read")
	require.Equal(t, keys/100, changes)
	for i := range keys / 50 {
		rate, err := a.SlidingWindow(ctx, fmt.Sprint("k", i), time.Minute)
		require.NoError(t, err)
		want := 2.0
		if i < keys/100 {
			want = 7
		}
		require.Equal(t, want, rate, "k%d", i)
	}
}

// TestWatchOverflowReadsInFull: when more changed than half what a node holds,
// the store answers an overflow and the cycle goes on to read every key held
// in the window.
func TestWatchOverflowReadsInFull(t *testing.T) {
	clk := newDecClock(decEpoch.Add(10 * time.Second))
	store := &pushLog{Store: memory.New()}
	ctx := context.Background()
	a := newDecNSOn(t, "async", clk, store, time.Minute)
	b := newDecNSOn(t, "async", clk, store, time.Minute)
	_, err := a.Increment(ctx, "mine", time.Minute, 1)
	require.NoError(t, err)
	require.NoError(t, a.Sync(ctx))
	for i := range 2000 { // far more than a holds (and than the 256 a watch takes at least)
		_, err := b.Increment(ctx, fmt.Sprint("other", i), time.Minute, 1)
		require.NoError(t, err)
	}
	_, err = b.Increment(ctx, "mine", time.Minute, 3)
	require.NoError(t, err)
	require.NoError(t, b.Sync(ctx))
	store.take()
	require.NoError(t, a.Sync(ctx))
	reads, _, _, _, over := store.take()
	require.Equal(t, 1, over)
	require.Equal(t, 1, reads, "the full read, in the same cycle: the one key a holds")
	rate, err := a.SlidingWindow(ctx, "mine", time.Minute)
	require.NoError(t, err)
	require.Equal(t, 4.0, rate)
	// High churn: the cycle after an overflow reads in full from the start
	// (the current and previous windows of a's key), its watches going
	// along; they do not overflow, so the next cycle is back to changes.
	require.NoError(t, a.Sync(ctx))
	reads, _, _, _, over = store.take()
	require.Equal(t, 2, reads)
	require.Zero(t, over)
	require.NoError(t, a.Sync(ctx))
	reads, _, _, _, over = store.take()
	require.Zero(t, reads, "back to the changes")
	require.Zero(t, over)
}

// TestWatchFollowsNodesAhead: near a window's end, a node whose clock is
// behind learns from the next window's watch that others are in it.
func TestWatchFollowsNodesAhead(t *testing.T) {
	behind := newDecClock(decEpoch.Add(58 * time.Second))
	ahead := newDecClock(decEpoch.Add(61 * time.Second))
	store := memory.New()
	ctx := context.Background()
	slow := newDecNSOn(t, "async", behind, store, time.Minute)
	fast := newDecNSOn(t, "async", ahead, store, time.Minute)
	l := ratelimit.Limit{Window: time.Minute, Max: 10}
	_, err := slow.Allow(ctx, "k", 1, l)
	require.NoError(t, err)
	require.NoError(t, slow.Sync(ctx))
	for range 4 {
		_, err := fast.Allow(ctx, "k", 1, l)
		require.NoError(t, err)
	}
	require.NoError(t, fast.Sync(ctx))
	require.NoError(t, slow.Sync(ctx))
	d, err := slow.Peek(ctx, "k", 1, l)
	require.NoError(t, err)
	// slow follows fast into the next minute: 4 there, and its own 1 in
	// the previous minute weighing fully.
	require.Equal(t, int64(10-4-1-1), d.Remaining)
}
