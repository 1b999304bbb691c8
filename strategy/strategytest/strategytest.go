// Package strategytest is the contract test suite that every strategy.Strategy
// implementation runs: call Run from the implementation's tests.
package strategytest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit/strategy"
)

// NewStore returns a fresh store for one test. Stores returned by separate
// calls must not see each other's counters (use a new key prefix, table or
// schema), or the suite's namespaces must be enough to isolate them.
type NewStore func(t *testing.T) strategy.Strategy

// RequireServices reports whether RATELIMIT_TEST_REQUIRE_SERVICES=1, under which
// a missing test server is a failure instead of a skip.
func RequireServices() bool { return os.Getenv("RATELIMIT_TEST_REQUIRE_SERVICES") == "1" }

// SkipOrFail skips t when the server named by envVar is not configured, or fails
// it when RequireServices is set. When RATELIMIT_TEST_SKIP_LOG names a file, a
// skip also appends the test's package directory and envVar to it, one line
// each: make test prints a summary of that log, one line per package.
func SkipOrFail(t testing.TB, envVar string) {
	t.Helper()
	msg := fmt.Sprintf("%s is not set; set it to run tests against a real server", envVar)
	if RequireServices() {
		t.Fatalf("%s (RATELIMIT_TEST_REQUIRE_SERVICES=1)", msg)
	}
	logSkip(t, envVar)
	t.Skip(msg)
}

// logSkip appends "<package dir>\t<envVar>" to the file RATELIMIT_TEST_SKIP_LOG
// names, if any. Test binaries run in their package's directory, and run in
// parallel: each line is one append, which the system does not interleave.
func logSkip(t testing.TB, envVar string) {
	path := os.Getenv("RATELIMIT_TEST_SKIP_LOG")
	if path == "" {
		return
	}
	dir, err := os.Getwd()
	if err != nil {
		t.Logf("RATELIMIT_TEST_SKIP_LOG: %v", err)
		return
	}
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		t.Logf("RATELIMIT_TEST_SKIP_LOG: %v", err)
		return
	}
	defer f.Close()
	if _, err := fmt.Fprintf(f, "%s\t%s\n", dir, envVar); err != nil {
		t.Logf("RATELIMIT_TEST_SKIP_LOG: %v", err)
	}
}

const sec = time.Second

// base is an arbitrary instant aligned to every size the suite uses.
const base int64 = 1_700_000_040_000 // divisible by 60_000 and 1_000

func id(key string, size time.Duration, start int64) strategy.CounterID {
	return strategy.CounterID{Key: key, Size: size, Start: start}
}

func diff(key string, size time.Duration, start, delta int64) strategy.Diff {
	return strategy.Diff{CounterID: id(key, size, start), Delta: delta}
}

var batchSeq struct {
	sync.Mutex
	n int
}

func newID(t *testing.T) string {
	batchSeq.Lock()
	defer batchSeq.Unlock()
	batchSeq.n++
	return fmt.Sprintf("strategytest-%d-%d", time.Now().UnixNano(), batchSeq.n)
}

func push(t *testing.T, s strategy.Strategy, ns string, diffs []strategy.Diff, reads ...strategy.CounterID) strategy.Result {
	t.Helper()
	res, err := s.PushDiffs(context.Background(), &strategy.Batch{ID: newID(t), Namespace: ns, Diffs: diffs, Reads: reads})
	require.NoError(t, err)
	require.Len(t, res.Totals, len(diffs))
	require.Len(t, res.Reads, len(reads))
	return res
}

func collect(t *testing.T, s strategy.Strategy, q strategy.Query) map[strategy.CounterID]int64 {
	t.Helper()
	out := map[strategy.CounterID]int64{}
	for c, err := range s.GetCounters(context.Background(), q) {
		require.NoError(t, err)
		_, dup := out[c.CounterID]
		require.False(t, dup, "counter %v returned twice", c.CounterID)
		out[c.CounterID] = c.Count
	}
	return out
}

// Run runs the contract suite against stores made by newStore.
func Run(t *testing.T, newStore NewStore) {
	t.Run("PushReturnsTotals", func(t *testing.T) {
		s := newStore(t)
		ns := "push-totals"
		res := push(t, s, ns, []strategy.Diff{diff("a", 60*sec, base, 3), diff("b", 60*sec, base, 5)})
		require.Equal(t, []int64{3, 5}, res.Totals)
		res = push(t, s, ns, []strategy.Diff{diff("a", 60*sec, base, 4)}, id("b", 60*sec, base), id("c", 60*sec, base))
		require.Equal(t, []int64{7}, res.Totals)
		require.Equal(t, []int64{5, 0}, res.Reads)
	})

	t.Run("NegativeAndZeroDeltas", func(t *testing.T) {
		s := newStore(t)
		ns := "negative"
		push(t, s, ns, []strategy.Diff{diff("a", sec, base, 10)})
		res := push(t, s, ns, []strategy.Diff{diff("a", sec, base, -4), diff("z", sec, base, 0)})
		require.Equal(t, []int64{6, 0}, res.Totals)
	})

	t.Run("TotalsSaturate", func(t *testing.T) {
		// Eight nodes' worth of saturated local counts: far past int64
		// without the bound, and the diff after it in the batch still counts.
		s := newStore(t)
		ns := "saturate"
		step := int64(strategy.MaxTotal / 2)
		var res strategy.Result
		for range 8 {
			res = push(t, s, ns, []strategy.Diff{diff("up", 60*sec, base, step), diff("down", 60*sec, base, -step), diff("n", 60*sec, base, 1)})
		}
		require.Equal(t, []int64{strategy.MaxTotal, -strategy.MaxTotal, 8}, res.Totals)
	})

	t.Run("SameBatchIDAppliesOnce", func(t *testing.T) {
		s := newStore(t)
		ns := "idempotent"
		b := &strategy.Batch{ID: newID(t), Namespace: ns, Diffs: []strategy.Diff{diff("k", 60*sec, base, 2), diff("j", 60*sec, base, 1)}}
		for range 3 {
			res, err := s.PushDiffs(context.Background(), b)
			require.NoError(t, err)
			require.Equal(t, []int64{2, 1}, res.Totals)
		}
		// A new batch ID applies again, and the answer carries the new totals.
		b2 := &strategy.Batch{ID: newID(t), Namespace: ns, Diffs: b.Diffs}
		res, err := s.PushDiffs(context.Background(), b2)
		require.NoError(t, err)
		require.Equal(t, []int64{4, 2}, res.Totals)
		res, err = s.PushDiffs(context.Background(), b)
		require.NoError(t, err)
		require.Equal(t, []int64{4, 2}, res.Totals, "a re-sent batch answers with current totals")
	})

	t.Run("NamespacesAndWindowsAreSeparate", func(t *testing.T) {
		s := newStore(t)
		push(t, s, "ns-one", []strategy.Diff{diff("k", sec, base, 1), diff("k", 60*sec, base, 2), diff("k", sec, base+1000, 3)})
		push(t, s, "ns-two", []strategy.Diff{diff("k", sec, base, 10)})
		ctx := context.Background()
		for _, c := range []struct {
			ns   string
			id   strategy.CounterID
			want int64
		}{
			{"ns-one", id("k", sec, base), 1},
			{"ns-one", id("k", 60*sec, base), 2},
			{"ns-one", id("k", sec, base+1000), 3},
			{"ns-two", id("k", sec, base), 10},
			{"ns-two", id("k", 60*sec, base), 0},
		} {
			got, err := s.GetWindow(ctx, c.ns, c.id)
			require.NoError(t, err)
			require.Equal(t, c.want, got, "%s %v", c.ns, c.id)
		}
	})

	t.Run("GetCountersCurrentAndPrevious", func(t *testing.T) {
		s := newStore(t)
		ns := "get-counters"
		w := 60 * sec
		push(t, s, ns, []strategy.Diff{
			diff("a", w, base-2*60_000, 100), // too old
			diff("a", w, base-60_000, 40),    // previous
			diff("a", w, base, 10),           // current
			diff("b", w, base, 7),
			diff("c", 10*sec, base, 3),   // another size
			diff("d", w, base+60_000, 1), // a future window is not current
		})
		push(t, s, "other-ns", []strategy.Diff{diff("a", w, base, 99)})
		now := base + 30_000
		all := collect(t, s, strategy.Query{Namespace: ns, Sizes: []time.Duration{w}, Now: now})
		require.Equal(t, map[strategy.CounterID]int64{
			id("a", w, base-60_000): 40,
			id("a", w, base):        10,
			id("b", w, base):        7,
		}, all)
		some := collect(t, s, strategy.Query{Namespace: ns, Sizes: []time.Duration{w, 10 * sec}, Now: now, Keys: []string{"a", "c", "missing"}})
		require.Equal(t, map[strategy.CounterID]int64{
			id("a", w, base-60_000): 40,
			id("a", w, base):        10,
		}, some, "c's 10s window at base is two windows before now")
		both := collect(t, s, strategy.Query{Namespace: ns, Sizes: []time.Duration{w, 10 * sec}, Now: base + 5_000, Keys: []string{"c"}})
		require.Equal(t, map[strategy.CounterID]int64{id("c", 10*sec, base): 3}, both)
		none := collect(t, s, strategy.Query{Namespace: ns, Sizes: []time.Duration{w}, Now: now, Keys: []string{}})
		require.Empty(t, none)
	})

	t.Run("SubSecondWindows", func(t *testing.T) {
		s := newStore(t)
		ns := "subsecond"
		size := 250 * time.Millisecond
		push(t, s, ns, []strategy.Diff{diff("k", size, base, 2), diff("k", size, base+250, 5)})
		got := collect(t, s, strategy.Query{Namespace: ns, Sizes: []time.Duration{size}, Now: base + 300})
		require.Equal(t, map[strategy.CounterID]int64{id("k", size, base): 2, id("k", size, base+250): 5}, got)
	})

	t.Run("Purge", func(t *testing.T) {
		s := newStore(t)
		ns := "purge"
		w := 10 * sec
		push(t, s, ns, []strategy.Diff{
			diff("k", w, base-20_000, 1), // older than previous at now: removed
			diff("k", w, base-10_000, 2), // previous: kept
			diff("k", w, base, 3),        // current: kept
		})
		now := base + 1
		require.NoError(t, s.Purge(context.Background(), now))
		for start, want := range map[int64]int64{base - 10_000: 2, base: 3} {
			got, err := s.GetWindow(context.Background(), ns, id("k", w, start))
			require.NoError(t, err)
			require.Equal(t, want, got)
		}
		// Stores that expire by TTL may still hold the old window; a store
		// that purges must not.
		got, err := s.GetWindow(context.Background(), ns, id("k", w, base-20_000))
		require.NoError(t, err)
		require.Contains(t, []int64{0, 1}, got)
	})

	t.Run("LargeBatch", func(t *testing.T) {
		s := newStore(t)
		ns := "large"
		const n = 5000
		diffs := make([]strategy.Diff, n)
		reads := make([]strategy.CounterID, n)
		for i := range diffs {
			diffs[i] = diff(fmt.Sprintf("key-%d", i), 60*sec, base, int64(i+1))
			reads[i] = id(fmt.Sprintf("key-%d", i), 60*sec, base-60_000)
		}
		res := push(t, s, ns, diffs, reads...)
		for i := range diffs {
			require.Equal(t, int64(i+1), res.Totals[i])
			require.Zero(t, res.Reads[i])
		}
		got := collect(t, s, strategy.Query{Namespace: ns, Sizes: []time.Duration{60 * sec}, Now: base})
		require.Len(t, got, n)
	})

	t.Run("ConcurrentPushesAreExact", func(t *testing.T) {
		s := newStore(t)
		ns := "concurrent"
		const workers, rounds = 8, 40
		keys := []string{"a", "b", "c", "d", "e"}
		var wg sync.WaitGroup
		errs := make(chan error, workers)
		for w := range workers {
			wg.Go(func() {
				for r := range rounds {
					var diffs []strategy.Diff
					for i := range keys {
						// Overlapping keys, in an order that differs per worker.
						diffs = append(diffs, diff(keys[(i+w+r)%len(keys)], 60*sec, base, 1))
					}
					if _, err := s.PushDiffs(context.Background(), &strategy.Batch{ID: newID(t), Namespace: ns, Diffs: diffs}); err != nil {
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
		got := collect(t, s, strategy.Query{Namespace: ns, Sizes: []time.Duration{60 * sec}, Now: base})
		keysGot := make([]string, 0, len(got))
		for c, n := range got {
			keysGot = append(keysGot, c.Key)
			require.Equal(t, int64(workers*rounds), n, c.Key)
		}
		sort.Strings(keysGot)
		require.Equal(t, keys, keysGot)
	})

	caps := strategy.CapabilitiesOf(newStore(t))
	if caps.Watch {
		runWatch(t, newStore)
	}
	if caps.Buckets {
		runBuckets(t, newStore)
	}
	if caps.Take {
		runTake(t, newStore)
	}

	t.Run("CancelledContextFails", func(t *testing.T) {
		s := newStore(t)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		b := &strategy.Batch{ID: newID(t), Namespace: "cancelled", Diffs: []strategy.Diff{diff("k", sec, base, 1)}}
		_, err := s.PushDiffs(ctx, b)
		require.Error(t, err)
		// Whatever the cancelled attempt did, re-sending the same batch under
		// the same ID leaves exactly one hit.
		res, err := s.PushDiffs(context.Background(), b)
		require.NoError(t, err)
		require.Equal(t, []int64{1}, res.Totals)
		_, err = s.GetWindow(ctx, "cancelled", id("k", sec, base))
		require.Error(t, err)
		if !errors.Is(err, context.Canceled) {
			t.Logf("GetWindow on a cancelled context returned %v (not wrapping context.Canceled)", err)
		}
	})
}
