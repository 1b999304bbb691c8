package httplimit

import (
	"net/netip"
	"strings"
)

// hopWalk walks forwarding entries from the right (the nearest hop) to the
// left. client is the last address a trusted hop vouched for; the walk goes
// on only while that address is itself a trusted proxy.
type hopWalk struct {
	o      *IPOptions
	client netip.Addr
	hops   int
}

// hop takes the next entry to the left and reports whether the walk goes on.
// An entry that is not an address ("unknown", "_hidden", garbage, or "" for
// an element that could not be parsed) ends the walk: the hop that reported
// it is the client.
func (w *hopWalk) hop(entry string) bool {
	w.hops++
	a, ok := parseAddr(strings.Trim(entry, " \t"))
	if !ok {
		return false
	}
	w.client = a
	return w.o.trusted(a) && w.hops < maxHops
}

// xffHops walks one X-Forwarded-For line from right to left and reports
// whether the walk goes on past its leftmost entry.
func xffHops(line string, w *hopWalk) bool {
	for {
		i := strings.LastIndexByte(line, ',')
		if !w.hop(line[i+1:]) {
			return false
		}
		if i < 0 {
			return true
		}
		line = line[:i]
	}
}

// forwardedHops walks one Forwarded line (RFC 7239) from right to left, one
// element at a time, and reports whether the walk goes on past its leftmost
// element.
//
// Reading from the right is what makes the header safe to trust: the trusted
// proxies' elements are the rightmost ones and well formed, so they are
// parsed completely before a single byte the client wrote is looked at. A
// client's malformed part (an unterminated quote, a stray backslash) cannot
// swallow or reinterpret an element appended after it, as it can when the
// line is read from the left. An element that is not well formed yields ""
// and ends the walk, so the key is the last address a trusted proxy reported.
func forwardedHops(line string, w *hopWalk) bool {
	for line != "" {
		rest, forValue, pairs, ok := lastForwardedElement(line)
		if !ok {
			return w.hop("")
		}
		// An empty element (", ,") is allowed by the list rule and names no hop.
		if pairs > 0 && !w.hop(forValue) {
			return false
		}
		line = rest
	}
	return true
}

// lastForwardedElement parses the last element of s, read from its end:
//
//	element = [ pair ] *( OWS ";" OWS [ pair ] )
//	pair    = name "=" ( value / quoted-string )
//
// elements being separated by "," with optional whitespace. It returns what
// is left of the element's separating comma, the element's for= value, the
// number of pairs, and false if the element is malformed: a pair without
// "=", an empty name or value, an unterminated or escaped quote, bytes after
// a quoted string, or for= twice.
func lastForwardedElement(s string) (rest, forValue string, pairs int, ok bool) {
	i, hasFor := len(s), false
	for {
		i = skipOWSLeft(s, i)
		if i == 0 {
			return "", forValue, pairs, true
		}
		switch s[i-1] {
		case ',':
			return s[:i-1], forValue, pairs, true
		case ';':
			i--
			continue
		}
		var value string
		if s[i-1] == '"' {
			open := openingQuote(s, i-1)
			if open < 0 {
				return "", "", 0, false
			}
			value, i = unquote(s[open+1:i-1]), open
		} else {
			j := i
			for j > 0 && plainByte(s[j-1]) {
				j--
			}
			if j == i {
				return "", "", 0, false
			}
			value, i = s[j:i], j
		}
		i = skipOWSLeft(s, i)
		if i == 0 || s[i-1] != '=' {
			return "", "", 0, false
		}
		i = skipOWSLeft(s, i-1)
		j := i
		for j > 0 && plainByte(s[j-1]) {
			j--
		}
		if j == i {
			return "", "", 0, false
		}
		name := s[j:i]
		i = skipOWSLeft(s, j)
		if i > 0 && s[i-1] != ';' && s[i-1] != ',' {
			return "", "", 0, false // e.g. `"a"x=1` or `a b=1`
		}
		pairs++
		if strings.EqualFold(name, "for") {
			if hasFor {
				return "", "", 0, false
			}
			forValue, hasFor = value, true
		}
	}
}

// openingQuote returns the index of the quote that opens the quoted string
// whose closing quote is at s[end], or -1 if there is none or the closing
// quote is escaped. A quote is escaped when an odd number of backslashes
// precede it; backslashes are not allowed outside quoted strings, so counting
// them gives the same reading from the right as from the left.
func openingQuote(s string, end int) int {
	if backslashesBefore(s, end)%2 == 1 {
		return -1
	}
	for i := end - 1; i >= 0; i-- {
		if s[i] == '"' && backslashesBefore(s, i)%2 == 0 {
			if backslashesBefore(s, i) > 0 {
				return -1 // a backslash outside a quoted string
			}
			return i
		}
	}
	return -1
}

func backslashesBefore(s string, i int) int {
	n := 0
	for i > 0 && s[i-1] == '\\' {
		n++
		i--
	}
	return n
}

// unquote removes the backslash escapes of a quoted string's content.
func unquote(s string) string {
	if strings.IndexByte(s, '\\') < 0 {
		return s
	}
	b := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+1 < len(s) {
			i++
		}
		b = append(b, s[i])
	}
	return string(b)
}

func skipOWSLeft(s string, i int) int {
	for i > 0 && (s[i-1] == ' ' || s[i-1] == '\t') {
		i--
	}
	return i
}

// plainByte reports whether c may appear in a name or an unquoted value. It
// is more lenient than RFC 7239's token (it admits ':' and brackets, which
// some proxies send unquoted) but never admits a delimiter, a quote or a
// backslash, so the element structure stays unambiguous.
func plainByte(c byte) bool {
	return c > ' ' && c < 0x7f && c != '"' && c != '\\' && c != ';' && c != ',' && c != '='
}
