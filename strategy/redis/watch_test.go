package redis

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit/strategy"
)

// The contract suite runs the watch, bucket and take parts only for what a
// store declares: the Redis store declares them all, so none is skipped.
func TestCapabilities(t *testing.T) {
	_, c := miniClient(t)
	s := newStore(t, c, Options{})
	require.Equal(t, strategy.Capabilities{Watch: true, Buckets: true, Take: true}, strategy.CapabilitiesOf(s))
	var _ strategy.Taker = s
}

// watchOnce pushes diffs with one watch of (size, start) from cursor and
// returns the result and the changes.
func watchOnce(t *testing.T, s *Store, ns string, w strategy.Watch, diffs ...strategy.Diff) (strategy.Result, strategy.Changes) {
	t.Helper()
	res, err := s.PushDiffs(context.Background(), &strategy.Batch{ID: batchID(t), Namespace: ns, Now: w.Start, Diffs: diffs,
		Watches: []strategy.Watch{w}})
	require.NoError(t, err)
	require.Len(t, res.Changes, 1)
	return res, res.Changes[0]
}

func changedMap(t *testing.T, c strategy.Changes) map[string]int64 {
	t.Helper()
	m := map[string]int64{}
	for _, ctr := range c.Counters {
		_, dup := m[ctr.Key]
		require.False(t, dup, "%q listed twice", ctr.Key)
		m[ctr.Key] = ctr.Count
	}
	return m
}

// listedByScripts counts the counters the watch scripts list, the follow-ups
// included: the batch's own counters are never among them.
type listedByScripts struct {
	mu sync.Mutex
	n  int
}

func (l *listedByScripts) DialHook(next goredis.DialHook) goredis.DialHook { return next }
func (l *listedByScripts) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		err := next(ctx, cmd)
		l.note(cmd)
		return err
	}
}
func (l *listedByScripts) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		err := next(ctx, cmds)
		l.note(cmds...)
		return err
	}
}

// note adds the pairs of watch-script replies (status, version, count,
// pairs per watch).
func (l *listedByScripts) note(cmds ...goredis.Cmder) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, c := range cmds {
		if sha, _ := c.Args()[1].(string); c.Name() != "evalsha" || sha != watchScript.Hash() {
			continue
		}
		vals, err := c.(*goredis.Cmd).Slice()
		if err != nil {
			continue
		}
		for i := 0; i+2 < len(vals); {
			status, count := vals[i].(int64), vals[i+2].(int64)
			i += 3
			if status == statusListed || status == statusAll {
				l.n += int(count)
				i += 2 * int(count)
			}
		}
	}
}

// A shard the batch writes in several script calls answers its watches once
// they all ran, listing what other nodes changed and none of the batch's
// own counters (which come from their totals, once each).
func testWatchSeveralCalls(t *testing.T, c goredis.UniversalClient) {
	l := &listedByScripts{}
	c.AddHook(l)
	// One shard, three diffs per script call: 40 diffs are 14 calls.
	s := newStore(t, c, Options{Shards: 1, BatchSize: 3})
	other := newStore(t, c, s.opts)
	ns := "several"
	w := strategy.Watch{Size: time.Minute, Start: base, Limit: 1000}
	var diffs []strategy.Diff
	for i := range 40 {
		diffs = append(diffs, diff(fmt.Sprintf("k%d", i), time.Minute, base, 1))
	}
	_, ch := watchOnce(t, s, ns, w, diffs...)
	require.False(t, ch.Overflow)
	require.Len(t, changedMap(t, ch), 40)
	w.Cursor = ch.Cursor

	// Another node changes k0 (which this batch changes too) and x.
	push := func(s *Store, diffs ...strategy.Diff) {
		_, err := s.PushDiffs(context.Background(), &strategy.Batch{ID: batchID(t), Namespace: ns, Diffs: diffs})
		require.NoError(t, err)
	}
	push(other, diff("k0", time.Minute, base, 5), diff("x", time.Minute, base, 7))
	before := l.n
	res, ch := watchOnce(t, s, ns, w, diffs...)
	require.False(t, ch.Overflow)
	got := changedMap(t, ch)
	require.Len(t, got, 41)
	require.Equal(t, int64(7), got["x"])
	require.Equal(t, int64(7), got["k0"], "1 + 5 + 1")
	require.Equal(t, int64(2), got["k39"])
	require.Equal(t, int64(7), res.Totals[0])
	require.Equal(t, 1, l.n-before, "listed by the scripts: x alone (k0 changed at the batch's own version after)")
	w.Cursor = ch.Cursor

	// Nothing changed since: an empty answer, whatever the calls.
	_, ch = watchOnce(t, s, ns, w)
	require.False(t, ch.Overflow)
	require.Empty(t, ch.Counters)

	// A re-sent batch applies nothing and still lists its counters once.
	b := &strategy.Batch{ID: batchID(t), Namespace: ns, Diffs: diffs, Watches: []strategy.Watch{w}}
	res, err := s.PushDiffs(context.Background(), b)
	require.NoError(t, err)
	require.Equal(t, int64(8), res.Totals[0])
	res, err = s.PushDiffs(context.Background(), b)
	require.NoError(t, err)
	require.Equal(t, int64(8), res.Totals[0])
	require.Len(t, changedMap(t, res.Changes[0]), 40)
	require.Equal(t, int64(8), changedMap(t, res.Changes[0])["k0"])
}

func TestWatchSeveralCallsMiniredis(t *testing.T) {
	_, c := miniClient(t)
	testWatchSeveralCalls(t, c)
}

func TestWatchSeveralCallsRedis(t *testing.T) {
	noLeaks(t)
	testWatchSeveralCalls(t, realClient(t))
}

// Redis losing the data between two watches (FLUSHALL, a restart without
// persistence) gives an Overflow, whether or not the window was written
// again since; never an answer that silently misses the lost counters.
func testWatchAfterDataLoss(t *testing.T, c goredis.UniversalClient, lose func(s *Store)) {
	s := newStore(t, c, Options{Shards: 4})
	ns := "loss"
	w := strategy.Watch{Size: time.Minute, Start: base, Limit: 100}
	var diffs []strategy.Diff
	for i := range 20 {
		diffs = append(diffs, diff(fmt.Sprintf("k%d", i), time.Minute, base, 3))
	}
	_, ch := watchOnce(t, s, ns, w, diffs...)
	require.False(t, ch.Overflow)
	w.Cursor = ch.Cursor

	lose(s)
	_, ch = watchOnce(t, s, ns, w)
	require.True(t, ch.Overflow, "the window was lost since the cursor")

	lose(s)
	_, ch = watchOnce(t, s, ns, w, diff("k1", time.Minute, base, 1))
	require.True(t, ch.Overflow, "the window was lost and written again since the cursor")
	w.Cursor = ch.Cursor
	_, ch = watchOnce(t, s, ns, w, diff("k2", time.Minute, base, 1))
	require.False(t, ch.Overflow, "the new cursor is one of the new window's")
	require.Equal(t, map[string]int64{"k2": 1}, changedMap(t, ch))

	// From the start, a window that lost its version keys (alone) still
	// lists every counter.
	for _, k := range scanKeys(t, c, s.opts.KeyPrefix) {
		if len(k) > 2 && k[len(k)-2:] == versionSuffix {
			require.NoError(t, c.Del(context.Background(), k).Err())
		}
	}
	_, ch = watchOnce(t, s, ns, strategy.Watch{Size: time.Minute, Start: base, Limit: 100})
	require.False(t, ch.Overflow)
	require.Equal(t, map[string]int64{"k1": 1, "k2": 1}, changedMap(t, ch))
}

func TestWatchAfterDataLossMiniredis(t *testing.T) {
	mr, c := miniClient(t)
	testWatchAfterDataLoss(t, c, func(*Store) { mr.FlushAll() })
}

func TestWatchAfterDataLossRedis(t *testing.T) {
	noLeaks(t)
	c := realClient(t)
	// The shared server is not flushed: the store's keys are deleted, which
	// is what FLUSHALL does to them.
	testWatchAfterDataLoss(t, c, func(s *Store) {
		for _, k := range scanKeys(t, c, s.opts.KeyPrefix) {
			require.NoError(t, c.Del(context.Background(), k).Err())
		}
	})
}

// A cursor ahead of its window proves Redis lost versions it had answered
// (a failover to a replica that lagged, simulated by restoring a snapshot of
// the window's keys): the watch overflows, and the window starts a new
// incarnation, so that the cursors of every other node overflow too rather
// than miss what the new primary's writes changed at the versions the lost
// ones had used.
func TestWatchCursorAheadOfTheWindow(t *testing.T) {
	noLeaks(t)
	c := realClient(t)
	ctx := context.Background()
	s := newStore(t, c, Options{Shards: 1})
	ns := "ahead"
	w := strategy.Watch{Size: time.Minute, Start: base, Limit: 100}
	_, ch := watchOnce(t, s, ns, w, diff("a", time.Minute, base, 1))
	behind := w
	behind.Cursor = ch.Cursor // another node's cursor, answered before the lost writes

	h := hashKey(s.shardPrefixes(ns)[0], time.Minute, base)
	keys := []string{h, h + versionSuffix, h + logSuffix, h + markSuffix}
	snapshot := make([]string, len(keys))
	for i, k := range keys {
		d, err := c.Dump(ctx, k).Result()
		if errors.Is(err, goredis.Nil) {
			continue // not there: restoring deletes it
		}
		require.NoError(t, err)
		snapshot[i] = d
	}
	// Writes the replica never got: this node's cursor is past them.
	_, ch = watchOnce(t, s, ns, w, diff("b", time.Minute, base, 1))
	_, ch = watchOnce(t, s, ns, strategy.Watch{Size: w.Size, Start: w.Start, Limit: 100, Cursor: ch.Cursor}, diff("c", time.Minute, base, 1))
	ahead := w
	ahead.Cursor = ch.Cursor
	for i, k := range keys {
		if snapshot[i] == "" {
			require.NoError(t, c.Del(ctx, k).Err())
			continue
		}
		require.NoError(t, c.RestoreReplace(ctx, k, time.Minute, snapshot[i]).Err())
	}

	_, ch = watchOnce(t, s, ns, ahead)
	require.True(t, ch.Overflow, "a cursor past the window's version")
	_, ch2 := watchOnce(t, s, ns, behind)
	require.True(t, ch2.Overflow, "the window started a new incarnation: every older cursor overflows")
	_, ch3 := watchOnce(t, s, ns, strategy.Watch{Size: w.Size, Start: w.Start, Limit: 100, Cursor: ch.Cursor}, diff("d", time.Minute, base, 1))
	require.False(t, ch3.Overflow)
	require.Equal(t, map[string]int64{"d": 1}, changedMap(t, ch3))
	_, ch3 = watchOnce(t, s, ns, strategy.Watch{Size: w.Size, Start: w.Start, Limit: 100})
	require.Equal(t, map[string]int64{"a": 1, "d": 1}, changedMap(t, ch3), "from the start: what the window holds")
}

// Limits count every counter of the window, the batch's own included, over
// all shards.
func TestWatchLimitOverShards(t *testing.T) {
	_, c := miniClient(t)
	s := newStore(t, c, Options{Shards: 8})
	other := newStore(t, c, s.opts)
	ns := "limit"
	w := strategy.Watch{Size: time.Minute, Start: base, Limit: 10}
	_, ch := watchOnce(t, s, ns, w)
	w.Cursor = ch.Cursor
	var diffs []strategy.Diff
	for i := range 6 {
		diffs = append(diffs, diff(fmt.Sprintf("o%d", i), time.Minute, base, 1))
	}
	_, err := other.PushDiffs(context.Background(), &strategy.Batch{ID: batchID(t), Namespace: ns, Diffs: diffs})
	require.NoError(t, err)
	var own []strategy.Diff
	for i := range 4 {
		own = append(own, diff(fmt.Sprintf("m%d", i), time.Minute, base, 1))
	}
	_, ch = watchOnce(t, s, ns, w, own...)
	require.False(t, ch.Overflow, "6 + 4 = the limit")
	require.Len(t, ch.Counters, 10)
	_, err = other.PushDiffs(context.Background(), &strategy.Batch{ID: batchID(t), Namespace: ns, Diffs: diffs})
	require.NoError(t, err)
	_, ch = watchOnce(t, s, ns, w, append(own, diff("m4", time.Minute, base, 1))...)
	require.True(t, ch.Overflow, "6 + 5 is past it")
	require.Empty(t, ch.Counters)
	require.NotEmpty(t, ch.Cursor)
}

// keysOf returns n diffs of one each, keys prefix0..prefix(n-1).
func keysOf(prefix string, n int) []strategy.Diff {
	var ds []strategy.Diff
	for i := range n {
		ds = append(ds, diff(fmt.Sprintf("%s%d", prefix, i), time.Minute, base, 1))
	}
	return ds
}

// A batch that changes at least half of a window's counters in a shard (and
// at least 64) marks its version instead of logging each counter. Its own
// watch lists what others changed as usual; another node's watch from
// before the marker lists everything the window holds (or overflows past
// its limit); markers trimmed past the latest 32 still count.
func testWatchMarkers(t *testing.T, c goredis.UniversalClient, opts Options) {
	s := newStore(t, c, opts)
	other := newStore(t, c, s.opts)
	ns := "markers"
	wa := strategy.Watch{Size: time.Minute, Start: base, Limit: 1000}
	_, ch := watchOnce(t, s, ns, wa, keysOf("a", 10)...) // logged: fewer than 64
	require.False(t, ch.Overflow)
	wa.Cursor = ch.Cursor

	// The other node's big batch: its own watch lists the 10 counters of
	// this node, and its own 100 from their totals.
	wb := strategy.Watch{Size: time.Minute, Start: base, Limit: 1000}
	_, chb := watchOnce(t, other, ns, wb, keysOf("b", 100)...)
	require.False(t, chb.Overflow)
	got := changedMap(t, chb)
	require.Len(t, got, 110)
	wb.Cursor = chb.Cursor

	// This node's watch from before the marker: everything the window holds.
	_, ch = watchOnce(t, s, ns, wa)
	require.False(t, ch.Overflow)
	require.Equal(t, got, changedMap(t, ch))
	wa.Cursor = ch.Cursor
	_, ch = watchOnce(t, s, ns, wa)
	require.Empty(t, ch.Counters, "nothing changed since")

	// Past its limit, the whole window is an Overflow.
	_, chb = watchOnce(t, other, ns, wb, keysOf("b", 100)...)
	require.Equal(t, 100, len(chb.Counters), "its own marker: only its own counters")
	wb.Cursor = chb.Cursor
	_, ch = watchOnce(t, s, ns, strategy.Watch{Size: time.Minute, Start: base, Limit: 50, Cursor: wa.Cursor})
	require.True(t, ch.Overflow)

	// Forty marked batches: the oldest markers are trimmed, and a cursor
	// from before them still sees a marker; the marking node's own
	// consecutive watches list nothing of the other's.
	for range 40 {
		_, chb = watchOnce(t, other, ns, wb, keysOf("b", 100)...)
		require.Len(t, chb.Counters, 100)
		wb.Cursor = chb.Cursor
	}
	_, ch = watchOnce(t, s, ns, wa, diff("a0", time.Minute, base, 1))
	require.False(t, ch.Overflow)
	got = changedMap(t, ch)
	require.Len(t, got, 110)
	require.Equal(t, int64(42), got["b7"])
	require.Equal(t, int64(2), got["a0"])
}

func TestWatchMarkersMiniredis(t *testing.T) {
	_, c := miniClient(t)
	testWatchMarkers(t, c, Options{Shards: 1})
}

func TestWatchMarkersRedis(t *testing.T) {
	noLeaks(t)
	testWatchMarkers(t, realClient(t), Options{Shards: 1})
	// Several script calls per batch (30 diffs each): each marks, and the
	// follow-up skips the batch's own markers.
	t.Run("SeveralCalls", func(t *testing.T) {
		testWatchMarkers(t, realClient(t), Options{Shards: 1, BatchSize: 30})
	})
}

// A batch of more marked script calls than the markers kept (34 calls of 3
// diffs) pushes another batch's marker out of the set: the trimmed marker
// still makes the batch's watch list everything (the other batch's changes
// were never logged).
func TestWatchMarkersTrimmedByOwnCalls(t *testing.T) {
	_, c := miniClient(t)
	s := newStore(t, c, Options{Shards: 1, BatchSize: 3})
	other := newStore(t, c, Options{KeyPrefix: s.opts.KeyPrefix, Shards: 1})
	ns := "trimmed"
	w := strategy.Watch{Size: time.Minute, Start: base, Limit: 1000}
	_, ch := watchOnce(t, s, ns, w, keysOf("a", 100)...)
	w.Cursor = ch.Cursor
	_, err := other.PushDiffs(context.Background(), &strategy.Batch{ID: batchID(t), Namespace: ns, Diffs: keysOf("b", 100)})
	require.NoError(t, err) // marked, not logged
	_, ch = watchOnce(t, s, ns, w, keysOf("a", 100)...)
	require.False(t, ch.Overflow)
	got := changedMap(t, ch)
	require.Len(t, got, 200, "the other batch's counters too")
	require.Equal(t, int64(1), got["b5"])
	require.Equal(t, int64(2), got["a5"])
}

// Each shard answers a watch with a share of the limit the batch's own
// diffs leave: a watch past its limit overflows in the scripts, without
// listing up to the whole limit in every shard.
func TestShardLimits(t *testing.T) {
	_, c := miniClient(t)
	for _, tc := range []struct {
		shards, limit, own, want int
	}{
		{64, 1000, 0, 94}, // 1000/64*2 + 64
		{64, 100_000, 0, 3188},
		{64, 1000, 999, 1},
		{64, 1000, 1001, -1},
		{1, 1000, 10, 990},
		{4, 10, 0, 10},
	} {
		s := newStore(t, c, Options{Shards: tc.shards})
		b := &strategy.Batch{Diffs: keysOf("k", tc.own), Watches: []strategy.Watch{{Size: time.Minute, Start: base, Limit: tc.limit},
			{Size: time.Hour, Start: base, Limit: tc.limit}}}
		require.Equal(t, []int{tc.want, min(tc.limit, tc.limit/tc.shards*2+64)}, s.shardLimits(b), "%+v", tc)
	}

	l := &listedByScripts{}
	c.AddHook(l)
	s := newStore(t, c, Options{Shards: 4})
	other := newStore(t, c, s.opts)
	ns := "share"
	_, err := other.PushDiffs(context.Background(), &strategy.Batch{ID: batchID(t), Namespace: ns, Diffs: keysOf("o", 100)})
	require.NoError(t, err)
	// 31 diffs in one shard: the other three answer with the watch script.
	var own []strategy.Diff
	for i := 0; len(own) < 31; i++ {
		if k := fmt.Sprintf("k%d", i); s.shardOf(keyHash(k)) == 0 {
			own = append(own, diff(k, time.Minute, base, 1))
		}
	}
	_, ch := watchOnce(t, s, ns, strategy.Watch{Size: time.Minute, Start: base, Limit: 30}, own...)
	require.True(t, ch.Overflow, "its own 31 diffs are past 30")
	require.Zero(t, l.n, "no shard listed anything")
	_, ch = watchOnce(t, s, ns, strategy.Watch{Size: time.Minute, Start: base, Limit: 1000}, own...)
	require.False(t, ch.Overflow)
	require.Len(t, changedMap(t, ch), 131)
	require.Positive(t, l.n, "within the limit, the other shards listed the other node's counters")
}

// A bulk batch (a node in high churn, strategy.Batch.Bulk) marks its
// versions however few its diffs: another node's watch then lists the whole
// window instead of the batch's counters.
func TestBulkBatchMarks(t *testing.T) {
	_, c := miniClient(t)
	s := newStore(t, c, Options{Shards: 1})
	other := newStore(t, c, s.opts)
	ns := "bulk"
	w := strategy.Watch{Size: time.Minute, Start: base, Limit: 1000}
	_, ch := watchOnce(t, s, ns, w, keysOf("a", 10)...)
	w.Cursor = ch.Cursor
	for _, bulk := range []bool{false, true} {
		_, err := other.PushDiffs(context.Background(), &strategy.Batch{ID: batchID(t), Namespace: ns, Diffs: keysOf("b", 5), Bulk: bulk})
		require.NoError(t, err)
		_, ch = watchOnce(t, s, ns, w)
		require.False(t, ch.Overflow)
		if bulk {
			require.Len(t, ch.Counters, 15, "marked: the whole window")
		} else {
			require.Len(t, ch.Counters, 5, "logged: the batch's counters")
		}
		w.Cursor = ch.Cursor
	}
}

// A pass that changes most of a window marks every one of its batches, not
// only its first, though no batch alone is half the window: a watch whose
// cursor falls between two batches of the pass (it read after the first)
// lists the whole window again after the second, whose changes were never
// logged. One marker for the whole pass would lose the second batch's
// changes to that watch unless the marker moved with each batch.
func TestWatchBetweenBatchesOfAMarkedPass(t *testing.T) {
	_, c := miniClient(t)
	s := newStore(t, c, Options{Shards: 1})
	other := newStore(t, c, s.opts)
	ns := "pass"
	ctx := context.Background()
	// The window's 200 counters, before anyone watches it (nothing marked
	// or logged), and one more counter logged since the watch's cursor.
	_, err := other.PushDiffs(ctx, &strategy.Batch{ID: batchID(t), Namespace: ns, Now: base, Diffs: keysOf("k", 200)})
	require.NoError(t, err)
	w := strategy.Watch{Size: time.Minute, Start: base, Limit: 1000}
	_, ch := watchOnce(t, s, ns, w)
	require.Len(t, ch.Counters, 200)
	w.Cursor = ch.Cursor
	_, ch = watchOnce(t, s, ns, w, diff("a", time.Minute, base, 1))
	require.Len(t, ch.Counters, 1, "its own counter only")
	w.Cursor = ch.Cursor
	marks := hashKey(s.shardPrefixes(ns)[0], time.Minute, base) + markSuffix
	markers := func() int64 {
		n, err := c.ZCard(ctx, marks).Result()
		require.NoError(t, err)
		return n
	}
	before := markers()
	// The other node's pass of 200 diffs, in two batches of 100: each
	// alone is less than half the window (201 counters), and would log;
	// the pass's 200 mark.
	all := keysOf("k", 200)
	for i, part := range [][]strategy.Diff{all[:100], all[100:]} {
		_, err := other.PushDiffs(ctx, &strategy.Batch{ID: batchID(t), Namespace: ns, Now: base, Diffs: part, PassDiffs: 200})
		require.NoError(t, err)
		require.Equal(t, before+int64(i+1), markers(), "batch %d marked", i)
		_, ch = watchOnce(t, s, ns, w)
		require.False(t, ch.Overflow)
		got := changedMap(t, ch)
		require.Len(t, got, 201, "batch %d: the whole window", i)
		for j, d := range part {
			require.Equal(t, int64(2), got[d.Key], "batch %d, counter %d", i, j)
		}
		w.Cursor = ch.Cursor
	}
	_, ch = watchOnce(t, s, ns, w)
	require.Empty(t, ch.Counters, "nothing changed since")
}
