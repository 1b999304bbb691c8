package httplimit_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestPolicyPrefixBoundaries: prefixes of 23, 24 and 25 bytes (around the inline bound), twin
// rule IDs that differ in their last byte, shadow twins, and tier rules past
// the eight found by a scan: before the entries are compiled (the prefix
// is the Entry's) and after (inline copy), each rule counts on its own
// counters, and the two paths share them.
func TestPolicyPrefixBoundaries(t *testing.T) {
	ns, _ := newNS(t, "local", newClock(epoch))
	var doc strings.Builder
	doc.WriteString("default: {limits: [{window: 1m, max: 100}]}\nrules:\n")
	var ids []string
	for _, n := range []int{20, 21, 22} {
		for _, last := range "ab" {
			id := strings.Repeat("x", n-1) + string(last)
			ids = append(ids, id)
			fmt.Fprintf(&doc, "  - {id: %s, match: {route: \"GET /%s\"}, limits: [{window: 1m, max: 3}]}\n", id, id)
		}
	}
	for i := range 10 {
		fmt.Fprintf(&doc, "  - {id: tier-rule-with-21-%02d, match: {tier: t%d}, limits: [{window: 1m, max: %d}]}\n", i, i, 2+i%3)
	}
	env := newPolicyEnv(t, doc.String(), ns)
	// Before compiling: two hits each (the first request starts compiling,
	// so some of these may already be served compiled; both are fine).
	for _, id := range ids {
		for range 2 {
			require.Equal(t, http.StatusOK, env.do("GET", "/"+id, "k", "").Code)
		}
	}
	require.Eventually(t, env.lim.Compiled, 5*time.Second, time.Millisecond)
	for _, id := range ids {
		require.Equal(t, 1, env.admitted(t, "GET", "/"+id, "k", ""), id)
	}
	for i := range 10 {
		require.Equal(t, 2+i%3, env.admitted(t, "GET", "/z", "k", fmt.Sprintf("t%d", i)), "tier %d", i)
	}
}
