package httplimit_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/dunglas/httpsfv"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/ratesync/ratelimit"
	"github.com/ratesync/ratelimit/httplimit"
	"github.com/ratesync/ratelimit/strategy"
	"github.com/ratesync/ratelimit/strategy/memory"
)

// clock is a settable clock, safe for concurrent use.
type clock struct{ ns atomic.Int64 }

func newClock(t time.Time) *clock {
	c := &clock{}
	c.ns.Store(t.UnixNano())
	return c
}

func (c *clock) Now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *clock) Advance(d time.Duration) { c.ns.Add(int64(d)) }

// epoch is an instant on an hour boundary.
var epoch = time.UnixMilli(1_700_002_800_000)

// newNS returns a namespace in mode ("local", "sync" or "async") over a
// memory store, with windows of 1 s, 1 min and 1 h, closed at cleanup; a
// goroutine leak check is registered first.
func newNS(t testing.TB, mode string, clk *clock) (*ratelimit.Namespace, *memory.Store) {
	t.Helper()
	t.Cleanup(func() { goleak.VerifyNone(t) })
	cfg := ratelimit.Config{WindowSizes: []time.Duration{time.Second, time.Minute, time.Hour}, Clock: clk.Now, SyncRate: -1}
	store := memory.New()
	switch mode {
	case "sync":
		cfg.SyncRate, cfg.Strategy, cfg.RetryInterval = 0, store, time.Hour
	case "async":
		cfg.SyncRate, cfg.Strategy = time.Hour, store
	}
	reg := ratelimit.NewRegistry()
	ns, err := reg.New(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = reg.Close(context.Background()) })
	return ns, store
}

var ok = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("X-Handler", "yes")
	_, _ = io.WriteString(w, "ok")
})

func mustNew(t testing.TB, opts httplimit.Options, next http.Handler) http.Handler {
	t.Helper()
	mw, err := httplimit.New(opts)
	require.NoError(t, err)
	return mw(next)
}

func get(h http.Handler, method, target, remote string, hdr ...string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(method, target, nil)
	r.RemoteAddr = remote
	for i := 0; i+1 < len(hdr); i += 2 {
		r.Header.Add(hdr[i], hdr[i+1])
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

type problemBody struct {
	Type       string `json:"type"`
	Title      string `json:"title"`
	Status     int    `json:"status"`
	Detail     string `json:"detail"`
	Policy     string `json:"policy"`
	Limit      int64  `json:"limit"`
	Window     int64  `json:"window"`
	RetryAfter int64  `json:"retry_after"`
}

func decodeProblem(t *testing.T, w *httptest.ResponseRecorder) problemBody {
	t.Helper()
	require.Equal(t, "application/problem+json", w.Header().Get("Content-Type"))
	require.Equal(t, strconv.Itoa(w.Body.Len()), w.Header().Get("Content-Length"))
	var p problemBody
	require.NoError(t, json.Unmarshal(w.Body.Bytes(), &p))
	return p
}

func TestHeadersAndRejection(t *testing.T) {
	for _, mode := range []string{"local", "sync", "async"} {
		t.Run(mode, func(t *testing.T) {
			clk := newClock(epoch.Add(30 * time.Second))
			ns, _ := newNS(t, mode, clk)
			h := mustNew(t, httplimit.Options{Namespace: ns, Limits: []ratelimit.Limit{{Window: time.Minute, Max: 3}}}, ok)
			for i := range 3 {
				w := get(h, "GET", "/", "192.0.2.1:1234")
				require.Equal(t, http.StatusOK, w.Code)
				require.Equal(t, "yes", w.Header().Get("X-Handler"))
				require.Equal(t, `"per-minute";q=3;w=60`, w.Header().Get("RateLimit-Policy"))
				// t: the hits weigh until the end of the next minute, 90 s away.
				require.Equal(t, fmt.Sprintf(`"per-minute";r=%d;t=90`, 2-i), w.Header().Get("RateLimit"))
				require.Empty(t, w.Header().Get("Retry-After"))
				require.Empty(t, w.Header().Get("RateLimit-Degraded"))
				require.Empty(t, w.Header().Get("X-RateLimit-Limit"))
			}
			w := get(h, "GET", "/", "192.0.2.1:1234")
			require.Equal(t, http.StatusTooManyRequests, w.Code)
			require.Empty(t, w.Header().Get("X-Handler"))
			require.Equal(t, `"per-minute";q=3;w=60`, w.Header().Get("RateLimit-Policy"))
			require.Equal(t, `"per-minute";r=0;t=90`, w.Header().Get("RateLimit"))
			// 3*(60-t)/60 <= 2 at t = 20 s of the next minute: 50 s from now.
			require.Equal(t, "50", w.Header().Get("Retry-After"))
			p := decodeProblem(t, w)
			require.Equal(t, problemBody{Type: "about:blank", Title: "Too Many Requests", Status: 429,
				Detail: `Rate limit "per-minute" exceeded: at most 3 per 1m0s. Retry in 50 s.`,
				Policy: "per-minute", Limit: 3, Window: 60, RetryAfter: 50}, p)

			// Another client is not affected.
			w = get(h, "GET", "/", "192.0.2.2:1234")
			require.Equal(t, http.StatusOK, w.Code)

			clk.Advance(50 * time.Second)
			w = get(h, "GET", "/", "192.0.2.1:1234")
			require.Equal(t, http.StatusOK, w.Code, "admitted at Retry-After")
		})
	}
}

// TestHeadersParse parses the emitted fields with a structured-fields parser.
func TestHeadersParse(t *testing.T) {
	clk := newClock(epoch)
	ns, _ := newNS(t, "local", clk)
	h := mustNew(t, httplimit.Options{Namespace: ns, Limits: []ratelimit.Limit{
		{Window: time.Second, Max: 10},
		{Window: time.Hour, Max: 1000, Name: `tier "gold" \ hourly`},
	}}, ok)
	for i := range 12 {
		w := get(h, "GET", "/", "192.0.2.1:1")
		policy, err := httpsfv.UnmarshalList(w.Header().Values("RateLimit-Policy"))
		require.NoError(t, err)
		require.Len(t, policy, 2)
		want := []struct {
			name string
			q, w int64
		}{{"per-second", 10, 1}, {`tier "gold" \ hourly`, 1000, 3600}}
		for j, m := range policy {
			it := m.(httpsfv.Item)
			require.Equal(t, want[j].name, it.Value)
			q, _ := it.Params.Get("q")
			wv, _ := it.Params.Get("w")
			require.Equal(t, want[j].q, q)
			require.Equal(t, want[j].w, wv)
		}
		rl, err := httpsfv.UnmarshalList(w.Header().Values("RateLimit"))
		require.NoError(t, err)
		require.Len(t, rl, 1)
		it := rl[0].(httpsfv.Item)
		require.Equal(t, "per-second", it.Value)
		r, _ := it.Params.Get("r")
		tt, _ := it.Params.Get("t")
		require.Equal(t, []string{"r", "t"}, it.Params.Names())
		if i < 10 {
			require.Equal(t, int64(9-i), r)
			require.Equal(t, int64(2), tt)
			require.Equal(t, http.StatusOK, w.Code)
		} else {
			require.Equal(t, int64(0), r)
			require.Equal(t, http.StatusTooManyRequests, w.Code)
		}
	}
}

func TestLegacyAndHiddenHeaders(t *testing.T) {
	clk := newClock(epoch.Add(15 * time.Second))
	ns, _ := newNS(t, "local", clk)
	limits := []ratelimit.Limit{{Window: time.Minute, Max: 2, Fixed: true}}
	legacy := mustNew(t, httplimit.Options{Namespace: ns, Limits: limits, LegacyHeaders: true, Clock: clk.Now}, ok)
	w := get(legacy, "GET", "/", "192.0.2.1:1")
	require.Equal(t, "2", w.Header().Get("X-RateLimit-Limit"))
	require.Equal(t, "1", w.Header().Get("X-RateLimit-Remaining"))
	require.Equal(t, strconv.FormatInt(epoch.Add(time.Minute).Unix(), 10), w.Header().Get("X-RateLimit-Reset"))
	require.Equal(t, `"per-minute";r=1;t=45`, w.Header().Get("RateLimit"))

	hidden := mustNew(t, httplimit.Options{Namespace: ns, Limits: limits, HideHeaders: true}, ok)
	w = get(hidden, "GET", "/", "192.0.2.1:1")
	require.Equal(t, http.StatusOK, w.Code)
	w = get(hidden, "GET", "/", "192.0.2.1:1")
	require.Equal(t, http.StatusTooManyRequests, w.Code)
	for name := range w.Header() {
		require.NotContains(t, strings.ToLower(name), "ratelimit", "header %s", name)
	}
	require.Equal(t, "45", w.Header().Get("Retry-After"), "a 429 keeps Retry-After")
}

// TestHugeQuota: structured-field integers stop at 15 digits; the legacy
// fields carry the true values.
func TestHugeQuota(t *testing.T) {
	clk := newClock(epoch)
	ns, _ := newNS(t, "local", clk)
	for i, quota := range []int64{1_000_000_000_000_000, ratelimit.MaxValue} {
		limits := []ratelimit.Limit{{Window: time.Second, Max: quota}}
		h := mustNew(t, httplimit.Options{Namespace: ns, Limits: limits, LegacyHeaders: true, Clock: clk.Now}, ok)
		w := get(h, "GET", "/", fmt.Sprintf("192.0.2.%d:1", i+1))
		require.Equal(t, `"per-second";q=999999999999999;w=1`, w.Header().Get("RateLimit-Policy"))
		require.Equal(t, `"per-second";r=999999999999999;t=2`, w.Header().Get("RateLimit"))
		require.Equal(t, strconv.FormatInt(quota, 10), w.Header().Get("X-RateLimit-Limit"))
		require.Equal(t, strconv.FormatInt(quota-1, 10), w.Header().Get("X-RateLimit-Remaining"))
		require.Equal(t, strconv.FormatInt(epoch.Add(2*time.Second).Unix(), 10), w.Header().Get("X-RateLimit-Reset"))
	}
}

func TestRetryAfterRoundsUpWithJitter(t *testing.T) {
	clk := newClock(epoch.Add(999 * time.Millisecond))
	ns, _ := newNS(t, "local", clk)
	limits := []ratelimit.Limit{{Window: time.Second, Max: 1, Fixed: true}}
	h := mustNew(t, httplimit.Options{Namespace: ns, Limits: limits}, ok)
	require.Equal(t, http.StatusOK, get(h, "GET", "/", "192.0.2.1:1").Code)
	w := get(h, "GET", "/", "192.0.2.1:1")
	require.Equal(t, http.StatusTooManyRequests, w.Code)
	require.Equal(t, "1", w.Header().Get("Retry-After"), "1 ms rounds up to 1 s")

	jit := mustNew(t, httplimit.Options{Namespace: ns, Limits: limits, RetryJitter: 3 * time.Second}, ok)
	seen := map[string]bool{}
	for range 200 {
		w := get(jit, "GET", "/", "192.0.2.1:1")
		require.Equal(t, http.StatusTooManyRequests, w.Code)
		seen[w.Header().Get("Retry-After")] = true
	}
	// 1 ms plus up to 3 s, rounded up: 1 to 4 s, 4 only past 2.999 s.
	require.GreaterOrEqual(t, len(seen), 3)
	for v := range seen {
		require.Contains(t, []string{"1", "2", "3", "4"}, v)
	}
}

func TestPerRouteLimits(t *testing.T) {
	clk := newClock(epoch)
	ns, _ := newNS(t, "local", clk)
	mux := http.NewServeMux()
	mux.Handle("/", ok)
	opts := httplimit.Options{
		Namespace: ns,
		Limits:    []ratelimit.Limit{{Window: time.Minute, Max: 5, Name: "default"}},
		Rules: []httplimit.Rule{
			{Pattern: "POST /login", Limits: []ratelimit.Limit{{Window: time.Minute, Max: 2, Name: "login"}}},
			{Pattern: "GET /items/{id}", Limits: []ratelimit.Limit{{Window: time.Minute, Max: 3, Name: "items"}}, Cost: 1},
			{Pattern: "/expensive/", Limits: []ratelimit.Limit{{Window: time.Minute, Max: 10, Name: "expensive"}}, Cost: 5},
			{Pattern: "GET /healthz"}, // exempt
		},
	}
	h := mustNew(t, opts, mux)
	const ip = "192.0.2.9:1"
	code := func(method, path string) (int, string) {
		w := get(h, method, path, ip)
		return w.Code, w.Header().Get("RateLimit-Policy")
	}
	for i := range 3 {
		c, p := code("POST", "/login")
		require.Equal(t, map[bool]int{true: 200, false: 429}[i < 2], c)
		require.Equal(t, `"login";q=2;w=60`, p)
	}
	// Items share one budget across ids (the pattern, not the path).
	for i := range 4 {
		c, p := code("GET", fmt.Sprintf("/items/%d", i))
		require.Equal(t, map[bool]int{true: 200, false: 429}[i < 3], c)
		require.Equal(t, `"items";q=3;w=60`, p)
	}
	// HEAD matches GET patterns, as in ServeMux.
	c, _ := code("HEAD", "/items/1")
	require.Equal(t, 429, c)
	// Cost 5 against 10.
	for i := range 3 {
		c, _ := code("GET", "/expensive/x")
		require.Equal(t, map[bool]int{true: 200, false: 429}[i < 2], c)
	}
	// Login's POST is limited; a GET of /login falls to the default rule.
	for i := range 6 {
		c, p := code("GET", "/login")
		require.Equal(t, map[bool]int{true: 200, false: 429}[i < 5], c)
		require.Equal(t, `"default";q=5;w=60`, p)
	}
	for range 20 {
		w := get(h, "GET", "/healthz", ip)
		require.Equal(t, 200, w.Code)
		require.Empty(t, w.Header().Get("RateLimit"))
	}
}

func TestNoDefaultLimits(t *testing.T) {
	clk := newClock(epoch)
	ns, _ := newNS(t, "local", clk)
	h := mustNew(t, httplimit.Options{Namespace: ns, Rules: []httplimit.Rule{
		{Pattern: "/api/", Limits: []ratelimit.Limit{{Window: time.Second, Max: 1}}},
	}}, ok)
	for range 3 {
		w := get(h, "GET", "/other", "192.0.2.1:1")
		require.Equal(t, 200, w.Code)
		require.Empty(t, w.Header().Get("RateLimit-Policy"))
	}
	require.Equal(t, 200, get(h, "GET", "/api/x", "192.0.2.1:1").Code)
	require.Equal(t, 429, get(h, "GET", "/api/x", "192.0.2.1:1").Code)
}

func TestRouteKeyInsideAndOutsideMux(t *testing.T) {
	clk := newClock(epoch)
	ns, _ := newNS(t, "local", clk)
	limits := []ratelimit.Limit{{Window: time.Minute, Max: 1}}
	var keys []string
	record := func(r *http.Request) (string, error) {
		k, err := httplimit.KeyByRoute()(r)
		keys = append(keys, k)
		return k, err
	}
	// Inside a mux: r.Pattern is set by the mux.
	mw, err := httplimit.New(httplimit.Options{Namespace: ns, Limits: limits, KeyFunc: record})
	require.NoError(t, err)
	mux := http.NewServeMux()
	mux.Handle("GET /a/{id}", mw(ok))
	mux.Handle("/b/", mw(ok))
	require.Equal(t, 200, get(mux, "GET", "/a/1", "192.0.2.1:1").Code)
	require.Equal(t, 429, get(mux, "GET", "/a/2", "192.0.2.2:1").Code, "one budget for the route")
	require.Equal(t, 200, get(mux, "POST", "/b/x", "192.0.2.1:1").Code)
	require.Equal(t, 200, get(mux, "PUT", "/b/x", "192.0.2.1:1").Code, "the method is part of the key")
	require.Equal(t, []string{"route:GET /a/{id}", "route:GET /a/{id}", "route:POST /b/", "route:PUT /b/"}, keys)

	// Outside: the rule's pattern, without touching the request.
	keys = nil
	var seen string
	h := mustNew(t, httplimit.Options{Namespace: ns, KeyFunc: record, Rules: []httplimit.Rule{
		{Pattern: "GET /c/{id}", Limits: limits},
	}}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { seen = r.Pattern }))
	require.Equal(t, 200, get(h, "GET", "/c/1", "192.0.2.1:1").Code)
	require.Empty(t, seen, "the request passed on is the caller's")
	require.Equal(t, []string{"route:GET /c/{id}"}, keys)
}

func TestKeyErrors(t *testing.T) {
	clk := newClock(epoch)
	ns, _ := newNS(t, "local", clk)
	limits := []ratelimit.Limit{{Window: time.Minute, Max: 1}}
	for _, tc := range []struct {
		name   string
		status int
		kf     httplimit.KeyFunc
		want   int
	}{
		{"missing header, default status", 0, httplimit.KeyByHeader("X-Tenant"), 400},
		{"missing api key, 401", 401, httplimit.KeyByAPIKey("X-API-Key", "api_key"), 401},
		{"failing func, 500", 500, func(*http.Request) (string, error) { return "", io.ErrUnexpectedEOF }, 500},
		{"empty key", 0, func(*http.Request) (string, error) { return "", nil }, 400},
		{"NUL in key", 0, func(*http.Request) (string, error) { return "a\x00b", nil }, 400},
		{"bad RemoteAddr", 0, nil, 400},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := mustNew(t, httplimit.Options{Namespace: ns, Limits: limits, KeyFunc: tc.kf, KeyErrorStatus: tc.status}, ok)
			for range 3 {
				w := get(h, "GET", "/", "not-an-address")
				require.Equal(t, tc.want, w.Code)
				p := decodeProblem(t, w)
				require.Equal(t, tc.want, p.Status)
				require.Empty(t, w.Header().Get("Retry-After"))
				require.Empty(t, w.Header().Get("RateLimit"))
			}
		})
	}
}

func TestNewValidation(t *testing.T) {
	clk := newClock(epoch)
	ns, _ := newNS(t, "local", clk)
	good := []ratelimit.Limit{{Window: time.Minute, Max: 10}}
	for _, tc := range []struct {
		name string
		opts httplimit.Options
		want string
	}{
		{"no namespace", httplimit.Options{Limits: good}, "Namespace is required"},
		{"429 for key errors", httplimit.Options{Namespace: ns, Limits: good, KeyErrorStatus: 429}, "KeyErrorStatus 429"},
		{"200 for key errors", httplimit.Options{Namespace: ns, Limits: good, KeyErrorStatus: 200}, "KeyErrorStatus 200"},
		{"unknown window", httplimit.Options{Namespace: ns, Limits: []ratelimit.Limit{{Window: 2 * time.Minute, Max: 1}}}, "unknown window"},
		{"cost above max", httplimit.Options{Namespace: ns, Limits: good, Cost: 11}, "invalid cost"},
		{"negative cost", httplimit.Options{Namespace: ns, Limits: good, Cost: -1}, "negative"},
		{"bad max", httplimit.Options{Namespace: ns, Limits: []ratelimit.Limit{{Window: time.Minute}}}, "invalid limit"},
		{"bad name", httplimit.Options{Namespace: ns, Limits: []ratelimit.Limit{{Window: time.Minute, Max: 1, Name: "é"}}}, "policy name"},
		{"negative jitter", httplimit.Options{Namespace: ns, Limits: good, RetryJitter: -1}, "RetryJitter"},
		{"empty pattern", httplimit.Options{Namespace: ns, Rules: []httplimit.Rule{{Limits: good}}}, "Pattern is required"},
		{"bad pattern", httplimit.Options{Namespace: ns, Rules: []httplimit.Rule{{Pattern: "GET x", Limits: good}}}, `Rules[0] ("GET x")`},
		{"duplicate pattern", httplimit.Options{Namespace: ns, Rules: []httplimit.Rule{{Pattern: "/a", Limits: good}, {Pattern: "/a", Limits: good}}}, "Rules[1]"},
		{"bad rule limit", httplimit.Options{Namespace: ns, Rules: []httplimit.Rule{{Pattern: "/a", Limits: []ratelimit.Limit{{Window: time.Hour, Max: 1}}, Cost: 2}}}, "Rules[0]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := httplimit.New(tc.opts)
			require.ErrorContains(t, err, tc.want)
		})
	}
}

// logBuffer collects log lines, safe for concurrent use.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

func newLog() (*slog.Logger, func() string) {
	l := &logBuffer{}
	return slog.New(slog.NewTextHandler(l, nil)), l.String
}

func TestStoreFailure(t *testing.T) {
	clk := newClock(epoch)
	ns, store := newNS(t, "sync", clk)
	var failing atomic.Bool
	store.SetFaults(func(memory.Op) memory.Fault {
		if failing.Load() {
			return memory.Refuse
		}
		return memory.NoFault
	})
	lg, logged := newLog()
	limits := []ratelimit.Limit{{Window: time.Minute, Max: 2}}
	h := mustNew(t, httplimit.Options{Namespace: ns, Limits: limits, Logger: lg, Rules: []httplimit.Rule{
		{Pattern: "/closed/", Limits: limits, FailClosed: true},
	}}, ok)

	w := get(h, "GET", "/open", "192.0.2.1:1")
	require.Equal(t, 200, w.Code)
	require.Empty(t, w.Header().Get("RateLimit-Degraded"))

	failing.Store(true)
	// Fail open: decided from local counts, visibly.
	w = get(h, "GET", "/open", "192.0.2.1:1")
	require.Equal(t, 200, w.Code)
	require.Equal(t, "?1", w.Header().Get("RateLimit-Degraded"))
	require.Equal(t, `"per-minute";r=0;t=120`, w.Header().Get("RateLimit"))
	// Local counts alone reach the limit: rejected without the store, not degraded.
	w = get(h, "GET", "/open", "192.0.2.1:1")
	require.Equal(t, 429, w.Code)
	require.Empty(t, w.Header().Get("RateLimit-Degraded"))

	// Fail closed.
	for range 3 {
		w = get(h, "GET", "/closed/x", "192.0.2.1:1")
		require.Equal(t, 503, w.Code)
		require.Equal(t, "?1", w.Header().Get("RateLimit-Degraded"))
		require.Equal(t, "1", w.Header().Get("Retry-After"))
		require.Equal(t, 503, decodeProblem(t, w).Status)
	}
	// One log line for the four degraded decisions (rate limited).
	out := logged()
	require.Equal(t, 1, strings.Count(out, "store unavailable"), out)

	failing.Store(false)
	w = get(h, "GET", "/closed/x", "192.0.2.3:1")
	require.Equal(t, 200, w.Code)
	require.Empty(t, w.Header().Get("RateLimit-Degraded"))
}

func TestStoreTimeoutBoundsTheWait(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		reg := ratelimit.NewRegistry()
		ns, err := reg.New(ratelimit.Config{WindowSizes: []time.Duration{time.Minute}, Strategy: &slowStore{Store: memory.New(), release: release},
			SyncTimeout: 300 * time.Millisecond, RetryInterval: time.Hour})
		require.NoError(t, err)
		limits := []ratelimit.Limit{{Window: time.Minute, Max: 5}}
		quiet := slog.New(slog.DiscardHandler)
		h := mustNew(t, httplimit.Options{Namespace: ns, Limits: limits, Logger: quiet}, ok)
		start := time.Now()
		w := get(h, "GET", "/", "192.0.2.1:1")
		require.Equal(t, 300*time.Millisecond, time.Since(start), "one SyncTimeout, then a degraded answer")
		require.Equal(t, 200, w.Code)
		require.Equal(t, "?1", w.Header().Get("RateLimit-Degraded"))
		// A rejection after a slow admission: the take-back gets what is left
		// of the SyncTimeout, no more.
		closed := mustNew(t, httplimit.Options{Namespace: ns, Limits: limits, FailClosed: true, Logger: quiet}, ok)
		start = time.Now()
		w = get(closed, "GET", "/", "192.0.2.2:1")
		require.Equal(t, 300*time.Millisecond, time.Since(start))
		require.Equal(t, 503, w.Code)
		close(release)
		require.NoError(t, reg.Close(context.Background()))
	})
}

// slowStore blocks pushes until its context ends.
type slowStore struct {
	*memory.Store
	release chan struct{}
}

func (s *slowStore) PushDiffs(ctx context.Context, b *strategy.Batch) (strategy.Result, error) {
	select {
	case <-ctx.Done():
		return strategy.Result{}, ctx.Err()
	case <-s.release:
		return s.Store.PushDiffs(ctx, b)
	}
}

func TestClosedNamespace(t *testing.T) {
	clk := newClock(epoch)
	ns, _ := newNS(t, "local", clk)
	limits := []ratelimit.Limit{{Window: time.Minute, Max: 1}}
	lg, logged := newLog()
	open := mustNew(t, httplimit.Options{Namespace: ns, Limits: limits, Logger: lg}, ok)
	closed := mustNew(t, httplimit.Options{Namespace: ns, Limits: limits, Logger: lg, FailClosed: true}, ok)
	require.NoError(t, ns.Close(context.Background()))
	require.Equal(t, 200, get(open, "GET", "/", "192.0.2.1:1").Code)
	require.Equal(t, 503, get(closed, "GET", "/", "192.0.2.1:1").Code)
	require.Contains(t, logged(), "rate limit check failed")
}

// TestBadInputNeverPanics sends hostile requests through the middleware.
func TestBadInputNeverPanics(t *testing.T) {
	clk := newClock(epoch)
	ns, _ := newNS(t, "local", clk)
	limits := []ratelimit.Limit{{Window: time.Minute, Max: 2}}
	huge := strings.Repeat("x", 1<<20)
	for _, kf := range []httplimit.KeyFunc{
		httplimit.KeyByIP(httplimit.IPOptions{TrustedProxies: proxies}),
		httplimit.KeyByIP(httplimit.IPOptions{TrustedProxies: proxies, Header: "Forwarded"}),
		httplimit.KeyByHeader("X-Tenant"),
		httplimit.KeyByAPIKey("Authorization", "k"),
		httplimit.Compose(httplimit.KeyByRoute(), httplimit.KeyByHeader("X-Tenant")),
	} {
		h := mustNew(t, httplimit.Options{Namespace: ns, Limits: limits, KeyFunc: kf, Rules: []httplimit.Rule{{Pattern: "GET /r/{x...}", Limits: limits}}}, ok)
		for _, hdr := range [][]string{
			{"X-Forwarded-For", huge},
			{"X-Forwarded-For", "\x00\xff,,[,]:"},
			{"Forwarded", `for="` + huge},
			{"Forwarded", `;;;==,,"\`},
			{"X-Tenant", huge},
			{"Authorization", "Bearer " + huge},
			{"Authorization", "Bearer"},
		} {
			for _, target := range []string{"/", "/r/" + strings.Repeat("a/", 1000), "/?k=%", "/?k=" + huge[:1000]} {
				for _, remote := range []string{"10.0.0.1:1", "", "garbage", "[::1]:99999"} {
					w := get(h, "GET", target, remote, hdr...)
					require.Contains(t, []int{200, 400, 429}, w.Code)
				}
			}
		}
	}
	// A huge key is counted (hashed by the namespace), not refused.
	h := mustNew(t, httplimit.Options{Namespace: ns, Limits: limits, KeyFunc: httplimit.KeyByHeader("X-Big")}, ok)
	codes := []int{}
	for range 3 {
		codes = append(codes, get(h, "GET", "/", "192.0.2.1:1", "X-Big", "big"+huge).Code)
	}
	require.Equal(t, []int{200, 200, 429}, codes)
}
