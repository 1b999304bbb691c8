package ratelimit_test

import (
	"context"
	"hash/maphash"
	"sync"
	"testing"
	"time"

	"golang.org/x/time/rate"

	"github.com/ratesync/ratelimit"
)

// xrateMap is how x/time/rate is used per key: a sharded map of limiters.
type xrateMap struct {
	seed   maphash.Seed
	shards [64]struct {
		mu sync.RWMutex
		m  map[string]*rate.Limiter
		_  [40]byte
	}
}

func newXRateMap(l rate.Limit, burst int) *xrateMap {
	x := &xrateMap{seed: maphash.MakeSeed()}
	for i := range x.shards {
		x.shards[i].m = make(map[string]*rate.Limiter)
	}
	for _, k := range benchKeyNames {
		s := &x.shards[maphash.String(x.seed, k)&63]
		s.m[k] = rate.NewLimiter(l, burst)
	}
	return x
}

func (x *xrateMap) allow(key string, now time.Time) bool {
	s := &x.shards[maphash.String(x.seed, key)&63]
	s.mu.RLock()
	lim := s.m[key]
	s.mu.RUnlock()
	return lim.AllowN(now, 1)
}

// BenchmarkTokenBucket measures a local token-bucket Allow over 100,000 keys
// (uniform, and one hot key) next to golang.org/x/time/rate's Limiter per key
// in a sharded map, in the same run. The limits are high, so every request is
// admitted. (sethvargo/go-limiter and redis_rate are compared in the compare
// module, to keep them out of the library's go.mod.)
func BenchmarkTokenBucket(b *testing.B) {
	ctx := context.Background()
	l := ratelimit.Limit{Algorithm: ratelimit.TokenBucket, Window: time.Second, Max: 1 << 19, Burst: 1 << 30}
	for _, pattern := range []string{"uniform", "hot"} {
		idx := keyPattern(pattern)
		for _, par := range []bool{false, true} {
			run := "serial"
			if par {
				run = "parallel"
			}
			b.Run("xtimerate/"+pattern+"/"+run, func(b *testing.B) {
				x := newXRateMap(rate.Limit(1<<19), 1<<30)
				runPattern(b, par, idx, func(k string) {
					if !x.allow(k, time.Now()) {
						b.Fatal("rejected")
					}
				})
			})
			b.Run("ratelimit/"+pattern+"/"+run, func(b *testing.B) {
				reg := ratelimit.NewRegistry()
				b.Cleanup(func() { _ = reg.Close(ctx) })
				ns, err := reg.New(ratelimit.Config{WindowSizes: []time.Duration{time.Second}, SyncRate: -1, MaxKeys: 2 * benchKeys})
				if err != nil {
					b.Fatal(err)
				}
				for _, k := range benchKeyNames {
					if _, err := ns.Allow(ctx, k, 1, l); err != nil {
						b.Fatal(err)
					}
				}
				runPattern(b, par, idx, func(k string) {
					if d, err := ns.Allow(ctx, k, 1, l); err != nil || !d.Allowed {
						b.Fatal(d, err)
					}
				})
			})
		}
	}
}
