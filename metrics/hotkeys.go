package metrics

import (
	"encoding/json"
	"net/http"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratesync/ratelimit"
)

var (
	hottestKey = desc("hottest_key_checks_per_second",
		"Checks per second of the namespace's busiest key over the last minute (from the hot-key sketch; no key label).")
	hotKeyChecks = desc("hot_key_checks_per_second",
		"Checks per second over the last minute of the busiest keys (opt-in: ExportHotKeys; keys may be personal data).", "rank", "key")
	hotKeyRejections = desc("hot_key_rejections_per_second",
		"Rejections per second over the last minute of the most rejected keys (opt-in: ExportHotKeys).", "rank", "key")
)

// ExportHotKeys makes the Collector export, for each namespace whose
// Config.HotKeys is on, the n busiest keys and the n most rejected as gauges
// labelled by key and rank. Off (n = 0) by default: keys may be personal
// data, and each is a series. The hottest key's rate, without its name, is
// exported whenever the report is on.
func (c *Collector) ExportHotKeys(n int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.hotKeys = max(n, 0)
}

// collectHotKeys sends the hot-key gauges of ns.
func collectHotKeys(ch chan<- prometheus.Metric, ns *ratelimit.Namespace, n int) {
	r := ns.HotKeys(max(n, 1))
	if len(r.ByChecks) == 0 {
		return
	}
	secs := r.Window.Seconds()
	name := ns.Name()
	ch <- prometheus.MustNewConstMetric(hottestKey, prometheus.GaugeValue, r.ByChecks[0].Count/secs, name)
	if n == 0 {
		return
	}
	for i, k := range r.ByChecks {
		ch <- prometheus.MustNewConstMetric(hotKeyChecks, prometheus.GaugeValue, k.Count/secs, name, strconv.Itoa(i+1), k.Key)
	}
	for i, k := range r.ByRejections {
		ch <- prometheus.MustNewConstMetric(hotKeyRejections, prometheus.GaugeValue, k.Count/secs, name, strconv.Itoa(i+1), k.Key)
	}
}

// hotKeysJSON is the body HotKeysHandler answers.
type hotKeysJSON struct {
	Namespaces []hotNamespaceJSON `json:"namespaces"`
}

type hotNamespaceJSON struct {
	Namespace     string       `json:"namespace"`
	WindowSeconds float64      `json:"window_seconds"`
	ByChecks      []hotKeyJSON `json:"by_checks"`
	ByRejections  []hotKeyJSON `json:"by_rejections"`
}

type hotKeyJSON struct {
	Key       string  `json:"key"`
	Count     float64 `json:"count"`
	Error     float64 `json:"error"`
	PerSecond float64 `json:"per_second"`
}

// maxHotKeys bounds the n a HotKeysHandler request may ask for.
const maxHotKeys = 1000

// HotKeysHandler returns an http.Handler that answers GET with the hot-key
// report (ratelimit.Namespace.HotKeys) of each namespace as JSON: the keys
// with the most checks and the most rejections over the last minute, with
// their estimated counts, error bounds and rates. The query parameter n
// (default 10, at most 1000) sets how many keys per list. Mount it where only
// operators reach it: keys may be personal data.
func HotKeysHandler(spaces ...*ratelimit.Namespace) http.Handler {
	spaces = append([]*ratelimit.Namespace(nil), spaces...)
	return hotKeysHandler(func() []*ratelimit.Namespace { return spaces })
}

// HotKeysHandler is the package's HotKeysHandler over the Collector's
// namespaces, as they are at each request.
func (c *Collector) HotKeysHandler() http.Handler {
	return hotKeysHandler(func() []*ratelimit.Namespace {
		c.mu.Lock()
		defer c.mu.Unlock()
		return append([]*ratelimit.Namespace(nil), c.spaces...)
	})
}

func hotKeysHandler(spaces func() []*ratelimit.Namespace) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		n := 10
		if v := r.URL.Query().Get("n"); v != "" {
			p, err := strconv.Atoi(v)
			if err != nil || p < 1 || p > maxHotKeys {
				http.Error(w, "n must be a whole number between 1 and 1000", http.StatusBadRequest)
				return
			}
			n = p
		}
		body := hotKeysJSON{Namespaces: []hotNamespaceJSON{}}
		for _, ns := range spaces() {
			rep := ns.HotKeys(n)
			secs := rep.Window.Seconds()
			conv := func(ks []ratelimit.HotKey) []hotKeyJSON {
				out := make([]hotKeyJSON, 0, len(ks))
				for _, k := range ks {
					out = append(out, hotKeyJSON{Key: k.Key, Count: k.Count, Error: k.Error, PerSecond: k.Count / secs})
				}
				return out
			}
			body.Namespaces = append(body.Namespaces, hotNamespaceJSON{Namespace: ns.Name(), WindowSeconds: secs,
				ByChecks: conv(rep.ByChecks), ByRejections: conv(rep.ByRejections)})
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		_ = json.NewEncoder(w).Encode(body)
	})
}
