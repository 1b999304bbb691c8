package ratelimit_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit"
	"github.com/ratesync/ratelimit/strategy"
	"github.com/ratesync/ratelimit/strategy/memory"
)

// A take-back that goes to a retired record is lost when the record absorbs
// the acknowledgement of another call's take-back still in flight.
//
// Node A's entry rotates its minute window M out (two minutes ahead) while
// M has a take-back of G1 (-1) and a hit of G7 (+1) in flight: the local
// count is 0 and the pending sum is 0, so rotate keeps no record. G7's +1
// is acknowledged first (no record: pending for M is now -1). G7 is then
// rejected and its take-back finds M rotated out: adjustRetired makes a
// record of -1. G1's -1 is acknowledged next, into that record: acked ==
// local, and the record is deleted. G7's take-back never reaches the store,
// which keeps G7's rejected hit in minute M.
func TestSyncTakeBackToRetiredRecordNotSwallowed(t *testing.T) {
	const m = int64(1_700_000_040_000) // a minute boundary
	require.Zero(t, m%60_000)
	store := memory.New()
	hs := &hookedStore{Store: store}
	clockA, clockB := newClock(m+500), newClock(m+100)
	a := syncTestNode(t, hs, clockA, 0, time.Second, time.Minute)
	b := syncTestNode(t, store, clockB, 0, time.Second, time.Minute)
	ctx := context.Background()
	limits := []ratelimit.Limit{{Window: time.Second, Max: 1, Algorithm: ratelimit.FixedWindow},
		{Window: time.Minute, Max: 100, Algorithm: ratelimit.FixedWindow}}
	allowB := func(at int64) {
		clockB.Store(at)
		d, err := b.Allow(ctx, "k", 1, limits...)
		require.NoError(t, err)
		require.True(t, d.Allowed)
	}
	allowB(m + 100) // second M spent

	var g7 ratelimit.Decision
	inG7 := func() { // inside G7's push: A's entry moves two minutes on
		clockA.Store(m + 120_000)
		_, err := a.Peek(ctx, "k", 1, limits...)
		require.NoError(t, err)
	}
	inG1Undo := func() { // inside G1's take-back's push
		allowB(m + 5100) // second M+5s spent
		clockA.Store(m + 5200)
		hs.hook.Store(&inG7)
		g7, _ = a.Allow(ctx, "k", 1, limits...)
	}
	// G1's first push carries its hit; the hook is armed for the next one,
	// its take-back.
	arm := func() { hs.hook.Store(&inG1Undo) }
	hs.hook.Store(&arm)
	g1, err := a.Allow(ctx, "k", 1, limits...)
	require.NoError(t, err)
	require.False(t, g1.Allowed, "second M is spent")
	require.False(t, g7.Allowed, "second M+5s is spent")

	clockA.Store(m + 5300) // sync before the store would purge minute M
	require.NoError(t, a.Sync(ctx))
	got, err := store.GetWindow(ctx, "synctest", strategy.CounterID{Key: "k", Size: time.Minute, Start: m})
	require.NoError(t, err)
	require.Equal(t, int64(2), got, "minute M: B's 2 hits; G1 and G7 were rejected and taken back")
}
