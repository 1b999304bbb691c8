package httplimit

// Compiled reports whether the entries of the snapshot in force have been
// compiled (in the background, after the first request that saw it).
func (l *PolicyLimiter) Compiled() bool {
	p := l.prep.Load()
	return p != nil && p.snap == l.src.Load()
}
