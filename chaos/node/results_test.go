package node

import (
	"testing"
)

// logResult logs a measured figure in a fixed form, so the figures for
// RESULTS.md can be collected with `go test -v | grep RESULT`.
func logResult(t testing.TB, name, figure string) {
	t.Helper()
	t.Logf("RESULT %s: %s", name, figure)
}
