package policy_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http/httptest"

	"github.com/ratesync/ratelimit/policy"
)

// Each resolution level, from the highest.
func ExampleSnapshot_Resolve() {
	s, err := policy.Load([]byte(`
default: {limits: [{window: 1m, max: 100}]}
rules:
  - {id: orders, match: {route: "POST /orders"}, limits: [{window: 1m, max: 30}]}
  - {id: pro, match: {tier: pro}, limits: [{window: 1m, max: 1000}]}
overrides: {sk_vip: {limits: [{window: 1m, max: 5000}]}}
allow: ["sk_internal_*"]
deny: {keys: ["sk_revoked_*"]}
`), 1, policy.Options{})
	if err != nil {
		panic(err)
	}
	for _, c := range []struct{ key, tier, method, path string }{
		{"sk_revoked_1", "pro", "GET", "/"},  // deny list
		{"sk_internal_ci", "", "GET", "/"},   // allow list
		{"sk_vip", "pro", "POST", "/orders"}, // per-key override
		{"sk_a", "pro", "POST", "/orders"},   // tier rule
		{"sk_a", "", "POST", "/orders"},      // route rule
		{"sk_a", "", "GET", "/"},             // global default
	} {
		res := s.Resolve(httptest.NewRequest(c.method, c.path, nil), c.key, c.tier)
		fmt.Printf("%-15s %-4s %-13s -> %s", c.key, c.tier, c.method+" "+c.path, res.Level)
		if res.Entry != nil {
			fmt.Printf(" %s max %d", res.Entry.Name(), res.Entry.Limits[0].Max)
		}
		fmt.Println()
	}
	// Output:
	// sk_revoked_1    pro  GET /         -> deny
	// sk_internal_ci       GET /         -> allow
	// sk_vip          pro  POST /orders  -> override override max 5000
	// sk_a            pro  POST /orders  -> tier pro max 1000
	// sk_a                 POST /orders  -> route orders max 30
	// sk_a                 GET /         -> default default max 100
}

// Errors name the line, the rule and the field.
func ExampleParse() {
	_, err := policy.Parse([]byte(`rules:
  - id: search
    match: {route: "GET /search"}
    limits: [{window: 1 minute, max: 10}]
  - id: orders
    match: {route: "POST /orders"}
    limits: [{window: 1m, max: 0}]
`))
	fmt.Println(err)
	// Output:
	// policy: line 4: rule "search": rules[0].limits[0].window: bad duration "1 minute": want a Go duration such as "1m" or "1h30m"
	// policy: line 7: rule "orders": rules[1].limits[0].max: 0 would reject all traffic: want at least 1
}

// Publish, watch, roll back.
func ExampleWatcher() {
	ctx := context.Background()
	store := policy.NewMemoryStore() // redisstore or pgstore for a cluster
	if _, err := policy.Publish(ctx, store, []byte("default: {limits: [{window: 1m, max: 100}]}"), nil); err != nil {
		panic(err)
	}
	w, err := policy.NewWatcher(ctx, store, policy.WatchOptions{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		panic(err)
	}
	defer w.Close()
	fmt.Println("enforcing version", w.Load().Version())

	_, err = policy.Publish(ctx, store, []byte("default: {limits: [{window: 1m, max: 0}]}"), nil)
	fmt.Println(err)

	v, _ := policy.Publish(ctx, store, []byte("default: {limits: [{window: 1m, max: 500}]}"), nil)
	fmt.Println("published version", v)
	v, _ = policy.Rollback(ctx, store)
	fmt.Println("rolled back to version", v)
	// Output:
	// enforcing version 1
	// policy: line 1: default.limits[0].max: 0 would reject all traffic: want at least 1
	// published version 2
	// rolled back to version 1
}
