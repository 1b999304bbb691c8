package policy

import (
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// decoder turns a parsed YAML (or JSON) node tree into a Document, strictly:
// unknown fields, duplicate keys, wrong kinds, bad numbers and durations,
// anchors and aliases are errors naming their line. It replaces yaml.v3's
// own decoder, whose duplicate-key check is quadratic in a mapping's size
// (36 s for 100,000 overrides).
type decoder struct {
	p    *problems
	rule string // id of the rule being decoded
}

func (d *decoder) errorf(n *yaml.Node, field, format string, args ...any) {
	if field == "" {
		field = "document"
	}
	d.p.addAt(n.Line, d.rule, field, format, args...)
}

// fields calls f for each key of the mapping n, reporting duplicate keys and
// the keys f does not know (f returns false). typ names the mapping's type in
// messages.
func (d *decoder) fields(n *yaml.Node, path, typ string, f func(key string, v *yaml.Node) bool) {
	if !d.kind(n, path, yaml.MappingNode, "a mapping") {
		return
	}
	var seen map[string]bool
	if len(n.Content) > 16 {
		seen = make(map[string]bool, len(n.Content)/2)
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if !d.kind(k, path, yaml.ScalarNode, "a scalar key") {
			continue
		}
		dup := false
		if seen != nil {
			dup = seen[k.Value]
			seen[k.Value] = true
		} else {
			for j := 0; j < i; j += 2 {
				dup = dup || n.Content[j].Value == k.Value
			}
		}
		kp := join(path, k.Value)
		if dup {
			d.errorf(k, kp, "mapping key %q is already defined", k.Value)
			continue
		}
		if !f(k.Value, v) {
			d.errorf(k, kp, "field %s is unknown in %s", k.Value, typ)
		}
	}
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// kind checks n's kind; aliases are refused (a document has no use for them
// and they can expand exponentially).
func (d *decoder) kind(n *yaml.Node, path string, want yaml.Kind, what string) bool {
	switch {
	case n.Kind == yaml.AliasNode:
		d.errorf(n, path, "anchors and aliases are not supported")
		return false
	case n.Anchor != "":
		d.errorf(n, path, "anchors and aliases are not supported")
		return false
	case n.Kind != want:
		d.errorf(n, path, "want %s, not %s", what, describe(n))
		return false
	}
	return true
}

func isNull(n *yaml.Node) bool {
	return n.Kind == yaml.ScalarNode && n.Tag == "!!null"
}

func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a sequence"
	case yaml.ScalarNode:
		return strings.TrimPrefix(n.Tag, "!!") + " " + shortValue(n)
	}
	return "an alias"
}

func (d *decoder) str(n *yaml.Node, path string, out *string) {
	if !d.kind(n, path, yaml.ScalarNode, "a string") {
		return
	}
	if n.Tag != "!!str" && !isNull(n) {
		d.errorf(n, path, "want a string, not %s (quote it)", describe(n))
		return
	}
	*out = n.Value
}

func (d *decoder) int(n *yaml.Node, path string, out *int64) {
	if !d.kind(n, path, yaml.ScalarNode, "an integer") || isNull(n) {
		return
	}
	v, err := strconv.ParseInt(n.Value, 0, 64)
	if n.Tag != "!!int" || err != nil {
		d.errorf(n, path, "want an integer, not %s", describe(n))
		return
	}
	*out = v
}

func (d *decoder) bool(n *yaml.Node, path string, out *bool) {
	if !d.kind(n, path, yaml.ScalarNode, "a boolean") || isNull(n) {
		return
	}
	v, err := strconv.ParseBool(strings.ToLower(n.Value))
	if n.Tag != "!!bool" || err != nil {
		d.errorf(n, path, "want true or false, not %s", describe(n))
		return
	}
	*out = v
}

func (d *decoder) duration(n *yaml.Node, path string, out *Duration) {
	if !d.kind(n, path, yaml.ScalarNode, "a duration") || isNull(n) {
		return
	}
	if n.Tag != "!!str" {
		d.errorf(n, path, "bad duration %s: want a string such as \"1m\"", shortValue(n))
		return
	}
	v, err := time.ParseDuration(n.Value)
	if err != nil {
		d.errorf(n, path, "bad duration %q: want a Go duration such as \"1m\" or \"1h30m\"", n.Value)
		return
	}
	*out = Duration(v)
}

func (d *decoder) strings(n *yaml.Node, path string, out *[]string) {
	if isNull(n) || !d.kind(n, path, yaml.SequenceNode, "a sequence of strings") {
		return
	}
	*out = make([]string, len(n.Content))
	for i, c := range n.Content {
		d.str(c, path+"["+strconv.Itoa(i)+"]", &(*out)[i])
	}
}

func (d *decoder) document(n *yaml.Node, doc *Document) {
	d.fields(n, "", "Document", func(k string, v *yaml.Node) bool {
		switch k {
		case "default":
			if !isNull(v) {
				doc.Default = new(Target)
				d.target(v, "default", doc.Default)
			}
		case "rules":
			if isNull(v) || !d.kind(v, "rules", yaml.SequenceNode, "a sequence of rules") {
				return true
			}
			doc.Rules = make([]Rule, len(v.Content))
			for i, c := range v.Content {
				d.rule = ruleID(c)
				d.ruleDoc(c, "rules["+strconv.Itoa(i)+"]", &doc.Rules[i])
				d.rule = ""
			}
		case "overrides":
			if isNull(v) || !d.kind(v, "overrides", yaml.MappingNode, "a mapping of keys to limits") {
				return true
			}
			doc.Overrides = make(map[string]Target, len(v.Content)/2)
			seen := make(map[string]bool, len(v.Content)/2)
			for i := 0; i+1 < len(v.Content); i += 2 {
				kn, vn := v.Content[i], v.Content[i+1]
				p := "overrides[" + strconv.Quote(kn.Value) + "]"
				if !d.kind(kn, p, yaml.ScalarNode, "a key") {
					continue
				}
				if seen[kn.Value] {
					d.errorf(kn, p, "mapping key %q is already defined", kn.Value)
					continue
				}
				seen[kn.Value] = true
				var t Target
				d.target(vn, p, &t)
				doc.Overrides[kn.Value] = t
			}
		case "allow":
			d.strings(v, "allow", &doc.Allow)
		case "deny":
			if isNull(v) {
				return true
			}
			doc.Deny = new(DenyList)
			d.fields(v, "deny", "DenyList", func(k string, v *yaml.Node) bool {
				switch k {
				case "keys":
					d.strings(v, "deny.keys", &doc.Deny.Keys)
				case "status":
					var s int64
					d.int(v, "deny.status", &s)
					doc.Deny.Status = int(max(min(s, 1<<20), -1))
				default:
					return false
				}
				return true
			})
		case "escalation":
			if isNull(v) {
				return true
			}
			e := new(Escalation)
			doc.Escalation = e
			d.fields(v, "escalation", "Escalation", func(k string, v *yaml.Node) bool {
				p := "escalation." + k
				switch k {
				case "strike_window":
					d.duration(v, p, &e.StrikeWindow)
				case "max_cooldown":
					d.duration(v, p, &e.MaxCooldown)
				case "deny_after":
					d.int(v, p, &e.DenyAfter)
				case "deny_for":
					d.duration(v, p, &e.DenyFor)
				default:
					return false
				}
				return true
			})
		default:
			return false
		}
		return true
	})
}

// ruleID is the id a rule node declares, for error messages.
func ruleID(n *yaml.Node) string {
	if n.Kind != yaml.MappingNode {
		return ""
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == "id" && n.Content[i+1].Kind == yaml.ScalarNode {
			return n.Content[i+1].Value
		}
	}
	return ""
}

func (d *decoder) ruleDoc(n *yaml.Node, path string, r *Rule) {
	d.fields(n, path, "Rule", func(k string, v *yaml.Node) bool {
		p := path + "." + k
		switch k {
		case "id":
			d.str(v, p, &r.ID)
		case "version":
			d.int(v, p, &r.Version)
		case "match":
			d.fields(v, p, "Match", func(k string, v *yaml.Node) bool {
				switch k {
				case "route":
					d.str(v, p+".route", &r.Match.Route)
				case "key":
					d.str(v, p+".key", &r.Match.Key)
				case "tier":
					d.str(v, p+".tier", &r.Match.Tier)
				default:
					return false
				}
				return true
			})
		case "limits":
			d.limits(v, p, &r.Limits)
		case "cost":
			d.int(v, p, &r.Cost)
		case "shadow":
			d.bool(v, p, &r.Shadow)
		default:
			return false
		}
		return true
	})
}

func (d *decoder) target(n *yaml.Node, path string, t *Target) {
	d.fields(n, path, "Target", func(k string, v *yaml.Node) bool {
		switch k {
		case "limits":
			d.limits(v, path+".limits", &t.Limits)
		case "cost":
			d.int(v, path+".cost", &t.Cost)
		default:
			return false
		}
		return true
	})
}

func (d *decoder) limits(n *yaml.Node, path string, out *[]Limit) {
	if isNull(n) || !d.kind(n, path, yaml.SequenceNode, "a sequence of limits") {
		return
	}
	*out = make([]Limit, len(n.Content))
	for i, c := range n.Content {
		l := &(*out)[i]
		p := path + "[" + strconv.Itoa(i) + "]"
		d.fields(c, p, "Limit", func(k string, v *yaml.Node) bool {
			switch k {
			case "window":
				d.duration(v, p+".window", &l.Window)
			case "max":
				d.int(v, p+".max", &l.Max)
			case "algorithm":
				d.str(v, p+".algorithm", &l.Algorithm)
			case "burst":
				d.int(v, p+".burst", &l.Burst)
			case "fixed":
				d.bool(v, p+".fixed", &l.Fixed)
			case "penalty":
				d.bool(v, p+".penalty", &l.Penalty)
			case "name":
				d.str(v, p+".name", &l.Name)
			default:
				return false
			}
			return true
		})
	}
}
