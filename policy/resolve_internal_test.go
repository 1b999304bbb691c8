package policy

import (
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"
	"unsafe"
)

// TestRouteHitMatchesFind checks the answers a routeHit keeps for classes
// whose answer does not depend on the key: for every class, route and key,
// routeHit.find answers what class.find answers.
func TestRouteHitMatchesFind(t *testing.T) {
	// Tiers m1 to m8 put some enforced slots past the inline ones.
	var more strings.Builder
	for i := 1; i <= 8; i++ {
		fmt.Fprintf(&more, "  - {id: m%d, match: {tier: m%d, route: \"GET /a\"}, limits: [{window: 1m, max: 1}]}\n", i, i)
		fmt.Fprintf(&more, "  - {id: m%d-k, match: {tier: m%d, key: \"k2\"}, limits: [{window: 1m, max: 1}]}\n", i, i)
		fmt.Fprintf(&more, "  - {id: m%d-sh, match: {tier: m%d, route: \"GET /c\"}, shadow: true, limits: [{window: 1m, max: 1}]}\n", i, i)
	}
	s, err := Load([]byte("rules:\n"+more.String()+`  - {id: a, match: {route: "GET /a"}, limits: [{window: 1m, max: 1}]}
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
	if s.nslots <= inlineSlots {
		t.Fatalf("%d slots: none past the inline ones", s.nslots)
	}
	type at struct {
		slot   int
		shadow bool
	}
	classes := map[at]*class{{0, false}: s.routes, {0, true}: s.shRoutes}
	for _, tc := range s.tiers {
		classes[at{tc.slot, false}], classes[at{tc.slot, true}] = tc.c, tc.sh
	}
	fixed := 0
	for _, path := range []string{"/a", "/b/1", "/c", "/d"} {
		hit := s.route(httptest.NewRequest("GET", path, nil))
		for i, c := range classes {
			if c == nil {
				continue
			}
			sl := hit.enforced(i.slot)
			if i.shadow {
				sl = hit.shadow[i.slot]
			}
			if sl.fix != noFixed {
				fixed++
			}
			for _, key := range []string{"k1", "k2", "k22", "kx", "z"} {
				got, gi := s.find(sl, c, key)
				if want := c.find(sl.gi, key); got != want {
					t.Errorf("%s, slot %v, key %s: %s, want %s", path, i, key, name(got), name(want))
				}
				if wi := -1; got != nil && gi != got.Index || got == nil && gi != wi {
					t.Errorf("%s, slot %v, key %s: index %d, entry %s", path, i, key, gi, name(got))
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

// TestRouteHitLayout checks the layout a request's route lookup relies on:
// a routeHit is a size class of whole cache lines (so it starts on one),
// its strings fill the first line and the enforced slots the second.
func TestRouteHitLayout(t *testing.T) {
	var h routeHit
	if got := unsafe.Sizeof(h); got != 192 {
		t.Errorf("routeHit is %d bytes, want 192", got)
	}
	if off, size := unsafe.Offsetof(h.inline), unsafe.Sizeof(h.inline); off != 64 || size != 64 {
		t.Errorf("inline slots at %d, %d bytes; want 64, 64", off, size)
	}
}
