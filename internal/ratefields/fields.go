package ratefields

import (
	"fmt"
	"strconv"
	"unsafe"

	"github.com/dunglas/httpsfv"

	"github.com/ratesync/ratelimit"
)

// Fields are a rule's rate-limit fields, computed once when the rule is
// compiled: the RateLimit-Policy value, and what the RateLimit value of each
// decision is made of. The zero Fields are those of a rule without limits.
type Fields struct {
	// Policy is the RateLimit-Policy value: an item per limit, its name
	// with the q and w parameters.
	Policy string
	// Names are the limits' names as structured-field strings, in the
	// order of the limits.
	Names []string
	// MaxLen is the length of the longest RateLimit value Value or Append
	// can make.
	MaxLen int
}

// maxValueLen is what a RateLimit value adds to its limit's name at most:
// the r and t parameters, each with an integer of up to 15 digits
// (MaxInteger).
const maxValueLen = len(";r=;t=") + 2*len("999999999999999")

// Build returns the fields of limits, advertised with the quota and window
// Quota gives: q is the quota, at most MaxInteger, and w the window in
// seconds (WindowSeconds). It fails only on a limit whose name is not a
// valid structured-field string.
func Build(limits []ratelimit.Limit) (Fields, error) {
	var f Fields
	policy := make(httpsfv.List, 0, len(limits))
	for _, l := range limits {
		name := l.PolicyName()
		item := httpsfv.NewItem(name)
		s, err := httpsfv.Marshal(item)
		if err != nil {
			return Fields{}, fmt.Errorf("policy name %q: %w", name, err)
		}
		f.Names = append(f.Names, s)
		f.MaxLen = max(f.MaxLen, len(s)+maxValueLen)
		q, w := Quota(l)
		item.Params.Add("q", min(q, MaxInteger))
		item.Params.Add("w", WindowSeconds(w))
		policy = append(policy, item)
	}
	s, err := httpsfv.Marshal(policy)
	if err != nil {
		return Fields{}, fmt.Errorf("RateLimit-Policy: %w", err)
	}
	f.Policy = s
	return f, nil
}

// Append appends to b the RateLimit value of decision d, whose binding limit
// is the i-th: the limit's name with r, the remaining quota, and t, the
// seconds until the quota is whole again, both at most MaxInteger. The r
// parameter's value is out[r0:r1].
func (f *Fields) Append(b []byte, i int, d ratelimit.Decision) (out []byte, r0, r1 int) {
	b = append(b, f.Names[i]...)
	b = append(b, ";r="...)
	r0 = len(b)
	b = strconv.AppendInt(b, min(d.Remaining, MaxInteger), 10)
	r1 = len(b)
	b = append(b, ";t="...)
	return strconv.AppendInt(b, min(CeilSeconds(d.Reset), MaxInteger), 10), r0, r1
}

// Value returns the RateLimit value of decision d, whose binding limit is
// the i-th (see Append), and the bounds of r's value in it. It is built in
// spare when spare has a capacity of MaxLen bytes, else in a new string:
// spare is the unused tail of a buffer the caller allocated anyway, whose
// bytes nothing else will write, since the string returned is made of them.
func (f *Fields) Value(i int, d ratelimit.Decision, spare []byte) (v string, r0, r1 int) {
	if cap(spare) >= f.MaxLen {
		b, r0, r1 := f.Append(spare[:0], i, d)
		return unsafe.String(unsafe.SliceData(b), len(b)), r0, r1 // bytes written once, never again
	}
	var buf [96]byte
	b, r0, r1 := f.Append(buf[:0], i, d)
	return string(b), r0, r1
}
