package ratelimit_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit"
)

// TestTwoLimitsAtBoundary: Allow with a fixed window of 4 a second and a
// minute window (and, on the general path, a third limit), local mode, one
// key a round, four callers while the
// clock moves from the last millisecond of a second to the next. Each
// admitted call counts in one of the two seconds, each admitting at most
// 4: more than 8 admitted is over the limit. A rejected call's count was
// taken back from the newest window instead of its own, and about 1 round
// in 100 admitted 9 (found by review).
func TestTwoLimitsAtBoundary(t *testing.T) {
	const x = 1_700_000_000_000 // a second boundary
	var clock atomic.Int64
	reg := ratelimit.NewRegistry()
	t.Cleanup(func() { _ = reg.Close(context.Background()) })
	ns, err := reg.New(ratelimit.Config{Namespace: "bound", WindowSizes: []time.Duration{time.Second, time.Minute},
		SyncRate: -1, Clock: func() time.Time { return time.UnixMilli(clock.Load()) }})
	require.NoError(t, err)
	sec := ratelimit.Limit{Window: time.Second, Max: 4, Algorithm: ratelimit.FixedWindow}
	minute := ratelimit.Limit{Window: time.Minute, Max: 1 << 40}
	for _, c := range []struct {
		name   string
		limits []ratelimit.Limit
	}{
		{"lean", []ratelimit.Limit{sec, minute}},
		{"general", []ratelimit.Limit{sec, minute, {Window: time.Minute, Max: 1 << 41}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			over := 0
			for round := range 1500 {
				base := int64(x + round*2000)
				clock.Store(base - 1)
				key := fmt.Sprint(c.name, round)
				var admitted, n atomic.Int64
				var wg sync.WaitGroup
				for range 4 {
					wg.Go(func() {
						for range 30 {
							if n.Add(1) == 40 {
								clock.Store(base)
							}
							d, err := ns.Allow(context.Background(), key, 1, c.limits...)
							if err != nil {
								t.Error(err)
								return
							}
							if d.Allowed {
								admitted.Add(1)
							}
						}
					})
				}
				wg.Wait()
				if a := admitted.Load(); a > 8 {
					over++
					t.Logf("round %d: %d admitted across two seconds of Max 4", round, a)
				}
			}
			require.Zero(t, over, "rounds over the limit")
		})
	}
}
