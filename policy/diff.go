package policy

import (
	"encoding/json"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strconv"
)

// Diff lists what changes from document a to document b, one line per
// change, in a stable order: "+" added, "-" removed, "~" changed, each with
// what it is (default, rule "id", override "key", allow "glob", deny
// "glob", deny.status, escalation) and, for a change, the old and new values.
// Equal documents give no lines.
func Diff(a, b *Document) []string {
	var out []string
	line := func(sign, what string, old, new any) {
		switch sign {
		case "~":
			out = append(out, fmt.Sprintf("~ %s: %s -> %s", what, render(old), render(new)))
		case "+":
			out = append(out, fmt.Sprintf("+ %s: %s", what, render(new)))
		default:
			out = append(out, fmt.Sprintf("- %s: %s", what, render(old)))
		}
	}
	pair := func(what string, old, new any, oldSet, newSet bool) {
		switch {
		case oldSet && newSet && !reflect.DeepEqual(old, new):
			line("~", what, old, new)
		case oldSet && !newSet:
			line("-", what, old, nil)
		case !oldSet && newSet:
			line("+", what, nil, new)
		}
	}
	pair("default", a.Default, b.Default, a.Default != nil, b.Default != nil)
	ra, rb := rulesByID(a.Rules), rulesByID(b.Rules)
	for _, id := range slices.Sorted(maps.Keys(union(ra, rb))) {
		x, okx := ra[id]
		y, oky := rb[id]
		pair("rule "+strconv.Quote(id), x, y, okx, oky)
	}
	for _, k := range slices.Sorted(maps.Keys(union(a.Overrides, b.Overrides))) {
		x, okx := a.Overrides[k]
		y, oky := b.Overrides[k]
		pair("override "+strconv.Quote(k), x, y, okx, oky)
	}
	setDiff := func(what string, x, y []string) {
		sx, sy := set(x), set(y)
		for _, g := range slices.Sorted(maps.Keys(union(sx, sy))) {
			switch {
			case sx[g] && !sy[g]:
				out = append(out, "- "+what+" "+strconv.Quote(g))
			case !sx[g] && sy[g]:
				out = append(out, "+ "+what+" "+strconv.Quote(g))
			}
		}
	}
	setDiff("allow", a.Allow, b.Allow)
	da, db := a.Deny, b.Deny
	if da == nil {
		da = &DenyList{}
	}
	if db == nil {
		db = &DenyList{}
	}
	setDiff("deny", da.Keys, db.Keys)
	pair("deny.status", da.Status, db.Status, da.Status != 0, db.Status != 0)
	pair("escalation", a.Escalation, b.Escalation, a.Escalation != nil, b.Escalation != nil)
	return out
}

func render(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return string(b)
}

func rulesByID(rs []Rule) map[string]Rule {
	m := make(map[string]Rule, len(rs))
	for _, r := range rs {
		m[r.ID] = r
	}
	return m
}

func union[V any](a, b map[string]V) map[string]bool {
	u := make(map[string]bool, len(a)+len(b))
	for k := range a {
		u[k] = true
	}
	for k := range b {
		u[k] = true
	}
	return u
}

func set(xs []string) map[string]bool {
	m := make(map[string]bool, len(xs))
	for _, x := range xs {
		m[x] = true
	}
	return m
}
