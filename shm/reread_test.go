package shm

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit/strategy"
)

// markedTable sets up a watched table in which keys were cold-read while a
// watch skipped a key (each marked flagReread).
func markedTable(t *testing.T, maxKeys int, keys ...string) (*Table, int64) {
	size := time.Minute
	tb := newTable(t, Options{Sizes: []time.Duration{size}, MaxKeys: maxKeys, Track: true, Watch: true})
	now := windowStart(time.Now().UnixMilli(), size.Milliseconds()) + 1000
	seq := tb.SkipSeq()
	tb.skipped.Add(1)
	for _, k := range keys {
		tb.LoadColdSince(k, now, 1, [2][2]int64{{3, 0}}, seq)
	}
	return tb, now
}

// readsOf returns how many reads of key's windows b holds.
func readsOf(b *Batch, key string) (n int) {
	for _, r := range b.readRefs {
		if r.e.key() == key {
			n++
		}
	}
	return n
}

// collectUpTo collects a push of at most max counters (0: no bound) from tb
// at now, and reports whether the pass is done.
func collectUpTo(tb *Table, now int64, max int) (*Batch, bool) {
	b := &Batch{}
	done := tb.CollectSome(now, true, b, max)
	return b, done
}

// An unknown outcome: the push is kept and sent again (the same batch); its
// success answers the reads; the mark is gone, the answered total learned.
func TestRereadUnknownThenResent(t *testing.T) {
	tb, now := markedTable(t, 1<<10, "k")
	tb.Watches(now, nil)
	tb.Rewind()
	b, _ := collectUpTo(tb, now, 0)
	require.Positive(t, readsOf(b, "k"))
	// outcome unknown: nothing settles b; the retry re-sends it and succeeds
	reads := make([]int64, len(b.Reads))
	for i := range reads {
		reads[i] = 7
	}
	tb.Ack(b, strategy.Result{Totals: make([]int64, len(b.Diffs)), Reads: reads})
	tb.PassDone()
	require.Equal(t, int64(7), tb.Peek("k", 0, now).Cur)
	tb.Rewind()
	b, _ = collectUpTo(tb, now, 0)
	require.Zero(t, readsOf(b, "k"), "answered: no read is kept forever")
}

// A pass cut short: its first chunk is refused; the keys of that chunk are
// marked again, the others were never unmarked: the next pass reads all.
func TestRereadPassCutShort(t *testing.T) {
	var keys []string
	for i := range 40 {
		keys = append(keys, fmt.Sprintf("k%d", i))
	}
	tb, now := markedTable(t, 1<<12, keys...)
	tb.Watches(now, nil)
	tb.Rewind()
	b, done := collectUpTo(tb, now, 1)
	require.False(t, done)
	tb.Release(b) // refused: the pass ends here
	tb.Rewind()
	b, done = collectUpTo(tb, now, 0)
	require.True(t, done)
	for _, k := range keys {
		require.Positive(t, readsOf(b, k), "key %s", k)
	}
	tb.Ack(b, strategy.Result{Totals: make([]int64, len(b.Diffs)), Reads: make([]int64, len(b.Reads))})
	tb.PassDone()
	tb.Rewind()
	b, _ = collectUpTo(tb, now, 0)
	require.Zero(t, len(b.Reads), "every read answered: no mark kept")
}

// Eviction between the collect and a refused push: Release does not mark
// the dead entry's key again through a new entry for the same key.
func TestRereadReleaseAfterEviction(t *testing.T) {
	tb, now := markedTable(t, 8, "k")
	tb.Watches(now, nil)
	tb.Rewind()
	b, _ := collectUpTo(tb, now, 0)
	require.Positive(t, readsOf(b, "k"))
	for i := range 64 { // evict k
		tb.Add(fmt.Sprintf("x%d", i), 0, now, 1)
		tb.Add(fmt.Sprintf("x%d", i), 0, now, 1)
	}
	require.False(t, tb.Holds("k"))
	tb.LoadColdSince("k", now, 1, [2][2]int64{{3, 0}}, tb.SkipSeq()) // read again, no skip since
	tb.Release(b)
	tb.Rewind()
	b, _ = collectUpTo(tb, now, 0)
	require.Zero(t, readsOf(b, "k"), "the new entry carries no mark of the dead one's")
}

// TestRereadSurvivesRefusedPush: a cold read that a watch answer raced
// marks its entry to be read again (flagReread); the next Collect reads the
// entry's windows and clears the mark. When the store refuses that push
// (Release: it surely applied nothing), the reads were never answered: the
// mark must come back, or the change the watch skipped is never learned
// (the key is idle, so nothing else brings it to a Collect).
func TestRereadSurvivesRefusedPush(t *testing.T) {
	tb, now := markedTable(t, 1<<10, "k")
	collect := func() *Batch {
		t.Helper()
		tb.Watches(now, nil)
		tb.Rewind()
		b, _ := collectUpTo(tb, now, 0)
		return b
	}
	b := collect()
	require.Positive(t, readsOf(b, "k"), "the marked entry is read")
	tb.Release(b) // the store refused the push
	tb.PassDone()

	b = collect()
	require.Positive(t, readsOf(b, "k"), "refused: the entry is read again")
	tb.Ack(b, strategy.Result{Totals: make([]int64, len(b.Diffs)), Reads: make([]int64, len(b.Reads))})
	tb.PassDone()

	b = collect()
	require.Zero(t, readsOf(b, "k"), "answered: the mark is gone")
}
