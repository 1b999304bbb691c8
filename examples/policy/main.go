// Command policy is an HTTP service whose limits are data: a policy file
// (tiers, per-key overrides, allow and deny lists, a shadow rule, escalation)
// that it follows while it serves, and an operator API to change it.
//
//	go run ./examples/policy                      # writes ./policy.yaml if missing
//	go run ./examples/policy -policy /tmp/p.yaml -addr localhost:8081
//
// It prints the commands to try when it starts. Counters are local (one
// node); see docs/policy.md for a cluster on Redis or PostgreSQL.
package main

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/ratesync/ratelimit"
	"github.com/ratesync/ratelimit/httplimit"
	"github.com/ratesync/ratelimit/policy"
)

// starter is the policy written when the file does not exist.
const starter = `# Edit me while the service runs: it follows this file within a second.
default:                      # requests without a tier
  limits: [{window: 1m, max: 10}]
rules:
  - id: free
    match: {tier: free}
    limits: [{window: 1m, max: 5}]
  - id: pro
    match: {tier: pro}
    limits: [{window: 1m, max: 20}]
  - id: orders
    match: {route: "POST /orders"}
    limits: [{window: 1m, max: 2}]
  - id: search-shadow         # trying a limit out: counted and logged, never enforced
    match: {route: "GET /search"}
    shadow: true
    limits: [{window: 1m, max: 3}]
overrides:
  sk_vip: {limits: [{window: 1m, max: 50}]}
allow: ["sk_internal_*"]
deny:
  keys: ["sk_revoked_*"]
  status: 403
escalation:                   # clients that keep sending after a 429
  strike_window: 1m
  max_cooldown: 2m
  deny_after: 10
  deny_for: 5m
`

func main() {
	addr := flag.String("addr", "localhost:8080", "listen address")
	path := flag.String("policy", "policy.yaml", "policy file (written with a starter policy if missing)")
	token := flag.String("admin-token", "secret", "bearer token of the operator API at /admin/policy/")
	flag.Parse()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if err := run(*addr, *path, *token, log); err != nil {
		log.Error("exit", "error", err)
		os.Exit(1)
	}
}

func run(addr, path, token string, log *slog.Logger) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		if err := os.WriteFile(path, []byte(starter), 0o644); err != nil {
			return err
		}
	}
	svc, err := newService(ctx, path, token, nil, log)
	if err != nil {
		return err
	}
	defer svc.Close()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	url := "http://" + ln.Addr().String()
	log.Info("listening", "url", url, "policy", path)
	fmt.Fprintf(os.Stderr, tryIt, url, path, token)
	srv := &http.Server{Handler: svc, ReadHeaderTimeout: 5 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return srv.Shutdown(sctx)
}

const tryIt = `
Try it (the key is X-API-Key, the tier X-Tier):

  hit() { for i in $(seq 1 $1); do curl -s -o /dev/null -w '%%{http_code} ' -H "X-API-Key: $2" -H "X-Tier: $3" %[1]s/hello; done; echo; }
  hit 7 alice free          # 5 x 200, then 429: the free tier
  hit 12 bob ""             # the default: 10 per minute
  hit 3 sk_revoked_1 pro    # 403: the deny list; never reaches the handler
  hit 30 sk_internal_ci ""  # always 200: the allow list spends nothing
  hit 12 sk_vip free        # the override (50) wins over the tier
  curl -si -H 'X-API-Key: alice' %[1]s/hello | grep Retry-After   # keep sending after 429s:
                            # the cooldown doubles (escalation), then a temporary 403

Change the policy while it serves, three ways:

  sed -i 's/max: 5}/max: 8}/' %[2]s                      # edit the file: free tier 5 -> 8
  go run ./cmd/ratelimit-policy publish -file %[2]s new.yaml    # validate, then replace it atomically
  curl -X PUT -H 'Authorization: Bearer %[3]s' --data-binary @new.yaml %[1]s/admin/policy/

and look:

  curl -H 'Authorization: Bearer %[3]s' %[1]s/admin/policy/             # the version in force
  curl -H 'Authorization: Bearer %[3]s' %[1]s/admin/policy/versions
  curl -X POST -H 'Authorization: Bearer %[3]s' %[1]s/admin/policy/rollback
  curl %[1]s/admin/stats                                           # version enforced, counters

A bad document (try max: 0) is refused; the last good version keeps serving.

`

// service is the example's HTTP handler and what it owns.
type service struct {
	http.Handler
	reg     *ratelimit.Registry
	watcher *policy.Watcher
	limiter *httplimit.PolicyLimiter
}

// newService builds the service on the policy file at path; clock may be nil.
func newService(ctx context.Context, path, token string, clock func() time.Time, log *slog.Logger) (*service, error) {
	reg := ratelimit.NewRegistry()
	ns, err := reg.New(ratelimit.Config{
		WindowSizes: []time.Duration{time.Second, time.Minute, time.Hour},
		SyncRate:    -1, // one node; use a Strategy (Redis, PostgreSQL) for a cluster
		Clock:       clock,
	})
	if err != nil {
		return nil, err
	}
	store := policy.NewFileStore(path)
	check := httplimit.CheckPolicy(ns)
	w, err := policy.NewWatcher(ctx, store, policy.WatchOptions{Check: check, PollInterval: time.Second, Logger: log})
	if err != nil {
		_ = reg.Close(ctx)
		return nil, err
	}
	lim, err := httplimit.NewWithPolicy(httplimit.PolicyOptions{
		Options: httplimit.Options{Namespace: ns, KeyFunc: httplimit.KeyByHeader("X-API-Key"), Logger: log, Clock: clock},
		Policy:  w,
		// For the demo the client says its tier; a real service takes it from
		// a claim its authentication verified.
		Tier: func(r *http.Request) string { return r.Header.Get("X-Tier") },
	})
	if err != nil {
		_ = w.Close()
		_ = reg.Close(ctx)
		return nil, err
	}
	app := http.NewServeMux()
	app.HandleFunc("GET /hello", func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "hello") })
	app.HandleFunc("GET /search", func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "results") })
	app.HandleFunc("POST /orders", func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "ordered") })

	mux := http.NewServeMux()
	mux.Handle("/", lim.Wrap(app))
	admin := policy.NewHandler(store, policy.HandlerOptions{Check: check, Logger: log})
	// The watcher shares the file store, which tells it of the API's changes
	// at once; edits by others are found by polling.
	mux.Handle("/admin/policy/", bearer(token, http.StripPrefix("/admin/policy", admin)))
	mux.HandleFunc("GET /admin/stats", func(rw http.ResponseWriter, r *http.Request) {
		rw.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(rw).Encode(map[string]any{"watcher": w.Stats(), "limiter": lim.Stats()})
	})
	return &service{Handler: mux, reg: reg, watcher: w, limiter: lim}, nil
}

// Close stops the watcher and the counters.
func (s *service) Close() {
	_ = s.watcher.Close()
	_ = s.reg.Close(context.Background())
}

// bearer lets through requests with the token: the operator API must sit
// behind authentication, this is the smallest one.
func bearer(token string, h http.Handler) http.Handler {
	want := []byte("Bearer " + token)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), want) != 1 {
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r)
	})
}
