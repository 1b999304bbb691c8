package policy

import (
	"encoding/binary"
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
	// Index is Entry.Index, or -1 when Entry is nil: a caller that keeps
	// per-entry data in a slice (see Snapshot.Entries) finds it without
	// reading the Entry.
	Index int
}

// Resolve resolves a request with client key and tier ("" for none) in the
// order deny list, allow list, per-key override, tier rule, route rule,
// global default. Shadow rules are resolved apart (tier, then route) and
// never change the enforced entry.
//
// Route matching is http.ServeMux's, remembered per (method, host, path) in a
// bounded cache, so a request to a path seen before allocates nothing.
func (s *Snapshot) Resolve(r *http.Request, key, tier string) Resolution {
	// The route cache is read first, although a listed key or an override
	// does not need it: its cache lines and the key index's are then read
	// side by side, and a request waits for one memory latency instead of
	// one after the other. A route not in the cache is matched and cached
	// only once the key turns out to need it, so a denied client sending
	// new paths neither allocates nor evicts other clients' routes.
	var tc *tierClasses
	if tier != "" {
		tc = s.tier(tier)
	}
	var hit *routeHit
	routed := tc != nil || s.routes != nil || s.shRoutes != nil
	if routed && r.URL != nil {
		hit = s.cachedRoute(r)
	}
	flags, override := s.keys.get(key)
	if flags&flagDeny == 0 && (s.stems == nil || len(key) >= s.stemLen && s.stemBits.mayHold(key[:s.stemLen]) && s.stems[key[:s.stemLen]]) {
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
		return Resolution{Level: LevelDeny, Status: s.denyCode, Index: -1}
	case flags&flagAllow != 0 || s.allowAll:
		return Resolution{Level: LevelAllow, Index: -1}
	}
	if override >= 0 && !s.shadow {
		return Resolution{Level: LevelOverride, Entry: s.entries[override], Index: override}
	}
	if routed && hit == nil {
		hit = s.route(r)
	}
	res := Resolution{Index: -1}
	if s.shadow {
		if tc != nil && tc.sh != nil {
			res.Shadow, _ = s.find(hit.shadow[tc.slot], tc.sh, key)
		}
		if res.Shadow == nil && s.shRoutes != nil {
			res.Shadow, _ = s.find(hit.shadow[0], s.shRoutes, key)
		}
	}
	if override >= 0 {
		res.Level, res.Entry, res.Index = LevelOverride, s.entries[override], override
		return res
	}
	if tc != nil && tc.c != nil {
		if e, i := s.find(hit.enforced(tc.slot), tc.c, key); e != nil {
			res.Level, res.Entry, res.Index = LevelTier, e, i
			return res
		}
	}
	if s.routes != nil {
		if e, i := s.find(hit.enforced(0), s.routes, key); e != nil {
			res.Level, res.Entry, res.Index = LevelRoute, e, i
			return res
		}
	}
	if s.def != nil {
		res.Level, res.Entry, res.Index = LevelDefault, s.def, s.def.Index
	}
	return res
}

// maxTierScan is the most tiers a snapshot finds by comparing the request's
// tier with each, which costs less than a map lookup's hash.
const maxTierScan = 8

// tier returns the classes of the tier named name, or nil.
func (s *Snapshot) tier(name string) *tierClasses {
	if len(s.tiers) > maxTierScan {
		return s.tiers[name]
	}
	for _, tc := range s.tierList {
		if tc.name == name {
			return tc
		}
	}
	return nil
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

// fixed returns the index (in Snapshot.entries) of what find returns for
// every key given gi, if that does not depend on the key; else noFixed, or
// noEntry when find returns nil for every key.
func (c *class) fixed(gi int32) int32 {
	for _, g := range [2]*group{c.groupAt(gi), c.any} {
		switch {
		case g == nil:
		case len(g.exact) > 0 || len(g.prefixes) > 0:
			return noFixed
		case g.all != nil:
			return int32(g.all.Index)
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

// In a hitSlot, noFixed marks a class whose answer depends on the key, and
// noEntry one that has no rule for the route.
const (
	noFixed int32 = -1
	noEntry int32 = -2
)

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

// inlineSlots is the number of enforced classes' slots a routeHit holds on
// its second cache line: the route rules and seven tiers.
const inlineSlots = 8

// routeHit is which group every class's mux chose for one request line. A
// request reads the line's strings and one slot: with the strings on the
// first cache line of the routeHit and the enforced classes' slots on the
// second, two lines (a routeHit is 192 bytes, a size class of whole lines).
type routeHit struct {
	path, method, host, raw string
	// inline and more are the enforced classes' slots, by tierClasses.slot
	// (0: the route rules): inline, then more past inlineSlots.
	inline [inlineSlots]hitSlot
	more   []hitSlot
	// shadow are the shadow classes' slots, by the same index (0: the
	// shadow route rules); nil without shadow rules.
	shadow []hitSlot
	_      [16]byte
}

// enforced returns the slot of the enforced class of index i.
func (h *routeHit) enforced(i int) hitSlot {
	if i < inlineSlots {
		return h.inline[i]
	}
	return h.more[i-inlineSlots]
}

type hitSlot struct {
	gi  int32 // the group's index; -1 when the class has no route for it
	fix int32 // the index in Snapshot.entries of the class's answer when it is the same for every key, or noFixed or noEntry (class.fixed)
}

// find is c.find, for c with slot sl, with the entry's index (-1 for
// none).
func (s *Snapshot) find(sl hitSlot, c *class, key string) (*Entry, int) {
	switch sl.fix {
	case noFixed:
		if e := c.find(sl.gi, key); e != nil {
			return e, e.Index
		}
		return nil, -1
	case noEntry:
		return nil, -1
	default:
		return s.entries[sl.fix], int(sl.fix)
	}
}

var seedOnce = maphash.MakeSeed()

// stemFilter is a set of 4,096 bits, one per stem hash: a key whose stem's
// bit is clear matches no list prefix, found without a map lookup (a stem of
// up to 8 bytes hashes in a multiplication).
type stemFilter [64]uint64

func stemBit(stem string) uint64 {
	var h uint64
	if len(stem) <= 8 {
		var b [8]byte
		copy(b[:], stem)
		h = (binary.LittleEndian.Uint64(b[:]) ^ uint64(len(stem))) * 0x9e3779b97f4a7c15
	} else {
		h = maphash.String(seedOnce, stem)
	}
	return h >> 52
}

func (f *stemFilter) add(stem string) {
	b := stemBit(stem)
	f[b/64] |= 1 << (b % 64)
}

func (f *stemFilter) mayHold(stem string) bool {
	b := stemBit(stem)
	return f[b/64]&(1<<(b%64)) != 0
}

// routeSet returns the first cache slot of the set r's request line maps
// to, and the hash it was picked by.
func routeSet(r *http.Request) (first, h uint64) {
	h = maphash.String(seedOnce, r.URL.Path) ^ uint64(len(r.Method))*0x9e3779b97f4a7c15
	return (h % (cacheSize / cacheWays)) * cacheWays, h
}

// cachedRoute returns r's routeHit if the cache holds it, else nil.
func (s *Snapshot) cachedRoute(r *http.Request) *routeHit {
	b, _ := routeSet(r)
	return s.cache.find(b, r)
}

// find returns r's routeHit from the set starting at slot b, or nil.
func (rc *routeCache) find(b uint64, r *http.Request) *routeHit {
	u := r.URL
	for w := range uint64(cacheWays) {
		if c := rc.slots[b+w].Load(); c != nil && c.path == u.Path && c.method == r.Method && c.host == r.Host && c.raw == u.RawPath {
			return c
		}
	}
	return nil
}

// route returns r's routeHit, matching and caching it when the cache does
// not hold it.
func (s *Snapshot) route(r *http.Request) *routeHit {
	b, h := routeSet(r)
	if c := s.cache.find(b, r); c != nil {
		return c
	}
	u := r.URL
	c := &routeHit{method: r.Method, host: r.Host, path: u.Path, raw: u.RawPath}
	if s.nslots > inlineSlots {
		c.more = make([]hitSlot, s.nslots-inlineSlots)
	}
	en := func(i int) *hitSlot {
		if i < inlineSlots {
			return &c.inline[i]
		}
		return &c.more[i-inlineSlots]
	}
	*en(0) = s.routes.match(r)
	if s.shadow {
		c.shadow = make([]hitSlot, s.nslots)
		c.shadow[0] = s.shRoutes.match(r)
	}
	for _, tc := range s.tiers {
		*en(tc.slot) = tc.c.match(r)
		if c.shadow != nil {
			c.shadow[tc.slot] = tc.sh.match(r)
		}
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
