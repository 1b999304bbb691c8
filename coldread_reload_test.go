package ratelimit_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit"
	"github.com/ratesync/ratelimit/strategy/memory"
)

// A batch of cold window keys is read in window W0 and answers in W1; in a
// table at its MaxKeys cap loading the batch evicts some of its own keys,
// which their callers load again after the wait (LoadColdSince from the
// batch's counts). That reload passed the time of the reload, not the
// time of the read: the totals of W0 (3, the client's spent budget) landed
// in W1, where the store holds 0. Under a fixed window of 1 s each such
// client was rejected on its first request of W1, which the store and the
// keys that were not evicted admit. The reload is at the read's time now.
// Five rounds: how many keys the batch evicts varies (2 to 9 of 48).
func TestRelearnAtWrongWindow(t *testing.T) {
	var rejected int64
	for range 5 {
		rejected += relearnRound(t)
	}
	require.Zero(t, rejected, "keys reloaded after their batch evicted them were rejected")
}

func relearnRound(t *testing.T) (rejected int64) {
	synctest.Test(t, func(t *testing.T) {
		const hot, cold = 64, 48
		lim := ratelimit.Limit{Window: time.Second, Max: 3, Fixed: true}
		mem := memory.New()
		store := &coldGate{Strategy: mem}
		cfg := ratelimit.Config{WindowSizes: []time.Duration{time.Second}, SyncRate: time.Hour, Strategy: mem, MaxKeys: hot, SyncTimeout: 10 * time.Second}
		a := newNS(t, cfg)
		cfg.Strategy = store
		b := newNS(t, cfg)
		for i := range cold {
			require.Equal(t, 3, allowed(t, a, fmt.Sprintf("cold%d", i), 3, lim))
		}
		require.NoError(t, a.Sync(context.Background()))
		for i := range hot {
			allowed(t, b, fmt.Sprintf("hot%d", i), 2, lim)
		}
		store.delay = 600 * time.Millisecond // each read: W0's first read, then the batch sent in W0, answered in W1
		start := time.Now()
		var wg sync.WaitGroup
		wg.Go(func() { _, _ = b.Allow(context.Background(), "first", 1, lim) })
		synctest.Wait()
		var out outcomes
		for i := range cold {
			wg.Go(func() { out.allow(t, b, fmt.Sprintf("cold%d", i), lim) })
		}
		wg.Wait()
		t.Logf("decided %v after the start (window 1 s); %d of %d admitted (%d degraded); the store holds 0 for each in this window",
			time.Since(start), out.admitted.Load(), cold, out.degraded.Load())
		rejected = cold - out.admitted.Load()
	})
	return rejected
}
