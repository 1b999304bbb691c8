package grpclimit_test

import (
	"context"
	"net"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"

	"github.com/ratesync/ratelimit/grpclimit"
)

type pipeAddr struct{}

func (pipeAddr) Network() string { return "bufconn" }
func (pipeAddr) String() string  { return "bufconn" }

func call(addr net.Addr, kv ...string) context.Context {
	ctx := context.Background()
	if addr != nil {
		ctx = peer.NewContext(ctx, &peer.Peer{Addr: addr})
	}
	return metadata.NewIncomingContext(ctx, metadata.Pairs(kv...))
}

func tcp(s string) net.Addr { return net.TCPAddrFromAddrPort(netip.MustParseAddrPort(s)) }

func TestKeyByPeer(t *testing.T) {
	proxy := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}
	for _, tc := range []struct {
		name string
		opts grpclimit.IPOptions
		ctx  context.Context
		want string
	}{
		{"peer", grpclimit.IPOptions{}, call(tcp("192.0.2.1:5")), "ip:192.0.2.1"},
		{"untrusted peer's header ignored", grpclimit.IPOptions{TrustedProxies: proxy}, call(tcp("192.0.2.1:5"), "x-forwarded-for", "203.0.113.9"), "ip:192.0.2.1"},
		{"trusted proxy", grpclimit.IPOptions{TrustedProxies: proxy}, call(tcp("10.1.2.3:5"), "x-forwarded-for", "6.6.6.6, 203.0.113.9, 10.9.9.9"), "ip:203.0.113.9"},
		{"trusted proxy, several values", grpclimit.IPOptions{TrustedProxies: proxy}, call(tcp("10.1.2.3:5"), "x-forwarded-for", "6.6.6.6", "x-forwarded-for", "203.0.113.9"), "ip:203.0.113.9"},
		{"forwarded", grpclimit.IPOptions{TrustedProxies: proxy, Header: "Forwarded"}, call(tcp("10.1.2.3:5"), "forwarded", `for="[2001:db8:1:2::7]:80"`), "ip:2001:db8:1:2::/64"},
		{"ipv6 grouped", grpclimit.IPOptions{}, call(tcp("[2001:db8:1:2::7]:5")), "ip:2001:db8:1:2::/64"},
		{"ipv4 grouped", grpclimit.IPOptions{IPv4Prefix: 24}, call(tcp("192.0.2.77:5")), "ip:192.0.2.0/24"},
		{"mapped", grpclimit.IPOptions{}, call(tcp("[::ffff:192.0.2.1]:5")), "ip:192.0.2.1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			kf, err := grpclimit.KeyByPeer(tc.opts)
			require.NoError(t, err)
			k, err := kf(tc.ctx, "/a.S/M")
			require.NoError(t, err)
			require.Equal(t, tc.want, k)
		})
	}
	kf, err := grpclimit.KeyByPeer(grpclimit.IPOptions{})
	require.NoError(t, err)
	for _, ctx := range []context.Context{context.Background(), call(pipeAddr{})} {
		_, err = kf(ctx, "/a.S/M")
		require.ErrorIs(t, err, grpclimit.ErrNoKey)
		_, err = grpclimit.ClientIP(ctx, grpclimit.IPOptions{})
		require.ErrorIs(t, err, grpclimit.ErrNoKey)
	}
	ip, err := grpclimit.ClientIP(call(tcp("10.1.2.3:5"), "x-forwarded-for", "203.0.113.9"), grpclimit.IPOptions{TrustedProxies: proxy})
	require.NoError(t, err)
	require.Equal(t, "203.0.113.9", ip)
	_, err = grpclimit.ClientIP(call(tcp("10.1.2.3:5")), grpclimit.IPOptions{IPv6Prefix: 129})
	require.ErrorContains(t, err, "IPv6Prefix")
}

func TestMetadataKeys(t *testing.T) {
	ctx := call(tcp("192.0.2.1:5"), "authorization", "Bearer  tok123", "x-api-key", "k9", "x-tenant", "", "x-tenant", "acme")
	k, err := grpclimit.KeyByAPIKey("")(ctx, "/a.S/M")
	require.NoError(t, err)
	require.Equal(t, "key:tok123", k)
	k, err = grpclimit.KeyByAPIKey("X-Api-Key")(ctx, "/a.S/M")
	require.NoError(t, err)
	require.Equal(t, "key:k9", k)
	k, err = grpclimit.KeyByMetadata("X-Tenant")(ctx, "/a.S/M")
	require.NoError(t, err)
	require.Equal(t, "acme", k)
	k, err = grpclimit.KeyByMethod()(ctx, "/a.S/M")
	require.NoError(t, err)
	require.Equal(t, "method:/a.S/M", k)

	for _, kf := range []grpclimit.KeyFunc{grpclimit.KeyByAPIKey("x-missing"), grpclimit.KeyByMetadata("x-missing"), grpclimit.KeyByAPIKey("")} {
		_, err = kf(context.Background(), "")
		require.ErrorIs(t, err, grpclimit.ErrNoKey)
	}
	_, err = grpclimit.KeyByMethod()(ctx, "")
	require.ErrorIs(t, err, grpclimit.ErrNoKey)
	// "Bearer" with nothing after it is no key.
	_, err = grpclimit.KeyByAPIKey("")(call(nil, "authorization", "Bearer "), "/a.S/M")
	require.ErrorIs(t, err, grpclimit.ErrNoKey)

	// Compose: length-prefixed parts, so no two combinations collide.
	c := grpclimit.Compose(grpclimit.KeyByMetadata("a"), grpclimit.KeyByMetadata("b"))
	k1, err := c(call(nil, "a", "x|1:y", "b", "z"), "")
	require.NoError(t, err)
	k2, err := c(call(nil, "a", "x", "b", "y|1:z"), "")
	require.NoError(t, err)
	require.NotEqual(t, k1, k2)
	require.Equal(t, "5:x|1:y|1:z", k1)
	_, err = c(call(nil, "a", "x"), "")
	require.ErrorIs(t, err, grpclimit.ErrNoKey)
}
