package ratelimit_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit"
	"github.com/ratesync/ratelimit/strategy/memory"
)

// Many callers on keys spent on A, in both lanes, some hanging up at once,
// some after a while, with Close at the end: no caller not Degraded is
// admitted, none waits past SyncTimeout, nothing is left running.
func TestLanesStress(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const keys, callers = 20, 200
		const timeout = 100 * time.Millisecond
		mem := memory.New()
		store := &coldGate{Strategy: mem, delay: 30 * time.Millisecond}
		cfg := ratelimit.Config{WindowSizes: []time.Duration{time.Minute, time.Hour}, SyncRate: time.Hour, Strategy: mem, SyncTimeout: timeout}
		a := newNS(t, cfg)
		cfg.Strategy = store
		reg := ratelimit.NewRegistry()
		b, err := reg.New(cfg)
		require.NoError(t, err)
		win := ratelimit.Limit{Window: time.Minute, Max: 5}
		bkt := ratelimit.Limit{Window: time.Hour, Max: 5, Algorithm: ratelimit.TokenBucket}
		for i := range keys {
			k := fmt.Sprintf("k%d", i)
			require.Equal(t, 5, allowed(t, a, k, 5, win))
			require.Equal(t, 5, allowed(t, a, k, 5, bkt))
		}
		require.NoError(t, a.Sync(context.Background()))
		var bad, slow, deg atomic.Int64
		var wg sync.WaitGroup
		for c := range callers {
			wg.Go(func() {
				ctx := context.Background()
				if c%3 == 1 {
					var cancel context.CancelFunc
					ctx, cancel = context.WithTimeout(ctx, time.Duration(c%7)*10*time.Millisecond)
					defer cancel()
				}
				time.Sleep(time.Duration(c%11) * 7 * time.Millisecond) // arrivals spread in fake time
				k := fmt.Sprintf("k%d", c%keys)
				var lims []ratelimit.Limit
				switch c % 3 {
				case 0:
					lims = []ratelimit.Limit{win}
				case 1:
					lims = []ratelimit.Limit{bkt}
				default:
					lims = []ratelimit.Limit{bkt, win}
				}
				start := time.Now()
				d, err := b.Allow(ctx, k, 1, lims...)
				if err != nil {
					return
				}
				if time.Since(start) > timeout {
					slow.Add(1)
				}
				if d.Degraded {
					deg.Add(1)
				} else if d.Allowed {
					bad.Add(1)
				}
			})
		}
		wg.Wait()
		require.NoError(t, reg.Close(context.Background()))
		t.Logf("%d admitted not degraded, %d waited past SyncTimeout, %d degraded; %d window reads, %d bucket reads",
			bad.Load(), slow.Load(), deg.Load(), store.winReads.Load(), store.bktReads.Load())
		require.Zero(t, bad.Load())
		require.Zero(t, slow.Load())
	})
}
