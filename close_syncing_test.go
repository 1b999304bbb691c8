package ratelimit_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit"
	"github.com/ratesync/ratelimit/strategy"
	"github.com/ratesync/ratelimit/strategy/memory"
)

// TestCloseLeanWhileSyncing: TestCloseRacingLeanPaths with a real limit
// (rejections, so counts are taken back) and a sync every millisecond
// (pushes settle under the lock-free additions of Increment), one-limit
// Allow and Increment racing Close. The store must hold exactly what was
// admitted (window) or counted (Increment), and no more than the limit.
func TestCloseLeanWhileSyncing(t *testing.T) {
	at := time.UnixMilli(1_700_000_000_000)
	window := ratelimit.Limit{Window: time.Hour, Max: 300}
	const workers, keys = 6, 3
	for _, mode := range []string{"cold-reads", "no-cold-reads"} {
		t.Run(mode, func(t *testing.T) {
			for round := range 5 {
				store := memory.New()
				cfg := ratelimit.Config{Namespace: fmt.Sprint("lean2-", round), WindowSizes: []time.Duration{time.Hour},
					SyncRate: time.Millisecond, Strategy: store, Clock: func() time.Time { return at }}
				if mode == "no-cold-reads" {
					cfg.ColdRead = ratelimit.ColdReadOff
				}
				reg := ratelimit.NewRegistry()
				ns, err := reg.New(cfg)
				require.NoError(t, err)
				var admitted [2][keys]atomic.Int64
				var calls atomic.Int64
				busy := make(chan struct{})
				var wg sync.WaitGroup
				for w := range workers {
					wg.Go(func() {
						for i := 0; ; i++ {
							kind, k := i%2, (w+i)%keys
							var d ratelimit.Decision
							var err error
							switch kind {
							case 0:
								d, err = ns.Allow(context.Background(), fmt.Sprint("k", k), 1, window)
							case 1:
								_, err = ns.Increment(context.Background(), fmt.Sprint("i", k), time.Hour, 1)
								d.Allowed = true
							}
							if errors.Is(err, ratelimit.ErrClosed) {
								return
							}
							if err != nil {
								t.Error(err)
								return
							}
							if d.Allowed {
								admitted[kind][k].Add(1)
							}
							if calls.Add(1) == 3000 {
								close(busy)
							}
						}
					})
				}
				<-busy
				require.NoError(t, reg.Close(context.Background()))
				wg.Wait()
				for k := range keys {
					for kind, prefix := range map[int]string{0: "k", 1: "i"} {
						n, err := store.GetWindow(context.Background(), cfg.Namespace, strategy.CounterID{Key: fmt.Sprint(prefix, k), Size: time.Hour, Start: strategy.WindowStart(at.UnixMilli(), time.Hour)})
						require.NoError(t, err)
						require.Equal(t, admitted[kind][k].Load(), n, "round %d key %s%d", round, prefix, k)
						if kind == 0 {
							require.LessOrEqual(t, n, window.Max, "round %d key %s%d: over the limit", round, prefix, k)
						}
					}
				}
			}
		})
	}
}
