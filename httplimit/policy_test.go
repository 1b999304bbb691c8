package httplimit_test

import (
	"bytes"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit"
	"github.com/ratesync/ratelimit/httplimit"
	"github.com/ratesync/ratelimit/policy"
)

const testPolicy = `
default: {limits: [{window: 1m, max: 10}]}
rules:
  - {id: orders, match: {route: "POST /orders"}, limits: [{window: 1m, max: 2}]}
  - {id: pro, match: {tier: pro}, limits: [{window: 1m, max: 3}]}
  - {id: search-shadow, match: {route: "GET /search"}, shadow: true, limits: [{window: 1m, max: 1}]}
overrides: {vip: {limits: [{window: 1m, max: 4}]}}
allow: ["internal-*"]
deny: {keys: ["bad"], status: %d}
`

type policyEnv struct {
	h      http.Handler
	lim    *httplimit.PolicyLimiter
	holder *policy.Holder
	served atomic.Int64
	logs   *bytes.Buffer
}

func newPolicyEnv(t *testing.T, doc string, ns *ratelimit.Namespace) *policyEnv {
	t.Helper()
	s, err := policy.Load([]byte(doc), 1, policy.Options{})
	require.NoError(t, err)
	require.NoError(t, httplimit.CheckPolicy(ns)(s))
	env := &policyEnv{holder: policy.NewHolder(s), logs: new(bytes.Buffer)}
	var mu sync.Mutex
	env.lim, err = httplimit.NewWithPolicy(httplimit.PolicyOptions{
		Options: httplimit.Options{Namespace: ns, KeyFunc: httplimit.KeyByHeader("X-Key"),
			Logger: slog.New(slog.NewTextHandler(lockedWriter{&mu, env.logs}, nil)), LogInterval: time.Nanosecond},
		Policy: env.holder,
		Tier:   func(r *http.Request) string { return r.Header.Get("X-Tier") },
	})
	require.NoError(t, err)
	env.h = env.lim.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		env.served.Add(1)
		w.WriteHeader(http.StatusOK)
	}))
	return env
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func (e *policyEnv) do(method, path, key, tier string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(method, path, nil)
	if key != "" {
		r.Header.Set("X-Key", key)
	}
	if tier != "" {
		r.Header.Set("X-Tier", tier)
	}
	w := httptest.NewRecorder()
	e.h.ServeHTTP(w, r)
	return w
}

// admitted sends requests until one is rejected and returns how many passed.
func (e *policyEnv) admitted(t *testing.T, method, path, key, tier string) int {
	t.Helper()
	for n := 0; n < 100; n++ {
		if w := e.do(method, path, key, tier); w.Code != http.StatusOK {
			require.Equal(t, http.StatusTooManyRequests, w.Code)
			return n
		}
	}
	t.Fatal("never rejected")
	return 0
}

func TestPolicyLevels(t *testing.T) {
	clk := newClock(epoch)
	ns, _ := newNS(t, "local", clk)
	env := newPolicyEnv(t, fmt.Sprintf(testPolicy, 403), ns)

	require.Equal(t, 2, env.admitted(t, "POST", "/orders", "a", ""), "route rule")
	require.Equal(t, 3, env.admitted(t, "POST", "/orders", "b", "pro"), "tier over route")
	require.Equal(t, 4, env.admitted(t, "POST", "/orders", "vip", "pro"), "override over tier")
	require.Equal(t, 10, env.admitted(t, "GET", "/x", "c", ""), "default")
	require.Equal(t, 3, env.admitted(t, "GET", "/x", "d", "pro"), "tier over default")

	// Deny-listed keys never reach the handler.
	before := env.served.Load()
	w := env.do("GET", "/x", "bad", "pro")
	require.Equal(t, http.StatusForbidden, w.Code)
	require.Empty(t, w.Header().Get("Retry-After"))
	require.Equal(t, before, env.served.Load())

	// Allow-listed keys pass and spend nothing: once off the allow list, the
	// key has its whole quota.
	for range 50 {
		require.Equal(t, http.StatusOK, env.do("POST", "/orders", "internal-1", "").Code)
	}
	s2, err := policy.Load([]byte(strings.Replace(fmt.Sprintf(testPolicy, 403), `allow: ["internal-*"]`, "", 1)), 2, policy.Options{})
	require.NoError(t, err)
	env.holder.Store(s2)
	require.Equal(t, 2, env.admitted(t, "POST", "/orders", "internal-1", ""))

	st := env.lim.Stats()
	require.EqualValues(t, 2, st.Version)
	require.EqualValues(t, 1, st.Requests[policy.LevelDeny])
	require.EqualValues(t, 50, st.Requests[policy.LevelAllow])
	require.EqualValues(t, 5, st.Requests[policy.LevelOverride])
	require.EqualValues(t, 6, st.Rejected) // one per admitted call

	// No key: 400, not 429.
	require.Equal(t, http.StatusBadRequest, env.do("GET", "/x", "", "").Code)
}

func TestPolicyDeny429(t *testing.T) {
	ns, _ := newNS(t, "local", newClock(epoch))
	env := newPolicyEnv(t, fmt.Sprintf(testPolicy, 429), ns)
	w := env.do("GET", "/x", "bad", "")
	require.Equal(t, http.StatusTooManyRequests, w.Code)
	require.Equal(t, "3600", w.Header().Get("Retry-After"))
	require.Zero(t, env.served.Load())
}

// TestPolicyShadowNeverRejects checks a shadow rule decides, counts and logs
// its would-be rejections, never rejects, and spends nothing of the
// enforced limits.
func TestPolicyShadowNeverRejects(t *testing.T) {
	ns, _ := newNS(t, "local", newClock(epoch))
	env := newPolicyEnv(t, fmt.Sprintf(testPolicy, 403), ns)
	for i := range 5 {
		w := env.do("GET", "/search", "s", "")
		require.Equal(t, http.StatusOK, w.Code)
		// The default is enforced as if the shadow rule were not there.
		require.Contains(t, w.Header().Get("RateLimit"), fmt.Sprintf(";r=%d;", 10-1-i))
	}
	require.EqualValues(t, 4, env.lim.Stats().ShadowRejected)
	require.Contains(t, env.logs.String(), "shadow rule would reject")
	require.Contains(t, env.logs.String(), "rule=search-shadow")
	require.Equal(t, 5, env.admitted(t, "GET", "/search", "s", ""))
}

// TestPolicyShadowWithoutEnforcedRule: a shadow rule is decided even when no
// enforced rule or default matches the request.
func TestPolicyShadowWithoutEnforcedRule(t *testing.T) {
	ns, _ := newNS(t, "local", newClock(epoch))
	env := newPolicyEnv(t, `
rules:
  - {id: trial, match: {route: "GET /search"}, shadow: true, limits: [{window: 1m, max: 2}]}
`, ns)
	for range 5 {
		require.Equal(t, http.StatusOK, env.do("GET", "/search", "s", "").Code)
	}
	require.EqualValues(t, 3, env.lim.Stats().ShadowRejected)
}

// TestPolicyEqualRulesCountApart: rules with equal limits share their
// compiled limits and headers, never their counters or their names.
func TestPolicyEqualRulesCountApart(t *testing.T) {
	ns, _ := newNS(t, "local", newClock(epoch))
	env := newPolicyEnv(t, `
default: {limits: [{window: 1m, max: 100}]}
rules:
  - {id: a, match: {route: "GET /a"}, limits: [{window: 1m, max: 3}]}
  - {id: b, match: {route: "GET /b"}, limits: [{window: 1m, max: 3}]}
  - {id: c, match: {route: "GET /c"}, shadow: true, limits: [{window: 1m, max: 3}]}
  - {id: a-rule-id-longer-than-the-inline-prefix, match: {route: "GET /la"}, limits: [{window: 1m, max: 3}]}
  - {id: a-rule-id-longer-than-the-inline-prefiy, match: {route: "GET /lb"}, limits: [{window: 1m, max: 3}]}
`, ns)
	require.EqualValues(t, 64, httplimit.EntryRuleSize, "a compiled entry is one cache line")
	env.do("GET", "/a", "warm", "")
	require.Eventually(t, env.lim.Compiled, 5*time.Second, time.Millisecond)
	require.Equal(t, 3, env.admitted(t, "GET", "/a", "k", ""))
	require.Equal(t, 3, env.admitted(t, "GET", "/b", "k", ""))
	require.Equal(t, 3, env.admitted(t, "GET", "/la", "k", ""))
	require.Equal(t, 3, env.admitted(t, "GET", "/lb", "k", ""))
	for range 4 {
		require.Equal(t, http.StatusOK, env.do("GET", "/c", "k", "").Code)
	}
	require.Contains(t, env.logs.String(), "rule=c")
}

// TestPolicyCountersSurviveReload raises a tier's limit: what the client
// spent under the old version still counts.
func TestPolicyCountersSurviveReload(t *testing.T) {
	ns, _ := newNS(t, "local", newClock(epoch))
	doc := fmt.Sprintf(testPolicy, 403)
	env := newPolicyEnv(t, doc, ns)
	require.Equal(t, 3, env.admitted(t, "GET", "/x", "p", "pro"))
	s2, err := policy.Load([]byte(strings.Replace(doc, "max: 3}", "max: 5}", 1)), 2, policy.Options{})
	require.NoError(t, err)
	env.holder.Store(s2)
	require.Equal(t, 2, env.admitted(t, "GET", "/x", "p", "pro"))
}

// TestPolicyTokenBucketKeepsItsTokens raises a token-bucket tier's rate and
// burst: the tokens the client spent under the old version stay spent.
func TestPolicyTokenBucketKeepsItsTokens(t *testing.T) {
	ns, _ := newNS(t, "local", newClock(epoch))
	doc := `
default: {limits: [{window: 1m, max: 10}]}
rules:
  - {id: pro, match: {tier: pro}, limits: [{window: 1m, max: 6, algorithm: token_bucket, burst: 4}]}
`
	env := newPolicyEnv(t, doc, ns)
	require.Equal(t, 4, env.admitted(t, "GET", "/x", "p", "pro"), "the burst")
	// Ten times the rate, twice the burst: 4 tokens owed of 8.
	s2, err := policy.Load([]byte(strings.Replace(doc, "max: 6, algorithm: token_bucket, burst: 4", "max: 60, algorithm: gcra, burst: 8", 1)), 2, policy.Options{})
	require.NoError(t, err)
	env.holder.Store(s2)
	require.Equal(t, 4, env.admitted(t, "GET", "/x", "p", "pro"))
}

func TestPolicyMisfit(t *testing.T) {
	ns, _ := newNS(t, "local", newClock(epoch))
	s, err := policy.Load([]byte("default: {limits: [{window: 7s, max: 1}]}"), 1, policy.Options{})
	require.NoError(t, err)
	require.ErrorIs(t, httplimit.CheckPolicy(ns)(s), ratelimit.ErrUnknownWindow)
	require.ErrorIs(t, httplimit.CheckPolicy(ns)(s), policy.ErrInvalid)
	lim, err := httplimit.NewWithPolicy(httplimit.PolicyOptions{Options: httplimit.Options{Namespace: ns,
		KeyFunc: httplimit.KeyByHeader("X-Key"), Logger: slog.New(slog.DiscardHandler)}, Policy: policy.NewHolder(s)})
	require.NoError(t, err)
	h := lim.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	r := httptest.NewRequest("GET", "/", nil)
	r.Header.Set("X-Key", "k")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	require.Equal(t, http.StatusOK, w.Code)
	require.EqualValues(t, 1, lim.Stats().Misfits)
}

func TestNewWithPolicyValidation(t *testing.T) {
	ns, _ := newNS(t, "local", newClock(epoch))
	_, err := httplimit.NewWithPolicy(httplimit.PolicyOptions{Options: httplimit.Options{Namespace: ns}})
	require.ErrorContains(t, err, "Policy is required")
	_, err = httplimit.NewWithPolicy(httplimit.PolicyOptions{Options: httplimit.Options{Namespace: ns, Cost: 2}, Policy: policy.NewHolder(nil)})
	require.ErrorContains(t, err, "must be empty")
	_, err = httplimit.NewWithPolicy(httplimit.PolicyOptions{Policy: policy.NewHolder(nil)})
	require.ErrorContains(t, err, "Namespace is required")

	// No snapshot: every request passes.
	lim, err := httplimit.NewWithPolicy(httplimit.PolicyOptions{Options: httplimit.Options{Namespace: ns}, Policy: policy.NewHolder(nil)})
	require.NoError(t, err)
	w := httptest.NewRecorder()
	lim.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})).ServeHTTP(w, httptest.NewRequest("GET", "/", nil))
	require.Equal(t, http.StatusOK, w.Code)
}

// TestPolicySwapUnderLoad swaps snapshots while requests are served: no
// request fails, and every one sees a whole policy (its limit is one of the
// versions').
func TestPolicySwapUnderLoad(t *testing.T) {
	ns, _ := newNS(t, "local", newClock(epoch))
	doc := "default: {limits: [{window: 1m, max: %d, name: v%d}]}"
	env := newPolicyEnv(t, fmt.Sprintf(doc, 1_000_000, 0), ns)
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for g := range 2 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				w := env.do("GET", "/x", fmt.Sprintf("k%d-%d", g, i%100), "")
				if w.Code != http.StatusOK || !strings.HasPrefix(w.Header().Get("RateLimit"), `"v`) {
					t.Errorf("status %d, RateLimit %q", w.Code, w.Header().Get("RateLimit"))
					return
				}
			}
		})
	}
	for v := 1; v <= 200; v++ {
		s, err := policy.Load(fmt.Appendf(nil, doc, 1_000_000+v, v), int64(v), policy.Options{})
		require.NoError(t, err)
		env.holder.Store(s)
	}
	close(stop)
	wg.Wait()
}

// TestPolicyAddsNoAllocation serves the same requests through New (one
// default limit) and through a policy (a route rule, a tier rule, an
// override, the default, with allow and deny lists): the policy path
// allocates no more than New's, and its RateLimit field is New's.
func TestPolicyAddsNoAllocation(t *testing.T) {
	ns, _ := newNS(t, "local", newClock(epoch))
	lim := []ratelimit.Limit{{Window: time.Minute, Max: 1 << 40}}
	plain, err := httplimit.New(httplimit.Options{Namespace: ns, KeyFunc: httplimit.KeyByHeader("X-Key"), Limits: lim})
	require.NoError(t, err)
	doc := `
default: {limits: [{window: 1m, max: 1099511627776}]}
rules:
  - {id: orders, match: {route: "POST /orders"}, limits: [{window: 1m, max: 1099511627776}]}
  - {id: pro, match: {tier: pro}, limits: [{window: 1m, max: 1099511627776}]}
overrides: {vip: {limits: [{window: 1m, max: 1099511627776}]}}
allow: ["internal-*"]
deny: {keys: ["bad*"]}
`
	env := newPolicyEnv(t, doc, ns)
	// What env's handler does.
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusOK) })
	for _, c := range []struct{ method, path, key, tier string }{
		{"POST", "/orders", "k1", ""}, {"GET", "/x", "k2", "pro"}, {"GET", "/x", "vip", ""}, {"GET", "/x", "k3", ""},
	} {
		r := httptest.NewRequest(c.method, c.path, nil)
		r.Header.Set("X-Key", c.key)
		r.Header.Set("X-Tier", c.tier)
		w := &benchWriter{h: make(http.Header)}
		serve := func(h http.Handler) func() {
			return func() {
				clear(w.h)
				h.ServeHTTP(w, r)
			}
		}
		serve(plain(next))()
		want := testing.AllocsPerRun(200, serve(plain(next)))
		// The first request starts compiling the policy's entries in the
		// background; until that ends, each request compiles its own.
		serve(env.h)()
		require.Eventually(t, env.lim.Compiled, 5*time.Second, time.Millisecond)
		got := testing.AllocsPerRun(200, serve(env.h))
		require.LessOrEqual(t, got, want, "%+v: the policy allocates %v, New %v", c, got, want)
		require.Regexp(t, `^"per-minute";r=\d+;t=\d+$`, w.h.Get("RateLimit"), "%+v", c)
	}
}

// TestPolicyTierAskedOnlyForTierRules: the tier function (a JWT to verify,
// say) is called only while the policy in force has tier rules.
func TestPolicyTierAskedOnlyForTierRules(t *testing.T) {
	ns, _ := newNS(t, "local", newClock(epoch))
	noTiers, err := policy.Load([]byte("default: {limits: [{window: 1m, max: 10}]}"), 1, policy.Options{})
	require.NoError(t, err)
	holder := policy.NewHolder(noTiers)
	var asked atomic.Int64
	lim, err := httplimit.NewWithPolicy(httplimit.PolicyOptions{
		Options: httplimit.Options{Namespace: ns, KeyFunc: httplimit.KeyByHeader("X-Key")},
		Policy:  holder,
		Tier:    func(*http.Request) string { asked.Add(1); return "pro" },
	})
	require.NoError(t, err)
	h := lim.Wrap(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	serve := func() {
		r := httptest.NewRequest("GET", "/", nil)
		r.Header.Set("X-Key", "k")
		h.ServeHTTP(httptest.NewRecorder(), r)
	}
	serve()
	require.Zero(t, asked.Load())
	withTiers, err := policy.Load(fmt.Appendf(nil, testPolicy, 403), 2, policy.Options{})
	require.NoError(t, err)
	holder.Store(withTiers)
	serve()
	require.EqualValues(t, 1, asked.Load())
}
