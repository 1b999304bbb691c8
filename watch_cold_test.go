package ratelimit_test

import (
	"context"
	"fmt"
	"iter"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/ratesync/ratelimit"
	"github.com/ratesync/ratelimit/strategy"
	"github.com/ratesync/ratelimit/strategy/memory"
	rlredis "github.com/ratesync/ratelimit/strategy/redis"
)

// slowFirstColdRead answers the first GetCounters (a cold read) of key "k" with the
// store's counters at the time it arrived, but holds the answer until release
// is closed. Everything else (and the capabilities: watches) is the memory
// store's.
type slowFirstColdRead struct {
	strategy.Strategy
	once    sync.Once
	arrived chan struct{}
	release chan struct{}
}

func (s *slowFirstColdRead) Capabilities() strategy.Capabilities {
	return strategy.CapabilitiesOf(s.Strategy)
}

func (s *slowFirstColdRead) GetCounters(ctx context.Context, q strategy.Query) iter.Seq2[strategy.Counter, error] {
	first := false
	if slices.Contains(q.Keys, "k") {
		s.once.Do(func() { first = true })
	}
	if !first {
		return s.Strategy.GetCounters(ctx, q)
	}
	// Read now, answer later.
	var got []strategy.Counter
	var gerr error
	for c, err := range s.Strategy.GetCounters(ctx, q) {
		if err != nil {
			gerr = err
			break
		}
		got = append(got, c)
	}
	close(s.arrived)
	<-s.release
	return func(yield func(strategy.Counter, error) bool) {
		if gerr != nil {
			yield(strategy.Counter{}, gerr)
			return
		}
		for _, c := range got {
			if !yield(c, nil) {
				return
			}
		}
	}
}

// TestWatchColdReadRacingWatchLearnsChange: two periodic nodes over a
// store with change logs, a fixed limit of 10 a minute on key "k".
//
// Node A finds "k" cold and reads it (the store holds 0 then); the answer is
// slow. Meanwhile node B admits 10 and pushes them, and A runs a sync cycle:
// its watch lists "k" = 10, which A skips (it does not hold "k" yet), and its
// cursor moves past that change. The slow cold read then lands and records
// 0 as "k"'s learned total. No later watch lists "k" (it does not change
// again), and A never reads a key whose total it "learned": after any number
// of cycles A still sees 0 of 10 used, and admits 10 more: 20 admitted in one
// window under a limit of 10, far beyond nodes x rate x SyncRate.
func TestWatchColdReadRacingWatchLearnsChange(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	mem := memory.New()
	store := &slowFirstColdRead{Strategy: mem, arrived: make(chan struct{}), release: make(chan struct{})}
	clk := newDecClock(decEpoch.Add(10 * time.Second)) // far from the minute's end: no read-ahead
	ctx := context.Background()
	a := newDecNSOn(t, "async", clk, store, time.Minute)
	b := newDecNSOn(t, "async", clk, mem, time.Minute)
	lim := ratelimit.Limit{Window: time.Minute, Max: 10, Algorithm: ratelimit.FixedWindow}

	// A holds another key (so it watches the window).
	_, err := a.Increment(ctx, "other", time.Minute, 1)
	require.NoError(t, err)

	slowErr := make(chan error, 1)
	go func() {
		_, err := a.Peek(ctx, "k", 1, lim) // cold: reads "k" (0), slowly
		slowErr <- err
	}()
	select {
	case <-store.arrived:
	case err := <-slowErr:
		t.Fatalf("the peek ended without a cold read: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("no cold read")
	}
	require.NoError(t, a.Sync(ctx)) // A's cursor for the window

	// B spends the whole limit and pushes it.
	for range 10 {
		d, err := b.Allow(ctx, "k", 1, lim)
		require.NoError(t, err)
		require.True(t, d.Allowed)
	}
	require.NoError(t, b.Sync(ctx))

	// A's cycle lists "k" = 10 (a key it does not hold yet) past its cursor.
	require.NoError(t, a.Sync(ctx))

	close(store.release) // the cold read lands: "k" = 0, as read before B's hits
	require.NoError(t, <-slowErr)

	// A few more cycles: nothing changes in the store.
	for range 3 {
		require.NoError(t, a.Sync(ctx))
	}
	total, err := mem.GetWindow(ctx, a.Name(), strategy.CounterID{Key: "k", Size: time.Minute, Start: decEpoch.UnixMilli()})
	require.NoError(t, err)
	require.EqualValues(t, 10, total, "the store holds B's 10 hits")

	d, err := a.Peek(ctx, "k", 1, lim)
	require.NoError(t, err)
	admitted := allowed(t, a, "k", 10, lim)
	require.NoError(t, a.Sync(ctx))
	total, err = mem.GetWindow(ctx, a.Name(), strategy.CounterID{Key: "k", Size: time.Minute, Start: decEpoch.UnixMilli()})
	require.NoError(t, err)
	t.Logf("after 4 cycles of A: A's peek says %d remaining (allowed %v); A then admitted %d; store total %d under a limit of 10",
		d.Remaining, d.Allowed, admitted, total)
	require.False(t, d.Allowed, "4 cycles after B spent the limit, A still sees it unspent (remaining %d)", d.Remaining)
	require.Zero(t, admitted, "A admitted %d over a limit B had spent 4 cycles before", admitted)
}

// noWatch hides a store's change logs: the node reads what it holds in full
// every cycle (the protocol before watches), as a control.
type noWatch struct{ strategy.Strategy }

// TestWatchColdKeyFollowsNodesAhead: within MaxClockSkew of a
// minute's end, node "slow" watches the next minute (read-ahead) to follow
// nodes whose clocks are ahead. Node "fast", 4 s ahead, spends the whole
// limit of 10 on "k" in the next minute. slow's watch lists "k" = 10 there,
// but slow does not hold "k" yet and skips it; its cursor moves on. Then
// slow gets its first request for "k": the cold read reads the current and
// previous minutes only (0), so slow admits it in the current minute. With
// full reads (control: the same store without change logs) the next cycle
// reads the next minute of a key held near the end (read-ahead) and slow
// follows fast there: every later request is rejected. With watches slow
// never learns it (the next minute's log has nothing new for "k"), and
// admits 9 more over the next cycles: 20 admitted against a limit of 10 in
// the minute fast and slow share.
func TestWatchColdKeyFollowsNodesAhead(t *testing.T) {
	for _, tc := range []struct {
		name  string
		watch bool
		redis bool
	}{{"watch", true, false}, {"fullreads", false, false}, {"redis", true, true}} {
		t.Run(tc.name, func(t *testing.T) {
			var mem strategy.Strategy = memory.New()
			if tc.redis {
				client := testRedisClient(t)
				st, err := rlredis.New(client, rlredis.Options{KeyPrefix: fmt.Sprintf("watchcold%d", time.Now().UnixNano()), Shards: 4})
				require.NoError(t, err)
				mem = st
			} else {
				t.Cleanup(func() { goleak.VerifyNone(t) })
			}
			slowStore := mem
			if !tc.watch {
				slowStore = noWatch{mem}
			}
			behind := newDecClock(decEpoch.Add(57 * time.Second))
			ahead := newDecClock(decEpoch.Add(61 * time.Second))
			slow := newDecNSOn(t, "async", behind, slowStore, time.Minute)
			fast := newDecNSOn(t, "async", ahead, mem, time.Minute)

			admitted := followAhead(t, slow, fast, behind)
			require.NoError(t, slow.Sync(context.Background()))
			t.Logf("%s: fast admitted 10 in the next minute; slow then admitted %d", tc.name, admitted)
			require.LessOrEqual(t, admitted, 1, "slow admitted %d after fast spent the limit in the minute slow follows (only the cold request, before any cycle, may pass)", admitted)
		})
	}
}

// TestWatchKeyHeldInOneOfTwoSizes (held): node a holds "k" only in the
// 1 s size of its table (1 s and 1 min); node b spends a limit of 10 a
// minute on it. a's watch of the minute lists "k", which a holds (in the
// other size): it opens the minute and learns 10, so a's first request
// under the minute's limit is rejected.
func TestWatchKeyHeldInOneOfTwoSizes(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	mem := memory.New()
	clk := newDecClock(decEpoch.Add(10*time.Second + 200*time.Millisecond))
	ctx := context.Background()
	a := newDecNSOn(t, "async", clk, mem, time.Second, time.Minute)
	b := newDecNSOn(t, "async", clk, mem, time.Second, time.Minute)
	sec := ratelimit.Limit{Window: time.Second, Max: 100, Algorithm: ratelimit.FixedWindow}
	min := ratelimit.Limit{Window: time.Minute, Max: 10, Algorithm: ratelimit.FixedWindow}
	d, err := a.Allow(ctx, "k", 1, sec)
	require.NoError(t, err)
	require.True(t, d.Allowed)
	require.NoError(t, a.Sync(ctx))
	for range 10 {
		d, err := b.Allow(ctx, "k", 1, min)
		require.NoError(t, err)
		require.True(t, d.Allowed)
	}
	require.NoError(t, b.Sync(ctx))
	require.NoError(t, a.Sync(ctx))
	d, err = a.Allow(ctx, "k", 1, min)
	require.NoError(t, err)
	require.False(t, d.Allowed, "b spent the minute's 10")
}

// TestWatchNewKeyFollowsNodesAheadColdReadOff is
// TestWatchColdKeyFollowsNodesAhead with ColdRead off: slow's first
// request for "k" makes the key without reading it, and its first cycle
// pushes the hit; under full reads (control) that cycle also reads the next
// minute of a key held near the end and slow follows fast. Under watches the
// read-ahead is left to the watch, which listed "k" before slow held it.
func TestWatchNewKeyFollowsNodesAheadColdReadOff(t *testing.T) {
	for _, watch := range []bool{true, false} {
		t.Run(fmt.Sprint("watch=", watch), func(t *testing.T) {
			t.Cleanup(func() { goleak.VerifyNone(t) })
			mem := memory.New()
			var slowStore strategy.Strategy = mem
			if !watch {
				slowStore = noWatch{mem}
			}
			behind := newDecClock(decEpoch.Add(57 * time.Second))
			ahead := newDecClock(decEpoch.Add(61 * time.Second))
			reg := ratelimit.NewRegistry()
			slow, err := reg.New(ratelimit.Config{WindowSizes: []time.Duration{time.Minute}, Clock: behind.Now, Strategy: slowStore,
				SyncTimeout: 30 * time.Second, SyncRate: time.Hour, ColdRead: ratelimit.ColdReadOff})
			require.NoError(t, err)
			t.Cleanup(func() { require.NoError(t, reg.Close(context.Background())) })
			fast := newDecNSOn(t, "async", ahead, mem, time.Minute)
			admitted := followAhead(t, slow, fast, behind)
			t.Logf("watch=%v: slow admitted %d after fast spent the limit", watch, admitted)
			require.LessOrEqual(t, admitted, 1, "slow admitted %d", admitted)
		})
	}
}

// followAhead runs the scenario of TestWatchColdKeyFollowsNodesAhead: slow
// holds another key and syncs; fast, a minute boundary ahead, spends a fixed
// limit of 10 a minute on "k" and syncs; slow's next cycle lists "k" in the
// next minute while slow does not hold it. Then slow asks for "k" ten times,
// 100 ms apart, syncing after each of the first three. It returns how many
// slow admitted.
func followAhead(t *testing.T, slow, fast *ratelimit.Namespace, behind *decClock) int {
	t.Helper()
	ctx := context.Background()
	lim := ratelimit.Limit{Window: time.Minute, Max: 10, Algorithm: ratelimit.FixedWindow}
	_, err := slow.Increment(ctx, "other", time.Minute, 1) // slow holds something
	require.NoError(t, err)
	require.NoError(t, slow.Sync(ctx))
	for range 10 {
		d, err := fast.Allow(ctx, "k", 1, lim)
		require.NoError(t, err)
		require.True(t, d.Allowed)
	}
	require.NoError(t, fast.Sync(ctx))
	require.NoError(t, slow.Sync(ctx)) // lists "k" in the next minute: not held
	admitted := 0
	for i := range 10 {
		d, err := slow.Allow(ctx, "k", 1, lim)
		require.NoError(t, err)
		if d.Allowed {
			admitted++
		}
		if i < 3 {
			require.NoError(t, slow.Sync(ctx))
		}
		behind.Advance(100 * time.Millisecond)
	}
	return admitted
}
