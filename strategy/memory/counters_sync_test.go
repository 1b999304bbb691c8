package memory_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit/strategy"
	"github.com/ratesync/ratelimit/strategy/memory"
)

// TestPushMatchesReference pushes random batches (many keys, so the windows'
// tables grow several times; several windows per batch; repeated IDs) and
// checks every answer, GetWindow, GetCounters and Len against a plain map.
func TestPushMatchesReference(t *testing.T) {
	ctx := context.Background()
	s := memory.New()
	rng := rand.New(rand.NewPCG(3, 4))
	type cid struct {
		key   string
		size  time.Duration
		start int64
	}
	ref := map[cid]int64{}
	applied := map[string]bool{}
	sizes := []time.Duration{time.Second, time.Minute}
	const now = 120_000
	pick := func() strategy.CounterID {
		size := sizes[rng.IntN(2)]
		cur := strategy.WindowStart(now, size)
		return strategy.CounterID{Key: fmt.Sprintf("k%d", rng.IntN(5000)), Size: size, Start: cur - int64(rng.IntN(2))*size.Milliseconds()}
	}
	for n := range 300 {
		b := &strategy.Batch{ID: fmt.Sprintf("b%d", rng.IntN(n+1)), Namespace: "ns"}
		used := map[strategy.CounterID]bool{}
		for range rng.IntN(200) {
			id := pick()
			if !used[id] { // at most one diff per counter
				used[id] = true
				b.Diffs = append(b.Diffs, strategy.Diff{CounterID: id, Delta: rng.Int64N(7) - 2})
			}
		}
		for range rng.IntN(50) {
			b.Reads = append(b.Reads, pick())
		}
		res, err := s.PushDiffs(ctx, b)
		require.NoError(t, err)
		seen := applied[b.ID]
		applied[b.ID] = true
		for i, d := range b.Diffs {
			k := cid{d.Key, d.Size, d.Start}
			if !seen {
				ref[k] += d.Delta
			}
			require.Equal(t, ref[k], res.Totals[i])
		}
		for i, id := range b.Reads {
			require.Equal(t, ref[cid{id.Key, id.Size, id.Start}], res.Reads[i])
		}
	}
	for k, n := range ref {
		got, err := s.GetWindow(ctx, "ns", strategy.CounterID{Key: k.key, Size: k.size, Start: k.start})
		require.NoError(t, err)
		require.Equal(t, n, got)
	}
	require.Equal(t, len(ref), s.Len())

	all := map[cid]int64{}
	for c, err := range s.GetCounters(ctx, strategy.Query{Namespace: "ns", Sizes: sizes, Now: now}) {
		require.NoError(t, err)
		k := cid{c.Key, c.Size, c.Start}
		_, dup := all[k]
		require.False(t, dup, "counter %v listed twice", k)
		all[k] = c.Count
	}
	require.Equal(t, ref, all)

	keys := []string{"k1", "k2", "absent"}
	got := map[cid]int64{}
	for c, err := range s.GetCounters(ctx, strategy.Query{Namespace: "ns", Sizes: sizes, Now: now, Keys: keys}) {
		require.NoError(t, err)
		got[cid{c.Key, c.Size, c.Start}] = c.Count
	}
	want := map[cid]int64{}
	for k, n := range ref {
		if k.key == "k1" || k.key == "k2" {
			want[k] = n
		}
	}
	require.Equal(t, want, got)
}

// TestReplayedBatchCreatesNothing re-sends an applied batch after Purge forgot
// nothing, and a batch touching a new window under a used ID: neither applies.
func TestReplayedBatchCreatesNothing(t *testing.T) {
	ctx := context.Background()
	s := memory.New()
	id := strategy.CounterID{Key: "k", Size: time.Second, Start: 1000}
	b := &strategy.Batch{ID: "b1", Namespace: "ns", Diffs: []strategy.Diff{{CounterID: id, Delta: 3}}}
	_, err := s.PushDiffs(ctx, b)
	require.NoError(t, err)
	other := strategy.CounterID{Key: "k", Size: time.Second, Start: 2000}
	b2 := &strategy.Batch{ID: "b1", Namespace: "ns", Diffs: []strategy.Diff{{CounterID: other, Delta: 5}, {CounterID: id, Delta: 5}},
		Reads: []strategy.CounterID{id, other}}
	res, err := s.PushDiffs(ctx, b2)
	require.NoError(t, err)
	require.Equal(t, []int64{0, 3}, res.Totals)
	require.Equal(t, []int64{3, 0}, res.Reads)
	require.Equal(t, 1, s.Len())
}

// BenchmarkPushDiffs measures pushes shaped like a sync cycle's: 16,384
// counters, a diff of the current window and a read of the previous one per
// key, over 100,000 keys.
func BenchmarkPushDiffs(b *testing.B) {
	ctx := context.Background()
	const keys, chunk = 100_000, 8192
	names := make([]string, keys)
	for i := range names {
		names[i] = fmt.Sprintf("user:%08d", i)
	}
	var batches []*strategy.Batch
	for lo := 0; lo < keys; lo += chunk {
		bt := &strategy.Batch{Namespace: "ns"}
		for _, k := range names[lo:min(lo+chunk, keys)] {
			bt.Diffs = append(bt.Diffs, strategy.Diff{CounterID: strategy.CounterID{Key: k, Size: time.Minute, Start: 60_000}, Delta: 1})
			bt.Reads = append(bt.Reads, strategy.CounterID{Key: k, Size: time.Minute, Start: 0})
		}
		batches = append(batches, bt)
	}
	s := memory.New()
	seq := 0
	push := func() {
		for _, bt := range batches {
			seq++
			bt.ID = fmt.Sprint(seq)
			if _, err := s.PushDiffs(ctx, bt); err != nil {
				b.Fatal(err)
			}
		}
	}
	push()
	b.ReportAllocs()
	for b.Loop() {
		push()
	}
}
