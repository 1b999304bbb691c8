// Package cputime reads the CPU time of the calling OS thread, for
// benchmarks that compare variants in turns on a shared machine: unlike the
// wall clock, a thread's CPU time does not run while other jobs hold the CPU.
package cputime
