package ratelimit_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit"
	"github.com/ratesync/ratelimit/strategy"
	"github.com/ratesync/ratelimit/strategy/memory"
)

// Attacks on the boundary fix that held. Each runs a call G2 at a later
// instant inside G1's push (hookedStore), rotating A's entry.

// With three window sizes the namespace has two tables: [1h 1d] and [1s].
// G1's second is rotated out of A's entry during its push, so it is judged
// from the store's reply, found at its table's offsets in the joined batch
// (the hour's diff and read come first). Read at the wrong offset, the
// hour's counts (B never counted there) would admit G1.
func TestSyncRotationJudgesAcrossTables(t *testing.T) {
	const x = int64(1_700_000_000_000) // a second boundary
	sizes := []time.Duration{time.Hour, 24 * time.Hour, time.Second}
	for _, c := range []struct {
		name       string
		sec        ratelimit.Limit
		bAt        int64
		g1At, g2At int64
	}{
		// The second's count (diff) is read from the reply.
		{"fixed", ratelimit.Limit{Window: time.Second, Max: 2, Algorithm: ratelimit.FixedWindow}, x + 100, x + 999, x + 2500},
		// The second before G1's (read) is read from the reply.
		{"sliding", ratelimit.Limit{Window: time.Second, Max: 2}, x - 900, x + 10, x + 1500},
	} {
		t.Run(c.name, func(t *testing.T) {
			store := memory.New()
			hs := &hookedStore{Store: store}
			clockA, clockB := newClock(c.g1At), newClock(c.bAt)
			a := syncTestNode(t, hs, clockA, 0, sizes...)
			b := syncTestNode(t, store, clockB, 0, sizes...)
			ctx := context.Background()
			for range 2 { // the second only: the hour does not count them
				d, err := b.Allow(ctx, "k", 1, c.sec)
				require.NoError(t, err)
				require.True(t, d.Allowed)
			}
			limits := []ratelimit.Limit{{Window: time.Hour, Max: 100}, c.sec}
			var g2 ratelimit.Decision
			hook := func() {
				clockA.Store(c.g2At)
				g2, _ = a.Allow(ctx, "k", 1, limits...)
			}
			hs.hook.Store(&hook)
			g1, err := a.Allow(ctx, "k", 1, limits...)
			require.NoError(t, err)
			require.True(t, g2.Allowed)
			require.False(t, g1.Allowed, "B spent the second")
			require.False(t, g1.Degraded)
		})
	}
}

// A peek (cost 0) at the end of a spent second, racing a call two seconds
// on that rotates the second out of A's entry, answers from the store's
// reads, at their offsets behind the minute limit's reads.
func TestSyncPeekRacingRotationReadsItsWindow(t *testing.T) {
	const x = int64(1_700_000_000_000)
	store := memory.New()
	hs := &hookedStore{Store: store}
	clockA, clockB := newClock(x+999), newClock(x+100)
	sizes := []time.Duration{time.Second, time.Minute}
	a := syncTestNode(t, hs, clockA, 0, sizes...)
	b := syncTestNode(t, store, clockB, 0, sizes...)
	ctx := context.Background()
	limits := []ratelimit.Limit{{Window: time.Minute, Max: 100}, {Window: time.Second, Max: 1, Algorithm: ratelimit.FixedWindow}}
	d, err := b.Allow(ctx, "k", 1, limits...)
	require.NoError(t, err)
	require.True(t, d.Allowed)

	hook := func() {
		clockA.Store(x + 2500)
		_, _ = a.Allow(ctx, "k", 1, limits...)
	}
	hs.hook.Store(&hook)
	p, err := a.Peek(ctx, "k", 1, limits...)
	require.NoError(t, err)
	require.False(t, p.Allowed, "B spent the second")
}

// G1's write-through reaches the store but its reply is lost (unknown
// outcome) while G2, two seconds on, rotates G1's second out of A's entry.
// G1 is answered from local state (Degraded); the retry re-sends its push,
// which the store recognises: every hit is in the store once, none pending.
func TestSyncLostReplyRacingRotationCountsOnce(t *testing.T) {
	const x = int64(1_700_000_000_000)
	store := memory.New()
	hs := &hookedStore{Store: store}
	clock := newClock(x + 999)
	a := syncTestNode(t, hs, clock, 0, time.Second, time.Minute)
	ctx := context.Background()
	limits := []ratelimit.Limit{{Window: time.Second, Max: 5}, {Window: time.Minute, Max: 100, Algorithm: ratelimit.FixedWindow}}

	var lose atomic.Bool
	store.SetFaults(func(op memory.Op) memory.Fault {
		if op == memory.OpPush && lose.CompareAndSwap(true, false) {
			return memory.LoseReply
		}
		return memory.NoFault
	})
	hook := func() {
		clock.Store(x + 2500)
		d, err := a.Allow(ctx, "k", 1, limits...)
		require.NoError(t, err)
		require.True(t, d.Allowed)
		lose.Store(true) // G1's push, next
	}
	hs.hook.Store(&hook)
	g1, err := a.Allow(ctx, "k", 1, limits...)
	require.NoError(t, err)
	require.True(t, g1.Allowed)
	require.True(t, g1.Degraded)

	clock.Store(x + 2600)
	require.NoError(t, a.Sync(ctx))
	require.Zero(t, a.Stats().PendingHits)
	for _, c := range []struct {
		size  time.Duration
		start int64
		want  int64
	}{{time.Second, x + 2000, 1}, {time.Minute, x - x%60_000, 2}} { // (second x may be purged by now)
		got, err := store.GetWindow(ctx, "synctest", strategy.CounterID{Key: "k", Size: c.size, Start: c.start})
		require.NoError(t, err)
		require.Equal(t, c.want, got, "%v window at %d", c.size, c.start)
	}
}

// A Penalty limit keeps a rejected hit, the others take it back from the
// window it counted in, while G2 in the next second (inside G1's push)
// rotates A's entry.
func TestSyncPenaltyRacingRotationKeepsOnlyThePenalty(t *testing.T) {
	const x = int64(1_700_000_000_000) // 20 s into a minute
	store := memory.New()
	hs := &hookedStore{Store: store}
	clockA, clockB := newClock(x+999), newClock(x+100)
	sizes := []time.Duration{time.Second, time.Minute}
	a := syncTestNode(t, hs, clockA, 0, sizes...)
	b := syncTestNode(t, store, clockB, 0, sizes...)
	ctx := context.Background()
	limits := []ratelimit.Limit{{Window: time.Second, Max: 1, Algorithm: ratelimit.FixedWindow, Penalty: true},
		{Window: time.Minute, Max: 100, Algorithm: ratelimit.FixedWindow}}
	d, err := b.Allow(ctx, "k", 1, limits...)
	require.NoError(t, err)
	require.True(t, d.Allowed)

	var g2 ratelimit.Decision
	hook := func() {
		clockA.Store(x + 1500)
		g2, _ = a.Allow(ctx, "k", 1, limits...)
	}
	hs.hook.Store(&hook)
	g1, err := a.Allow(ctx, "k", 1, limits...)
	require.NoError(t, err)
	require.True(t, g2.Allowed)
	require.False(t, g1.Allowed)
	require.NoError(t, a.Sync(ctx))
	for _, c := range []struct {
		size  time.Duration
		start int64
		want  int64
	}{{time.Second, x, 2}, {time.Second, x + 1000, 1}, {time.Minute, x - 20_000, 2}} {
		got, err := store.GetWindow(ctx, "synctest", strategy.CounterID{Key: "k", Size: c.size, Start: c.start})
		require.NoError(t, err)
		require.Equal(t, c.want, got, "%v window at %d", c.size, c.start)
	}
}
