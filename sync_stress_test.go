package ratelimit_test

import (
	"context"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit"
	"github.com/ratesync/ratelimit/strategy"
	"github.com/ratesync/ratelimit/strategy/memory"
)

// ledgerStore wraps a memory store: it keeps, per window, the net of every
// diff the store applied, and after the store answered it yields a random
// while, so that replies to concurrent pushes come back out of the order the
// store applied them in. Purge does nothing: with windows of a few
// milliseconds, a cycle's purge on a loaded machine can drop a window that
// a call assembled just before is still pushing to.
type ledgerStore struct {
	*memory.Store
	mu  sync.Mutex
	net map[strategy.CounterID]int64
}

func (l *ledgerStore) PushDiffs(ctx context.Context, b *strategy.Batch) (strategy.Result, error) {
	res, err := l.Store.PushDiffs(ctx, b)
	if err == nil {
		l.mu.Lock()
		for _, d := range b.Diffs {
			l.net[d.CounterID] += d.Delta
		}
		l.mu.Unlock()
	}
	for range rand.IntN(4) {
		runtime.Gosched()
	}
	if rand.IntN(8) == 0 {
		time.Sleep(time.Duration(rand.IntN(50)) * time.Microsecond)
	}
	return res, err
}

func (l *ledgerStore) Purge(context.Context, int64) error { return nil }

// Two synchronous-mode nodes, 8 goroutines each, hammer one key under a fixed
// limit of 3 per 20 ms (and, in "two-limits", a sliding limit of 40 a second
// too), with the store's replies reordered. Every 20 ms window of the store
// must end at most at 3, and the store must hold exactly the hits admitted
// (every rejected hit taken back once).
func TestSyncStressStoreTotalsWithinLimits(t *testing.T) {
	fixed := ratelimit.Limit{Window: 20 * time.Millisecond, Max: 3, Algorithm: ratelimit.FixedWindow}
	sliding := ratelimit.Limit{Window: time.Second, Max: 40}
	for _, c := range []struct {
		name   string
		limits []ratelimit.Limit
	}{{"fixed", []ratelimit.Limit{fixed}}, {"two-limits", []ratelimit.Limit{fixed, sliding}}} {
		t.Run(c.name, func(t *testing.T) {
			base := memory.New()
			ctx := context.Background()
			var stores []*ledgerStore
			var nodes []*ratelimit.Namespace
			for range 2 {
				ls := &ledgerStore{Store: base, net: make(map[strategy.CounterID]int64)}
				ns, err := ratelimit.NewRegistry().New(ratelimit.Config{Namespace: "stress",
					WindowSizes: []time.Duration{20 * time.Millisecond, time.Second},
					SyncRate:    0, Strategy: ls, ColdRead: ratelimit.ColdReadOff,
					// A push timing out on a loaded machine would be
					// decided from local state (Degraded), which this
					// test does not bound.
					SyncTimeout: time.Minute})
				require.NoError(t, err)
				stores, nodes = append(stores, ls), append(nodes, ns)
			}
			var admitted atomic.Int64
			deadline := time.Now().Add(500 * time.Millisecond)
			var wg sync.WaitGroup
			for _, ns := range nodes {
				for range 8 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for time.Now().Before(deadline) {
							d, err := ns.Allow(ctx, "k", 1, c.limits...)
							if err == nil && d.Allowed {
								admitted.Add(1)
							}
						}
					}()
				}
			}
			wg.Wait()
			for _, ns := range nodes {
				require.NoError(t, ns.Sync(ctx))
				st := ns.Stats()
				require.Zero(t, st.PendingHits, "hits left unpushed after Sync")
				require.Zero(t, st.DroppedHits)
				require.NoError(t, ns.Close(ctx))
			}
			net := map[strategy.CounterID]int64{}
			for _, ls := range stores {
				for id, n := range ls.net {
					net[id] += n
				}
			}
			var sum int64
			for id, n := range net {
				if id.Size == fixed.Window {
					sum += n
					if n > fixed.Max || n < 0 {
						t.Errorf("the window at %d ends at %d", id.Start, n)
					}
				}
			}
			require.Equal(t, admitted.Load(), sum, "hits in the store against hits admitted")
		})
	}
}
