// Command grpc is a gRPC server behind grpclimit's interceptors and a client
// that reaches the server's limit and waits as told.
//
//	go run ./examples/grpc                        # server and client in one process
//	go run ./examples/grpc -mode server -addr localhost:50051
//	go run ./examples/grpc -mode client -addr localhost:50051
//
// The server limits health checks to -max per second per client address
// (the health service ships with gRPC, so no protoc step is needed). The
// client sends -calls checks as fast as it can; when refused, its interceptor
// reads the RetryInfo delay from the ResourceExhausted status, waits exactly
// that long and tries again, so every call succeeds.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"

	"github.com/ratesync/ratelimit"
	"github.com/ratesync/ratelimit/grpclimit"
)

func main() {
	mode := flag.String("mode", "both", "server, client, or both (in one process)")
	addr := flag.String("addr", "127.0.0.1:0", "server address (listen, or dial with -mode client)")
	maxPerSecond := flag.Int64("max", 5, "checks admitted per second per client")
	calls := flag.Int("calls", 12, "checks the client sends")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Stdout, *mode, *addr, *maxPerSecond, *calls); err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, out io.Writer, mode, addr string, maxPerSecond int64, calls int) error {
	switch mode {
	case "server":
		srv, err := startServer(addr, maxPerSecond, nil)
		if err != nil {
			return err
		}
		defer srv.stop()
		fmt.Fprintf(out, "serving on %s: at most %d checks per second per client\n", srv.addr, maxPerSecond)
		<-ctx.Done()
		return nil
	case "client":
		return runClient(ctx, out, addr, calls, grpclimit.ClientOptions{})
	case "both":
		srv, err := startServer(addr, maxPerSecond, nil)
		if err != nil {
			return err
		}
		defer srv.stop()
		fmt.Fprintf(out, "serving on %s: at most %d checks per second per client\n", srv.addr, maxPerSecond)
		return runClient(ctx, out, srv.addr, calls, grpclimit.ClientOptions{})
	}
	return fmt.Errorf("unknown -mode %q", mode)
}

type server struct {
	addr string
	stop func()
}

// startServer serves the health service on addr, limited to maxPerSecond
// checks per second per client, counted in a local namespace (a real
// deployment would give the namespace a shared store). clock is nil for the
// system clock.
func startServer(addr string, maxPerSecond int64, clock func() time.Time) (*server, error) {
	reg := ratelimit.NewRegistry()
	ns, err := reg.New(ratelimit.Config{WindowSizes: []time.Duration{time.Second}, SyncRate: -1, Clock: clock})
	if err != nil {
		return nil, err
	}
	lim, err := grpclimit.New(grpclimit.Options{Namespace: ns,
		Limits: []ratelimit.Limit{{Window: time.Second, Max: maxPerSecond}}})
	if err != nil {
		return nil, errors.Join(err, reg.Close(context.Background()))
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, errors.Join(err, reg.Close(context.Background()))
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(lim.UnaryServerInterceptor()),
		grpc.ChainStreamInterceptor(lim.StreamServerInterceptor()))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(ln)
	}()
	return &server{addr: ln.Addr().String(), stop: func() {
		srv.GracefulStop()
		<-done
		_ = reg.Close(context.Background())
	}}, nil
}

// runClient sends calls health checks; opts.Wait, when set, replaces the
// real wait (tests move a fake clock).
func runClient(ctx context.Context, out io.Writer, addr string, calls int, opts grpclimit.ClientOptions) error {
	wait := opts.Wait
	if wait == nil {
		wait = func(ctx context.Context, d time.Duration) error {
			t := time.NewTimer(d)
			defer t.Stop()
			select {
			case <-t.C:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
	waits := 0
	opts.Wait = func(ctx context.Context, d time.Duration) error {
		waits++
		fmt.Fprintf(out, "  refused: the server says retry in %v; waiting\n", d)
		return wait(ctx, d)
	}
	opts.MaxRetries = 10
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithUnaryInterceptor(grpclimit.UnaryClientInterceptor(opts)))
	if err != nil {
		return err
	}
	defer cc.Close()
	c := healthpb.NewHealthClient(cc)
	for i := range calls {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		var hdr metadata.MD
		resp, err := c.Check(cctx, &healthpb.HealthCheckRequest{}, grpc.Header(&hdr))
		cancel()
		if err != nil {
			return fmt.Errorf("call %d: %w", i+1, err)
		}
		fmt.Fprintf(out, "call %2d: %v (ratelimit: %s)\n", i+1, resp.GetStatus(), first(hdr.Get(grpclimit.MDRateLimit)))
	}
	fmt.Fprintf(out, "%d calls served, %d waits\n", calls, waits)
	return nil
}

func first(v []string) string {
	if len(v) == 0 {
		return ""
	}
	return v[0]
}
