package policy

import (
	"math/bits"
	"strconv"
	"strings"
	"unicode/utf8"
)

// lite reads the plain subset of YAML that policy documents are written in,
// JSON included: block and flow mappings and sequences, plain, single- and
// double-quoted one-line scalars, comments. It reads a document as the
// schema asks for it (liteDecoder), with no node tree, which is what makes
// it fast enough to reload a policy of 100,000 overrides in tens of
// milliseconds.
//
// It is not a YAML parser: whatever lies outside the subset, or is wrong in
// it (a syntax error, an unknown field, a bad value), makes it give up
// (bail), and Parse reads the document again with yaml.v3, which gives the
// answer and the errors with their lines. So the subset is chosen to be
// read exactly as yaml.v3 reads it: when in doubt, lite bails. FuzzLite
// checks that every document it reads yields the Document yaml.v3 yields.
type lite struct {
	s   string
	pos int
	ls  int // start of the line holding pos
	ind int // after skipLines: the indentation of the line at pos; -1 at the end
}

// bailout is the panic value of bail, recovered by parseLite.
type bailout struct{}

func bail() { panic(bailout{}) }

// tags of scalars, as yaml.v3 resolves them.
const (
	tagStr = iota + 1
	tagInt
	tagBool
	tagNull
)

// val is a value whose reading has begun: a scalar, read whole, or a
// collection, to be read by mapping or sequence.
type val struct {
	kind  byte // 'm' mapping, 's' sequence, 'v' scalar
	flow  bool // a flow collection ({...} or [...])
	block bool // a flow collection that is a value in block context: its line ends after it
	bind  int  // the indentation its flow lines must exceed
	text  string
	tag   int
}

func (v val) null() bool { return v.kind == 'v' && v.tag == tagNull }

// slot says where a value begins: after "key:" or "- " in block context
// (ind is the collection's indentation), or in a flow collection.
type slot struct {
	flow  bool
	ind   int
	seqOK bool // block mapping value: a sequence may be at ind itself
	entry bool // block sequence entry: may hold a compact mapping
}

// check bails on what the subset never holds anywhere: bytes outside
// printable ASCII and the newline (tabs, CR, Unicode, controls), directives
// and document markers other than a first "---" line. It reads 8 bytes at a
// time.
func (p *lite) check() {
	s := p.s
	if strings.HasPrefix(s, "---") && len(s) > 3 && s[3] != '\n' || strings.HasPrefix(s, "...") || strings.HasPrefix(s, "%") {
		bail()
	}
	const high = 0x8080808080808080
	// zero has the high bit of each byte of x that is 0 set, and no other.
	zero := func(x uint64) uint64 { return ^((x&^high + 0x7f7f7f7f7f7f7f7f) | x) & high }
	i := 0
	for ; i+8 <= len(s); i += 8 {
		w := uint64(s[i]) | uint64(s[i+1])<<8 | uint64(s[i+2])<<16 | uint64(s[i+3])<<24 |
			uint64(s[i+4])<<32 | uint64(s[i+5])<<40 | uint64(s[i+6])<<48 | uint64(s[i+7])<<56
		nl := zero(w ^ 0x0a0a0a0a0a0a0a0a)
		ctrl := zero(w & 0xe0e0e0e0e0e0e0e0) // bytes below ' '
		if w&high|zero(w^0x7f7f7f7f7f7f7f7f)|ctrl&^nl != 0 {
			bail()
		}
		for ; nl != 0; nl &= nl - 1 {
			p.lineStart(i + bits.TrailingZeros64(nl)/8 + 1)
		}
	}
	for ; i < len(s); i++ {
		if c := s[i]; c-' ' >= 0x7f-' ' { // c < ' ' || c >= 0x7f
			if c != '\n' {
				bail()
			}
			p.lineStart(i + 1)
		}
	}
}

// lineStart bails on a directive or a document marker at offset i, the
// start of a line.
func (p *lite) lineStart(i int) {
	if r := p.s[i:]; strings.HasPrefix(r, "---") || strings.HasPrefix(r, "...") || strings.HasPrefix(r, "%") {
		bail()
	}
}

func (p *lite) peek() byte {
	if p.pos < len(p.s) {
		return p.s[p.pos]
	}
	return 0
}

func (p *lite) col() int { return p.pos - p.ls }

func (p *lite) spaces() {
	for p.pos < len(p.s) && p.s[p.pos] == ' ' {
		p.pos++
	}
}

// blankAt reports whether offset i is a space, a line end or the end.
func (p *lite) blankAt(i int) bool {
	return i >= len(p.s) || p.s[i] == ' ' || p.s[i] == '\n'
}

// skipLines moves from the start of a line to the first content of the next
// line that has any (skipping blank and comment lines) and sets ind.
func (p *lite) skipLines() {
	for {
		p.ls = p.pos
		p.spaces()
		switch p.peek() {
		case 0:
			p.ind = -1
			return
		case '\n':
			p.pos++
			continue
		case '#':
			p.toEOL()
			if p.pos < len(p.s) {
				p.pos++
			}
			continue
		}
		p.ind = p.col()
		return
	}
}

func (p *lite) toEOL() {
	if i := strings.IndexByte(p.s[p.pos:], '\n'); i >= 0 {
		p.pos += i
	} else {
		p.pos = len(p.s)
	}
}

// endLine checks that only spaces and a comment remain on the line, and
// moves to the next content.
func (p *lite) endLine() {
	p.spaces()
	switch p.peek() {
	case '#':
		if p.pos > p.ls && p.s[p.pos-1] != ' ' {
			bail() // a comment needs a space before it
		}
		p.toEOL()
	case '\n', 0:
	default:
		bail()
	}
	if p.pos < len(p.s) {
		p.pos++
	}
	p.skipLines()
}

// root begins the document's top value.
func (p *lite) root() val {
	p.skipLines()
	if p.ind == 0 && strings.HasPrefix(p.s[p.pos:], "---") {
		p.pos += 3
		p.endLine()
	}
	switch {
	case p.ind < 0:
		bail() // an empty document: yaml.v3's answer
	case p.peek() == '{':
		return val{kind: 'm', flow: true, block: true, bind: -1}
	case p.keyAhead():
		return val{kind: 'm'}
	}
	bail()
	return val{}
}

// end checks the document holds nothing after its top value.
func (p *lite) end() {
	if p.ind >= 0 {
		bail()
	}
}

// value begins the value at sl. A scalar is read whole.
func (p *lite) value(sl slot) val {
	if sl.flow {
		return p.flowValue(sl.ind)
	}
	p.spaces()
	switch c := p.peek(); c {
	case 0, '\n', '#':
		if sl.entry {
			bail() // "-" alone, its entry on the next lines
		}
		p.endLine()
		switch {
		case p.ind > sl.ind && p.atEntry():
			return val{kind: 's'}
		case p.ind > sl.ind && p.keyAhead():
			return val{kind: 'm'}
		case p.ind > sl.ind:
			bail()
		case p.ind == sl.ind && sl.seqOK && p.atEntry():
			return val{kind: 's'}
		}
		return val{kind: 'v', tag: tagNull}
	case '{':
		return val{kind: 'm', flow: true, block: true, bind: sl.ind}
	case '[':
		return val{kind: 's', flow: true, block: true, bind: sl.ind}
	case '"', '\'':
		if sl.entry && p.keyAhead() {
			return val{kind: 'm'}
		}
		s := p.quoted()
		p.endLine()
		return val{kind: 'v', text: s, tag: tagStr}
	}
	if sl.entry && p.keyAhead() {
		return val{kind: 'm'}
	}
	s := p.plain(false)
	if p.peek() == ':' {
		bail() // "key: a: b"
	}
	p.endLine()
	return val{kind: 'v', text: s, tag: resolvePlain(s)}
}

// mapping reads the mapping v, calling f with each key; f must read the
// key's value from the slot it is given.
func (p *lite) mapping(v val, f func(key string, sl slot)) {
	switch {
	case v.kind != 'm':
		bail()
	case v.flow:
		p.flowMapping(v.bind, f)
		if v.block {
			p.endLine()
		}
	default:
		p.blockMapping(f)
	}
}

// sequence reads the sequence v, calling f for each entry; f must read the
// entry from the slot it is given.
func (p *lite) sequence(v val, f func(sl slot)) {
	switch {
	case v.kind != 's':
		bail()
	case v.flow:
		p.flowSequence(v.bind, f)
		if v.block {
			p.endLine()
		}
	default:
		p.blockSequence(f)
	}
}

func (p *lite) blockMapping(f func(string, slot)) {
	ind := p.col()
	for {
		f(p.blockKey(), slot{ind: ind, seqOK: true})
		switch {
		case p.ind < ind:
			return
		case p.ind > ind:
			bail()
		}
	}
}

func (p *lite) blockSequence(f func(slot)) {
	ind := p.col()
	for {
		if !p.atEntry() {
			bail()
		}
		p.pos++
		f(slot{ind: ind, entry: true})
		switch {
		case p.ind == ind && p.atEntry():
		case p.ind <= ind:
			return
		default:
			bail()
		}
	}
}

// atEntry reports whether a block sequence entry ("- ") begins at pos.
func (p *lite) atEntry() bool {
	return p.peek() == '-' && p.blankAt(p.pos+1)
}

// blockKey reads a block mapping's key and its ':'.
func (p *lite) blockKey() string {
	var k string
	if c := p.peek(); c == '"' || c == '\'' {
		k = p.quoted()
		p.spaces()
	} else {
		k = p.plain(false)
	}
	if p.peek() != ':' || !p.blankAt(p.pos+1) || len(k) > 1000 || k == "<<" {
		bail() // not a key; yaml.v3's keys are at most 1024 bytes; a merge
	}
	p.pos++
	return k
}

// keyAhead reports whether a block mapping key begins at pos, without
// moving.
func (p *lite) keyAhead() bool {
	s, i := p.s, p.pos
	if i >= len(s) {
		return false
	}
	switch q := s[i]; {
	case q == '"' || q == '\'':
		for i++; ; i++ {
			switch {
			case i >= len(s) || s[i] == '\n':
				return false
			case s[i] == '\\' && q == '"':
				i++ // the escaped character
			case s[i] == q && q == '\'' && i+1 < len(s) && s[i+1] == '\'':
				i++
			case s[i] == q:
				i++
				for i < len(s) && s[i] == ' ' {
					i++
				}
				return i < len(s) && s[i] == ':' && p.blankAt(i+1)
			}
		}
	case !plainStart(s, i):
		return false
	}
	for ; i < len(s); i++ {
		switch s[i] {
		case '\n':
			return false
		case ':':
			if p.blankAt(i + 1) {
				return true
			}
		case '#':
			if s[i-1] == ' ' {
				return false
			}
		}
	}
	return false
}

// plainStart reports whether a plain scalar may begin at s[i]: not at an
// indicator, but "-" before a digit (a negative number).
func plainStart(s string, i int) bool {
	c := s[i]
	if c == '-' {
		return i+1 < len(s) && s[i+1] >= '0' && s[i+1] <= '9'
	}
	return !notPlain[c]
}

// notPlain marks the bytes a plain scalar cannot begin with.
var notPlain = func() (t [256]bool) {
	for _, c := range []byte("?:,[]{}#&*!|>'\"%@`\n ") {
		t[c] = true
	}
	return t
}()

// plain reads a one-line plain scalar, without its trailing spaces; it stops
// before a ": ", a " #" comment, the line's end, and in flow context before
// ",[]{}" too.
func (p *lite) plain(flow bool) string {
	start := p.pos
	if p.pos >= len(p.s) || !plainStart(p.s, p.pos) {
		bail() // an indicator, or empty
	}
	for ; p.pos < len(p.s); p.pos++ {
		switch p.s[p.pos] {
		case '\n':
			goto done
		case ':':
			if p.blankAt(p.pos + 1) {
				goto done
			}
			if flow {
				bail()
			}
		case '#':
			if p.s[p.pos-1] == ' ' {
				goto done
			}
		case ',', '[', ']', '{', '}', '?':
			if flow {
				goto done
			}
		}
	}
done:
	end := p.pos
	for end > start && p.s[end-1] == ' ' {
		end--
	}
	return p.s[start:end]
}

// quoted reads a one-line single- or double-quoted scalar (JSON's escapes
// only).
func (p *lite) quoted() string {
	q := p.s[p.pos]
	p.pos++
	start := p.pos
	var b []byte // only when there are escapes
	for {
		if p.pos >= len(p.s) || p.s[p.pos] == '\n' {
			bail() // unterminated, or folded over lines
		}
		c := p.s[p.pos]
		switch {
		case c == q && q == '\'' && p.pos+1 < len(p.s) && p.s[p.pos+1] == '\'':
			b = append(append(b, p.s[start:p.pos]...), '\'')
			p.pos += 2
			start = p.pos
			continue
		case c == q:
			s := p.s[start:p.pos]
			p.pos++
			if b != nil {
				return string(append(b, s...))
			}
			return s
		case c == '\\' && q == '"':
			b = append(b, p.s[start:p.pos]...)
			b = p.escape(b)
			start = p.pos
			continue
		}
		p.pos++
	}
}

// escape appends the character of the escape at pos and moves past it.
func (p *lite) escape(b []byte) []byte {
	if p.pos+1 >= len(p.s) {
		bail()
	}
	c := p.s[p.pos+1]
	p.pos += 2
	switch c {
	case '"', '\\', '/':
		return append(b, c)
	case 'b':
		return append(b, '\b')
	case 'f':
		return append(b, '\f')
	case 'n':
		return append(b, '\n')
	case 'r':
		return append(b, '\r')
	case 't':
		return append(b, '\t')
	case 'u':
		if p.pos+4 > len(p.s) {
			bail()
		}
		r, err := strconv.ParseUint(p.s[p.pos:p.pos+4], 16, 16)
		if err != nil || r >= 0xd800 && r < 0xe000 {
			bail() // surrogates: left to yaml.v3
		}
		p.pos += 4
		return utf8.AppendRune(b, rune(r))
	}
	bail()
	return nil
}

// flowSpace skips spaces, line ends and comments inside a flow collection;
// its lines must be indented more than bind.
func (p *lite) flowSpace(bind int) {
	for p.pos < len(p.s) {
		switch p.s[p.pos] {
		case ' ':
			p.pos++
		case '\n':
			p.pos++
			p.ls = p.pos
			p.spaces()
			if c := p.peek(); c != '\n' && c != '#' && c != 0 && p.col() <= bind {
				bail()
			}
		case '#':
			if c := p.s[p.pos-1]; c != ' ' && c != '\n' {
				bail()
			}
			p.toEOL()
		default:
			return
		}
	}
}

// flowValue begins a value in a flow collection.
func (p *lite) flowValue(bind int) val {
	p.flowSpace(bind)
	switch c := p.peek(); c {
	case '{':
		return val{kind: 'm', flow: true, bind: bind}
	case '[':
		return val{kind: 's', flow: true, bind: bind}
	case '"', '\'':
		return val{kind: 'v', text: p.quoted(), tag: tagStr}
	}
	s := p.plain(true)
	if p.peek() == '\n' { // a plain scalar may go on on the next line
		p.flowSpace(bind)
		if c := p.peek(); c != ',' && c != ']' && c != '}' {
			bail()
		}
	}
	return val{kind: 'v', text: s, tag: resolvePlain(s)}
}

func (p *lite) flowMapping(bind int, f func(string, slot)) {
	p.pos++ // '{'
	p.flowSpace(bind)
	if p.peek() == '}' {
		p.pos++
		return
	}
	for {
		var k string
		if c := p.peek(); c == '"' || c == '\'' {
			k = p.quoted() // JSON: the ':' may follow at once
			p.spaces()
			if p.peek() != ':' {
				bail()
			}
		} else {
			k = p.plain(true)
			if p.peek() != ':' || !p.blankAt(p.pos+1) {
				bail()
			}
		}
		if len(k) > 1000 || k == "<<" {
			bail()
		}
		p.pos++
		if c := p.peek(); c != ' ' && c != '\n' && c != '"' && c != '\'' && c != '{' && c != '[' && (c < '0' || c > '9') && c != '-' && c != 't' && c != 'f' && c != 'n' {
			bail() // JSON's values only right after ':'
		}
		f(k, slot{flow: true, ind: bind})
		p.flowSpace(bind)
		switch p.peek() {
		case ',':
			p.pos++
			p.flowSpace(bind)
			if p.peek() == '}' {
				bail()
			}
		case '}':
			p.pos++
			return
		default:
			bail()
		}
	}
}

func (p *lite) flowSequence(bind int, f func(slot)) {
	p.pos++ // '['
	p.flowSpace(bind)
	if p.peek() == ']' {
		p.pos++
		return
	}
	for {
		f(slot{flow: true, ind: bind})
		p.flowSpace(bind)
		switch p.peek() {
		case ',':
			p.pos++
			p.flowSpace(bind)
			if p.peek() == ']' {
				bail()
			}
		case ']':
			p.pos++
			return
		default:
			bail()
		}
	}
}

// resolvePlain returns the tag yaml.v3 gives the plain scalar s, or bails
// where the subset stops: only strings starting with a letter (and most
// other characters), decimal integers and Go durations are read.
func resolvePlain(s string) int {
	switch s {
	case "~", "null", "Null", "NULL":
		return tagNull
	case "true", "True", "TRUE", "false", "False", "FALSE":
		return tagBool
	}
	switch c := s[0]; {
	case c == '-' || c >= '0' && c <= '9':
		if isDecimal(s) {
			if len(s) <= 18 {
				return tagInt // below 10^18: an int64
			}
			if _, err := strconv.ParseInt(s, 10, 64); err == nil {
				return tagInt
			}
		} else if isDuration(s) {
			return tagStr
		}
		bail()
	case c == '.' || c == '+' || c == '<':
		bail() // floats, signs, merges
	}
	return tagStr
}

// isDecimal reports whether s is -?(0|[1-9][0-9]*).
func isDecimal(s string) bool {
	s = strings.TrimPrefix(s, "-")
	if s == "" || s[0] == '0' && len(s) > 1 {
		return false
	}
	for i := range len(s) {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// isDuration reports whether s is ([0-9]+(\.[0-9]+)?(ns|us|ms|s|m|h))+, a
// Go duration yaml.v3 reads as a string.
func isDuration(s string) bool {
	if s == "" {
		return false
	}
	for s != "" {
		i := 0
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			i++
		}
		if i == 0 {
			return false
		}
		if i < len(s) && s[i] == '.' {
			j := i + 1
			for j < len(s) && s[j] >= '0' && s[j] <= '9' {
				j++
			}
			if j == i+1 {
				return false
			}
			i = j
		}
		s = s[i:]
		switch {
		case strings.HasPrefix(s, "ns"), strings.HasPrefix(s, "us"), strings.HasPrefix(s, "ms"):
			s = s[2:]
		case strings.HasPrefix(s, "s"), strings.HasPrefix(s, "m"), strings.HasPrefix(s, "h"):
			s = s[1:]
		default:
			return false
		}
	}
	return true
}
