package shm

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"testing"
	"testing/quick"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit/strategy"
	"github.com/ratesync/ratelimit/strategy/memory"
)

func newTable(t testing.TB, opts Options) *Table {
	t.Helper()
	tb, err := New(opts)
	require.NoError(t, err)
	return tb
}

func TestEntrySize(t *testing.T) {
	// The memory budget counts on this: an entry is 64 bytes before its
	// key, in one allocation (80 bytes with a 13-byte key), with no
	// pointers for the garbage collector to scan.
	require.Equal(t, uintptr(64), unsafe.Sizeof(entry{}))
	for _, n := range []int{0, 1, 13, 24, 36, 1000} {
		key := strings.Repeat("k", n)
		var e *entry
		allocs := testing.AllocsPerRun(10, func() { e = newEntry(key) })
		require.Equal(t, 1.0, allocs, "one allocation, key included")
		require.Equal(t, key, e.key())
	}
}

// TestEntryKeys stores keys around the inline length, and keys that differ
// only past it or in length: each is found as itself, and only as itself.
func TestEntryKeys(t *testing.T) {
	long := strings.Repeat("k", 100)
	keys := []string{"", "a", strings.Repeat("x", 7), strings.Repeat("x", 8),
		strings.Repeat("x", 9), strings.Repeat("x", 8) + "y", long, long[:99] + "j"}
	for _, k := range keys {
		e := newEntry(k)
		require.Equal(t, k, e.key())
		for _, o := range keys {
			require.Equal(t, o == k, e.key() == o, "%q is %q", k, o)
		}
	}
	// Through the table: each key counts apart.
	tb := newTable(t, Options{Sizes: []time.Duration{time.Second}})
	for i, k := range keys {
		tb.Add(k, 0, 0, int64(i+1))
	}
	for i, k := range keys {
		require.EqualValues(t, i+1, tb.Peek(k, 0, 0).Cur, "%q", k)
	}
}

func TestNewRejectsBadOptions(t *testing.T) {
	for _, o := range []Options{
		{},
		{Sizes: []time.Duration{time.Second, time.Minute, time.Hour}},
		{Sizes: []time.Duration{0}},
		{Sizes: []time.Duration{1500 * time.Microsecond}},
		{Sizes: []time.Duration{time.Second}, MaxKeys: -1},
	} {
		_, err := New(o)
		require.ErrorIs(t, err, ErrConfig, "%+v", o)
	}
}

func TestWorkedExample(t *testing.T) {
	tb := newTable(t, Options{Sizes: []time.Duration{time.Minute}})
	const t0 = 1_700_000_040_000 // a minute boundary
	tb.Add("k", 0, t0-30_000, 40)
	v := tb.Add("k", 0, t0+30_000, 10)
	require.Equal(t, View{Start: t0, Cur: 10, Prev: 40}, v)
}

// model is the mutex-based reference the table must agree with.
type model struct {
	mu     sync.Mutex
	sizes  []int64
	latest map[[2]any]int64
	count  map[[3]any]int64
}

func (m *model) window(key string, w int, now int64) int64 {
	size := m.sizes[w]
	x := windowStart(now, size)
	lat, ok := m.latest[[2]any{key, w}]
	if !ok || x > lat {
		m.latest[[2]any{key, w}] = x
		lat = x
	}
	if x < lat {
		x = lat
	}
	return x
}

func (m *model) view(key string, w int, x int64) View {
	return View{Start: x, Cur: m.count[[3]any{key, w, x}], Prev: m.count[[3]any{key, w, x - m.sizes[w]}]}
}

func (m *model) add(key string, w int, now, v int64) View {
	m.mu.Lock()
	defer m.mu.Unlock()
	x := m.window(key, w, now)
	m.count[[3]any{key, w, x}] += v
	return m.view(key, w, x)
}

func (m *model) peek(key string, w int, now int64) View {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.view(key, w, m.window(key, w, now))
}

type op struct {
	Key  uint8
	W    bool
	Peek bool
	Step uint16 // time step in ms
	Back bool   // jump the clock back instead
	V    int8
}

// TestTableMatchesModel checks the table against the mutex-based model. Two
// runs: time only moves forward, with keys created (and expired entries
// dropped) as they come; and the clock also jumps back, with every key created
// up front. An entry dropped because its windows were too old cannot come back
// when the clock later jumps behind them, which the model, never forgetting,
// would not mirror: the table forgets by design.
func TestTableMatchesModel(t *testing.T) {
	for _, back := range []bool{false, true} {
		t.Run(fmt.Sprintf("clockJumpsBack=%v", back), func(t *testing.T) {
			check := func(ops []op) bool {
				tb := newTable(t, Options{Sizes: []time.Duration{100 * time.Millisecond, time.Second}})
				m := &model{sizes: []int64{100, 1000}, latest: map[[2]any]int64{}, count: map[[3]any]int64{}}
				now := int64(1_000_000)
				if back {
					for k := range 8 {
						for w := range 2 {
							key := fmt.Sprintf("k%d", k)
							tb.Peek(key, w, now)
							m.peek(key, w, now)
						}
					}
				}
				for _, o := range ops {
					if o.Back && back {
						now -= int64(o.Step % 1500)
					} else {
						now += int64(o.Step % 300)
					}
					key := fmt.Sprintf("k%d", o.Key%8)
					w := 0
					if o.W {
						w = 1
					}
					var got, want View
					if o.Peek {
						got, want = tb.Peek(key, w, now), m.peek(key, w, now)
					} else {
						got, want = tb.Add(key, w, now, int64(o.V)), m.add(key, w, now, int64(o.V))
					}
					if got != want {
						t.Logf("%+v at %d: table %+v, model %+v", o, now, got, want)
						return false
					}
				}
				return true
			}
			require.NoError(t, quick.Check(check, &quick.Config{MaxCount: 500}))
		})
	}
}

func TestAddExistingKeyAllocatesNothing(t *testing.T) {
	tb := newTable(t, Options{Sizes: []time.Duration{time.Second, time.Minute}, Track: true, WriteThrough: true})
	now := int64(1_000_000)
	tb.Add("k", 0, now, 1)
	tb.Add("k", 1, now, 1)
	allocs := testing.AllocsPerRun(1000, func() {
		tb.Add("k", 0, now, 1)
		tb.Add("k", 1, now, 1)
		tb.Peek("k", 0, now)
	})
	require.Zero(t, allocs)
}

func TestKeyCapEvictsAndCounts(t *testing.T) {
	tb := newTable(t, Options{Sizes: []time.Duration{time.Minute}, MaxKeys: 100})
	now := int64(1_000_000)
	for i := range 1000 {
		tb.Add(fmt.Sprintf("key-%d", i), 0, now, 1)
	}
	require.LessOrEqual(t, tb.Len(), 100)
	require.Equal(t, int64(1000-tb.Len()), tb.Evictions())
}

func TestExpiredEntriesLeaveWithoutEviction(t *testing.T) {
	tb := newTable(t, Options{Sizes: []time.Duration{time.Second}, MaxKeys: 64})
	now := int64(1_000_000)
	for round := range 20 {
		for i := range 16 {
			tb.Add(fmt.Sprintf("r%d-%d", round, i), 0, now, 1)
		}
		now += 2000 // every earlier key is now older than the previous window
	}
	require.Zero(t, tb.Evictions(), "expired entries make room before live ones are evicted")
	require.LessOrEqual(t, tb.Len(), 64)
}

// collectSettle collects every window of tb at now into one batch and
// settles it with settle.
func collectSettle(t testing.TB, tb *Table, st *memory.Store, now int64, id string) {
	t.Helper()
	var b Batch
	tb.collectAll(now, false, &b)
	settle(t, tb, st, &b, id)
}

// settle pushes b until the store gives a definite answer, as the sync loop
// does. Once an attempt's outcome was unknown, only a success settles b: a
// later "not applied" speaks for that attempt alone.
func settle(t testing.TB, tb *Table, st *memory.Store, b *Batch, id string) {
	unknown := false
	for range 1000 {
		res, err := st.PushDiffs(context.Background(), &strategy.Batch{ID: id, Namespace: "ns", Diffs: b.Diffs, Reads: b.Reads})
		if err == nil {
			tb.Ack(b, res)
			return
		}
		if !unknown && errors.Is(err, strategy.ErrNotApplied) {
			tb.Release(b)
			return
		}
		unknown = true
	}
	t.Fatal("push never settled")
}

// TestNoHitLostOrDoubled drives random hits through rotations, clock jumps,
// evictions and a faulty store, then checks that the store holds every hit of
// every window exactly once.
func TestNoHitLostOrDoubled(t *testing.T) {
	for seed := range uint64(20) {
		rng := rand.New(rand.NewPCG(seed, 7))
		// Odd seeds also keep the per-counter pending bookkeeping; every
		// other pair of seeds walks the whole table instead of active lists.
		tb := newTable(t, Options{Sizes: []time.Duration{50 * time.Millisecond, 200 * time.Millisecond}, MaxKeys: 16, Track: true,
			WriteThrough: seed%2 == 1, Walk: seed%4 >= 2, ReadAhead: 30 * time.Millisecond})
		st := memory.New()
		st.SetFaults(func(memory.Op) memory.Fault { return memory.Fault(rng.IntN(4)) })
		want := map[strategy.CounterID]int64{}
		now := int64(1_000_000)
		var b Batch
		batches := 0
		for range 3000 {
			switch r := rng.IntN(100); {
			case r < 3:
				now -= int64(rng.IntN(300))
			case r < 10:
				b.Reset()
				tb.collectAll(now, rng.IntN(2) == 0, &b)
				batches++
				settle(t, tb, st, &b, fmt.Sprintf("b%d-%d", seed, batches))
			default:
				now += int64(rng.IntN(20))
				key := fmt.Sprintf("k%d", rng.IntN(40))
				w := rng.IntN(2)
				v := int64(rng.IntN(5) - 1)
				vw := tb.Add(key, w, now, v)
				want[strategy.CounterID{Key: key, Size: tb.sizes[w], Start: vw.Start}] += v
			}
		}
		st.SetFaults(nil)
		for range 3 {
			b.Reset()
			tb.collectAll(now, false, &b)
			batches++
			settle(t, tb, st, &b, fmt.Sprintf("b%d-%d", seed, batches))
		}
		hits, retired := tb.Pending()
		require.Zero(t, hits)
		require.Zero(t, retired)
		for id, n := range want {
			got, err := st.GetWindow(context.Background(), "ns", id)
			require.NoError(t, err)
			require.Equal(t, n, got, "seed %d %v", seed, id)
		}
	}
}

// syncUntilStopped runs sync cycles on tb against st (every other one with
// reads), as the sync loop does, until the returned stop is called; stop
// waits for the cycle under way.
func syncUntilStopped(t *testing.T, tb *Table, st *memory.Store, now func() int64) (stop func()) {
	var b Batch
	return loopUntilStopped(func(n int) {
		b.Reset()
		tb.collectAll(now(), n%2 == 0, &b)
		settle(t, tb, st, &b, fmt.Sprintf("c%d", n))
	})
}

// loopUntilStopped calls cycle(0), cycle(1), … on a goroutine of its own,
// yielding between calls, until the returned stop is called; stop waits
// for the call under way.
func loopUntilStopped(cycle func(n int)) (stop func()) {
	done, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		for n := 0; ; n++ {
			select {
			case <-done:
				return
			default:
			}
			cycle(n)
			runtime.Gosched()
		}
	}()
	return func() {
		close(done)
		<-stopped
	}
}

func TestConcurrentAddsAndSyncs(t *testing.T) {
	for _, walk := range []bool{false, true} {
		t.Run(fmt.Sprintf("walk=%v", walk), func(t *testing.T) { testConcurrentAddsAndSyncs(t, walk) })
	}
}

func testConcurrentAddsAndSyncs(t *testing.T, walk bool) {
	// No cap on retired records: this test is about exactness, not about
	// shedding (TestShed).
	tb := newTable(t, Options{Sizes: []time.Duration{10 * time.Millisecond}, MaxKeys: 64, Track: true, Walk: walk, MaxRetired: 1 << 30})
	st := memory.New()
	var clock sync.Mutex
	now := int64(1_000_000)
	tick := func(d int64) int64 {
		clock.Lock()
		defer clock.Unlock()
		now += d
		return now
	}
	const workers, hits = 4, 5000
	var wg sync.WaitGroup
	totals := make([]map[strategy.CounterID]int64, workers)
	for g := range workers {
		totals[g] = map[strategy.CounterID]int64{}
		wg.Go(func() {
			for i := range hits {
				key := fmt.Sprintf("k%d", (i*7+g)%200)
				vw := tb.Add(key, 0, tick(1), 1)
				totals[g][strategy.CounterID{Key: key, Size: 10 * time.Millisecond, Start: vw.Start}]++
			}
		})
	}
	stop := syncUntilStopped(t, tb, st, func() int64 { return tick(0) })
	wg.Wait()
	stop()
	var b Batch
	tb.collectAll(tick(0), false, &b)
	settle(t, tb, st, &b, "final")
	sum := int64(0)
	for _, m := range totals {
		for id, n := range m {
			_ = id
			sum += n
		}
	}
	require.Equal(t, int64(workers*hits), sum)
	stored := int64(0)
	want := map[strategy.CounterID]int64{}
	for _, m := range totals {
		for id, n := range m {
			want[id] += n
		}
	}
	for id := range want {
		got, err := st.GetWindow(context.Background(), "ns", id)
		require.NoError(t, err)
		stored += got
	}
	require.Equal(t, sum, stored, "every hit reaches the store exactly once")
}

func TestCollectSkipsWriteThroughsInFlight(t *testing.T) {
	tb := newTable(t, Options{Sizes: []time.Duration{time.Minute}, WriteThrough: true})
	now := int64(1_000_000)
	var wt, b Batch
	tb.Add("k", 0, now, 2) // a plain hit, for the loop to push
	tb.AddPending("k", 0, now, 5, &wt)
	require.Len(t, wt.Diffs, 1)
	require.Equal(t, int64(5), wt.Diffs[0].Delta)
	tb.collectAll(now, false, &b)
	require.Len(t, b.Diffs, 1)
	require.Equal(t, int64(2), b.Diffs[0].Delta, "the write-through in flight is not pushed again")
	tb.Ack(&b, strategy.Result{Totals: []int64{2}})
	// The write-through fails for sure: its hit goes back to the loop.
	tb.Release(&wt)
	b.Reset()
	tb.collectAll(now, false, &b)
	require.Len(t, b.Diffs, 1)
	require.Equal(t, int64(5), b.Diffs[0].Delta)
	tb.Ack(&b, strategy.Result{Totals: []int64{7}})
	v := tb.Peek("k", 0, now)
	require.Equal(t, int64(7), v.Cur)
	hits, retired := tb.Pending()
	require.Zero(t, hits)
	require.Zero(t, retired)
}

func TestAddWindowsMatchesAdd(t *testing.T) {
	a := newTable(t, Options{Sizes: []time.Duration{time.Second, time.Minute}})
	b := newTable(t, Options{Sizes: []time.Duration{time.Second, time.Minute}})
	rng := rand.New(rand.NewPCG(3, 4))
	now := int64(1_000_000)
	for range 2000 {
		now += int64(rng.IntN(700))
		key := fmt.Sprintf("k%d", rng.IntN(5))
		mask := uint8(rng.IntN(3) + 1)
		v := [2]int64{int64(rng.IntN(5)), int64(rng.IntN(5))}
		peek := rng.IntN(4) == 0
		got := a.AddWindows(key, now, mask, v, peek)
		for w := range 2 {
			if mask&(1<<w) == 0 {
				require.Zero(t, got[w])
				continue
			}
			var want View
			if peek {
				want = b.Peek(key, w, now)
			} else {
				want = b.Add(key, w, now, v[w])
			}
			require.Equal(t, want, got[w])
		}
	}
	allocs := testing.AllocsPerRun(100, func() { a.AddWindows("k1", now, 3, [2]int64{1, 1}, false) })
	require.Zero(t, allocs)
}

func TestCollectReadsPreviousWindowUntilSettled(t *testing.T) {
	tb := newTable(t, Options{Sizes: []time.Duration{time.Second}, Track: true, Settle: 300 * time.Millisecond})
	reads := func(now int64) []strategy.CounterID {
		var b Batch
		tb.collectAll(now, true, &b)
		res := strategy.Result{Totals: make([]int64, len(b.Diffs)), Reads: make([]int64, len(b.Reads))}
		for i := range res.Reads {
			res.Reads[i] = 7 // the store's total for every window read
		}
		tb.Ack(&b, res)
		return b.Reads
	}
	tb.Peek("old", 0, 1_000_500)
	require.Len(t, reads(1_000_600), 2, "the current window, and the previous one this node never learned")
	require.Len(t, reads(1_000_700), 1, "the current window only: the previous one is known and settled")
	// The next window: the previous one is read while it settles...
	tb.Peek("old", 0, 1_001_100)
	require.Len(t, reads(1_001_100), 2)
	// ...and not once it has, since this node knows its total.
	require.Len(t, reads(1_001_400), 1)
	require.Equal(t, int64(7), tb.Peek("old", 0, 1_001_400).Prev)
	// A key first seen after the previous window settled: its previous
	// window is read once, because this node never learned it.
	tb.Peek("new", 0, 1_001_500)
	got := reads(1_001_500)
	require.ElementsMatch(t, []strategy.CounterID{
		{Key: "new", Size: time.Second, Start: 1_001_000},
		{Key: "new", Size: time.Second, Start: 1_000_000},
		{Key: "old", Size: time.Second, Start: 1_001_000},
	}, got)
	require.Len(t, reads(1_001_600), 2, "both keys' current windows only")
}

func TestHotKeysSurviveAFloodOfOneHitKeys(t *testing.T) {
	tb := newTable(t, Options{Sizes: []time.Duration{time.Hour}, MaxKeys: 4096})
	now := int64(1_000_000)
	const hot = 100
	for round := range 60 {
		for i := range hot {
			v := tb.Add(fmt.Sprintf("hot-%d", i), 0, now, 1)
			require.Equal(t, int64(round+1), v.Cur, "hot key %d lost its count in round %d", i, round)
		}
		for i := range 1000 { // 60,000 one-hit keys in all, 15 times the cap
			tb.Add(fmt.Sprintf("flood-%d-%d", round, i), 0, now, 1)
		}
	}
	require.Positive(t, tb.Evictions())
}

func TestANodeBehindFollowsTheNextWindow(t *testing.T) {
	tb := newTable(t, Options{Sizes: []time.Duration{10 * time.Second}, Track: true, ReadAhead: 2 * time.Second})
	var early Batch
	tb.Add("k", 0, 1_000_005_000, 1)
	tb.collectAll(1_000_005_000, true, &early) // 5 s before the window ends: no read ahead
	require.NotContains(t, early.Reads, strategy.CounterID{Key: "k", Size: 10 * time.Second, Start: 1_000_010_000})
	tb.Ack(&early, strategy.Result{Totals: []int64{1}, Reads: make([]int64, len(early.Reads))})
	now := int64(1_000_009_000) // 1 s before its window ends
	tb.Add("k", 0, now, 3)
	var b Batch
	tb.collectAll(now, true, &b)
	require.Contains(t, b.Reads, strategy.CounterID{Key: "k", Size: 10 * time.Second, Start: 1_000_010_000}, "the next window is read")
	res := strategy.Result{Totals: []int64{4}, Reads: make([]int64, len(b.Reads))}
	for i, id := range b.Reads {
		if id.Start == 1_000_010_000 {
			res.Reads[i] = 50 // nodes whose clocks are ahead already counted there
		}
	}
	tb.Ack(&b, res)
	// This node's clock is still in the old window, but it now counts in the
	// next one, with the old window as its previous.
	v := tb.Add("k", 0, now, 1)
	require.Equal(t, View{Start: 1_000_010_000, Cur: 51, Prev: 4}, v)
}

func TestWindowOfFarApart(t *testing.T) {
	// The last window found and now far apart: now - start overflows.
	tb := newTable(t, Options{Sizes: []time.Duration{time.Second}})
	tb.windowOf(0, -5e18)
	x, _ := tb.windowOf(0, 5e18)
	require.Equal(t, int64(5e18), x)
	x, _ = tb.windowOf(0, -5e18)
	require.Equal(t, int64(-5e18), x)
}

func TestBucketSize(t *testing.T) {
	require.Equal(t, uintptr(64), unsafe.Sizeof(bucket{}))
}

// TestPassShare: CollectSome's progress over the shards, which a caller
// extrapolates a pass's size from, is 0 between passes, grows with each
// chunk, and its diffs over the share collected are close to the pass's.
func TestPassShare(t *testing.T) {
	tb := newTable(t, Options{Sizes: []time.Duration{time.Minute}, MaxKeys: 1 << 14, Track: true, Watch: true})
	now := time.Now().UnixMilli()
	const keys = 8000
	for i := range keys {
		tb.Add(fmt.Sprintf("k%d", i), 0, now, 1)
	}
	collected, shards, retired := tb.PassShare()
	require.Zero(t, collected)
	require.Zero(t, retired)
	require.Equal(t, 256, shards)
	tb.Rewind()
	var b Batch
	diffs, last := 0, 0
	for {
		done := tb.CollectSome(now, false, &b, 1000)
		diffs += len(b.Diffs)
		collected, _, retired := tb.PassShare()
		require.Zero(t, retired)
		if done {
			require.Zero(t, collected, "between passes")
			break
		}
		require.Greater(t, collected, last)
		last = collected
		require.InDelta(t, keys, diffs*shards/collected, keys/4, "the extrapolated pass after %d shards", collected)
		tb.Release(&b)
		b.Reset()
	}
	require.Equal(t, keys, diffs)
	tb.Release(&b)
	b.Reset()

	// Retired records come first, and are counted apart: they say nothing
	// of the shards.
	e := newEntry("gone")
	tb.noteTime(now)
	for i := range 500 {
		tb.retire(counterRef{e: e, start: now + int64(i)*60_000}, 1, 0)
	}
	tb.Rewind()
	require.False(t, tb.CollectSome(now, false, &b, 600))
	collected, _, retired = tb.PassShare()
	require.Equal(t, 500, retired)
	require.Positive(t, collected)
	tb.Release(&b)
}
