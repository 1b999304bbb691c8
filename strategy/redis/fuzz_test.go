package redis

import (
	"strconv"
	"strings"
	"testing"
	"time"
)

// unescapeNamespace inverts escapeNamespace.
func unescapeNamespace(s string) string {
	r := strings.NewReplacer("%7B", "{", "%7D", "}", "%25", "%")
	return r.Replace(s)
}

// Any namespace and key give keys whose hash tag is exactly
// "<escaped namespace>.<shard>": a namespace can neither end the tag early
// nor collide with another namespace.
func FuzzKeyLayout(f *testing.F) {
	for _, ns := range []string{"", "api", "a{b}", "}{", "%7B", "a.1", "{", "100%"} {
		f.Add(ns, "key")
	}
	f.Fuzz(func(t *testing.T, ns, key string) {
		s := &Store{opts: Options{KeyPrefix: "rl", Shards: 8}} // a fresh prefix cache per input
		esc := escapeNamespace(ns)
		if strings.ContainsAny(esc, "{}") {
			t.Fatalf("escaped namespace %q has a brace", esc)
		}
		if got := unescapeNamespace(esc); got != ns {
			t.Fatalf("escape is not injective: %q -> %q -> %q", ns, esc, got)
		}
		shard := s.shardOf(keyHash(key))
		if shard < 0 || shard >= 8 {
			t.Fatalf("shard %d out of range", shard)
		}
		name := hashKey(s.shardPrefixes(ns)[shard], time.Minute, -60_000)
		open := strings.IndexByte(name, '{')
		end := strings.IndexByte(name[open+1:], '}')
		if tag := name[open+1 : open+1+end]; tag != esc+"."+strconv.Itoa(shard) {
			t.Fatalf("hash tag of %q is %q", name, tag)
		}
	})
}
