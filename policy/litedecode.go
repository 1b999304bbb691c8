package policy

import (
	"strconv"
	"strings"
	"time"
)

// parseLite reads data with lite into a Document exactly as decoder reads
// yaml.v3's node tree, or reports false when lite bails (the document is
// outside the subset, or has a problem for yaml.v3 to report). The
// Document's Overrides are left nil: they are returned in the document's
// order instead (nil when the document has none), for build to read
// without a map and for overrideList.fill to put in the Document when it
// is asked for. A duplicate key is left to build to find.
func parseLite(data []byte) (doc *Document, ovs *overrideList, ok bool) {
	defer func() {
		if r := recover(); r != nil {
			if _, b := r.(bailout); !b {
				panic(r)
			}
			doc, ovs, ok = nil, nil, false
		}
	}()
	// One copy of the text backs every string of the Document. A CRLF line
	// break is a line break to YAML: it becomes LF (a lone CR stays, and
	// check bails on it).
	text := string(data)
	if strings.Contains(text, "\r\n") {
		text = strings.ReplaceAll(text, "\r\n", "\n")
	}
	d := &liteDecoder{p: lite{s: text}}
	d.p.check()
	doc = new(Document)
	d.document(d.p.root(), doc)
	d.p.end()
	return doc, d.overrides, true
}

// overrideList is a document's overrides in its order, in chunks (never
// copied as they grow).
type overrideList struct {
	chunks [][]override
	n      int
}

type override struct {
	key string
	t   Target
}

const overrideChunk = 4096

func (l *overrideList) add(o override) {
	if l.n%overrideChunk == 0 {
		l.chunks = append(l.chunks, make([]override, 0, overrideChunk))
	}
	c := &l.chunks[len(l.chunks)-1]
	*c = append(*c, o)
	l.n++
}

// all yields the overrides (for build).
func (l *overrideList) all(yield func(string, Target) bool) {
	for _, c := range l.chunks {
		for _, o := range c {
			if !yield(o.key, o.t) {
				return
			}
		}
	}
}

// fill sets doc.Overrides. The keys are distinct (build checked).
func (l *overrideList) fill(doc *Document) {
	doc.Overrides = make(map[string]Target, l.n)
	for k, t := range l.all {
		doc.Overrides[k] = t
	}
}

// liteDecoder is decoder's twin over lite: same fields, same types, same
// treatment of nulls; anything decoder would report, it bails on.
type liteDecoder struct {
	p         lite
	scratch   []Limit
	slab      []Limit // backs the Limits of many targets
	overrides *overrideList
	lastDur   string // the last duration read, and its value
	lastDurV  Duration
}

// fields reads the mapping v, calling f with each key; f returns the
// field's number (below 16) for the duplicate check, or -1 for an unknown
// field.
func (d *liteDecoder) fields(v val, f func(key string, sl slot) int) {
	var seen uint16
	d.p.mapping(v, func(k string, sl slot) {
		i := f(k, sl)
		if i < 0 || seen&(1<<i) != 0 {
			bail()
		}
		seen |= 1 << i
	})
}

func (d *liteDecoder) scalar(sl slot) val {
	v := d.p.value(sl)
	if v.kind != 'v' {
		bail()
	}
	return v
}

// str is decoder.str: a string, or a null's text.
func (d *liteDecoder) str(sl slot) string {
	v := d.scalar(sl)
	if v.tag != tagStr && v.tag != tagNull {
		bail()
	}
	return v.text
}

func (d *liteDecoder) int(sl slot, out *int64) {
	v := d.scalar(sl)
	switch v.tag {
	case tagNull:
	case tagInt:
		n, err := strconv.ParseInt(v.text, 10, 64)
		if err != nil {
			bail()
		}
		*out = n
	default:
		bail()
	}
}

func (d *liteDecoder) bool(sl slot, out *bool) {
	v := d.scalar(sl)
	switch v.tag {
	case tagNull:
	case tagBool:
		*out = v.text[0] == 't' || v.text[0] == 'T'
	default:
		bail()
	}
}

func (d *liteDecoder) duration(sl slot, out *Duration) {
	v := d.scalar(sl)
	switch v.tag {
	case tagNull:
	case tagStr:
		if v.text != d.lastDur { // most windows are alike
			t, err := time.ParseDuration(v.text)
			if err != nil {
				bail()
			}
			d.lastDur, d.lastDurV = v.text, Duration(t)
		}
		*out = d.lastDurV
	default:
		bail()
	}
}

func (d *liteDecoder) strings(sl slot, out *[]string) {
	v := d.p.value(sl)
	if v.null() {
		return
	}
	*out = []string{}
	d.p.sequence(v, func(sl slot) { *out = append(*out, d.str(sl)) })
}

func (d *liteDecoder) document(v val, doc *Document) {
	d.fields(v, func(k string, sl slot) int {
		switch k {
		case "default":
			if v := d.p.value(sl); !v.null() {
				doc.Default = new(Target)
				d.target(v, doc.Default)
			}
			return 0
		case "rules":
			if v := d.p.value(sl); !v.null() {
				doc.Rules = []Rule{}
				d.p.sequence(v, func(sl slot) {
					doc.Rules = append(doc.Rules, Rule{})
					d.rule(d.p.value(sl), &doc.Rules[len(doc.Rules)-1])
				})
			}
			return 1
		case "overrides":
			if v := d.p.value(sl); !v.null() {
				d.overrides = new(overrideList)
				d.p.mapping(v, func(k string, sl slot) {
					var t Target
					d.target(d.p.value(sl), &t)
					d.overrides.add(override{k, t})
				})
			}
			return 2
		case "allow":
			d.strings(sl, &doc.Allow)
			return 3
		case "deny":
			if v := d.p.value(sl); !v.null() {
				doc.Deny = new(DenyList)
				d.fields(v, func(k string, sl slot) int {
					switch k {
					case "keys":
						d.strings(sl, &doc.Deny.Keys)
						return 0
					case "status":
						var s int64
						d.int(sl, &s)
						doc.Deny.Status = int(max(min(s, 1<<20), -1))
						return 1
					}
					return -1
				})
			}
			return 4
		case "escalation":
			if v := d.p.value(sl); !v.null() {
				e := new(Escalation)
				doc.Escalation = e
				d.fields(v, func(k string, sl slot) int {
					switch k {
					case "strike_window":
						d.duration(sl, &e.StrikeWindow)
						return 0
					case "max_cooldown":
						d.duration(sl, &e.MaxCooldown)
						return 1
					case "deny_after":
						d.int(sl, &e.DenyAfter)
						return 2
					case "deny_for":
						d.duration(sl, &e.DenyFor)
						return 3
					}
					return -1
				})
			}
			return 5
		}
		return -1
	})
}

func (d *liteDecoder) rule(v val, r *Rule) {
	d.fields(v, func(k string, sl slot) int {
		switch k {
		case "id":
			r.ID = d.str(sl)
			return 0
		case "version":
			d.int(sl, &r.Version)
			return 1
		case "match":
			d.fields(d.p.value(sl), func(k string, sl slot) int {
				switch k {
				case "route":
					r.Match.Route = d.str(sl)
					return 0
				case "key":
					r.Match.Key = d.str(sl)
					return 1
				case "tier":
					r.Match.Tier = d.str(sl)
					return 2
				}
				return -1
			})
			return 2
		case "limits":
			d.limits(sl, &r.Limits)
			return 3
		case "cost":
			d.int(sl, &r.Cost)
			return 4
		case "shadow":
			d.bool(sl, &r.Shadow)
			return 5
		}
		return -1
	})
}

func (d *liteDecoder) target(v val, t *Target) {
	d.fields(v, func(k string, sl slot) int {
		switch k {
		case "limits":
			d.limits(sl, &t.Limits)
			return 0
		case "cost":
			d.int(sl, &t.Cost)
			return 1
		}
		return -1
	})
}

// limits reads a sequence of limits into scratch, then into a slice of the
// slab of exactly their number: one allocation serves many targets.
func (d *liteDecoder) limits(sl slot, out *[]Limit) {
	v := d.p.value(sl)
	if v.null() {
		return
	}
	ls := d.scratch[:0]
	d.p.sequence(v, func(sl slot) {
		ls = append(ls, Limit{})
		l := &ls[len(ls)-1]
		d.fields(d.p.value(sl), func(k string, sl slot) int {
			switch k {
			case "window":
				d.duration(sl, &l.Window)
				return 0
			case "max":
				d.int(sl, &l.Max)
				return 1
			case "fixed":
				d.bool(sl, &l.Fixed)
				return 2
			case "penalty":
				d.bool(sl, &l.Penalty)
				return 3
			case "name":
				l.Name = d.str(sl)
				return 4
			case "algorithm":
				l.Algorithm = d.str(sl)
				return 5
			case "burst":
				d.int(sl, &l.Burst)
				return 6
			}
			return -1
		})
	})
	d.scratch = ls
	if len(ls) == 0 {
		*out = []Limit{}
		return
	}
	if cap(d.slab)-len(d.slab) < len(ls) {
		d.slab = make([]Limit, 0, max(256, len(ls)))
	}
	n := len(d.slab)
	d.slab = append(d.slab, ls...)
	*out = d.slab[n : n+len(ls) : n+len(ls)]
}
