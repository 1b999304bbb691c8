package httplimit_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit/httplimit"
)

// The trusted proxy (10.0.0.1, the peer) appends its element to whatever the
// client sent; the element it appends names the client it saw. However
// malformed the client's part, that element decides the key (issue 11, case
// 7).
func TestForwardedProxyElementDecides(t *testing.T) {
	fwd := httplimit.KeyByIP(httplimit.IPOptions{TrustedProxies: proxies, Header: "Forwarded"})
	xff := httplimit.KeyByIP(httplimit.IPOptions{TrustedProxies: proxies})
	const want = "ip:203.0.113.7"
	for _, client := range []string{
		`for=192.0.2.50;by="x`, // the unterminated quote used to swallow the proxy's element
		`for="192.0.2.50`,      // ... and this one made the key the proxy itself
		`for=192.0.2.50;host="a\`,
		`for="192.0.2.50\"`,
		`"`, `\`, `;`, `=`, `for=`, `for==1.2.3.4`, `for=1.2.3.4 for=5.6.7.8`,
		`for=192.0.2.50;for=192.0.2.51`,
		`for=192.0.2.50"`, `x"y, for=192.0.2.50`, `for="[2001:db8::1`,
		`, , ;;`, ``, strings.Repeat(`for="`, 1000),
	} {
		for _, proxy := range []string{
			`for=203.0.113.7`, `for="203.0.113.7"`, `for="203.0.113.7:4711";proto=https`,
			`proto=https;for=203.0.113.7;by=10.0.0.1;host="example.com"`,
			`for=203.0.113.7, for=10.3.3.3`, // two trusted proxies appended in turn
		} {
			k, err := fwd(req("10.0.0.1:1", "Forwarded", client+", "+proxy))
			require.NoError(t, err)
			require.Equal(t, want, k, "one line: %s, %s", client, proxy)
			k, err = fwd(req("10.0.0.1:1", "Forwarded", client, "Forwarded", proxy))
			require.NoError(t, err)
			require.Equal(t, want, k, "two lines: %s | %s", client, proxy)
		}
		k, err := xff(req("10.0.0.1:1", "X-Forwarded-For", client+", 203.0.113.7"))
		require.NoError(t, err)
		require.Equal(t, want, k, "XFF: %s", client)
		k, err = xff(req("10.0.0.1:1", "X-Forwarded-For", client, "X-Forwarded-For", "203.0.113.7, 10.3.3.3"))
		require.NoError(t, err)
		require.Equal(t, want, k, "XFF two lines: %s", client)
	}
}

// A malformed part right of the trusted hops ends the walk: the key is the
// last address a trusted proxy vouched for, never one the client wrote.
func TestForwardedMalformedStopsAtTrustedHop(t *testing.T) {
	fwd := httplimit.KeyByIP(httplimit.IPOptions{TrustedProxies: proxies, Header: "Forwarded"})
	for _, tc := range []struct{ hdr, want string }{
		// The client is itself inside the trusted network: its malformed part
		// is left of the hop its proxy reported, and that hop is the key.
		{`for="192.0.2.50, for=10.5.5.5`, "ip:10.5.5.5"},
		{`for=192.0.2.50;by="x, for=10.5.5.5, for=10.6.6.6`, "ip:10.5.5.5"},
		// Quoted commas and escaped quotes inside a well-formed element.
		{`for=192.0.2.9;host="a, for=6.6.6.6\", b", for=10.5.5.5`, "ip:192.0.2.9"},
		{`for="192.0.2.10";ext="\\", for=10.5.5.5`, "ip:192.0.2.10"},
		// Empty elements and empty pairs are allowed by RFC 7239's list rule.
		{`for=192.0.2.11;;proto=http, , for=10.5.5.5`, "ip:192.0.2.11"},
		// Duplicate for= in one element is ambiguous: the walk stops there.
		{`for=192.0.2.12;for=192.0.2.13, for=10.5.5.5`, "ip:10.5.5.5"},
		// Garbage after a quoted value.
		{`for="192.0.2.14"x, for=10.5.5.5`, "ip:10.5.5.5"},
		{`for="192.0.2.14" ;proto=http`, "ip:192.0.2.14"},
	} {
		k, err := fwd(req("10.0.0.1:1", "Forwarded", tc.hdr))
		require.NoError(t, err)
		require.Equal(t, tc.want, k, tc.hdr)
	}
}

// FuzzForwardedProxyDecides: whatever the client sends, the element its
// trusted proxy appends decides the key, in one line or in its own line,
// for Forwarded and X-Forwarded-For alike. The parser never panics.
func FuzzForwardedProxyDecides(f *testing.F) {
	for _, s := range []string{`for=192.0.2.50;by="x`, `for="192.0.2.50`, `"\"`, `\`, `for="\\`, `a;b=,"`, ``} {
		f.Add(s, uint8(0))
	}
	fwd := httplimit.KeyByIP(httplimit.IPOptions{TrustedProxies: proxies, Header: "Forwarded"})
	xff := httplimit.KeyByIP(httplimit.IPOptions{TrustedProxies: proxies})
	proxyForms := []string{
		`for=203.0.113.7`, `for="203.0.113.7"`, `for="203.0.113.7:80";proto=https`,
		`by=10.0.0.1;for=203.0.113.7`, `for=203.0.113.7, for="10.3.3.3"`,
	}
	f.Fuzz(func(t *testing.T, client string, form uint8) {
		proxy := proxyForms[int(form)%len(proxyForms)]
		for _, r := range []*http.Request{
			req("10.0.0.1:1", "Forwarded", client+", "+proxy),
			req("10.0.0.1:1", "Forwarded", client, "Forwarded", proxy),
		} {
			k, err := fwd(r)
			require.NoError(t, err)
			require.Equal(t, "ip:203.0.113.7", k)
		}
		k, err := xff(req("10.0.0.1:1", "X-Forwarded-For", client+", 203.0.113.7"))
		require.NoError(t, err)
		require.Equal(t, "ip:203.0.113.7", k)
		// The client's part alone: never a panic, always a valid address.
		a, err := httplimit.ClientIP(req("10.0.0.1:1", "Forwarded", client), httplimit.IPOptions{TrustedProxies: proxies, Header: "Forwarded"})
		require.NoError(t, err)
		require.True(t, a.IsValid())
	})
}

// TestAuthorizationWithoutCredentials: a scheme with no credentials is no key.
// Over real HTTP the server trims the trailing space of "Bearer ", so the
// key function sees "Bearer" alone; it used to become the key "Bearer",
// shared by every token-less client.
func TestAuthorizationWithoutCredentials(t *testing.T) {
	kf := httplimit.KeyByAPIKey("Authorization", "")
	for _, v := range []string{"Bearer", "Bearer ", "Bearer \t ", "bearer", "Basic", "Basic  ", " ", "\t", "Digest\t"} {
		_, err := kf(req("1.2.3.4:1", "Authorization", v))
		require.ErrorIs(t, err, httplimit.ErrNoKey, "%q", v)
	}
	for v, want := range map[string]string{"Bearer tok": "key:tok", "Bearer\ttok ": "key:tok", " Bearer tok": "key:tok", "Basic dXNlcjpwYXNz": "key:Basic dXNlcjpwYXNz", "Token  a b": "key:Token a b"} {
		k, err := kf(req("1.2.3.4:1", "Authorization", v))
		require.NoError(t, err, "%q", v)
		require.Equal(t, want, k, "%q", v)
	}
	// A header without credentials falls back to the query parameter, as a
	// missing header does.
	k, err := httplimit.KeyByAPIKey("Authorization", "api_key")(httptest.NewRequest("GET", "/?api_key=q", nil))
	require.NoError(t, err)
	require.Equal(t, "key:q", k)
	r := httptest.NewRequest("GET", "/?api_key=q", nil)
	r.Header.Set("Authorization", "Bearer")
	k, err = httplimit.KeyByAPIKey("Authorization", "api_key")(r)
	require.NoError(t, err)
	require.Equal(t, "key:q", k)
	// Other headers: a value of only whitespace is no key.
	_, err = httplimit.KeyByAPIKey("X-API-Key", "")(req("1.2.3.4:1", "X-Api-Key", " \t"))
	require.ErrorIs(t, err, httplimit.ErrNoKey)
}

// TestAuthorizationBearerOverHTTP sends "Authorization: Bearer " on the wire
// to a real server: the middleware answers 400, never counts the request.
func TestAuthorizationBearerOverHTTP(t *testing.T) {
	var keys []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		k, err := httplimit.KeyByAPIKey("Authorization", "")(r)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		keys = append(keys, k)
	}))
	defer srv.Close()
	for _, line := range []string{"Authorization: Bearer \r\n", "Authorization: Bearer\t\t\r\n", "Authorization:    Bearer\r\n"} {
		c, err := net.Dial("tcp", srv.Listener.Addr().String())
		require.NoError(t, err)
		_, err = fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: x\r\n%sConnection: close\r\n\r\n", line)
		require.NoError(t, err)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		_ = c.Close()
		require.Equal(t, http.StatusBadRequest, resp.StatusCode, "%q", line)
	}
	require.Empty(t, keys)
}
