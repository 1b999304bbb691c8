package shm

import (
	"hash/maphash"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// evictOnFind makes the next lookup of a bucket or log run evict before
// the caller locks what it found: the window a concurrent eviction hits.
func evictOnFind(t *testing.T, evict func()) {
	t.Helper()
	hookOnce(t, &testHookFound, evict)
}

// hookOnce sets the test hook *hook to run fn the first time it is called,
// and clears it when the test ends.
func hookOnce(t *testing.T, hook *func(), fn func()) {
	t.Helper()
	armed := true
	*hook = func() {
		if armed {
			armed = false
			fn()
		}
	}
	t.Cleanup(func() { *hook = nil })
}

// TestTryAfterEviction: a bucket evicted between Try's lookup and its lock
// does not take the spend with it: Try finds the table's bucket again.
func TestTryAfterEviction(t *testing.T) {
	for _, track := range []bool{false, true} {
		b, err := NewBuckets(BucketOptions{Period: time.Second, Track: track})
		require.NoError(t, err)
		const now, interval = 1_000_000, 100.0
		b.Try("k", now, interval, 10, 1, SpendIfFits)
		evictOnFind(t, func() {
			s := &b.shards[maphash.String(b.seed, "k")&b.mask]
			s.mu.Lock()
			b.remove(s, s.find(maphash.String(b.seed, "k"), "k"))
			s.mu.Unlock()
		})
		_, fits, spent := b.Try("k", now, interval, 10, 3, SpendIfFits)
		require.True(t, fits && spent)
		tat, held := b.View("k", now, interval)
		require.True(t, held)
		// Without Track the evicted bucket's spend is gone with it (the
		// table forgets); the new spend is in the bucket held. With Track
		// the first spend waits in the retired buckets for the next push.
		require.Equal(t, float64(now)+3*interval, tat, "track %v", track)
	}
}

// TestTryOpen: TryOpen spends on a bucket held, creates one only when
// told, and spends nothing once the table is sealed.
func TestTryOpen(t *testing.T) {
	b, err := NewBuckets(BucketOptions{Period: time.Second})
	require.NoError(t, err)
	const now, interval = 1_000_000, 100.0
	_, _, _, held, open := b.TryOpen("k", now, interval, 10, 1, SpendIfFits, false)
	require.False(t, held)
	require.True(t, open)
	require.False(t, b.Holds("k"))
	b.Try("k", now, interval, 10, 1, SpendIfFits)
	tat, fits, spent, held, open := b.TryOpen("k", now, interval, 10, 2, SpendIfFits, false)
	require.True(t, held && open && fits && spent)
	require.Equal(t, float64(now)+interval, tat)
	tat, _ = b.View("k", now, interval)
	require.Equal(t, float64(now)+3*interval, tat)
	_, _, spent, held, _ = b.TryOpen("new", now, interval, 10, 1, SpendAlways, true)
	require.True(t, held && spent)
	require.Equal(t, 2, b.Len())

	b.Seal()
	_, _, spent, held, open = b.TryOpen("k", now, interval, 10, 1, SpendAlways, false)
	require.False(t, spent || open)
	require.True(t, held)
	tat, _ = b.View("k", now, interval)
	require.Equal(t, float64(now)+3*interval, tat, "nothing spent once sealed")
	require.False(t, math.IsInf(tat, 0))
}

// TestLogTryAfterEviction: a log evicted between Try's lookup and its lock
// does not take the added entry with it.
func TestLogTryAfterEviction(t *testing.T) {
	l, err := NewLogs(time.Minute, 0)
	require.NoError(t, err)
	const now = 1_000_000
	l.Try("k", now, 10, 1, true, false)
	evictOnFind(t, func() {
		s := &l.shards[maphash.String(l.seed, "k")&l.mask]
		s.mu.Lock()
		l.makeRoom(s, now) // the shard's only log, its reference bit cleared then evicted
		s.mu.Unlock()
		require.Empty(t, s.m)
	})
	_, fits, _ := l.Try("k", now, 10, 3, true, false)
	require.True(t, fits)
	st, held := l.State("k", now, 10, 0)
	require.True(t, held)
	require.Equal(t, int64(3), st.Count)
}
