package shm

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit/strategy"
	"github.com/ratesync/ratelimit/strategy/memory"
)

// TestJudgedCallsAdmitTheLimitWhileSyncing: workers make judged calls on
// one key with a limit while a sync loop collects and settles pushes all
// the time. Nothing is evicted and the clock stands still, so exactly the
// limit is admitted, and the store ends with exactly the admitted hits.
// Mask 1 is one window size, mask 3 two; both admitted one call too many
// before Ack ordered negative diffs (found by review).
func TestJudgedCallsAdmitTheLimitWhileSyncing(t *testing.T) {
	for _, mask := range []uint8{1, 3} {
		t.Run(fmt.Sprint("mask", mask), func(t *testing.T) {
			for round := range 4 {
				tb := newTable(t, Options{Sizes: []time.Duration{time.Minute, time.Hour}, Track: true, Walk: round%2 == 1})
				st := memory.New()
				const now = 1_000_000
				const limit = 30000
				const workers, calls = 4, 15000
				judge := func(v [2]View) bool { return v[0].Cur <= limit }
				var admitted atomic.Int64
				var wg sync.WaitGroup
				for range workers {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for range calls {
							if _, ok, _, _ := tb.AddWindowsOpen("k", now, mask, [2]int64{1, 1}, false, false, true, judge); ok {
								admitted.Add(1)
							}
						}
					}()
				}
				stop := syncUntilStopped(t, tb, st, func() int64 { return now })
				wg.Wait()
				stop()
				var b Batch
				tb.collectAll(now, false, &b)
				settle(t, tb, st, &b, "final")
				got, err := st.GetWindow(context.Background(), "ns", strategy.CounterID{Key: "k", Size: time.Minute, Start: 960_000})
				require.NoError(t, err)
				require.Equal(t, admitted.Load(), got, "round %d: store holds the admitted hits", round)
				require.Equal(t, int64(limit), admitted.Load(), "round %d: admitted", round)
			}
		})
	}
}
