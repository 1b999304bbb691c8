package grpclimit_test

import (
	"context"
	"net"
	"net/netip"
	"strconv"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"

	"github.com/ratesync/ratelimit"
	"github.com/ratesync/ratelimit/grpclimit"
	"github.com/ratesync/ratelimit/policy"
)

// nopStream stands for the server's transport stream, which receives the
// header metadata.
type nopStream struct{}

func (nopStream) Method() string               { return "/a.S/M" }
func (nopStream) SetHeader(metadata.MD) error  { return nil }
func (nopStream) SendHeader(metadata.MD) error { return nil }
func (nopStream) SetTrailer(metadata.MD) error { return nil }

// BenchmarkUnaryInterceptor measures what the interceptor adds to a call
// (key from the peer address, Allow in local mode, header metadata), without
// the network, over many clients: with New's limits, and with the same limit
// as a policy's route rule (resolution against the snapshot added).
func BenchmarkUnaryInterceptor(b *testing.B) {
	reg := ratelimit.NewRegistry()
	defer reg.Close(context.Background())
	ns, err := reg.New(ratelimit.Config{WindowSizes: []time.Duration{time.Minute}, SyncRate: -1})
	if err != nil {
		b.Fatal(err)
	}
	lim, err := grpclimit.New(grpclimit.Options{Namespace: ns, Limits: []ratelimit.Limit{{Window: time.Minute, Max: 1 << 40}}})
	if err != nil {
		b.Fatal(err)
	}
	snap, err := policy.Load([]byte(`
default: {limits: [{window: 1m, max: 10}]}
rules: [{id: m, match: {route: "POST /a.S/M"}, limits: [{window: 1m, max: 1099511627776}]}]
`), 1, policy.Options{})
	if err != nil {
		b.Fatal(err)
	}
	plim, err := grpclimit.NewWithPolicy(grpclimit.PolicyOptions{Options: grpclimit.Options{Namespace: ns}, Policy: policy.NewHolder(snap)})
	if err != nil {
		b.Fatal(err)
	}
	ctxs := make([]context.Context, 1024)
	for i := range ctxs {
		ap := netip.MustParseAddrPort("192.0.2." + strconv.Itoa(i%250+1) + ":" + strconv.Itoa(1000+i))
		ctx := peer.NewContext(context.Background(), &peer.Peer{Addr: net.TCPAddrFromAddrPort(ap)})
		ctxs[i] = grpc.NewContextWithServerTransportStream(ctx, nopStream{})
	}
	info := &grpc.UnaryServerInfo{FullMethod: "/a.S/M"}
	handler := func(context.Context, any) (any, error) { return nil, nil }
	for _, bc := range []struct {
		name string
		ic   grpc.UnaryServerInterceptor
	}{{"rules", lim.UnaryServerInterceptor()}, {"policy", plim.UnaryServerInterceptor()}} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				i := 0
				for pb.Next() {
					if _, err := bc.ic(ctxs[i%len(ctxs)], nil, info, handler); err != nil {
						b.Error(err)
						return
					}
					i++
				}
			})
		})
	}
}
