package ratelimit_test

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/ratesync/ratelimit"
)

// BenchmarkUniformKeys is the uniform serial case of BenchmarkIncrement and
// BenchmarkAllow (two limits, async mode) over 10,000 to 1,000,000 keys,
// each next to the map-plus-atomic baseline on the same keys, and next to
// floor2's bare Increment (floor1: one window counted, the key holding two
// window sizes as the table's entries do) and bare two-window check.
// floor1key is floor1 in an 80-byte allocation that holds a copy of its key
// and compares it, as the table's entries do (floor1pad: the allocation
// without the comparison).
//
// Both are memory bound, and their ratio depends on where each one's
// working set falls against the processor's caches, and on how many calls
// the processor overlaps: calls back to back on independent keys let it
// start the next call's loads while this one waits on memory, and the
// fewer instructions a call has, the more calls overlap. The -buf cases
// run the same calls on keys written into a buffer, as a server builds them
// from its requests; the -dep cases run them one at a time as well (each
// call's key chosen through the result of the one before), as a server
// makes them, where each check sits among its request's own work (see
// inPlace).
func BenchmarkUniformKeys(b *testing.B) {
	ctx := context.Background()
	limits := []ratelimit.Limit{{Window: time.Second, Max: 1 << 40}, {Window: time.Minute, Max: 1 << 40}}
	for _, n := range []int{10_000, 100_000, 300_000, 1_000_000} {
		keys := userKeys(n)
		idx := make([]int, 1<<16)
		rng := rand.New(rand.NewPCG(1, 2))
		for i := range idx {
			idx[i] = rng.IntN(n)
		}
		run := func(b *testing.B, op func(key string)) { runPatternOf(b, keys, false, idx, op) }
		b.Run(fmt.Sprintf("keys=%d/baseline", n), func(b *testing.B) {
			base := newBaselineOf(keys)
			run(b, func(k string) { base.add(k, 1) })
		})
		b.Run(fmt.Sprintf("keys=%d/floor1", n), func(b *testing.B) {
			f := newFloor2(keys)
			run(b, func(k string) { f.increment(k, 1) })
		})
		b.Run(fmt.Sprintf("keys=%d/floor1pad", n), func(b *testing.B) {
			f := newFloorKeyed(keys)
			run(b, func(k string) { f.increment(k, 1, false) })
		})
		b.Run(fmt.Sprintf("keys=%d/floor1key", n), func(b *testing.B) {
			f := newFloorKeyed(keys)
			run(b, func(k string) { f.increment(k, 1, true) })
		})
		b.Run(fmt.Sprintf("keys=%d/increment-async", n), func(b *testing.B) {
			ns := benchNamespaceOf(b, "async", keys)
			run(b, func(k string) {
				if _, err := ns.Increment(ctx, k, time.Minute, 1); err != nil {
					b.Fatal(err)
				}
			})
		})
		b.Run(fmt.Sprintf("keys=%d/floor2", n), func(b *testing.B) { benchFloor2(b, keys, false, idx) })
		b.Run(fmt.Sprintf("keys=%d/allow2-async", n), func(b *testing.B) {
			ns := benchNamespaceOf(b, "async", keys)
			run(b, func(k string) {
				if d, err := ns.Allow(ctx, k, 1, limits...); err != nil || !d.Allowed {
					b.Fatal(d, err)
				}
			})
		})
		// The same calls on keys written into a buffer, as a server builds
		// its key from the request (-buf), and one at a time, each call's key
		// chosen through the result of the one before (-dep): see inPlace.
		for _, mode := range []string{"buf", "dep"} {
			dep := mode == "dep"
			b.Run(fmt.Sprintf("keys=%d/baseline-%s", n, mode), func(b *testing.B) {
				base := newBaselineOf(keys)
				inPlace(b, keys, idx, dep, func(k string) uint64 { return uint64(base.add(k, 1)) >> 62 })
			})
			b.Run(fmt.Sprintf("keys=%d/floor1key-%s", n, mode), func(b *testing.B) {
				f := newFloorKeyed(keys)
				inPlace(b, keys, idx, dep, func(k string) uint64 { return math.Float64bits(f.increment(k, 1, true)) >> 63 })
			})
			b.Run(fmt.Sprintf("keys=%d/increment-async-%s", n, mode), func(b *testing.B) {
				ns := benchNamespaceOf(b, "async", keys)
				inPlace(b, keys, idx, dep, func(k string) uint64 {
					r, err := ns.Increment(ctx, k, time.Minute, 1)
					if err != nil {
						b.Fatal(err)
					}
					return math.Float64bits(r) >> 63
				})
				requireAllHeld(b, ns, n)
			})
			b.Run(fmt.Sprintf("keys=%d/allow2-async-%s", n, mode), func(b *testing.B) {
				ns := benchNamespaceOf(b, "async", keys)
				inPlace(b, keys, idx, dep, func(k string) uint64 {
					d, err := ns.Allow(ctx, k, 1, limits...)
					if err != nil || !d.Allowed {
						b.Fatal(d, err)
					}
					return uint64(d.Remaining) >> 63
				})
				requireAllHeld(b, ns, n)
			})
		}
	}
}

// floorKeyed is floor1 with each key's state in an 80-byte allocation that
// also holds a copy of the key, as the table's entries do (64 bytes and the
// key, 80 bytes for these 13-byte keys): floor1key compares the copy on
// each call, as a table that owns its keys must; floor1pad only pays for
// the larger, unaligned allocation. Benchmarks only.
type floorKeyed struct {
	keys  keyMap[floorKeyedState]
	clock atomic.Int64
}

type floorKeyedState struct {
	floorKey
	klen uint8
	key  [16]byte
}

func newFloorKeyed(keys []string) *floorKeyed {
	f := new(floorKeyed)
	f.keys.init(keys)
	for i := range f.keys.shards {
		for k, st := range f.keys.shards[i].m {
			if len(k) > len(st.key) {
				panic("floorKeyed holds keys of up to 16 bytes")
			}
			st.klen = uint8(copy(st.key[:], k))
		}
	}
	f.clock.Store(time.Now().UnixMilli())
	return f
}

// increment is floor1's increment; with compare, it first checks the key's
// copy against key.
func (f *floorKeyed) increment(key string, i int, compare bool) float64 {
	st := f.keys.get(key)
	if compare && string(st.key[:st.klen]) != key {
		panic("floorKeyed: wrong key")
	}
	return st.increment(i, f.clock.Load())
}

// inPlace is runPatternOf, serial, on keys written into a buffer of the
// loop's own instead of read from keys: a server builds its key from the
// request it serves, so the key's bytes are in cache, and they are not the
// bytes a map of keys stores (Go's string comparison skips the bytes of two
// strings with one pointer, as runPatternOf's keys are to the baseline's
// map). keys must be userKeys'.
//
// With dep, each call's key index is offset by a value derived from the
// call before's result (always 0, which the processor cannot know): a call
// starts only when the one before has finished, as in a server, where each
// check sits among its request's own work, instead of overlapping its waits
// on memory with the next call's.
//
// The calls see the key as a string over the buffer, made after the key is
// written: they only read it. Nothing keeps it as long as every key is held
// (none is inserted, and no cold read queues it); the Namespace cases check
// that after the loop (requireAllHeld).
func inPlace(b *testing.B, keys []string, idx []int, dep bool, op func(key string) uint64) {
	buf := []byte(keys[0])
	for _, j := range []int{0, len(keys) / 2, len(keys) - 1} {
		if writeUserKey(buf, j); string(buf) != keys[j] {
			b.Fatalf("inPlace writes %q for key %d, want %q", buf, j, keys[j])
		}
	}
	b.ReportAllocs()
	var d uint64
	for i := 0; b.Loop(); i++ {
		writeUserKey(buf, idx[(uint64(i)+d)&uint64(len(idx)-1)])
		r := op(unsafe.String(&buf[0], len(buf)))
		if dep {
			d = r
		}
	}
}

// writeUserKey writes userKeys' key j ("user:" and 8 digits) into buf.
func writeUserKey(buf []byte, j int) {
	for p := len(buf) - 1; p >= len("user:"); p-- {
		buf[p] = byte('0' + j%10)
		j /= 10
	}
}

// requireAllHeld fails b unless ns still holds all n keys and evicted none:
// then no call on a key written by inPlace kept it.
func requireAllHeld(b *testing.B, ns *ratelimit.Namespace, n int) {
	if st := ns.Stats(); st.TrackedKeys != n || st.Evictions != 0 {
		b.Fatalf("%d keys held, %d evicted: want %d and 0", st.TrackedKeys, st.Evictions, n)
	}
}
