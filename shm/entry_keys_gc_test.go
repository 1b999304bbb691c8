package shm

import (
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestKeyLengthsThroughSync: keys of every length around the inline bound go through
// Add/Peek/Keys, Collect (diff keys), eviction into retired records, a GC
// that could free long keys' copies, and a Collect of the retired records:
// every key the table hands out is the key it was given.
func TestKeyLengthsThroughSync(t *testing.T) {
	lens := []int{0, 1, 26, 27, 28, 29, 255, 256, 257, 1000, 70_000}
	mk := func(n, v int) string {
		b := []byte(strings.Repeat("x", n))
		if n > 0 {
			b[n-1] = byte('a' + v)
			b[0] = byte('A' + v)
		}
		return string(b)
	}
	var keys []string
	for _, n := range lens {
		for v := range 2 {
			if n == 0 && v == 1 {
				continue
			}
			keys = append(keys, mk(n, v))
		}
	}
	tb := newTable(t, Options{Sizes: []time.Duration{time.Second}, MaxKeys: 1 << 10, Track: true, Walk: true})
	for i, k := range keys {
		// The caller's string is a copy with its own buffer, then dropped.
		tb.Add(string([]byte(k)), 0, 1_000, int64(i+1))
	}
	runtime.GC()
	runtime.GC()
	for i, k := range keys {
		require.EqualValues(t, i+1, tb.Peek(k, 0, 1_000).Cur, "len %d", len(k))
	}
	got := tb.Keys(1_000, nil)
	require.ElementsMatch(t, keys, got)

	var b Batch
	tb.collectAll(1_000, false, &b)
	sum := map[string]int64{}
	for _, d := range b.Diffs {
		sum[d.Key] += d.Delta
	}
	for i, k := range keys {
		require.EqualValues(t, i+1, sum[k], "diff for len %d", len(k))
	}
	tb.Release(&b)

	// Expire everything: a walk drops the entries, their hits go to retired
	// records whose keys point into (or through) the dropped entries.
	var b2 Batch
	tb.collectAll(10_000, false, &b2)
	tb.Release(&b2)
	for range 3 {
		runtime.GC()
	}
	tb.retMu.Lock()
	rk := map[string]int64{}
	for _, r := range tb.retired {
		rk[r.key] += r.local
	}
	tb.retMu.Unlock()
	require.Len(t, rk, len(keys), "every key retired")
	var b3 Batch
	tb.collectAll(10_000, false, &b3)
	sum = map[string]int64{}
	for _, d := range b3.Diffs {
		sum[d.Key] += d.Delta
	}
	for k, v := range rk {
		require.Equal(t, v, sum[k])
		require.Contains(t, keys, k)
	}
	tb.Release(&b3)
}
