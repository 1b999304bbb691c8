// Command otel is an HTTP service behind the httplimit middleware whose
// rate-limit figures go out through OpenTelemetry: printed to stdout every few
// seconds, or served for Prometheus to scrape. It counts on the in-process
// memory store: no server needed.
//
//	go run .                       # metrics printed to stdout every 10 s
//	go run . -export prometheus    # metrics at /metrics, in Prometheus's text format
//
// It is a module of its own, so that the OpenTelemetry SDK and exporters stay
// out of the library's go.mod.
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

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/exporters/stdout/stdoutmetric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/ratesync/ratelimit"
	"github.com/ratesync/ratelimit/httplimit"
	"github.com/ratesync/ratelimit/ratelimitotel"
	"github.com/ratesync/ratelimit/strategy/memory"
)

func main() {
	addr := flag.String("addr", "localhost:8080", "listen address")
	export := flag.String("export", "stdout", "where the metrics go: stdout (printed every -interval) or prometheus (served at /metrics)")
	interval := flag.Duration("interval", 10*time.Second, "how often the stdout exporter prints")
	flag.Parse()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if err := run(*addr, *export, *interval, log); err != nil {
		log.Error("exit", "error", err)
		os.Exit(1)
	}
}

func run(addr, export string, interval time.Duration, log *slog.Logger) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	svc, err := newService(export, interval, os.Stdout)
	if err != nil {
		return err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := svc.close(cctx); err != nil {
			log.Warn("shutting down", "error", err)
		}
	}()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	url := "http://" + ln.Addr().String()
	log.Info("listening", "url", url, "export", export)
	fmt.Fprintf(os.Stderr, "\nTry it (GET /search allows 5 per minute):\n\n  for i in $(seq 1 7); do curl -s -o /dev/null -w '%%{http_code}\\n' %s/search; done\n\n", url)
	if export == "prometheus" {
		fmt.Fprintf(os.Stderr, "  curl -s %s/metrics | grep ^ratelimit_\n\n", url)
	}
	srv := &http.Server{Handler: svc.handler, ReadHeaderTimeout: 5 * time.Second}
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

// service is the HTTP handler and what it needs to shut down.
type service struct {
	handler  http.Handler
	provider *sdkmetric.MeterProvider
	registry *ratelimit.Registry
}

// newService builds the middleware, a namespace observed by ratelimitotel,
// and a meter provider exporting to out every interval (export "stdout") or
// serving Prometheus's text format at /metrics (export "prometheus").
func newService(export string, interval time.Duration, out io.Writer) (*service, error) {
	root := http.NewServeMux()
	var reader sdkmetric.Reader
	switch export {
	case "stdout":
		exp, err := stdoutmetric.New(stdoutmetric.WithWriter(out), stdoutmetric.WithPrettyPrint())
		if err != nil {
			return nil, err
		}
		reader = sdkmetric.NewPeriodicReader(exp, sdkmetric.WithInterval(interval))
	case "prometheus":
		promReg := prometheus.NewRegistry()
		exp, err := otelprom.New(otelprom.WithRegisterer(promReg))
		if err != nil {
			return nil, err
		}
		reader = exp
		// Scrapes go around the middleware: they spend no client's quota.
		root.Handle("GET /metrics", promhttp.HandlerFor(promReg, promhttp.HandlerOpts{}))
	default:
		return nil, fmt.Errorf("-export %q: want stdout or prometheus", export)
	}
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	obs, err := ratelimitotel.New(ratelimitotel.Options{MeterProvider: provider})
	if err != nil {
		_ = provider.Shutdown(context.Background())
		return nil, err
	}
	reg := ratelimit.NewRegistry()
	ns, err := reg.New(ratelimit.Config{
		Namespace:   "example-otel",
		WindowSizes: []time.Duration{time.Second, time.Minute},
		SyncRate:    100 * time.Millisecond,
		Strategy:    memory.New(),
		Observer:    obs, // decisions, latency and Retry-After histograms, sync cycles, store calls
	})
	if err != nil {
		_ = provider.Shutdown(context.Background())
		return nil, err
	}
	obs.Register(ns) // the gauges: pending hits, tracked keys, last sync age
	mw, err := httplimit.New(httplimit.Options{
		Namespace: ns,
		Limits:    []ratelimit.Limit{{Window: time.Second, Max: 3}, {Window: time.Minute, Max: 20}},
		KeyFunc:   httplimit.KeyByIP(httplimit.IPOptions{}),
		Rules: []httplimit.Rule{
			{Pattern: "GET /search", Limits: []ratelimit.Limit{{Window: time.Minute, Max: 5, Name: "search"}}},
		},
	})
	if err != nil {
		_ = reg.Close(context.Background())
		_ = provider.Shutdown(context.Background())
		return nil, err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /hello", func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "hello\n")
	})
	mux.HandleFunc("GET /search", func(w http.ResponseWriter, r *http.Request) {
		_, _ = fmt.Fprintf(w, "results for %q\n", r.URL.Query().Get("q"))
	})
	root.Handle("/", mw(mux))
	return &service{handler: root, provider: provider, registry: reg}, nil
}

// close flushes the counters, then the last metrics.
func (s *service) close(ctx context.Context) error {
	return errors.Join(s.registry.Close(ctx), s.provider.Shutdown(ctx))
}
