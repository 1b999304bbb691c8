package ratelimit_test

import (
	"context"
	"iter"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit"
	"github.com/ratesync/ratelimit/strategy"
	"github.com/ratesync/ratelimit/strategy/memory"
)

// gatedReads answers a GetCounters with the store's state when it arrives,
// but, while armed, holds the answer until release is closed.
type gatedReads struct {
	strategy.Strategy
	mu      sync.Mutex
	release chan struct{}
}

func (s *gatedReads) arm() chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.release = make(chan struct{})
	return s.release
}

func (s *gatedReads) GetCounters(ctx context.Context, q strategy.Query) iter.Seq2[strategy.Counter, error] {
	s.mu.Lock()
	gate := s.release
	s.release = nil
	s.mu.Unlock()
	type res struct {
		c   strategy.Counter
		err error
	}
	var out []res
	for c, err := range s.Strategy.GetCounters(ctx, q) {
		out = append(out, res{c, err})
	}
	return func(yield func(strategy.Counter, error) bool) {
		if gate != nil {
			select {
			case <-gate:
			case <-ctx.Done():
				yield(strategy.Counter{}, ctx.Err())
				return
			}
		}
		for _, r := range out {
			if !yield(r.c, r.err) {
				return
			}
		}
	}
}

// A cold read sent late in window X lands after the key's entry moved to
// X+1 (a caller that stopped waiting counted there). LoadCold then drops
// the whole answer ("the read is stale"), although its total for X is
// exactly what the entry's previous window lacks (its synced count is still
// unknown). The key is now held, so no read follows: B judges the client
// without A's 5 hits of X until its next sync.
func TestColdReadLandsAfterRotation(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		lim := ratelimit.Limit{Window: time.Minute, Max: 5}
		store := &gatedReads{Strategy: memory.New()}
		clk := &fakeClock{t: minute.Add(50 * time.Second)}
		cfg := ratelimit.Config{WindowSizes: []time.Duration{time.Minute}, SyncRate: time.Hour,
			SyncTimeout: time.Hour, Strategy: store, Clock: clk.Now}
		regA, regB := ratelimit.NewRegistry(), ratelimit.NewRegistry()
		defer func() { _ = regA.Close(context.Background()); _ = regB.Close(context.Background()) }()
		a, err := regA.New(cfg)
		require.NoError(t, err)
		b, err := regB.New(cfg)
		require.NoError(t, err)
		spend(t, a, "client", 5, lim) // 5 hits in window X, in the store

		clk.Set(minute.Add(59 * time.Second))
		release := store.arm()
		first := make(chan ratelimit.Decision, 1)
		go func() {
			d, err := b.Allow(context.Background(), "client", 1, lim)
			require.NoError(t, err)
			first <- d
		}()
		synctest.Wait() // the read (at X+59s) waits at the gate

		clk.Set(minute.Add(61 * time.Second)) // window X+1
		cctx, cancel := context.WithCancel(context.Background())
		second := make(chan ratelimit.Decision, 1)
		go func() {
			d, err := b.Allow(cctx, "client", 1, lim)
			require.NoError(t, err)
			second <- d
		}()
		synctest.Wait() // waits for the same read
		cancel()        // and stops waiting: counted at X+1, Degraded
		d2 := <-second
		require.True(t, d2.Degraded)

		close(release)
		d1 := <-first
		require.False(t, d1.Degraded, "the read succeeded")
		// At X+61s the previous window (X, 5 hits) weighs 59/60: with the
		// second caller's hit the load is past 5 already.
		admitted := 0
		if d1.Allowed {
			admitted++
		}
		for range 5 {
			d, err := b.Allow(context.Background(), "client", 1, lim)
			require.NoError(t, err)
			if d.Allowed {
				admitted++
			}
		}
		require.Zero(t, admitted, "B admitted %d after a successful read that showed 5 hits in the previous window", admitted)
	})
}
