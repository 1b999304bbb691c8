// Command http is an HTTP service behind the httplimit middleware: two routes
// with different limits, counted on the in-process memory store (no server
// needed), or on Redis or PostgreSQL with a flag.
//
//	go run ./examples/http
//	go run ./examples/http -store redis -redis-addr localhost:6379 -redis-db 3 -redis-prefix myapp
//	go run ./examples/http -store postgres -postgres-dsn postgres://localhost/ratelimit -postgres-schema myapp -postgres-table limits
//
// -h lists the flags.
// It prints a curl loop that reaches a 429 when it starts.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	goredis "github.com/redis/go-redis/v9"

	"github.com/ratesync/ratelimit"
	"github.com/ratesync/ratelimit/httplimit"
	"github.com/ratesync/ratelimit/metrics"
	"github.com/ratesync/ratelimit/strategy"
	"github.com/ratesync/ratelimit/strategy/memory"
	"github.com/ratesync/ratelimit/strategy/postgres"
	"github.com/ratesync/ratelimit/strategy/redis"
)

// storeFlags says which store to count in, and where in it.
type storeFlags struct {
	name string // memory, redis or postgres

	redisAddr   string
	redisDB     int
	redisPrefix string // redis.Options.KeyPrefix

	postgresDSN    string
	postgresSchema string // postgres.Options.Schema
	postgresTable  string // postgres.Options.Table
}

func main() {
	var sf storeFlags
	addr := flag.String("addr", "localhost:8080", "listen address")
	flag.StringVar(&sf.name, "store", "memory", "counter store: memory, redis or postgres")
	flag.StringVar(&sf.redisAddr, "redis-addr", "localhost:6379", "Redis address (with -store redis)")
	flag.IntVar(&sf.redisDB, "redis-db", 0, "Redis database number (with -store redis)")
	flag.StringVar(&sf.redisPrefix, "redis-prefix", redis.DefaultKeyPrefix, "prefix of every Redis key (with -store redis)")
	flag.StringVar(&sf.postgresDSN, "postgres-dsn", "", "PostgreSQL connection string (with -store postgres)")
	flag.StringVar(&sf.postgresSchema, "postgres-schema", "", "PostgreSQL schema of the tables, which must exist (with -store postgres; default: the search_path)")
	flag.StringVar(&sf.postgresTable, "postgres-table", "rl_counters", "PostgreSQL counters table, created if missing; its batch IDs go to TABLE_batches (with -store postgres)")
	syncRate := flag.Duration("sync", 100*time.Millisecond, "SyncRate: > 0 syncs in the background, 0 writes every hit through")
	flag.Parse()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if err := run(*addr, sf, *syncRate, log); err != nil {
		log.Error("exit", "error", err)
		os.Exit(1)
	}
}

func run(addr string, sf storeFlags, syncRate time.Duration, log *slog.Logger) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	st, closeStore, err := openStore(ctx, sf)
	if err != nil {
		return err
	}
	defer closeStore()
	h, closeNS, err := newHandler(st, syncRate, nil, log)
	if err != nil {
		return err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := closeNS(cctx); err != nil {
			log.Warn("flushing the counters", "error", err)
		}
	}()

	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	url := "http://" + ln.Addr().String()
	log.Info("listening", "url", url, "store", sf.name)
	fmt.Fprintf(os.Stderr, `
Try it (GET /search allows 5 per minute; GET /hello 3 per second and 20 per minute):

  for i in $(seq 1 7); do curl -s -o /dev/null -w '%%{http_code}\n' %[1]s/search; done

  curl -i %[1]s/search     # the 429: Retry-After, RateLimit, RateLimit-Policy, problem+json body

  curl -s %[1]s/metrics | grep ^ratelimit_    # Prometheus metrics (docs/metrics.md)
  curl -s %[1]s/debug/ratelimit/hotkeys       # the busiest keys of the last minute

`, url)
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		return err
	}
	if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// openStore returns the strategy sf names and a function that releases it.
func openStore(ctx context.Context, sf storeFlags) (strategy.Strategy, func(), error) {
	switch sf.name {
	case "memory":
		return memory.New(), func() {}, nil
	case "redis":
		client := goredis.NewUniversalClient(redisOptions(sf))
		if err := client.Ping(ctx).Err(); err != nil {
			_ = client.Close()
			return nil, nil, fmt.Errorf("redis %s: %w", sf.redisAddr, err)
		}
		s, err := redis.New(client, redis.Options{KeyPrefix: sf.redisPrefix})
		if err != nil {
			_ = client.Close()
			return nil, nil, err
		}
		return s, func() { _ = client.Close() }, nil
	case "postgres":
		if sf.postgresDSN == "" {
			return nil, nil, errors.New("-store postgres needs -postgres-dsn")
		}
		pool, err := pgxpool.New(ctx, sf.postgresDSN)
		if err != nil {
			return nil, nil, err
		}
		s, err := postgres.New(ctx, pool, postgres.Options{Schema: sf.postgresSchema, Table: sf.postgresTable})
		if err != nil {
			pool.Close()
			return nil, nil, err
		}
		return s, pool.Close, nil
	}
	return nil, nil, fmt.Errorf("unknown -store %q (memory, redis or postgres)", sf.name)
}

// redisOptions sets every timeout and retry option: the store stays exact
// with any MaxRetries, and these bound how long a sync waits for a slow or
// absent Redis.
func redisOptions(sf storeFlags) *goredis.UniversalOptions {
	return &goredis.UniversalOptions{
		Addrs:           []string{sf.redisAddr},
		DB:              sf.redisDB,
		MaxRetries:      3,
		MinRetryBackoff: 8 * time.Millisecond,
		MaxRetryBackoff: 512 * time.Millisecond,
		DialTimeout:     time.Second,
		ReadTimeout:     500 * time.Millisecond,
		WriteTimeout:    500 * time.Millisecond,
		PoolTimeout:     time.Second,
		// Required by redis.New: every call returns by its context's deadline.
		ContextTimeoutEnabled: true,
	}
}

// newHandler builds the service: its routes behind the rate limiter, and,
// outside it, the limiter's Prometheus metrics on /metrics and its hot-key
// report on /debug/ratelimit/hotkeys (in production, mount these where only
// operators reach them: hot keys may be personal data). clock may be nil
// (time.Now). It returns a function that closes the namespace.
func newHandler(st strategy.Strategy, syncRate time.Duration, clock func() time.Time, log *slog.Logger) (http.Handler, func(context.Context) error, error) {
	reg := ratelimit.NewRegistry()
	collector := metrics.NewCollector()
	ns, err := reg.New(ratelimit.Config{
		Namespace:   "example-http",
		WindowSizes: []time.Duration{time.Second, time.Minute},
		SyncRate:    syncRate,
		Strategy:    st,
		Clock:       clock,
		Logger:      log,
		Observer:    collector, // latency and Retry-After histograms, decisions by policy
		HotKeys:     ratelimit.HotKeysConfig{Capacity: 64, SampleRate: 1},
	})
	if err != nil {
		return nil, nil, err
	}
	mw, err := httplimit.New(httplimit.Options{
		Namespace: ns,
		// GET /hello and anything else: 3 per second and 20 per minute.
		Limits: []ratelimit.Limit{
			{Window: time.Second, Max: 3},
			{Window: time.Minute, Max: 20},
		},
		KeyFunc: httplimit.KeyByIP(httplimit.IPOptions{}),
		Rules: []httplimit.Rule{
			{Pattern: "GET /search", Limits: []ratelimit.Limit{{Window: time.Minute, Max: 5, Name: "search"}}, FailClosed: true},
			{Pattern: "GET /healthz"}, // no limits: a readiness probe never spends a client's quota
		},
		LegacyHeaders: true,
		Logger:        log,
	})
	if err != nil {
		_ = reg.Close(context.Background())
		return nil, nil, err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /hello", func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "hello\n")
	})
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("GET /search", func(w http.ResponseWriter, r *http.Request) {
		_, _ = fmt.Fprintf(w, "results for %q\n", r.URL.Query().Get("q"))
	})
	collector.Add(ns)
	promReg := prometheus.NewRegistry()
	if err := promReg.Register(collector); err != nil {
		_ = reg.Close(context.Background())
		return nil, nil, err
	}
	root := http.NewServeMux()
	root.Handle("GET /metrics", promhttp.HandlerFor(promReg, promhttp.HandlerOpts{}))
	root.Handle("GET /debug/ratelimit/hotkeys", collector.HotKeysHandler())
	root.Handle("/", mw(mux))
	return root, reg.Close, nil
}
