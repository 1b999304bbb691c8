package httplimit_test

import (
	"testing"

	"github.com/ratesync/ratelimit/httplimit"
)

// BenchmarkClientIP measures the forwarding-header walk for a request that
// crossed two trusted proxies.
func BenchmarkClientIP(b *testing.B) {
	for _, tc := range []struct{ name, header, value string }{
		{"XFF", "X-Forwarded-For", "198.51.100.1, 203.0.113.7, 10.3.3.3"},
		{"Forwarded", "Forwarded", `for=198.51.100.1, for="203.0.113.7:4711";proto=https, for=10.3.3.3;by=10.0.0.1`},
	} {
		b.Run(tc.name, func(b *testing.B) {
			kf := httplimit.KeyByIP(httplimit.IPOptions{TrustedProxies: proxies, Header: tc.header})
			r := req("10.0.0.1:1", tc.header, tc.value)
			b.ReportAllocs()
			for b.Loop() {
				if k, err := kf(r); err != nil || k != "ip:203.0.113.7" {
					b.Fatal(k, err)
				}
			}
		})
	}
}
