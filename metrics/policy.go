package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratesync/ratelimit/httplimit"
	"github.com/ratesync/ratelimit/policy"
)

// PolicyCollector exposes a node's policy state: the version its watcher
// enforces, installs and refused versions, and the policy middleware's
// decisions by level, shadow rejections and escalations. Either source may
// be nil. Metrics are labelled by name (PolicyCollector's own), so several
// policies can be collected.
type PolicyCollector struct {
	name    string
	watcher *policy.Watcher
	limiter PolicyStatser
}

// PolicyStatser is a policy middleware's statistics: an
// *httplimit.PolicyLimiter, or a grpclimit module's *PolicyLimiter (whose
// PolicyStats are httplimit's).
type PolicyStatser interface {
	Stats() httplimit.PolicyStats
}

// NewPolicyCollector returns a PolicyCollector named name, over a watcher and
// a policy middleware (HTTP or gRPC), either of which may be nil.
func NewPolicyCollector(name string, w *policy.Watcher, l PolicyStatser) *PolicyCollector {
	c := &PolicyCollector{name: name, watcher: w}
	if l != nil && !isNilPointer(l) {
		c.limiter = l
	}
	return c
}

// isNilPointer reports whether l holds a nil *httplimit.PolicyLimiter, which
// callers pass for "no middleware" as they did before PolicyStatser.
func isNilPointer(l PolicyStatser) bool {
	p, ok := l.(*httplimit.PolicyLimiter)
	return ok && p == nil
}

func pdesc(name, help string, labels ...string) *prometheus.Desc {
	return prometheus.NewDesc("ratelimit_policy_"+name, help, append([]string{"policy"}, labels...), nil)
}

var (
	policyVersion       = pdesc("version", "Version of the policy this node's watcher enforces (0: none).")
	policyInstalls      = pdesc("installs_total", "Policy versions installed.")
	policyRejected      = pdesc("rejected_versions_total", "Policy versions refused (bad document or failed check); the last good one stayed in force.")
	policyLastRejected  = pdesc("last_rejected_version", "The last refused version (0: none).")
	policyStoreErrors   = pdesc("store_errors_total", "Failed calls to the policy store.")
	policyServedVersion = pdesc("served_version", "Version of the snapshot the middleware last served with.")
	policyRequests      = pdesc("requests_total", "Requests by the resolution level that decided them.", "level")
	policyRejections    = pdesc("rejections_total", "429s sent by enforced limits.")
	policyShadow        = pdesc("shadow_rejections_total", "Requests a shadow rule would have rejected.")
	policyCooldowns     = pdesc("cooldowns_total", "429s sent to clients in an escalation cooldown.")
	policyTempDenied    = pdesc("temporary_denials_total", "Requests refused by an escalation's temporary deny.")
	policyStrikes       = pdesc("strikes_total", "Rejections recorded for escalation.")
)

// Describe implements prometheus.Collector.
func (c *PolicyCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{policyVersion, policyInstalls, policyRejected, policyLastRejected, policyStoreErrors,
		policyServedVersion, policyRequests, policyRejections, policyShadow, policyCooldowns, policyTempDenied, policyStrikes} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *PolicyCollector) Collect(ch chan<- prometheus.Metric) {
	m := func(d *prometheus.Desc, t prometheus.ValueType, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, t, v, append([]string{c.name}, labels...)...)
	}
	if c.watcher != nil {
		s := c.watcher.Stats()
		m(policyVersion, prometheus.GaugeValue, float64(s.Version))
		m(policyInstalls, prometheus.CounterValue, float64(s.Installs))
		m(policyRejected, prometheus.CounterValue, float64(s.Rejected))
		m(policyLastRejected, prometheus.GaugeValue, float64(s.LastRejected))
		m(policyStoreErrors, prometheus.CounterValue, float64(s.StoreErrors))
	}
	if c.limiter != nil {
		s := c.limiter.Stats()
		m(policyServedVersion, prometheus.GaugeValue, float64(s.Version))
		for lv, n := range s.Requests {
			m(policyRequests, prometheus.CounterValue, float64(n), policy.Level(lv).String())
		}
		m(policyRejections, prometheus.CounterValue, float64(s.Rejected))
		m(policyShadow, prometheus.CounterValue, float64(s.ShadowRejected))
		m(policyCooldowns, prometheus.CounterValue, float64(s.Cooldowns))
		m(policyTempDenied, prometheus.CounterValue, float64(s.TempDenied))
		m(policyStrikes, prometheus.CounterValue, float64(s.Strikes))
	}
}
