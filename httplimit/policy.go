package httplimit

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/ratesync/ratelimit"
	"github.com/ratesync/ratelimit/internal/ratefields"
	"github.com/ratesync/ratelimit/policy"
)

// PolicyOptions configure NewWithPolicy.
type PolicyOptions struct {
	// Options are the middleware's options, as for New, except that the
	// limits come from the policy: Limits, Rules and Cost must be empty.
	// KeyFunc identifies the client; its key is matched against the
	// policy's lists, overrides and key globs.
	Options
	// Policy gives the policy in force (a *policy.Holder or a
	// *policy.Watcher); it is read on every request, so a new version applies
	// to the next request. A nil snapshot lets every request pass. Required.
	Policy policy.Provider
	// Tier returns the request's tier ("" for none): from a header, a
	// verified JWT claim, a context value. It is called only when the
	// policy in force has tier rules. Default: no tiers.
	Tier func(*http.Request) string
	// ShadowNamespace counts shadow rules. Default Namespace: shadow
	// counters have keys of their own there, so they never spend an enforced
	// rule's quota.
	ShadowNamespace *ratelimit.Namespace
	// Penalties keeps the escalation state of policies that escalate
	// (policy.Escalation), shared by the nodes that share it: a
	// redisstore.Penalties for a cluster. Default: a policy.MemoryPenalties
	// of this limiter alone.
	Penalties policy.Penalties
}

// PolicyLimiter is the middleware of a policy; see NewWithPolicy.
type PolicyLimiter struct {
	c        *core
	src      policy.Provider
	tier     func(*http.Request) string
	keyFunc  KeyFunc
	shadowNS *ratelimit.Namespace
	pen      policy.Penalties
	prep     atomic.Pointer[prepared]
	building atomic.Pointer[policy.Snapshot]
	stats    policyCounters
}

// prepared is a snapshot's entries compiled for serving, by Entry.Index.
type prepared struct {
	snap    *policy.Snapshot
	entries []entryRule
}

// entryRule is an entry compiled for serving: its rule, shared by the
// entries of equal limits, and what is its own. A request reads these few
// bytes, side by side with the other entries', and a rule that many
// requests share, rather than a rule, limits and header strings of its own:
// a policy of many rules with few distinct limits keeps few in the cache.
//
// An entry is 64 bytes, one cache line, with its prefix inline when the
// prefix is short: a request to one of many rules misses on one line, not
// on the entry and its prefix's bytes.
type entryRule struct {
	ru     *rule  // nil when the entry's limits do not fit the namespace
	name   string // the entry's name, for logs
	prefix string // of the entry's counters; its bytes are buf's when they fit
	buf    [24]byte
}

// setPrefix sets er's prefix, to bytes of er.buf when it fits. er must not
// move afterwards (an element of prepared.entries).
func (er *entryRule) setPrefix(prefix string) {
	if len(prefix) == 0 || len(prefix) > len(er.buf) {
		er.prefix = prefix
		return
	}
	n := copy(er.buf[:], prefix)
	er.prefix = unsafe.String(&er.buf[0], n)
}

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

// PolicyStats are a PolicyLimiter's counters since it was made.
type PolicyStats struct {
	// Version is the version of the last snapshot a request was served
	// with (0 before any).
	Version int64
	// Requests counts requests by the level that decided them, indexed by
	// policy.Level (LevelNone: nothing matched).
	Requests [policy.LevelDefault + 1]uint64
	// Rejected counts 429s sent by enforced limits.
	Rejected uint64
	// ShadowRejected counts requests a shadow rule would have rejected.
	ShadowRejected uint64
	// Misfits counts requests passed unlimited because their entry's limits
	// do not fit the namespace (a window it does not count): see
	// CheckPolicy, which refuses such a policy before it is installed.
	Misfits uint64
	// Cooldowns counts 429s sent to keys in an escalation cooldown;
	// TempDenied counts requests refused by a temporary deny; Strikes counts
	// rejections recorded in the penalties store.
	Cooldowns, TempDenied, Strikes uint64
}

// NewWithPolicy returns the middleware of a policy. Each request's key (from
// KeyFunc) and tier (from Tier) are resolved against the snapshot in force:
// deny-listed keys get the policy's status (403 or 429) and never reach the
// handler; allow-listed keys pass and spend nothing; other requests are
// limited by the per-key override, tier rule, route rule or global default
// that matches them, with the headers and 429 answers of New. Counters are
// keyed by rule id, so a new version of a rule keeps what clients spent.
// A shadow rule that matches is decided too, on counters of its own: a
// would-be rejection is counted (Stats.ShadowRejected) and logged, never
// sent.
func NewWithPolicy(opts PolicyOptions) (*PolicyLimiter, error) {
	if err := ratefields.CheckPolicyOptions("httplimit", opts.Policy, opts.Limits, len(opts.Rules), opts.Cost); err != nil {
		return nil, err
	}
	f, err := New(opts.Options)
	if err != nil {
		return nil, err
	}
	c := f(nil).(*middleware).core // the validated options, with defaults
	l := &PolicyLimiter{c: c, src: opts.Policy, tier: opts.Tier, keyFunc: c.def.keyFunc, shadowNS: opts.ShadowNamespace}
	if l.shadowNS == nil {
		l.shadowNS = c.ns
	}
	if l.pen = opts.Penalties; l.pen == nil {
		l.pen = policy.NewMemoryPenalties()
	}
	return l, nil
}

// CheckPolicy returns a check that a snapshot's limits fit ns (every window
// is one ns counts, every cost fits): give it to the policy's watcher, so a
// policy the middleware could not enforce is refused when published.
func CheckPolicy(ns *ratelimit.Namespace) func(*policy.Snapshot) error {
	return func(s *policy.Snapshot) error {
		for _, e := range s.Entries() {
			if err := ns.CheckLimits(e.Cost, e.Limits...); err != nil {
				return fmt.Errorf("%w: %s: %w", policy.ErrInvalid, e.Name(), err)
			}
		}
		return nil
	}
}

// Wrap returns next behind the middleware.
func (l *PolicyLimiter) Wrap(next http.Handler) http.Handler {
	return &policyHandler{l: l, next: next}
}

// Stats returns the limiter's counters.
func (l *PolicyLimiter) Stats() PolicyStats {
	s := PolicyStats{Version: l.stats.version.Load(), Rejected: l.stats.rejected.Load(),
		ShadowRejected: l.stats.shadowRejected.Load(), Misfits: l.stats.misfit.Load(),
		Cooldowns: l.stats.cooldowns.Load(), TempDenied: l.stats.tempDenied.Load(), Strikes: l.stats.strikes.Load()}
	for i := range s.Requests {
		s.Requests[i] = l.stats.levels[i].Load()
	}
	return s
}

type policyHandler struct {
	l    *PolicyLimiter
	next http.Handler
}

// prepared returns the compiled entries of snap, or nil while they are
// being compiled: the first request to see a new snapshot starts compiling
// them all in the background, and until that ends each request compiles only
// its own entry, so none waits for a reload.
func (l *PolicyLimiter) prepared(snap *policy.Snapshot) *prepared {
	if p := l.prep.Load(); p != nil && p.snap == snap {
		return p
	}
	if l.building.CompareAndSwap(nil, snap) {
		go func() {
			defer l.building.Store(nil)
			entries := snap.Entries()
			p := &prepared{snap: snap, entries: make([]entryRule, len(entries))}
			shared := map[string]*rule{}
			var fp []byte
			for _, e := range entries {
				fp = strconv.AppendBool(strconv.AppendInt(fp[:0], e.Cost, 10), e.Shadow)
				for _, lim := range e.Limits {
					fp = fmt.Appendf(fp, "|%d,%d,%t,%t,%q", lim.Window, lim.Max, lim.Fixed, lim.Penalty, lim.Name)
				}
				ru, ok := shared[string(fp)]
				if !ok {
					ru = l.compileEntry(e)
					shared[string(fp)] = ru
				}
				er := &p.entries[e.Index]
				er.ru, er.name = ru, e.Name()
				er.setPrefix(e.Prefix)
			}
			l.prep.Store(p)
		}()
	}
	return nil
}

// compileEntry compiles e's limits, or returns nil when they do not fit the
// namespace.
func (l *PolicyLimiter) compileEntry(e *policy.Entry) *rule {
	ns := l.c.ns
	if e.Shadow {
		ns = l.shadowNS
	}
	if ns.CheckLimits(e.Cost, e.Limits...) != nil {
		return nil
	}
	ru, err := l.c.compile(e.Name(), Rule{Limits: e.Limits, Cost: e.Cost})
	if err != nil {
		return nil
	}
	ru.failClosed = l.c.def.failClosed
	return ru
}

// entry returns the compiled entry of index i, e, compiling it when p is
// nil (while the snapshot's entries are being prepared).
func (p *prepared) entry(l *PolicyLimiter, e *policy.Entry, i int) *entryRule {
	if p != nil {
		return &p.entries[i]
	}
	return &entryRule{ru: l.compileEntry(e), name: e.Name(), prefix: e.Prefix}
}

func (h *policyHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	l, m := h.l, h.l.c
	key, err := l.keyFunc(r)
	if err != nil || key == "" || strings.IndexByte(key, 0) >= 0 {
		m.problem(w, m.keyStatus, "the request carries no usable rate-limit key", nil, 0)
		return
	}
	snap := l.src.Load()
	if snap == nil {
		l.stats.levels[policy.LevelNone].Add(1)
		h.next.ServeHTTP(w, r)
		return
	}
	if v := snap.Version(); l.stats.version.Load() != v {
		l.stats.version.Store(v)
	}
	tier := ""
	if l.tier != nil && snap.HasTiers() {
		tier = l.tier(r)
	}
	res := snap.Resolve(r, key, tier)
	l.stats.levels[res.Level].Add(1)
	switch res.Level {
	case policy.LevelDeny:
		retry := int64(0)
		if res.Status == http.StatusTooManyRequests {
			retry = 3600 // a 429 always says when to come back
		}
		m.problem(w, res.Status, "This client is denied by policy.", nil, retry)
		return
	case policy.LevelAllow:
		h.next.ServeHTTP(w, r)
		return
	}
	p := l.prepared(snap)
	if res.Shadow != nil {
		// Also when nothing enforced matched (LevelNone): a shadow rule
		// is tried on exactly the traffic it would limit.
		l.shadow(r, p.entry(l, res.Shadow, res.Shadow.Index), key)
	}
	if res.Entry == nil {
		h.next.ServeHTTP(w, r)
		return
	}
	er := p.entry(l, res.Entry, res.Index)
	ru := er.ru
	if ru == nil {
		l.stats.misfit.Add(1)
		m.logf("httplimit: policy entry does not fit the namespace; request passed unlimited", "rule", er.name, "version", snap.Version())
		h.next.ServeHTTP(w, r)
		return
	}
	esc := snap.Escalation()
	if esc != nil && l.penalized(w, r, snap, esc, ru, key) {
		return
	}
	// The counter key (the entry's prefix and the key) and the RateLimit
	// field's value share one allocation, so the policy adds none to the
	// request: keys are immutable strings over the first bytes, and the
	// field is written once into the rest.
	kb := make([]byte, 0, len(er.prefix)+len(key)+ru.fields.MaxLen)
	kb = append(append(kb, er.prefix...), key...)
	status, d := m.serveLimited(w, r, ru, er.name, unsafe.String(unsafe.SliceData(kb), len(kb)), kb[len(kb):])
	switch status {
	case 0:
		h.next.ServeHTTP(w, r)
	case http.StatusTooManyRequests:
		l.stats.rejected.Add(1)
		if esc != nil {
			l.strike(r, key, esc, d.Limit.Window)
		}
	}
}

// penalized answers a key under an escalation penalty: a temporary deny
// (the policy's deny status) or a cooldown (429, itself a strike). It
// returns false when the key has no penalty.
func (l *PolicyLimiter) penalized(w http.ResponseWriter, r *http.Request, snap *policy.Snapshot, esc *policy.Escalation, ru *rule, key string) bool {
	m := l.c
	now := m.clock()
	pen := l.pen.Check(key, now)
	switch {
	case now.Before(pen.DenyUntil):
		l.stats.tempDenied.Add(1)
		m.problem(w, snap.DenyStatus(), "This client is denied for a while: it kept sending after being told to wait.", nil, max(ratefields.CeilSeconds(pen.DenyUntil.Sub(now)), 1))
		return true
	case now.Before(pen.CooldownUntil):
		l.stats.cooldowns.Add(1)
		base := ru.limits[0].Window
		for _, lim := range ru.limits {
			base = min(base, lim.Window)
		}
		if p, ok := l.strike(r, key, esc, base); ok && p.CooldownUntil.After(pen.CooldownUntil) {
			pen = p
		}
		m.problem(w, http.StatusTooManyRequests, "This client is cooling down: it kept sending after being told to wait.", nil, max(ratefields.CeilSeconds(pen.CooldownUntil.Sub(now)), 1))
		return true
	}
	return false
}

// strike records a rejection of key in the penalties store.
func (l *PolicyLimiter) strike(r *http.Request, key string, esc *policy.Escalation, base time.Duration) (policy.Penalty, bool) {
	l.stats.strikes.Add(1)
	p, err := l.pen.Reject(r.Context(), key, l.c.clock(), esc, base)
	if err != nil {
		l.c.logf("httplimit: penalties store failed", "error", err)
		return p, false
	}
	if p.Strikes > 0 {
		l.c.logf("httplimit: client keeps sending after 429", "key", key, "strikes", p.Strikes, "cooldown_until", p.CooldownUntil, "deny_until", p.DenyUntil)
	}
	return p, true
}

// shadow decides a shadow rule on its own counters and counts a would-be
// rejection; it never answers.
func (l *PolicyLimiter) shadow(r *http.Request, er *entryRule, key string) {
	ru := er.ru
	if ru == nil {
		l.stats.misfit.Add(1)
		return
	}
	d, err := l.shadowNS.Allow(r.Context(), er.prefix+key, ru.cost, ru.limits...)
	if err == nil && !d.Allowed {
		l.stats.shadowRejected.Add(1)
		l.c.logf("httplimit: shadow rule would reject", "rule", er.name, "key", key, "limit", d.Limit.PolicyName(), "retry_after", d.RetryAfter)
	}
}

// serveLimited decides a request under ru (of the entry named name) with
// the counter key k, writing the headers (into spare when it is large
// enough; see writeHeaders); it answers 429 or 503 itself and returns that
// status, or returns 0 for the caller to serve the request; and the
// decision.
func (m *core) serveLimited(w http.ResponseWriter, r *http.Request, ru *rule, name, k string, spare []byte) (int, ratelimit.Decision) {
	d, err := m.ns.Allow(r.Context(), k, ru.cost, ru.limits...)
	if err != nil {
		m.logf("httplimit: rate limit check failed", "rule", name, "error", err)
		if ru.failClosed {
			m.unavailable(w)
			return http.StatusServiceUnavailable, d
		}
		return 0, d
	}
	h := w.Header()
	if d.Degraded {
		m.logf("httplimit: store unavailable, decided from local counts", "rule", name, "fail_closed", ru.failClosed)
		if !m.hide {
			h["Ratelimit-Degraded"] = []string{"?1"}
		}
		if ru.failClosed {
			if d.Allowed {
				_ = m.ns.Refund(r.Context(), k, ru.cost, ru.limits...)
			}
			m.unavailable(w)
			return http.StatusServiceUnavailable, d
		}
	}
	if !m.answer(w, h, ru, d, spare) {
		return http.StatusTooManyRequests, d
	}
	return 0, d
}
