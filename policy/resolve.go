package policy

import (
	"hash/maphash"
	"net/http"
	"sync/atomic"
)

// Resolution is what a request resolved to.
type Resolution struct {
	// Level is the level that decided.
	Level Level
	// Entry holds the limits to enforce: nil for LevelDeny, LevelAllow and
	// LevelNone.
	Entry *Entry
	// Shadow is the shadow rule that matches the request, if any: it is
	// decided and counted apart, and never rejects. Deny- and allow-listed
	// requests have none.
	Shadow *Entry
	// Status is the answer for LevelDeny (403 or 429).
	Status int
}

// Resolve resolves a request with client key and tier ("" for none) in the
// order deny list, allow list, per-key override, tier rule, route rule,
// global default. Shadow rules are resolved apart (tier, then route) and
// never change the enforced entry.
//
// Route matching is http.ServeMux's, remembered per (method, host, path) in a
// bounded cache, so a request to a path seen before allocates nothing.
func (s *Snapshot) Resolve(r *http.Request, key, tier string) Resolution {
	flags, override := s.keys.get(key)
	if flags&flagDeny == 0 && (s.stems == nil || len(key) >= s.stemLen && s.stems[key[:s.stemLen]]) {
		for _, ps := range s.prefixes {
			if ps.n <= len(key) {
				flags |= ps.m[key[:ps.n]]
				if flags&flagDeny != 0 {
					break
				}
			}
		}
	}
	switch {
	case flags&flagDeny != 0:
		return Resolution{Level: LevelDeny, Status: s.denyCode}
	case flags&flagAllow != 0 || s.allowAll:
		return Resolution{Level: LevelAllow}
	}
	if override >= 0 && !s.shadow {
		return Resolution{Level: LevelOverride, Entry: s.entries[override]}
	}
	var res Resolution
	var tc *tierClasses
	if tier != "" {
		tc = s.tiers[tier]
	}
	var hit *routeHit
	if tc != nil || s.routes != nil || s.shRoutes != nil {
		hit = s.route(r)
	}
	if s.shadow {
		if tc != nil && tc.sh != nil {
			res.Shadow = hit.find(tc.slot+1, tc.sh, key)
		}
		if res.Shadow == nil && s.shRoutes != nil {
			res.Shadow = hit.find(1, s.shRoutes, key)
		}
	}
	if override >= 0 {
		res.Level, res.Entry = LevelOverride, s.entries[override]
		return res
	}
	if tc != nil && tc.c != nil {
		if e := hit.find(tc.slot, tc.c, key); e != nil {
			res.Level, res.Entry = LevelTier, e
			return res
		}
	}
	if s.routes != nil {
		if e := hit.find(0, s.routes, key); e != nil {
			res.Level, res.Entry = LevelRoute, e
			return res
		}
	}
	if s.def != nil {
		res.Level, res.Entry = LevelDefault, s.def
	}
	return res
}

// find returns the most specific rule of c for key, given the index of the
// group of the route ServeMux chose (-1 for none): that group's, else that of
// the rules without a route.
func (c *class) find(gi int32, key string) *Entry {
	if gi >= 0 {
		if e := c.groups[gi].find(key); e != nil {
			return e
		}
	}
	if c.any != nil {
		return c.any.find(key)
	}
	return nil
}

// fixed returns what find returns for every key given gi, if that does not
// depend on the key (noEntry for nil), or nil.
func (c *class) fixed(gi int32) *Entry {
	for _, g := range [2]*group{c.groupAt(gi), c.any} {
		switch {
		case g == nil:
		case len(g.exact) > 0 || len(g.prefixes) > 0:
			return nil
		case g.all != nil:
			return g.all
		}
	}
	return noEntry
}

func (c *class) groupAt(gi int32) *group {
	if gi < 0 {
		return nil
	}
	return c.groups[gi]
}

// noEntry marks, in a routeHit, a class that has no rule for the route.
var noEntry = new(Entry)

// find returns the group's most specific rule for key: exact, then the
// longest prefix, then the rule without a key glob.
func (g *group) find(key string) *Entry {
	if e := g.exact[key]; e != nil {
		return e
	}
	for _, pe := range g.prefixes {
		if len(pe.p) <= len(key) && key[:len(pe.p)] == pe.p {
			return pe.e
		}
	}
	return g.all
}

// cacheSize is the number of (method, host, path) route results a snapshot
// remembers, in sets of cacheWays; a path whose set is full replaces one.
const (
	cacheSize = 8192
	cacheWays = 4
)

type routeCache struct {
	slots [cacheSize]atomic.Pointer[routeHit]
}

// routeHit is which group every class's mux chose for one request line.
type routeHit struct {
	method, host, path, raw string
	// slots: 0 route rules, 1 shadow route rules, then per tier its
	// enforced and its shadow class.
	slots []hitSlot
}

type hitSlot struct {
	gi int32  // the group's index; -1 when the class has no route for it
	e  *Entry // the class's answer when it is the same for every key (class.fixed)
}

// find is c.find, for c at slot i.
func (h *routeHit) find(i int, c *class, key string) *Entry {
	switch e := h.slots[i].e; e {
	case nil:
		return c.find(h.slots[i].gi, key)
	case noEntry:
		return nil
	default:
		return e
	}
}

var seedOnce = maphash.MakeSeed()

func (s *Snapshot) route(r *http.Request) *routeHit {
	u := r.URL
	h := maphash.String(seedOnce, u.Path) ^ uint64(len(r.Method))*0x9e3779b97f4a7c15
	b := (h % (cacheSize / cacheWays)) * cacheWays
	for w := range uint64(cacheWays) {
		if c := s.cache.slots[b+w].Load(); c != nil && c.path == u.Path && c.method == r.Method && c.host == r.Host && c.raw == u.RawPath {
			return c
		}
	}
	c := &routeHit{method: r.Method, host: r.Host, path: u.Path, raw: u.RawPath, slots: make([]hitSlot, s.nslots)}
	c.slots[0] = s.routes.match(r)
	c.slots[1] = s.shRoutes.match(r)
	for _, tc := range s.tiers {
		c.slots[tc.slot] = tc.c.match(r)
		c.slots[tc.slot+1] = tc.sh.match(r)
	}
	// Fill an empty way, else replace one picked by the hash's high bits.
	w := (h >> 32) % cacheWays
	for i := range uint64(cacheWays) {
		if s.cache.slots[b+i].Load() == nil {
			w = i
			break
		}
	}
	s.cache.slots[b+w].Store(c)
	return c
}

// match returns the slot of c for r: the index of the group of the route
// ServeMux chooses (or -1), and the answer when it does not depend on the
// key.
func (c *class) match(r *http.Request) hitSlot {
	if c == nil {
		return hitSlot{-1, noEntry}
	}
	gi := int32(-1)
	if c.mux != nil {
		if h, _ := c.mux.Handler(r); h != nil {
			if i, ok := h.(ruleHandler); ok {
				gi = int32(i)
			}
		}
	}
	return hitSlot{gi, c.fixed(gi)}
}
