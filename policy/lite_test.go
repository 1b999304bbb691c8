package policy

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

// liteSeeds are documents in the styles policies are written in, each of
// which lite must read.
var liteSeeds = []string{
	"default: {limits: [{window: 1m, max: 100}]}\n",
	`# comment
default:
  limits:
  - window: 1m     # indentless sequence
    max: 100
    name: per-minute
  - {window: 1s, max: 10, fixed: true, penalty: false}
rules:
  - id: orders
    version: 3
    match: {route: "POST /orders", key: 'sk_''x''_*', tier: pro}
    limits: [{window: 1m, max: 30}]
    cost: 2
    shadow: true
  - id: items
    match:
      route: GET /items/{id}
    limits:
      - window: 1h30m
        max: 9007199254740992
overrides:
  sk_vip_001: {limits: [{window: 1m, max: 10000}]}
  "sk:vip 2":
    limits: [{window: 500ms, max: 1}]
    cost: 1
  'k3': {cost: ~, limits: [{window: 1m, max: 5, name: null}]}
allow: [sk_internal_*, "sk_monitoring", 'x']
deny:
  keys:
    - sk_revoked_*
    - "sk_abuse"
  status: 429
escalation:
  strike_window: 1m
  max_cooldown: 10m
  deny_after: 20
  deny_for: 15m
`,
	"---\nallow: []\ndeny: {keys: [], status: 403}\noverrides: {}\nrules: []\n",
	`{"default":{"limits":[{"window":"1m0s","max":100}]},"rules":[{"id":"a","match":{"route":"GET /a"},"limits":[{"window":"1s","max":1,"fixed":true}]}],"overrides":{"k\u00e9\n":{"limits":[{"window":"1m","max":2}],"cost":1}},"deny":{"keys":["b*"],"status":429}}`,
	`{
  "default": {
    "limits": [
      {"window": "1m", "max": 100}
    ]
  },
  "escalation": {"deny_after": 3, "deny_for": "1h"}
}
`,
	"default:\n    limits:\n        - window: 1m0s\n          max: 1000\n",
	"overrides:\n  a: {limits: [{window: 1m,\n      max: 5}]}\n",
	"default: null\nrules: ~\noverrides:\nallow:\ndeny:\nescalation: null\n",
	"rules:\n- id: x\n  match: {key: \"k\"}\n  limits: [{window: 1m, max: 1}]\n",
	"# Windows\r\ndefault:\r\n  limits: [{window: 1m,\r\n    max: 5}]\r\nallow: ['a', \"b\"]\r\n",
}

// TestLiteReadsCommonStyles checks that lite reads (rather than leaves to
// yaml.v3) the usual styles of documents, yaml.v3's and encoding/json's
// renderings of a document included, and reads them as yaml.v3 does.
func TestLiteReadsCommonStyles(t *testing.T) {
	docs := slicesOf(liteSeeds)
	for _, name := range []string{"valid.yaml", "valid.json"} {
		b, err := os.ReadFile(filepath.Join("..", "testdata", "policy", name))
		if err != nil {
			t.Fatal(err)
		}
		docs = append(docs, b)
	}
	big := &Document{Default: &Target{Limits: []Limit{{Window: Duration(time.Minute), Max: 5}}}, Overrides: map[string]Target{}}
	for i := range 50 {
		big.Overrides[fmt.Sprintf("sk_%d", i)] = Target{Limits: []Limit{{Window: Duration(time.Second), Max: int64(i + 1), Name: "n"}}, Cost: 1}
		big.Rules = append(big.Rules, Rule{ID: fmt.Sprintf("r%d", i), Match: Match{Route: fmt.Sprintf("GET /r/{id}/%d", i), Tier: "t"},
			Limits: []Limit{{Window: Duration(time.Minute), Max: 9, Fixed: true}}, Shadow: i%2 == 0})
	}
	y, err := yaml.Marshal(big)
	if err != nil {
		t.Fatal(err)
	}
	j, err := json.Marshal(big)
	if err != nil {
		t.Fatal(err)
	}
	ji, err := json.MarshalIndent(big, "", "\t")
	if err != nil {
		t.Fatal(err)
	}
	docs = append(docs, y, j, []byte(strings.ReplaceAll(string(ji), "\t", "  ")))
	for i, d := range docs {
		got, ok := liteDoc(d)
		if !ok {
			t.Fatalf("document %d: lite did not read it:\n%s", i, d)
		}
		compareYAML(t, d, got)
	}
}

// TestLiteLeavesToYAML lists documents lite must not read: outside the
// subset, or wrong.
func TestLiteLeavesToYAML(t *testing.T) {
	for _, d := range []string{
		"",
		"# only a comment\n",
		"default: &a {limits: [{window: 1m, max: 1}]}\n",
		"default: !!map {limits: [{window: 1m, max: 1}]}\n",
		"default: {limits: [{window: 1m, max: 1e3}]}\n",
		"default: {limits: [{window: 1m, max: 0x10}]}\n",
		"default: {limits: [{window: 60, max: 1}]}\n",
		"default: {limits: [{window: 1m, max: \"1\"}]}\n",
		"rules: [{id: 5, match: {key: a}, limits: [{window: 1m, max: 1}]}]\n",
		"default: {limits: [{window: 1m, max: 1}], limits: []}\n",
		"default: {limits: [{window: 1m, max: 1}], extra: 1}\n",
		"overrides: {a: {limits: []}, a: {limits: []}}\n",
		"allow: [a, b,]\n",
		"allow:\n- a\n-\n",
		"allow: |\n  a\n",
		"allow: [a]\n---\nallow: [b]\n",
		"allow: [a]\r\n\r",
		"allow:\t[a]\n",
		"allow: [\"caf\u00e9\"]\n",
		"allow: [a] x\n",
		"allow: [a]#x\n",
		"deny:\n  keys: [a]\n   status: 403\n",
		"deny: {keys: [a],\nstatus: 403}\n",
		"<<: {allow: [a]}\n",
	} {
		if doc, ok := liteDoc([]byte(d)); ok {
			t.Errorf("lite read %q: %+v", d, doc)
		}
	}
}

// liteDoc is the Document lite reads, with its overrides, or false when
// parse would leave the document to yaml.v3: lite bails, or an override key
// is repeated (build finds it).
func liteDoc(data []byte) (*Document, bool) {
	doc, ovs, ok := parseLite(data)
	if !ok {
		return nil, false
	}
	if ovs != nil {
		ovs.fill(doc)
		if len(doc.Overrides) != ovs.n {
			return nil, false
		}
	}
	return doc, true
}

func slicesOf(ss []string) [][]byte {
	var out [][]byte
	for _, s := range ss {
		out = append(out, []byte(s))
	}
	return out
}

// compareYAML fails unless yaml.v3 and decoder read data without a problem
// into got.
func compareYAML(t *testing.T, data []byte, got *Document) {
	t.Helper()
	want, _, decoded, err := parseYAML(data)
	if err == nil {
		err = decoded.err()
	}
	if err != nil {
		t.Fatalf("lite read a document yaml.v3 refuses (%v):\n%q", err, data)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("lite and yaml.v3 differ on\n%q\nlite:   %s\nyaml.v3: %s", data, dump(got), dump(want))
	}
}

func dump(d *Document) string {
	b, _ := json.Marshal(d)
	return fmt.Sprintf("%s (nil overrides %v, nil rules %v, nil allow %v)", b, d.Overrides == nil, d.Rules == nil, d.Allow == nil)
}

// FuzzLite checks that every document lite reads is read by yaml.v3 and
// decoder without a problem, into an equal Document.
func FuzzLite(f *testing.F) {
	for _, s := range liteSeeds {
		f.Add([]byte(s))
	}
	for _, pat := range []string{"*/*", "*.*"} {
		files, _ := filepath.Glob(filepath.Join("..", "testdata", "policy", pat))
		for _, p := range files {
			if b, err := os.ReadFile(p); err == nil {
				f.Add(b)
			}
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if got, ok := liteDoc(data); ok {
			compareYAML(t, data, got)
		}
	})
}

// TestDocumentOverrides checks that a snapshot Load read with lite gives its
// overrides in Document (the map is made on the first call, by whichever
// goroutine comes first) as Parse and yaml.v3 do.
func TestDocumentOverrides(t *testing.T) {
	data := []byte("overrides:\n  a: {limits: [{window: 1m, max: 5}]}\n  b: {limits: [{window: 1s, max: 2}], cost: 2}\n")
	s, err := Load(data, 1, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if s.slow {
		t.Fatal("read by yaml.v3")
	}
	want, _, _, err := parseYAML(data)
	if err != nil {
		t.Fatal(err)
	}
	docs := make(chan *Document, 4)
	for range 4 {
		go func() { docs <- s.Document() }()
	}
	for range 4 {
		if d := <-docs; !reflect.DeepEqual(d, want) {
			t.Fatalf("Document() = %s, want %s", dump(d), dump(want))
		}
	}
	if d, err := Parse(data); err != nil || !reflect.DeepEqual(d, want) {
		t.Fatalf("Parse = %s, %v; want %s", dump(d), err, dump(want))
	}
}

// TestLiteCheck compares check, which reads 8 bytes at a time, with a
// byte-by-byte reading of its rules, on random texts.
func TestLiteCheck(t *testing.T) {
	rnd := rand.New(rand.NewPCG(1, 2))
	alphabet := []byte("ab -.%\n\n\n\t\r\x00\x1f\x7f\x80\xff:#")
	for range 20000 {
		b := make([]byte, rnd.IntN(40))
		for i := range b {
			b[i] = alphabet[rnd.IntN(len(alphabet))]
		}
		s := string(b)
		want := true
		for i := 0; i < len(s); i++ {
			if c := s[i]; c != '\n' && (c < ' ' || c >= 0x7f) {
				want = false
			}
			if i == 0 || s[i-1] == '\n' {
				r := s[i:]
				if strings.HasPrefix(r, "...") || strings.HasPrefix(r, "%") ||
					strings.HasPrefix(r, "---") && (i > 0 || len(s) > 3 && s[3] != '\n') {
					want = false
				}
			}
		}
		got := func() (ok bool) {
			defer func() { ok = recover() == nil }()
			(&lite{s: s}).check()
			return
		}()
		if got != want {
			t.Fatalf("check(%q) passes: %v, want %v", s, got, want)
		}
	}
}
