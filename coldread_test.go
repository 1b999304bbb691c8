package ratelimit_test

import (
	"context"
	"fmt"
	"iter"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit"
	"github.com/ratesync/ratelimit/strategy"
	"github.com/ratesync/ratelimit/strategy/memory"
)

// readCountingStore counts GetCounters calls and the keys they asked for; when
// gate is not nil, every call waits for it to be closed (or for its context).
type readCountingStore struct {
	strategy.Strategy
	reads atomic.Int64
	keys  atomic.Int64
	gate  chan struct{}
}

func (s *readCountingStore) GetCounters(ctx context.Context, q strategy.Query) iter.Seq2[strategy.Counter, error] {
	s.reads.Add(1)
	s.keys.Add(int64(len(q.Keys)))
	if s.gate != nil {
		select {
		case <-s.gate:
		case <-ctx.Done():
			return func(yield func(strategy.Counter, error) bool) { yield(strategy.Counter{}, ctx.Err()) }
		}
	}
	return s.Strategy.GetCounters(ctx, q)
}

// twoNodes returns two periodic namespaces (A and B) sharing store, with a
// clock on a minute boundary. Their loops never fire during a test (SyncRate
// 1 h): the test syncs by hand.
func twoNodes(t *testing.T, store strategy.Strategy, cold ratelimit.ColdRead) (a, b *ratelimit.Namespace) {
	t.Helper()
	clk := &fakeClock{t: minute.Add(10 * time.Second)}
	cfg := ratelimit.Config{WindowSizes: []time.Duration{time.Minute}, SyncRate: time.Hour,
		Strategy: store, Clock: clk.Now, ColdRead: cold}
	return newNS(t, cfg), newNS(t, cfg)
}

// spend makes n admitted Allows of key on ns under lim and syncs ns.
func spend(t *testing.T, ns *ratelimit.Namespace, key string, n int, lim ratelimit.Limit) {
	t.Helper()
	for i := range n {
		d, err := ns.Allow(ctx, key, 1, lim)
		require.NoError(t, err)
		require.True(t, d.Allowed, "hit %d", i+1)
	}
	require.NoError(t, ns.Sync(ctx))
}

// allowed makes n Allows of key on ns under limits and returns how many
// were admitted.
func allowed(t *testing.T, ns *ratelimit.Namespace, key string, n int, limits ...ratelimit.Limit) int {
	t.Helper()
	admitted := 0
	for range n {
		d, err := ns.Allow(ctx, key, 1, limits...)
		require.NoError(t, err)
		if d.Allowed {
			admitted++
		}
	}
	return admitted
}

// The scenario: a client spends its 5 requests on node A, A syncs,
// and the client reaches node B, which has never seen it. B reads the key
// before judging it, and rejects.
func TestColdReadMovingClient(t *testing.T) {
	leakCheck(t)
	lim := ratelimit.Limit{Window: time.Minute, Max: 5}
	a, b := twoNodes(t, memory.New(), ratelimit.ColdReadOn)
	spend(t, a, "client", 5, lim)
	d, err := b.Allow(ctx, "client", 1, lim)
	require.NoError(t, err)
	require.False(t, d.Allowed, "B knows the client spent its budget on A")
	require.False(t, d.Degraded)
	require.Equal(t, int64(0), d.Remaining)
	// The key stays local: B's own hit and A's are both in B's view.
	rate, err := b.SlidingWindow(ctx, "client", time.Minute)
	require.NoError(t, err)
	require.Equal(t, 5.0, rate)
	// Increment and Peek read a cold key too.
	spend(t, a, "other", 5, lim)
	rate, err = b.Increment(ctx, "other", time.Minute, 1)
	require.NoError(t, err)
	require.Equal(t, 6.0, rate)
	spend(t, a, "third", 5, lim)
	d, err = b.Peek(ctx, "third", 1, lim)
	require.NoError(t, err)
	require.False(t, d.Allowed)
}

// ColdReadOff keeps the old behaviour: B judges a key it never saw from its
// own hits alone until a sync reads it.
func TestColdReadOff(t *testing.T) {
	leakCheck(t)
	lim := ratelimit.Limit{Window: time.Minute, Max: 5}
	store := &readCountingStore{Strategy: memory.New()}
	a, b := twoNodes(t, store, ratelimit.ColdReadOff)
	spend(t, a, "client", 5, lim)
	for i := range 5 {
		d, err := b.Allow(ctx, "client", 1, lim)
		require.NoError(t, err)
		require.True(t, d.Allowed, "hit %d on B: a fresh budget, as before", i+1)
	}
	require.Zero(t, store.reads.Load(), "no cold read")
	require.NoError(t, b.Sync(ctx))
	d, err := b.Allow(ctx, "client", 1, lim)
	require.NoError(t, err)
	require.False(t, d.Allowed, "after B's sync, B knows")
}

// Local and synchronous modes never make a cold read.
func TestColdReadOnlyPeriodic(t *testing.T) {
	leakCheck(t)
	lim := ratelimit.Limit{Window: time.Minute, Max: 5}
	store := &readCountingStore{Strategy: memory.New()}
	sync := newNS(t, ratelimit.Config{Namespace: "s", WindowSizes: []time.Duration{time.Minute}, Strategy: store})
	local := newNS(t, ratelimit.Config{Namespace: "l", WindowSizes: []time.Duration{time.Minute}, SyncRate: -1})
	for _, ns := range []*ratelimit.Namespace{sync, local} {
		d, err := ns.Allow(ctx, "k", 1, lim)
		require.NoError(t, err)
		require.True(t, d.Allowed)
	}
	require.Zero(t, store.reads.Load())
}

func TestColdReadConfig(t *testing.T) {
	reg := ratelimit.NewRegistry()
	_, err := reg.New(ratelimit.Config{WindowSizes: []time.Duration{time.Minute}, SyncRate: time.Second,
		Strategy: memory.New(), ColdRead: 7})
	require.ErrorIs(t, err, ratelimit.ErrInvalidConfig)
	require.ErrorContains(t, err, "ColdRead")
}

// outcomes counts the outcomes of concurrent decisions.
type outcomes struct{ admitted, degraded atomic.Int64 }

// allow makes one Allow of key on ns under l and counts its outcome.
func (o *outcomes) allow(t *testing.T, ns *ratelimit.Namespace, key string, l ratelimit.Limit) {
	d, err := ns.Allow(context.Background(), key, 1, l)
	if err != nil {
		t.Error(err)
	}
	if d.Allowed {
		o.admitted.Add(1)
	}
	if d.Degraded {
		o.degraded.Add(1)
	}
}

// Concurrent cold keys share round trips: while one read is in flight, every
// other cold key queues for the next one, so n keys cost two reads. Callers
// hitting the same cold key together read it once.
func TestColdReadCoalesces(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const n = 50
		lim := ratelimit.Limit{Window: time.Minute, Max: 3}
		mem := memory.New()
		store := &readCountingStore{Strategy: mem, gate: make(chan struct{})}
		reg := ratelimit.NewRegistry()
		defer func() { require.NoError(t, reg.Close(context.Background())) }()
		b, err := reg.New(ratelimit.Config{WindowSizes: []time.Duration{time.Minute}, SyncRate: time.Hour, Strategy: store})
		require.NoError(t, err)
		// Another node spent every key's budget.
		now := time.Now().UnixMilli()
		var diffs []strategy.Diff
		for i := range n {
			diffs = append(diffs, strategy.Diff{CounterID: strategy.CounterID{Key: fmt.Sprintf("k%d", i), Size: time.Minute,
				Start: strategy.WindowStart(now, time.Minute)}, Delta: 3})
		}
		_, err = mem.PushDiffs(context.Background(), &strategy.Batch{ID: "a-1", Namespace: "default", Diffs: diffs})
		require.NoError(t, err)

		var wg sync.WaitGroup
		var out outcomes
		for i := range n {
			for range 2 { // two callers per key
				wg.Go(func() { out.allow(t, b, fmt.Sprintf("k%d", i), lim) })
			}
		}
		synctest.Wait() // one read in flight, the other callers queued behind it
		require.Equal(t, int64(1), store.reads.Load())
		close(store.gate)
		wg.Wait()
		require.Equal(t, int64(2), store.reads.Load(), "%d cold keys, two reads", n)
		require.Equal(t, int64(n), store.keys.Load(), "each key read once")
		require.Zero(t, out.admitted.Load(), "every key was spent elsewhere")
		require.Zero(t, out.degraded.Load())
	})
}

// hangingStore never answers GetCounters: it returns when the call's context
// ends. Pushes work.
type hangingStore struct {
	strategy.Strategy
	reads atomic.Int64
}

func (s *hangingStore) GetCounters(ctx context.Context, q strategy.Query) iter.Seq2[strategy.Counter, error] {
	s.reads.Add(1)
	return func(yield func(strategy.Counter, error) bool) {
		<-ctx.Done()
		yield(strategy.Counter{}, ctx.Err())
	}
}

// A store that hangs: the cold decision returns by SyncTimeout, Degraded,
// with the hit counted (and later pushed). While reads fail, later cold keys
// do not wait at all; a read that succeeds again ends that.
func TestColdReadHangingStore(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const timeout = 50 * time.Millisecond
		lim := ratelimit.Limit{Window: time.Minute, Max: 5}
		mem := memory.New()
		store := &hangingStore{Strategy: mem}
		reg := ratelimit.NewRegistry()
		defer func() { require.NoError(t, reg.Close(context.Background())) }()
		ns, err := reg.New(ratelimit.Config{WindowSizes: []time.Duration{time.Minute}, SyncRate: time.Hour,
			Strategy: store, SyncTimeout: timeout})
		require.NoError(t, err)

		start := time.Now()
		d, err := ns.Allow(context.Background(), "k", 1, lim)
		require.NoError(t, err)
		require.True(t, d.Allowed)
		require.True(t, d.Degraded)
		require.Equal(t, timeout, time.Since(start), "waited SyncTimeout, no more")
		require.Equal(t, int64(4), d.Remaining, "the hit is counted")

		// The store is known to fail: the next cold key does not wait; its
		// read goes out as a probe in the background.
		start = time.Now()
		d, err = ns.Allow(context.Background(), "k2", 1, lim)
		require.NoError(t, err)
		require.True(t, d.Allowed && d.Degraded)
		require.Zero(t, time.Since(start))
		synctest.Wait()

		require.NoError(t, ns.Sync(context.Background()))
		got, err := mem.GetWindow(context.Background(), "default", strategy.CounterID{Key: "k", Size: time.Minute,
			Start: strategy.WindowStart(time.Now().UnixMilli(), time.Minute)})
		require.NoError(t, err)
		require.Equal(t, int64(1), got, "the degraded hit reached the store")
	})
}

// A caller's context bounds its wait too, and a cancelled caller does not
// mark the store as failing.
func TestColdReadCallerDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		lim := ratelimit.Limit{Window: time.Minute, Max: 5}
		mem := memory.New()
		store := &hangingStore{Strategy: mem}
		reg := ratelimit.NewRegistry()
		defer func() { require.NoError(t, reg.Close(context.Background())) }()
		ns, err := reg.New(ratelimit.Config{WindowSizes: []time.Duration{time.Minute}, SyncRate: time.Hour,
			Strategy: store, SyncTimeout: time.Second})
		require.NoError(t, err)
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
		defer cancel()
		start := time.Now()
		d, err := ns.Allow(cctx, "k", 1, lim)
		require.NoError(t, err)
		require.True(t, d.Allowed && d.Degraded)
		require.Equal(t, 10*time.Millisecond, time.Since(start))
		// The next cold key still waits for its read: its caller's deadline
		// said nothing about the store.
		start = time.Now()
		_, err = ns.Allow(context.Background(), "k2", 1, lim)
		require.NoError(t, err)
		require.Equal(t, time.Second, time.Since(start))
	})
}

// A key evicted and seen again is cold again: it is read again.
func TestColdReadAfterEviction(t *testing.T) {
	leakCheck(t)
	lim := ratelimit.Limit{Window: time.Minute, Max: 5}
	store := &readCountingStore{Strategy: memory.New()}
	clk := &fakeClock{t: minute.Add(10 * time.Second)}
	cfg := ratelimit.Config{Namespace: "b", WindowSizes: []time.Duration{time.Minute}, SyncRate: time.Hour,
		Strategy: store, Clock: clk.Now, MaxKeys: 1}
	b := newNS(t, cfg)
	cfg.Namespace, cfg.MaxKeys = "b", 0
	a := newNS(t, cfg) // a second node of namespace "b", in another registry
	_, err := b.Allow(ctx, "client", 1, lim)
	require.NoError(t, err)
	_, err = b.Allow(ctx, "evicts-client", 1, lim) // MaxKeys 1: "client" leaves B
	require.NoError(t, err)
	require.NoError(t, b.Sync(ctx))
	spend(t, a, "client", 4, lim) // A reads B's hit first: 1 + 4 = 5
	reads := store.reads.Load()
	d, err := b.Allow(ctx, "client", 1, lim)
	require.NoError(t, err)
	require.False(t, d.Allowed, "B read the key again")
	require.Equal(t, reads+1, store.reads.Load())
}

// Many goroutines hit keys that another node has counted, with eviction and
// syncs running, against a model: a mutex-guarded map of every hit counted.
// A cold key is never judged below the other node's total, and at the end
// every hit is in the store exactly once.
func TestColdReadConcurrentModel(t *testing.T) {
	t.Run("no eviction", func(t *testing.T) { coldReadModel(t, 40, true) })
	// Half the keys fit: keys are evicted and cold again all the time. A key
	// evicted between its read and its decision (a race the eviction hand
	// makes unlikely, not impossible) is judged from this node's hits until
	// the next sync, so only the totals are checked.
	t.Run("eviction", func(t *testing.T) { coldReadModel(t, 20, false) })
}

func coldReadModel(t *testing.T, maxKeys int, strict bool) {
	leakCheck(t)
	const keys, workers, hits = 40, 8, 300
	mem := memory.New()
	clk := &fakeClock{t: minute.Add(10 * time.Second)}
	cfg := ratelimit.Config{WindowSizes: []time.Duration{time.Minute}, SyncRate: time.Hour,
		Strategy: mem, Clock: clk.Now, MaxKeys: maxKeys}
	b := newNS(t, cfg)
	now := clk.Now().UnixMilli()
	pre := make([]int64, keys) // the other node's hits, already in the store
	var diffs []strategy.Diff
	for i := range keys {
		pre[i] = int64(10 + i)
		diffs = append(diffs, strategy.Diff{CounterID: strategy.CounterID{Key: fmt.Sprintf("k%d", i), Size: time.Minute,
			Start: strategy.WindowStart(now, time.Minute)}, Delta: pre[i]})
	}
	_, err := mem.PushDiffs(ctx, &strategy.Batch{ID: "other-1", Namespace: "default", Diffs: diffs})
	require.NoError(t, err)

	var below atomic.Int64 // decisions that judged a key below the store's total
	var mu sync.Mutex
	model := make([]int64, keys) // hits counted on B, per key (guarded by mu)
	var wg sync.WaitGroup
	stop := make(chan struct{})
	syncer := make(chan struct{})
	go func() { // syncs race with the cold reads
		defer close(syncer)
		for {
			select {
			case <-stop:
				return
			default:
				if err := b.Sync(ctx); err != nil {
					t.Error(err)
				}
			}
		}
	}()
	for w := range workers {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(w), 1))
			for range hits {
				k := r.IntN(keys)
				rate, err := b.Increment(ctx, fmt.Sprintf("k%d", k), time.Minute, 1)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				model[k]++
				mu.Unlock()
				if rate < float64(pre[k]+1) {
					below.Add(1)
				}
				if rate < float64(pre[k]+1) && strict {
					t.Errorf("k%d judged at %v, below the store's %d plus this hit", k, rate, pre[k])
				}
			}
		})
	}
	wg.Wait()
	close(stop)
	<-syncer
	require.NoError(t, b.Sync(ctx))
	st := b.Stats()
	t.Logf("%d of %d increments judged below the store's total; %d evictions, %d hits dropped",
		below.Load(), workers*hits, st.Evictions, st.DroppedHits)
	require.Zero(t, st.PendingHits)
	start := strategy.WindowStart(now, time.Minute)
	var counted, stored int64
	for k := range keys {
		got, err := mem.GetWindow(ctx, "default", strategy.CounterID{Key: fmt.Sprintf("k%d", k), Size: time.Minute, Start: start})
		require.NoError(t, err)
		counted += model[k]
		stored += got - pre[k]
		if st.DroppedHits == 0 {
			require.Equal(t, pre[k]+model[k], got, "k%d: every hit in the store once", k)
			rate, err := b.SlidingWindow(ctx, fmt.Sprintf("k%d", k), time.Minute)
			require.NoError(t, err)
			require.Equal(t, float64(pre[k]+model[k]), rate, "k%d: B's view", k)
		}
	}
	// With eviction, a burst of evictions while the syncs are starved of a
	// core (eight workers on two) can pass the retired records' cap: the
	// hits given up are counted, never lost silently, never doubled.
	require.Equal(t, counted, stored+st.DroppedHits, "every hit is in the store once, or counted as dropped")
	if strict {
		require.Zero(t, st.DroppedHits)
	}
}

// Close releases callers waiting for a cold read, whatever SyncTimeout says.
func TestColdReadCloseReleasesWaiters(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		lim := ratelimit.Limit{Window: time.Minute, Max: 5}
		reg := ratelimit.NewRegistry()
		ns, err := reg.New(ratelimit.Config{WindowSizes: []time.Duration{time.Minute}, SyncRate: time.Hour,
			Strategy: &hangingStore{Strategy: memory.New()}, SyncTimeout: time.Hour})
		require.NoError(t, err)
		var wg sync.WaitGroup
		for _, key := range []string{"leader", "follower", "follower"} {
			wg.Go(func() {
				d, err := ns.Allow(context.Background(), key, 1, lim)
				if err == nil && !d.Degraded {
					t.Errorf("%s: a cold read cut short by Close is degraded", key)
				}
			})
		}
		synctest.Wait()
		start := time.Now()
		require.NoError(t, reg.Close(context.Background()))
		wg.Wait()
		// At once: Close only polls the calls in flight (every 50 µs at first).
		require.Less(t, time.Since(start), time.Millisecond, "released at once")
	})
}
