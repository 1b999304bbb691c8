package shm

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit/strategy"
)

// TestRereadSurvivesRefusedPush: a cold read that a watch answer raced
// marks its entry to be read again (flagReread); the next Collect reads the
// entry's windows and clears the mark. When the store refuses that push
// (Release: it surely applied nothing), the reads were never answered: the
// mark must come back, or the change the watch skipped is never learned
// (the key is idle, so nothing else brings it to a Collect).
func TestRereadSurvivesRefusedPush(t *testing.T) {
	size := time.Minute
	tb := newTable(t, Options{Sizes: []time.Duration{size}, MaxKeys: 1 << 10, Track: true, Watch: true})
	now := windowStart(time.Now().UnixMilli(), size.Milliseconds()) + 1000
	seq := tb.SkipSeq()
	tb.skipped.Add(1) // a watch answer skipped a key not held, after the read was sent
	tb.LoadColdSince("k", now, 1, [2][2]int64{{3, 0}}, seq)

	collect := func() *Batch {
		t.Helper()
		tb.Watches(now, nil)
		tb.Rewind()
		b := &Batch{}
		tb.CollectSome(now, true, b, 0)
		return b
	}
	reads := func(b *Batch) (n int) {
		for _, r := range b.readRefs {
			if r.e.key() == "k" {
				n++
			}
		}
		return n
	}

	b := collect()
	require.Positive(t, reads(b), "the marked entry is read")
	tb.Release(b) // the store refused the push
	tb.PassDone()

	b = collect()
	require.Positive(t, reads(b), "refused: the entry is read again")
	tb.Ack(b, strategy.Result{Totals: make([]int64, len(b.Diffs)), Reads: make([]int64, len(b.Reads))})
	tb.PassDone()

	b = collect()
	require.Zero(t, reads(b), "answered: the mark is gone")
}
