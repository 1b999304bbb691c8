package policy_test

import (
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit/policy"
)

const orderDoc = `
default: {limits: [{window: 1m, max: 1}]}
rules:
  - {id: route, match: {route: "GET /x"}, limits: [{window: 1m, max: 2}]}
  - {id: route-key, match: {route: "GET /x", key: "k*"}, limits: [{window: 1m, max: 3}]}
  - {id: route-key-longer, match: {route: "GET /x", key: "kk*"}, limits: [{window: 1m, max: 3}]}
  - {id: route-key-exact, match: {route: "GET /x", key: "kkk"}, limits: [{window: 1m, max: 3}]}
  - {id: route-wild, match: {route: "GET /items/{id}"}, limits: [{window: 1m, max: 2}]}
  - {id: keyonly, match: {key: "q*"}, limits: [{window: 1m, max: 2}]}
  - {id: tier, match: {tier: pro}, limits: [{window: 1m, max: 4}]}
  - {id: tier-route, match: {tier: pro, route: "GET /x"}, limits: [{window: 1m, max: 5}]}
  - {id: shadow, match: {route: "GET /x"}, shadow: true, limits: [{window: 1m, max: 1}]}
overrides: {kover: {limits: [{window: 1m, max: 6}]}}
allow: ["kallow", "kboth*"]
deny: {keys: ["kdeny*", "kboth"]}
`

// TestResolveOrder shows each level winning over every level below it.
func TestResolveOrder(t *testing.T) {
	s, err := policy.Load([]byte(orderDoc), 1, policy.Options{})
	require.NoError(t, err)
	for _, c := range []struct {
		key, tier, path string
		level           policy.Level
		id              string
	}{
		{"kboth", "pro", "/x", policy.LevelDeny, ""},        // deny over allow
		{"kdeny9", "pro", "/x", policy.LevelDeny, ""},       // deny prefix
		{"kbothx", "pro", "/x", policy.LevelAllow, ""},      // allow prefix over override, tier...
		{"kallow", "pro", "/x", policy.LevelAllow, ""},      // allow exact
		{"kover", "pro", "/x", policy.LevelOverride, ""},    // override over tier
		{"k1", "pro", "/x", policy.LevelTier, "tier-route"}, // tier+route over tier, route
		{"k1", "pro", "/y", policy.LevelTier, "tier"},       // tier over default
		{"k1", "", "/x", policy.LevelRoute, "route-key"},    // key glob over the route alone
		{"kk1", "", "/x", policy.LevelRoute, "route-key-longer"},
		{"kkk", "", "/x", policy.LevelRoute, "route-key-exact"},
		{"z", "", "/x", policy.LevelRoute, "route"},     // route over default
		{"z", "free", "/x", policy.LevelRoute, "route"}, // an unknown tier falls through
		{"z", "", "/items/7", policy.LevelRoute, "route-wild"},
		{"q1", "", "/y", policy.LevelRoute, "keyonly"}, // a rule without route
		{"z", "", "/y", policy.LevelDefault, ""},
	} {
		name := fmt.Sprintf("%s/%s%s", c.key, c.tier, c.path)
		res := s.Resolve(httptest.NewRequest("GET", c.path, nil), c.key, c.tier)
		require.Equal(t, c.level, res.Level, name)
		if c.level >= policy.LevelOverride {
			require.NotNil(t, res.Entry, name)
			require.Equal(t, c.id, res.Entry.ID, name)
			require.Equal(t, res.Entry.Index, res.Index, name)
			require.Same(t, res.Entry, s.Entries()[res.Index], name)
		} else {
			require.Nil(t, res.Entry, name)
			require.Equal(t, -1, res.Index, name)
		}
		if c.level == policy.LevelDeny {
			require.Equal(t, 403, res.Status)
		}
		if c.path == "/x" && c.level > policy.LevelAllow {
			require.NotNil(t, res.Shadow, name)
			require.Equal(t, "shadow", res.Shadow.ID)
			require.NotEqual(t, res.Shadow.Prefix, res.Entry.Prefix)
		} else {
			require.Nil(t, res.Shadow, name)
		}
	}
	empty, err := policy.Load(nil, 1, policy.Options{})
	require.NoError(t, err)
	require.Equal(t, policy.LevelNone, empty.Resolve(httptest.NewRequest("GET", "/", nil), "k", "").Level)
}

// TestCountersKeyedByID checks a new version of a rule keeps its counter
// prefix, and equal overrides share one entry.
func TestCountersKeyedByID(t *testing.T) {
	a, err := policy.Load([]byte(orderDoc), 1, policy.Options{})
	require.NoError(t, err)
	b, err := policy.Load([]byte(strings.Replace(orderDoc, "max: 5}", "max: 50}", 1)), 2, policy.Options{})
	require.NoError(t, err)
	r := httptest.NewRequest("GET", "/x", nil)
	ea, eb := a.Resolve(r, "k1", "pro").Entry, b.Resolve(r, "k1", "pro").Entry
	require.EqualValues(t, 5, ea.Limits[0].Max)
	require.EqualValues(t, 50, eb.Limits[0].Max)
	require.Equal(t, ea.Prefix, eb.Prefix)

	doc, _ := bigDocument(10, 1000)
	s, err := policy.Compile(doc, 1, policy.Options{})
	require.NoError(t, err)
	require.Less(t, len(s.Entries()), 1000+20, "overrides share entries")
}

func TestResolveDoesNotAllocate(t *testing.T) {
	doc, keys := bigDocument(1000, 100_000)
	s, err := policy.Compile(doc, 1, policy.Options{})
	require.NoError(t, err)
	reqs := benchRequests()
	for _, r := range reqs { // the first request to a path fills the route cache
		_ = s.Resolve(r, "k", "pro")
	}
	i := 0
	allocs := testing.AllocsPerRun(1000, func() {
		i++
		_ = s.Resolve(reqs[i%len(reqs)], keys[i%len(keys)], tiers[i%len(tiers)])
	})
	require.Zero(t, allocs)
}

var tiers = []string{"", "free", "pro", "t3", "enterprise"}

// bigDocument builds a policy of n rules (half route rules on distinct
// literal routes, half tier rules over 5 tiers) and m per-key overrides (10
// distinct limits), 1,000 allow and 1,000 deny entries (a tenth of them
// prefixes). It returns request keys: overrides, listed and unlisted keys.
func bigDocument(n, m int) (*policy.Document, []string) {
	lim := func(max int64) []policy.Limit {
		return []policy.Limit{{Window: policy.Duration(time.Minute), Max: max}}
	}
	doc := &policy.Document{Default: &policy.Target{Limits: lim(100)}, Overrides: map[string]policy.Target{}}
	for i := range n {
		r := policy.Rule{ID: fmt.Sprintf("r%d", i), Limits: lim(int64(10 + i))}
		if i%2 == 0 {
			r.Match.Route = fmt.Sprintf("GET /api/v1/r%d", i/2)
		} else {
			r.Match.Tier = tiers[1+(i/2)%4]
			r.Match.Route = fmt.Sprintf("GET /api/v1/r%d", i/2)
		}
		if i%16 == 1 {
			r.Match.Route += "/"
		}
		if i%10 == 2 {
			r.Match.Key = fmt.Sprintf("sk_%d_*", i)
		}
		doc.Rules = append(doc.Rules, r)
	}
	var keys []string
	for i := range m {
		k := fmt.Sprintf("sk_ovr_%d", i)
		doc.Overrides[k] = policy.Target{Limits: lim(int64(1000 + i%10))}
		if i%10 == 0 {
			keys = append(keys, k)
		}
	}
	doc.Deny = &policy.DenyList{}
	for i := range 1000 {
		suffix := ""
		if i%10 == 0 {
			suffix = "*"
		}
		doc.Allow = append(doc.Allow, fmt.Sprintf("sk_int_%d%s", i, suffix))
		doc.Deny.Keys = append(doc.Deny.Keys, fmt.Sprintf("sk_bad_%d%s", i, suffix))
	}
	for i := range len(keys) * 4 {
		keys = append(keys, fmt.Sprintf("sk_plain_%d", i))
	}
	keys = append(keys, "sk_int_5", "sk_bad_30x")
	return doc, keys
}

func benchRequests() []*http.Request {
	var reqs []*http.Request
	for i := range 600 {
		reqs = append(reqs, httptest.NewRequest("GET", fmt.Sprintf("/api/v1/r%d", i), nil))
	}
	return reqs
}

func TestHasTiers(t *testing.T) {
	s, err := policy.Load([]byte(orderDoc), 1, policy.Options{})
	require.NoError(t, err)
	require.True(t, s.HasTiers())
	s, err = policy.Load([]byte("rules: [{id: a, match: {route: \"GET /a\"}, limits: [{window: 1m, max: 1}]}]"), 1, policy.Options{})
	require.NoError(t, err)
	require.False(t, s.HasTiers())
}

// TestListPrefixesMatchNaive resolves random keys against allow and deny
// lists of prefixes of several lengths (the stem filter and the map behind
// it) and of exact keys, and checks each answer against a direct scan of
// the lists. Keys and prefixes come from a four-letter alphabet, so many
// keys share a stem with some prefix.
func TestListPrefixesMatchNaive(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	word := func(n int) string {
		b := make([]byte, n)
		for i := range b {
			b[i] = "abcd"[rng.IntN(4)]
		}
		return string(b)
	}
	for _, short := range []int{2, 10} { // stems hashed by multiplication, then by maphash
		var allow, deny []string
		for i := range 12 {
			allow = append(allow, word(short+rng.IntN(3))+"*")
			deny = append(deny, word(short+rng.IntN(3))+"*")
			if i%4 == 0 {
				allow = append(allow, word(short+rng.IntN(6)))
				deny = append(deny, word(short+rng.IntN(6)))
			}
		}
		doc := &policy.Document{Default: &policy.Target{Limits: []policy.Limit{{Window: policy.Duration(time.Minute), Max: 1}}},
			Allow: allow, Deny: &policy.DenyList{Keys: deny}}
		s, err := policy.Compile(doc, 1, policy.Options{})
		require.NoError(t, err)
		matches := func(list []string, key string) bool {
			for _, g := range list {
				if p, ok := strings.CutSuffix(g, "*"); ok && strings.HasPrefix(key, p) || g == key {
					return true
				}
			}
			return false
		}
		r := httptest.NewRequest("GET", "/", nil)
		seen := map[policy.Level]int{}
		var stems []string // keys with a prefix's stem, not always the prefix
		for _, g := range append(allow, deny...) {
			stems = append(stems, g[:short])
		}
		for range 20_000 {
			key := word(1 + rng.IntN(short+8))
			if rng.IntN(2) == 0 {
				key = stems[rng.IntN(len(stems))] + word(rng.IntN(5))
			}
			want := policy.LevelDefault
			switch {
			case matches(deny, key):
				want = policy.LevelDeny
			case matches(allow, key):
				want = policy.LevelAllow
			}
			require.Equal(t, want, s.Resolve(r, key, "").Level, "key %q", key)
			seen[want]++
		}
		for _, l := range []policy.Level{policy.LevelDeny, policy.LevelAllow, policy.LevelDefault} {
			require.Greater(t, seen[l], 100, "level %v: the test must see every answer", l)
		}
	}
}

// TestTiersFewAndMany resolves every tier of policies of few tiers (found by
// a scan) and many (found in a map): each request gets its own tier's rule,
// and an unknown tier falls through to the default.
func TestTiersFewAndMany(t *testing.T) {
	for _, n := range []int{1, 3, 8, 9, 20} {
		doc := &policy.Document{Default: &policy.Target{Limits: []policy.Limit{{Window: policy.Duration(time.Minute), Max: 1}}}}
		for i := range n {
			doc.Rules = append(doc.Rules, policy.Rule{ID: fmt.Sprintf("r%d", i), Match: policy.Match{Tier: fmt.Sprintf("tier%d", i)},
				Limits: []policy.Limit{{Window: policy.Duration(time.Minute), Max: int64(i + 2)}}})
		}
		s, err := policy.Compile(doc, 1, policy.Options{})
		require.NoError(t, err)
		r := httptest.NewRequest("GET", "/", nil)
		for i := range n {
			res := s.Resolve(r, "k", fmt.Sprintf("tier%d", i))
			require.Equal(t, policy.LevelTier, res.Level, "%d tiers, tier %d", n, i)
			require.Equal(t, fmt.Sprintf("r%d", i), res.Entry.ID)
		}
		for _, unknown := range []string{"tier", "tier99", "Tier0", "x"} {
			require.Equal(t, policy.LevelDefault, s.Resolve(r, "k", unknown).Level, "%d tiers, %q", n, unknown)
		}
	}
}
