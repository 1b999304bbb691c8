// Command http is an HTTP service behind the httplimit middleware: two routes
// with different limits, counted on the in-process memory store (no server
// needed), or on Redis or PostgreSQL with a flag.
//
//	go run ./examples/http
//	go run ./examples/http -store redis -redis-addr localhost:6379
//	go run ./examples/http -store postgres -postgres-dsn postgres://localhost/ratelimit
//
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
	goredis "github.com/redis/go-redis/v9"

	"github.com/ratesync/ratelimit"
	"github.com/ratesync/ratelimit/httplimit"
	"github.com/ratesync/ratelimit/strategy"
	"github.com/ratesync/ratelimit/strategy/memory"
	"github.com/ratesync/ratelimit/strategy/postgres"
	"github.com/ratesync/ratelimit/strategy/redis"
)

func main() {
	addr := flag.String("addr", "localhost:8080", "listen address")
	store := flag.String("store", "memory", "counter store: memory, redis or postgres")
	redisAddr := flag.String("redis-addr", "localhost:6379", "Redis address (with -store redis)")
	dsn := flag.String("postgres-dsn", "", "PostgreSQL connection string (with -store postgres)")
	syncRate := flag.Duration("sync", 100*time.Millisecond, "SyncRate: > 0 syncs in the background, 0 writes every hit through")
	flag.Parse()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if err := run(*addr, *store, *redisAddr, *dsn, *syncRate, log); err != nil {
		log.Error("exit", "error", err)
		os.Exit(1)
	}
}

func run(addr, storeName, redisAddr, dsn string, syncRate time.Duration, log *slog.Logger) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	st, closeStore, err := openStore(ctx, storeName, redisAddr, dsn)
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
	log.Info("listening", "url", url, "store", storeName)
	fmt.Fprintf(os.Stderr, `
Try it (GET /search allows 5 per minute; GET /hello 3 per second and 20 per minute):

  for i in $(seq 1 7); do curl -s -o /dev/null -w '%%{http_code}\n' %[1]s/search; done

  curl -i %[1]s/search     # the 429: Retry-After, RateLimit, RateLimit-Policy, problem+json body

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

// openStore returns the named strategy and a function that releases it.
func openStore(ctx context.Context, name, redisAddr, dsn string) (strategy.Strategy, func(), error) {
	switch name {
	case "memory":
		return memory.New(), func() {}, nil
	case "redis":
		client := goredis.NewUniversalClient(&goredis.UniversalOptions{Addrs: []string{redisAddr}})
		if err := client.Ping(ctx).Err(); err != nil {
			_ = client.Close()
			return nil, nil, fmt.Errorf("redis %s: %w", redisAddr, err)
		}
		s, err := redis.New(client, redis.Options{})
		if err != nil {
			_ = client.Close()
			return nil, nil, err
		}
		return s, func() { _ = client.Close() }, nil
	case "postgres":
		if dsn == "" {
			return nil, nil, errors.New("-store postgres needs -postgres-dsn")
		}
		pool, err := pgxpool.New(ctx, dsn)
		if err != nil {
			return nil, nil, err
		}
		s, err := postgres.New(ctx, pool, postgres.Options{})
		if err != nil {
			pool.Close()
			return nil, nil, err
		}
		return s, pool.Close, nil
	}
	return nil, nil, fmt.Errorf("unknown -store %q (memory, redis or postgres)", name)
}

// newHandler builds the service: its routes behind the rate limiter. clock
// may be nil (time.Now). It returns a function that closes the namespace.
func newHandler(st strategy.Strategy, syncRate time.Duration, clock func() time.Time, log *slog.Logger) (http.Handler, func(context.Context) error, error) {
	reg := ratelimit.NewRegistry()
	ns, err := reg.New(ratelimit.Config{
		Namespace:   "example-http",
		WindowSizes: []time.Duration{time.Second, time.Minute},
		SyncRate:    syncRate,
		Strategy:    st,
		Clock:       clock,
		Logger:      log,
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
	mux.HandleFunc("GET /search", func(w http.ResponseWriter, r *http.Request) {
		_, _ = fmt.Fprintf(w, "results for %q\n", r.URL.Query().Get("q"))
	})
	return mw(mux), reg.Close, nil
}
