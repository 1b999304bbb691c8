package policy

import (
	"cmp"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ratesync/ratelimit"
)

// Level is the resolution level that decided a request, from the highest.
type Level uint8

// Resolution levels, in the order they are tried.
const (
	// LevelNone: nothing matched and there is no default; the request
	// passes unlimited.
	LevelNone Level = iota
	// LevelDeny: the key is on the deny list.
	LevelDeny
	// LevelAllow: the key is on the allow list.
	LevelAllow
	// LevelOverride: the key has a per-key override.
	LevelOverride
	// LevelTier: a rule naming the request's tier.
	LevelTier
	// LevelRoute: a rule without a tier.
	LevelRoute
	// LevelDefault: the global default.
	LevelDefault
)

var levelNames = [...]string{"none", "deny", "allow", "override", "tier", "route", "default"}

// String names the level ("deny", "tier", ...).
func (l Level) String() string {
	if int(l) < len(levelNames) {
		return levelNames[l]
	}
	return "level(" + strconv.Itoa(int(l)) + ")"
}

// Entry is a compiled rule, override or default: what a request resolved to
// spends. Entries are immutable once compiled.
type Entry struct {
	// ID is the rule's id; "" for overrides and the default.
	ID string
	// Level is the entry's level (LevelOverride, LevelTier, LevelRoute or
	// LevelDefault).
	Level Level
	// Route is the rule's route pattern, or "".
	Route string
	// Limits are the limits, in the document's order.
	Limits []ratelimit.Limit
	// Cost is what one request spends (at least 1).
	Cost int64
	// Shadow reports a shadow rule.
	Shadow bool
	// Prefix is prepended to the request's key to name its counters. It
	// depends on the rule's id (never its version), so a new version of a
	// rule keeps the counts of the old one. Shadow rules have prefixes of
	// their own, so they never spend an enforced rule's quota.
	Prefix string
	// Data is what Options.Prepare returned for the entry.
	Data any
	// Index is the entry's position in Snapshot.Entries, so that a user can
	// keep per-entry data of a snapshot in a slice.
	Index int
}

// Name is the rule's id, "override" or "default".
func (e *Entry) Name() string {
	switch {
	case e.ID != "":
		return e.ID
	case e.Level == LevelOverride:
		return "override"
	}
	return "default"
}

// Options configure Compile.
type Options struct {
	// Prepare, when set, is called once per distinct entry at compile time;
	// its result is stored in Entry.Data and its error fails the compile
	// (naming the entry). The middleware uses it to check limits against its
	// namespace and to precompute headers.
	Prepare func(*Entry) (any, error)
}

// Snapshot is a compiled, immutable policy. It is safe for concurrent use.
type Snapshot struct {
	version  int64
	doc      *Document
	docOnce  sync.Once
	pending  *overrideList // doc's overrides, until Document puts them in doc
	raw      []byte
	slow     bool            // raw was read by yaml.v3, not lite
	keys     *keyIndex       // exact keys on the lists and overrides
	prefixes []prefixSet     // list prefixes, longest first
	stems    map[string]bool // the first stemLen bytes of every list prefix
	stemLen  int             // the shortest list prefix's length
	stemBits *stemFilter     // the stems' hashes: rules out most keys before the map
	allowAll bool
	denyCode int
	def      *Entry
	tiers    map[string]*tierClasses
	tierList []*tierClasses // the tiers, when few: scanned rather than hashed (see tier)
	routes   *class
	shRoutes *class      // shadow rules without a tier
	nslots   int         // route slots: 1 + 1 per tier (see routeHit)
	cache    *routeCache // route results, per snapshot
	shadow   bool
	esc      *Escalation
	entries  []*Entry
}

const (
	flagDeny uint8 = 1 << iota
	flagAllow
)

type prefixSet struct {
	n int
	m map[string]uint8
}

// class holds the rules of one level (one tier, or the route rules).
type class struct {
	mux    *http.ServeMux // nil without routed rules
	groups []*group       // by ruleHandler
	any    *group         // rules without a route
	byPat  map[string]int // pattern -> groups index (compile only)
}

// tierClasses holds a tier's rules: enforced and shadow.
type tierClasses struct {
	name  string
	c, sh *class
	slot  int // both classes' route slot (see routeHit)
}

// group holds the rules of one route, ordered by key specificity.
type group struct {
	exact    map[string]*Entry
	prefixes []prefixEntry // longest first
	all      *Entry        // no key glob
}

type prefixEntry struct {
	p string
	e *Entry
}

// ruleHandler marks a pattern in a class's mux.
type ruleHandler int

func (ruleHandler) ServeHTTP(http.ResponseWriter, *http.Request) {}

// Compile validates doc and compiles it. version is the version the source
// assigned (reported by Snapshot.Version). Errors wrap ErrInvalid and name
// the rule and field (lines are known only to Parse and Load).
func Compile(doc *Document, version int64, opts Options) (*Snapshot, error) {
	var p problems
	s := build(doc, &p, nil)
	if err := p.err(); err != nil {
		return nil, err
	}
	s.version = version
	if err := s.prepare(opts); err != nil {
		return nil, err
	}
	return s, nil
}

// Load parses data (as Parse does, with lines in errors) and compiles it.
func Load(data []byte, version int64, opts Options) (*Snapshot, error) {
	s, err := parse(data)
	if err != nil {
		return nil, err
	}
	s.version = version
	s.raw = data
	if err := s.prepare(opts); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *Snapshot) prepare(opts Options) error {
	if opts.Prepare == nil {
		return nil
	}
	for _, e := range s.entries {
		d, err := opts.Prepare(e)
		if err != nil {
			f := "default"
			switch e.Level {
			case LevelOverride:
				f = "overrides"
			case LevelTier, LevelRoute:
				f = "rules"
			}
			return &Error{Rule: e.ID, Field: f + ".limits", Msg: err.Error()}
		}
		e.Data = d
	}
	return nil
}

// Version is the version the source assigned to this snapshot.
func (s *Snapshot) Version() int64 { return s.version }

// Document returns the compiled document. It must not be modified.
func (s *Snapshot) Document() *Document {
	s.docOnce.Do(func() {
		if s.pending != nil {
			s.pending.fill(s.doc)
			s.pending = nil
		}
	})
	return s.doc
}

// Raw returns the document's text when it was loaded from text, else nil.
func (s *Snapshot) Raw() []byte { return s.raw }

// DenyStatus is the status deny-listed requests get (403 or 429).
func (s *Snapshot) DenyStatus() int { return s.denyCode }

// Escalation returns the escalation settings with defaults filled, or nil.
func (s *Snapshot) Escalation() *Escalation { return s.esc }

// HasShadow reports whether the policy has shadow rules.
func (s *Snapshot) HasShadow() bool { return s.shadow }

// HasTiers reports whether the policy has tier rules: without any, a
// request's tier does not change its resolution, and the middleware does
// not ask for it.
func (s *Snapshot) HasTiers() bool { return len(s.tiers) > 0 }

// Entries returns every distinct entry; Entry.Index is its position.
func (s *Snapshot) Entries() []*Entry { return slices.Clone(s.entries) }

// build compiles doc, adding its problems to p; the snapshot is usable only
// when p holds none. The overrides are doc.Overrides, or when ovs is not
// nil, ovs's (doc.Overrides is then nil).
func build(doc *Document, p *problems, ovs *overrideList) *Snapshot {
	overrides, n := maps.All(doc.Overrides), len(doc.Overrides)
	if ovs != nil {
		overrides, n = ovs.all, ovs.n
	}
	nkeys := n + len(doc.Allow)
	if doc.Deny != nil {
		nkeys += len(doc.Deny.Keys)
	}
	s := &Snapshot{doc: doc, keys: newKeyIndex(nkeys), denyCode: http.StatusForbidden,
		tiers: map[string]*tierClasses{}, nslots: 1, cache: new(routeCache)}
	interned := map[string]*Entry{}
	intern := func(e *Entry) *Entry {
		fp := string(appendFingerprint(nil, e.Level, e.Cost, e.Limits))
		if o, ok := interned[fp]; ok {
			return o
		}
		interned[fp] = e
		e.Index = len(s.entries)
		s.entries = append(s.entries, e)
		return e
	}
	if doc.Default != nil {
		if ls, cost, ok := checkTarget(p, "", "default", *doc.Default); ok {
			s.def = intern(&Entry{Level: LevelDefault, Limits: ls, Cost: cost, Prefix: "d\x00"})
		}
	}
	// Lists.
	prefixes := map[int]map[string]uint8{}
	addList := func(field string, i int, glob string, flag uint8) {
		f := field + "[" + strconv.Itoa(i) + "]"
		prefix, isPrefix, msg := parseGlob(glob)
		switch {
		case msg != "":
			p.add("", f, "%s", msg)
			return
		case isPrefix && prefix == "" && flag == flagDeny:
			p.add("", f, "\"*\" would deny every request")
			return
		case isPrefix && prefix == "":
			s.allowAll = true
		case isPrefix:
			m := prefixes[len(prefix)]
			if m == nil {
				m = map[string]uint8{}
				prefixes[len(prefix)] = m
			}
			m[prefix] |= flag
		default:
			s.keys.add(prefix, flag, -1)
		}
	}
	for i, g := range doc.Allow {
		addList("allow", i, g, flagAllow)
	}
	if doc.Deny != nil {
		switch doc.Deny.Status {
		case 0:
		case http.StatusForbidden, http.StatusTooManyRequests:
			s.denyCode = doc.Deny.Status
		default:
			p.add("", "deny.status", "%d is neither 403 nor 429", doc.Deny.Status)
		}
		for i, g := range doc.Deny.Keys {
			addList("deny.keys", i, g, flagDeny)
		}
	}
	for n, m := range prefixes {
		s.prefixes = append(s.prefixes, prefixSet{n, m})
	}
	slices.SortFunc(s.prefixes, func(a, b prefixSet) int { return cmp.Compare(b.n, a.n) })
	if len(s.prefixes) > 1 {
		// One lookup of a key's stem rules out most keys before one lookup
		// per prefix length.
		s.stemLen = s.prefixes[len(s.prefixes)-1].n
		s.stems = map[string]bool{}
		s.stemBits = new(stemFilter)
		for _, ps := range s.prefixes {
			for p := range ps.m {
				s.stems[p[:s.stemLen]] = true
				s.stemBits.add(p[:s.stemLen])
			}
		}
	}
	// Overrides. Equal ones share one entry: a policy may hold 100,000
	// overrides but few distinct limits. Errors are sorted by key afterwards.
	var op problems
	var scratch []ratelimit.Limit
	var fp []byte
	// The entries of valid one-limit targets, by content: most overrides
	// find theirs here, without being checked and fingerprinted again.
	type oneLimit struct {
		cost int64
		l    Limit
	}
	seen := map[oneLimit]*Entry{}
	for k, t := range overrides {
		if len(t.Limits) == 1 && k != "" {
			if e := seen[oneLimit{t.Cost, t.Limits[0]}]; e != nil && strings.IndexByte(k, 0) < 0 && k[len(k)-1] != '*' {
				if s.keys.add(k, 0, e.Index) {
					op.add("", "overrides["+strconv.Quote(k)+"]", "mapping key %q is already defined", k)
				}
				continue
			}
		}
		field := ""
		if k == "" || strings.ContainsRune(k, 0) || strings.HasSuffix(k, "*") || !quickTarget(t) {
			field = "overrides[" + strconv.Quote(k) + "]"
		}
		switch {
		case k == "" || strings.ContainsRune(k, 0):
			op.add("", field, "an override's key must be non-empty and hold no NUL byte")
			continue
		case strings.HasSuffix(k, "*"):
			op.add("", field, "an override names one key; use a rule with match.key for a glob")
			continue
		}
		ls, cost, ok := checkTargetInto(&op, "", field, t, scratch)
		scratch = ls
		if !ok {
			continue
		}
		fp = appendFingerprint(fp[:0], LevelOverride, cost, ls)
		e := interned[string(fp)]
		if e == nil {
			e = intern(&Entry{Level: LevelOverride, Limits: slices.Clone(ls), Cost: cost, Prefix: "o\x00"})
		}
		if len(t.Limits) == 1 {
			seen[oneLimit{t.Cost, t.Limits[0]}] = e
		}
		if s.keys.add(k, 0, e.Index) {
			op.add("", "overrides["+strconv.Quote(k)+"]", "mapping key %q is already defined", k)
		}
	}
	if s.keys.full {
		op.add("", "overrides", "the keys of the lists and overrides exceed 4 GB")
	}
	slices.SortFunc(op.errs, func(a, b *Error) int { return cmp.Compare(a.Field, b.Field) })
	for _, e := range op.errs {
		if len(p.errs) < maxErrors {
			p.errs = append(p.errs, e)
		}
	}
	// Rules.
	ids := map[string]int{}
	for i := range doc.Rules {
		r := &doc.Rules[i]
		f := "rules[" + strconv.Itoa(i) + "]"
		if !validID(r.ID) {
			p.add(r.ID, f+".id", "%q: want 1 to 64 letters, digits, '.', '_' or '-'", r.ID)
			continue
		}
		if j, dup := ids[r.ID]; dup {
			p.add(r.ID, f+".id", "duplicates the id of rules[%d]", j)
			continue
		}
		ids[r.ID] = i
		if r.Version < 0 {
			p.add(r.ID, f+".version", "%d is negative", r.Version)
		}
		m := r.Match
		if m.Route == "" && m.Key == "" && m.Tier == "" {
			p.add(r.ID, f+".match", "matches every request: set route, key or tier (or use default)")
			continue
		}
		if m.Tier != "" && !validTier(m.Tier) {
			p.add(r.ID, f+".match.tier", "%q: want 1 to 64 printable characters without spaces", m.Tier)
			continue
		}
		prefix, isPrefix, msg := parseGlob(m.Key)
		if m.Key != "" && msg != "" {
			p.add(r.ID, f+".match.key", "%s", msg)
			continue
		}
		ls, cost, ok := checkTarget(p, r.ID, f, Target{Limits: r.Limits, Cost: r.Cost})
		if !ok {
			continue
		}
		e := &Entry{ID: r.ID, Level: LevelRoute, Route: m.Route, Limits: ls, Cost: cost, Shadow: r.Shadow, Prefix: "r:" + r.ID + "\x00"}
		if r.Shadow {
			e.Prefix = "s:" + r.ID + "\x00"
			s.shadow = true
		}
		var c *class
		if m.Tier != "" {
			e.Level = LevelTier
			tc := s.tiers[m.Tier]
			if tc == nil {
				tc = &tierClasses{name: m.Tier, slot: s.nslots}
				s.nslots++
				s.tiers[m.Tier] = tc
			}
			pc := &tc.c
			if r.Shadow {
				pc = &tc.sh
			}
			if *pc == nil {
				*pc = &class{}
			}
			c = *pc
		} else {
			if r.Shadow {
				if s.shRoutes == nil {
					s.shRoutes = &class{}
				}
				c = s.shRoutes
			} else {
				if s.routes == nil {
					s.routes = &class{}
				}
				c = s.routes
			}
		}
		g, err := c.group(m.Route, i)
		if err != "" {
			p.add(r.ID, f+".match.route", "%s", err)
			continue
		}
		s.entries = append(s.entries, e)
		if other := g.add(m.Key, prefix, isPrefix, e); other != nil {
			p.add(r.ID, f+".match", "overlaps rule %q (same tier, route and key) and cannot be ordered", other.ID)
		}
	}
	if doc.Escalation != nil {
		s.esc = checkEscalation(p, *doc.Escalation)
	}
	for i, e := range s.entries {
		e.Index = i
	}
	if len(s.tiers) <= maxTierScan {
		for _, tc := range s.tiers {
			s.tierList = append(s.tierList, tc)
		}
	}
	return s
}

// group returns the group of pattern in c, registering it. The error is a
// sentence for a bad or conflicting pattern.
func (c *class) group(pattern string, ruleIdx int) (*group, string) {
	if pattern == "" {
		if c.any == nil {
			c.any = &group{}
		}
		return c.any, ""
	}
	if i, ok := c.byPat[pattern]; ok {
		return c.groups[i], ""
	}
	if c.mux == nil {
		c.mux = http.NewServeMux()
		c.byPat = map[string]int{}
	}
	if msg := register(c.mux, pattern, ruleHandler(len(c.groups))); msg != "" {
		return nil, msg
	}
	c.byPat[pattern] = len(c.groups)
	g := &group{}
	c.groups = append(c.groups, g)
	return g, ""
}

// register adds pattern to mux, turning ServeMux's panic (a bad pattern, or
// one that overlaps another with neither more specific) into a sentence.
func register(mux *http.ServeMux, pattern string, h http.Handler) (msg string) {
	defer func() {
		if r := recover(); r != nil {
			msg = fmt.Sprint(r)
			if strings.Contains(msg, "conflicts with") {
				msg = "overlaps another rule's route and neither is more specific, so they cannot be ordered: " + msg
			}
		}
	}()
	mux.Handle(pattern, h)
	return ""
}

// add puts e in g under a key glob; it returns the entry already there when
// the glob is taken.
func (g *group) add(glob, prefix string, isPrefix bool, e *Entry) *Entry {
	switch {
	case glob == "" || (isPrefix && prefix == ""):
		if g.all != nil {
			return g.all
		}
		g.all = e
	case isPrefix:
		for _, pe := range g.prefixes {
			if pe.p == prefix {
				return pe.e
			}
		}
		g.prefixes = append(g.prefixes, prefixEntry{prefix, e})
		slices.SortStableFunc(g.prefixes, func(a, b prefixEntry) int { return cmp.Compare(len(b.p), len(a.p)) })
	default:
		if o := g.exact[prefix]; o != nil {
			return o
		}
		if g.exact == nil {
			g.exact = map[string]*Entry{}
		}
		g.exact[prefix] = e
	}
	return nil
}

// checkTarget validates limits and cost at field, converting the limits into
// a new slice.
func checkTarget(p *problems, rule, field string, t Target) ([]ratelimit.Limit, int64, bool) {
	ls, cost, ok := checkTargetInto(p, rule, field, t, nil)
	return slices.Clip(ls), cost, ok
}

// checkTargetInto is checkTarget, appending the limits to buf.
func checkTargetInto(p *problems, rule, field string, t Target, buf []ratelimit.Limit) ([]ratelimit.Limit, int64, bool) {
	n := len(p.errs)
	if len(t.Limits) == 0 {
		p.add(rule, field+".limits", "at least one limit is required")
		return nil, 0, false
	}
	cost := t.Cost
	if cost == 0 {
		cost = 1
	}
	if cost < 0 {
		p.add(rule, field+".cost", "%d is negative", cost)
	}
	ls := buf[:0]
	for i, l := range t.Limits {
		f := func() string { return field + ".limits[" + strconv.Itoa(i) + "]" } // on errors only
		w := l.Window.D()
		switch {
		case w <= 0:
			p.add(rule, f()+".window", "%v: a window must be positive", w)
		case w%time.Millisecond != 0:
			p.add(rule, f()+".window", "%v is not a whole number of milliseconds", w)
		}
		switch {
		case l.Max <= 0:
			p.add(rule, f()+".max", "%d would reject all traffic: want at least 1", l.Max)
		case l.Max > ratelimit.MaxValue:
			p.add(rule, f()+".max", "%d exceeds 2^53", l.Max)
		case cost > l.Max:
			p.add(rule, f()+".max", "%d is below the cost %d: every request would be rejected", l.Max, cost)
		}
		alg, err := ratelimit.ParseAlgorithm(l.Algorithm)
		if err != nil {
			p.add(rule, f()+".algorithm", "%q is not an algorithm: want sliding_window, fixed_window, token_bucket (gcra) or sliding_log", l.Algorithm)
		}
		switch {
		case l.Burst < 0:
			p.add(rule, f()+".burst", "%d is negative", l.Burst)
		case l.Burst != 0 && alg != ratelimit.TokenBucket:
			p.add(rule, f()+".burst", "a burst is for token buckets, not %s", alg)
		case alg == ratelimit.TokenBucket && l.Burst != 0 && cost > l.Burst:
			p.add(rule, f()+".burst", "%d is below the cost %d: every request would be rejected", l.Burst, cost)
		case l.Fixed && alg != ratelimit.SlidingWindow && alg != ratelimit.FixedWindow:
			p.add(rule, f()+".fixed", "fixed is for windows, not %s", alg)
		}
		for j := range i {
			if t.Limits[j].Window == l.Window && !sameCounting(t.Limits[j], l) {
				p.add(rule, f()+".algorithm", "limits[%d] has the same window but counts otherwise", j)
			}
		}
		ls = append(ls, ratelimit.Limit{Window: w, Max: l.Max, Algorithm: alg, Burst: l.Burst, Fixed: l.Fixed, Penalty: l.Penalty, Name: l.Name})
	}
	return ls, cost, len(p.errs) == n
}

func checkEscalation(p *problems, e Escalation) *Escalation {
	if e.StrikeWindow == 0 {
		e.StrikeWindow = Duration(time.Minute)
	}
	if e.MaxCooldown == 0 {
		e.MaxCooldown = Duration(15 * time.Minute)
	}
	if e.DenyFor == 0 {
		e.DenyFor = Duration(time.Hour)
	}
	for _, d := range []struct {
		f string
		v Duration
	}{{"strike_window", e.StrikeWindow}, {"max_cooldown", e.MaxCooldown}, {"deny_for", e.DenyFor}} {
		if d.v < 0 || d.v.D()%time.Millisecond != 0 {
			p.add("", "escalation."+d.f, "%v: want a positive whole number of milliseconds", d.v)
		}
	}
	if e.DenyAfter < 0 {
		p.add("", "escalation.deny_after", "%d is negative", e.DenyAfter)
	}
	return &e
}

// parseGlob splits a key glob: an exact key, or a prefix and a final "*".
// msg is non-empty for a bad glob.
func parseGlob(g string) (prefix string, isPrefix bool, msg string) {
	if g == "" {
		return "", false, "an empty key matches nothing"
	}
	if strings.ContainsRune(g, 0) {
		return "", false, "a key holds no NUL byte"
	}
	star := strings.IndexByte(g, '*')
	switch {
	case star < 0:
		return g, false, ""
	case star == len(g)-1:
		return g[:star], true, ""
	}
	return "", false, fmt.Sprintf("%q: a glob is an exact key or a prefix followed by one final \"*\"", g)
}

func validID(id string) bool {
	if id == "" || len(id) > 64 {
		return false
	}
	for _, c := range []byte(id) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

func validTier(t string) bool {
	if len(t) > 64 {
		return false
	}
	for _, c := range []byte(t) {
		if c <= ' ' || c >= 0x7f {
			return false
		}
	}
	return true
}

// appendFingerprint identifies an entry's content, so equal overrides share
// one entry.
func appendFingerprint(b []byte, level Level, cost int64, ls []ratelimit.Limit) []byte {
	b = append(b, byte(level))
	b = strconv.AppendInt(b, cost, 10)
	for _, l := range ls {
		b = append(b, '|')
		b = strconv.AppendInt(b, int64(l.Window), 10)
		b = append(b, ',')
		b = strconv.AppendInt(b, l.Max, 10)
		b = strconv.AppendBool(b, l.Fixed)
		b = append(b, byte(l.Algorithm))
		b = strconv.AppendInt(b, l.Burst, 10)
		b = strconv.AppendBool(b, l.Penalty)
		b = strconv.AppendQuote(b, l.Name)
	}
	return b
}

// quickTarget reports whether t is surely valid, so that its field path need
// not be built (checkTargetInto builds paths only for errors).
func quickTarget(t Target) bool {
	if len(t.Limits) == 0 || t.Cost < 0 {
		return false
	}
	cost := max(t.Cost, 1)
	for i, l := range t.Limits {
		w := l.Window.D()
		if w <= 0 || w%time.Millisecond != 0 || l.Max < cost || l.Max > ratelimit.MaxValue {
			return false
		}
		if l.Algorithm != "" || l.Burst != 0 {
			return false // checked in full
		}
		for j := range i {
			if t.Limits[j].Window == l.Window && t.Limits[j].Fixed != l.Fixed {
				return false
			}
		}
	}
	return true
}

// sameCounting reports whether two limits of one window count the same way:
// the same algorithm (Fixed is the fixed window's), and for the kinds whose
// state is shared (token buckets, sliding logs), the same parameters.
func sameCounting(a, b Limit) bool {
	aa, _ := ratelimit.ParseAlgorithm(a.Algorithm)
	ba, _ := ratelimit.ParseAlgorithm(b.Algorithm)
	if a.Fixed && aa == ratelimit.SlidingWindow {
		aa = ratelimit.FixedWindow
	}
	if b.Fixed && ba == ratelimit.SlidingWindow {
		ba = ratelimit.FixedWindow
	}
	switch {
	case aa != ba:
		return false
	case aa == ratelimit.TokenBucket || aa == ratelimit.SlidingLog:
		return a.Max == b.Max && a.Burst == b.Burst
	}
	return true
}
