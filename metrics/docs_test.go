package metrics_test

import (
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit/metrics"
)

// exported returns the names of every metric the Collector can export.
func exported(t *testing.T) map[string]bool {
	t.Helper()
	ch := make(chan *prometheus.Desc, 100)
	go func() {
		metrics.NewCollector().Describe(ch)
		close(ch)
	}()
	fq := regexp.MustCompile(`fqName: "([a-z_]+)"`)
	names := map[string]bool{}
	for d := range ch {
		m := fq.FindStringSubmatch(d.String())
		require.NotNil(t, m, d.String())
		names[m[1]] = true
	}
	require.Greater(t, len(names), 20)
	return names
}

// The metric list in docs/metrics.md names every metric, and the dashboard
// and alert rules use only metrics that exist.
func TestDocsAndDashboardMatchTheMetrics(t *testing.T) {
	names := exported(t)
	doc, err := os.ReadFile("../docs/metrics.md")
	require.NoError(t, err)
	for n := range names {
		require.Contains(t, string(doc), "`"+n+"{", "docs/metrics.md does not list %s", n)
	}

	raw, err := os.ReadFile("../docs/grafana/ratelimit.json")
	require.NoError(t, err)
	var dash struct {
		Panels []struct {
			Type        string `json:"type"`
			Title       string `json:"title"`
			Description string `json:"description"`
			Targets     []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	require.NoError(t, json.Unmarshal(raw, &dash))
	rules, err := os.ReadFile("../docs/grafana/alerts.yml")
	require.NoError(t, err)
	exprs := []string{string(rules)}
	for _, p := range dash.Panels {
		if p.Type == "row" {
			continue
		}
		require.NotEmpty(t, p.Description, p.Title)
		require.NotEmpty(t, p.Targets, p.Title)
		for _, tg := range p.Targets {
			exprs = append(exprs, tg.Expr)
		}
	}
	used := regexp.MustCompile(`ratelimit_[a-z_]+`)
	seen := map[string]bool{}
	for _, e := range exprs {
		for _, m := range used.FindAllString(e, -1) {
			base := m
			for _, suffix := range []string{"_bucket", "_count", "_sum"} {
				base = strings.TrimSuffix(base, suffix)
			}
			require.True(t, names[base], "%s uses %s, which the Collector does not export", e, m)
			seen[base] = true
		}
	}
	// The seed-002 alerts are covered.
	for _, n := range []string{"ratelimit_policy_decisions_total", "ratelimit_store_duration_seconds",
		"ratelimit_hottest_key_checks_per_second", "ratelimit_hot_key_checks_per_second"} {
		require.True(t, seen[n], n)
	}
}

// The README's Metrics table names every metric of the Collector and of the
// PolicyCollector.
func TestReadmeListsEveryMetric(t *testing.T) {
	names := exported(t)
	ch := make(chan *prometheus.Desc, 100)
	go func() {
		metrics.NewPolicyCollector("p", nil, nil).Describe(ch)
		close(ch)
	}()
	fq := regexp.MustCompile(`fqName: "([a-z_]+)"`)
	for d := range ch {
		m := fq.FindStringSubmatch(d.String())
		require.NotNil(t, m, d.String())
		names[m[1]] = true
	}
	raw, err := os.ReadFile("../README.md")
	require.NoError(t, err)
	readme := string(raw)
	start := strings.Index(readme, "\n## Metrics\n")
	require.GreaterOrEqual(t, start, 0, "README.md has no Metrics section")
	section := readme[start+1:]
	if end := strings.Index(section[1:], "\n## "); end >= 0 {
		section = section[:end+1]
	}
	for n := range names {
		require.Contains(t, section, "| `"+n+"` |", "README.md's Metrics table does not list %s", n)
	}
}
