package ratelimit_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit"
	"github.com/ratesync/ratelimit/strategy"
	"github.com/ratesync/ratelimit/strategy/memory"
)

// This file holds the tests of promises a hostile store once broke: each
// failed on the code before its fix.

// countingStore wraps a memory store: it fails the pushes whose number (from
// 1) fail returns a fault for, and records the largest push it was sent.
type countingStore struct {
	*memory.Store
	mu       sync.Mutex
	pushes   int
	largest  int
	failWith func(n int) memory.Fault
}

func newCountingStore(failWith func(n int) memory.Fault) *countingStore {
	s := &countingStore{Store: memory.New(), failWith: failWith}
	s.Store.SetFaults(func(op memory.Op) memory.Fault {
		if op != memory.OpPush {
			return memory.NoFault
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		s.pushes++
		if s.failWith == nil {
			return memory.NoFault
		}
		return s.failWith(s.pushes)
	})
	return s
}

func (s *countingStore) PushDiffs(ctx context.Context, b *strategy.Batch) (strategy.Result, error) {
	s.mu.Lock()
	s.largest = max(s.largest, len(b.Diffs)+len(b.Reads))
	s.mu.Unlock()
	return s.Store.PushDiffs(ctx, b)
}

func (s *countingStore) setFail(f func(n int) memory.Fault) {
	s.mu.Lock()
	s.failWith, s.pushes = f, 0
	s.mu.Unlock()
}

func (s *countingStore) largestPush() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.largest
}

// storeSum adds the store's totals of keys over both windows of size at now.
func storeSum(t *testing.T, s strategy.Strategy, ns string, size time.Duration, now time.Time, keys []string) int64 {
	t.Helper()
	var sum int64
	for c, err := range s.GetCounters(ctx, strategy.Query{Namespace: ns, Sizes: []time.Duration{size}, Now: now.UnixMilli(), Keys: keys}) {
		require.NoError(t, err)
		sum += c.Count
	}
	return sum
}

func keyNames(prefix string, n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = prefix + strconv.Itoa(i)
	}
	return keys
}

// A push that is not the cycle's last fails: the next Sync must still push
// every hit before it returns nil, and so must Close. (Before the fix the
// collect cursor stayed mid-table and the next cycle skipped the shards
// before it.)
func TestSyncAfterAFailedChunkPushesEverything(t *testing.T) {
	leakCheck(t)
	for name, fault := range map[string]memory.Fault{"refused": memory.Refuse, "lost request": memory.LoseRequest, "lost reply": memory.LoseReply} {
		t.Run(name, func(t *testing.T) {
			clk := &fakeClock{t: minute.Add(time.Second)}
			store := newCountingStore(nil)
			reg := ratelimit.NewRegistry()
			ns, err := reg.New(ratelimit.Config{WindowSizes: []time.Duration{time.Minute, time.Hour},
				SyncRate: time.Hour, Strategy: store, Clock: clk.Now})
			require.NoError(t, err)
			keys := keyNames("k", 12_000)
			hitAll := func() {
				for _, k := range keys {
					_, err := ns.Increment(ctx, k, time.Minute, 1)
					require.NoError(t, err)
					_, err = ns.Increment(ctx, k, time.Hour, 1)
					require.NoError(t, err)
				}
			}
			hitAll()
			// The cycle needs two pushes (24,000 counters over 16,384): the
			// second fails.
			store.setFail(func(n int) memory.Fault {
				if n == 2 {
					return fault
				}
				return memory.NoFault
			})
			require.Error(t, ns.Sync(ctx))
			require.NoError(t, ns.Sync(ctx))
			require.Equal(t, int64(12_000), storeSum(t, store, ns.Name(), time.Minute, clk.Now(), keys),
				"Sync returned nil with hits unpushed")
			require.Equal(t, int64(12_000), storeSum(t, store, ns.Name(), time.Hour, clk.Now(), keys),
				"Sync returned nil with hits unpushed")
			require.Zero(t, ns.Stats().PendingHits)

			// The same at Close: the first flush attempt fails mid-table.
			hitAll()
			store.setFail(func(n int) memory.Fault {
				if n == 2 {
					return fault
				}
				return memory.NoFault
			})
			cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			require.NoError(t, reg.Close(cctx))
			require.Equal(t, int64(24_000), storeSum(t, store, ns.Name(), time.Minute, clk.Now(), keys),
				"Close returned nil with hits unpushed")
			require.Equal(t, int64(24_000), storeSum(t, store, ns.Name(), time.Hour, clk.Now(), keys),
				"Close returned nil with hits unpushed")
		})
	}
}

// Close that cannot push everything says how many hits it could not push.
func TestCloseReportsUnpushedHits(t *testing.T) {
	leakCheck(t)
	clk := &fakeClock{t: minute.Add(time.Second)}
	store := newCountingStore(func(int) memory.Fault { return memory.Refuse })
	reg := ratelimit.NewRegistry()
	ns, err := reg.New(ratelimit.Config{WindowSizes: []time.Duration{time.Minute},
		SyncRate: time.Hour, Strategy: store, Clock: clk.Now})
	require.NoError(t, err)
	for _, k := range keyNames("k", 100) {
		_, err := ns.Increment(ctx, k, time.Minute, 3)
		require.NoError(t, err)
	}
	cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	err = ns.Close(cctx)
	require.ErrorIs(t, err, ratelimit.ErrStoreUnavailable)
	var unpushed *ratelimit.UnpushedError
	require.True(t, errors.As(err, &unpushed), "%v", err)
	require.Equal(t, int64(300), unpushed.Hits)
	require.Contains(t, err.Error(), "300 hits")

	// Sync reports them too.
	ns2, err := reg.New(ratelimit.Config{Namespace: "two", WindowSizes: []time.Duration{time.Minute},
		SyncRate: time.Hour, Strategy: store, Clock: clk.Now})
	require.NoError(t, err)
	_, err = ns2.Increment(ctx, "k", time.Minute, 7)
	require.NoError(t, err)
	err = ns2.Sync(ctx)
	require.True(t, errors.As(err, &unpushed), "%v", err)
	require.Equal(t, int64(7), unpushed.Hits)
	store.setFail(nil)
	require.NoError(t, reg.Close(ctx))
}

// A unique-key flood while the store is out: the retired windows stay within
// their cap (memory bounded by the configuration, however long the outage),
// every hit is either pushed after recovery or counted as dropped, the
// pending hits drain in one cycle, and no push exceeds the per-push cap.
// (Before the fix every retired record went into the first push, and a flood
// held millions of them.)
func TestOutageFloodStaysBounded(t *testing.T) {
	leakCheck(t)
	const (
		maxKeys  = 10_000
		floodLen = 200_000
		pushCap  = 1_250 // MaxKeys/8
	)
	clk := &fakeClock{t: minute}
	var applied sumStore
	applied.countingStore = newCountingStore(func(int) memory.Fault { return memory.LoseRequest })
	reg := ratelimit.NewRegistry()
	t.Cleanup(func() { _ = reg.Close(ctx) })
	sizes := []time.Duration{time.Second, time.Minute}
	ns, err := reg.New(ratelimit.Config{WindowSizes: sizes, SyncRate: time.Hour, Strategy: &applied,
		Clock: clk.Now, MaxKeys: maxKeys})
	require.NoError(t, err)
	maxRetired := 0
	for i := range floodLen {
		clk.Set(minute.Add(time.Duration(i) * 60 * time.Second / floodLen))
		k := "flood:" + strconv.Itoa(i)
		for _, w := range sizes {
			_, err := ns.Increment(ctx, k, w, 1)
			require.NoError(t, err)
		}
		if i%1000 == 0 {
			maxRetired = max(maxRetired, ns.Stats().RetiredWindows)
		}
	}
	st := ns.Stats()
	t.Logf("during the outage: at most %d retired windows, %d hits dropped, %d pending", maxRetired, st.DroppedHits, st.PendingHits)
	// The cap, plus a quarter while a push of unknown outcome holds the
	// cap's worth of records (its re-send must find them), plus what that
	// push may hold beyond its cap: the entries of the shard whose walk
	// crossed it (128 shards of 78 keys for MaxKeys 10,000, two windows
	// each), which the flood evicts while the push is unresolved.
	const shardShare = 2 * (maxKeys/128 + 1)
	require.LessOrEqual(t, maxRetired, maxKeys/8+maxKeys/32+shardShare, "retired windows beyond their cap")
	require.Positive(t, st.DroppedHits)

	applied.setFail(nil)
	cycles := 0
	for ; ns.Stats().PendingHits != 0 && cycles < 10; cycles++ {
		_ = ns.Sync(ctx)
	}
	require.Zero(t, ns.Stats().PendingHits, "pending hits did not drain in 10 cycles")
	require.LessOrEqual(t, cycles, 2)
	st = ns.Stats()
	require.Equal(t, int64(2*floodLen), applied.sum()+st.DroppedHits,
		"every hit is in the store or counted as dropped")
	require.LessOrEqual(t, applied.largestPush(), 2*pushCap, "a push beyond the per-push cap")
}

// sumStore adds up the deltas of the pushes the store applied (it fails
// pushes only before applying them, so each success applies once).
type sumStore struct {
	*countingStore
	mu    sync.Mutex
	total int64
}

func (s *sumStore) PushDiffs(ctx context.Context, b *strategy.Batch) (strategy.Result, error) {
	res, err := s.countingStore.PushDiffs(ctx, b)
	if err == nil {
		s.mu.Lock()
		for _, d := range b.Diffs {
			s.total += d.Delta
		}
		s.mu.Unlock()
	}
	return res, err
}

func (s *sumStore) sum() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.total
}

// Counts saturate instead of wrapping: 1,024 increments of 2^53 would wrap a
// 64-bit count to a large negative number, and Allow would then admit with a
// full Remaining.
func TestCountsSaturate(t *testing.T) {
	leakCheck(t)
	for _, mode := range []string{"local", "periodic"} {
		t.Run(mode, func(t *testing.T) {
			clk := &fakeClock{t: minute.Add(time.Second)}
			cfg := ratelimit.Config{WindowSizes: []time.Duration{time.Minute}, Clock: clk.Now, SyncRate: -1}
			store := memory.New()
			if mode == "periodic" {
				cfg.SyncRate, cfg.Strategy = time.Hour, store
			}
			ns := newNS(t, cfg)
			for i := range 1024 {
				rate, err := ns.Increment(ctx, "k", time.Minute, ratelimit.MaxValue)
				require.NoError(t, err)
				require.Positive(t, rate, "increment %d", i)
				if mode == "periodic" && i%100 == 0 {
					require.NoError(t, ns.Sync(ctx))
				}
			}
			d, err := ns.Allow(ctx, "k", 1, ratelimit.Limit{Window: time.Minute, Max: 10})
			require.NoError(t, err)
			require.False(t, d.Allowed)
			require.Zero(t, d.Remaining)
			if mode == "periodic" {
				require.NoError(t, ns.Sync(ctx))
				n, err := store.GetWindow(ctx, ns.Name(), strategy.CounterID{Key: "k", Size: time.Minute, Start: minute.UnixMilli()})
				require.NoError(t, err)
				require.Positive(t, n)
				require.LessOrEqual(t, n, int64(strategy.MaxTotal))
			}
		})
	}
}

// A window so long that a store's retention would overflow is refused.
func TestWindowTooLong(t *testing.T) {
	_, err := ratelimit.NewRegistry().New(ratelimit.Config{WindowSizes: []time.Duration{147 * 365 * 24 * time.Hour}, SyncRate: -1})
	require.ErrorIs(t, err, ratelimit.ErrInvalidConfig)
	require.Contains(t, err.Error(), "WindowSizes")
}

// evictingStore increments fresh keys of ns during the first push of a Sync,
// as concurrent traffic would: they evict keys the sync has not visited yet.
// It refuses the pushes of the sync loop, so that only Sync pushes anything.
type evictingStore struct {
	*memory.Store
	armed atomic.Bool
	evict func()
}

// syncCall marks the context of the test's own Sync call.
type syncCall struct{}

func (s *evictingStore) PushDiffs(ctx context.Context, b *strategy.Batch) (strategy.Result, error) {
	if ctx.Value(syncCall{}) == nil {
		return strategy.Result{}, fmt.Errorf("the loop's push: %w", strategy.ErrNotApplied)
	}
	if s.armed.CompareAndSwap(true, false) {
		s.evict()
	}
	return s.Store.PushDiffs(ctx, b)
}

// Keys evicted while a Sync walks the table (by traffic during its first
// push) had their hits counted before it began: Sync must push them before it
// returns nil. (The retired records were collected only at the start of the
// pass, so those hits waited for the next cycle.)
func TestSyncPushesKeysEvictedDuringIt(t *testing.T) {
	leakCheck(t)
	const maxKeys = 2048
	clk := &fakeClock{t: minute.Add(time.Second)}
	store := &evictingStore{Store: memory.New()}
	var ns *ratelimit.Namespace
	store.evict = func() {
		for _, k := range keyNames("new", maxKeys/8) {
			_, err := ns.Increment(ctx, k, time.Minute, 1)
			require.NoError(t, err)
		}
	}
	reg := ratelimit.NewRegistry()
	t.Cleanup(func() { _ = reg.Close(context.WithValue(ctx, syncCall{}, true)) })
	ns, err := reg.New(ratelimit.Config{WindowSizes: []time.Duration{time.Minute}, SyncRate: time.Hour,
		Strategy: store, Clock: clk.Now, MaxKeys: maxKeys})
	require.NoError(t, err)
	old := keyNames("old", maxKeys)
	for _, k := range old {
		_, err := ns.Increment(ctx, k, time.Minute, 1)
		require.NoError(t, err)
	}
	evicted := ns.Stats().Evictions
	store.armed.Store(true)
	require.NoError(t, ns.Sync(context.WithValue(ctx, syncCall{}, true)))
	require.Greater(t, ns.Stats().Evictions, evicted, "the test evicts keys during the sync")
	require.Zero(t, ns.Stats().DroppedHits)
	require.Equal(t, int64(maxKeys), storeSum(t, store, ns.Name(), time.Minute, clk.Now(), old),
		"Sync returned nil with hits counted before it unpushed")
}

// keepAll is a countingStore that never purges, so a test can read windows
// older than the previous one.
type keepAll struct{ *countingStore }

func (keepAll) Purge(context.Context, int64) error { return nil }

// Synchronous mode: a hit whose push lost its reply (kept, to re-send), then
// taken back by a negative increment while the store refuses, then its window
// rotates out before the store is back. The take-back must reach the store
// with the re-sent hit. (Before, the rotation saw local == acked and kept no
// record: the store ended with the hit the node had taken back.)
func TestSyncModeTakeBackSurvivesRotation(t *testing.T) {
	leakCheck(t)
	clk := &fakeClock{t: minute.Add(100 * time.Millisecond)}
	store := keepAll{newCountingStore(func(n int) memory.Fault {
		switch n {
		case 1:
			return memory.LoseReply // applied, reply lost: kept to re-send
		case 2:
			return memory.Refuse // the take-back stays local
		}
		return memory.NoFault
	})}
	reg := ratelimit.NewRegistry()
	t.Cleanup(func() { _ = reg.Close(ctx) })
	ns, err := reg.New(ratelimit.Config{WindowSizes: []time.Duration{time.Second}, Strategy: store,
		Clock: clk.Now, RetryInterval: time.Hour})
	require.NoError(t, err)
	first := clk.Now()
	_, err = ns.Increment(ctx, "k", time.Second, 1)
	require.ErrorIs(t, err, ratelimit.ErrStoreUnavailable)
	_, err = ns.Increment(ctx, "k", time.Second, -1)
	require.ErrorIs(t, err, ratelimit.ErrStoreUnavailable)
	clk.Set(first.Add(3 * time.Second)) // the window of both rotates out
	_, err = ns.Increment(ctx, "k", time.Second, 1)
	require.NoError(t, err)
	require.NoError(t, ns.Sync(ctx))
	require.Zero(t, storeSum(t, store, ns.Name(), time.Second, first, []string{"k"}),
		"the store keeps a hit the node took back")
	require.Zero(t, ns.Stats().PendingHits)
}
