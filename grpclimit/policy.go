package grpclimit

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/ratesync/ratelimit"
	"github.com/ratesync/ratelimit/httplimit"
	"github.com/ratesync/ratelimit/internal/ratefields"
	"github.com/ratesync/ratelimit/policy"
)

// PolicyOptions configure NewWithPolicy.
type PolicyOptions struct {
	// Options are the interceptors' options, as for New, except that the
	// limits come from the policy: Limits, Rules and Cost must be empty.
	// KeyFunc identifies the client; its key is matched against the
	// policy's lists, overrides and key globs (KeyByMetadata gives the raw
	// value, KeyByAPIKey prefixes it with "key:"). FailClosed applies to
	// every entry of the policy.
	Options
	// Policy gives the policy in force (a *policy.Holder or a
	// *policy.Watcher); it is read on every call, so a new version applies
	// to the next call. A nil snapshot lets every call pass. Required.
	Policy policy.Provider
	// Tier returns the call's tier ("" for none): from metadata a trusted
	// proxy sets, a verified token's claim, a context value. It is called
	// only when the policy in force has tier rules. Default: no tiers.
	Tier func(ctx context.Context, fullMethod string) string
	// ShadowNamespace counts shadow rules. Default Namespace: shadow
	// counters have keys of their own there, so they never spend an
	// enforced rule's quota.
	ShadowNamespace *ratelimit.Namespace
	// Penalties keeps the escalation state of policies that escalate
	// (policy.Escalation), shared by the nodes that share it: a
	// redisstore.Penalties for a cluster (the same one httplimit uses, so a
	// client that misbehaves over HTTP is penalized over gRPC too). Default:
	// a policy.MemoryPenalties of this limiter alone.
	Penalties policy.Penalties
	// Clock tells the time of escalation penalties. Default time.Now.
	Clock func() time.Time
}

// PolicyStats are a PolicyLimiter's counters since it was made. The type is
// httplimit's, so that code reading the HTTP middleware's counters reads
// these too; over gRPC, Rejected counts ResourceExhausted refusals by
// enforced limits, Cooldowns the refusals of keys in an escalation cooldown
// and TempDenied the calls refused by a temporary deny.
type PolicyStats = httplimit.PolicyStats

// PolicyLimiter makes the server interceptors of a policy; see
// NewWithPolicy. It is safe for concurrent use.
type PolicyLimiter struct {
	l        *Limiter // the validated options
	src      policy.Provider
	tier     func(context.Context, string) string
	keyFunc  KeyFunc
	closed   bool // FailClosed
	shadowNS *ratelimit.Namespace
	pen      policy.Penalties
	clock    func() time.Time
	prep     atomic.Pointer[prepared]
	reqs     sync.Map     // full method → *http.Request, read-only once stored
	nreqs    atomic.Int64 // entries in reqs
	stats    policyCounters
}

// maxCachedMethods bounds the requests kept for route matching: a server
// has a fixed set of methods, but one with an UnknownServiceHandler sees
// whatever method names its clients send.
const maxCachedMethods = 4096

type policyCounters struct {
	levels         [policy.LevelDefault + 1]atomic.Uint64
	rejected       atomic.Uint64
	shadowRejected atomic.Uint64
	misfit         atomic.Uint64
	cooldowns      atomic.Uint64
	tempDenied     atomic.Uint64
	strikes        atomic.Uint64
	version        atomic.Int64
}

// prepared holds a snapshot's entries compiled for serving, by Entry.Index,
// each compiled by the first call that needs it.
type prepared struct {
	snap  *policy.Snapshot
	rules []atomic.Pointer[rule]
}

// misfit marks an entry whose limits do not fit the namespace.
var misfit = &rule{}

// NewWithPolicy returns the interceptors of a policy. Each call's key (from
// KeyFunc) and tier (from Tier) are resolved against the snapshot in force,
// with the policy package's resolution and in its order: the deny list, the
// allow list, a per-key override, a tier rule, a route rule, the global
// default.
//
// The route of a call is its full method, matched against the policy's
// route patterns as http.ServeMux matches a request with method POST, path
// "/pkg.Service/Method" and no host. So "POST /pkg.Service/Method" or
// "/pkg.Service/Method" names one method, "/pkg.Service/" a whole service,
// and patterns naming another HTTP method or a host never match a gRPC call:
// one document can hold the rules of an HTTP API and of a gRPC service.
//
// A deny-listed key is refused with codes.PermissionDenied, or
// codes.ResourceExhausted without RetryInfo when the policy's deny status is
// 429 (there is no time after which it is admitted). An allow-listed key
// passes, spends nothing and gets no metadata. Other calls are limited by
// the entry they resolve to, with the metadata and refusals of New; counters
// are keyed by rule id, so a new version of a rule keeps what clients spent.
// A shadow rule that matches is decided too, on counters of its own: a
// would-be refusal is counted (PolicyStats.ShadowRejected) and logged, never
// sent. A policy that escalates refuses a key that keeps calling after a
// refusal as httplimit does: a cooldown is codes.ResourceExhausted with the
// cooldown's remaining time as RetryInfo, a temporary deny the deny status's
// code (with RetryInfo when it is 429).
func NewWithPolicy(opts PolicyOptions) (*PolicyLimiter, error) {
	if err := ratefields.CheckPolicyOptions("grpclimit", opts.Policy, opts.Limits, len(opts.Rules), opts.Cost); err != nil {
		return nil, err
	}
	l, err := New(opts.Options)
	if err != nil {
		return nil, err
	}
	p := &PolicyLimiter{l: l, src: opts.Policy, tier: opts.Tier, keyFunc: l.def.keyFunc, closed: opts.FailClosed,
		shadowNS: opts.ShadowNamespace, pen: opts.Penalties, clock: opts.Clock}
	if p.shadowNS == nil {
		p.shadowNS = l.ns
	}
	if p.pen == nil {
		p.pen = policy.NewMemoryPenalties()
	}
	if p.clock == nil {
		p.clock = time.Now
	}
	return p, nil
}

// CheckPolicy returns a check that a snapshot's limits fit ns: give it to
// the policy's watcher (policy.WatchOptions.Check), so that a policy the
// interceptors could not enforce is refused when it is published. It is
// httplimit.CheckPolicy.
func CheckPolicy(ns *ratelimit.Namespace) func(*policy.Snapshot) error {
	return httplimit.CheckPolicy(ns)
}

// UnaryServerInterceptor returns the interceptor that limits unary calls.
// A refused call never reaches the handler.
func (p *PolicyLimiter) UnaryServerInterceptor() grpc.UnaryServerInterceptor { return unary(p.check) }

// StreamServerInterceptor returns the interceptor that limits streams: a
// stream is decided once, when it opens; a refused stream never reaches the
// handler.
func (p *PolicyLimiter) StreamServerInterceptor() grpc.StreamServerInterceptor {
	return stream(p.check)
}

// Stats returns the limiter's counters.
func (p *PolicyLimiter) Stats() PolicyStats {
	c := &p.stats
	s := PolicyStats{Version: c.version.Load(), Rejected: c.rejected.Load(), ShadowRejected: c.shadowRejected.Load(),
		Misfits: c.misfit.Load(), Cooldowns: c.cooldowns.Load(), TempDenied: c.tempDenied.Load(), Strikes: c.strikes.Load()}
	for i := range s.Requests {
		s.Requests[i] = c.levels[i].Load()
	}
	return s
}

func (p *PolicyLimiter) check(ctx context.Context, full string) (metadata.MD, error) {
	l := p.l
	key, err := p.keyFunc(ctx, full)
	if err != nil || key == "" || strings.IndexByte(key, 0) >= 0 {
		return nil, l.noKey()
	}
	snap := p.src.Load()
	if snap == nil {
		p.stats.levels[policy.LevelNone].Add(1)
		return nil, nil
	}
	if v := snap.Version(); p.stats.version.Load() != v {
		p.stats.version.Store(v)
	}
	tier := ""
	if p.tier != nil && snap.HasTiers() {
		tier = p.tier(ctx, full)
	}
	res := snap.Resolve(p.request(full), key, tier)
	p.stats.levels[res.Level].Add(1)
	switch res.Level {
	case policy.LevelDeny:
		return p.refuse(nil, res.Status, "deny", "this client is denied by policy", 0)
	case policy.LevelAllow:
		return nil, nil
	}
	pr := p.prepared(snap)
	if res.Shadow != nil { // also when nothing enforced matched (LevelNone)
		p.shadow(ctx, pr.rule(p, res.Shadow), key)
	}
	if res.Entry == nil {
		return nil, nil
	}
	ru := pr.rule(p, res.Entry)
	if ru == misfit {
		p.stats.misfit.Add(1)
		l.logf("grpclimit: policy entry does not fit the namespace; call passed unlimited", "rule", res.Entry.Name(), "version", snap.Version())
		return nil, nil
	}
	esc := snap.Escalation()
	if esc != nil {
		if md, err := p.penalized(ctx, snap, esc, ru, key); err != nil {
			return md, err
		}
	}
	// The counter key (the entry's prefix and the key) and the ratelimit
	// value share one allocation, so the policy adds none to the call.
	kb := make([]byte, 0, len(ru.prefix)+len(key)+ru.fields.MaxLen)
	kb = append(append(kb, ru.prefix...), key...)
	md, d, err := l.decide(ctx, ru, unsafe.String(unsafe.SliceData(kb), len(kb)), kb[len(kb):])
	if err != nil && status.Code(err) == codes.ResourceExhausted {
		p.stats.rejected.Add(1)
		if esc != nil {
			p.strike(ctx, key, esc, d.Limit.Window)
		}
	}
	return md, err
}

// request returns the HTTP request a call's route is matched as: method
// POST, path the full method. Requests are kept per method (Resolve only
// reads them), up to maxCachedMethods.
func (p *PolicyLimiter) request(full string) *http.Request {
	if r, ok := p.reqs.Load(full); ok {
		return r.(*http.Request)
	}
	r := &http.Request{Method: http.MethodPost, URL: &url.URL{Path: full}, Header: http.Header{}, Proto: "HTTP/2.0", ProtoMajor: 2}
	if p.nreqs.Load() < maxCachedMethods {
		if _, loaded := p.reqs.LoadOrStore(full, r); !loaded {
			p.nreqs.Add(1)
		}
	}
	return r
}

// prepared returns the compiled entries of snap.
func (p *PolicyLimiter) prepared(snap *policy.Snapshot) *prepared {
	old := p.prep.Load()
	if old != nil && old.snap == snap {
		return old
	}
	pr := &prepared{snap: snap, rules: make([]atomic.Pointer[rule], len(snap.Entries()))}
	if p.prep.CompareAndSwap(old, pr) {
		return pr
	}
	if cur := p.prep.Load(); cur != nil && cur.snap == snap {
		return cur // another call installed it first
	}
	return pr // snapshots are changing under us: this call keeps its own
}

// rule returns the compiled entry e, compiling it on first use.
func (pr *prepared) rule(p *PolicyLimiter, e *policy.Entry) *rule {
	slot := &pr.rules[e.Index]
	if ru := slot.Load(); ru != nil {
		return ru
	}
	ru := p.compileEntry(e)
	slot.Store(ru) // two calls may both compile it: the results are equal
	return ru
}

func (p *PolicyLimiter) compileEntry(e *policy.Entry) *rule {
	ns := p.l.ns
	if e.Shadow {
		ns = p.shadowNS
	}
	ru, err := p.l.compile(ns, e.Name(), Rule{Limits: e.Limits, Cost: e.Cost, FailClosed: p.closed})
	if err != nil || len(ru.limits) == 0 {
		return misfit
	}
	ru.method, ru.prefix = e.Name(), e.Prefix
	return ru
}

// shadow decides a shadow rule on its own counters and counts a would-be
// refusal; it never refuses.
func (p *PolicyLimiter) shadow(ctx context.Context, ru *rule, key string) {
	if ru == misfit {
		p.stats.misfit.Add(1)
		return
	}
	d, err := p.shadowNS.Allow(ctx, ru.prefix+key, ru.cost, ru.limits...)
	if err == nil && !d.Allowed {
		p.stats.shadowRejected.Add(1)
		p.l.logf("grpclimit: shadow rule would refuse", "rule", ru.method, "key", key, "limit", d.Limit.PolicyName(), "retry_after", d.RetryAfter)
	}
}

// penalized refuses a key under an escalation penalty: a temporary deny
// (the policy's deny status) or a cooldown (ResourceExhausted, itself a
// strike). It returns a nil error when the key has no penalty.
func (p *PolicyLimiter) penalized(ctx context.Context, snap *policy.Snapshot, esc *policy.Escalation, ru *rule, key string) (metadata.MD, error) {
	now := p.clock()
	pen := p.pen.Check(key, now)
	switch {
	case now.Before(pen.DenyUntil):
		p.stats.tempDenied.Add(1)
		return p.refuse(ru, snap.DenyStatus(), "temporary-deny", "this client is denied for a while: it kept calling after being told to wait", pen.DenyUntil.Sub(now))
	case now.Before(pen.CooldownUntil):
		p.stats.cooldowns.Add(1)
		base := ru.limits[0].Window
		for _, lim := range ru.limits {
			base = min(base, lim.Window)
		}
		if np, ok := p.strike(ctx, key, esc, base); ok && np.CooldownUntil.After(pen.CooldownUntil) {
			pen = np
		}
		return p.refuse(ru, http.StatusTooManyRequests, "cooldown", "this client is cooling down: it kept calling after being told to wait", pen.CooldownUntil.Sub(now))
	}
	return nil, nil
}

// strike records a refusal of key in the penalties store.
func (p *PolicyLimiter) strike(ctx context.Context, key string, esc *policy.Escalation, base time.Duration) (policy.Penalty, bool) {
	p.stats.strikes.Add(1)
	pen, err := p.pen.Reject(ctx, key, p.clock(), esc, base)
	if err != nil {
		p.l.logf("grpclimit: penalties store failed", "error", err)
		return pen, false
	}
	if pen.Strikes > 0 {
		p.l.logf("grpclimit: client keeps calling after ResourceExhausted", "key", key, "strikes", pen.Strikes,
			"cooldown_until", pen.CooldownUntil, "deny_until", pen.DenyUntil)
	}
	return pen, true
}

// refuse refuses a call the policy refuses outside its limits: a deny
// (httpStatus 403: PermissionDenied; 429: ResourceExhausted) or an
// escalation penalty. A ResourceExhausted refusal carries a QuotaFailure
// naming the rule (or "deny") and quotaID, and, when wait is positive,
// RetryInfo with wait. It returns the response header metadata (retry-after
// when wait is positive) and the status error.
func (p *PolicyLimiter) refuse(ru *rule, httpStatus int, quotaID, msg string, wait time.Duration) (metadata.MD, error) {
	subject := "deny"
	if ru != nil {
		subject = ru.name()
	}
	var md metadata.MD
	if wait > 0 {
		msg = fmt.Sprintf("%s; retry in %v", msg, wait)
		if !p.l.hide {
			md = metadata.MD{MDRetryAfter: []string{strconv.FormatInt(max(ratefields.CeilSeconds(wait), 1), 10)}}
		}
	}
	code := codes.PermissionDenied
	if httpStatus == http.StatusTooManyRequests {
		code = codes.ResourceExhausted
	}
	st := status.New(code, msg)
	if code == codes.ResourceExhausted {
		var details []protoadapt.MessageV1
		if wait > 0 {
			details = append(details, &errdetails.RetryInfo{RetryDelay: durationpb.New(wait)})
		}
		details = append(details, &errdetails.QuotaFailure{Violations: []*errdetails.QuotaFailure_Violation{{
			Subject: subject, Description: msg, QuotaId: quotaID}}})
		if withDetails, err := st.WithDetails(details...); err == nil {
			st = withDetails
		}
	}
	return md, st.Err()
}
