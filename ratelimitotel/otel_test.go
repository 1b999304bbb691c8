package ratelimitotel_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/goleak"

	"github.com/ratesync/ratelimit"
	"github.com/ratesync/ratelimit/ratelimitotel"
	"github.com/ratesync/ratelimit/strategy/memory"
)

var epoch = time.UnixMilli(1_700_000_040_000) // a minute boundary

type harness struct {
	obs    *ratelimitotel.Observer
	reader *sdkmetric.ManualReader
	spans  *tracetest.InMemoryExporter
	tp     *sdktrace.TracerProvider
}

func newHarness(t *testing.T, traced bool) *harness {
	t.Helper()
	h := &harness{reader: sdkmetric.NewManualReader(), spans: tracetest.NewInMemoryExporter()}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(h.reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	opts := ratelimitotel.Options{MeterProvider: mp}
	if traced {
		h.tp = sdktrace.NewTracerProvider(sdktrace.WithSyncer(h.spans))
		t.Cleanup(func() { _ = h.tp.Shutdown(context.Background()) })
		opts.TracerProvider = h.tp
	}
	var err error
	h.obs, err = ratelimitotel.New(opts)
	require.NoError(t, err)
	return h
}

func (h *harness) collect(t *testing.T) map[string]metricdata.Metrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, h.reader.Collect(context.Background(), &rm))
	out := map[string]metricdata.Metrics{}
	for _, sm := range rm.ScopeMetrics {
		require.Equal(t, ratelimitotel.ScopeName, sm.Scope.Name)
		for _, m := range sm.Metrics {
			out[m.Name] = m
		}
	}
	return out
}

// has reports whether set holds every attribute of want; a want of "" means
// the attribute must be absent.
func has(set attribute.Set, want map[string]string) bool {
	for k, v := range want {
		got, ok := set.Value(attribute.Key(k))
		if v == "" && ok || v != "" && (!ok || got.String() != v) {
			return false
		}
	}
	return true
}

func sumPoint(t *testing.T, m metricdata.Metrics, want map[string]string) int64 {
	t.Helper()
	s, ok := m.Data.(metricdata.Sum[int64])
	require.True(t, ok, m.Name)
	for _, p := range s.DataPoints {
		if has(p.Attributes, want) {
			return p.Value
		}
	}
	t.Fatalf("%s: no point with %v", m.Name, want)
	return 0
}

func histPoint(t *testing.T, m metricdata.Metrics, want map[string]string) metricdata.HistogramDataPoint[float64] {
	t.Helper()
	hd, ok := m.Data.(metricdata.Histogram[float64])
	require.True(t, ok, m.Name)
	for _, p := range hd.DataPoints {
		if has(p.Attributes, want) {
			return p
		}
	}
	t.Fatalf("%s: no point with %v", m.Name, want)
	return metricdata.HistogramDataPoint[float64]{}
}

func gaugePoint[N int64 | float64](t *testing.T, m metricdata.Metrics) N {
	t.Helper()
	g, ok := m.Data.(metricdata.Gauge[N])
	require.True(t, ok, m.Name)
	require.Len(t, g.DataPoints, 1)
	return g.DataPoints[0].Value
}

func TestMetricsSynchronous(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	h := newHarness(t, true)
	ctx := context.Background()
	store := memory.New()
	reg := ratelimit.NewRegistry()
	t.Cleanup(func() { _ = reg.Close(ctx) })
	ns, err := reg.New(ratelimit.Config{Namespace: "api", WindowSizes: []time.Duration{time.Minute}, Strategy: store,
		RetryInterval: time.Hour, Observer: h.obs, Clock: func() time.Time { return epoch }})
	require.NoError(t, err)
	h.obs.Register(ns)

	lim := ratelimit.Limit{Window: time.Minute, Max: 2, Name: "orders"}
	for range 2 {
		_, err := ns.Allow(ctx, "client", 1, lim)
		require.NoError(t, err)
	}
	d, err := ns.Allow(ctx, "client", 1, lim)
	require.NoError(t, err)
	require.False(t, d.Allowed)
	store.SetFaults(func(memory.Op) memory.Fault { return memory.Refuse })
	_, err = ns.Allow(ctx, "other", 1, lim)
	require.NoError(t, err)

	ms := h.collect(t)
	dec := ms["ratelimit.decisions"]
	require.Equal(t, "{decision}", dec.Unit)
	require.Equal(t, int64(2), sumPoint(t, dec, map[string]string{"ratelimit.namespace": "api", "ratelimit.policy": "orders", "ratelimit.decision": "allowed", "ratelimit.degraded": "false"}))
	require.Equal(t, int64(1), sumPoint(t, dec, map[string]string{"ratelimit.decision": "rejected", "ratelimit.degraded": "false"}))
	require.Equal(t, int64(1), sumPoint(t, dec, map[string]string{"ratelimit.decision": "allowed", "ratelimit.degraded": "true"}))
	lat := histPoint(t, ms["ratelimit.decision.duration"], map[string]string{"ratelimit.policy": "orders"})
	require.Equal(t, "s", ms["ratelimit.decision.duration"].Unit)
	require.Equal(t, uint64(4), lat.Count)
	require.Equal(t, ratelimitotel.DecisionBuckets, lat.Bounds)
	ra := histPoint(t, ms["ratelimit.retry_after"], map[string]string{"ratelimit.policy": "orders"})
	require.Equal(t, uint64(1), ra.Count)
	require.Equal(t, d.RetryAfter.Seconds(), ra.Sum)
	okPush := histPoint(t, ms["ratelimit.store.duration"], map[string]string{"ratelimit.store.operation": "push", "error.type": ""})
	require.Equal(t, uint64(2), okPush.Count)
	badPush := histPoint(t, ms["ratelimit.store.duration"], map[string]string{"ratelimit.store.operation": "push", "error.type": "store_error"})
	require.Equal(t, uint64(1), badPush.Count)
	require.Equal(t, int64(2), sumPoint(t, ms["ratelimit.pushed.counters"], map[string]string{"ratelimit.namespace": "api"}))
	require.Equal(t, int64(1), gaugePoint[int64](t, ms["ratelimit.pending_hits"])) // the refused write-through waits
	require.Positive(t, gaugePoint[int64](t, ms["ratelimit.tracked_keys"]))

	// One span per check, each store call its child.
	spans := h.spans.GetSpans()
	byID := map[trace.SpanID]tracetest.SpanStub{}
	var checks, pushes int
	for _, s := range spans {
		byID[s.SpanContext.SpanID()] = s
	}
	for _, s := range spans {
		switch s.Name {
		case "ratelimit.check":
			checks++
			require.Equal(t, trace.SpanKindInternal, s.SpanKind)
		case "ratelimit.push":
			pushes++
			require.Equal(t, trace.SpanKindClient, s.SpanKind)
			parent, ok := byID[s.Parent.SpanID()]
			require.True(t, ok, "push span without a parent")
			require.Equal(t, "ratelimit.check", parent.Name)
		}
	}
	require.Equal(t, 4, checks)
	require.Equal(t, 3, pushes) // the rejection was answered from memory
}

func TestSyncCycleSpansAndGauges(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	h := newHarness(t, true)
	ctx := context.Background()
	store := memory.New()
	reg := ratelimit.NewRegistry()
	t.Cleanup(func() { _ = reg.Close(ctx) })
	// ColdReadOff: a cold key's first decision would read the store (a
	// fetch span of its own); this test is about the sync cycle's spans.
	ns, err := reg.New(ratelimit.Config{WindowSizes: []time.Duration{time.Second, time.Minute}, Strategy: store,
		SyncRate: time.Hour, Observer: h.obs, ColdRead: ratelimit.ColdReadOff})
	require.NoError(t, err)
	h.obs.Register(ns)

	// The caller's own span is never ended by the Observer.
	ctx, parent := h.tp.Tracer("test").Start(ctx, "request")
	_, err = ns.Allow(ctx, "k", 3, ratelimit.Limit{Window: time.Minute, Max: 5}, ratelimit.Limit{Window: time.Second, Max: 5})
	require.NoError(t, err)
	require.Empty(t, h.spans.GetSpans(), "asynchronous decisions open no span and end none")
	require.NoError(t, ns.Sync(ctx))
	parent.End()

	var sync, push tracetest.SpanStub
	for _, s := range h.spans.GetSpans() {
		switch s.Name {
		case "ratelimit.sync":
			sync = s
		case "ratelimit.push":
			push = s
		}
	}
	require.Equal(t, "ratelimit.sync", sync.Name)
	require.Equal(t, sync.SpanContext.SpanID(), push.Parent.SpanID())
	require.Equal(t, parent.SpanContext().SpanID(), sync.Parent.SpanID())
	require.Contains(t, push.Attributes, attribute.Int("ratelimit.push.diffs", 2))

	store.SetFaults(func(memory.Op) memory.Fault { return memory.Refuse })
	_, err = ns.Increment(context.Background(), "k", time.Minute, 1)
	require.NoError(t, err)
	require.Error(t, ns.Sync(context.Background()))

	ms := h.collect(t)
	require.Equal(t, uint64(1), histPoint(t, ms["ratelimit.sync.duration"], map[string]string{"ratelimit.namespace": "default", "error.type": ""}).Count)
	require.Equal(t, uint64(1), histPoint(t, ms["ratelimit.sync.duration"], map[string]string{"error.type": "store_error"}).Count)
	require.Equal(t, int64(6), sumPoint(t, ms["ratelimit.pushed.delta"], nil))
	require.Equal(t, int64(2), sumPoint(t, ms["ratelimit.sync.cycles"], nil))
	require.Equal(t, int64(1), sumPoint(t, ms["ratelimit.sync.errors"], nil))
	require.Equal(t, int64(1), gaugePoint[int64](t, ms["ratelimit.pending_hits"]))
	age := gaugePoint[float64](t, ms["ratelimit.sync.age"])
	require.GreaterOrEqual(t, age, 0.0)
	require.Less(t, age, 60.0)
	var failed int
	for _, s := range h.spans.GetSpans() {
		if s.Name == "ratelimit.sync" && s.Status.Code.String() == "Error" {
			failed++
		}
	}
	require.Equal(t, 1, failed)

	h.obs.Unregister(ns)
	ms = h.collect(t)
	_, ok := ms["ratelimit.pending_hits"]
	require.False(t, ok && len(ms["ratelimit.pending_hits"].Data.(metricdata.Gauge[int64]).DataPoints) > 0)
	require.NoError(t, h.obs.Shutdown())
}

func TestNoTracerNoSpans(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	h := newHarness(t, false)
	ctx := context.Background()
	reg := ratelimit.NewRegistry()
	t.Cleanup(func() { _ = reg.Close(ctx) })
	ns, err := reg.New(ratelimit.Config{WindowSizes: []time.Duration{time.Minute}, Strategy: memory.New(),
		RetryInterval: time.Hour, Observer: h.obs})
	require.NoError(t, err)
	// A caller span from another provider must survive the check untouched.
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(h.spans))
	t.Cleanup(func() { _ = tp.Shutdown(ctx) })
	cctx, parent := tp.Tracer("test").Start(ctx, "request")
	_, err = ns.Allow(cctx, "k", 1, ratelimit.Limit{Window: time.Minute, Max: 5})
	require.NoError(t, err)
	require.Empty(t, h.spans.GetSpans())
	parent.End()
	require.Len(t, h.spans.GetSpans(), 1)
	// Bad arguments record nothing.
	_, err = ns.Allow(ctx, "", 1, ratelimit.Limit{Window: time.Minute, Max: 5})
	require.Error(t, err)
	ms := h.collect(t)
	require.Equal(t, int64(1), sumPoint(t, ms["ratelimit.decisions"], map[string]string{"ratelimit.decision": "allowed"}))
}
