package postgres

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit/strategy"
)

// watchOnce pushes diffs with one watch of the minute window at base and
// returns its answer.
func watchOnce(t *testing.T, s *Store, ns, cursor string, limit int, diffs ...strategy.Diff) strategy.Changes {
	t.Helper()
	res, err := s.PushDiffs(context.Background(), &strategy.Batch{ID: fmt.Sprintf("w-%d", time.Now().UnixNano()), Namespace: ns,
		Now: base, Diffs: diffs, Watches: []strategy.Watch{{Size: time.Minute, Start: base, Cursor: cursor, Limit: limit}}})
	require.NoError(t, err)
	return res.Changes[0]
}

// listed returns the counters of an answer by key.
func listed(c strategy.Changes) map[string]int64 {
	out := map[string]int64{}
	for _, ctr := range c.Counters {
		out[ctr.Key] = ctr.Count
	}
	return out
}

// The classic trap of change logs: a push P gets its transaction ID, then
// waits (here for a row lock another session holds); a later push Q, with a
// higher ID, commits; a watch answered now sees Q and not P. A cursor moved
// past the highest ID the watch saw would skip P once P commits: the
// store's cursor (its snapshot's xmin) lists P in the next watch.
func TestWatchInFlightWrite(t *testing.T) {
	dsn := testDSN(t)
	app := uniqueTable(t)
	pool := newPool(t, dsn, func(c *pgxpool.Config) { c.ConnConfig.RuntimeParams["application_name"] = app })
	s := newStore(t, pool, Options{Table: app})
	other := newPool(t, dsn)
	ctx := context.Background()
	ns := "inflight"
	w := time.Minute

	c0 := watchOnce(t, s, ns, "", 100, diff("p", w, base, 1))
	require.Equal(t, map[string]int64{"p": 1}, listed(c0))

	// Another session locks p's counter, so P blocks in its upsert, after
	// inserting its batch ID: its transaction ID is taken.
	tx, err := other.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `SELECT 1 FROM `+s.counters+` WHERE namespace = $1 AND key = 'p' FOR UPDATE`, ns)
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() {
		_, err := s.PushDiffs(ctx, &strategy.Batch{ID: "P", Namespace: ns, Diffs: []strategy.Diff{diff("p", w, base, 1)}})
		done <- err
	}()
	var pxid int64
	require.Eventually(t, func() bool {
		// P's backend waits for a lock, with a transaction ID.
		err := other.QueryRow(ctx, `SELECT backend_xid::text::bigint FROM pg_stat_activity
			WHERE application_name = $1 AND wait_event_type = 'Lock' AND backend_xid IS NOT NULL`, app).Scan(&pxid)
		return err == nil
	}, 10*time.Second, 5*time.Millisecond, "P never waited for the lock")

	// Q commits with a higher transaction ID; a watch then sees Q and not
	// P.
	_, err = s.PushDiffs(ctx, &strategy.Batch{ID: "Q", Namespace: ns, Diffs: []strategy.Diff{diff("q", w, base, 5)}})
	require.NoError(t, err)
	var qxid int64
	require.NoError(t, other.QueryRow(ctx, `SELECT max(xid) FROM `+s.changes+` WHERE namespace = $1`, ns).Scan(&qxid))
	require.Greater(t, qxid, pxid, "Q's transaction ID is above P's, which is still in flight")
	seen := watchOnce(t, s, ns, c0.Cursor, 100)
	require.False(t, seen.Overflow)
	require.Equal(t, map[string]int64{"q": 5}, listed(seen), "P has not committed: p is not listed")

	// P commits; the watch from that answer lists it.
	require.NoError(t, tx.Rollback(ctx))
	require.NoError(t, <-done)
	c3 := watchOnce(t, s, ns, seen.Cursor, 100)
	require.False(t, c3.Overflow)
	require.Equal(t, map[string]int64{"p": 2, "q": 5}, listed(c3),
		"the write in flight when the watch saw Q (and Q again: the cursor is below P's ID)")
	// And only once its cursor is past it does it stop being listed.
	c4 := watchOnce(t, s, ns, c3.Cursor, 100)
	require.Empty(t, c4.Counters)
}

// A cursor is valid on one incarnation of the tables: after they are dropped
// and created again, or truncated, it is answered with an Overflow, and the
// overflow's cursor is valid.
func TestWatchOverflowsOnNewTables(t *testing.T) {
	pool := newPool(t, testDSN(t))
	s := newStore(t, pool, Options{})
	ctx := context.Background()
	ns := "incarnation"
	w := time.Minute
	c := watchOnce(t, s, ns, "", 100, diff("a", w, base, 1))
	require.False(t, c.Overflow)
	for _, change := range []string{
		`DROP TABLE ` + s.counters + `, ` + s.batches + `, ` + s.changes, // created again by the next push
		`TRUNCATE ` + s.counters,
		`TRUNCATE ` + s.changes,
	} {
		_, err := pool.Exec(ctx, change)
		require.NoError(t, err)
		c2 := watchOnce(t, s, ns, c.Cursor, 100, diff("b", w, base, 1))
		require.True(t, c2.Overflow, "after %s", change)
		require.Empty(t, c2.Counters)
		c3 := watchOnce(t, s, ns, c2.Cursor, 100)
		require.False(t, c3.Overflow, "the overflow's cursor, after %s", change)
		c = c3
	}
	for _, bad := range []string{"garbage", "1/x/12/", "1//12/", "2/" + c.Cursor[2:], "1/a/-4/", "1/a/1/x"} {
		require.True(t, watchOnce(t, s, ns, bad, 100).Overflow, "%q", bad)
	}
}

// A cursor of another server, or of the same server before a restart, is
// answered with an Overflow.
func TestWatchOverflowsOnAnotherServer(t *testing.T) {
	dsn := testDSN(t)
	srv, own := ownServer(t)
	shared := newPool(t, dsn)
	table := uniqueTable(t)
	a := newStore(t, shared, Options{Table: table})
	b, err := New(context.Background(), own, Options{Table: table})
	require.NoError(t, err)
	ns := "servers"
	ca := watchOnce(t, a, ns, "", 100, diff("a", time.Minute, base, 1))
	cb := watchOnce(t, b, ns, "", 100, diff("a", time.Minute, base, 1))
	require.True(t, watchOnce(t, b, ns, ca.Cursor, 100).Overflow, "the shared server's cursor on another server")
	require.True(t, watchOnce(t, a, ns, cb.Cursor, 100).Overflow, "and the other way")
	cb = watchOnce(t, b, ns, cb.Cursor, 100)
	require.False(t, cb.Overflow)

	srv.Stop("immediate")
	srv.Restart()
	own.Reset()
	var c strategy.Changes
	require.Eventually(t, func() bool {
		res, err := b.PushDiffs(context.Background(), &strategy.Batch{ID: "after-restart", Namespace: ns,
			Watches: []strategy.Watch{{Size: time.Minute, Start: base, Cursor: cb.Cursor, Limit: 100}}})
		if err == nil {
			c = res.Changes[0]
		}
		return err == nil
	}, 30*time.Second, 50*time.Millisecond)
	require.True(t, c.Overflow, "a cursor from before the restart (an unlogged table may have been emptied)")
}

// Watches of a batch sent in parts are answered once every part is applied:
// the other nodes' changes listed, the batch's own counters with their
// totals, and the batch's parts left out of the next watch.
func TestWatchMultiPart(t *testing.T) {
	pool := newPool(t, testDSN(t))
	s := newStore(t, pool, Options{MaxPushRows: 3})
	other := newStore(t, pool, Options{Table: s.opts.Table})
	ns := "parts"
	w := time.Minute
	c := watchOnce(t, s, ns, "", 100)
	var mine []strategy.Diff
	want := map[string]int64{}
	for i := range 8 {
		k := fmt.Sprint("mine-", i)
		mine = append(mine, diff(k, w, base, int64(i+1)))
		want[k] = int64(i + 1)
	}
	_, err := other.PushDiffs(context.Background(), &strategy.Batch{ID: "theirs", Namespace: ns,
		Diffs: []strategy.Diff{diff("theirs", w, base, 7), diff("mine-0", w, base, 10)}})
	require.NoError(t, err)
	want["theirs"], want["mine-0"] = 7, 11
	c = watchOnce(t, s, ns, c.Cursor, 100, mine...)
	require.False(t, c.Overflow)
	require.Equal(t, want, listed(c))
	next := watchOnce(t, s, ns, c.Cursor, 100)
	require.False(t, next.Overflow)
	require.Empty(t, next.Counters, "the batch's own parts are not listed again")

	// The limit counts the batch's own counters too.
	c = watchOnce(t, s, ns, next.Cursor, 5, mine...)
	require.True(t, c.Overflow)
	require.Empty(t, watchOnce(t, s, ns, c.Cursor, 5).Counters)
}

// Purge trims the change log past ChangeRetention, leaving a marker: a
// cursor from before the trimmed entries is answered with an Overflow, a
// later one is not.
func TestWatchRetention(t *testing.T) {
	pool := newPool(t, testDSN(t))
	s := newStore(t, pool, Options{PurgeInterval: time.Millisecond, ChangeRetention: time.Second, MaxClockSkew: time.Millisecond})
	ctx := context.Background()
	ns := "retention"
	// A live window, so that Purge keeps it.
	w := time.Hour
	start := strategy.WindowStart(serverMillis(t, pool), w)
	watch := func(cursor string, diffs ...strategy.Diff) strategy.Changes {
		t.Helper()
		res, err := s.PushDiffs(ctx, &strategy.Batch{ID: fmt.Sprintf("r-%d", time.Now().UnixNano()), Namespace: ns, Diffs: diffs,
			Watches: []strategy.Watch{{Size: w, Start: start, Cursor: cursor, Limit: 100}}})
		require.NoError(t, err)
		return res.Changes[0]
	}
	old := watch("", diff("a", w, start, 1))
	c := watch(old.Cursor, diff("b", w, start, 1))
	require.Equal(t, map[string]int64{"b": 1}, listed(c))
	entries := func() int64 { return rowCount(t, pool, s.opts.Table+changesSuffix, "keys IS NOT NULL") }
	require.Equal(t, int64(2), entries())
	// The entries were logged ten seconds ago, by the server's clock.
	_, err := pool.Exec(ctx, `UPDATE `+s.changes+` SET logged_at = logged_at - 10000`)
	require.NoError(t, err)
	require.NoError(t, s.Purge(ctx, serverMillis(t, pool)))
	require.Zero(t, entries())
	require.Equal(t, int64(1), rowCount(t, pool, s.opts.Table+changesSuffix, "keys IS NULL"), "one marker for the window")
	require.True(t, watch(old.Cursor).Overflow, "entries from the cursor on were trimmed")
	// The marker stands for every entry it replaced, the cursor's own
	// included: an Overflow too (a trimmed entry is older than any cursor
	// of a node that syncs within the retention).
	c = watch(c.Cursor)
	require.True(t, c.Overflow)
	c = watch(c.Cursor, diff("c", w, start, 1))
	require.False(t, c.Overflow, "a cursor past the trimmed entries")
	require.Equal(t, map[string]int64{"c": 1}, listed(c))
	c = watch(c.Cursor)
	require.False(t, c.Overflow)
	require.Empty(t, c.Counters)
	require.Equal(t, int64(1), entries(), "entries within the retention are kept")
}

// The counters table keeps one index and HOT updates: watches add no index
// to it, and a push's updates stay heap-only.
func TestWatchKeepsUpdatesHOT(t *testing.T) {
	// One connection, whose statistics the test flushes.
	pool := newPool(t, testDSN(t), func(c *pgxpool.Config) { c.MaxConns = 1 })
	s := newStore(t, pool, Options{})
	ctx := context.Background()
	var diffs []strategy.Diff
	for i := range 2000 {
		diffs = append(diffs, diff(fmt.Sprint("k", i), time.Minute, base, 1))
	}
	for i := range 2 { // an insert, then an update of every counter
		_, err := s.PushDiffs(ctx, &strategy.Batch{ID: fmt.Sprint("hot-", i), Namespace: "hot", Diffs: diffs,
			Watches: []strategy.Watch{{Size: time.Minute, Start: base, Limit: 10}}})
		require.NoError(t, err)
	}
	var indexes int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_index WHERE indrelid = to_regclass($1)`, s.counters).Scan(&indexes))
	require.Equal(t, 1, indexes, "the primary key only")
	// A backend reports its statistics at most once a second, unless told
	// to (PostgreSQL 15+): the pushes ran on this connection.
	_, err := pool.Exec(ctx, `SELECT pg_stat_force_next_flush()`)
	require.NoError(t, err)
	var upd, hot int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relid = to_regclass($1)`, s.counters).Scan(&upd, &hot))
	require.Equal(t, int64(2000), upd)
	require.Equal(t, upd, hot, "every update of the counters is heap-only")
}
