package httplimit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/ratesync/ratelimit"
	"github.com/ratesync/ratelimit/internal/ratefields"
)

// Options configure the middleware. The zero value of every field but
// Namespace is a documented default.
type Options struct {
	// Namespace counts the hits. Its WindowSizes must include every limit's
	// Window. Required.
	Namespace *ratelimit.Namespace

	// Limits hold requests that match no Rule. Empty: such requests pass
	// unlimited and get no rate-limit headers.
	Limits []ratelimit.Limit
	// KeyFunc identifies the client of requests that match no Rule, and of
	// rules without their own. Default: KeyByIP(IPOptions{}), the peer's
	// address (no proxy trusted).
	KeyFunc KeyFunc
	// Cost is what one request spends, here and in rules without their own.
	// Default 1.
	Cost int64
	// FailClosed rejects, with 503 Service Unavailable, the requests matching
	// no Rule whose decision was degraded (the store failed). Default: fail
	// open, that is, decide from this node's own counts, which only ever
	// admits more than the cluster-wide counts would.
	FailClosed bool
	// Queue, when positive, holds a request matching no Rule that its limits
	// reject for up to Queue, instead of answering 429 at once: when the
	// limits would admit it within Queue (and within the request's own
	// deadline), the middleware waits (Namespace.Wait) and then serves it.
	// Traffic is shaped rather than refused. Default 0: no waiting.
	Queue time.Duration

	// Rules give routes their own limits, key and failure mode. A request is
	// matched against the patterns as http.ServeMux matches them (Go 1.22
	// syntax: "[METHOD ][HOST]/[PATH]" with {wildcards}; the most specific
	// wins); one matching no rule uses the fields above. Each rule counts in
	// its own counters, even when its limits equal another's.
	Rules []Rule

	// LegacyHeaders adds X-RateLimit-Limit, X-RateLimit-Remaining and
	// X-RateLimit-Reset (Unix seconds) to the IETF fields.
	LegacyHeaders bool
	// HideHeaders sends none of the rate-limit headers (RateLimit,
	// RateLimit-Policy, the legacy ones, RateLimit-Degraded). A 429 keeps its
	// Retry-After.
	HideHeaders bool
	// RetryJitter adds a random delay, up to RetryJitter, to the Retry-After
	// of a 429, so that clients rejected together do not come back together.
	// Default 0: Retry-After is the true wait, rounded up to whole seconds.
	RetryJitter time.Duration

	// KeyErrorStatus answers requests whose key cannot be found (the key
	// function failed or returned "" or a key holding a NUL byte). A 4xx or
	// 5xx status other than 429: a client without a key has not exceeded
	// anything. Default 400 Bad Request.
	KeyErrorStatus int

	// Logger receives a line when decisions are degraded (the store failed)
	// and when Allow fails, at most one per LogInterval with a count of the
	// lines skipped. Default slog.Default().
	Logger *slog.Logger
	// LogInterval spaces the log lines. Default 10 s.
	LogInterval time.Duration
	// Clock gives the time for X-RateLimit-Reset. Default time.Now.
	Clock func() time.Time
}

// Rule is a per-route policy.
type Rule struct {
	// Pattern is an http.ServeMux pattern, for example "POST /orders" or
	// "GET /items/{id}". Required; two rules may not have equal patterns.
	Pattern string
	// Limits hold the route. Empty: the route is exempt (health checks).
	Limits []ratelimit.Limit
	// KeyFunc identifies the client. Default Options.KeyFunc.
	KeyFunc KeyFunc
	// Cost is what one request spends. Default Options.Cost.
	Cost int64
	// FailClosed: see Options.FailClosed. Rules do not inherit it.
	FailClosed bool
	// Queue: see Options.Queue. Rules do not inherit it.
	Queue time.Duration
}

// rule is a Rule compiled for serving.
type rule struct {
	pattern    string
	prefix     string // prepended to keys so each rule has its own counters
	limits     []ratelimit.Limit
	keyFunc    KeyFunc
	cost       int64
	failClosed bool
	queue      time.Duration
	fields     ratefields.Fields // the RateLimit-Policy and RateLimit values
	maxes      []string          // per limit: its quota, for X-RateLimit-Limit
}

// core is the compiled configuration, shared by every handler New's
// function wraps.
type core struct {
	ns        *ratelimit.Namespace
	def       *rule
	rules     []*rule
	mux       *http.ServeMux // matches Rules; nil without rules
	legacy    bool
	hide      bool
	jitter    time.Duration
	keyStatus int
	log       *slog.Logger
	logEvery  int64 // ns
	lastLog   atomic.Int64
	skipped   atomic.Int64
	clock     func() time.Time
}

type middleware struct {
	*core
	next http.Handler
}

// ruleHandler marks a rule's pattern in the matching mux.
type ruleHandler int

func (ruleHandler) ServeHTTP(http.ResponseWriter, *http.Request) {}

// New returns the middleware described by opts, or an error naming the field
// that is invalid.
func New(opts Options) (func(http.Handler) http.Handler, error) {
	m := &core{ns: opts.Namespace, legacy: opts.LegacyHeaders, hide: opts.HideHeaders,
		jitter: opts.RetryJitter, keyStatus: opts.KeyErrorStatus, log: opts.Logger, clock: opts.Clock}
	if m.ns == nil {
		return nil, errors.New("httplimit: Options.Namespace is required")
	}
	if opts.KeyFunc == nil {
		opts.KeyFunc = KeyByIP(IPOptions{})
	}
	if opts.Cost == 0 {
		opts.Cost = 1
	}
	if m.keyStatus == 0 {
		m.keyStatus = http.StatusBadRequest
	}
	if m.keyStatus < 400 || m.keyStatus > 599 || m.keyStatus == http.StatusTooManyRequests {
		return nil, fmt.Errorf("httplimit: Options.KeyErrorStatus %d is not a 4xx or 5xx status other than 429", m.keyStatus)
	}
	if m.jitter < 0 {
		return nil, errors.New("httplimit: Options.RetryJitter must not be negative")
	}
	if m.log == nil {
		m.log = slog.Default()
	}
	if opts.LogInterval < 0 {
		return nil, errors.New("httplimit: Options.LogInterval must not be negative")
	}
	if opts.LogInterval == 0 {
		opts.LogInterval = 10 * time.Second
	}
	m.logEvery = int64(opts.LogInterval)
	if m.clock == nil {
		m.clock = time.Now
	}
	var err error
	if m.def, err = m.compile("Options", Rule{Limits: opts.Limits, KeyFunc: opts.KeyFunc, Cost: opts.Cost, FailClosed: opts.FailClosed, Queue: opts.Queue}); err != nil {
		return nil, err
	}
	if len(opts.Rules) > 0 {
		m.mux = http.NewServeMux()
	}
	for i, r := range opts.Rules {
		field := fmt.Sprintf("Options.Rules[%d] (%q)", i, r.Pattern)
		if r.Pattern == "" {
			return nil, fmt.Errorf("httplimit: %s: Pattern is required", field)
		}
		if r.KeyFunc == nil {
			r.KeyFunc = opts.KeyFunc
		}
		if r.Cost == 0 {
			r.Cost = opts.Cost
		}
		c, err := m.compile(field, r)
		if err != nil {
			return nil, err
		}
		c.pattern, c.prefix = r.Pattern, r.Pattern+"\x00"
		if err := register(m.mux, r.Pattern, ruleHandler(i)); err != nil {
			return nil, fmt.Errorf("httplimit: %s: %w", field, err)
		}
		m.rules = append(m.rules, c)
	}
	return func(next http.Handler) http.Handler {
		return &middleware{core: m, next: next}
	}, nil
}

// register adds a pattern to mux, turning ServeMux's panic on a bad or
// conflicting pattern into an error.
func register(mux *http.ServeMux, pattern string, h http.Handler) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("%v", p)
		}
	}()
	mux.Handle(pattern, h)
	return nil
}

func (m *core) compile(field string, r Rule) (*rule, error) {
	if r.Cost < 0 {
		return nil, fmt.Errorf("httplimit: %s: Cost %d is negative", field, r.Cost)
	}
	if r.Queue < 0 {
		return nil, fmt.Errorf("httplimit: %s: Queue %v is negative", field, r.Queue)
	}
	c := &rule{keyFunc: r.KeyFunc, cost: r.Cost, failClosed: r.FailClosed, queue: r.Queue}
	var err error
	if c.limits, c.fields, err = ratefields.Compile("httplimit: "+field, m.ns, r.Cost, r.Limits); err != nil {
		return nil, err
	}
	for _, l := range c.limits {
		q, _ := ratefields.Quota(l)
		c.maxes = append(c.maxes, strconv.FormatInt(q, 10))
	}
	return c, nil
}

// answer writes a decision's headers (unless hidden) and, when it rejects,
// the 429; it reports whether the request may go on. The headers describe the
// binding limit, d.Limit, found among the rule's limits.
// A spare of at least ru.fields.MaxLen free bytes (see writeHeaders) saves an
// allocation.
func (m *core) answer(w http.ResponseWriter, h http.Header, ru *rule, d ratelimit.Decision, spare []byte) bool {
	i := 0
	for j := range ru.limits {
		if ru.limits[j] == d.Limit {
			i = j
			break
		}
	}
	if !m.hide {
		m.writeHeaders(h, ru, i, d, spare)
	}
	if !d.Allowed {
		m.reject(w, ru, i, d)
		return false
	}
	return true
}

func (ru *rule) name() string {
	if ru.pattern == "" {
		return "(default)"
	}
	return ru.pattern
}

func (m *core) match(r *http.Request) *rule {
	if m.mux == nil {
		return m.def
	}
	if h, _ := m.mux.Handler(r); h != nil {
		if i, ok := h.(ruleHandler); ok {
			return m.rules[i]
		}
	}
	return m.def
}

func (m *middleware) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	ru := m.match(r)
	if len(ru.limits) == 0 {
		m.next.ServeHTTP(w, r)
		return
	}
	kr := r
	if ru.pattern != "" && r.Pattern == "" {
		// Let KeyByRoute see the rule's pattern, without touching r.
		c := *r
		c.Pattern = ru.pattern
		kr = &c
	}
	key, err := ru.keyFunc(kr)
	if err != nil || key == "" || strings.IndexByte(key, 0) >= 0 {
		m.problem(w, m.keyStatus, "the request carries no usable rate-limit key", nil, 0)
		return
	}
	if ru.prefix != "" {
		key = ru.prefix + key
	}
	d, err := m.decide(r, key, ru)
	if err != nil {
		// Not a store failure (those come back as Degraded): the namespace is
		// closed or the request's context is nil. Treat it like one.
		m.logf("httplimit: rate limit check failed", "rule", ru.name(), "error", err)
		if ru.failClosed {
			m.unavailable(w)
			return
		}
		m.next.ServeHTTP(w, r)
		return
	}
	h := w.Header()
	if d.Degraded {
		m.logf("httplimit: store unavailable, decided from local counts", "rule", ru.name(), "fail_closed", ru.failClosed)
		if !m.hide {
			h["Ratelimit-Degraded"] = []string{"?1"}
		}
		if ru.failClosed {
			if d.Allowed {
				// Not served, so not counted: taken back here, pushed later.
				_ = m.ns.Refund(r.Context(), key, ru.cost, ru.limits...)
			}
			m.unavailable(w)
			return
		}
	}
	if !m.answer(w, h, ru, d, nil) {
		return
	}
	m.next.ServeHTTP(w, r)
}

// decide is Allow, or for a rule that queues, Wait for up to its Queue: a
// request that cannot be admitted in time gets the rejection.
func (m *core) decide(r *http.Request, key string, ru *rule) (ratelimit.Decision, error) {
	if ru.queue <= 0 {
		return m.ns.Allow(r.Context(), key, ru.cost, ru.limits...)
	}
	ctx, cancel := context.WithTimeout(r.Context(), ru.queue)
	defer cancel()
	d, err := m.ns.Wait(ctx, key, ru.cost, ru.limits...)
	if errors.Is(err, ratelimit.ErrWouldExceedDeadline) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		// Not admitted within the queue's time (or the client left): the
		// rejection is the answer.
		return d, nil
	}
	return d, err
}

// writeHeaders writes the rate-limit fields of decision d, whose binding
// limit is ru's i-th. The RateLimit value is built in spare when it has
// ru.fields.MaxLen bytes of capacity, else in a new string: spare is the
// unused tail of a buffer the caller allocated anyway, whose bytes nothing
// else will write (see ratefields.Fields.Value).
func (m *core) writeHeaders(h http.Header, ru *rule, i int, d ratelimit.Decision, spare []byte) {
	rl, r0, r1 := ru.fields.Value(i, d, spare) // r='s value is rl[r0:r1]
	// One allocation backs every field's value slice.
	if !m.legacy {
		vals := &[2]string{ru.fields.Policy, rl}
		h["Ratelimit-Policy"], h["Ratelimit"] = vals[0:1:1], vals[1:2:2]
		return
	}
	remaining := rl[r0:r1] // r=, unless it was clamped
	if d.Remaining > ratefields.MaxInteger {
		remaining = strconv.FormatInt(d.Remaining, 10)
	}
	reset := m.clock().Add(d.Reset)
	sec := reset.Unix()
	if reset.Nanosecond() > 0 {
		sec++
	}
	vals := &[5]string{ru.fields.Policy, rl, ru.maxes[i], remaining, strconv.FormatInt(sec, 10)}
	h["Ratelimit-Policy"], h["Ratelimit"] = vals[0:1:1], vals[1:2:2]
	h["X-Ratelimit-Limit"], h["X-Ratelimit-Remaining"], h["X-Ratelimit-Reset"] = vals[2:3:3], vals[3:4:4], vals[4:5:5]
}

// reject answers 429 with Retry-After and a problem report naming the policy.
func (m *core) reject(w http.ResponseWriter, ru *rule, i int, d ratelimit.Decision) {
	wait := d.RetryAfter
	if m.jitter > 0 {
		wait += rand.N(m.jitter + 1)
	}
	secs := max(ratefields.CeilSeconds(wait), 1) // 0 would invite an immediate retry storm
	l := d.Limit
	detail := fmt.Sprintf("Rate limit %q exceeded: at most %d per %v. Retry in %d s.", l.PolicyName(), l.Max, l.Window, secs)
	if l.Algorithm == ratelimit.TokenBucket {
		q, _ := ratefields.Quota(l)
		detail = fmt.Sprintf("Rate limit %q exceeded: a burst of %d, refilling %d per %v. Retry in %d s.", l.PolicyName(), q, l.Max, l.Window, secs)
	}
	m.problem(w, http.StatusTooManyRequests, detail, &l, secs)
}

func (m *core) unavailable(w http.ResponseWriter) {
	m.problem(w, http.StatusServiceUnavailable, "The rate limiter cannot reach its store and this route fails closed.", nil, 1)
}

// problem is an RFC 9457 problem report, with the violated policy as
// extension members.
type problem struct {
	Type       string `json:"type"`
	Title      string `json:"title"`
	Status     int    `json:"status"`
	Detail     string `json:"detail"`
	Policy     string `json:"policy,omitempty"`
	Limit      int64  `json:"limit,omitempty"`
	Window     int64  `json:"window,omitempty"` // seconds
	RetryAfter int64  `json:"retry_after,omitempty"`
}

// problem answers status with a problem report, and a positive retry (seconds)
// as Retry-After too.
func (m *core) problem(w http.ResponseWriter, status int, detail string, l *ratelimit.Limit, retry int64) {
	p := problem{Type: "about:blank", Title: http.StatusText(status), Status: status, Detail: detail, RetryAfter: retry}
	if l != nil {
		q, w := ratefields.Quota(*l)
		p.Policy, p.Limit, p.Window = l.PolicyName(), q, ratefields.WindowSeconds(w)
	}
	body, _ := json.Marshal(p) // cannot fail: strings and integers
	// One allocation backs every field's value slice.
	vals := &[4]string{"application/problem+json", strconv.Itoa(len(body) + 1), "nosniff", strconv.FormatInt(retry, 10)}
	h := w.Header()
	h["Content-Type"], h["Content-Length"], h["X-Content-Type-Options"] = vals[0:1:1], vals[1:2:2], vals[2:3:3]
	if retry > 0 {
		h["Retry-After"] = vals[3:4:4]
	}
	w.WriteHeader(status)
	_, _ = w.Write(append(body, '\n'))
}

// logf logs at most one line per LogInterval, counting the others.
func (m *core) logf(msg string, args ...any) {
	now := time.Now().UnixNano()
	last := m.lastLog.Load()
	if now-last < m.logEvery || !m.lastLog.CompareAndSwap(last, now) {
		m.skipped.Add(1)
		return
	}
	m.log.Warn(msg, append(args, "skipped_since_last_line", m.skipped.Swap(0))...)
}
