package policy_test

import (
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"

	"github.com/ratesync/ratelimit/policy"
)

// FuzzParse checks that no document makes Parse panic, that every error is
// made of *Error values that say where the problem is, and that a document
// Parse accepts compiles and resolves.
func FuzzParse(f *testing.F) {
	files, _ := filepath.Glob(filepath.Join(fixtures, "*", "*"))
	top, _ := filepath.Glob(filepath.Join(fixtures, "*.*"))
	for _, p := range append(files, top...) {
		if b, err := os.ReadFile(p); err == nil {
			f.Add(b)
		}
	}
	f.Add([]byte("rules: [{id: a, match: {key: 'x*', tier: t}, limits: [{window: 1s, max: 1}]}]"))
	req := httptest.NewRequest("GET", "/items/1", nil)
	f.Fuzz(func(t *testing.T, data []byte) {
		doc, err := policy.Parse(data)
		if err != nil {
			errs := policy.Errors(err)
			if len(errs) == 0 {
				t.Fatalf("error without *Error: %v", err)
			}
			for _, e := range errs {
				if e.Field == "" || e.Msg == "" {
					t.Fatalf("error names no field: %#v", e)
				}
				if e.Line <= 0 && e.Field != "document" {
					t.Fatalf("error in a field names no line: %#v", e)
				}
			}
			return
		}
		s, err := policy.Compile(doc, 1, policy.Options{})
		if err != nil {
			t.Fatalf("Parse accepted what Compile refuses: %v", err)
		}
		_ = s.Resolve(req, "sk_x", "t")
		_ = s.Resolve(req, "", "")
	})
}
