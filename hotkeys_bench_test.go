package ratelimit_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratesync/ratelimit"
)

// BenchmarkAllowHotKeys compares Allow (local mode, Zipf-skewed keys, in
// parallel) with the hot-key report off and on, in one run: the difference
// is the report's cost per check.
func BenchmarkAllowHotKeys(b *testing.B) {
	idx := keyPattern("zipf")
	lim := ratelimit.Limit{Window: time.Minute, Max: 1 << 40}
	for _, bc := range []struct {
		name string
		hk   ratelimit.HotKeysConfig
	}{
		{"off", ratelimit.HotKeysConfig{}},
		{"on", ratelimit.HotKeysConfig{Capacity: 256}},
		{"on-unsampled", ratelimit.HotKeysConfig{Capacity: 256, SampleRate: 1}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			reg := ratelimit.NewRegistry()
			defer reg.Close(ctx)
			ns, err := reg.New(ratelimit.Config{WindowSizes: []time.Duration{time.Minute}, SyncRate: -1, HotKeys: bc.hk})
			if err != nil {
				b.Fatal(err)
			}
			var seq atomic.Int64
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				i := int(seq.Add(1)) * 7919
				for pb.Next() {
					if _, err := ns.Allow(ctx, benchKeyNames[idx[i&(len(idx)-1)]], 1, lim); err != nil {
						b.Error(err)
						return
					}
					i++
				}
			})
		})
	}
}
