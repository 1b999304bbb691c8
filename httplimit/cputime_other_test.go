//go:build !linux

package httplimit_test

import "time"

var start = time.Now()

// threadTime returns the time since the test began (the wall clock: the
// thread's CPU time is read on Linux only).
func threadTime() time.Duration { return time.Since(start) }
