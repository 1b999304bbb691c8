// Package floor holds the one integer division the rate limiter's window
// model rests on: division rounded toward minus infinity, so that instants
// before 1970 (and negative offsets) still fall into aligned windows. The
// model itself lives in the root package's window.go.
package floor

// Div returns a / b rounded down, for b > 0: the number of the window of size
// b that holds the instant a, when windows are aligned on 0.
func Div(a, b int64) int64 {
	q := a / b
	if a%b < 0 {
		q--
	}
	return q
}
