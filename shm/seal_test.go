package shm

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestAddWindowsOpen: one call counts, judges and takes a rejected count
// back; with ifHeld it does nothing for a key not held; sealed, it counts
// nothing.
func TestAddWindowsOpen(t *testing.T) {
	tb := newTable(t, Options{Sizes: []time.Duration{time.Second, time.Minute}, Track: true})
	const now = 1_000_000
	v := [2]int64{2, 2}
	admit := func([2]View) bool { return true }
	reject := func([2]View) bool { return false }

	_, _, held, open := tb.AddWindowsOpen("k", now, 3, v, false, true, true, admit)
	require.True(t, open)
	require.False(t, held, "ifHeld: nothing for a key not held")
	require.Zero(t, tb.Len())

	out, ok, held, open := tb.AddWindowsOpen("k", now, 3, v, false, false, true, admit)
	require.True(t, ok && held && open)
	require.Equal(t, int64(2), out[0].Cur)
	require.Equal(t, int64(2), out[1].Cur)

	var seen [2]View
	out, ok, _, _ = tb.AddWindowsOpen("k", now, 3, v, false, true, true, func(vs [2]View) bool { seen = vs; return false })
	require.False(t, ok)
	require.Equal(t, int64(4), seen[0].Cur, "judged with the count")
	require.Equal(t, int64(2), out[0].Cur, "rejected: taken back")
	require.Equal(t, int64(2), out[1].Cur)

	out, ok, _, _ = tb.AddWindowsOpen("k", now, 3, v, true, true, true, reject)
	require.False(t, ok)
	require.Equal(t, int64(2), out[0].Cur, "a peek counts nothing, and takes nothing back")
	require.Equal(t, int64(2), tb.Peek("k", 0, now).Cur)

	tb.Seal()
	for _, ifHeld := range []bool{false, true} {
		_, ok, _, open = tb.AddWindowsOpen("k", now, 3, v, false, ifHeld, true, admit)
		require.False(t, ok || open)
	}
	// Seal took the entry out, its counts into retired records for the
	// last Collect: 2 in each window size, nothing more.
	hits, _ := tb.Pending()
	require.Equal(t, int64(4), hits, "nothing counted once sealed")
}

// TestSealWaitsForCalls: calls of AddWindowsOpen racing Seal either count
// before Seal returns or report the table sealed; none counts after. A
// judge that blocks holds its call inside the table while Seal runs.
func TestSealWaitsForCalls(t *testing.T) {
	tb := newTable(t, Options{Sizes: []time.Duration{time.Minute}, Track: true})
	const now = 1_000_000
	inside, release := make(chan struct{}), make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		_, ok, _, open := tb.AddWindowsOpen("k", now, 1, [2]int64{1, 1}, false, false, true, func([2]View) bool {
			close(inside)
			<-release
			return true
		})
		require.True(t, ok && open)
	})
	<-inside
	sealed := make(chan struct{})
	go func() {
		tb.Seal()
		close(sealed)
	}()
	select {
	case <-sealed:
		t.Fatal("Seal returned while a call was counting")
	case <-time.After(50 * time.Millisecond):
	}
	close(release)
	<-sealed
	wg.Wait()
	hits, _ := tb.Pending()
	require.Equal(t, int64(1), hits, "the call under way counted before Seal returned")
}
