package policy_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/ratesync/ratelimit/policy"
)

// TestDeniedKeyDoesNotTouchRouteCache: Resolve reads the route cache before
// the key index (their misses overlap), but a route it does not hold is
// matched and cached only for a key that needs it. A deny-listed client
// sending requests to ever new paths allocates nothing and evicts no
// legitimate client's route. (Found by review: the first version matched
// and cached the route of every request, 11 allocations per denied
// request.)
func TestDeniedKeyDoesNotTouchRouteCache(t *testing.T) {
	s, err := policy.Load([]byte(`
default: {limits: [{window: 1m, max: 1}]}
rules:
  - {id: a, match: {route: "GET /a/{x}"}, limits: [{window: 1m, max: 2}]}
  - {id: t, match: {tier: pro, route: "GET /b/{x}"}, limits: [{window: 1m, max: 2}]}
deny: {keys: ["bad*"]}
`), 1, policy.Options{})
	if err != nil {
		t.Fatal(err)
	}
	// Legitimate traffic: 256 paths, cached.
	var good []*http.Request
	for i := range 256 {
		good = append(good, httptest.NewRequest("GET", fmt.Sprintf("/a/good%d", i), nil))
	}
	for _, r := range good {
		s.Resolve(r, "client", "pro")
	}
	// A denied client floods new paths.
	flood := make([]*http.Request, 40_000)
	for i := range flood {
		flood[i] = httptest.NewRequest("GET", fmt.Sprintf("/a/x%d", i), nil)
	}
	n := 0
	denied := testing.AllocsPerRun(1000, func() {
		if res := s.Resolve(flood[n], "bad-client", "pro"); res.Level != policy.LevelDeny {
			t.Fatal(res.Level)
		}
		n++
	})
	for ; n < len(flood); n++ {
		s.Resolve(flood[n], "bad-client", "pro")
	}
	n = 0
	legit := testing.AllocsPerRun(10, func() {
		for _, r := range good {
			s.Resolve(r, "client", "pro")
		}
	})
	if denied != 0 || legit != 0 {
		t.Errorf("a denied request to a new path: %v allocations (want 0); after the flood, 256 cached legitimate requests: %v allocations (want 0)", denied, legit)
	}
}
