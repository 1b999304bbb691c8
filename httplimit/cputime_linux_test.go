package httplimit_test

import (
	"syscall"
	"time"
)

// threadTime returns the CPU time the calling OS thread has used: unlike
// the wall clock, it does not run while other jobs hold the CPU.
func threadTime() time.Duration {
	const rusageThread = 1 // RUSAGE_THREAD
	var ru syscall.Rusage
	if err := syscall.Getrusage(rusageThread, &ru); err != nil {
		panic(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
