// Package ratefields holds what httplimit and grpclimit compute alike of
// a rule: its limits checked against the namespace that counts them, the
// value of its RateLimit-Policy field and the makings of its RateLimit field
// (draft-ietf-httpapi-ratelimit-headers, as structured fields of RFC 9651),
// and the checks of the options their NewWithPolicy share. httplimit sends
// the fields as HTTP headers, grpclimit as response header metadata; both
// format them here, so their values are the same.
package ratefields
