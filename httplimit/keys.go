package httplimit

import (
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
)

// KeyFunc returns the key a request is counted under: a client, a tenant, an
// API key. An error (or an empty key) means the request cannot be identified;
// the middleware answers it with Options.KeyErrorStatus, never 429.
type KeyFunc func(*http.Request) (string, error)

// ErrNoKey is returned (wrapped) by the key functions of this package when
// the request lacks what they read: the header, the API key, a parsable
// address.
var ErrNoKey = errors.New("httplimit: no key in request")

// IPOptions configure KeyByIP and ClientIP.
type IPOptions struct {
	// TrustedProxies are the networks of the proxies in front of the
	// service. Only when the connection's peer (RemoteAddr) is inside one of
	// them is Header believed; it is walked from right to left, past every
	// trusted hop, and the first untrusted address is the client. A client
	// cannot choose its key by sending the header itself: its own entries are
	// left of the address the trusted proxy appended. Default: none, so the
	// key is always the peer's address.
	TrustedProxies []netip.Prefix
	// Header is the forwarding header the trusted proxies maintain:
	// "X-Forwarded-For" (comma-separated addresses, the default) or
	// "Forwarded" (RFC 7239, its for= parameters). Any other name is read
	// like X-Forwarded-For. Name only the header your proxies append to: a
	// header they pass through untouched is the client's to forge. Its lines
	// are read from the last to the first and each from right to left, so
	// the elements the proxies appended (to the client's line or in a line
	// of their own) are parsed before anything the client wrote: a malformed
	// client part, such as an unterminated quote, cannot swallow them. A
	// Forwarded element that is not well formed ends the walk like an entry
	// that is not an address.
	Header string
	// IPv6Prefix groups IPv6 clients by network: a client usually holds a
	// whole /64, so limiting single addresses would let it rotate through
	// them. Between 1 and 128; default 64.
	IPv6Prefix int
	// IPv4Prefix groups IPv4 clients the same way. Between 1 and 32; default
	// 32 (one address).
	IPv4Prefix int
}

// maxHops bounds how many forwarding entries are examined, so a huge header
// costs no more than a small one.
const maxHops = 32

func (o IPOptions) normalize() (IPOptions, error) {
	if o.IPv6Prefix == 0 {
		o.IPv6Prefix = 64
	}
	if o.IPv4Prefix == 0 {
		o.IPv4Prefix = 32
	}
	if o.IPv6Prefix < 1 || o.IPv6Prefix > 128 {
		return o, fmt.Errorf("httplimit: IPOptions.IPv6Prefix %d is not in 1..128", o.IPv6Prefix)
	}
	if o.IPv4Prefix < 1 || o.IPv4Prefix > 32 {
		return o, fmt.Errorf("httplimit: IPOptions.IPv4Prefix %d is not in 1..32", o.IPv4Prefix)
	}
	if o.Header == "" {
		o.Header = "X-Forwarded-For"
	}
	o.Header = http.CanonicalHeaderKey(o.Header)
	for _, p := range o.TrustedProxies {
		if !p.IsValid() {
			return o, fmt.Errorf("httplimit: IPOptions.TrustedProxies: invalid prefix %v", p)
		}
	}
	o.TrustedProxies = append([]netip.Prefix(nil), o.TrustedProxies...)
	for i, p := range o.TrustedProxies {
		// Addresses are compared unmapped: ::ffff:10.0.0.0/104 is 10.0.0.0/8.
		if p.Addr().Is4In6() && p.Bits() >= 96 {
			p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
		}
		o.TrustedProxies[i] = p.Masked()
	}
	return o, nil
}

func (o *IPOptions) trusted(a netip.Addr) bool {
	for _, p := range o.TrustedProxies {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// ClientIP returns the client's address: the peer's (RemoteAddr), or, when
// the peer is a trusted proxy, the first untrusted address of the forwarding
// header read from right to left. An entry that is not an address ("unknown",
// an obfuscated identifier, garbage, a malformed Forwarded element) ends the
// walk: the hop that reported it is the client, so the key is always an
// address a trusted proxy vouched for. It returns an error matching ErrNoKey when RemoteAddr is not
// an address, or an error naming the bad option. It never panics.
func ClientIP(r *http.Request, opts IPOptions) (netip.Addr, error) {
	o, err := opts.normalize()
	if err != nil {
		return netip.Addr{}, err
	}
	return o.clientIP(r)
}

func (o *IPOptions) clientIP(r *http.Request) (netip.Addr, error) {
	peer, ok := parseAddr(r.RemoteAddr)
	if !ok {
		return netip.Addr{}, fmt.Errorf("%w: RemoteAddr %.64q is not an IP address", ErrNoKey, r.RemoteAddr)
	}
	if len(o.TrustedProxies) == 0 || !o.trusted(peer) {
		return peer, nil
	}
	w := hopWalk{o: o, client: peer}
	forwarded := o.Header == "Forwarded"
	lines := r.Header[o.Header]
	// Lines are walked from the last (the nearest proxy's) to the first, each
	// from right to left.
	for i := len(lines) - 1; i >= 0; i-- {
		if lines[i] == "" {
			continue
		}
		if forwarded {
			if !forwardedHops(lines[i], &w) {
				break
			}
		} else if !xffHops(lines[i], &w) {
			break
		}
	}
	return w.client, nil
}

// parseAddr parses an address as it appears in RemoteAddr and forwarding
// headers: "1.2.3.4", "1.2.3.4:80", "::1", "[::1]", "[::1]:80". The result
// is unmapped (::ffff:1.2.3.4 is 1.2.3.4) and zoneless.
func parseAddr(s string) (netip.Addr, bool) {
	if s == "" {
		return netip.Addr{}, false
	}
	// Try the likely form first: a failed parse allocates its error.
	if s[0] == '[' || strings.Count(s, ":") == 1 {
		if ap, err := netip.ParseAddrPort(s); err == nil {
			return ap.Addr().Unmap().WithZone(""), true
		}
		if len(s) > 2 && s[0] == '[' && s[len(s)-1] == ']' {
			s = s[1 : len(s)-1]
		}
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Addr{}, false
	}
	return a.Unmap().WithZone(""), true
}

// KeyByIP returns a KeyFunc keyed on the client's address (see ClientIP),
// grouped by network: IPv4 by IPv4Prefix (default /32), IPv6 by IPv6Prefix
// (default /64). Keys look like "ip:192.0.2.1" and "ip:2001:db8:1:2::/64".
// It panics if opts is invalid (a prefix length out of range, an invalid
// trusted prefix), as a bad pattern panics in http.ServeMux.
func KeyByIP(opts IPOptions) KeyFunc {
	o, err := opts.normalize()
	if err != nil {
		panic(err)
	}
	return func(r *http.Request) (string, error) {
		a, err := o.clientIP(r)
		if err != nil {
			return "", err
		}
		var buf [64]byte
		b := append(buf[:0], "ip:"...)
		bits := o.IPv4Prefix
		if a.Is6() {
			bits = o.IPv6Prefix
		}
		if bits == a.BitLen() {
			b = a.AppendTo(b)
		} else {
			p, _ := a.Prefix(bits) // bits is in range for a's family
			b = p.AppendTo(b)
		}
		return string(b), nil
	}
}

// KeyByHeader returns a KeyFunc keyed on a request header's value (the first
// line of it), for example a tenant ID set by an authenticating proxy.
// Values longer than the namespace's MaxKeyLength are hashed by the
// namespace. A missing or empty header is an error matching ErrNoKey.
func KeyByHeader(name string) KeyFunc {
	name = http.CanonicalHeaderKey(name)
	return func(r *http.Request) (string, error) {
		if v := r.Header[name]; len(v) > 0 && v[0] != "" {
			return v[0], nil
		}
		return "", fmt.Errorf("%w: no %s header", ErrNoKey, name)
	}
}

// KeyByAPIKey returns a KeyFunc keyed on an API key taken from a header or,
// when the header is absent, a query parameter; either name may be "" to skip
// that source. From an Authorization header, the credentials of a "Bearer"
// scheme are the key, and a scheme without credentials is no key. A header
// value of only whitespace is no key. Keys look like "key:abc123". No key is
// an error matching ErrNoKey.
//
// The key is used as the client's identity only: it is not checked. Put the
// middleware after authentication if unauthenticated keys must not be
// counted, or a client can spend another's quota by sending its key.
func KeyByAPIKey(header, query string) KeyFunc {
	header = http.CanonicalHeaderKey(header)
	return func(r *http.Request) (string, error) {
		if header != "" {
			if v := r.Header[header]; len(v) > 0 {
				if k := headerKey(header, v[0]); k != "" {
					return "key:" + k, nil
				}
			}
		}
		if query != "" && r.URL != nil {
			if k, ok := queryValue(r.URL.RawQuery, query); ok && k != "" {
				return "key:" + k, nil
			}
		}
		return "", fmt.Errorf("%w: no API key (header %q, query parameter %q)", ErrNoKey, header, query)
	}
}

// headerKey returns the API key a header value holds, or "" for none. An
// Authorization value is "scheme credentials": a scheme without credentials
// ("Bearer", or "Bearer " whose trailing space the server trimmed) is no key,
// never the key "Bearer" shared by every client that sends it; the key of a
// Bearer scheme is its token, that of another scheme the scheme and its
// credentials.
func headerKey(header, v string) string {
	v = strings.Trim(v, " \t")
	if header != "Authorization" {
		return v
	}
	i := strings.IndexAny(v, " \t")
	if i < 0 {
		return ""
	}
	scheme, cred := v[:i], strings.TrimLeft(v[i:], " \t")
	if strings.EqualFold(scheme, "Bearer") {
		return cred
	}
	return scheme + " " + cred
}

// queryValue returns the first value of name in a raw query, unescaped,
// without parsing the whole query into a map.
func queryValue(raw, name string) (string, bool) {
	for raw != "" {
		var pair string
		pair, raw, _ = strings.Cut(raw, "&")
		k, v, _ := strings.Cut(pair, "=")
		if k != name {
			if !strings.ContainsAny(k, "%+") {
				continue
			}
			if uk, err := url.QueryUnescape(k); err != nil || uk != name {
				continue
			}
		}
		if !strings.ContainsAny(v, "%+") {
			return v, true
		}
		uv, err := url.QueryUnescape(v)
		if err != nil {
			return "", false
		}
		return uv, true
	}
	return "", false
}

// KeyByRoute returns a KeyFunc keyed on the route: the method and the
// http.ServeMux pattern that matched ("GET /items/{id}"). The pattern is
// r.Pattern, set when the middleware wraps a handler registered on a
// ServeMux, or else the pattern of the Rule the middleware matched; without
// either it is the request's path. Keyed on the route alone, all clients share
// one budget per route; compose it with a client key for per-client budgets
// per route.
func KeyByRoute() KeyFunc {
	return func(r *http.Request) (string, error) {
		p := r.Pattern
		if p == "" && r.URL != nil {
			p = r.URL.Path
		}
		if p == "" {
			return "", fmt.Errorf("%w: no route", ErrNoKey)
		}
		if i := strings.IndexAny(p, " \t"); i >= 0 && i < strings.IndexByte(p, '/') {
			return "route:" + p, nil // the pattern names its method
		}
		return "route:" + r.Method + " " + p, nil
	}
}

// Compose returns a KeyFunc whose key joins the keys of fns, so a request is
// counted per combination (for example per API key and route). Each part is
// length-prefixed, so no two different combinations give one key. The first
// error is returned.
func Compose(fns ...KeyFunc) KeyFunc {
	fns = append([]KeyFunc(nil), fns...)
	return func(r *http.Request) (string, error) {
		var buf [128]byte
		b := buf[:0]
		for i, fn := range fns {
			k, err := fn(r)
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
