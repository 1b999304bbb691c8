package strategytest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit/strategy"
)

// watchPush pushes diffs with one watch of window (size, start) and returns
// the changes.
func watchPush(t *testing.T, s strategy.Strategy, ns string, size time.Duration, start int64, cursor string, limit int, diffs ...strategy.Diff) (strategy.Result, strategy.Changes) {
	t.Helper()
	b := &strategy.Batch{ID: newID(t), Namespace: ns, Now: start, Diffs: diffs,
		Watches: []strategy.Watch{{Size: size, Start: start, Cursor: cursor, Limit: limit}}}
	res, err := s.PushDiffs(context.Background(), b)
	require.NoError(t, err)
	require.Len(t, res.Totals, len(diffs))
	require.Len(t, res.Changes, 1)
	return res, res.Changes[0]
}

// changed returns the changes as a map from key to total, checking each
// counter belongs to the watched window and appears once.
func changed(t *testing.T, c strategy.Changes, size time.Duration, start int64) map[string]int64 {
	t.Helper()
	out := map[string]int64{}
	for _, ctr := range c.Counters {
		require.Equal(t, size, ctr.Size, "%+v", ctr)
		require.Equal(t, start, ctr.Start, "%+v", ctr)
		_, dup := out[ctr.Key]
		require.False(t, dup, "%q listed twice", ctr.Key)
		out[ctr.Key] = ctr.Count
	}
	return out
}

// runWatch is the contract of Batch.Watches (Capabilities.Watch).
func runWatch(t *testing.T, newStore NewStore) {
	w := 60 * sec
	t.Run("WatchFromTheStart", func(t *testing.T) {
		s := newStore(t)
		ns := "watch-start"
		_, c := watchPush(t, s, ns, w, base, "", 100)
		require.False(t, c.Overflow)
		require.Empty(t, c.Counters, "an empty window has no changes")
		push(t, s, ns, []strategy.Diff{diff("a", w, base, 3), diff("b", w, base, 5), diff("x", 10*sec, base, 1)})
		_, c = watchPush(t, s, ns, w, base, "", 100)
		require.False(t, c.Overflow)
		require.Equal(t, map[string]int64{"a": 3, "b": 5}, changed(t, c, w, base), "the other window's counter is not this one's")
		require.NotEmpty(t, c.Cursor)
	})

	t.Run("WatchSinceCursor", func(t *testing.T) {
		s := newStore(t)
		ns := "watch-since"
		push(t, s, ns, []strategy.Diff{diff("a", w, base, 3), diff("b", w, base, 5)})
		_, c := watchPush(t, s, ns, w, base, "", 100)
		c1 := c.Cursor
		_, c = watchPush(t, s, ns, w, base, c1, 100)
		require.False(t, c.Overflow)
		require.Empty(t, c.Counters, "nothing changed since the cursor")
		push(t, s, ns, []strategy.Diff{diff("b", w, base, 1), diff("c", w, base, 2)})
		push(t, s, ns, []strategy.Diff{diff("b", w, base, 1)}) // twice since c1: listed once
		push(t, s, "watch-other-ns", []strategy.Diff{diff("a", w, base, 7)})
		push(t, s, ns, []strategy.Diff{diff("d", w, base+60_000, 2)})
		_, c = watchPush(t, s, ns, w, base, c1, 100)
		require.False(t, c.Overflow)
		require.Equal(t, map[string]int64{"b": 7, "c": 2}, changed(t, c, w, base))
		// The batch's own diffs are among the changes, with their totals after it.
		res, c2 := watchPush(t, s, ns, w, base, c.Cursor, 100, diff("a", w, base, 10))
		require.Equal(t, []int64{13}, res.Totals)
		require.False(t, c2.Overflow)
		require.Equal(t, int64(13), changed(t, c2, w, base)["a"])
		// An older cursor still lists everything since it.
		_, c = watchPush(t, s, ns, w, base, c1, 100)
		require.Equal(t, map[string]int64{"a": 13, "b": 7, "c": 2}, changed(t, c, w, base))
	})

	t.Run("WatchOverflow", func(t *testing.T) {
		s := newStore(t)
		ns := "watch-overflow"
		_, c := watchPush(t, s, ns, w, base, "", 5)
		cur := c.Cursor
		var diffs []strategy.Diff
		for i := range 12 {
			diffs = append(diffs, diff(fmt.Sprintf("k%d", i), w, base, 1))
		}
		push(t, s, ns, diffs)
		_, c = watchPush(t, s, ns, w, base, cur, 5)
		require.True(t, c.Overflow, "12 changes against a limit of 5")
		require.Empty(t, c.Counters)
		require.NotEmpty(t, c.Cursor)
		// The overflow's cursor is a position like any other.
		_, c2 := watchPush(t, s, ns, w, base, c.Cursor, 5)
		require.False(t, c2.Overflow)
		require.Empty(t, c2.Counters)
		push(t, s, ns, []strategy.Diff{diff("k3", w, base, 1)})
		_, c2 = watchPush(t, s, ns, w, base, c.Cursor, 5)
		require.Equal(t, map[string]int64{"k3": 2}, changed(t, c2, w, base))
	})

	t.Run("WatchReplayedBatchChangesNothing", func(t *testing.T) {
		s := newStore(t)
		ns := "watch-replay"
		b := &strategy.Batch{ID: newID(t), Namespace: ns, Now: base, Diffs: []strategy.Diff{diff("a", w, base, 1)}}
		_, err := s.PushDiffs(context.Background(), b)
		require.NoError(t, err)
		_, c := watchPush(t, s, ns, w, base, "", 100)
		res, err := s.PushDiffs(context.Background(), b)
		require.NoError(t, err)
		require.Equal(t, []int64{1}, res.Totals)
		_, c2 := watchPush(t, s, ns, w, base, c.Cursor, 100)
		require.False(t, c2.Overflow)
		// A re-sent batch applies nothing, so it changes nothing. A store
		// may list counters that did not change (PostgreSQL does while
		// another session's transaction holds its cursors back), but never
		// with a total the re-send raised.
		for _, ct := range c2.Counters {
			require.Equal(t, int64(1), ct.Count, "a re-sent batch applies nothing: %+v", ct)
		}
	})

	t.Run("WatchAfterTheWindowWasLost", func(t *testing.T) {
		// A window purged (or lost) and written again: a cursor of the old
		// one must not hide the new one's counters.
		s := newStore(t)
		ns := "watch-lost"
		size := 10 * sec
		push(t, s, ns, []strategy.Diff{diff("a", size, base, 4)})
		_, c := watchPush(t, s, ns, size, base, "", 100)
		require.NoError(t, s.Purge(context.Background(), base+10*time.Minute.Milliseconds()))
		if got, err := s.GetWindow(context.Background(), ns, id("a", size, base)); err != nil || got != 0 {
			t.Skip("the store expires windows by TTL: Purge cannot remove them")
		}
		push(t, s, ns, []strategy.Diff{diff("b", size, base, 1)})
		_, c2 := watchPush(t, s, ns, size, base, c.Cursor, 100)
		if !c2.Overflow {
			require.Equal(t, map[string]int64{"b": 1}, changed(t, c2, size, base))
		}
	})

	t.Run("WatchConvergesUnderConcurrentPushes", func(t *testing.T) {
		// Nodes push random diffs, each with a watch of the window, and
		// keep a view: their own totals and the changes. After the last
		// push, one more watch must bring every view to the store's totals,
		// however the pushes interleaved. A store whose cursor skips
		// writes still in flight when it answered fails this.
		s := newStore(t)
		ns := "watch-converge"
		const nodes, rounds, keys = 6, 60, 40
		views := make([]map[string]int64, nodes)
		cursors := make([]string, nodes)
		var wg sync.WaitGroup
		errs := make(chan error, nodes)
		for n := range nodes {
			views[n] = map[string]int64{}
			wg.Go(func() {
				rng := rand.New(rand.NewPCG(uint64(n), 7))
				for range rounds {
					seen := map[string]bool{}
					var diffs []strategy.Diff
					for range 1 + rng.IntN(6) {
						k := fmt.Sprintf("k%d", rng.IntN(keys))
						if !seen[k] {
							seen[k] = true
							diffs = append(diffs, diff(k, w, base, 1+rng.Int64N(3)))
						}
					}
					if err := watchStep(s, ns, w, diffs, views[n], &cursors[n], keys); err != nil {
						errs <- err
						return
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err)
		}
		want := map[string]int64{}
		for c, n := range collect(t, s, strategy.Query{Namespace: ns, Sizes: []time.Duration{w}, Now: base}) {
			want[c.Key] = n
		}
		for n := range nodes {
			require.NoError(t, watchStep(s, ns, w, nil, views[n], &cursors[n], keys))
			require.Equal(t, want, views[n], "node %d", n)
		}
	})
}

// watchStep pushes diffs with a watch from *cursor and folds the answer into
// view: on an overflow, it reads every key.
func watchStep(s strategy.Strategy, ns string, w time.Duration, diffs []strategy.Diff, view map[string]int64, cursor *string, keys int) error {
	b := &strategy.Batch{ID: fmt.Sprintf("watch-%d", time.Now().UnixNano()) + fmt.Sprint(rand.Int64()), Namespace: ns, Now: base, Diffs: diffs,
		Watches: []strategy.Watch{{Size: w, Start: base, Cursor: *cursor, Limit: 1000}}}
	res, err := s.PushDiffs(context.Background(), b)
	if err != nil {
		return err
	}
	for i, d := range diffs {
		view[d.Key] = res.Totals[i]
	}
	c := res.Changes[0]
	if c.Overflow {
		return fmt.Errorf("overflow with a limit above the keys")
	}
	for _, ctr := range c.Counters {
		view[ctr.Key] = ctr.Count
	}
	*cursor = c.Cursor
	return nil
}
