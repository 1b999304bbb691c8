// Package metrics exposes rate-limiter namespaces as Prometheus metrics.
//
//	c := metrics.NewCollector(ns1, ns2)
//	prometheus.MustRegister(c)
//
// Every metric is labelled by namespace; decision counters also by window (the
// binding limit's window size, e.g. "1m0s"). There are no per-key labels, so
// cardinality stays bounded whatever the traffic.
//
// Set the Collector as the namespaces' Config.Observer too, and it also
// exports latency and Retry-After histograms, decisions by policy, store round
// trips and pushed counters (see docs/metrics.md):
//
//	c := metrics.NewCollector()
//	ns, _ := reg.New(ratelimit.Config{..., Observer: c})
//	c.Add(ns)
package metrics

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratesync/ratelimit"
)

// Collector is a prometheus.Collector over a set of namespaces. It reads each
// namespace's Stats at scrape time; the hot path pays nothing for it.
type Collector struct {
	mu      sync.Mutex
	spaces  []*ratelimit.Namespace
	obs     *observed // what it learns as a ratelimit.Observer (observer.go)
	hotKeys int       // keys per namespace exported as gauges (hotkeys.go); GUARDED_BY(mu)
}

// NewCollector returns a Collector over the given namespaces.
func NewCollector(spaces ...*ratelimit.Namespace) *Collector {
	return &Collector{spaces: append([]*ratelimit.Namespace(nil), spaces...), obs: newObserved()}
}

// Add starts collecting ns.
func (c *Collector) Add(ns *ratelimit.Namespace) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.spaces = append(c.spaces, ns)
}

// Remove stops collecting ns.
func (c *Collector) Remove(ns *ratelimit.Namespace) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, s := range c.spaces {
		if s == ns {
			c.spaces = append(c.spaces[:i], c.spaces[i+1:]...)
			return
		}
	}
}

func desc(name, help string, labels ...string) *prometheus.Desc {
	return prometheus.NewDesc("ratelimit_"+name, help, append([]string{"namespace"}, labels...), nil)
}

var (
	trackedKeys      = desc("tracked_keys", "Keys held in memory.")
	evictions        = desc("evictions_total", "Keys evicted by the MaxKeys cap.")
	syncs            = desc("syncs_total", "Background sync cycles run.")
	syncErrors       = desc("sync_errors_total", "Background sync cycles that failed.")
	pendingHits      = desc("pending_hits", "Hits counted on this node that the store has not confirmed yet.")
	retiredWindows   = desc("retired_windows", "Evicted or rotated windows whose hits wait for a push.")
	droppedHits      = desc("dropped_hits_total", "Unconfirmed hits given up to keep memory bounded during a long store outage.")
	unresolvedPushes = desc("unresolved_pushes", "Pushes whose outcome is unknown, waiting to be re-sent.")
	lastSyncDuration = desc("last_sync_duration_seconds", "Duration of the last sync cycle.")
	lastSyncAge      = desc("last_sync_age_seconds", "Time since the last sync cycle ended.")
	decisions        = desc("decisions_total", "Allow decisions by binding limit window and outcome.", "window", "decision")
	degraded         = desc("degraded_decisions_total", "Decisions made from local state because the store failed.", "window")
)

// Describe sends the descriptors of every metric the Collector exports.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{trackedKeys, evictions, syncs, syncErrors, pendingHits,
		retiredWindows, droppedHits, unresolvedPushes, lastSyncDuration, lastSyncAge, decisions, degraded,
		hottestKey, hotKeyChecks, hotKeyRejections} {
		ch <- d
	}
	for _, o := range c.obs.collectors() {
		o.Describe(ch)
	}
}

// Collect sends the current value of every metric.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	spaces := append([]*ratelimit.Namespace(nil), c.spaces...)
	hot := c.hotKeys
	c.mu.Unlock()
	for _, o := range c.obs.collectors() {
		o.Collect(ch)
	}
	now := time.Now()
	for _, ns := range spaces {
		st := ns.Stats()
		name := ns.Name()
		metric := func(d *prometheus.Desc, t prometheus.ValueType, v float64, labels ...string) {
			ch <- prometheus.MustNewConstMetric(d, t, v, append([]string{name}, labels...)...)
		}
		metric(trackedKeys, prometheus.GaugeValue, float64(st.TrackedKeys))
		metric(evictions, prometheus.CounterValue, float64(st.Evictions))
		metric(syncs, prometheus.CounterValue, float64(st.Syncs))
		metric(syncErrors, prometheus.CounterValue, float64(st.SyncErrors))
		metric(pendingHits, prometheus.GaugeValue, float64(st.PendingHits))
		metric(retiredWindows, prometheus.GaugeValue, float64(st.RetiredWindows))
		metric(droppedHits, prometheus.CounterValue, float64(st.DroppedHits))
		metric(unresolvedPushes, prometheus.GaugeValue, float64(st.UnresolvedPushes))
		if !st.LastSync.IsZero() {
			metric(lastSyncDuration, prometheus.GaugeValue, st.LastSyncDuration.Seconds())
			metric(lastSyncAge, prometheus.GaugeValue, now.Sub(st.LastSync).Seconds())
		}
		collectHotKeys(ch, ns, hot)
		for _, d := range st.Decisions {
			w := d.Window.String()
			metric(decisions, prometheus.CounterValue, float64(d.Allowed), w, "allowed")
			metric(decisions, prometheus.CounterValue, float64(d.Rejected), w, "rejected")
			metric(degraded, prometheus.CounterValue, float64(d.Degraded), w)
		}
	}
}
