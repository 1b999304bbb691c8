package repotest

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"
)

// skipHelper is the one function allowed to skip for a missing server: it
// fails instead when RATELIMIT_TEST_REQUIRE_SERVICES=1.
const skipHelper = "SkipOrFail"

// TestServerSkipsGoThroughSkipOrFail fails for a Skip, Skipf or SkipNow call
// that depends on an environment variable (a server's address, read with
// os.Getenv or os.LookupEnv, or named in the message) unless the code around
// it checks RequireServices: such a skip would hide a missing server in CI,
// where every server is required.
func TestServerSkipsGoThroughSkipOrFail(t *testing.T) {
	root := repoRoot(t)
	files := goFiles(t, root, func(rel string) bool {
		return strings.HasSuffix(rel, "_test.go") || strings.Contains(rel, "test"+string(filepath.Separator))
	})
	if len(files) == 0 {
		t.Fatal("no test files found")
	}
	for _, rel := range files {
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, filepath.Join(root, rel), nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, fn := range f.Decls {
			fd, ok := fn.(*ast.FuncDecl)
			if !ok || fd.Body == nil || fd.Name.Name == skipHelper {
				continue
			}
			for _, pos := range badSkips(fd.Body) {
				t.Errorf("%s: a skip that depends on an environment variable; call strategytest.SkipOrFail(t, envVar) so that RATELIMIT_TEST_REQUIRE_SERVICES=1 turns it into a failure", fset.Position(pos))
			}
		}
	}
}

// badSkips returns the positions of the skip calls in body that depend on an
// environment variable without a RequireServices check around them.
func badSkips(body *ast.BlockStmt) []token.Pos {
	envVars := map[string]bool{} // local variables assigned from os.Getenv / os.LookupEnv
	ast.Inspect(body, func(n ast.Node) bool {
		if as, ok := n.(*ast.AssignStmt); ok {
			for _, r := range as.Rhs {
				if mentionsEnv(r, nil) {
					for _, l := range as.Lhs {
						if id, ok := l.(*ast.Ident); ok {
							envVars[id.Name] = true
						}
					}
				}
			}
		}
		return true
	})
	var bad []token.Pos
	var stack []ast.Node
	ast.Inspect(body, func(n ast.Node) bool {
		if n == nil {
			stack = stack[:len(stack)-1]
			return true
		}
		stack = append(stack, n)
		call, ok := n.(*ast.CallExpr)
		if !ok || !isSkip(call) {
			return true
		}
		depends := false
		for _, a := range call.Args {
			depends = depends || mentionsEnv(a, envVars)
		}
		for _, anc := range stack {
			ifs, ok := anc.(*ast.IfStmt)
			if !ok {
				continue
			}
			if mentions(ifs.Cond, "RequireServices") {
				return true
			}
			depends = depends || mentionsEnv(ifs.Cond, envVars)
			if ifs.Init != nil {
				depends = depends || mentionsEnv(ifs.Init, envVars)
			}
		}
		if depends {
			bad = append(bad, call.Pos())
		}
		return true
	})
	return bad
}

func isSkip(call *ast.CallExpr) bool {
	sel, ok := call.Fun.(*ast.SelectorExpr)
	if !ok {
		return false
	}
	switch sel.Sel.Name {
	case "Skip", "Skipf", "SkipNow":
		return true
	}
	return false
}

// mentionsEnv reports whether n reads an environment variable: a call to
// os.Getenv or os.LookupEnv, a string naming a RATELIMIT_TEST_ variable, an
// identifier named like one (env..., ...Env) or a local in envVars.
func mentionsEnv(n ast.Node, envVars map[string]bool) bool {
	found := false
	ast.Inspect(n, func(n ast.Node) bool {
		switch x := n.(type) {
		case *ast.SelectorExpr:
			if id, ok := x.X.(*ast.Ident); ok && id.Name == "os" && (x.Sel.Name == "Getenv" || x.Sel.Name == "LookupEnv") {
				found = true
			}
		case *ast.BasicLit:
			found = found || (x.Kind == token.STRING && strings.Contains(x.Value, "RATELIMIT_TEST_"))
		case *ast.Ident:
			found = found || envVars[x.Name] || strings.HasPrefix(x.Name, "env") || strings.HasSuffix(x.Name, "Env")
		}
		return !found
	})
	return found
}

// mentions reports whether n contains an identifier named name.
func mentions(n ast.Node, name string) bool {
	found := false
	ast.Inspect(n, func(n ast.Node) bool {
		if id, ok := n.(*ast.Ident); ok && id.Name == name {
			found = true
		}
		return !found
	})
	return found
}

// The check itself: which skips it flags.
func TestBadSkips(t *testing.T) {
	cases := []struct {
		body string
		bad  int
	}{
		{`addr := os.Getenv("X"); if addr == "" { t.Skip("no server") }`, 1},
		{`if os.Getenv("X") == "" { b.Skipf("%s is not set", "X") }`, 1},
		{`if testing.Short() { t.Skipf("set %s", envRedis) }`, 1},
		{`if !ok { if strategytest.RequireServices() { t.Fatal("x") } else { t.Skip("x") } }`, 0},
		{`addr := os.Getenv("X"); if addr == "" { strategytest.SkipOrFail(t, "X") }`, 0},
		{`if testing.Short() { t.Skip("short") }`, 0},
	}
	for _, c := range cases {
		f, err := parser.ParseFile(token.NewFileSet(), "x.go", "package p\nfunc f() {"+c.body+"}", 0)
		if err != nil {
			t.Fatal(err)
		}
		if got := len(badSkips(f.Decls[0].(*ast.FuncDecl).Body)); got != c.bad {
			t.Errorf("%s: %d bad skips, want %d", c.body, got, c.bad)
		}
	}
}
