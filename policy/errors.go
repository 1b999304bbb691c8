package policy

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// ErrInvalid is wrapped by every error Parse and Compile return for a
// document that is not a valid policy; each such error is an *Error that
// names where the problem is.
var ErrInvalid = errors.New("policy: invalid document")

// Error is one problem in a document: where it is (the line, when the
// document has lines, the rule and the field) and what is wrong.
type Error struct {
	// Line is the 1-based line of the offending node; 0 when unknown (a
	// document built in Go, or a fault of the whole document).
	Line int
	// Rule is the id of the rule the problem is in, or "" outside rules.
	Rule string
	// Field is the path of the offending field, for example
	// "rules[2].limits[0].window", or "document" for the whole document.
	Field string
	// Msg says what is wrong.
	Msg string
}

// Error formats the problem as "policy: line L: rule "id": field: msg".
func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("policy: ")
	if e.Line > 0 {
		b.WriteString("line ")
		b.WriteString(strconv.Itoa(e.Line))
		b.WriteString(": ")
	}
	if e.Rule != "" {
		b.WriteString("rule ")
		b.WriteString(strconv.Quote(e.Rule))
		b.WriteString(": ")
	}
	b.WriteString(e.Field)
	b.WriteString(": ")
	b.WriteString(e.Msg)
	return b.String()
}

// Unwrap makes errors.Is(err, ErrInvalid) true.
func (e *Error) Unwrap() error { return ErrInvalid }

// maxErrors bounds how many problems one Parse reports.
const maxErrors = 20

// problems collects the errors of one document.
type problems struct {
	errs []*Error
}

func (p *problems) add(rule, field, format string, args ...any) {
	p.addAt(0, rule, field, format, args...)
}

func (p *problems) addAt(line int, rule, field, format string, args ...any) {
	if len(p.errs) < maxErrors {
		p.errs = append(p.errs, &Error{Line: line, Rule: rule, Field: field, Msg: fmt.Sprintf(format, args...)})
	}
}

// err joins the problems, or is nil without any.
func (p *problems) err() error {
	if len(p.errs) == 0 {
		return nil
	}
	errs := make([]error, len(p.errs))
	for i, e := range p.errs {
		errs[i] = e
	}
	return errors.Join(errs...)
}

// Errors returns the *Error values err holds (one, or several joined).
func Errors(err error) []*Error {
	var out []*Error
	var walk func(error)
	walk = func(err error) {
		if err == nil {
			return
		}
		if e, ok := err.(*Error); ok {
			out = append(out, e)
			return
		}
		if j, ok := err.(interface{ Unwrap() []error }); ok {
			for _, e := range j.Unwrap() {
				walk(e)
			}
			return
		}
		walk(errors.Unwrap(err))
	}
	walk(err)
	return out
}
