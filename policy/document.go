package policy

import (
	"fmt"
	"time"

	"go.yaml.in/yaml/v3"
)

// Document is a policy as written: what Parse decodes and Compile compiles.
// Every field is optional; an empty document limits nothing.
type Document struct {
	// Default holds requests that no rule, override or list matches. Nil:
	// such requests pass unlimited.
	Default *Target `yaml:"default,omitempty" json:"default,omitempty"`
	// Rules are the route and tier rules.
	Rules []Rule `yaml:"rules,omitempty" json:"rules,omitempty"`
	// Overrides give single keys their own limits, above every rule.
	Overrides map[string]Target `yaml:"overrides,omitempty" json:"overrides,omitempty"`
	// Allow lists keys (exact, or a prefix ending in "*") that bypass every
	// check and spend nothing.
	Allow []string `yaml:"allow,omitempty" json:"allow,omitempty"`
	// Deny lists keys that are always refused.
	Deny *DenyList `yaml:"deny,omitempty" json:"deny,omitempty"`
	// Escalation punishes clients that keep sending after a 429. Nil: off.
	Escalation *Escalation `yaml:"escalation,omitempty" json:"escalation,omitempty"`
}

// Rule limits the requests its Match selects.
type Rule struct {
	// ID names the rule, uniquely: letters, digits, '.', '_' and '-'. The
	// rule's counters are keyed by it, so a new version of the rule (a higher
	// limit, say) keeps what clients have spent. Required.
	ID string `yaml:"id" json:"id"`
	// Version is the rule's own revision number, for operators; it does not
	// change counting.
	Version int64 `yaml:"version,omitempty" json:"version,omitempty"`
	// Match selects requests; at least one of its fields must be set.
	Match Match `yaml:"match" json:"match"`
	// Limits are the rule's limits; at least one.
	Limits []Limit `yaml:"limits" json:"limits"`
	// Cost is what one request spends. Default 1.
	Cost int64 `yaml:"cost,omitempty" json:"cost,omitempty"`
	// Shadow makes the rule decide and count its would-be rejections
	// without ever rejecting, and without spending the enforced rules'
	// quota.
	Shadow bool `yaml:"shadow,omitempty" json:"shadow,omitempty"`
}

// Match selects requests. Empty fields match everything.
type Match struct {
	// Route is an http.ServeMux pattern: "[METHOD ][HOST]/[PATH]" with
	// {wildcards}, for example "POST /orders" or "GET /items/{id}".
	Route string `yaml:"route,omitempty" json:"route,omitempty"`
	// Key is a key glob: an exact key, or a prefix followed by one "*"
	// ("sk_prod_*"). "*" matches every key.
	Key string `yaml:"key,omitempty" json:"key,omitempty"`
	// Tier is the tier the request must have (see the middleware's tier
	// function). A rule with a tier is a tier rule and wins over rules
	// without one.
	Tier string `yaml:"tier,omitempty" json:"tier,omitempty"`
}

// Limit is one ratelimit.Limit: at most Max hits per Window, counted with an
// algorithm.
type Limit struct {
	// Window is the window size, a Go duration ("1m", "1h30m"); it must be
	// a positive whole number of milliseconds (and one of the namespace's
	// window sizes, checked when the snapshot is installed). Required.
	Window Duration `yaml:"window" json:"window"`
	// Max is the largest load admitted per window; at least 1 (0 would
	// reject all traffic).
	Max int64 `yaml:"max" json:"max"`
	// Algorithm is how the limit counts: "sliding_window" (the default),
	// "fixed_window", "token_bucket" (or "gcra") or "sliding_log" (see
	// ratelimit.Algorithm).
	Algorithm string `yaml:"algorithm,omitempty" json:"algorithm,omitempty"`
	// Burst is a token bucket's capacity in tokens; 0 means Max. Only with
	// algorithm token_bucket.
	Burst int64 `yaml:"burst,omitempty" json:"burst,omitempty"`
	// Fixed counts a fixed window instead of a sliding one (algorithm
	// fixed_window says the same).
	Fixed bool `yaml:"fixed,omitempty" json:"fixed,omitempty"`
	// Penalty counts rejected hits too.
	Penalty bool `yaml:"penalty,omitempty" json:"penalty,omitempty"`
	// Name names the limit in headers and problem reports.
	Name string `yaml:"name,omitempty" json:"name,omitempty"`
}

// Target is the limits of the global default or of a per-key override.
type Target struct {
	// Limits are the limits; at least one.
	Limits []Limit `yaml:"limits" json:"limits"`
	// Cost is what one request spends. Default 1.
	Cost int64 `yaml:"cost,omitempty" json:"cost,omitempty"`
}

// DenyList lists refused keys.
type DenyList struct {
	// Keys are exact keys or prefixes ending in "*".
	Keys []string `yaml:"keys" json:"keys"`
	// Status is the answer: 403 (the default) or 429.
	Status int `yaml:"status,omitempty" json:"status,omitempty"`
}

// Escalation configures progressive penalties for clients ignoring 429s.
//
// Every request of a key rejected with 429 is recorded; each one after the
// first inside StrikeWindow is a strike (the client kept sending after being
// told to wait). Each strike puts the key in a cooldown that starts at the
// binding limit's window and doubles with every further strike, up to
// MaxCooldown; during a cooldown every request of the key is answered 429
// (and is itself a strike). DenyAfter strikes put the key on a temporary deny
// list for DenyFor. Both expire by themselves; see Escalate and Penalties.
type Escalation struct {
	// StrikeWindow is the window over which strikes are counted. Default 1m.
	StrikeWindow Duration `yaml:"strike_window,omitempty" json:"strike_window,omitempty"`
	// MaxCooldown caps the cooldown. Default 15m.
	MaxCooldown Duration `yaml:"max_cooldown,omitempty" json:"max_cooldown,omitempty"`
	// DenyAfter is the number of strikes that deny the key; 0 never denies.
	DenyAfter int64 `yaml:"deny_after,omitempty" json:"deny_after,omitempty"`
	// DenyFor is how long a temporary deny lasts. Default 1h.
	DenyFor Duration `yaml:"deny_for,omitempty" json:"deny_for,omitempty"`
}

// Duration is a time.Duration written as a Go duration string ("90s").
type Duration time.Duration

// D returns d as a time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

// String formats d as time.Duration does.
func (d Duration) String() string { return time.Duration(d).String() }

// MarshalYAML writes d as a duration string.
func (d Duration) MarshalYAML() (any, error) { return d.String(), nil }

// MarshalText writes d as a duration string (JSON).
func (d Duration) MarshalText() ([]byte, error) { return []byte(d.String()), nil }

// UnmarshalText parses a duration string (JSON through encoding/json).
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	if err != nil {
		return fmt.Errorf("bad duration %q", b)
	}
	*d = Duration(v)
	return nil
}

func shortValue(n *yaml.Node) string {
	if n.Kind != yaml.ScalarNode {
		return "(not a scalar)"
	}
	v := n.Value
	if len(v) > 40 {
		v = v[:40] + "..."
	}
	return fmt.Sprintf("%q", v)
}
