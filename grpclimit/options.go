package grpclimit

import (
	"log/slog"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/ratesync/ratelimit"
)

// Options configure the server interceptors. The zero value of every field
// but Namespace is a documented default.
type Options struct {
	// Namespace counts the calls. Its WindowSizes must include every limit's
	// Window. Required.
	Namespace *ratelimit.Namespace

	// Limits hold calls that match no Rule. Empty: such calls pass unlimited
	// and get no rate-limit metadata.
	Limits []ratelimit.Limit
	// KeyFunc identifies the client of calls that match no Rule, and of rules
	// without their own. Default: KeyByPeer(IPOptions{}), the peer's address
	// (no proxy trusted).
	KeyFunc KeyFunc
	// Cost is what one call spends (a stream spends it once, when it
	// opens), here and in rules without their own. Default 1.
	Cost int64
	// FailClosed refuses, with codes.Unavailable, the calls matching no Rule
	// whose decision was degraded (the store failed). Default: fail open,
	// that is, decide from this node's own counts.
	FailClosed bool

	// Rules give methods their own limits, key and failure mode. A call
	// matches, in this order: the rule naming its exact full method
	// ("/pkg.Service/Method"), the rule naming its service
	// ("/pkg.Service/*"), or else the fields above, the same precedence as
	// httplimit's most-specific-pattern-wins. Each rule counts in its own
	// counters, even when its limits equal another's.
	Rules []Rule

	// HideHeaders sends none of the rate-limit response header metadata
	// (ratelimit-policy, ratelimit, ratelimit-degraded, retry-after). A
	// rejection keeps its status details.
	HideHeaders bool

	// KeyErrorCode answers calls whose key cannot be found (the key function
	// failed, or returned "" or a key holding a NUL byte). Any code but OK
	// and ResourceExhausted: a client without a key has exceeded nothing.
	// Default codes.InvalidArgument.
	KeyErrorCode codes.Code

	// Logger receives a line when decisions are degraded (the store failed)
	// and when Allow fails, at most one per LogInterval with a count of the
	// lines skipped. Default slog.Default().
	Logger *slog.Logger
	// LogInterval spaces the log lines. Default 10 s.
	LogInterval time.Duration
}

// Rule is a per-method policy.
type Rule struct {
	// Method is a full method, "/pkg.Service/Method", or a service wildcard,
	// "/pkg.Service/*". Required; two rules may not name the same one.
	Method string
	// Limits hold the matching calls. Empty: they are exempt (health
	// checks).
	Limits []ratelimit.Limit
	// KeyFunc identifies the client. Default Options.KeyFunc.
	KeyFunc KeyFunc
	// Cost is what one call spends. Default Options.Cost.
	Cost int64
	// FailClosed: see Options.FailClosed. Rules do not inherit it.
	FailClosed bool
}
