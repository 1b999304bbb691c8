package compare

import (
	"context"
	"fmt"
	"hash/maphash"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sethvargo/go-limiter/memorystore"
	"golang.org/x/time/rate"

	"github.com/ratesync/ratelimit"
)

const localKeys = 100_000

var localKeyNames = func() []string {
	keys := make([]string, localKeys)
	for i := range keys {
		keys[i] = fmt.Sprintf("user:%08d", i)
	}
	return keys
}()

// localPattern returns indexes into localKeyNames: uniform, or one hot key.
func localPattern(kind string) []int {
	idx := make([]int, 1<<16)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range idx {
		if kind == "uniform" {
			idx[i] = rng.IntN(localKeys)
		}
	}
	return idx
}

func runLocal(b *testing.B, parallel bool, idx []int, op func(key string)) {
	b.ReportAllocs()
	b.ResetTimer()
	if !parallel {
		for i := 0; b.Loop(); i++ {
			op(localKeyNames[idx[i&(len(idx)-1)]])
		}
		return
	}
	var seed atomic.Int64
	b.RunParallel(func(pb *testing.PB) {
		i := int(seed.Add(7919))
		for pb.Next() {
			op(localKeyNames[idx[i&(len(idx)-1)]])
			i++
		}
	})
}

// xrate is x/time/rate used per key: a sharded map of limiters.
type xrate struct {
	seed   maphash.Seed
	shards [64]struct {
		mu sync.RWMutex
		m  map[string]*rate.Limiter
		_  [40]byte
	}
}

func newXRate(r rate.Limit, burst int) *xrate {
	x := &xrate{seed: maphash.MakeSeed()}
	for i := range x.shards {
		x.shards[i].m = make(map[string]*rate.Limiter)
	}
	for _, k := range localKeyNames {
		x.shards[maphash.String(x.seed, k)&63].m[k] = rate.NewLimiter(r, burst)
	}
	return x
}

func (x *xrate) allow(key string) bool {
	s := &x.shards[maphash.String(x.seed, key)&63]
	s.mu.RLock()
	l := s.m[key]
	s.mu.RUnlock()
	return l.Allow()
}

// BenchmarkLocalTokenBucket: a local token-bucket check over 100,000 keys
// (uniform, and one hot key), serial and parallel, for this library's
// Namespace.Allow (local mode, the default cached clock), x/time/rate's
// Limiter per key in a sharded map, and sethvargo/go-limiter's memorystore,
// in one run. Every request is admitted.
//
//	go test -run '^$' -bench BenchmarkLocalTokenBucket -count 6 .
func BenchmarkLocalTokenBucket(b *testing.B) {
	ctx := context.Background()
	const perSecond = 1 << 19
	for _, pattern := range []string{"uniform", "hot"} {
		idx := localPattern(pattern)
		for _, par := range []bool{false, true} {
			run := "serial"
			if par {
				run = "parallel"
			}
			b.Run("ratelimit/"+pattern+"/"+run, func(b *testing.B) {
				reg := ratelimit.NewRegistry()
				b.Cleanup(func() { _ = reg.Close(ctx) })
				ns, err := reg.New(ratelimit.Config{WindowSizes: []time.Duration{time.Second}, SyncRate: -1, MaxKeys: 2 * localKeys})
				if err != nil {
					b.Fatal(err)
				}
				l := ratelimit.Limit{Algorithm: ratelimit.TokenBucket, Window: time.Second, Max: perSecond, Burst: 1 << 40}
				for _, k := range localKeyNames {
					_, _ = ns.Allow(ctx, k, 1, l)
				}
				runLocal(b, par, idx, func(k string) {
					if d, err := ns.Allow(ctx, k, 1, l); err != nil || !d.Allowed {
						b.Fatal(d, err)
					}
				})
			})
			b.Run("xtimerate/"+pattern+"/"+run, func(b *testing.B) {
				x := newXRate(perSecond, 1<<40)
				runLocal(b, par, idx, func(k string) {
					if !x.allow(k) {
						b.Fatal("rejected")
					}
				})
			})
			b.Run("golimiter/"+pattern+"/"+run, func(b *testing.B) {
				// go-limiter adds interval/tokens tokens per elapsed
				// interval, capped at Tokens: with more tokens than the
				// interval has nanoseconds it never refills (2^40 per
				// second ran dry after a second). An interval longer
				// than the run and more tokens than it takes keep every
				// request admitted, with the same work per Take.
				st, err := memorystore.New(&memorystore.Config{Tokens: 1 << 40, Interval: time.Hour, SweepInterval: time.Hour, SweepMinTTL: time.Hour})
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { _ = st.Close(ctx) })
				for _, k := range localKeyNames {
					_, _, _, _, _ = st.Take(ctx, k)
				}
				runLocal(b, par, idx, func(k string) {
					if _, _, _, ok, err := st.Take(ctx, k); err != nil || !ok {
						b.Fatal(ok, err)
					}
				})
			})
		}
	}
}
