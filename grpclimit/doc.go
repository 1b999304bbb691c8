// Package grpclimit rate-limits gRPC servers with a ratelimit.Namespace, and
// makes clients wait as the server tells them.
//
//	lim, err := grpclimit.New(grpclimit.Options{
//		Namespace: ns,
//		Limits:    []ratelimit.Limit{{Window: time.Minute, Max: 600}},
//		KeyFunc:   grpclimit.KeyByAPIKey(""),
//		Rules: []grpclimit.Rule{
//			{Method: "/shop.Orders/Create", Limits: []ratelimit.Limit{{Window: time.Minute, Max: 10}}},
//			{Method: "/grpc.health.v1.Health/*"}, // exempt
//		},
//	})
//	srv := grpc.NewServer(
//		grpc.ChainUnaryInterceptor(lim.UnaryServerInterceptor()),
//		grpc.ChainStreamInterceptor(lim.StreamServerInterceptor()))
//
// A call matches the rule naming its full method, else the rule naming its
// service ("/pkg.Service/*"), else the default limits. A refused call gets
// codes.ResourceExhausted with two details: google.rpc.RetryInfo, whose delay
// is the true earliest time the same call would be admitted (a client that
// waits exactly that long is admitted), and google.rpc.QuotaFailure naming
// the violated policy. Every limited call, admitted or not, gets the IETF
// RateLimit-Policy and RateLimit fields as response header metadata
// ("ratelimit-policy", "ratelimit"), with the values httplimit sends.
//
// When the store fails, a rule that fails open decides from this node's
// counts (and marks the response "ratelimit-degraded: ?1"); one that fails
// closed refuses the call with codes.Unavailable.
//
// NewWithPolicy takes the limits from a policy document (package policy)
// instead: rules, tiers, per-key overrides, allow and deny lists, shadow
// rules and escalation, hot-reloaded by a policy.Watcher. A call is resolved
// as httplimit.NewWithPolicy resolves a request, its route being its full
// method matched as the HTTP request "POST /pkg.Service/Method": the policy
// route "/pkg.Service/" names a service, "POST /pkg.Service/Method" (or
// "/pkg.Service/Method") one method. A deny-listed client gets
// codes.PermissionDenied (ResourceExhausted when the policy's deny status is
// 429).
//
// UnaryClientInterceptor retries a refused call after the server's delay when
// that fits in the call's deadline.
//
// This package is its own module, so that the ratelimit module does not
// depend on gRPC.
package grpclimit
