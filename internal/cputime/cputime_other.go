//go:build !linux

package cputime

import "time"

var start = time.Now()

// Thread returns the time since the program began: the wall clock, as the
// thread's CPU time is read on Linux only.
func Thread() time.Duration { return time.Since(start) }
