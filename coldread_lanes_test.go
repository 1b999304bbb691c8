package ratelimit_test

import (
	"context"
	"iter"
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

// coldGate holds every cold read (GetCounters, or a push of bucket reads
// only) until gate is closed or the call's context ends; delay, if set, is
// how long each such call takes once released (fake time in a bubble).
type coldGate struct {
	strategy.Strategy
	gate        chan struct{}
	delay       time.Duration
	failBuckets bool        // bucket reads fail at once (the windows' reads work)
	hangWindows atomic.Bool // window reads hang until their context ends
	// The reads, and the keys they asked for.
	winReads, winKeys atomic.Int64
	bktReads, bktKeys atomic.Int64
}

func (s *coldGate) Capabilities() strategy.Capabilities { return strategy.CapabilitiesOf(s.Strategy) }

func (s *coldGate) wait(ctx context.Context) error {
	if s.gate != nil {
		select {
		case <-s.gate:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if s.delay > 0 {
		select {
		case <-time.After(s.delay):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

func (s *coldGate) GetCounters(ctx context.Context, q strategy.Query) iter.Seq2[strategy.Counter, error] {
	s.winReads.Add(1)
	s.winKeys.Add(int64(len(q.Keys)))
	err := s.wait(ctx)
	if err == nil && s.hangWindows.Load() {
		<-ctx.Done()
		err = ctx.Err()
	}
	if err != nil {
		return func(yield func(strategy.Counter, error) bool) { yield(strategy.Counter{}, err) }
	}
	return s.Strategy.GetCounters(ctx, q)
}

func (s *coldGate) PushDiffs(ctx context.Context, b *strategy.Batch) (strategy.Result, error) {
	if len(b.BucketReads) > 0 && len(b.BucketDiffs) == 0 && len(b.Diffs) == 0 {
		s.bktReads.Add(1)
		s.bktKeys.Add(int64(len(b.BucketReads)))
		if err := s.wait(ctx); err != nil {
			return strategy.Result{}, err
		}
		if s.failBuckets {
			return strategy.Result{}, strategy.ErrNotApplied
		}
	}
	return s.Strategy.PushDiffs(ctx, b)
}

// coldNodes returns node A on mem and node B on store (wrapping mem).
func coldNodes(t *testing.T, mem strategy.Strategy, store strategy.Strategy, timeout time.Duration) (a, b *ratelimit.Namespace) {
	cfg := ratelimit.Config{WindowSizes: []time.Duration{time.Minute}, SyncRate: time.Hour, Strategy: mem, SyncTimeout: timeout}
	a = newNS(t, cfg)
	cfg.Strategy = store
	return a, newNS(t, cfg)
}

// Two requests of one client reach node B together; the first (which sends
// the shared cold read of the bucket) hangs up while the read is in flight.
// The store is healthy, yet the second request, which waited on that read,
// was judged from B's empty bucket: admitted, though the client spent its
// bucket on A. Before 573c097 the second request read the bucket itself;
// now a read never ends with the caller that started it.
func TestColdBucketOwnerCancelAdmitsWaiter(t *testing.T) {
	ownerHangsUp(t, coldBucketLimit)
}

// The same for windows (older than buckets' reads): the waiter of a cold
// window key was degraded by the owner's hang-up.
func TestColdWindowOwnerCancelAdmitsWaiter(t *testing.T) {
	ownerHangsUp(t, coldWindowLimit)
}

// The two limits of the cold-read review tests: 5 a minute.
var (
	coldBucketLimit = ratelimit.Limit{Window: time.Minute, Max: 5, Algorithm: ratelimit.TokenBucket}
	coldWindowLimit = ratelimit.Limit{Window: time.Minute, Max: 5}
)

// spentOnA returns nodes A and B (see coldNodes) with key spent under lim
// on A, synced.
func spentOnA(t *testing.T, mem strategy.Strategy, store strategy.Strategy, key string, lim ratelimit.Limit) (a, b *ratelimit.Namespace) {
	a, b = coldNodes(t, mem, store, time.Second)
	require.Equal(t, 5, allowed(t, a, key, 5, lim))
	require.NoError(t, a.Sync(context.Background()))
	return a, b
}

// ownerHangsUp: the caller whose cold read of a key spent on A is in
// flight hangs up; a second caller waiting on that read must be rejected.
func ownerHangsUp(t *testing.T, lim ratelimit.Limit) {
	synctest.Test(t, func(t *testing.T) {
		mem := memory.New()
		store := &coldGate{Strategy: mem, gate: make(chan struct{})}
		_, b := spentOnA(t, mem, store, "client", lim)
		octx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		wg.Go(func() { _, _ = b.Allow(octx, "client", 1, lim) }) // the owner
		synctest.Wait()
		var waiter ratelimit.Decision
		wg.Go(func() {
			var err error
			waiter, err = b.Allow(context.Background(), "client", 1, lim)
			require.NoError(t, err)
		})
		synctest.Wait()
		cancel() // the owner's client hangs up
		synctest.Wait()
		close(store.gate)
		wg.Wait()
		t.Logf("waiter: allowed %v degraded %v; %d window reads, %d bucket reads", waiter.Allowed, waiter.Degraded,
			store.winReads.Load(), store.bktReads.Load())
		require.False(t, waiter.Allowed, "a healthy store shows the key spent, yet the waiter was admitted (Degraded %v)", waiter.Degraded)
	})
}

// behindARead starts a decision on "first" under lim whose read holds at
// store's gate, then runs calls, each in its own goroutine, once all of
// them queued behind it opens the gate, and waits for every call.
func behindARead(b *ratelimit.Namespace, store *coldGate, lim ratelimit.Limit, calls ...func()) {
	var wg sync.WaitGroup
	wg.Go(func() { _, _ = b.Allow(context.Background(), "first", 1, lim) }) // the read in flight
	synctest.Wait()
	for _, call := range calls {
		wg.Go(call)
	}
	synctest.Wait() // queued behind the read in flight
	close(store.gate)
	wg.Wait()
}

// A decision whose key is cold in a token bucket and in a window waited for
// two reads one after the other, each bounded by SyncTimeout on its own: on a
// store that answers each read in 0.8 × SyncTimeout, the call waited 1.6 ×
// SyncTimeout ("A caller waits at most SyncTimeout"). Both are read in one
// wait now.
func TestColdBucketAndWindowWaitTwice(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const timeout = 100 * time.Millisecond
		bucket := ratelimit.Limit{Window: time.Minute, Max: 5, Algorithm: ratelimit.TokenBucket}
		window := ratelimit.Limit{Window: time.Minute, Max: 5}
		mem := memory.New()
		store := &coldGate{Strategy: mem, delay: timeout * 8 / 10}
		_, b := coldNodes(t, mem, store, timeout)
		start := time.Now()
		d, err := b.Allow(context.Background(), "client", 1, bucket, window)
		took := time.Since(start)
		require.NoError(t, err)
		t.Logf("waited %v (SyncTimeout %v), %d window reads, %d bucket reads, degraded %v", took, timeout,
			store.winReads.Load(), store.bktReads.Load(), d.Degraded)
		require.LessOrEqual(t, took, timeout, "one call waited past SyncTimeout")
		require.False(t, d.Degraded, "each read answers within SyncTimeout")
	})
}

// A mixed batch: bucket reads fail (the store refuses them) while window
// reads work. A caller of a cold window key that shared the batch with a
// bucket key was Degraded, and its key marked unread, though its own read
// succeeded. Each kind has its own lane of reads now.
func TestMixedBatchBucketFailureDegradesWindows(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := memory.New()
		store := &coldGate{Strategy: mem, gate: make(chan struct{}), failBuckets: true}
		_, b := coldNodes(t, mem, store, time.Second)
		var wd ratelimit.Decision
		behindARead(b, store, coldWindowLimit,
			func() { _, _ = b.Allow(context.Background(), "bkt", 1, coldBucketLimit) },
			func() { wd, _ = b.Allow(context.Background(), "win", 1, coldWindowLimit) })
		t.Logf("window caller: allowed %v degraded %v; %d window reads", wd.Allowed, wd.Degraded, store.winReads.Load())
		require.False(t, wd.Degraded, "the window key's read succeeded; a bucket read's failure degraded it")
	})
}

// A mixed batch the other way: window reads hang (a slow GetCounters) while
// bucket reads work. A cold bucket key queued in the same batch was never
// read: its caller was judged from this node's empty bucket, admitted though
// the store showed it spent.
func TestMixedBatchWindowHangAdmitsBucket(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := memory.New()
		store := &coldGate{Strategy: mem, gate: make(chan struct{})}
		_, b := spentOnA(t, mem, store, "bkt", coldBucketLimit)
		var bd ratelimit.Decision
		behindARead(b, store, coldBucketLimit,
			func() { store.hangWindows.Store(true); _, _ = b.Allow(context.Background(), "win", 1, coldWindowLimit) },
			func() { bd, _ = b.Allow(context.Background(), "bkt", 1, coldBucketLimit) })
		t.Logf("bucket caller: allowed %v degraded %v; bucket reads %d", bd.Allowed, bd.Degraded, store.bktReads.Load())
		require.False(t, bd.Allowed, "the bucket read would have answered: spent; admitted (Degraded %v)", bd.Degraded)
	})
}

// The owner hangs up while the store hangs: it leaves, and its read goes on
// for the waiter (a read is not its caller's). Close releases the waiter
// (Degraded) and ends that read: nothing is left running (synctest checks).
func TestColdOwnerCancelThenClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		lim := ratelimit.Limit{Window: time.Minute, Max: 5, Algorithm: ratelimit.TokenBucket}
		store := &coldGate{Strategy: memory.New(), gate: make(chan struct{})}
		reg := ratelimit.NewRegistry()
		b, err := reg.New(ratelimit.Config{WindowSizes: []time.Duration{time.Minute}, SyncRate: time.Hour, Strategy: store, SyncTimeout: time.Hour})
		require.NoError(t, err)
		octx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		owner := make(chan ratelimit.Decision, 1)
		wg.Go(func() { d, _ := b.Allow(octx, "client", 1, lim); owner <- d })
		synctest.Wait()
		var waiter ratelimit.Decision
		wg.Go(func() { waiter, _ = b.Allow(context.Background(), "client", 1, lim) })
		synctest.Wait()
		cancel()
		synctest.Wait()
		select {
		case d := <-owner:
			require.True(t, d.Degraded, "the owner hung up before its read ended")
		default:
			t.Fatal("the owner still waits after hanging up")
		}
		require.Equal(t, int64(1), store.bktReads.Load(), "one read, still in flight for the waiter")
		require.NoError(t, reg.Close(context.Background()))
		wg.Wait()
		require.True(t, waiter.Allowed && waiter.Degraded)
	})
}

// Held: a bucket whose window size index (2) is not its window table's
// index (1), cold together with a window limit in another table, in one
// decision: the right bucket table learns the store's state.
func TestColdBucketTableIndex(t *testing.T) {
	leakCheck(t)
	sizes := []time.Duration{time.Second, time.Minute, time.Hour}
	mem := memory.New()
	clk := &fakeClock{t: minute.Add(10 * time.Second)}
	cfg := ratelimit.Config{WindowSizes: sizes, SyncRate: time.Hour, Strategy: mem, Clock: clk.Now}
	a, b := newNS(t, cfg), newNS(t, cfg)
	bucket := ratelimit.Limit{Window: time.Hour, Max: 5, Algorithm: ratelimit.TokenBucket}
	window := ratelimit.Limit{Window: time.Second, Max: 1000}
	spend(t, a, "client", 5, bucket)
	admitted := allowed(t, b, "client", 5, window, bucket)
	require.Zero(t, admitted)
	admitted = allowed(t, b, "client2", 6, bucket, window)
	require.Equal(t, 5, admitted)
}
