package httplimit

import "unsafe"

// Compiled reports whether the entries of the snapshot in force have been
// compiled (in the background, after the first request that saw it).
func (l *PolicyLimiter) Compiled() bool {
	p := l.prep.Load()
	return p != nil && p.snap == l.src.Load()
}

// EntryRuleSize is the size of a compiled policy entry, which a request to
// one of many rules reads: one cache line.
const EntryRuleSize = unsafe.Sizeof(entryRule{})
