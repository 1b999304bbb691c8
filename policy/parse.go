package policy

import (
	"bytes"
	"errors"
	"io"
	"regexp"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// MaxDocumentSize bounds the documents Parse accepts (bytes).
const MaxDocumentSize = 64 << 20

// Parse decodes a YAML or JSON document strictly (unknown fields, duplicate
// keys, bad durations, wrong types, anchors and aliases are errors) and
// validates it as Compile does. Errors wrap ErrInvalid; each is an *Error
// naming the line, the rule and the field (see Errors). Plain YAML and JSON
// are read fast (see the package documentation, "Reload time").
func Parse(data []byte) (*Document, error) {
	s, err := parse(data)
	if err != nil {
		return nil, err
	}
	return s.Document(), nil
}

// parse parses and compiles data.
func parse(data []byte) (*Snapshot, error) {
	if len(data) > MaxDocumentSize {
		return nil, &Error{Field: "document", Msg: "larger than MaxDocumentSize"}
	}
	// Most documents are in the subset lite reads, many times faster than
	// yaml.v3. yaml.v3 reads the others, and those with problems, to report
	// them with their lines.
	if doc, ovs, ok := parseLite(data); ok {
		var p problems
		if s := build(doc, &p, ovs); len(p.errs) == 0 {
			s.pending = ovs // the map is made when Document asks for it
			return s, nil
		}
	}
	_, s, err := parseSlow(data)
	return s, err
}

// parseSlow is parse with yaml.v3 alone.
func parseSlow(data []byte) (*Document, *Snapshot, error) {
	doc, root, decoded, err := parseYAML(data)
	if err != nil {
		return nil, nil, err
	}
	var p problems
	s := build(doc, &p, nil)
	s.slow = true
	if len(p.errs) > 0 || len(decoded.errs) > 0 {
		idx := newIndex(root)
		// The decoding errors, then the others, except those about a field
		// that could not be decoded (its zero value is no news).
		all := decoded
	next:
		for _, e := range p.errs {
			for _, d := range decoded.errs {
				if related(d.Field, e.Field) {
					continue next
				}
			}
			e.Line = idx.line(e.Field)
			if len(all.errs) < maxErrors {
				all.errs = append(all.errs, e)
			}
		}
		return nil, nil, all.err()
	}
	return doc, s, nil
}

// parseYAML decodes data with yaml.v3 and decoder. err is a syntax error;
// decoded holds the problems of the fields that could not be decoded.
func parseYAML(data []byte) (doc *Document, root *yaml.Node, decoded problems, err error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	root = new(yaml.Node)
	doc = new(Document)
	switch err := dec.Decode(root); {
	case errors.Is(err, io.EOF):
		// An empty document limits nothing.
	case err != nil:
		return nil, nil, decoded, syntaxError(err)
	default:
		var extra yaml.Node
		if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
			if err != nil {
				return nil, nil, decoded, syntaxError(err)
			}
			return nil, nil, decoded, &Error{Line: extra.Line, Field: "document", Msg: "more than one YAML document"}
		}
		if len(root.Content) == 1 && !isNull(root.Content[0]) {
			(&decoder{p: &decoded}).document(root.Content[0], doc)
		}
	}
	return doc, root, decoded, nil
}

// related reports whether one field path is the other or contains it.
func related(a, b string) bool {
	if len(a) > len(b) {
		a, b = b, a
	}
	return a == b || a == "document" || strings.HasPrefix(b, a) && (b[len(a)] == '.' || b[len(a)] == '[')
}

var lineRE = regexp.MustCompile(`^(?:yaml: )?line (\d+): (.*)$`)

// syntaxError turns a yaml.v3 syntax error into an *Error with its line.
func syntaxError(err error) error {
	m := strings.TrimPrefix(err.Error(), "yaml: ")
	e := &Error{Field: "document", Msg: m}
	if sm := lineRE.FindStringSubmatch(m); sm != nil {
		e.Line, _ = strconv.Atoi(sm[1])
		e.Msg = sm[2]
	}
	return e
}

// index maps field paths ("rules[1].limits[0].max") of a parsed document to
// their lines. It is built only when there are errors to place.
type index struct {
	lines map[string]int
}

func newIndex(root *yaml.Node) *index {
	idx := &index{lines: map[string]int{}}
	if len(root.Content) == 1 {
		idx.walk("", root.Content[0])
	}
	return idx
}

func (idx *index) walk(path string, n *yaml.Node) {
	switch n.Kind {
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			p := join(path, k.Value)
			if path == "overrides" {
				p = path + "[" + strconv.Quote(k.Value) + "]"
			}
			if _, ok := idx.lines[p]; !ok {
				idx.lines[p] = k.Line
			}
			idx.walk(p, v)
		}
	case yaml.SequenceNode:
		for i, c := range n.Content {
			p := path + "[" + strconv.Itoa(i) + "]"
			idx.lines[p] = c.Line
			idx.walk(p, c)
		}
	}
}

// line returns the line of path, or of its closest ancestor that has one.
func (idx *index) line(path string) int {
	for {
		if l, ok := idx.lines[path]; ok {
			return l
		}
		i := strings.LastIndexAny(path, ".[")
		if i <= 0 {
			return 0
		}
		path = path[:i]
	}
}
