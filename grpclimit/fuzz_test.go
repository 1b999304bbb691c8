package grpclimit

import (
	"context"
	"net"
	"net/netip"
	"testing"

	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
)

// FuzzKeys: no method name, peer address or metadata makes the key functions
// or the rule matcher panic, and a key is never empty without an error.
func FuzzKeys(f *testing.F) {
	f.Add("/a.S/M", "10.0.0.1:5", "203.0.113.9, 10.0.0.2", "Bearer x")
	f.Add("", "[::1]:0", `for="[2001:db8::1]:80";proto=https, for=unknown`, "")
	f.Add("/*/", "1.2.3.4:1", ",,,", "bearer")
	trusted := IPOptions{TrustedProxies: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("::/0")}}
	byPeer, _ := KeyByPeer(trusted)
	fwd := trusted
	fwd.Header = "Forwarded"
	byFwd, _ := KeyByPeer(fwd)
	fns := []KeyFunc{byPeer, byFwd, KeyByAPIKey(""), KeyByMetadata("x-tenant"), KeyByMethod(),
		Compose(byPeer, KeyByMethod())}
	f.Fuzz(func(t *testing.T, method, addr, xff, auth string) {
		_, _, _ = splitMethod(method)
		ctx := metadata.NewIncomingContext(context.Background(), metadata.MD{
			"x-forwarded-for": {xff}, "forwarded": {xff}, "authorization": {auth}, "x-tenant": {auth}})
		if ap, err := netip.ParseAddrPort(addr); err == nil {
			ctx = peer.NewContext(ctx, &peer.Peer{Addr: net.TCPAddrFromAddrPort(ap)})
		}
		for _, fn := range fns {
			if k, err := fn(ctx, method); err == nil && k == "" {
				t.Fatalf("empty key without an error for %q %q %q %q", method, addr, xff, auth)
			}
		}
	})
}
