package grpclimit_test

import (
	"context"
	"fmt"
	"net"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/ratesync/ratelimit"
	"github.com/ratesync/ratelimit/grpclimit"
	"github.com/ratesync/ratelimit/policy"
)

// A server limited to 2 health checks per minute per client address; the
// third check is refused with the time to wait.
func Example() {
	start := time.UnixMilli(1_700_002_800_000) // a fixed clock keeps the output stable
	reg := ratelimit.NewRegistry()
	defer reg.Close(context.Background())
	ns, _ := reg.New(ratelimit.Config{WindowSizes: []time.Duration{time.Minute}, SyncRate: -1,
		Clock: func() time.Time { return start }})

	lim, err := grpclimit.New(grpclimit.Options{Namespace: ns,
		Limits: []ratelimit.Limit{{Window: time.Minute, Max: 2}}})
	if err != nil {
		fmt.Println(err)
		return
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(lim.UnaryServerInterceptor()),
		grpc.ChainStreamInterceptor(lim.StreamServerInterceptor()))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	go srv.Serve(ln)
	defer srv.Stop()

	cc, _ := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	defer cc.Close()
	c := healthpb.NewHealthClient(cc)
	for range 3 {
		_, err := c.Check(context.Background(), &healthpb.HealthCheckRequest{})
		if d, ok := grpclimit.RetryDelay(err); ok {
			fmt.Println(status.Code(err), "retry in", d)
			continue
		}
		fmt.Println(status.Code(err))
	}
	// Output:
	// OK
	// OK
	// ResourceExhausted retry in 1m30s
}

// Limits from a policy document: the route of a call is its full method,
// matched as an HTTP request "POST /pkg.Service/Method" would be, so
// "/grpc.health.v1.Health/" names the whole health service.
func ExampleNewWithPolicy() {
	start := time.UnixMilli(1_700_002_800_000)
	reg := ratelimit.NewRegistry()
	defer reg.Close(context.Background())
	ns, _ := reg.New(ratelimit.Config{WindowSizes: []time.Duration{time.Minute}, SyncRate: -1,
		Clock: func() time.Time { return start }})

	snap, err := policy.Load([]byte(`
default: {limits: [{window: 1m, max: 100}]}
rules:
  - {id: health, match: {route: "/grpc.health.v1.Health/"}, limits: [{window: 1m, max: 1}]}
allow: ["sk_internal_*"]
deny: {keys: ["sk_revoked"]}
`), 1, policy.Options{})
	if err != nil {
		fmt.Println(err)
		return
	}
	lim, err := grpclimit.NewWithPolicy(grpclimit.PolicyOptions{
		Options: grpclimit.Options{Namespace: ns, KeyFunc: grpclimit.KeyByMetadata("x-api-key")},
		Policy:  policy.NewHolder(snap), // or a *policy.Watcher following a store
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(lim.UnaryServerInterceptor()),
		grpc.ChainStreamInterceptor(lim.StreamServerInterceptor()))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	go srv.Serve(ln)
	defer srv.Stop()

	cc, _ := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	defer cc.Close()
	c := healthpb.NewHealthClient(cc)
	for _, key := range []string{"sk_alice", "sk_alice", "sk_internal_ci", "sk_internal_ci", "sk_revoked"} {
		ctx := metadata.AppendToOutgoingContext(context.Background(), "x-api-key", key)
		_, err := c.Check(ctx, &healthpb.HealthCheckRequest{})
		fmt.Println(key, status.Code(err))
	}
	// Output:
	// sk_alice OK
	// sk_alice ResourceExhausted
	// sk_internal_ci OK
	// sk_internal_ci OK
	// sk_revoked PermissionDenied
}
