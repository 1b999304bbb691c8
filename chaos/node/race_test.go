//go:build race

package node

// raceEnabled scales the heavy scenarios down under the race detector, which
// makes every memory access several times slower.
const raceEnabled = true
