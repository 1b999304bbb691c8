// Package httplimit is net/http middleware over a ratelimit.Namespace: it
// finds the client's key, asks Namespace.Allow, writes the rate-limit headers
// on every response, and answers 429 Too Many Requests with a truthful
// Retry-After and an application/problem+json body.
//
//	mw, err := httplimit.New(httplimit.Options{
//		Namespace: ns,
//		Limits:    []ratelimit.Limit{{Window: time.Minute, Max: 100}},
//		KeyFunc:   httplimit.KeyByIP(httplimit.IPOptions{TrustedProxies: proxies}),
//		Rules: []httplimit.Rule{
//			{Pattern: "POST /login", Limits: []ratelimit.Limit{{Window: time.Minute, Max: 5}}, FailClosed: true},
//			{Pattern: "GET /healthz"}, // exempt
//		},
//	})
//	http.ListenAndServe(addr, mw(mux))
//
// # Headers
//
// Every limited response carries the IETF fields of
// draft-ietf-httpapi-ratelimit-headers, as structured fields:
//
//	RateLimit-Policy: "per-second";q=10;w=1, "per-hour";q=1000;w=3600
//	RateLimit: "per-second";r=3;t=2
//
// RateLimit-Policy lists every limit of the route (q: quota, w: window in
// seconds, rounded up). RateLimit describes the binding limit: the one with
// the least remaining quota, or, on a 429, the violated one that takes longest
// to admit the request. r is the remaining quota, t the seconds (rounded up)
// until the binding limit's quota is whole again; a sliding window forgets a
// hit only when the window after it ends, so t can reach twice the window.
// Options.LegacyHeaders adds X-RateLimit-Limit, X-RateLimit-Remaining and
// X-RateLimit-Reset (Unix seconds); Options.HideHeaders removes them all. A
// decision made without the store carries RateLimit-Degraded: ?1.
//
// # Keys
//
// KeyByIP (the default) keys on the peer's address; forwarding headers are
// read only from trusted proxies, right to left, so clients cannot pick their
// key; IPv6 clients are grouped by /64. KeyByHeader, KeyByAPIKey and
// KeyByRoute read a header, an API key, or the matched route; Compose
// combines them. A request without a usable key gets Options.KeyErrorStatus
// (400 by default), never 429.
//
// # Failures
//
// A decision made without the store is Degraded: in synchronous mode when
// the store call fails (the wait is bounded by the namespace's
// SyncTimeout), in periodic mode while the last sync cycle failed (the
// cluster's counts this node knows are stale). It is made from this node's
// counts (a lower bound of the cluster's), logged (at most one line per
// LogInterval), and by default acted on (fail open); a route with
// FailClosed answers 503 instead, in every mode.
package httplimit
