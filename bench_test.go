package ratelimit_test

import (
	"context"
	"fmt"
	"hash/maphash"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratesync/ratelimit"
	"github.com/ratesync/ratelimit/strategy/memory"
)

const benchKeys = 100_000

var benchKeyNames = userKeys(benchKeys)

// userKeys returns n 13-byte keys, user:00000000 on.
func userKeys(n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("user:%08d", i)
	}
	return keys
}

// keyPattern returns indexes into benchKeyNames: uniform, Zipf-skewed, or one hot key.
func keyPattern(kind string) []int {
	const n = 1 << 16
	idx := make([]int, n)
	rng := rand.New(rand.NewPCG(1, 2))
	zipf := rand.NewZipf(rng, 1.1, 1, benchKeys-1)
	for i := range idx {
		switch kind {
		case "uniform":
			idx[i] = rng.IntN(benchKeys)
		case "zipf":
			idx[i] = int(zipf.Uint64())
		case "hot":
			idx[i] = 0
		}
	}
	return idx
}

// keyMap is a 64-shard map from keys to values of V behind RWMutexes: the
// lookup of the baseline and of floor2.
type keyMap[V any] struct {
	seed   maphash.Seed
	shards [64]struct {
		mu sync.RWMutex
		m  map[string]*V
		_  [40]byte
	}
}

// init holds a zero V for each of keys.
func (km *keyMap[V]) init(keys []string) {
	km.seed = maphash.MakeSeed()
	for i := range km.shards {
		km.shards[i].m = make(map[string]*V)
	}
	for _, k := range keys {
		km.shards[maphash.String(km.seed, k)&63].m[k] = new(V)
	}
}

// get returns key's value.
func (km *keyMap[V]) get(key string) *V {
	s := &km.shards[maphash.String(km.seed, key)&63]
	s.mu.RLock()
	v := s.m[key]
	s.mu.RUnlock()
	return v
}

// baseline is the simplest sharded counter: a 64-shard map of atomics behind
// RWMutexes, lookup plus atomic add. The library is held to at most 1.5x it.
type baseline struct{ keyMap[atomic.Int64] }

func newBaseline() *baseline { return newBaselineOf(benchKeyNames) }

// newBaselineOf is newBaseline on keys.
func newBaselineOf(keys []string) *baseline {
	b := new(baseline)
	b.init(keys)
	return b
}

func (b *baseline) add(key string, v int64) int64 { return b.get(key).Add(v) }

func benchNamespace(b *testing.B, mode string) *ratelimit.Namespace {
	return benchNamespaceOf(b, mode, benchKeyNames)
}

// benchNamespaceOf is benchNamespace holding keys.
func benchNamespaceOf(b *testing.B, mode string, keys []string) *ratelimit.Namespace {
	cfg := ratelimit.Config{WindowSizes: []time.Duration{time.Second, time.Minute}, SyncRate: -1}
	if 2*len(keys) > 1<<20 {
		cfg.MaxKeys = 2 * len(keys) // room enough that no key is evicted
	}
	if mode == "coarse" {
		// Local mode with the cached clock: the table's own cost, without a
		// system clock read per call.
		c := ratelimit.NewCoarseClock(time.Millisecond)
		b.Cleanup(c.Stop)
		cfg.Clock = c.Now
	}
	if mode == "async" {
		// A long SyncRate keeps the loop out of the measurement; the table
		// does the same bookkeeping (dirty lists) as with any SyncRate.
		cfg.SyncRate, cfg.Strategy = time.Hour, memory.New()
	}
	reg := ratelimit.NewRegistry()
	ns, err := reg.New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = reg.Close(context.Background()) })
	for _, k := range keys {
		if _, err := ns.Increment(context.Background(), k, time.Minute, 1); err != nil {
			b.Fatal(err)
		}
	}
	return ns
}

func runPattern(b *testing.B, parallel bool, idx []int, op func(key string)) {
	runPatternOf(b, benchKeyNames, parallel, idx, op)
}

// runPatternOf is runPattern on keys (idx indexes keys).
func runPatternOf(b *testing.B, keys []string, parallel bool, idx []int, op func(key string)) {
	b.ReportAllocs()
	b.ResetTimer()
	if !parallel {
		for i := 0; b.Loop(); i++ {
			op(keys[idx[i&(len(idx)-1)]])
		}
		return
	}
	var seed atomic.Int64
	b.RunParallel(func(pb *testing.PB) {
		i := int(seed.Add(7919))
		for pb.Next() {
			op(keys[idx[i&(len(idx)-1)]])
			i++
		}
	})
}

// BenchmarkIncrement measures Increment and SlidingWindow on existing keys
// among 100,000, next to the map-plus-atomic baseline on the same keys, in
// local and async modes with the default clock (time.Now), and in local mode
// with a CoarseClock ("coarse"), which shows the table's own cost.
func BenchmarkIncrement(b *testing.B) {
	ctx := context.Background()
	for _, pattern := range []string{"uniform", "zipf", "hot"} {
		idx := keyPattern(pattern)
		for _, par := range []bool{false, true} {
			run := "serial"
			if par {
				run = "parallel"
			}
			b.Run(fmt.Sprintf("baseline/%s/%s", pattern, run), func(b *testing.B) {
				base := newBaseline()
				runPattern(b, par, idx, func(key string) { base.add(key, 1) })
			})
			for _, mode := range []string{"local", "async", "coarse"} {
				b.Run(fmt.Sprintf("increment-%s/%s/%s", mode, pattern, run), func(b *testing.B) {
					ns := benchNamespace(b, mode)
					runPattern(b, par, idx, func(key string) {
						if _, err := ns.Increment(ctx, key, time.Minute, 1); err != nil {
							b.Fatal(err)
						}
					})
				})
				b.Run(fmt.Sprintf("slidingwindow-%s/%s/%s", mode, pattern, run), func(b *testing.B) {
					ns := benchNamespace(b, mode)
					runPattern(b, par, idx, func(key string) {
						if _, err := ns.SlidingWindow(ctx, key, time.Minute); err != nil {
							b.Fatal(err)
						}
					})
				})
			}
		}
	}
}

// BenchmarkMemoryPerKey reports the heap bytes each tracked key costs with two
// window sizes, over 1M keys.
func BenchmarkMemoryPerKey(b *testing.B) {
	// 13-byte keys, and 24-byte ones (an API key, a policy rule's prefix
	// before a client key): an entry holds its key's bytes, so longer keys
	// take a larger allocation.
	for _, format := range []string{"user:%08d", "sk_live_%016d"} {
		name := fmt.Sprintf("key-%d-bytes", len(fmt.Sprintf(format, 0)))
		b.Run(name, func(b *testing.B) { benchMemoryPerKey(b, format) })
	}
}

func benchMemoryPerKey(b *testing.B, format string) {
	const n = 1_000_000
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf(format, i)
	}
	ctx := context.Background()
	for b.Loop() {
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		reg := ratelimit.NewRegistry()
		ns, err := reg.New(ratelimit.Config{WindowSizes: []time.Duration{time.Second, time.Minute}, SyncRate: time.Hour, Strategy: memory.New(), MaxKeys: 2 * n})
		if err != nil {
			b.Fatal(err)
		}
		for _, k := range keys {
			_, _ = ns.Increment(ctx, k, time.Second, 1)
			_, _ = ns.Increment(ctx, k, time.Minute, 1)
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		if got := ns.Stats().TrackedKeys; got != n {
			b.Fatalf("tracked %d keys, want %d", got, n)
		}
		// The key strings themselves are the caller's (made before the
		// first reading); the table's copies are inside its entries.
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/n, "bytes/key")
		runtime.KeepAlive(keys)
		_ = reg.Close(ctx)
	}
}

// BenchmarkSyncCycle measures one sync cycle pushing 100,000 dirty keys to the
// memory store.
func BenchmarkSyncCycle(b *testing.B) {
	ctx := context.Background()
	ns := benchNamespace(b, "async")
	if err := ns.Sync(ctx); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		b.StopTimer()
		for _, k := range benchKeyNames {
			_, _ = ns.Increment(ctx, k, time.Minute, 1)
		}
		b.StartTimer()
		if err := ns.Sync(ctx); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(benchKeys)*float64(b.N)/b.Elapsed().Seconds(), "counters/s")
}

// floor2 is the least a check of two sliding windows must do, measured as
// a yardstick next to the baseline: it finds the key as the baseline does,
// counts the request in both windows with one atomic addition each, judges
// both sliding loads and takes the request back when one rejects it. It
// keeps no state beyond that (no sync bookkeeping, no eviction, no
// statistics), and rotates a window under a mutex, racily enough for a
// benchmark only.
type floor2 struct {
	keys  keyMap[floorKey]
	clock atomic.Int64 // Unix ms, as the default clock caches it
}

type floorKey struct {
	mu sync.Mutex
	w  [2]floorWindow
}

type floorWindow struct {
	start     atomic.Int64
	cur, prev atomic.Int64
}

// floorResult is the answer floor2 fills in: what a Decision must report.
type floorResult struct {
	allowed          bool
	remaining, reset int64
}

func newFloor2(keys []string) *floor2 {
	f := new(floor2)
	f.keys.init(keys)
	f.clock.Store(time.Now().UnixMilli())
	return f
}

var floorSizes = [2]int64{1000, 60_000}

// find returns key's state and the time.
func (f *floor2) find(key string) (*floorKey, int64) {
	return f.keys.get(key), f.clock.Load()
}

// window returns k's window of floorSizes[i] at now, rotated to it, with
// the weight of the window before it.
func (k *floorKey) window(i int, now int64) (*floorWindow, float64) {
	w, size := &k.w[i], floorSizes[i]
	start := now - now%size
	if w.start.Load() != start {
		k.mu.Lock()
		if old := w.start.Load(); old != start {
			p := w.cur.Swap(0)
			if start != old+size {
				p = 0
			}
			w.prev.Store(p)
			w.start.Store(start)
		}
		k.mu.Unlock()
	}
	return w, float64(size-(now-start)) / float64(size)
}

// allow decides a request of cost 1 under limits of limit[i] per window of
// floorSizes[i].
func (f *floor2) allow(key string, limit [2]int64, r *floorResult) {
	k, now := f.find(key)
	*r = floorResult{allowed: true, remaining: 1 << 62}
	var loads [2]float64
	for i := range k.w {
		w, weight := k.window(i, now)
		loads[i] = float64(w.cur.Add(1)) + float64(w.prev.Load())*weight
		if loads[i] > float64(limit[i]) {
			r.allowed = false
		}
	}
	for i := range k.w {
		if !r.allowed {
			k.w[i].cur.Add(-1)
			continue
		}
		if rem := int64(float64(limit[i]) - loads[i]); rem < r.remaining { // the binding limit
			r.remaining, r.reset = rem, floorSizes[i]-now%floorSizes[i]
		}
	}
}

// increment is floor2's Increment: it adds 1 to key's window of
// floorSizes[i] and returns the sliding rate after it.
func (f *floor2) increment(key string, i int) float64 {
	k, now := f.find(key)
	return k.increment(i, now)
}

// increment adds 1 to k's window of floorSizes[i] at now and returns the
// sliding rate after it.
func (k *floorKey) increment(i int, now int64) float64 {
	w, weight := k.window(i, now)
	return float64(w.cur.Add(1)) + float64(w.prev.Load())*weight
}

// benchFloor2 runs floor2 on keys (idx indexes keys), every request admitted.
func benchFloor2(b *testing.B, keys []string, parallel bool, idx []int) {
	f := newFloor2(keys)
	var r floorResult
	runPatternOf(b, keys, parallel, idx, func(k string) {
		if f.allow(k, [2]int64{1 << 40, 1 << 40}, &r); !r.allowed {
			b.Fatal(r)
		}
	})
}
