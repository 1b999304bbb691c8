//go:build linux

package cputime

import (
	"syscall"
	"time"
)

// Thread returns the CPU time the calling OS thread has used. Callers lock
// their goroutine to its thread (runtime.LockOSThread) around a measure.
func Thread() time.Duration {
	const rusageThread = 1 // RUSAGE_THREAD
	var ru syscall.Rusage
	if err := syscall.Getrusage(rusageThread, &ru); err != nil {
		panic(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
