package metrics_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/ratesync/ratelimit"
	"github.com/ratesync/ratelimit/metrics"
)

// BenchmarkAllowObserved compares Allow (local mode, many keys) without an
// Observer and with the Prometheus Collector as its Observer.
func BenchmarkAllowObserved(b *testing.B) {
	keys := make([]string, 4096)
	for i := range keys {
		keys[i] = "client-" + strconv.Itoa(i)
	}
	lim := ratelimit.Limit{Window: time.Minute, Max: 1 << 40, Name: "bench"}
	for _, bc := range []struct {
		name string
		obs  func() ratelimit.Observer
	}{
		{"off", func() ratelimit.Observer { return nil }},
		{"prometheus", func() ratelimit.Observer { return metrics.NewCollector() }},
	} {
		b.Run(bc.name, func(b *testing.B) {
			reg := ratelimit.NewRegistry()
			defer reg.Close(context.Background())
			ns, err := reg.New(ratelimit.Config{WindowSizes: []time.Duration{time.Minute}, SyncRate: -1, Observer: bc.obs()})
			if err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				ctx := context.Background()
				i := 0
				for pb.Next() {
					if _, err := ns.Allow(ctx, keys[i%len(keys)], 1, lim); err != nil {
						b.Error(err)
						return
					}
					i += 7
				}
			})
		})
	}
}
