package repotest

import (
	"encoding/json"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// knownImports are the packages a README fragment may use without importing
// them, by the name it uses. A fragment that imports a package itself (the
// goredis alias, say) shows the import line in the README.
var knownImports = map[string]string{
	"context":   "context",
	"errors":    "errors",
	"fmt":       "fmt",
	"http":      "net/http",
	"log":       "log",
	"netip":     "net/netip",
	"slog":      "log/slog",
	"time":      "time",
	"ratelimit": "github.com/ratesync/ratelimit",
	"httplimit": "github.com/ratesync/ratelimit/httplimit",
	"metrics":   "github.com/ratesync/ratelimit/metrics",
	"strategy":  "github.com/ratesync/ratelimit/strategy",
	"memory":    "github.com/ratesync/ratelimit/strategy/memory",
	"postgres":  "github.com/ratesync/ratelimit/strategy/postgres",
	"redis":     "github.com/ratesync/ratelimit/strategy/redis",
}

var goBlock = regexp.MustCompile("(?ms)^```go\n(.*?)^```\n")

// readmeBlocks returns the Go blocks of README.md with the line each starts on.
func readmeBlocks(t *testing.T, root string) (blocks []string, lines []int) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range goBlock.FindAllSubmatchIndex(b, -1) {
		blocks = append(blocks, string(b[m[2]:m[3]]))
		lines = append(lines, 1+strings.Count(string(b[:m[2]]), "\n"))
	}
	return blocks, lines
}

// program turns a README Go block into a main package. A block that starts
// with "package" is a whole file. Otherwise it is the body of a function
// that has ctx (a context.Context) in scope, optionally preceded by import
// declarations; the packages of knownImports it uses are imported for it.
func program(block string) (string, error) {
	if strings.HasPrefix(block, "package ") {
		return block, nil
	}
	var imports []string
	body := block
	for strings.HasPrefix(body, "import ") {
		end := strings.Index(body, "\n") + 1
		if strings.HasPrefix(body, "import (") {
			end = strings.Index(body, "\n)\n") + 3
		}
		if end <= 0 {
			return "", fmt.Errorf("unterminated import declaration")
		}
		imports = append(imports, strings.TrimSpace(body[:end]))
		body = strings.TrimLeft(body[end:], "\n")
	}
	fset := token.NewFileSet()
	head := "package main\n" + strings.Join(imports, "\n") + "\n"
	f, err := parser.ParseFile(fset, "snippet.go", head+"func snippet() {\n"+body+"\n}\n", parser.SkipObjectResolution)
	if err != nil {
		return "", err
	}
	have := map[string]bool{}
	for _, imp := range f.Imports {
		name := filepath.Base(strings.Trim(imp.Path.Value, `"`))
		if imp.Name != nil {
			name = imp.Name.Name
		}
		have[name] = true
	}
	need := map[string]bool{"context": true}
	ast.Inspect(f, func(n ast.Node) bool {
		if sel, ok := n.(*ast.SelectorExpr); ok {
			if id, ok := sel.X.(*ast.Ident); ok && knownImports[id.Name] != "" && !have[id.Name] {
				need[id.Name] = true
			}
		}
		return true
	})
	var auto []string
	for name := range need {
		path := knownImports[name]
		if filepath.Base(path) == name {
			auto = append(auto, fmt.Sprintf("import %q", path))
		} else {
			auto = append(auto, fmt.Sprintf("import %s %q", name, path))
		}
	}
	slices.Sort(auto)
	return head + strings.Join(auto, "\n") + "\n\nfunc main() { snippet(context.Background()) }\n\n" +
		"func snippet(ctx context.Context) {\n\t_ = ctx\n" + body + "}\n", nil
}

// TestReadmeGoBlocks builds every Go block of README.md, so that the README
// cannot show code that does not compile. The blocks are type-checked by go
// vet, as main packages inside this module (through an overlay: nothing is
// written to the source tree).
func TestReadmeGoBlocks(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the README's Go blocks with go vet")
	}
	root := repoRoot(t)
	blocks, lines := readmeBlocks(t, root)
	if len(blocks) == 0 {
		t.Fatal("README.md has no Go block")
	}
	tmp := t.TempDir()
	overlay := map[string]map[string]string{"Replace": {}}
	var pkgs []string
	where := map[string]int{}
	for i, block := range blocks {
		src, err := program(block)
		if err != nil {
			t.Errorf("README.md:%d: %v", lines[i], err)
			continue
		}
		dir := fmt.Sprintf("readme_block_%d", lines[i])
		file := filepath.Join(tmp, dir+".go")
		if err := os.WriteFile(file, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
		virtual := filepath.Join(root, "internal", "repotest", "_readme", dir, "main.go")
		overlay["Replace"][virtual] = file
		pkgs = append(pkgs, "./internal/repotest/_readme/"+dir)
		where[dir] = lines[i]
	}
	ov, err := json.Marshal(overlay)
	if err != nil {
		t.Fatal(err)
	}
	ovFile := filepath.Join(tmp, "overlay.json")
	if err := os.WriteFile(ovFile, ov, 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", append([]string{"build", "-o", os.DevNull, "-overlay", ovFile}, pkgs...)...)
	cmd.Dir = root
	out, err := cmd.CombinedOutput()
	if err != nil {
		msg := string(out)
		for dir, line := range where {
			msg = strings.ReplaceAll(msg, dir, fmt.Sprintf("%s (README.md:%d)", dir, line))
		}
		t.Errorf("README Go blocks do not build: %v\n%s", err, msg)
	}
}

// The checker itself: a broken block is reported.
func TestProgram(t *testing.T) {
	src, err := program("store := memory.New()\nfmt.Println(store)\n")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`import "github.com/ratesync/ratelimit/strategy/memory"`, `import "fmt"`, "func snippet(ctx context.Context) {"} {
		if !strings.Contains(src, want) {
			t.Errorf("program lacks %s:\n%s", want, src)
		}
	}
	src, err = program("import goredis \"github.com/redis/go-redis/v9\"\n\nc := goredis.NewClient(nil)\n_ = c\n")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Count(src, "go-redis/v9") != 1 {
		t.Errorf("goredis imported twice:\n%s", src)
	}
	if _, err := program("if err != nil { ... }\n"); err == nil {
		t.Error("a block with ... parsed")
	}
}
