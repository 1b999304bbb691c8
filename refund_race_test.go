package ratelimit_test

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit"
)

// Refunds of admitted hits racing Allows, Increments, rejected Allows and
// sync pushes on one key: after a final sync the store holds exactly
// admitted + incremented - refunded, and the node's view agrees.
func TestRefundRaceStoreTotal(t *testing.T) {
	for _, mode := range []string{"sync", "async"} {
		for _, ls := range [][]ratelimit.Limit{
			{{Window: time.Minute, Max: 200}},
			{{Window: time.Minute, Max: 200}, {Window: time.Minute, Max: 300, Fixed: true}},
			{{Window: time.Minute, Max: 200}, {Window: time.Second, Max: 1000}},
		} {
			t.Run(mode, func(t *testing.T) {
				clk := newDecClock(decEpoch.Add(10 * time.Second))
				ns, store := newDecNS(t, mode, clk, time.Second, time.Minute)
				var admitted, refunded, incr atomic.Int64
				var wg sync.WaitGroup
				stop := make(chan struct{})
				for g := range 6 {
					wg.Go(func() {
						for i := range 400 {
							d, err := ns.Allow(ctx, "k", 1, ls...)
							require.NoError(t, err)
							if !d.Allowed {
								continue
							}
							admitted.Add(1)
							if (i+g)%3 != 0 {
								require.NoError(t, ns.Refund(ctx, "k", 1, ls...))
								refunded.Add(1)
							}
							if g == 0 && i%10 == 0 {
								_, err := ns.Increment(ctx, "k", time.Minute, 1)
								require.NoError(t, err)
								incr.Add(1)
							}
						}
					})
				}
				var sw sync.WaitGroup
				sw.Go(func() {
					for {
						select {
						case <-stop:
							return
						default:
							_ = ns.Sync(ctx)
						}
					}
				})
				wg.Wait()
				close(stop)
				sw.Wait()
				require.NoError(t, ns.Sync(ctx))
				want := admitted.Load() + incr.Load() - refunded.Load()
				got := revTotal(t, store, ns.Name(), "k", time.Minute, clk.Now())
				t.Logf("admitted %d incremented %d refunded %d store %d", admitted.Load(), incr.Load(), refunded.Load(), got)
				require.Equal(t, want, got)
				rate, err := ns.SlidingWindow(ctx, "k", time.Minute)
				require.NoError(t, err)
				require.EqualValues(t, want, rate)
			})
		}
	}
}

// Two limits sharing a window (sliding and fixed): one refund takes the
// cost back once.
func TestRefundSharedWindow(t *testing.T) {
	for _, mode := range decModes {
		t.Run(mode, func(t *testing.T) {
			clk := newDecClock(decEpoch.Add(10 * time.Second))
			ns, _ := newDecNS(t, mode, clk, time.Minute)
			ls := []ratelimit.Limit{{Window: time.Minute, Max: 5}, {Window: time.Minute, Max: 4, Fixed: true}}
			require.Equal(t, 3, allowed(t, ns, "k", 3, ls...))
			require.NoError(t, ns.Refund(ctx, "k", 2, ls...))
			require.Equal(t, 3, allowed(t, ns, "k", 9, ls...))
		})
	}
}
