package httplimit_test

import (
	"flag"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit"
	"github.com/ratesync/ratelimit/httplimit"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/ with the current output")

// goldenPath is the fixture's path in the repository's top-level testdata/.
func goldenPath(name string) string { return filepath.Join("..", "testdata", "httplimit", name) }

// TestGoldenResponses records what a client sees, status line, headers and
// body, for a burst against one route with two limits, a request without a
// key, and a fail-closed route: testdata/httplimit/responses.golden. A change
// to any header or body shows up as a diff there; run
// go test ./httplimit -run TestGoldenResponses -update to accept it.
func TestGoldenResponses(t *testing.T) {
	clk := newClock(epoch.Add(30 * time.Second))
	ns, _ := newNS(t, "local", clk)
	h := mustNew(t, httplimit.Options{
		Namespace: ns,
		Limits:    []ratelimit.Limit{{Window: time.Second, Max: 2}, {Window: time.Minute, Max: 3, Name: "per-minute"}},
		KeyFunc:   httplimit.KeyByHeader("X-Tenant"),
		Rules: []httplimit.Rule{
			{Pattern: "GET /healthz"},
			{Pattern: "POST /login", Limits: []ratelimit.Limit{{Window: time.Minute, Max: 1, Name: "login"}}, FailClosed: true},
		},
		LegacyHeaders: true,
		Clock:         clk.Now, // X-RateLimit-Reset is a Unix time
	}, ok)
	var out strings.Builder
	do := func(what, method, target string, hdr ...string) {
		w := get(h, method, target, "192.0.2.1:1234", hdr...)
		fmt.Fprintf(&out, "### %s: %s %s\n%d %s\n", what, method, target, w.Code, http.StatusText(w.Code))
		names := make([]string, 0, len(w.Header()))
		for k := range w.Header() {
			names = append(names, k)
		}
		slices.Sort(names)
		for _, k := range names {
			for _, v := range w.Header()[k] {
				fmt.Fprintf(&out, "%s: %s\n", k, v)
			}
		}
		fmt.Fprintf(&out, "\n%s\n\n", strings.TrimRight(w.Body.String(), "\n"))
	}
	do("first request", "GET", "/search", "X-Tenant", "acme")
	do("second request, same second", "GET", "/search", "X-Tenant", "acme")
	do("third request, same second: the per-second limit rejects", "GET", "/search", "X-Tenant", "acme")
	clk.Advance(2 * time.Second) // the per-second window has slid past both hits
	do("two seconds later", "GET", "/search", "X-Tenant", "acme")
	do("the fourth in a minute: the per-minute limit rejects", "GET", "/search", "X-Tenant", "acme")
	do("another tenant has its own budget", "GET", "/search", "X-Tenant", "globex")
	do("no key: 400, never 429", "GET", "/search")
	do("an exempt route", "GET", "/healthz")
	do("login, first", "POST", "/login", "X-Tenant", "acme")
	do("login, second", "POST", "/login", "X-Tenant", "acme")

	path := goldenPath("responses.golden")
	if *update {
		require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o755))
		require.NoError(t, os.WriteFile(path, []byte(out.String()), 0o644))
	}
	want, err := os.ReadFile(path)
	require.NoError(t, err, "run with -update to create it")
	require.Equal(t, string(want), out.String())
}
