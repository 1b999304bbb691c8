package metrics_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/ratesync/ratelimit"
	"github.com/ratesync/ratelimit/metrics"
	"github.com/ratesync/ratelimit/strategy/memory"
)

// gather returns the families of c by name.
func gather(t *testing.T, c prometheus.Collector) map[string]*dto.MetricFamily {
	t.Helper()
	pr := prometheus.NewPedanticRegistry()
	require.NoError(t, pr.Register(c))
	fams, err := pr.Gather()
	require.NoError(t, err)
	out := map[string]*dto.MetricFamily{}
	for _, f := range fams {
		out[f.GetName()] = f
	}
	return out
}

// find returns the metric of family f whose labels include want.
func find(t *testing.T, f *dto.MetricFamily, want map[string]string) *dto.Metric {
	t.Helper()
	require.NotNil(t, f)
	for _, m := range f.GetMetric() {
		got := map[string]string{}
		for _, l := range m.GetLabel() {
			got[l.GetName()] = l.GetValue()
		}
		match := true
		for k, v := range want {
			match = match && got[k] == v
		}
		if match {
			return m
		}
	}
	t.Fatalf("%s has no series with %v", f.GetName(), want)
	return nil
}

func TestCollectorAsObserver(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	ctx := context.Background()
	store := memory.New()
	reg := ratelimit.NewRegistry()
	t.Cleanup(func() { _ = reg.Close(ctx) })
	c := metrics.NewCollector()
	now := time.UnixMilli(1_700_000_040_000)
	ns, err := reg.New(ratelimit.Config{Namespace: "api", WindowSizes: []time.Duration{time.Minute},
		Strategy: store, RetryInterval: time.Hour, Observer: c, Clock: func() time.Time { return now }})
	require.NoError(t, err)
	c.Add(ns)

	lim := ratelimit.Limit{Window: time.Minute, Max: 2, Name: "orders"}
	for range 2 {
		d, err := ns.Allow(ctx, "client", 1, lim)
		require.NoError(t, err)
		require.True(t, d.Allowed)
	}
	d, err := ns.Allow(ctx, "client", 1, lim)
	require.NoError(t, err)
	require.False(t, d.Allowed)
	store.SetFaults(func(memory.Op) memory.Fault { return memory.Refuse })
	d, err = ns.Allow(ctx, "other", 1, lim)
	require.NoError(t, err)
	require.True(t, d.Allowed && d.Degraded)

	problems, err := testutil.CollectAndLint(c)
	require.NoError(t, err)
	require.Empty(t, problems)
	fams := gather(t, c)
	for _, name := range []string{"ratelimit_policy_decisions_total", "ratelimit_decision_duration_seconds",
		"ratelimit_retry_after_seconds", "ratelimit_store_duration_seconds", "ratelimit_store_errors_total",
		"ratelimit_pushed_counters_total", "ratelimit_pushed_delta_total"} {
		require.Contains(t, fams, name)
	}
	dec := fams["ratelimit_policy_decisions_total"]
	require.Equal(t, 2.0, find(t, dec, map[string]string{"namespace": "api", "policy": "orders", "decision": "allowed", "degraded": "false"}).GetCounter().GetValue())
	require.Equal(t, 1.0, find(t, dec, map[string]string{"policy": "orders", "decision": "rejected", "degraded": "false"}).GetCounter().GetValue())
	require.Equal(t, 1.0, find(t, dec, map[string]string{"policy": "orders", "decision": "allowed", "degraded": "true"}).GetCounter().GetValue())
	lat := find(t, fams["ratelimit_decision_duration_seconds"], map[string]string{"policy": "orders"}).GetHistogram()
	require.Equal(t, uint64(4), lat.GetSampleCount())
	require.Positive(t, lat.GetSampleSum())
	ra := find(t, fams["ratelimit_retry_after_seconds"], map[string]string{"policy": "orders"}).GetHistogram()
	require.Equal(t, uint64(1), ra.GetSampleCount())
	require.Equal(t, d0(t, ns, lim).Seconds(), ra.GetSampleSum())

	ok := find(t, fams["ratelimit_store_duration_seconds"], map[string]string{"op": "push", "outcome": "ok"}).GetHistogram()
	require.Equal(t, uint64(2), ok.GetSampleCount()) // two write-throughs; the rejection came from memory
	bad := find(t, fams["ratelimit_store_duration_seconds"], map[string]string{"op": "push", "outcome": "error"}).GetHistogram()
	require.Equal(t, uint64(1), bad.GetSampleCount())
	require.Equal(t, 1.0, find(t, fams["ratelimit_store_errors_total"], map[string]string{"op": "push"}).GetCounter().GetValue())
	require.Equal(t, 2.0, find(t, fams["ratelimit_pushed_counters_total"], nil).GetCounter().GetValue())
	require.Equal(t, 2.0, find(t, fams["ratelimit_pushed_delta_total"], nil).GetCounter().GetValue())
	// No series carries a key.
	for _, f := range fams {
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				require.NotContains(t, []string{"client", "other"}, l.GetValue(), f.GetName())
			}
		}
	}
}

// d0 returns the Retry-After a rejected "client" is told now.
func d0(t *testing.T, ns *ratelimit.Namespace, lim ratelimit.Limit) time.Duration {
	t.Helper()
	d, err := ns.Peek(context.Background(), "client", 1, lim)
	require.NoError(t, err)
	require.False(t, d.Allowed)
	return d.RetryAfter
}

func TestCollectorSyncCycles(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	ctx := context.Background()
	store := memory.New()
	reg := ratelimit.NewRegistry()
	t.Cleanup(func() { _ = reg.Close(ctx) })
	c := metrics.NewCollector()
	ns, err := reg.New(ratelimit.Config{WindowSizes: []time.Duration{time.Second, time.Minute},
		Strategy: store, SyncRate: time.Hour, Observer: c})
	require.NoError(t, err)
	c.Add(ns)
	_, err = ns.Increment(ctx, "k", time.Minute, 3)
	require.NoError(t, err)
	require.NoError(t, ns.Sync(ctx))
	store.SetFaults(func(memory.Op) memory.Fault { return memory.Refuse })
	_, err = ns.Increment(ctx, "k", time.Minute, 1)
	require.NoError(t, err)
	require.Error(t, ns.Sync(ctx))

	fams := gather(t, c)
	okSync := find(t, fams["ratelimit_sync_duration_seconds"], map[string]string{"namespace": "default", "outcome": "ok"}).GetHistogram()
	require.Equal(t, uint64(1), okSync.GetSampleCount())
	badSync := find(t, fams["ratelimit_sync_duration_seconds"], map[string]string{"outcome": "error"}).GetHistogram()
	require.Equal(t, uint64(1), badSync.GetSampleCount())
	require.Equal(t, 3.0, find(t, fams["ratelimit_pushed_delta_total"], nil).GetCounter().GetValue())
	require.Equal(t, 1.0, find(t, fams["ratelimit_store_errors_total"], map[string]string{"op": "push"}).GetCounter().GetValue())
	// The Stats-based figures are still there.
	require.Equal(t, 2.0, find(t, fams["ratelimit_syncs_total"], nil).GetCounter().GetValue())
	require.Equal(t, 1.0, find(t, fams["ratelimit_pending_hits"], nil).GetGauge().GetValue())
}

func TestZeroCollectorIgnoresEvents(t *testing.T) {
	var c metrics.Collector
	c.End(context.Background(), ratelimit.Event{Op: ratelimit.OpPush})
	c.Decision(context.Background(), ratelimit.DecisionEvent{})
	require.Zero(t, testutil.CollectAndCount(&c))
}
