package httplimit_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit/httplimit"
)

func req(remote string, hdr ...string) *http.Request {
	r := httptest.NewRequest("GET", "/", nil)
	r.RemoteAddr = remote
	for i := 0; i+1 < len(hdr); i += 2 {
		r.Header.Add(hdr[i], hdr[i+1])
	}
	return r
}

var proxies = []netip.Prefix{
	netip.MustParsePrefix("10.0.0.0/8"),
	netip.MustParsePrefix("2001:db8:ffff::/48"),
}

func TestKeyByIP(t *testing.T) {
	trusting := httplimit.IPOptions{TrustedProxies: proxies}
	fwd := httplimit.IPOptions{TrustedProxies: proxies, Header: "Forwarded"}
	for _, tc := range []struct {
		name   string
		opts   httplimit.IPOptions
		remote string
		hdr    []string
		want   string
	}{
		{"ipv4 with port", httplimit.IPOptions{}, "192.0.2.1:1234", nil, "ip:192.0.2.1"},
		{"ipv4 without port", httplimit.IPOptions{}, "192.0.2.1", nil, "ip:192.0.2.1"},
		{"ipv6 grouped by /64", httplimit.IPOptions{}, "[2001:db8:1:2:3:4:5:6]:443", nil, "ip:2001:db8:1:2::/64"},
		{"ipv6 same /64, other address", httplimit.IPOptions{}, "[2001:db8:1:2:ffff::1]:443", nil, "ip:2001:db8:1:2::/64"},
		{"ipv6 /56", httplimit.IPOptions{IPv6Prefix: 56}, "[2001:db8:1:2ff::1]:1", nil, "ip:2001:db8:1:200::/56"},
		{"ipv6 /128", httplimit.IPOptions{IPv6Prefix: 128}, "[2001:db8::1]:1", nil, "ip:2001:db8::1"},
		{"ipv6 bare", httplimit.IPOptions{}, "2001:db8::1", nil, "ip:2001:db8::/64"},
		{"ipv6 bracketed, no port", httplimit.IPOptions{}, "[2001:db8::1]", nil, "ip:2001:db8::/64"},
		{"ipv6 zone dropped", httplimit.IPOptions{IPv6Prefix: 128}, "[fe80::1%eth0]:1", nil, "ip:fe80::1"},
		{"ipv4-mapped is ipv4", httplimit.IPOptions{}, "[::ffff:192.0.2.7]:1", nil, "ip:192.0.2.7"},
		{"ipv4 /24", httplimit.IPOptions{IPv4Prefix: 24}, "192.0.2.77:1", nil, "ip:192.0.2.0/24"},

		{"XFF ignored from untrusted peer", trusting, "192.0.2.1:1", []string{"X-Forwarded-For", "198.51.100.1"}, "ip:192.0.2.1"},
		{"XFF ignored without trusted proxies", httplimit.IPOptions{}, "10.0.0.1:1", []string{"X-Forwarded-For", "198.51.100.1"}, "ip:10.0.0.1"},
		{"XFF from trusted proxy", trusting, "10.0.0.1:1", []string{"X-Forwarded-For", "198.51.100.1"}, "ip:198.51.100.1"},
		{"XFF skips trusted hops", trusting, "10.0.0.1:1", []string{"X-Forwarded-For", "198.51.100.1, 10.1.1.1,10.2.2.2"}, "ip:198.51.100.1"},
		{"XFF spoofed left part ignored", trusting, "10.0.0.1:1", []string{"X-Forwarded-For", "1.1.1.1, 198.51.100.1"}, "ip:198.51.100.1"},
		{"XFF spoof of a trusted hop", trusting, "10.0.0.1:1", []string{"X-Forwarded-For", "1.1.1.1, 10.9.9.9, 198.51.100.1"}, "ip:198.51.100.1"},
		{"XFF over several lines", trusting, "10.0.0.1:1", []string{"X-Forwarded-For", "1.1.1.1", "X-Forwarded-For", "198.51.100.1, 10.3.3.3"}, "ip:198.51.100.1"},
		{"XFF all trusted: leftmost", trusting, "10.0.0.1:1", []string{"X-Forwarded-For", "10.5.5.5, 10.6.6.6"}, "ip:10.5.5.5"},
		{"XFF with ports and brackets", trusting, "10.0.0.1:1", []string{"X-Forwarded-For", "[2001:db8:5::1]:99, 10.1.1.1:80"}, "ip:2001:db8:5::/64"},
		{"XFF garbage stops at the hop that sent it", trusting, "10.0.0.1:1", []string{"X-Forwarded-For", "198.51.100.1, garbage, 10.4.4.4"}, "ip:10.4.4.4"},
		{"XFF empty", trusting, "10.0.0.1:1", []string{"X-Forwarded-For", ""}, "ip:10.0.0.1"},
		{"XFF only commas", trusting, "10.0.0.1:1", []string{"X-Forwarded-For", ",,,"}, "ip:10.0.0.1"},
		{"XFF ipv6 proxy", trusting, "[2001:db8:ffff::9]:1", []string{"X-Forwarded-For", "203.0.113.5"}, "ip:203.0.113.5"},
		{"custom header", httplimit.IPOptions{TrustedProxies: proxies, Header: "x-real-ip"}, "10.0.0.1:1", []string{"X-Real-Ip", "203.0.113.9"}, "ip:203.0.113.9"},
		{"other header not read", trusting, "10.0.0.1:1", []string{"X-Real-Ip", "203.0.113.9"}, "ip:10.0.0.1"},

		{"Forwarded", fwd, "10.0.0.1:1", []string{"Forwarded", "for=198.51.100.1;proto=https"}, "ip:198.51.100.1"},
		{"Forwarded quoted ipv6 with port", fwd, "10.0.0.1:1", []string{"Forwarded", `for="[2001:db8:7::1]:4711"`}, "ip:2001:db8:7::/64"},
		{"Forwarded chain", fwd, "10.0.0.1:1", []string{"Forwarded", `for=1.1.1.1, for=198.51.100.2;by=10.0.0.2, For="10.7.7.7"`}, "ip:198.51.100.2"},
		{"Forwarded params in any order", fwd, "10.0.0.1:1", []string{"Forwarded", `proto=http;for=198.51.100.3;host="a,b"`}, "ip:198.51.100.3"},
		{"Forwarded quoted comma", fwd, "10.0.0.1:1", []string{"Forwarded", `for=198.51.100.4;host="x, for=6.6.6.6"`}, "ip:198.51.100.4"},
		{"Forwarded unknown", fwd, "10.0.0.1:1", []string{"Forwarded", `for=198.51.100.1, for=unknown`}, "ip:10.0.0.1"},
		{"Forwarded obfuscated", fwd, "10.0.0.1:1", []string{"Forwarded", `for=_hidden`}, "ip:10.0.0.1"},
		{"Forwarded without for", fwd, "10.0.0.1:1", []string{"Forwarded", `proto=https`}, "ip:10.0.0.1"},
		{"Forwarded malformed", fwd, "10.0.0.1:1", []string{"Forwarded", `for="unterminated`}, "ip:10.0.0.1"},
		{"Forwarded from untrusted", fwd, "192.0.2.1:1", []string{"Forwarded", `for=198.51.100.1`}, "ip:192.0.2.1"},
		{"Forwarded ignored when XFF configured", trusting, "10.0.0.1:1", []string{"Forwarded", `for=198.51.100.1`}, "ip:10.0.0.1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k, err := httplimit.KeyByIP(tc.opts)(req(tc.remote, tc.hdr...))
			require.NoError(t, err)
			require.Equal(t, tc.want, k)
		})
	}
}

func TestKeyByIPErrors(t *testing.T) {
	for _, remote := range []string{"", "not-an-address", "@", "[::1", "1.2.3.4:port", "example.com:80"} {
		_, err := httplimit.KeyByIP(httplimit.IPOptions{})(req(remote))
		require.ErrorIs(t, err, httplimit.ErrNoKey, remote)
	}
	for _, o := range []httplimit.IPOptions{
		{IPv6Prefix: 129}, {IPv6Prefix: -1}, {IPv4Prefix: 33}, {TrustedProxies: []netip.Prefix{{}}},
	} {
		require.Panics(t, func() { httplimit.KeyByIP(o) })
		_, err := httplimit.ClientIP(req("1.2.3.4:1"), o)
		require.Error(t, err)
	}
	// A mapped trusted prefix trusts the IPv4 peer.
	a, err := httplimit.ClientIP(req("10.1.2.3:1", "X-Forwarded-For", "192.0.2.55"),
		httplimit.IPOptions{TrustedProxies: []netip.Prefix{netip.MustParsePrefix("::ffff:10.0.0.0/104")}})
	require.NoError(t, err)
	require.Equal(t, netip.MustParseAddr("192.0.2.55"), a)
}

// TestKeyByIPHugeHeader: a header with many entries costs a bounded walk and
// still cannot be used to choose the key.
func TestKeyByIPHugeHeader(t *testing.T) {
	kf := httplimit.KeyByIP(httplimit.IPOptions{TrustedProxies: proxies})
	long := strings.Repeat("10.0.0.1, ", 100_000) + "198.51.100.1"
	k, err := kf(req("10.0.0.1:1", "X-Forwarded-For", long))
	require.NoError(t, err)
	require.Equal(t, "ip:198.51.100.1", k)
	// All trusted beyond the walk's bound: the last hop examined is the key,
	// one of the trusted proxies, never a client-chosen address.
	k, err = kf(req("10.0.0.1:1", "X-Forwarded-For", "6.6.6.6, "+strings.Repeat("10.0.0.2, ", 1000)+"10.0.0.3"))
	require.NoError(t, err)
	require.Equal(t, "ip:10.0.0.2", k)
	k, err = httplimit.KeyByIP(httplimit.IPOptions{TrustedProxies: proxies, Header: "Forwarded"})(req("10.0.0.1:1", "Forwarded", strings.Repeat(`for="10.0.0.1";by=x, `, 50_000)+"for=198.51.100.9"))
	require.NoError(t, err)
	require.Equal(t, "ip:198.51.100.9", k)
}

func FuzzClientIP(f *testing.F) {
	for _, s := range []string{"198.51.100.1, 10.0.0.1", `for="[2001:db8::1]:1";by=x, for=unknown`, `for="\`, `"`, ",;=", "[::1]:", "[", "for=\"a\\\""} {
		f.Add("10.0.0.1:1", s)
	}
	f.Fuzz(func(t *testing.T, remote, header string) {
		for _, h := range []string{"X-Forwarded-For", "Forwarded"} {
			r := req(remote, h, header)
			a, err := httplimit.ClientIP(r, httplimit.IPOptions{TrustedProxies: proxies, Header: h})
			if err != nil {
				require.ErrorIs(t, err, httplimit.ErrNoKey)
				continue
			}
			require.True(t, a.IsValid())
			k, err := httplimit.KeyByIP(httplimit.IPOptions{TrustedProxies: proxies, Header: h})(r)
			require.NoError(t, err)
			require.True(t, strings.HasPrefix(k, "ip:"))
		}
	})
}

func TestKeyByHeader(t *testing.T) {
	kf := httplimit.KeyByHeader("x-tenant")
	k, err := kf(req("1.2.3.4:1", "X-Tenant", "acme", "X-Tenant", "other"))
	require.NoError(t, err)
	require.Equal(t, "acme", k)
	_, err = kf(req("1.2.3.4:1"))
	require.ErrorIs(t, err, httplimit.ErrNoKey)
	_, err = kf(req("1.2.3.4:1", "X-Tenant", ""))
	require.ErrorIs(t, err, httplimit.ErrNoKey)
}

func TestKeyByAPIKey(t *testing.T) {
	kf := httplimit.KeyByAPIKey("X-API-Key", "api_key")
	for _, tc := range []struct {
		target string
		hdr    []string
		want   string
	}{
		{"/", []string{"X-Api-Key", "abc"}, "key:abc"},
		{"/?api_key=fromquery", []string{"X-Api-Key", "hdr"}, "key:hdr"},
		{"/?x=1&api_key=q1&api_key=q2", nil, "key:q1"},
		{"/?api%5Fkey=esc%20aped+x", nil, "key:esc aped x"},
		{"/?api_keyx=no&api_key=yes", nil, "key:yes"},
	} {
		r := httptest.NewRequest("GET", tc.target, nil)
		for i := 0; i+1 < len(tc.hdr); i += 2 {
			r.Header.Set(tc.hdr[i], tc.hdr[i+1])
		}
		k, err := kf(r)
		require.NoError(t, err, tc.target)
		require.Equal(t, tc.want, k, tc.target)
	}
	for _, target := range []string{"/", "/?api_key=", "/?api_key=%zz", "/?other=1"} {
		_, err := kf(httptest.NewRequest("GET", target, nil))
		require.ErrorIs(t, err, httplimit.ErrNoKey, target)
	}
	bearer := httplimit.KeyByAPIKey("Authorization", "")
	for hdr, want := range map[string]string{"Bearer tok123": "key:tok123", "bearer  tok": "key:tok", "Basic dXNlcjpwYXNz": "key:Basic dXNlcjpwYXNz"} {
		k, err := bearer(req("1.2.3.4:1", "Authorization", hdr))
		require.NoError(t, err)
		require.Equal(t, want, k)
	}
	_, err := bearer(req("1.2.3.4:1", "Authorization", "Bearer "))
	require.ErrorIs(t, err, httplimit.ErrNoKey)
}

func TestKeyByRoute(t *testing.T) {
	kf := httplimit.KeyByRoute()
	r := httptest.NewRequest("POST", "/items/7", nil)
	k, err := kf(r)
	require.NoError(t, err)
	require.Equal(t, "route:POST /items/7", k, "no pattern: the path")
	r.Pattern = "/items/{id}"
	k, _ = kf(r)
	require.Equal(t, "route:POST /items/{id}", k)
	r.Pattern = "POST example.com/items/{id}"
	k, _ = kf(r)
	require.Equal(t, "route:POST example.com/items/{id}", k)
}

func TestCompose(t *testing.T) {
	a := func(s string) httplimit.KeyFunc { return func(*http.Request) (string, error) { return s, nil } }
	r := req("1.2.3.4:1")
	k1, err := httplimit.Compose(a("a|b"), a("c"))(r)
	require.NoError(t, err)
	k2, err := httplimit.Compose(a("a"), a("b|c"))(r)
	require.NoError(t, err)
	require.NotEqual(t, k1, k2)
	require.Equal(t, "3:a|b|1:c", k1)
	k, err := httplimit.Compose(httplimit.KeyByIP(httplimit.IPOptions{}), httplimit.KeyByRoute())(r)
	require.NoError(t, err)
	require.Equal(t, "10:ip:1.2.3.4|11:route:GET /", k)
	boom := errors.New("boom")
	_, err = httplimit.Compose(a("x"), func(*http.Request) (string, error) { return "", boom })(r)
	require.ErrorIs(t, err, boom)
}
