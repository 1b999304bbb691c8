package policy

import (
	"fmt"
	"net/http/httptest"
	"testing"
)

// TestRouteHitMatchesFind checks the answers a routeHit keeps for classes
// whose answer does not depend on the key: for every class, route and key,
// routeHit.find answers what class.find answers.
func TestRouteHitMatchesFind(t *testing.T) {
	s, err := Load([]byte(`
rules:
  - {id: a, match: {route: "GET /a"}, limits: [{window: 1m, max: 1}]}
  - {id: a-k, match: {route: "GET /a", key: "k*"}, limits: [{window: 1m, max: 1}]}
  - {id: b, match: {route: "GET /b/{x}"}, limits: [{window: 1m, max: 1}]}
  - {id: c-exact, match: {route: "GET /c", key: "k1"}, limits: [{window: 1m, max: 1}]}
  - {id: any-k, match: {key: "k2*"}, limits: [{window: 1m, max: 1}]}
  - {id: t, match: {tier: t}, limits: [{window: 1m, max: 1}]}
  - {id: t-a, match: {tier: t, route: "GET /a"}, limits: [{window: 1m, max: 1}]}
  - {id: u-k, match: {tier: u, key: "k1"}, limits: [{window: 1m, max: 1}]}
  - {id: sh, match: {route: "GET /b/{x}"}, shadow: true, limits: [{window: 1m, max: 1}]}
  - {id: sh-t, match: {tier: t, key: "k*"}, shadow: true, limits: [{window: 1m, max: 1}]}
`), 1, Options{})
	if err != nil {
		t.Fatal(err)
	}
	classes := map[int]*class{0: s.routes, 1: s.shRoutes}
	for _, tc := range s.tiers {
		classes[tc.slot], classes[tc.slot+1] = tc.c, tc.sh
	}
	fixed := 0
	for _, path := range []string{"/a", "/b/1", "/c", "/d"} {
		hit := s.route(httptest.NewRequest("GET", path, nil))
		for i, c := range classes {
			if c == nil {
				continue
			}
			if hit.slots[i].e != nil {
				fixed++
			}
			for _, key := range []string{"k1", "k2", "k22", "kx", "z"} {
				if got, want := hit.find(i, c, key), c.find(hit.slots[i].gi, key); got != want {
					t.Errorf("%s, slot %d, key %s: %s, want %s", path, i, key, name(got), name(want))
				}
			}
		}
	}
	if fixed == 0 {
		t.Fatal("no answer kept: the test tests nothing")
	}
}

func name(e *Entry) string {
	if e == nil {
		return "nil"
	}
	return fmt.Sprintf("%q", e.ID)
}
