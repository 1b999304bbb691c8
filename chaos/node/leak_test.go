package node

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit"
	"github.com/ratesync/ratelimit/strategy"
	"github.com/ratesync/ratelimit/strategy/memory"
)

// Scenario 9: no goroutine outlives Close, whatever state the store is in.
// Every test registers goleak first; run with -count=20 to shake out races.

const (
	leakWindow = 10 * time.Second
	// closeDeadline is the context deadline given to Close on a failing store;
	// closeSlack is how late after it Close may return (scheduling on a
	// loaded two-core CI machine, not logic).
	closeDeadline = 150 * time.Millisecond
	closeSlack    = 250 * time.Millisecond
)

var leakLimit = ratelimit.Limit{Window: leakWindow, Max: 1_000_000}

type storeCase struct {
	name    string
	store   func() strategy.Strategy
	healthy bool
}

func storeCases() []storeCase {
	down := func(f memory.Fault) func() strategy.Strategy {
		return func() strategy.Strategy {
			s := memory.New()
			s.SetFaults(func(memory.Op) memory.Fault { return f })
			return s
		}
	}
	return []storeCase{
		{name: "healthy", store: func() strategy.Strategy { return memory.New() }, healthy: true},
		{name: "down-refuse", store: down(memory.Refuse)},
		{name: "down-lost-request", store: down(memory.LoseRequest)},
		{name: "down-lost-reply", store: down(memory.LoseReply)},
		{name: "slow", store: func() strategy.Strategy { return newSlowStore() }},
	}
}

// hit counts n admitted hits of cost 1 for key.
func hit(t *testing.T, ns *ratelimit.Namespace, key string, n int) {
	t.Helper()
	for range n {
		d, err := ns.Allow(context.Background(), key, 1, leakLimit)
		require.NoError(t, err)
		require.True(t, d.Allowed)
	}
}

// closeWithin closes ns with a deadline and returns how long Close took and
// its error.
func closeWithin(ns interface {
	Close(context.Context) error
}, d time.Duration) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	start := time.Now()
	err := ns.Close(ctx)
	return time.Since(start), err
}

func TestCloseNoLeaks(t *testing.T) {
	modes := []struct {
		name     string
		syncRate time.Duration
	}{
		{"periodic", 5 * time.Millisecond},
		{"synchronous", 0},
		{"periodic-before-first-sync", time.Hour},
	}
	for _, sc := range storeCases() {
		for _, m := range modes {
			t.Run(sc.name+"/"+m.name, func(t *testing.T) {
				noLeaks(t)
				store := sc.store()
				reg := ratelimit.NewRegistry()
				ns, err := reg.New(ratelimit.Config{Namespace: "leak", WindowSizes: []time.Duration{leakWindow},
					SyncRate: m.syncRate, Strategy: store, SyncTimeout: 50 * time.Millisecond, RetryInterval: 5 * time.Millisecond})
				require.NoError(t, err)
				n := 25
				if m.syncRate == 0 && !sc.healthy {
					n = 3 // each waits SyncTimeout
				}
				hit(t, ns, "k", n)

				took, err := closeWithin(ns, closeDeadline)
				if sc.healthy {
					require.NoError(t, err)
					total, err := storeTotal(store, "leak", "k", leakWindow)
					require.NoError(t, err)
					assert.EqualValues(t, 25, total, "Close on a live store loses no hit")
				} else {
					require.ErrorIs(t, err, ratelimit.ErrStoreUnavailable)
					assert.Less(t, took, closeDeadline+closeSlack, "Close returns by its deadline")
				}
				// Idempotent: the same answer, at once; every later call is refused.
				_, err2 := closeWithin(ns, closeDeadline)
				assert.Equal(t, err, err2)
				_, err = ns.Allow(context.Background(), "k", 1, leakLimit)
				assert.ErrorIs(t, err, ratelimit.ErrClosed)
				assert.ErrorIs(t, ns.Sync(context.Background()), ratelimit.ErrClosed)
				_, err = ns.Increment(context.Background(), "k", leakWindow, 1)
				assert.ErrorIs(t, err, ratelimit.ErrClosed)
				if s, ok := store.(*slowStore); ok {
					s.Release()
				}
			})
		}
	}
}

// The loop's cycle is blocked in the store when Close is called.
func TestCloseDuringLoopSync(t *testing.T) {
	for _, release := range []bool{false, true} {
		name := map[bool]string{false: "store-stays-stuck", true: "store-recovers"}[release]
		t.Run(name, func(t *testing.T) {
			noLeaks(t)
			store := newSlowStore()
			defer store.Release()
			reg := ratelimit.NewRegistry()
			// ColdReadOff: with an hour's SyncTimeout, the first hit's cold
			// read would wait for the stuck store for that hour.
			ns, err := reg.New(ratelimit.Config{Namespace: "inflight", WindowSizes: []time.Duration{leakWindow},
				SyncRate: time.Millisecond, Strategy: store, SyncTimeout: time.Hour, ColdRead: ratelimit.ColdReadOff})
			require.NoError(t, err)
			hit(t, ns, "k", 10)
			<-store.entered // the loop's push is in flight, and waits for ever

			if !release {
				took, err := closeWithin(ns, closeDeadline)
				require.ErrorIs(t, err, ratelimit.ErrStoreUnavailable)
				assert.Less(t, took, closeDeadline+closeSlack)
				return
			}
			done := make(chan error, 1)
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				done <- ns.Close(ctx)
			}()
			store.Release()
			require.NoError(t, <-done)
			n, err := storeTotal(store.Store, "inflight", "k", leakWindow)
			require.NoError(t, err)
			assert.EqualValues(t, 10, n)
		})
	}
}

// A caller's own Sync is blocked in the store when Close is called: Close
// must still return by its deadline.
func TestCloseDuringCallerSync(t *testing.T) {
	noLeaks(t)
	store := newSlowStore()
	reg := ratelimit.NewRegistry()
	ns, err := reg.New(ratelimit.Config{Namespace: "callersync", WindowSizes: []time.Duration{leakWindow},
		SyncRate: time.Hour, Strategy: store, SyncTimeout: 2 * time.Second})
	require.NoError(t, err)
	hit(t, ns, "k", 10)
	syncDone := make(chan error, 1)
	go func() { syncDone <- ns.Sync(context.Background()) }()
	<-store.entered

	took, err := closeWithin(ns, closeDeadline)
	assert.ErrorIs(t, err, ratelimit.ErrStoreUnavailable)
	assert.Less(t, took, closeDeadline+closeSlack,
		"Close waits for a caller's Sync in flight instead of returning by its deadline")
	store.Release()
	<-syncDone // whatever it answers: the store came back after Close
}

func TestCloseConcurrent(t *testing.T) {
	noLeaks(t)
	store := memory.New()
	reg := ratelimit.NewRegistry()
	ns, err := reg.New(ratelimit.Config{Namespace: "concurrent", WindowSizes: []time.Duration{leakWindow},
		SyncRate: time.Millisecond, Strategy: store})
	require.NoError(t, err)
	hit(t, ns, "k", 40)
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for i := range errs {
		wg.Go(func() { _, errs[i] = closeWithin(ns, 5*time.Second) })
	}
	wg.Wait()
	for _, err := range errs {
		assert.NoError(t, err)
	}
	n, err := storeTotal(store, "concurrent", "k", leakWindow)
	require.NoError(t, err)
	assert.EqualValues(t, 40, n)
	require.NoError(t, reg.Close(context.Background()), "the registry forgot the closed namespace")
}

func TestRegistryCloseNoLeaks(t *testing.T) {
	noLeaks(t)
	store := memory.New()
	reg := ratelimit.NewRegistry()
	for i, rate := range []time.Duration{-1, 0, time.Millisecond, time.Hour} {
		ns, err := reg.New(ratelimit.Config{Namespace: string(rune('a' + i)), WindowSizes: []time.Duration{leakWindow},
			SyncRate: rate, Strategy: store})
		require.NoError(t, err)
		hit(t, ns, "k", 3)
	}
	_, err := closeWithin(reg, 5*time.Second)
	require.NoError(t, err)
	_, err = closeWithin(reg, 5*time.Second)
	require.NoError(t, err)
	_, err = reg.New(ratelimit.Config{Namespace: "late", WindowSizes: []time.Duration{leakWindow}, SyncRate: -1})
	assert.ErrorIs(t, err, ratelimit.ErrClosed)
}
