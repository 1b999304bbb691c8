package ratelimitotel_test

import (
	"context"
	"fmt"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/ratesync/ratelimit"
	"github.com/ratesync/ratelimit/ratelimitotel"
)

// A namespace observed through an OpenTelemetry meter provider: three
// decisions against a limit of two, then the decisions counter read back.
func Example() {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())
	obs, err := ratelimitotel.New(ratelimitotel.Options{MeterProvider: mp})
	if err != nil {
		fmt.Println(err)
		return
	}

	reg := ratelimit.NewRegistry()
	defer reg.Close(context.Background())
	ns, _ := reg.New(ratelimit.Config{Namespace: "api", WindowSizes: []time.Duration{time.Minute}, SyncRate: -1, Observer: obs})
	obs.Register(ns)
	for range 3 {
		_, _ = ns.Allow(context.Background(), "client", 1, ratelimit.Limit{Window: time.Minute, Max: 2, Name: "orders"})
	}

	var rm metricdata.ResourceMetrics
	_ = reader.Collect(context.Background(), &rm)
	for _, m := range rm.ScopeMetrics[0].Metrics {
		if m.Name != "ratelimit.decisions" {
			continue
		}
		for _, decision := range []string{"allowed", "rejected"} {
			for _, p := range m.Data.(metricdata.Sum[int64]).DataPoints {
				if v, _ := p.Attributes.Value(ratelimitotel.AttrDecision); v.AsString() == decision {
					policy, _ := p.Attributes.Value(ratelimitotel.AttrPolicy)
					fmt.Printf("%s %s: %d\n", policy.AsString(), decision, p.Value)
				}
			}
		}
	}
	// Output:
	// orders allowed: 2
	// orders rejected: 1
}
