package metrics_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit"
	"github.com/ratesync/ratelimit/metrics"
)

func hotNS(t *testing.T, name string, hk ratelimit.HotKeysConfig) *ratelimit.Namespace {
	t.Helper()
	reg := ratelimit.NewRegistry()
	t.Cleanup(func() { _ = reg.Close(context.Background()) })
	start := time.UnixMilli(1_700_000_040_000) // a minute boundary: the whole minute counts
	ns, err := reg.New(ratelimit.Config{Namespace: name, WindowSizes: []time.Duration{time.Minute}, SyncRate: -1,
		HotKeys: hk, Clock: func() time.Time { return start }})
	require.NoError(t, err)
	lim := ratelimit.Limit{Window: time.Minute, Max: 60}
	for range 120 {
		_, err := ns.Allow(context.Background(), "alice", 1, lim)
		require.NoError(t, err)
	}
	for range 30 {
		_, err := ns.Allow(context.Background(), "bob", 1, lim)
		require.NoError(t, err)
	}
	return ns
}

func TestHotKeyGauges(t *testing.T) {
	ns := hotNS(t, "api", ratelimit.HotKeysConfig{Capacity: 16, SampleRate: 1})
	off := hotNS(t, "quiet", ratelimit.HotKeysConfig{})
	c := metrics.NewCollector(ns, off)

	// By default: the hottest rate, no key.
	require.NoError(t, testutil.CollectAndCompare(c, strings.NewReader(`
# HELP ratelimit_hottest_key_checks_per_second Checks per second of the namespace's busiest key over the last minute (from the hot-key sketch; no key label).
# TYPE ratelimit_hottest_key_checks_per_second gauge
ratelimit_hottest_key_checks_per_second{namespace="api"} 2
`), "ratelimit_hottest_key_checks_per_second", "ratelimit_hot_key_checks_per_second"))

	c.ExportHotKeys(5)
	problems, err := testutil.CollectAndLint(c)
	require.NoError(t, err)
	require.Empty(t, problems)
	require.NoError(t, testutil.CollectAndCompare(c, strings.NewReader(`
# HELP ratelimit_hot_key_checks_per_second Checks per second over the last minute of the busiest keys (opt-in: ExportHotKeys; keys may be personal data).
# TYPE ratelimit_hot_key_checks_per_second gauge
ratelimit_hot_key_checks_per_second{key="alice",namespace="api",rank="1"} 2
ratelimit_hot_key_checks_per_second{key="bob",namespace="api",rank="2"} 0.5
# HELP ratelimit_hot_key_rejections_per_second Rejections per second over the last minute of the most rejected keys (opt-in: ExportHotKeys).
# TYPE ratelimit_hot_key_rejections_per_second gauge
ratelimit_hot_key_rejections_per_second{key="alice",namespace="api",rank="1"} 1
`), "ratelimit_hot_key_checks_per_second", "ratelimit_hot_key_rejections_per_second"))
}

func TestHotKeysHandler(t *testing.T) {
	ns := hotNS(t, "api", ratelimit.HotKeysConfig{Capacity: 16, SampleRate: 1})
	off := hotNS(t, "quiet", ratelimit.HotKeysConfig{})
	c := metrics.NewCollector(ns)
	c.Add(off)
	for _, h := range []http.Handler{metrics.HotKeysHandler(ns, off), c.HotKeysHandler()} {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest("GET", "/debug/hotkeys?n=1", nil))
		require.Equal(t, 200, w.Code)
		require.Equal(t, "application/json", w.Header().Get("Content-Type"))
		var body struct {
			Namespaces []struct {
				Namespace     string  `json:"namespace"`
				WindowSeconds float64 `json:"window_seconds"`
				ByChecks      []struct {
					Key       string  `json:"key"`
					Count     float64 `json:"count"`
					PerSecond float64 `json:"per_second"`
				} `json:"by_checks"`
				ByRejections []struct {
					Key   string  `json:"key"`
					Count float64 `json:"count"`
				} `json:"by_rejections"`
			} `json:"namespaces"`
		}
		require.NoError(t, json.Unmarshal(w.Body.Bytes(), &body))
		require.Len(t, body.Namespaces, 2)
		api := body.Namespaces[0]
		require.Equal(t, "api", api.Namespace)
		require.Equal(t, 60.0, api.WindowSeconds)
		require.Len(t, api.ByChecks, 1)
		require.Equal(t, "alice", api.ByChecks[0].Key)
		require.Equal(t, 120.0, api.ByChecks[0].Count)
		require.Equal(t, 2.0, api.ByChecks[0].PerSecond)
		require.Equal(t, 60.0, api.ByRejections[0].Count)
		require.Empty(t, body.Namespaces[1].ByChecks)
		require.NotNil(t, body.Namespaces[1].ByChecks) // [] rather than null
	}
	h := metrics.HotKeysHandler(ns)
	for _, target := range []string{"/?n=0", "/?n=1001", "/?n=x"} {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest("GET", target, nil))
		require.Equal(t, 400, w.Code, target)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest("POST", "/", nil))
	require.Equal(t, 405, w.Code)
}
