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

// TestCloseRacingIncrementEvictRotate (from a review): Increment's
// lock-free additions (values 1, -1 and 2^32, the largest lock-free one)
// race evictions (MaxKeys 8 for 16 keys), a clock that moves on by one
// and by two windows, syncs every millisecond, and Close. The store must
// hold, per key summed over windows, exactly what the calls that returned
// no error counted.
func TestCloseRacingIncrementEvictRotate(t *testing.T) {
	const workers, keys, rounds = 4, 16, 6
	const size = time.Second
	for round := range rounds {
		for _, cold := range []bool{false, true} {
			store := noPurge{memory.New()}
			start := int64(1_700_000_000_000)
			var clock atomic.Int64
			clock.Store(start)
			cfg := ratelimit.Config{Namespace: fmt.Sprint("rv", round), WindowSizes: []time.Duration{size}, MaxKeys: 8,
				SyncRate: time.Millisecond, PurgeInterval: 1000 * time.Hour, Strategy: store, Clock: func() time.Time { return time.UnixMilli(clock.Load()) }}
			if !cold {
				cfg.ColdRead = ratelimit.ColdReadOff
			}
			reg := ratelimit.NewRegistry()
			ns, err := reg.New(cfg)
			require.NoError(t, err)
			var counted [keys]atomic.Int64
			var calls, syncs atomic.Int64
			busy := make(chan struct{})
			var busyOnce sync.Once
			var wg sync.WaitGroup
			for w := range workers {
				wg.Go(func() {
					for i := 0; ; i++ {
						k := (w*7 + i) % keys
						if i%25 != 0 || calls.Load() >= 3000 {
							k %= 4 // hot keys, held and counted lock-free
						}
						v := int64(1)
						switch i % 11 {
						case 3:
							v = -1
						case 7:
							v = 1 << 32
						}
						switch m := i % 397; {
						case calls.Load() >= 3000:
						case m == 0:
							clock.Add(1000) // the next window
						case m == 200:
							clock.Add(2000) // two windows on
						}
						_, err := ns.Increment(context.Background(), fmt.Sprint("k", k), size, v)
						if errors.Is(err, ratelimit.ErrClosed) {
							return
						}
						if err != nil {
							t.Error(err)
							return
						}
						counted[k].Add(v)
						if calls.Add(1) >= 3000 && syncs.Load() >= 10 {
							busyOnce.Do(func() { close(busy) })
						}
					}
				})
			}
			stopSync := make(chan struct{})
			var sg sync.WaitGroup
			sg.Go(func() { // syncs race the calls and Close, as the loop's would
				for {
					select {
					case <-stopSync:
						return
					default:
					}
					if err := ns.Sync(context.Background()); err != nil && !errors.Is(err, ratelimit.ErrClosed) {
						t.Error(err)
						return
					}
					syncs.Add(1)
				}
			})
			<-busy
			require.NoError(t, reg.Close(context.Background()))
			wg.Wait()
			close(stopSync)
			sg.Wait()
			if round == 0 {
				t.Logf("cold %v: evictions %d, syncs %d, clock +%d", cold, ns.Stats().Evictions, syncs.Load(), clock.Load()-start)
			}
			require.Zero(t, ns.Stats().DroppedHits, "the test must stay within MaxRetired: %+v clock +%d", ns.Stats(), clock.Load()-start)
			for k := range keys {
				got := int64(0)
				for x := start; x <= clock.Load()+2000; x += 1000 {
					n, err := store.GetWindow(context.Background(), cfg.Namespace, strategy.CounterID{Key: fmt.Sprint("k", k), Size: size, Start: x})
					require.NoError(t, err)
					got += n
				}
				if counted[k].Load() != got {
					for x := start; x <= clock.Load()+2000; x += 1000 {
						n, _ := store.GetWindow(context.Background(), cfg.Namespace, strategy.CounterID{Key: fmt.Sprint("k", k), Size: size, Start: x})
						if n != 0 {
							t.Logf("window +%d: %d", x-start, n)
						}
					}
					t.Logf("clock +%d; stats %+v", clock.Load()-start, ns.Stats())
				}
				require.Equal(t, counted[k].Load(), got, "round %d cold %v key k%d", round, cold, k)
			}
		}
	}
}

// noPurge is a memory store that keeps every window: the test sums them.
type noPurge struct{ *memory.Store }

func (noPurge) Purge(context.Context, int64) error { return nil }
