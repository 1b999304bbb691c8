package node

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dunglas/httpsfv"

	"github.com/ratesync/ratelimit"
	"github.com/ratesync/ratelimit/httplimit"
	"github.com/ratesync/ratelimit/strategy/memory"
)

// Scenario 8: bad input. FuzzAPI drives the namespace's public methods, and
// FuzzMiddleware the HTTP middleware, with arbitrary arguments: nothing may
// panic, every error must match a documented sentinel, and every answer must
// be possible (no negative Remaining, no NaN rate). `go test` runs the seeds;
// .ci/fuzz.sh fuzzes each target for a while.

var fuzzSizes = []time.Duration{time.Second, 10 * time.Second, time.Minute}

// fuzzSpaces returns the namespaces the API fuzzer drives, one per mode,
// closed when f ends. Inputs share them (a fuzz worker runs its inputs one at
// a time), so state carries over between inputs as in a long-lived service.
// The synchronous namespace's store injects the fault *fault says.
func fuzzSpaces(f *testing.F, fault *atomic.Int32) []*ratelimit.Namespace {
	faulty := memory.New()
	faulty.SetFaults(func(memory.Op) memory.Fault { return memory.Fault(fault.Load()) })
	reg := ratelimit.NewRegistry()
	f.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		fault.Store(0)
		_ = reg.Close(ctx)
	})
	var out []*ratelimit.Namespace
	for _, c := range []ratelimit.Config{
		{Namespace: "local", SyncRate: -1},
		{Namespace: "periodic", SyncRate: time.Hour, Strategy: memory.New()},
		{Namespace: "sync", SyncRate: 0, Strategy: faulty, SyncTimeout: 50 * time.Millisecond, RetryInterval: time.Hour},
	} {
		c.WindowSizes, c.MaxKeys = fuzzSizes, 4096
		ns, err := reg.New(c)
		if err != nil {
			f.Fatal(err)
		}
		out = append(out, ns)
	}
	return out
}

func fuzzAPISeeds(f *testing.F) {
	big := strings.Repeat("k", 1<<20)
	sec, minute := int64(time.Second), int64(time.Minute)
	for _, s := range []struct {
		op, mode, fault uint8
		key             string
		cost, window    int64
		max             int64
		extra           int64
	}{
		{0, 0, 0, "user:1", 1, sec, 10, 0},
		{2, 1, 0, "user:1", 1, sec, 10, 0},
		{2, 2, 0, "user:1", 1, minute, 10, 0},
		{2, 2, 1, "user:1", 1, minute, 10, 0}, // refused
		{2, 2, 3, "user:1", 1, minute, 10, 0}, // lost reply
		{3, 2, 2, "user:1", 1, sec, 10, 0},    // lost request
		{2, 0, 0, "", 1, sec, 10, 0},
		{0, 1, 0, "", 1, sec, 10, 0},
		{2, 1, 0, big, 1, sec, 10, 0},
		{0, 2, 0, big, 5, minute, 0, 0},
		{2, 0, 0, "a\x00b", 1, sec, 10, 0},
		{1, 1, 0, "\xff\xfe\xfd", 0, sec, 10, 0},
		{2, 0, 0, "ok", -1, sec, 10, 0},
		{2, 0, 0, "ok", 0, sec, 10, 0},
		{2, 1, 0, "ok", math.MaxInt64, sec, math.MaxInt64, 0},
		{2, 1, 0, "ok", 1 << 53, sec, 1 << 53, 0},
		{2, 1, 0, "ok", 1<<53 + 1, sec, 1<<53 + 1, 0},
		{0, 0, 0, "ok", math.MinInt64, sec, 0, 0},
		{0, 1, 0, "ok", -(1 << 53), sec, 0, 0},
		{0, 2, 0, "ok", math.MaxInt64, sec, 0, 0},
		{2, 0, 0, "ok", 1, 0, 10, 0},
		{2, 0, 0, "ok", 1, -sec, 10, 0},
		{2, 0, 0, "ok", 1, math.MaxInt64, 10, 0},
		{2, 0, 0, "ok", 1, math.MinInt64, 10, 0},
		{2, 0, 0, "ok", 1, 1, 10, 0},
		{2, 0, 0, "ok", 1, sec, 0, 0},
		{2, 0, 0, "ok", 1, sec, -5, 0},
		{2, 0, 0, "ok", 1, sec, math.MinInt64, 0},
		{4, 1, 0, "ok", 3, sec, 10, 0}, // refund
		{5, 1, 0, "ok", 1, sec, 10, 0}, // two limits
		{5, 2, 0, "ok", 1, sec, 1, 0},  // two limits, the second tighter
		{6, 0, 0, "ok", 1, sec, 10, 0}, // CheckLimits
		{7, 1, 0, "ok", 0, sec, 0, -1}, // Fetch at an odd time
		{7, 2, 0, "ok", 0, sec, 0, math.MaxInt64},
		{8, 1, 0, "ok", 0, sec, 0, 0},  // Sync
		{9, 2, 1, "ok", 0, sec, 0, 0},  // Sync on a failing store
		{5, 0, 0, "ok", 1, sec, 10, 1}, // fixed, penalty
	} {
		f.Add(s.op, s.mode, s.fault, s.key, s.cost, s.window, s.max, s.extra)
	}
}

func FuzzAPI(f *testing.F) {
	fuzzAPISeeds(f)
	var faults atomic.Int32
	spaces := fuzzSpaces(f, &faults)
	f.Fuzz(func(t *testing.T, op, mode, fault uint8, key string, cost, window, limitMax, extra int64) {
		ns := spaces[int(mode)%len(spaces)]
		faults.Store(int32(fault % 4))
		defer faults.Store(0)
		ctx := context.Background()
		w := time.Duration(window)
		l := ratelimit.Limit{Window: w, Max: limitMax, Fixed: extra&1 != 0, Penalty: extra&2 != 0}
		check := func(what string, err error) {
			if err != nil && !isSentinel(err) {
				t.Fatalf("%s: error %v matches no sentinel", what, err)
			}
		}
		checkRate := func(what string, r float64, err error) {
			check(what, err)
			if math.IsNaN(r) || math.IsInf(r, 0) {
				t.Fatalf("%s: rate %v", what, r)
			}
		}
		checkD := func(what string, d ratelimit.Decision, err error) {
			check(what, err)
			if err == nil && impossible(d) {
				t.Fatalf("%s: impossible decision %+v", what, d)
			}
		}
		switch op % 10 {
		case 0:
			r, err := ns.Increment(ctx, key, w, cost)
			checkRate("Increment", r, err)
		case 1:
			r, err := ns.SlidingWindow(ctx, key, w)
			checkRate("SlidingWindow", r, err)
		case 2:
			d, err := ns.Allow(ctx, key, cost, l)
			checkD("Allow", d, err)
		case 3:
			d, err := ns.Peek(ctx, key, cost, l)
			checkD("Peek", d, err)
		case 4:
			check("Refund", ns.Refund(ctx, key, cost, l))
		case 5:
			second := ratelimit.Limit{Window: time.Minute, Max: max(limitMax/2, 1), Name: key}
			d, err := ns.Allow(ctx, key, cost, l, second, l)
			checkD("Allow with three limits", d, err)
		case 6:
			check("CheckLimits", ns.CheckLimits(cost, l))
		case 7:
			check("Fetch", ns.Fetch(ctx, time.Unix(0, extra)))
		case 8, 9:
			check("Sync", ns.Sync(ctx))
		}
		// Whatever came before, the namespace still answers sane requests.
		d, err := ns.Allow(ctx, "probe", 1, ratelimit.Limit{Window: time.Second, Max: math.MaxInt32})
		checkD("probe", d, err)
		if err != nil && !errors.Is(err, ratelimit.ErrStoreUnavailable) {
			t.Fatalf("probe: %v", err)
		}
	})
}

// fuzzHandlers returns the middlewares FuzzMiddleware drives, their
// namespaces closed when f ends: keys by IP (X-Forwarded-For and Forwarded
// behind trusted proxies), by header, by API key and route; rules with
// patterns; a fail-closed namespace whose store refuses every call.
func fuzzHandlers(f *testing.F) []http.Handler {
	next := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	reg := ratelimit.NewRegistry()
	f.Cleanup(func() {
		// One namespace's store is dead: its Close gives up at the deadline.
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		_ = reg.Close(ctx)
	})
	healthy, err := reg.New(ratelimit.Config{Namespace: "mw", WindowSizes: fuzzSizes, SyncRate: time.Hour, Strategy: memory.New(), MaxKeys: 4096})
	if err != nil {
		f.Fatal(err)
	}
	dead := memory.New()
	dead.SetFaults(func(memory.Op) memory.Fault { return memory.Refuse })
	down, err := reg.New(ratelimit.Config{Namespace: "mw-down", WindowSizes: fuzzSizes, SyncRate: 0, Strategy: dead,
		MaxKeys: 4096, RetryInterval: time.Hour})
	if err != nil {
		f.Fatal(err)
	}
	proxies := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("::1/128"), netip.MustParsePrefix("fd00::/8")}
	tight := []ratelimit.Limit{{Window: time.Second, Max: 2}, {Window: time.Minute, Max: 5, Name: "per-minute"}}
	rules := []httplimit.Rule{
		{Pattern: "POST /login", Limits: []ratelimit.Limit{{Window: 10 * time.Second, Max: 1}}, FailClosed: true},
		{Pattern: "GET /items/{id}", Limits: tight, KeyFunc: httplimit.Compose(httplimit.KeyByAPIKey("Authorization", "api_key"), httplimit.KeyByRoute())},
		{Pattern: "GET /healthz"},
		{Pattern: "example.com/{$}", Limits: tight, KeyFunc: httplimit.KeyByHeader("X-Tenant")},
	}
	quiet := slog.New(slog.DiscardHandler)
	var out []http.Handler
	for _, o := range []httplimit.Options{
		{Namespace: healthy, Limits: tight, KeyFunc: httplimit.KeyByIP(httplimit.IPOptions{TrustedProxies: proxies}), Rules: rules, LegacyHeaders: true},
		{Namespace: healthy, Limits: tight, KeyFunc: httplimit.KeyByIP(httplimit.IPOptions{TrustedProxies: proxies, Header: "Forwarded", IPv4Prefix: 24, IPv6Prefix: 48}), RetryJitter: time.Second},
		{Namespace: down, Limits: tight, Rules: rules, FailClosed: true},
		{Namespace: down, Limits: tight, KeyFunc: httplimit.KeyByHeader("X-Tenant"), KeyErrorStatus: http.StatusUnauthorized},
	} {
		o.Logger = quiet
		mw, err := httplimit.New(o)
		if err != nil {
			f.Fatal(err)
		}
		out = append(out, mw(next))
	}
	return out
}

func FuzzMiddleware(f *testing.F) {
	for _, s := range []struct {
		which                            uint8
		method, target, remote, xff, fwd string
		tenant, auth                     string
	}{
		{0, "GET", "/", "192.0.2.1:1234", "", "", "", ""},
		{0, "GET", "/", "10.0.0.1:1234", "198.51.100.7, 10.0.0.2", "", "", ""},
		{0, "GET", "/", "10.0.0.1:1234", "unknown, _hidden, ::ffff:1.2.3.4", "", "", ""},
		{0, "GET", "/", "10.0.0.1:1234", strings.Repeat("1.2.3.4,", 10000), "", "", ""},
		{0, "GET", "/", "10.0.0.1", "", "", "", ""},
		{0, "GET", "/", "", "", "", "", ""},
		{0, "GET", "/", "[::1]:80", "2001:db8::1", "", "", ""},
		{0, "GET", "/", "[fe80::1%eth0]:80", "", "", "", ""},
		{0, "GET", "/", "not an address", "", "", "", ""},
		{1, "GET", "/", "10.1.2.3:9", "", `for="[2001:db8:cafe::17]:4711", for=192.0.2.43;proto=https, for=unknown`, "", ""},
		{1, "GET", "/", "10.1.2.3:9", "", `for=";;,,""\"`, "", ""},
		{1, "GET", "/", "10.1.2.3:9", "", "for=" + strings.Repeat("x", 1<<20), "", ""},
		{0, "POST", "/login", "192.0.2.1:1", "", "", "", ""},
		{0, "GET", "/items/42?api_key=abc", "192.0.2.1:1", "", "", "", "Bearer t0ken"},
		{0, "GET", "/items/%00?api_key=%ff", "192.0.2.1:1", "", "", "", "Bearer "},
		{0, "GET", "/items/x?api_key=" + strings.Repeat("k", 1<<16), "192.0.2.1:1", "", "", "", ""},
		{0, "GET", "/healthz", "", "", "", "", ""},
		{0, "BREW", "//example.com/../../x", "192.0.2.1:1", "", "", "\x00", ""},
		{2, "POST", "/login", "192.0.2.1:1", "", "", "", ""},
		{2, "GET", "/", "192.0.2.1:1", "", "", "", ""},
		{3, "GET", "/", "", "", "", "tenant-a", ""},
		{3, "GET", "/", "", "", "", "a\x00b", ""},
		{3, "GET", "/", "", "", "", "\xff\xfe", ""},
		{3, "GET", "/", "", "", "", "", ""},
		{0, "GET", "*", "192.0.2.1:1", "", "", "", ""},
		{0, "", "", "", "", "", "", ""},
	} {
		f.Add(s.which, s.method, s.target, s.remote, s.xff, s.fwd, s.tenant, s.auth)
	}
	handlers := fuzzHandlers(f)
	f.Fuzz(func(t *testing.T, which uint8, method, target, remote, xff, fwd, tenant, auth string) {
		h := handlers[int(which)%len(handlers)]
		u, err := url.ParseRequestURI(target)
		if err != nil {
			u = &url.URL{Path: target}
		}
		r := (&http.Request{Method: method, URL: u, Host: "example.com", RemoteAddr: remote, RequestURI: target,
			Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1, Header: http.Header{}}).WithContext(context.Background())
		// Set directly: a client can send bytes that Header.Set would reject.
		for name, v := range map[string]string{"X-Forwarded-For": xff, "Forwarded": fwd, "X-Tenant": tenant, "Authorization": auth} {
			if v != "" {
				r.Header[name] = []string{v}
			}
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		res := rec.Result()
		switch res.StatusCode {
		case http.StatusOK, http.StatusBadRequest, http.StatusUnauthorized, http.StatusServiceUnavailable:
		case http.StatusTooManyRequests:
			secs, err := strconv.Atoi(res.Header.Get("Retry-After"))
			if err != nil || secs < 1 {
				t.Fatalf("429 with Retry-After %q", res.Header.Get("Retry-After"))
			}
		default:
			t.Fatalf("status %d", res.StatusCode)
		}
		if res.StatusCode != http.StatusOK {
			var p map[string]any
			if err := json.Unmarshal(rec.Body.Bytes(), &p); err != nil || p["status"] != float64(res.StatusCode) {
				t.Fatalf("status %d with body %q", res.StatusCode, rec.Body.String())
			}
		}
		for _, name := range []string{"RateLimit", "RateLimit-Policy"} {
			if v := res.Header.Values(name); len(v) > 0 {
				if _, err := httpsfv.UnmarshalList(v); err != nil {
					t.Fatalf("%s: %q is not a structured-field list: %v", name, v, err)
				}
			}
		}
		// The client address never panics and errs only with ErrNoKey.
		if _, err := httplimit.ClientIP(r, httplimit.IPOptions{TrustedProxies: []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0")}}); err != nil && !errors.Is(err, httplimit.ErrNoKey) {
			t.Fatalf("ClientIP: %v", err)
		}
	})
}
