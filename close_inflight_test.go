package ratelimit_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit"
	"github.com/ratesync/ratelimit/strategy"
	"github.com/ratesync/ratelimit/strategy/memory"
)

// TestReviewStatsAfterClose: Seal now takes every entry out of the window
// tables, so after Close Stats().TrackedKeys drops to 0 (it reported the
// keys held before the change). Logged per mode; fails when it changed.

// TestCallInFlightAtCloseFindsItsKey: a call on the general path (three
// limits here) registers as in flight, and Close waits for it before it
// seals the tables, which takes every entry out. Sealed first, the call
// found its key gone, created a fresh entry and judged a count of 0: a key
// at its limit was admitted once more while Close ran (found by review).
func TestCallInFlightAtCloseFindsItsKey(t *testing.T) {
	at := time.UnixMilli(1_700_000_000_000)
	var armed atomic.Bool
	reached, release := make(chan struct{}), make(chan struct{})
	clock := func() time.Time {
		if armed.CompareAndSwap(true, false) {
			close(reached)
			<-release
		}
		return at
	}
	st := memory.New()
	reg := ratelimit.NewRegistry()
	ns, err := reg.New(ratelimit.Config{Namespace: "inflight", WindowSizes: []time.Duration{time.Minute},
		SyncRate: time.Hour, Strategy: st, ColdRead: ratelimit.ColdReadOff, Clock: clock})
	require.NoError(t, err)
	limits := []ratelimit.Limit{{Window: time.Minute, Max: 3}, {Window: time.Minute, Max: 100}, {Window: time.Minute, Max: 100}}
	for range 3 {
		d, err := ns.Allow(context.Background(), "k", 1, limits...)
		require.NoError(t, err)
		require.True(t, d.Allowed)
	}
	d, err := ns.Allow(context.Background(), "k", 1, limits...)
	require.NoError(t, err)
	require.False(t, d.Allowed, "at its limit")
	armed.Store(true)
	got := make(chan ratelimit.Decision, 1)
	go func() {
		d, err := ns.Allow(context.Background(), "k", 1, limits...)
		if err != nil {
			t.Logf("call in flight: %v", err)
		}
		got <- d
	}()
	<-reached // the call is in flight (entered), before its table call
	closed := make(chan error, 1)
	go func() { closed <- ns.Close(context.Background()) }()
	// Close has begun once the namespace refuses new calls; the call in
	// flight holds it up.
	require.Eventually(t, func() bool {
		_, err := ns.Allow(context.Background(), "probe", 1, limits[1])
		return errors.Is(err, ratelimit.ErrClosed)
	}, 5*time.Second, time.Millisecond)
	close(release)
	d = <-got
	require.NoError(t, <-closed)
	n, err := st.GetWindow(context.Background(), "inflight", strategy.CounterID{Key: "k", Size: time.Minute, Start: strategy.WindowStart(at.UnixMilli(), time.Minute)})
	require.NoError(t, err)
	t.Logf("call in flight at Close: allowed %v, remaining %d; store holds %d (limit 3)", d.Allowed, d.Remaining, n)
	require.False(t, d.Allowed, "a key at its limit admitted by a call in flight at Close")
}
