package ratelimit_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/ratesync/ratelimit"
	"github.com/ratesync/ratelimit/strategy"
	"github.com/ratesync/ratelimit/strategy/memory"
)

var ctx = context.Background()

// fakeClock is a settable clock for tests that do not run in a synctest bubble.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Set(t time.Time) {
	c.mu.Lock()
	c.t = t
	c.mu.Unlock()
}

// minute is an instant on a minute boundary.
var minute = time.UnixMilli(1_700_000_040_000)

func newNS(t *testing.T, cfg ratelimit.Config) *ratelimit.Namespace {
	t.Helper()
	reg := ratelimit.NewRegistry()
	ns, err := reg.New(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = reg.Close(context.Background()) })
	return ns
}

func leakCheck(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
}

func TestWorkedExample(t *testing.T) {
	leakCheck(t)
	clk := &fakeClock{t: minute.Add(-30 * time.Second)}
	ns := newNS(t, ratelimit.Config{WindowSizes: []time.Duration{time.Minute}, SyncRate: -1, Clock: clk.Now})
	_, err := ns.Increment(ctx, "k", time.Minute, 40)
	require.NoError(t, err)
	clk.Set(minute.Add(30 * time.Second))
	rate, err := ns.Increment(ctx, "k", time.Minute, 10)
	require.NoError(t, err)
	require.Equal(t, 30.0, rate)
	clk.Set(minute.Add(45 * time.Second))
	rate, err = ns.SlidingWindow(ctx, "k", time.Minute)
	require.NoError(t, err)
	require.Equal(t, 20.0, rate)
	// A key with no previous window: the previous counts 0.
	rate, err = ns.Increment(ctx, "fresh", time.Minute, 10)
	require.NoError(t, err)
	require.Equal(t, 10.0, rate)
	require.Equal(t, 30.0, ratelimit.SlidingRate(10, 40, minute.Add(30*time.Second), time.Minute))
}

func TestRegistry(t *testing.T) {
	leakCheck(t)
	reg := ratelimit.NewRegistry()
	ns, err := reg.New(ratelimit.Config{WindowSizes: []time.Duration{time.Second}, SyncRate: -1})
	require.NoError(t, err)
	require.Equal(t, "default", ns.Name())
	_, err = reg.New(ratelimit.Config{Namespace: "default", WindowSizes: []time.Duration{time.Second}, SyncRate: -1})
	require.ErrorIs(t, err, ratelimit.ErrNamespaceExists)
	got, ok := reg.Namespace("")
	require.True(t, ok)
	require.Same(t, ns, got)
	_, ok = reg.Namespace("nope")
	require.False(t, ok)
	other, err := reg.New(ratelimit.Config{Namespace: "other", WindowSizes: []time.Duration{time.Second}, SyncRate: time.Second, Strategy: memory.New()})
	require.NoError(t, err)
	require.NoError(t, reg.Close(ctx))
	require.NoError(t, reg.Close(ctx), "Close is idempotent")
	_, err = other.Increment(ctx, "k", time.Second, 1)
	require.ErrorIs(t, err, ratelimit.ErrClosed)
	_, err = reg.New(ratelimit.Config{Namespace: "late", WindowSizes: []time.Duration{time.Second}, SyncRate: -1})
	require.ErrorIs(t, err, ratelimit.ErrClosed)
}

func TestConfigErrorsNameTheField(t *testing.T) {
	sec := []time.Duration{time.Second}
	for field, cfg := range map[string]ratelimit.Config{
		"WindowSizes":   {SyncRate: -1},
		"Strategy":      {WindowSizes: sec, SyncRate: time.Second},
		"SyncRate":      {WindowSizes: sec, SyncRate: time.Microsecond, Strategy: memory.New()},
		"MaxKeys":       {WindowSizes: sec, SyncRate: -1, MaxKeys: -1},
		"MaxKeyLength":  {WindowSizes: sec, SyncRate: -1, MaxKeyLength: 10},
		"SyncTimeout":   {WindowSizes: sec, SyncRate: -1, SyncTimeout: -1},
		"FetchScope":    {WindowSizes: sec, SyncRate: -1, FetchScope: 7},
		"WindowSizes ":  {WindowSizes: []time.Duration{time.Second, time.Second}, SyncRate: -1},
		"WindowSizes  ": {WindowSizes: []time.Duration{1500 * time.Microsecond}, SyncRate: -1},
	} {
		_, err := ratelimit.NewRegistry().New(cfg)
		require.ErrorIs(t, err, ratelimit.ErrInvalidConfig, field)
		require.Contains(t, err.Error(), strings.TrimSpace(field))
	}
}

func TestBadInput(t *testing.T) {
	leakCheck(t)
	ns := newNS(t, ratelimit.Config{WindowSizes: []time.Duration{time.Second, time.Minute, time.Hour}, SyncRate: -1})
	_, err := ns.Increment(ctx, "", time.Second, 1)
	require.ErrorIs(t, err, ratelimit.ErrInvalidKey)
	_, err = ns.SlidingWindow(ctx, "", time.Second)
	require.ErrorIs(t, err, ratelimit.ErrInvalidKey)
	_, err = ns.Increment(ctx, "k", 2*time.Second, 1)
	require.ErrorIs(t, err, ratelimit.ErrUnknownWindow)
	_, err = ns.Increment(ctx, "k", -time.Second, 1)
	require.ErrorIs(t, err, ratelimit.ErrUnknownWindow)
	_, err = ns.Increment(ctx, "k", time.Second, ratelimit.MaxValue+1)
	require.ErrorIs(t, err, ratelimit.ErrInvalidValue)
	_, err = ns.Increment(ctx, "k", time.Second, -ratelimit.MaxValue-1)
	require.ErrorIs(t, err, ratelimit.ErrInvalidValue)
	//lint:ignore SA1012 a nil context is the bad input under test
	_, err = ns.Increment(nil, "k", time.Second, 1) //nolint:staticcheck
	require.ErrorIs(t, err, ratelimit.ErrNilContext)

	// Over-long keys are hashed: distinct keys stay distinct, equal ones equal.
	long1 := strings.Repeat("a", 10_000) + "1"
	long2 := strings.Repeat("a", 10_000) + "2"
	r, err := ns.Increment(ctx, long1, time.Hour, 5)
	require.NoError(t, err)
	require.Equal(t, 5.0, r)
	r, err = ns.Increment(ctx, long2, time.Hour, 1)
	require.NoError(t, err)
	require.Equal(t, 1.0, r)
	r, err = ns.SlidingWindow(ctx, long1, time.Hour)
	require.NoError(t, err)
	require.Equal(t, 5.0, r)
	// NUL bytes and invalid UTF-8 are just bytes.
	r, err = ns.Increment(ctx, "a\x00\xff", time.Minute, 2)
	require.NoError(t, err)
	require.Equal(t, 2.0, r)

	require.NoError(t, ns.Close(ctx))
	_, err = ns.Increment(ctx, "k", time.Second, 1)
	require.ErrorIs(t, err, ratelimit.ErrClosed)
	_, err = ns.SlidingWindow(ctx, "k", time.Second)
	require.ErrorIs(t, err, ratelimit.ErrClosed)
	require.ErrorIs(t, ns.Sync(ctx), ratelimit.ErrClosed)
	require.ErrorIs(t, ns.Fetch(ctx, time.Now()), ratelimit.ErrClosed)
}

func TestNegativeIncrementAndManySizes(t *testing.T) {
	clk := &fakeClock{t: minute}
	ns := newNS(t, ratelimit.Config{WindowSizes: []time.Duration{time.Second, time.Minute, time.Hour}, SyncRate: -1, Clock: clk.Now})
	for _, w := range []time.Duration{time.Second, time.Minute, time.Hour} {
		_, err := ns.Increment(ctx, "k", w, 5)
		require.NoError(t, err)
		r, err := ns.Increment(ctx, "k", w, -2)
		require.NoError(t, err)
		require.Equal(t, 3.0, r, w)
	}
}

// multiNode makes n registries sharing one store.
func multiNode(t *testing.T, n int, cfg ratelimit.Config) []*ratelimit.Namespace {
	t.Helper()
	nodes := make([]*ratelimit.Namespace, n)
	for i := range nodes {
		reg := ratelimit.NewRegistry()
		ns, err := reg.New(cfg)
		require.NoError(t, err)
		nodes[i] = ns
		t.Cleanup(func() { _ = reg.Close(context.Background()) })
	}
	return nodes
}

func TestMultiNodeConverges(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.New()
		nodes := multiNode(t, 3, ratelimit.Config{WindowSizes: []time.Duration{time.Minute, time.Hour}, SyncRate: 50 * time.Millisecond, Strategy: store})
		keys := []string{"alice", "bob", "carol", "dave"}
		want := map[string]int{}
		for i := range 300 {
			key := keys[i%len(keys)]
			_, err := nodes[i%3].Increment(ctx, key, time.Minute, 1)
			require.NoError(t, err)
			_, err = nodes[i%3].Increment(ctx, key, time.Hour, 1)
			require.NoError(t, err)
			want[key]++
			if i%50 == 0 {
				time.Sleep(20 * time.Millisecond) // let the loops run mid-traffic
			}
		}
		// Every node pushes, then every node fetches.
		for _, n := range nodes {
			require.NoError(t, n.Sync(ctx))
		}
		for _, n := range nodes {
			require.NoError(t, n.Fetch(ctx, time.Now()))
		}
		for _, n := range nodes {
			for key, w := range want {
				for _, size := range []time.Duration{time.Minute, time.Hour} {
					r, err := n.SlidingWindow(ctx, key, size)
					require.NoError(t, err)
					require.InDelta(t, float64(w), r, 1e-9, "%s %v", key, size)
				}
			}
		}
	})
}

func TestMultiNodeConvergesByTheLoopAlone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.New()
		nodes := multiNode(t, 3, ratelimit.Config{WindowSizes: []time.Duration{time.Hour}, SyncRate: 50 * time.Millisecond, Strategy: store})
		for i := range 90 {
			_, err := nodes[i%3].Increment(ctx, "k", time.Hour, 1)
			require.NoError(t, err)
		}
		// A node that only reads a key converges too.
		reader := multiNode(t, 1, ratelimit.Config{WindowSizes: []time.Duration{time.Hour}, SyncRate: 50 * time.Millisecond, Strategy: store})[0]
		all := append(nodes, reader)
		// A cycle reads the keys used since the one before: every node uses
		// the key, and the next cycles bring it the cluster's total.
		for _, n := range all {
			_, err := n.SlidingWindow(ctx, "k", time.Hour)
			require.NoError(t, err)
		}
		time.Sleep(120 * time.Millisecond) // two cycles of fake time
		for _, n := range all {
			r, err := n.SlidingWindow(ctx, "k", time.Hour)
			require.NoError(t, err)
			require.Equal(t, 90.0, r)
		}
	})
}

// recordingStore wraps a store and records when pushes start and how many run at once.
type recordingStore struct {
	strategy.Strategy
	delay    time.Duration
	check    func(*strategy.Batch, strategy.Result) // called after each successful push
	mu       sync.Mutex
	starts   []time.Time
	inflight int
	maxIn    int
}

func (s *recordingStore) PushDiffs(ctx context.Context, b *strategy.Batch) (strategy.Result, error) {
	s.mu.Lock()
	s.starts = append(s.starts, time.Now())
	s.inflight++
	s.maxIn = max(s.maxIn, s.inflight)
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.inflight--
		s.mu.Unlock()
	}()
	if s.delay > 0 {
		select {
		case <-time.After(s.delay):
		case <-ctx.Done():
			return strategy.Result{}, ctx.Err()
		}
	}
	res, err := s.Strategy.PushDiffs(ctx, b)
	if err == nil && s.check != nil {
		s.check(b, res)
	}
	return res, err
}

func TestSyncTicksAlignAndDoNotPileUp(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		time.Sleep(17 * time.Millisecond) // start off a boundary
		rec := &recordingStore{Strategy: memory.New()}
		ns := newNS(t, ratelimit.Config{WindowSizes: []time.Duration{time.Minute}, SyncRate: 100 * time.Millisecond, Strategy: rec})
		for range 5 {
			_, err := ns.Increment(ctx, "k", time.Minute, 1)
			require.NoError(t, err)
			time.Sleep(100 * time.Millisecond)
		}
		rec.mu.Lock()
		require.NotEmpty(t, rec.starts)
		for _, s := range rec.starts {
			require.Zero(t, s.UnixNano()%int64(100*time.Millisecond), "tick at %v is not on a SyncRate boundary", s)
		}
		rec.mu.Unlock()

		// A store slower than SyncRate: cycles never overlap.
		slow := &recordingStore{Strategy: memory.New(), delay: 250 * time.Millisecond}
		ns2 := newNS(t, ratelimit.Config{Namespace: "slow", WindowSizes: []time.Duration{time.Minute}, SyncRate: 100 * time.Millisecond, Strategy: slow})
		for range 20 {
			_, err := ns2.Increment(ctx, "k", time.Minute, 1)
			require.NoError(t, err)
			time.Sleep(50 * time.Millisecond)
		}
		slow.mu.Lock()
		require.Equal(t, 1, slow.maxIn, "at most one sync in flight")
		require.LessOrEqual(t, len(slow.starts), 5, "a 250 ms push re-arms the 100 ms ticker after it ends")
		slow.mu.Unlock()
	})
}

func TestLocalModeStartsNoGoroutine(t *testing.T) {
	leakCheck(t)
	reg := ratelimit.NewRegistry()
	ns, err := reg.New(ratelimit.Config{WindowSizes: []time.Duration{time.Second}, SyncRate: -1})
	require.NoError(t, err)
	// goleak.VerifyNone would fail here if the namespace had started a loop.
	require.NoError(t, goleak.Find())
	_, err = ns.Increment(ctx, "k", time.Second, 1)
	require.NoError(t, err)
	require.NoError(t, ns.Sync(ctx))
	require.NoError(t, reg.Close(ctx))
}

func TestSynchronousModeWritesThrough(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.New()
		nodes := multiNode(t, 2, ratelimit.Config{WindowSizes: []time.Duration{time.Minute}, SyncRate: 0, Strategy: store})
		r, err := nodes[0].Increment(ctx, "k", time.Minute, 3)
		require.NoError(t, err)
		require.Equal(t, 3.0, r)
		pushes := store.Pushes()
		r, err = nodes[1].Increment(ctx, "k", time.Minute, 2)
		require.NoError(t, err)
		require.Equal(t, 5.0, r, "the other node's hits are visible at once")
		require.Equal(t, pushes+1, store.Pushes(), "one round trip per Increment")
		r, err = nodes[0].SlidingWindow(ctx, "k", time.Minute)
		require.NoError(t, err)
		require.Equal(t, 5.0, r, "a read goes through to the store")

		// The store fails: answers come from local state, flagged; hits are kept.
		store.SetFaults(func(memory.Op) memory.Fault { return memory.LoseReply })
		r, err = nodes[0].Increment(ctx, "k", time.Minute, 1)
		require.ErrorIs(t, err, ratelimit.ErrStoreUnavailable)
		require.Equal(t, 6.0, r)
		store.SetFaults(func(memory.Op) memory.Fault { return memory.Refuse })
		r, err = nodes[0].Increment(ctx, "k", time.Minute, 1)
		require.ErrorIs(t, err, ratelimit.ErrStoreUnavailable)
		require.Equal(t, 7.0, r)
		store.SetFaults(nil)
		time.Sleep(1100 * time.Millisecond) // the retry loop runs every RetryInterval (1 s)
		n, err := store.GetWindow(ctx, "default", strategy.CounterID{Key: "k", Size: time.Minute, Start: ratelimit.WindowStart(time.Now(), time.Minute).UnixMilli()})
		require.NoError(t, err)
		require.Equal(t, int64(7), n, "the lost reply was applied once, the refused hit pushed later")
	})
}

func TestFaultyStoreLosesAndDoublesNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.New()
		faultsInTurn(store)
		nodes := multiNode(t, 3, ratelimit.Config{WindowSizes: []time.Duration{time.Hour}, SyncRate: 10 * time.Millisecond, Strategy: store, MaxBackoff: 40 * time.Millisecond})
		for i := range 600 {
			_, _ = nodes[i%3].Increment(ctx, fmt.Sprintf("k%d", i%7), time.Hour, 1)
			if i%10 == 0 {
				time.Sleep(7 * time.Millisecond)
			}
		}
		store.SetFaults(nil)
		for _, node := range nodes {
			require.NoError(t, node.Close(ctx))
		}
		total := int64(0)
		start := ratelimit.WindowStart(time.Now(), time.Hour).UnixMilli()
		for k := range 7 {
			c, err := store.GetWindow(ctx, "default", strategy.CounterID{Key: fmt.Sprintf("k%d", k), Size: time.Hour, Start: start})
			require.NoError(t, err)
			total += c
		}
		require.Equal(t, int64(600), total)
	})
}

func TestFetchScopes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.New()
		writer := multiNode(t, 1, ratelimit.Config{WindowSizes: []time.Duration{time.Hour}, SyncRate: time.Hour, Strategy: store})[0]
		for i := range 10 {
			_, err := writer.Increment(ctx, fmt.Sprintf("k%d", i), time.Hour, 1)
			require.NoError(t, err)
		}
		require.NoError(t, writer.Sync(ctx))

		seen := multiNode(t, 1, ratelimit.Config{Namespace: "default", WindowSizes: []time.Duration{time.Hour}, SyncRate: time.Hour, Strategy: store})[0]
		require.NoError(t, seen.Fetch(ctx, time.Now()))
		require.Zero(t, seen.Stats().TrackedKeys, "FetchSeen pulls nothing this node has not seen")
		_, err := seen.SlidingWindow(ctx, "k3", time.Hour)
		require.NoError(t, err)
		require.NoError(t, seen.Fetch(ctx, time.Now()))
		require.Equal(t, 1, seen.Stats().TrackedKeys)
		r, err := seen.SlidingWindow(ctx, "k3", time.Hour)
		require.NoError(t, err)
		require.Equal(t, 1.0, r)

		all := multiNode(t, 1, ratelimit.Config{WindowSizes: []time.Duration{time.Hour}, SyncRate: time.Hour, Strategy: store, FetchScope: ratelimit.FetchAll})[0]
		require.NoError(t, all.Fetch(ctx, time.Now()))
		require.Equal(t, 10, all.Stats().TrackedKeys)
	})
}

func TestCloseFlushes(t *testing.T) {
	leakCheck(t)
	store := memory.New()
	reg := ratelimit.NewRegistry()
	ns, err := reg.New(ratelimit.Config{WindowSizes: []time.Duration{time.Hour}, SyncRate: time.Hour, Strategy: store})
	require.NoError(t, err)
	for range 42 {
		_, err := ns.Increment(ctx, "k", time.Hour, 1)
		require.NoError(t, err)
	}
	require.NoError(t, ns.Close(ctx))
	require.NoError(t, ns.Close(ctx))
	c, err := store.GetWindow(ctx, "default", strategy.CounterID{Key: "k", Size: time.Hour, Start: ratelimit.WindowStart(time.Now(), time.Hour).UnixMilli()})
	require.NoError(t, err)
	require.Equal(t, int64(42), c)
	_, ok := reg.Namespace("default")
	require.False(t, ok, "a closed namespace leaves its registry")
}

func TestCloseOnDeadStoreReturnsByDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.New()
		store.SetFaults(func(memory.Op) memory.Fault { return memory.LoseRequest })
		reg := ratelimit.NewRegistry()
		ns, err := reg.New(ratelimit.Config{WindowSizes: []time.Duration{time.Hour}, SyncRate: 100 * time.Millisecond, Strategy: store})
		require.NoError(t, err)
		_, err = ns.Increment(ctx, "k", time.Hour, 1)
		require.NoError(t, err)
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		start := time.Now()
		err = ns.Close(cctx)
		require.ErrorIs(t, err, ratelimit.ErrStoreUnavailable)
		require.LessOrEqual(t, time.Since(start), 2*time.Second)
	})
}

func TestSyncErrorsMatchSentinel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.New()
		ns := newNS(t, ratelimit.Config{WindowSizes: []time.Duration{time.Hour}, SyncRate: time.Hour, Strategy: store})
		_, err := ns.Increment(ctx, "k", time.Hour, 1)
		require.NoError(t, err)
		store.SetFaults(func(memory.Op) memory.Fault { return memory.Refuse })
		err = ns.Sync(ctx)
		require.ErrorIs(t, err, ratelimit.ErrStoreUnavailable)
		require.ErrorIs(t, err, memory.ErrInjected)
		require.True(t, errors.Is(err, strategy.ErrNotApplied))
		store.SetFaults(nil)
		require.NoError(t, ns.Sync(ctx))
		r, err := ns.SlidingWindow(ctx, "k", time.Hour)
		require.NoError(t, err)
		require.Equal(t, 1.0, r)
	})
}

func TestSynchronousModeConcurrentFaults(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := memory.New()
		// A push takes 2 ms of fake time, so write-throughs are in flight
		// while the retry loop collects.
		store := &recordingStore{Strategy: mem, delay: 2 * time.Millisecond}
		// No total may ever exceed the hits issued for its key: a hit pushed
		// twice would show here even if a later negative diff undid it.
		var issued [5]atomic.Int64
		store.check = func(b *strategy.Batch, res strategy.Result) {
			for i, d := range b.Diffs {
				var k int
				fmt.Sscanf(d.Key, "k%d", &k)
				if res.Totals[i] > issued[k].Load() {
					t.Errorf("%s: store total %d exceeds the %d hits issued", d.Key, res.Totals[i], issued[k].Load())
				}
			}
		}
		faultsInTurn(mem)
		nodes := multiNode(t, 2, ratelimit.Config{WindowSizes: []time.Duration{time.Hour}, SyncRate: 0, Strategy: store,
			RetryInterval: 5 * time.Millisecond, MaxBackoff: 20 * time.Millisecond})
		var wg sync.WaitGroup
		for g := range 4 {
			wg.Go(func() {
				for i := range 200 {
					issued[i%5].Add(1)
					_, err := nodes[g%2].Increment(ctx, fmt.Sprintf("k%d", i%5), time.Hour, 1)
					if err != nil && !errors.Is(err, ratelimit.ErrStoreUnavailable) {
						t.Error(err)
					}
					if i%20 == 0 {
						time.Sleep(3 * time.Millisecond) // let the retry loops run between write-throughs
					}
				}
			})
		}
		wg.Wait()
		mem.SetFaults(nil)
		for _, node := range nodes {
			require.NoError(t, node.Close(ctx))
		}
		start := ratelimit.WindowStart(time.Now(), time.Hour).UnixMilli()
		total := int64(0)
		for k := range 5 {
			c, err := mem.GetWindow(ctx, "default", strategy.CounterID{Key: fmt.Sprintf("k%d", k), Size: time.Hour, Start: start})
			require.NoError(t, err)
			total += c
		}
		require.Equal(t, int64(800), total, "every write-through applied exactly once")
	})
}

func TestAsyncDecisionsDegradedWhileStoreFails(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.New()
		ns := newNS(t, ratelimit.Config{WindowSizes: []time.Duration{time.Minute}, SyncRate: 100 * time.Millisecond, Strategy: store})
		lim := ratelimit.Limit{Window: time.Minute, Max: 100}
		d, err := ns.Allow(ctx, "k", 1, lim)
		require.NoError(t, err)
		require.False(t, d.Degraded)
		store.SetFaults(func(memory.Op) memory.Fault { return memory.Refuse })
		time.Sleep(150 * time.Millisecond) // a cycle fails
		d, err = ns.Allow(ctx, "k", 1, lim)
		require.NoError(t, err)
		require.True(t, d.Allowed)
		require.True(t, d.Degraded)
		store.SetFaults(nil)
		time.Sleep(5 * time.Second) // past the backoff: a cycle succeeds
		d, err = ns.Allow(ctx, "k", 1, lim)
		require.NoError(t, err)
		require.False(t, d.Degraded)
		require.Equal(t, 3.0, mustRate(t, ns, "k"))
	})
}

func mustRate(t *testing.T, ns *ratelimit.Namespace, key string) float64 {
	t.Helper()
	r, err := ns.SlidingWindow(ctx, key, time.Minute)
	require.NoError(t, err)
	return r
}

func TestEvictionPressureTriggersASync(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.New()
		ns := newNS(t, ratelimit.Config{WindowSizes: []time.Duration{time.Minute}, SyncRate: time.Hour, Strategy: store, MaxKeys: 1024})
		for i := range 5000 {
			_, err := ns.Increment(ctx, fmt.Sprintf("flood-%d", i), time.Minute, 1)
			require.NoError(t, err)
			if i%500 == 0 {
				synctest.Wait() // let a triggered cycle run
			}
		}
		synctest.Wait()
		st := ns.Stats()
		require.Positive(t, st.Syncs, "evictions outran the hour-long SyncRate: the loop synced early")
		require.Less(t, st.RetiredWindows, 1024, "the early syncs pushed the evicted keys' hits")
		require.NoError(t, ns.Close(ctx))
		require.Equal(t, 5000, store.Len(), "every evicted key's hit reached the store")
	})
}

func TestStatsPendingHitsInPeriodicMode(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.New()
		ns := newNS(t, ratelimit.Config{WindowSizes: []time.Duration{time.Minute}, SyncRate: time.Hour, Strategy: store})
		store.SetFaults(func(memory.Op) memory.Fault { return memory.Refuse })
		for i := range 7 {
			_, err := ns.Increment(ctx, fmt.Sprintf("k%d", i%3), time.Minute, 1)
			require.NoError(t, err)
		}
		require.Error(t, ns.Sync(ctx))
		require.Equal(t, int64(7), ns.Stats().PendingHits, "the store confirmed none")
		store.SetFaults(nil)
		require.NoError(t, ns.Sync(ctx))
		require.Zero(t, ns.Stats().PendingHits)
	})
}

// faultsInTurn makes store inject every kind of fault in turn, one per
// operation (the first operation gets the fault numbered 1).
func faultsInTurn(store *memory.Store) {
	var mu sync.Mutex
	n := 0
	store.SetFaults(func(memory.Op) memory.Fault {
		mu.Lock()
		defer mu.Unlock()
		n++
		return memory.Fault(n % 4)
	})
}
