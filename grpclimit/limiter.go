package grpclimit

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/ratesync/ratelimit"
	"github.com/ratesync/ratelimit/internal/ratefields"
)

// Response header metadata keys: the IETF RateLimit fields
// (draft-ietf-httpapi-ratelimit-headers) with the values httplimit writes,
// and Retry-After in whole seconds on a rejection.
const (
	MDPolicy     = "ratelimit-policy"
	MDRateLimit  = "ratelimit"
	MDDegraded   = "ratelimit-degraded"
	MDRetryAfter = "retry-after"
)

// Limiter holds the compiled Options and makes the server interceptors.
// It is safe for concurrent use.
type Limiter struct {
	ns       *ratelimit.Namespace
	def      *rule
	exact    map[string]*rule // by full method
	services map[string]*rule // by "/pkg.Service/"
	hide     bool
	keyCode  codes.Code
	log      *slog.Logger
	logEvery int64 // ns
	lastLog  atomic.Int64
	skipped  atomic.Int64
}

// rule is a Rule compiled for serving.
type rule struct {
	method     string // "" for the default
	prefix     string // prepended to keys so each rule has its own counters
	limits     []ratelimit.Limit
	keyFunc    KeyFunc
	cost       int64
	failClosed bool
	fields     ratefields.Fields // the ratelimit-policy and ratelimit values
}

// New compiles opts, or returns an error naming the field that is invalid.
func New(opts Options) (*Limiter, error) {
	l := &Limiter{ns: opts.Namespace, hide: opts.HideHeaders, keyCode: opts.KeyErrorCode, log: opts.Logger,
		exact: map[string]*rule{}, services: map[string]*rule{}}
	if l.ns == nil {
		return nil, errors.New("grpclimit: Options.Namespace is required")
	}
	if opts.KeyFunc == nil {
		opts.KeyFunc, _ = KeyByPeer(IPOptions{}) // the zero options are valid
	}
	if opts.Cost == 0 {
		opts.Cost = 1
	}
	if l.keyCode == codes.OK {
		l.keyCode = codes.InvalidArgument
	}
	if l.keyCode == codes.ResourceExhausted || l.keyCode > codes.Unauthenticated {
		return nil, fmt.Errorf("grpclimit: Options.KeyErrorCode %v is not an error code other than ResourceExhausted", l.keyCode)
	}
	if l.log == nil {
		l.log = slog.Default()
	}
	if opts.LogInterval < 0 {
		return nil, errors.New("grpclimit: Options.LogInterval must not be negative")
	}
	if opts.LogInterval == 0 {
		opts.LogInterval = 10 * time.Second
	}
	l.logEvery = int64(opts.LogInterval)
	var err error
	if l.def, err = l.compile(l.ns, "Options", Rule{Limits: opts.Limits, KeyFunc: opts.KeyFunc, Cost: opts.Cost, FailClosed: opts.FailClosed}); err != nil {
		return nil, err
	}
	for i, r := range opts.Rules {
		field := fmt.Sprintf("Options.Rules[%d] (%q)", i, r.Method)
		service, method, ok := splitMethod(r.Method)
		if !ok {
			return nil, fmt.Errorf("grpclimit: %s: Method is not \"/pkg.Service/Method\" or \"/pkg.Service/*\"", field)
		}
		if r.KeyFunc == nil {
			r.KeyFunc = opts.KeyFunc
		}
		if r.Cost == 0 {
			r.Cost = opts.Cost
		}
		c, err := l.compile(l.ns, field, r)
		if err != nil {
			return nil, err
		}
		c.method, c.prefix = r.Method, r.Method+"\x00"
		table, name := l.exact, r.Method
		if method == "*" {
			table, name = l.services, service
		}
		if _, dup := table[name]; dup {
			return nil, fmt.Errorf("grpclimit: %s: another rule names the same method", field)
		}
		table[name] = c
	}
	return l, nil
}

// splitMethod splits "/pkg.Service/Method" into "/pkg.Service/" and
// "Method".
func splitMethod(full string) (service, method string, ok bool) {
	if len(full) < 4 || full[0] != '/' {
		return "", "", false
	}
	i := strings.LastIndexByte(full, '/')
	if i <= 1 || i == len(full)-1 || strings.ContainsAny(full, " \t\x00") {
		return "", "", false
	}
	service, method = full[:i+1], full[i+1:]
	if strings.Contains(method, "*") && method != "*" {
		return "", "", false
	}
	return service, method, true
}

// compile checks r's limits against ns, which will count them, and
// precomputes its response metadata.
func (l *Limiter) compile(ns *ratelimit.Namespace, field string, r Rule) (*rule, error) {
	if r.Cost < 0 {
		return nil, fmt.Errorf("grpclimit: %s: Cost %d is negative", field, r.Cost)
	}
	c := &rule{keyFunc: r.KeyFunc, cost: r.Cost, failClosed: r.FailClosed}
	var err error
	// As httplimit: a token bucket is its Burst per refill time.
	if c.limits, c.fields, err = ratefields.Compile("grpclimit: "+field, ns, r.Cost, r.Limits); err != nil {
		return nil, err
	}
	return c, nil
}

func (ru *rule) name() string {
	if ru.method == "" {
		return "(default)"
	}
	return ru.method
}

// match returns the rule of a full method: exact, then service, then the
// default.
func (l *Limiter) match(full string) *rule {
	if r, ok := l.exact[full]; ok {
		return r
	}
	if i := strings.LastIndexByte(full, '/'); i > 0 {
		if r, ok := l.services[full[:i+1]]; ok {
			return r
		}
	}
	return l.def
}

// check decides one call. It returns the response header metadata to send
// (nil for none) and the status error that refuses the call (nil to serve
// it).
func (l *Limiter) check(ctx context.Context, full string) (metadata.MD, error) {
	ru := l.match(full)
	if len(ru.limits) == 0 {
		return nil, nil
	}
	key, err := ru.keyFunc(ctx, full)
	if err != nil || key == "" || strings.IndexByte(key, 0) >= 0 {
		return nil, l.noKey()
	}
	md, _, err := l.decide(ctx, ru, ru.prefix+key, nil)
	return md, err
}

// noKey is the status of a call without a usable key.
func (l *Limiter) noKey() error {
	return status.Error(l.keyCode, "the call carries no usable rate-limit key")
}

// decide decides one call under ru, counted under the counter key k. It
// returns the response header metadata to send (nil for none), the
// decision, and the status error that refuses the call (nil to serve it).
// A spare of ru.fields.MaxLen free bytes holds the ratelimit value (see
// ratefields.Fields.Value).
func (l *Limiter) decide(ctx context.Context, ru *rule, k string, spare []byte) (metadata.MD, ratelimit.Decision, error) {
	d, err := l.ns.Allow(ctx, k, ru.cost, ru.limits...)
	if err != nil {
		// Not a store failure (those come back as Degraded): the namespace is
		// closed. Treat it like one.
		l.logf("grpclimit: rate limit check failed", "rule", ru.name(), "error", err)
		if ru.failClosed {
			return nil, d, unavailable()
		}
		return nil, d, nil
	}
	var md metadata.MD
	if !l.hide {
		md = make(metadata.MD, 4)
	}
	if d.Degraded {
		l.logf("grpclimit: store unavailable, decided from local counts", "rule", ru.name(), "fail_closed", ru.failClosed)
		if md != nil {
			md[MDDegraded] = []string{"?1"}
		}
		if ru.failClosed {
			if d.Allowed {
				// Not served, so not counted: taken back here, pushed later.
				_ = l.ns.Refund(ctx, k, ru.cost, ru.limits...)
			}
			return md, d, unavailable()
		}
	}
	i := 0
	for j := range ru.limits {
		if ru.limits[j] == d.Limit {
			i = j
			break
		}
	}
	if md != nil {
		v, _, _ := ru.fields.Value(i, d, spare)
		md[MDPolicy] = []string{ru.fields.Policy}
		md[MDRateLimit] = []string{v}
	}
	if d.Allowed {
		return md, d, nil
	}
	if md != nil {
		md[MDRetryAfter] = []string{strconv.FormatInt(max(ratefields.CeilSeconds(d.RetryAfter), 1), 10)}
	}
	return md, d, rejection(ru, d)
}

// rejection is the status of a rejected call: ResourceExhausted with the true
// wait as RetryInfo and the violated policy as QuotaFailure.
func rejection(ru *rule, d ratelimit.Decision) error {
	lim := d.Limit
	msg := fmt.Sprintf("rate limit %q exceeded: at most %d per %v; retry in %v", lim.PolicyName(), lim.Max, lim.Window, d.RetryAfter)
	st, err := status.New(codes.ResourceExhausted, msg).WithDetails(
		&errdetails.RetryInfo{RetryDelay: durationpb.New(d.RetryAfter)},
		&errdetails.QuotaFailure{Violations: []*errdetails.QuotaFailure_Violation{{
			Subject:     ru.name(),
			Description: msg,
			QuotaId:     lim.PolicyName(),
			QuotaValue:  lim.Max,
			QuotaDimensions: map[string]string{
				"window": lim.Window.String(),
			},
		}}},
	)
	if err != nil { // only if the details cannot be marshalled
		return status.Error(codes.ResourceExhausted, msg)
	}
	return st.Err()
}

func unavailable() error {
	return status.Error(codes.Unavailable, "the rate limiter cannot reach its store and this method fails closed")
}

// UnaryServerInterceptor returns the interceptor that limits unary calls.
// A refused call never reaches the handler.
func (l *Limiter) UnaryServerInterceptor() grpc.UnaryServerInterceptor { return unary(l.check) }

// StreamServerInterceptor returns the interceptor that limits streams: a
// stream spends its cost once, when it opens; a refused stream never reaches
// the handler.
func (l *Limiter) StreamServerInterceptor() grpc.StreamServerInterceptor { return stream(l.check) }

// checkFunc decides a call by its full method: the response header metadata
// to send (nil for none) and the status error that refuses it (nil to serve
// it).
type checkFunc func(ctx context.Context, fullMethod string) (metadata.MD, error)

func unary(check checkFunc) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		md, err := check(ctx, info.FullMethod)
		if len(md) > 0 {
			_ = grpc.SetHeader(ctx, md) // fails only if headers were sent: they were not
		}
		if err != nil {
			return nil, err
		}
		return handler(ctx, req)
	}
}

func stream(check checkFunc) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		md, err := check(ss.Context(), info.FullMethod)
		if len(md) > 0 {
			_ = ss.SetHeader(md)
		}
		if err != nil {
			return err
		}
		return handler(srv, ss)
	}
}

// logf logs at most one line per LogInterval, counting the others.
func (l *Limiter) logf(msg string, args ...any) {
	now := time.Now().UnixNano()
	last := l.lastLog.Load()
	if now-last < l.logEvery || !l.lastLog.CompareAndSwap(last, now) {
		l.skipped.Add(1)
		return
	}
	l.log.Warn(msg, append(args, "skipped_since_last_line", l.skipped.Swap(0))...)
}
