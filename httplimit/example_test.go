package httplimit_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"time"

	"github.com/ratesync/ratelimit"
	"github.com/ratesync/ratelimit/httplimit"
)

func Example() {
	// A fixed clock, so the output does not depend on the time it runs.
	now := time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)
	reg := ratelimit.NewRegistry()
	defer reg.Close(context.Background())
	ns, err := reg.New(ratelimit.Config{
		WindowSizes: []time.Duration{time.Minute},
		SyncRate:    -1, // local only, for the example; use a Strategy in production
		Clock:       func() time.Time { return now },
	})
	if err != nil {
		panic(err)
	}
	mw, err := httplimit.New(httplimit.Options{
		Namespace: ns,
		Limits:    []ratelimit.Limit{{Window: time.Minute, Max: 100}},
		KeyFunc: httplimit.KeyByIP(httplimit.IPOptions{
			TrustedProxies: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")},
		}),
		Rules: []httplimit.Rule{
			{Pattern: "POST /login", Limits: []ratelimit.Limit{{Window: time.Minute, Max: 2, Name: "login"}}},
		},
	})
	if err != nil {
		panic(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "hello") })
	h := mw(mux)

	for range 3 {
		r := httptest.NewRequest("POST", "/login", nil)
		r.RemoteAddr = "10.1.2.3:5555"                  // a trusted load balancer
		r.Header.Set("X-Forwarded-For", "198.51.100.7") // the client it saw
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		fmt.Printf("%d RateLimit: %s", w.Code, w.Header().Get("RateLimit"))
		if ra := w.Header().Get("Retry-After"); ra != "" {
			fmt.Printf(" Retry-After: %s", ra)
		}
		fmt.Println()
	}
	// Output:
	// 200 RateLimit: "login";r=1;t=120
	// 200 RateLimit: "login";r=0;t=120
	// 429 RateLimit: "login";r=0;t=120 Retry-After: 90
}
