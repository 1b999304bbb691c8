package metrics_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/ratesync/ratelimit"
	"github.com/ratesync/ratelimit/metrics"
	"github.com/ratesync/ratelimit/strategy/memory"
)

func TestCollector(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	ctx := context.Background()
	store := memory.New()
	reg := ratelimit.NewRegistry()
	t.Cleanup(func() { _ = reg.Close(ctx) })
	ns, err := reg.New(ratelimit.Config{Namespace: "api", WindowSizes: []time.Duration{time.Second, time.Minute},
		SyncRate: time.Hour, Strategy: store, MaxKeys: 64})
	require.NoError(t, err)
	for i := range 100 {
		_, err := ns.Increment(ctx, strings.Repeat("k", i+1), time.Minute, 1)
		require.NoError(t, err)
	}
	lim := ratelimit.Limit{Window: time.Second, Max: 1}
	d, err := ns.Allow(ctx, "client", 1, lim)
	require.NoError(t, err)
	require.True(t, d.Allowed)
	d, err = ns.Allow(ctx, "client", 1, lim)
	require.NoError(t, err)
	require.False(t, d.Allowed)

	c := metrics.NewCollector(ns)
	pr := prometheus.NewPedanticRegistry()
	require.NoError(t, pr.Register(c))
	problems, err := testutil.CollectAndLint(c)
	require.NoError(t, err)
	require.Empty(t, problems)

	st := ns.Stats()
	require.Positive(t, st.Evictions)
	expected := `
# HELP ratelimit_decisions_total Allow decisions by binding limit window and outcome.
# TYPE ratelimit_decisions_total counter
ratelimit_decisions_total{decision="allowed",namespace="api",window="1m0s"} 0
ratelimit_decisions_total{decision="allowed",namespace="api",window="1s"} 1
ratelimit_decisions_total{decision="rejected",namespace="api",window="1m0s"} 0
ratelimit_decisions_total{decision="rejected",namespace="api",window="1s"} 1
# HELP ratelimit_tracked_keys Keys held in memory.
# TYPE ratelimit_tracked_keys gauge
ratelimit_tracked_keys{namespace="api"} ` + strconv.Itoa(st.TrackedKeys) + `
# HELP ratelimit_evictions_total Keys evicted by the MaxKeys cap.
# TYPE ratelimit_evictions_total counter
ratelimit_evictions_total{namespace="api"} ` + strconv.FormatInt(st.Evictions, 10) + `
`
	require.NoError(t, testutil.GatherAndCompare(pr, strings.NewReader(expected),
		"ratelimit_decisions_total", "ratelimit_tracked_keys", "ratelimit_evictions_total"))

	// A sync shows up, with its age and duration.
	require.NoError(t, ns.Sync(ctx))
	c.Remove(ns)
	require.Zero(t, testutil.CollectAndCount(c))
	c.Add(ns)
	require.Equal(t, 1, testutil.CollectAndCount(c, "ratelimit_last_sync_age_seconds"))
	require.Equal(t, 1.0, testutil.ToFloat64(filtered{c, "ratelimit_syncs_total"}))
}

// filtered narrows a collector to one metric, for testutil.ToFloat64.
type filtered struct {
	prometheus.Collector
	name string
}

func (f filtered) Collect(ch chan<- prometheus.Metric) {
	all := make(chan prometheus.Metric, 64)
	go func() { f.Collector.Collect(all); close(all) }()
	for m := range all {
		if strings.Contains(m.Desc().String(), `"`+f.name+`"`) {
			ch <- m
		}
	}
}
