package metrics_test

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/ratesync/ratelimit"
	"github.com/ratesync/ratelimit/httplimit"
	"github.com/ratesync/ratelimit/metrics"
	"github.com/ratesync/ratelimit/policy"
)

func TestPolicyCollector(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	ctx := context.Background()
	store := policy.NewMemoryStore()
	_, err := policy.Publish(ctx, store, []byte("default: {limits: [{window: 1m, max: 1}]}\ndeny: {keys: [bad]}"), nil)
	require.NoError(t, err)
	_, err = store.Append(ctx, []byte("default: {limits: [{window: 1m, max: 0}]}"))
	require.NoError(t, err)
	_, err = policy.Rollback(ctx, store)
	require.NoError(t, err)
	w, err := policy.NewWatcher(ctx, store, policy.WatchOptions{Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	defer w.Close()

	reg := ratelimit.NewRegistry()
	defer reg.Close(ctx)
	ns, err := reg.New(ratelimit.Config{WindowSizes: []time.Duration{time.Minute}, SyncRate: -1})
	require.NoError(t, err)
	l, err := httplimit.NewWithPolicy(httplimit.PolicyOptions{Options: httplimit.Options{Namespace: ns, KeyFunc: httplimit.KeyByHeader("K")}, Policy: w})
	require.NoError(t, err)
	h := l.Wrap(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	for _, k := range []string{"a", "a", "bad"} {
		r := httptest.NewRequest("GET", "/", nil)
		r.Header.Set("K", k)
		h.ServeHTTP(httptest.NewRecorder(), r)
	}
	c := metrics.NewPolicyCollector("api", w, l)
	require.NoError(t, testutil.CollectAndCompare(c, strings.NewReader(`
# HELP ratelimit_policy_version Version of the policy this node's watcher enforces (0: none).
# TYPE ratelimit_policy_version gauge
ratelimit_policy_version{policy="api"} 1
# HELP ratelimit_policy_served_version Version of the snapshot the middleware last served with.
# TYPE ratelimit_policy_served_version gauge
ratelimit_policy_served_version{policy="api"} 1
# HELP ratelimit_policy_rejections_total 429s sent by enforced limits.
# TYPE ratelimit_policy_rejections_total counter
ratelimit_policy_rejections_total{policy="api"} 1
`), "ratelimit_policy_version", "ratelimit_policy_served_version", "ratelimit_policy_rejections_total"))
	require.NoError(t, testutil.CollectAndCompare(c, strings.NewReader(`
# HELP ratelimit_policy_requests_total Requests by the resolution level that decided them.
# TYPE ratelimit_policy_requests_total counter
ratelimit_policy_requests_total{level="allow",policy="api"} 0
ratelimit_policy_requests_total{level="default",policy="api"} 2
ratelimit_policy_requests_total{level="deny",policy="api"} 1
ratelimit_policy_requests_total{level="none",policy="api"} 0
ratelimit_policy_requests_total{level="override",policy="api"} 0
ratelimit_policy_requests_total{level="route",policy="api"} 0
ratelimit_policy_requests_total{level="tier",policy="api"} 0
# HELP ratelimit_policy_rejected_versions_total Policy versions refused (bad document or failed check); the last good one stayed in force.
# TYPE ratelimit_policy_rejected_versions_total counter
ratelimit_policy_rejected_versions_total{policy="api"} 0
`), "ratelimit_policy_requests_total", "ratelimit_policy_rejected_versions_total"))
}

// statser stands for a gRPC policy middleware (grpclimit's PolicyLimiter,
// whose Stats are httplimit.PolicyStats).
type statser httplimit.PolicyStats

func (s statser) Stats() httplimit.PolicyStats { return httplimit.PolicyStats(s) }

func TestPolicyCollectorAnyMiddleware(t *testing.T) {
	s := statser{Version: 3, Rejected: 7, ShadowRejected: 2}
	c := metrics.NewPolicyCollector("grpc", nil, s)
	require.NoError(t, testutil.CollectAndCompare(c, strings.NewReader(`
# HELP ratelimit_policy_rejections_total 429s sent by enforced limits.
# TYPE ratelimit_policy_rejections_total counter
ratelimit_policy_rejections_total{policy="grpc"} 7
# HELP ratelimit_policy_shadow_rejections_total Requests a shadow rule would have rejected.
# TYPE ratelimit_policy_shadow_rejections_total counter
ratelimit_policy_shadow_rejections_total{policy="grpc"} 2
`), "ratelimit_policy_rejections_total", "ratelimit_policy_shadow_rejections_total"))
	var none *httplimit.PolicyLimiter
	require.Zero(t, testutil.CollectAndCount(metrics.NewPolicyCollector("none", nil, none)), "a nil middleware exports nothing")
}
