package grpclimit

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"

	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"

	"github.com/ratesync/ratelimit/httplimit"
)

// KeyFunc returns the key an RPC is counted under: a client, a tenant, an API
// key. fullMethod is the RPC's "/package.Service/Method". An error (or an
// empty key) means the call cannot be identified; the interceptor answers it
// with Options.KeyErrorCode, never codes.ResourceExhausted.
type KeyFunc func(ctx context.Context, fullMethod string) (string, error)

// ErrNoKey is returned (wrapped) by the provided key functions when the call
// lacks what they read: the metadata, the API key, an IP peer address.
var ErrNoKey = errors.New("grpclimit: no key in call")

// IPOptions configure KeyByPeer and ClientIP. They are httplimit's, with the
// same meaning, so that a service keyed on client addresses counts a client
// the same way over HTTP and gRPC. Header names the metadata key the trusted
// proxies append to ("x-forwarded-for" by default; "forwarded" for RFC 7239);
// it is matched case-insensitively, as gRPC metadata keys are lower case.
type IPOptions = httplimit.IPOptions

// ClientIP returns the client's address: the peer's, or, when the peer is one
// of opts.TrustedProxies, the first untrusted address of the forwarding
// metadata read from right to left, exactly as httplimit.ClientIP reads the
// forwarding header of an HTTP request. It returns an error matching ErrNoKey
// when the peer is not an IP address (a Unix socket, an in-memory listener),
// or an error naming a bad option.
func ClientIP(ctx context.Context, opts IPOptions) (string, error) {
	r, err := asRequest(ctx, opts.Header)
	if err != nil {
		return "", err
	}
	a, err := httplimit.ClientIP(r, opts)
	if err != nil {
		return "", mapNoKey(err)
	}
	return a.String(), nil
}

// KeyByPeer returns a KeyFunc keyed on the client's address (see ClientIP),
// grouped by network as httplimit.KeyByIP groups it: keys look like
// "ip:192.0.2.1" and "ip:2001:db8:1:2::/64". It returns an error naming the
// option when opts is invalid.
func KeyByPeer(opts IPOptions) (KeyFunc, error) {
	// Validate once, here, rather than on every call.
	if _, err := httplimit.ClientIP(&http.Request{RemoteAddr: "192.0.2.1:1"}, opts); err != nil {
		return nil, fmt.Errorf("grpclimit: KeyByPeer: %w", err)
	}
	byIP := httplimit.KeyByIP(opts) // cannot panic: opts are valid
	header := opts.Header
	return func(ctx context.Context, _ string) (string, error) {
		r, err := asRequest(ctx, header)
		if err != nil {
			return "", err
		}
		k, err := byIP(r)
		return k, mapNoKey(err)
	}, nil
}

// asRequest presents the call's peer and forwarding metadata as the parts of
// an HTTP request that httplimit's address functions read, so both packages
// share one implementation of the trusted-proxy walk.
func asRequest(ctx context.Context, header string) (*http.Request, error) {
	p, ok := peer.FromContext(ctx)
	if !ok || p.Addr == nil {
		return nil, fmt.Errorf("%w: no peer", ErrNoKey)
	}
	remote := p.Addr.String()
	if _, isTCP := p.Addr.(*net.TCPAddr); !isTCP && p.Addr.Network() != "tcp" {
		return nil, fmt.Errorf("%w: peer %.64q (%s) is not an IP address", ErrNoKey, remote, p.Addr.Network())
	}
	r := &http.Request{RemoteAddr: remote}
	if header == "" {
		header = "x-forwarded-for"
	}
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		if v := md.Get(header); len(v) > 0 {
			r.Header = http.Header{http.CanonicalHeaderKey(header): v}
		}
	}
	return r, nil
}

// mapNoKey makes httplimit's ErrNoKey match grpclimit's too.
func mapNoKey(err error) error {
	if err != nil && errors.Is(err, httplimit.ErrNoKey) {
		return fmt.Errorf("%w: %w", ErrNoKey, err)
	}
	return err
}

// firstValue returns the first non-empty value of a metadata key.
func firstValue(ctx context.Context, name string) string {
	md, ok := metadata.FromIncomingContext(ctx)
	if !ok {
		return ""
	}
	for _, v := range md.Get(name) {
		if v != "" {
			return v
		}
	}
	return ""
}

// KeyByMetadata returns a KeyFunc keyed on a metadata value (the first
// non-empty one), for example a tenant ID set by an authenticating proxy.
// Keys are the value itself; values longer than the namespace's MaxKeyLength
// are hashed by the namespace. A missing or empty value is an error matching
// ErrNoKey.
func KeyByMetadata(name string) KeyFunc {
	name = strings.ToLower(name)
	return func(ctx context.Context, _ string) (string, error) {
		if v := firstValue(ctx, name); v != "" {
			return v, nil
		}
		return "", fmt.Errorf("%w: no %q metadata", ErrNoKey, name)
	}
}

// KeyByAPIKey returns a KeyFunc keyed on an API key sent as metadata under
// name ("authorization" when name is ""). From "authorization", the
// credentials of a "Bearer" scheme are the key. Keys look like "key:abc123",
// as httplimit.KeyByAPIKey's. No key is an error matching ErrNoKey.
//
// The key is used as the client's identity only: it is not checked. Put the
// interceptor after authentication if unauthenticated keys must not be
// counted.
func KeyByAPIKey(name string) KeyFunc {
	if name == "" {
		name = "authorization"
	}
	name = strings.ToLower(name)
	return func(ctx context.Context, _ string) (string, error) {
		k := firstValue(ctx, name)
		if name == "authorization" {
			if scheme, cred, ok := strings.Cut(k, " "); ok && strings.EqualFold(scheme, "Bearer") {
				k = strings.TrimSpace(cred)
			}
		}
		if k == "" {
			return "", fmt.Errorf("%w: no API key in %q metadata", ErrNoKey, name)
		}
		return "key:" + k, nil
	}
}

// KeyByMethod returns a KeyFunc keyed on the full method, "method:" followed
// by "/package.Service/Method". Alone, all clients share one budget per
// method; compose it with a client key for per-client budgets per method.
func KeyByMethod() KeyFunc {
	return func(_ context.Context, fullMethod string) (string, error) {
		if fullMethod == "" {
			return "", fmt.Errorf("%w: no method", ErrNoKey)
		}
		return "method:" + fullMethod, nil
	}
}

// Compose returns a KeyFunc whose key joins the keys of fns, so a call is
// counted per combination (for example per tenant and method). Each part is
// length-prefixed, as httplimit.Compose does, so no two different
// combinations give one key. The first error is returned.
func Compose(fns ...KeyFunc) KeyFunc {
	fns = append([]KeyFunc(nil), fns...)
	return func(ctx context.Context, fullMethod string) (string, error) {
		var buf [128]byte
		b := buf[:0]
		for i, fn := range fns {
			k, err := fn(ctx, fullMethod)
			if err != nil {
				return "", err
			}
			if i > 0 {
				b = append(b, '|')
			}
			b = strconv.AppendInt(b, int64(len(k)), 10)
			b = append(b, ':')
			b = append(b, k...)
		}
		return string(b), nil
	}
}
