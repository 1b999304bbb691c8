package shm

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
	"unsafe"
)

// BenchmarkTableUniform splits a uniform Increment over 100,000 keys into
// the table's parts, next to a Go map holding the same entries:
//
//   - map-find and table-find: the lookup. map-find reads from the entry
//     what findFast reads (its flags, its newest window, its key's bytes),
//     so the two compare the table's index with the map;
//   - map-add and table-findadd: the lookup and one atomic addition to the
//     entry's count;
//   - table-fast: the whole lock-free count (addOpenFast: the views of both
//     windows, the marks for sync and eviction);
//   - table-add: AddOpen, the call Increment makes.
//
// Each case runs back to back on the keys' strings; on keys written into a
// buffer (-buf), as a server builds its key from the request; and one call
// at a time (-dep), each call's key chosen through the result of the one
// before, so that no call overlaps its waits on memory with the next one's
// (as ratelimit's inPlace does). Benchmarks only: it locates the table's
// share of BenchmarkUniformKeys.
func BenchmarkTableUniform(b *testing.B) {
	const n, now = 100_000, 1_000_500
	tb, err := New(Options{Sizes: []time.Duration{time.Second, time.Minute}, Track: true})
	if err != nil {
		b.Fatal(err)
	}
	keys := make([]string, n)
	m := make(map[string]*entry, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("user:%08d", i)
		tb.AddOpen(keys[i], 1, now, 1, false, false)
		_, e, _, _, ok := tb.findFast(keys[i], 1, now)
		if !ok {
			b.Fatal("key not held")
		}
		m[keys[i]] = e
	}
	_, par := tb.windowOf(1, now)
	idx := make([]int, 1<<16)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range idx {
		idx[i] = rng.IntN(n)
	}
	buf := []byte(keys[0])
	for _, j := range []int{0, n / 2, n - 1} {
		if writeUserKey(buf, j); string(buf) != keys[j] {
			b.Fatalf("wrote %q for key %d, want %q", buf, j, keys[j])
		}
	}
	for _, mode := range []string{"", "-buf", "-dep"} {
		// run calls op on key after key; the calls only read the key, and
		// every key is held, so none keeps a key written into buf.
		run := func(b *testing.B, op func(key string) uint64) {
			var d uint64
			for i := 0; b.Loop(); i++ {
				j := idx[(uint64(i)+d)&uint64(len(idx)-1)]
				if mode == "" {
					op(keys[j])
					continue
				}
				writeUserKey(buf, j)
				if r := op(unsafe.String(&buf[0], len(buf))); mode == "-dep" {
					d = r
				}
			}
		}
		b.Run("map-find"+mode, func(b *testing.B) {
			run(b, func(k string) uint64 {
				e := m[k]
				if e == nil || e.flags.Load()&flagDead != 0 || e.key() != k {
					b.Fatal("missing")
				}
				return uint64(e.w[1].latest.Load()) >> 63
			})
		})
		b.Run("table-find"+mode, func(b *testing.B) {
			run(b, func(k string) uint64 {
				_, e, _, _, ok := tb.findFast(k, 1, now)
				if !ok {
					b.Fatal("missing")
				}
				return uint64(e.w[1].latest.Load()) >> 63
			})
		})
		b.Run("map-add"+mode, func(b *testing.B) {
			run(b, func(k string) uint64 { return uint64(m[k].w[1].slot[par].local.Add(1)) >> 31 })
		})
		b.Run("table-findadd"+mode, func(b *testing.B) {
			run(b, func(k string) uint64 {
				_, e, _, par, ok := tb.findFast(k, 1, now)
				if !ok {
					b.Fatal("missing")
				}
				return uint64(e.w[1].slot[par].local.Add(1)) >> 31
			})
		})
		b.Run("table-fast"+mode, func(b *testing.B) {
			run(b, func(k string) uint64 {
				vw, ok := tb.addOpenFast(k, 1, now, 1)
				if !ok {
					b.Fatal("missing")
				}
				return uint64(vw.Cur) >> 63
			})
		})
		b.Run("table-add"+mode, func(b *testing.B) {
			run(b, func(k string) uint64 {
				vw, held, _ := tb.AddOpen(k, 1, now, 1, false, false)
				if !held {
					b.Fatal("missing")
				}
				return uint64(vw.Cur) >> 63
			})
		})
	}
	if tb.Len() != n {
		b.Fatalf("%d keys held, want %d", tb.Len(), n)
	}
}

// writeUserKey writes key j of the benchmark ("user:" and 8 digits) into buf.
func writeUserKey(buf []byte, j int) {
	for p := len(buf) - 1; p >= len("user:"); p-- {
		buf[p] = byte('0' + j%10)
		j /= 10
	}
}
