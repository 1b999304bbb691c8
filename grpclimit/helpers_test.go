package grpclimit_test

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/ratesync/ratelimit"
	"github.com/ratesync/ratelimit/grpclimit"
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

// newNS returns a namespace in mode ("local" or "sync") over a memory store,
// with windows of 1 s and 1 min, closed at cleanup; a goroutine leak check is
// registered first.
func newNS(t *testing.T, mode string, clk *clock) (*ratelimit.Namespace, *memory.Store) {
	t.Helper()
	t.Cleanup(func() { goleak.VerifyNone(t) })
	cfg := ratelimit.Config{WindowSizes: []time.Duration{time.Second, time.Minute}, Clock: clk.Now, SyncRate: -1}
	store := memory.New()
	if mode == "sync" {
		cfg.SyncRate, cfg.Strategy, cfg.RetryInterval = 0, store, time.Hour
	}
	reg := ratelimit.NewRegistry()
	ns, err := reg.New(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = reg.Close(context.Background()) })
	return ns, store
}

// interceptors is what a *grpclimit.Limiter and a *grpclimit.PolicyLimiter
// offer a server.
type interceptors interface {
	UnaryServerInterceptor() grpc.UnaryServerInterceptor
	StreamServerInterceptor() grpc.StreamServerInterceptor
}

// serve starts a gRPC server on loopback TCP with the health service behind
// lim's interceptors, and returns a client connection with the extra dial
// options. Both stop at cleanup.
func serve(t *testing.T, lim interceptors, dial ...grpc.DialOption) healthpb.HealthClient {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(lim.UnaryServerInterceptor()),
		grpc.ChainStreamInterceptor(lim.StreamServerInterceptor()))
	hs := health.NewServer()
	healthpb.RegisterHealthServer(srv, hs)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(ln)
	}()
	cc, err := grpc.NewClient(ln.Addr().String(), append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, dial...)...)
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = cc.Close()
		srv.Stop()
		<-done
	})
	return healthpb.NewHealthClient(cc)
}

func mustLimiter(t *testing.T, opts grpclimit.Options) *grpclimit.Limiter {
	t.Helper()
	l, err := grpclimit.New(opts)
	require.NoError(t, err)
	return l
}

// details returns the RetryInfo and QuotaFailure of a refusal.
func details(t *testing.T, err error) (*errdetails.RetryInfo, *errdetails.QuotaFailure) {
	t.Helper()
	st, ok := status.FromError(err)
	require.True(t, ok, "%v", err)
	require.Equal(t, codes.ResourceExhausted, st.Code(), "%v", err)
	var ri *errdetails.RetryInfo
	var qf *errdetails.QuotaFailure
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.RetryInfo:
			ri = d
		case *errdetails.QuotaFailure:
			qf = d
		}
	}
	require.NotNil(t, ri, "no RetryInfo")
	require.NotNil(t, qf, "no QuotaFailure")
	return ri, qf
}

func requireCode(t *testing.T, want codes.Code, err error) {
	t.Helper()
	require.Equal(t, want, status.Code(err), "%v", err)
}

var checkReq = &healthpb.HealthCheckRequest{}
