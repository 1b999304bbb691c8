package ratelimit_test

import (
	"context"
	"iter"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit"
	"github.com/ratesync/ratelimit/strategy"
	"github.com/ratesync/ratelimit/strategy/memory"
)

// lateStore notices a cancelled context only at the end of its call (as
// go-redis may, up to the call's deadline): every GetCounters takes delay.
type lateStore struct {
	strategy.Strategy
	delay    time.Duration
	inflight atomic.Int64
}

func (s *lateStore) Capabilities() strategy.Capabilities { return strategy.CapabilitiesOf(s.Strategy) }

func (s *lateStore) GetCounters(ctx context.Context, q strategy.Query) iter.Seq2[strategy.Counter, error] {
	s.inflight.Add(1)
	defer s.inflight.Add(-1)
	time.Sleep(s.delay) // the store's own latency, in the bubble's fake time
	if err := ctx.Err(); err != nil {
		return func(yield func(strategy.Counter, error) bool) { yield(strategy.Counter{}, err) }
	}
	return s.Strategy.GetCounters(ctx, q)
}

// A caller whose context can end hands its cold read to a goroutine; Close
// released the caller and waited for the calls in flight, but not for that
// goroutine: Close returned while the read was still inside the store (the
// application then closes its store client under it). Close now waits for
// those goroutines too, within its context.
func TestCloseLeavesColdReadInStore(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := &lateStore{Strategy: memory.New(), delay: 50 * time.Millisecond}
		reg := ratelimit.NewRegistry()
		b, err := reg.New(ratelimit.Config{WindowSizes: []time.Duration{time.Minute}, SyncRate: time.Hour, Strategy: store, SyncTimeout: time.Second})
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		var wg sync.WaitGroup
		wg.Go(func() { _, _ = b.Allow(ctx, "client", 1, coldWindowLimit) })
		synctest.Wait() // its read is in the store
		require.NoError(t, reg.Close(context.Background()))
		left := store.inflight.Load()
		wg.Wait()
		t.Logf("cold reads still inside the store when Close returned: %d", left)
		require.Zero(t, left, "Close returned with a cold read still using the store")
	})
}
