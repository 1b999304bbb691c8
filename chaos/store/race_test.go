//go:build race

package store

// raceEnabled reports whether the race detector is on.
const raceEnabled = true
