// Package policy makes rate limits data: a declarative document (YAML or
// JSON) of rules, tiers, per-key overrides, allow and deny lists, shadow rules
// and escalation settings, parsed strictly, compiled into an immutable
// Snapshot, and swapped atomically while requests are served.
//
// # Document
//
//	default:                      # global default, for requests no rule matches
//	  limits: [{window: 1m, max: 100}]
//	rules:
//	  - id: orders                # unique; counters are keyed by it
//	    match: {route: "POST /orders"}
//	    limits: [{window: 1m, max: 30}]
//	  - id: pro
//	    match: {tier: pro}        # the tier comes from Options.Tier
//	    limits: [{window: 1m, max: 1000}]
//	  - id: search-shadow
//	    match: {route: "GET /search"}
//	    shadow: true              # decides and counts, never rejects
//	    limits: [{window: 1m, max: 10}]
//	overrides:                    # per API key
//	  sk_vip_001: {limits: [{window: 1m, max: 10000}]}
//	allow: ["sk_internal_*"]      # bypass every check
//	deny:
//	  keys: ["sk_revoked_*"]
//	  status: 403                 # or 429
//
// # Resolution
//
// A request's key (from the middleware's key function) and tier (from a
// function the user gives) are resolved in this order, the first level that
// matches wins: the deny list, the allow list, a per-key override, a tier rule
// (a rule whose match names a tier), a route rule (a rule without a tier),
// the global default. Within a level the most specific rule wins: the route
// that http.ServeMux would choose, then an exact key over a longer key prefix
// over a shorter one over no key. Two rules that the order cannot separate
// are an error when the document is parsed.
//
// # Reload time
//
// Parse and Load read documents written in plain YAML or in JSON (block and
// flow collections, one-line plain or quoted scalars, comments; numbers as
// decimal integers) with a reader of their own, about ten times faster than
// a YAML decoder: a node reloads a policy of 100,000 overrides in tens of
// milliseconds. A document that uses more of YAML (anchors, tags, block or
// folded scalars, other number forms, tabs) or has a problem is read by
// yaml.v3, which is slower but gives the same Document and reports every
// problem with its line; WatchStats.SlowParses counts such versions.
package policy
