package metrics

import (
	"context"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratesync/ratelimit"
)

// Histogram buckets, in seconds. Each covers its figure's range on a small
// machine and on a loaded one: a decision from memory takes a microsecond or
// so, one that writes through to the store a store round trip.
var (
	// DecisionBuckets bound Allow's latency: 1 µs to 250 ms.
	DecisionBuckets = []float64{1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4,
		1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25}
	// RetryAfterBuckets bound the Retry-After of rejections: 10 ms to a day.
	RetryAfterBuckets = []float64{0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 900, 3600, 86400}
	// StoreBuckets bound store round trips and sync cycles: 100 µs to 10 s,
	// with 5 ms as a boundary (a common alert threshold).
	StoreBuckets = []float64{1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}
)

// observed holds what the Collector learns as a ratelimit.Observer: figures
// that Stats cannot give (latencies, Retry-After, decisions by policy).
type observed struct {
	decisions  *prometheus.CounterVec
	decisionH  *prometheus.HistogramVec
	retryAfter *prometheus.HistogramVec
	syncH      *prometheus.HistogramVec
	storeH     *prometheus.HistogramVec
	storeErrs  *prometheus.CounterVec
	pushed     *prometheus.CounterVec
	delta      *prometheus.CounterVec
	// policies caches each (namespace, policy)'s series, so a decision costs
	// a map read instead of hashing label values.
	policies sync.Map // policyKey -> *policySeries
}

type policyKey struct{ ns, policy string }

type policySeries struct {
	allowed, rejected, allowedDeg, rejectedDeg prometheus.Counter
	latency, retry                             prometheus.Observer
}

func newObserved() *observed {
	hist := func(name, help string, buckets []float64, labels ...string) *prometheus.HistogramVec {
		return prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "ratelimit_" + name, Help: help, Buckets: buckets},
			append([]string{"namespace"}, labels...))
	}
	counter := func(name, help string, labels ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ratelimit_" + name, Help: help},
			append([]string{"namespace"}, labels...))
	}
	return &observed{
		decisions: counter("policy_decisions_total",
			"Allow decisions by binding policy, outcome (allowed, rejected) and whether the store had failed (degraded).",
			"policy", "decision", "degraded"),
		decisionH: hist("decision_duration_seconds", "Latency of Allow, by binding policy.", DecisionBuckets, "policy"),
		retryAfter: hist("retry_after_seconds", "Retry-After of rejected decisions: the true wait until the request would be admitted.",
			RetryAfterBuckets, "policy"),
		syncH: hist("sync_duration_seconds", "Duration of sync cycles (push and fetch), by outcome (ok, error).", StoreBuckets, "outcome"),
		storeH: hist("store_duration_seconds", "Duration of store round trips, by operation (push, fetch, get_window, purge) and outcome (ok, error).",
			StoreBuckets, "op", "outcome"),
		storeErrs: counter("store_errors_total", "Store calls that failed, by operation.", "op"),
		pushed:    counter("pushed_counters_total", "Counters pushed to the store (each key and window size once per push)."),
		delta:     counter("pushed_delta_total", "Sum of the increments pushed to the store (a hit counts once per window size)."),
	}
}

var _ ratelimit.Observer = (*Collector)(nil)

func (o *observed) collectors() []prometheus.Collector {
	if o == nil {
		return nil
	}
	return []prometheus.Collector{o.decisions, o.decisionH, o.retryAfter, o.syncH, o.storeH, o.storeErrs, o.pushed, o.delta}
}

func (o *observed) series(ns, policy string) *policySeries {
	k := policyKey{ns, policy}
	if s, ok := o.policies.Load(k); ok {
		return s.(*policySeries)
	}
	s := &policySeries{
		allowed:     o.decisions.WithLabelValues(ns, policy, "allowed", "false"),
		rejected:    o.decisions.WithLabelValues(ns, policy, "rejected", "false"),
		allowedDeg:  o.decisions.WithLabelValues(ns, policy, "allowed", "true"),
		rejectedDeg: o.decisions.WithLabelValues(ns, policy, "rejected", "true"),
		latency:     o.decisionH.WithLabelValues(ns, policy),
		retry:       o.retryAfter.WithLabelValues(ns, policy),
	}
	actual, _ := o.policies.LoadOrStore(k, s)
	return actual.(*policySeries)
}

// Start implements ratelimit.Observer; the Collector opens no span.
func (c *Collector) Start(ctx context.Context, _ ratelimit.Op) context.Context { return ctx }

// End implements ratelimit.Observer: it records sync cycles and store calls.
func (c *Collector) End(_ context.Context, e ratelimit.Event) {
	o := c.obs
	if o == nil { // a Collector not made by NewCollector
		return
	}
	outcome := "ok"
	if e.Err != nil {
		outcome = "error"
	}
	if e.Op == ratelimit.OpSync {
		o.syncH.WithLabelValues(e.Namespace, outcome).Observe(e.Duration.Seconds())
		return
	}
	op := string(e.Op)
	o.storeH.WithLabelValues(e.Namespace, op, outcome).Observe(e.Duration.Seconds())
	if e.Err != nil {
		o.storeErrs.WithLabelValues(e.Namespace, op).Inc()
	}
	if e.Op == ratelimit.OpPush && e.Err == nil {
		o.pushed.WithLabelValues(e.Namespace).Add(float64(e.Diffs))
		if e.Delta > 0 {
			o.delta.WithLabelValues(e.Namespace).Add(float64(e.Delta))
		}
	}
}

// Decision implements ratelimit.Observer: it counts decisions by policy and
// records their latency and Retry-After. Keys are never labels.
func (c *Collector) Decision(_ context.Context, e ratelimit.DecisionEvent) {
	if e.Err != nil || c.obs == nil {
		return
	}
	d := e.Decision
	s := c.obs.series(e.Namespace, d.Limit.PolicyName())
	switch {
	case d.Allowed && !d.Degraded:
		s.allowed.Inc()
	case d.Allowed:
		s.allowedDeg.Inc()
	case !d.Degraded:
		s.rejected.Inc()
	default:
		s.rejectedDeg.Inc()
	}
	s.latency.Observe(e.Duration.Seconds())
	if !d.Allowed {
		s.retry.Observe(d.RetryAfter.Seconds())
	}
}
