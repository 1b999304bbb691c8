package store

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit"
	"github.com/ratesync/ratelimit/strategy"
)

// largestPush wraps a strategy and records the largest push it was sent.
type largestPush struct {
	strategy.Strategy
	largest atomic.Int64
}

func (l *largestPush) PushDiffs(ctx context.Context, b *strategy.Batch) (strategy.Result, error) {
	n := int64(len(b.Diffs) + len(b.Reads))
	for m := l.largest.Load(); n > m && !l.largest.CompareAndSwap(m, n); m = l.largest.Load() {
	}
	return l.Strategy.PushDiffs(ctx, b)
}

// Recovery after an outage (case 3 of the hostile-store issue): 20,000 keys
// counted on 1 s and 1 min windows (every other option at its default) while
// Redis is black-holed for 30 s. Once it answers again, every push respects
// the per-push cap and the node's pending hits reach 0 within 10 cycles.
// Before, the first push held 535,864 counters, timed out every cycle for 60
// s, and the pending hits grew from 0.87 M to 2.6 M.
func TestRecoveryAfterOutage(t *testing.T) {
	noLeaks(t)
	const keys = 20_000
	outage := pick(30*time.Second, 3*time.Second)
	b := redisBackend(t, redisAddr(t))
	st := &largestPush{Strategy: b.node()}
	reg := ratelimit.NewRegistry()
	ns, err := reg.New(ratelimit.Config{WindowSizes: []time.Duration{time.Second, time.Minute},
		SyncRate: refSyncRate, Strategy: st})
	require.NoError(t, err)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var counted atomic.Int64
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			k := fmt.Sprint("k", i%keys)
			for _, w := range []time.Duration{time.Second, time.Minute} {
				if _, err := ns.Increment(context.Background(), k, w, 1); err != nil {
					t.Errorf("Increment: %v", err)
					return
				}
			}
			counted.Add(2)
			if i%40 == 0 {
				time.Sleep(time.Millisecond) // about 20,000 keys a second
			}
		}
	})
	time.Sleep(time.Second) // every key active before the outage
	b.outage(true)
	time.Sleep(outage)
	during := ns.Stats()
	st.largest.Store(0)
	b.outage(false)
	close(stop)
	wg.Wait()
	syncs := ns.Stats().Syncs
	drained := pollUntil(60*time.Second, func() bool { return ns.Stats().PendingHits == 0 })
	after := ns.Stats()
	cycles := after.Syncs - syncs
	result(t, "%d keys on 1 s and 1 min windows, Redis black-holed for %v: pending at the end of the outage %d (%d retired windows, %d hits dropped); after recovery %d cycles to drain, largest push %d counters, %d hits dropped in all of %d",
		keys, outage, during.PendingHits, during.RetiredWindows, during.DroppedHits, cycles, st.largest.Load(), after.DroppedHits, counted.Load())
	require.True(t, drained, "pending hits did not drain in 60 s")
	require.LessOrEqual(t, cycles, int64(10), "cycles to drain after recovery")
	require.LessOrEqual(t, st.largest.Load(), int64(2*16384), "a push beyond the per-push cap")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	require.NoError(t, reg.Close(ctx))
}
