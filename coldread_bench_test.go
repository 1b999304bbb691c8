package ratelimit_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratesync/ratelimit"
	"github.com/ratesync/ratelimit/strategy/memory"
)

// BenchmarkColdAllow is Allow on a periodic namespace over the memory store,
// with the cold read on and off: "cold" makes every call on a key never seen
// (each waits for its read; in parallel, reads are shared), "hot" on one of
// 100,000 keys already held (the cost of asking whether the key is held).
// MaxKeys 1<<16 keeps the cold run's table at its cap, evicting as it goes.
func BenchmarkColdAllow(b *testing.B) {
	for _, kind := range []string{"cold", "hot"} {
		for _, setting := range []struct {
			name string
			cold ratelimit.ColdRead
		}{{"on", ratelimit.ColdReadOn}, {"off", ratelimit.ColdReadOff}} {
			b.Run(kind+"/"+setting.name, func(b *testing.B) {
				reg := ratelimit.NewRegistry()
				defer func() { _ = reg.Close(context.Background()) }()
				ns, err := reg.New(ratelimit.Config{WindowSizes: []time.Duration{time.Second, time.Minute}, SyncRate: time.Hour,
					Strategy: memory.New(), MaxKeys: 1 << 17, ColdRead: setting.cold})
				if err != nil {
					b.Fatal(err)
				}
				limits := []ratelimit.Limit{{Window: time.Second, Max: 1 << 40}, {Window: time.Minute, Max: 1 << 40}}
				if kind == "hot" {
					for _, k := range benchKeyNames {
						if _, err := ns.Allow(context.Background(), k, 1, limits...); err != nil {
							b.Fatal(err)
						}
					}
				}
				idx := keyPattern("uniform")
				var next atomic.Int64
				b.ReportAllocs()
				b.ResetTimer()
				b.RunParallel(func(pb *testing.PB) {
					ctx := context.Background()
					buf := []byte("cold:")
					for i := int(next.Add(1)) << 40; pb.Next(); i++ {
						key := benchKeyNames[idx[i&(len(idx)-1)]]
						if kind == "cold" {
							buf = strconv.AppendInt(buf[:len("cold:")], int64(i), 36)
							key = string(buf)
						}
						if _, err := ns.Allow(ctx, key, 1, limits...); err != nil {
							b.Error(err)
							return
						}
					}
				})
				b.StopTimer() // Close's flush is not the check's cost
			})
		}
	}
}
