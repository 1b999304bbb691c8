package postgres

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit/strategy"
)

// totals reads every counter of ns at size through a direct pool.
func totals(t testing.TB, s *Store, ns string, size time.Duration, now int64) map[string]int64 {
	t.Helper()
	out := map[string]int64{}
	for c, err := range s.GetCounters(context.Background(), strategy.Query{Namespace: ns, Sizes: []time.Duration{size}, Now: now}) {
		require.NoError(t, err)
		out[c.Key] += c.Count
	}
	return out
}

// lostCommits pushes n batches through the proxy, each cut once after its
// statement reached the server, and re-sends every batch under the same ID
// until it succeeds, like the core's sync loop. It returns what the keys
// should total.
func lostCommits(t *testing.T, s *Store, p *pgProxy, ns string, n int) map[string]int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	keys := []string{"a", "b", "c", "d", "e", "f", "g", "h"}
	want := map[string]int64{}
	prefix := fmt.Sprintf("lost-%d", time.Now().UnixNano())
	for i := range n {
		var diffs []strategy.Diff
		for _, k := range keys {
			diffs = append(diffs, diff(k, time.Minute, base, rand.Int64N(5)+1))
		}
		rand.Shuffle(len(diffs), func(i, j int) { diffs[i], diffs[j] = diffs[j], diffs[i] })
		b := &strategy.Batch{ID: fmt.Sprintf("%s-%05d", prefix, i), Namespace: ns, Diffs: diffs}
		// Every other cut waits for the server's reply, so the commit
		// surely happened; the others cut as soon as the statement is
		// delivered.
		p.cutAfter(b.ID, 1, i%2 == 0)
		for attempt := 0; ; attempt++ {
			require.Less(t, attempt, 10, "batch %s never succeeded", b.ID)
			res, err := s.PushDiffs(ctx, b)
			if err != nil {
				// The statement reached the server: the outcome is
				// unknown, never "not applied".
				require.False(t, errors.Is(err, strategy.ErrNotApplied), "attempt %d: %v", attempt, err)
				continue
			}
			for j, d := range diffs {
				if !s.noGuard {
					require.Equal(t, want[d.Key]+d.Delta, res.Totals[j], "batch %d key %s", i, d.Key)
				}
			}
			break
		}
		for _, d := range diffs {
			want[d.Key] += d.Delta
		}
	}
	return want
}

// A push whose reply is lost after the server committed it is re-sent under
// the same batch ID and not applied twice.
func TestLostCommit(t *testing.T) {
	dsn := testDSN(t)
	direct := newPool(t, dsn)
	table := uniqueTable(t)
	check := newStore(t, direct, Options{Table: table})

	for _, c := range []struct {
		name    string
		retries int
		mode    pgx.QueryExecMode
	}{
		{"CallerRetries", -1, 0}, // every cut reaches the caller, which re-sends
		{"StoreRetries", 0, 0},   // the store re-sends at once (default MaxRetries)
		// pgx reports a reply lost in simple-protocol mode as "conn closed",
		// which claims SafeToRetry: it must not pass for "not applied".
		{"SimpleProtocol", -1, pgx.QueryExecModeSimpleProtocol},
	} {
		t.Run(c.name, func(t *testing.T) {
			p, pool := newProxy(t, dsn, func(cfg *pgxpool.Config) {
				cfg.MaxConns = 2
				if c.mode != 0 {
					cfg.ConnConfig.DefaultQueryExecMode = c.mode
				}
			})
			s := newStore(t, pool, Options{Table: table, MaxRetries: c.retries})
			ns := "lost-commit-" + c.name
			want := lostCommits(t, s, p, ns, 200)
			require.Equal(t, int64(200), p.cutCount.Load(), "every push was cut once")
			require.Equal(t, want, totals(t, check, ns, time.Minute, base))
		})
	}

	// The same test without the batch-ID guard counts the lost commits
	// twice: the guard is what makes the totals exact.
	t.Run("WithoutGuardFails", func(t *testing.T) {
		p, pool := newProxy(t, dsn, func(cfg *pgxpool.Config) { cfg.MaxConns = 2 })
		s := newStore(t, pool, Options{Table: table, MaxRetries: -1})
		s.noGuard = true
		ns := "lost-commit-unguarded"
		want := lostCommits(t, s, p, ns, 20)
		got := totals(t, check, ns, time.Minute, base)
		require.NotEqual(t, want, got)
		for k, n := range want {
			// The 10 cuts that waited for the commit applied twice for sure.
			require.Greater(t, got[k], n, k)
		}
	})
}

// A batch split in parts, cut after its second part committed, reports an
// unknown outcome; the re-sent batch completes it exactly.
func TestMultiPartLostCommit(t *testing.T) {
	dsn := testDSN(t)
	p, pool := newProxy(t, dsn)
	s := newStore(t, pool, Options{MaxPushRows: 2, MaxRetries: -1})
	ctx := context.Background()
	var diffs []strategy.Diff
	for i := range 7 {
		diffs = append(diffs, diff(fmt.Sprint("k", i), time.Minute, base, int64(i+1)))
	}
	b := &strategy.Batch{ID: "parts", Namespace: "ns", Diffs: diffs}
	p.cutAfter("parts#1/4", 1, true)
	_, err := s.PushDiffs(ctx, b)
	require.Error(t, err)
	require.False(t, errors.Is(err, strategy.ErrNotApplied), "%v", err)
	require.Equal(t, int64(1), p.cutCount.Load())
	res, err := s.PushDiffs(ctx, b)
	require.NoError(t, err)
	require.Equal(t, []int64{1, 2, 3, 4, 5, 6, 7}, res.Totals)

	// With the server unreachable nothing of the batch is written. (The
	// first pushes may go out on pooled connections the proxy just closed,
	// which looks exactly like a lost reply: unknown outcome.)
	p.setDown(true)
	refused := false
	for i := 0; i < 5 && !refused; i++ {
		_, err = s.PushDiffs(ctx, &strategy.Batch{ID: fmt.Sprint("down-", i), Namespace: "ns", Diffs: diffs})
		require.Error(t, err)
		refused = errors.Is(err, strategy.ErrNotApplied)
	}
	require.True(t, refused, "once the stale connections are gone, a refused push is not applied")
}

// caller models the core's sync loop: a batch whose outcome is unknown is
// re-sent unchanged until it succeeds; diffs of a batch surely not applied
// are merged into the next one.
type caller struct {
	s       *Store
	ns      string
	seq     int
	pending *strategy.Batch // outcome unknown: re-send as is
	merged  int64           // not applied: send with the next batch
	total   int64           // every hit counted by the caller
	errs    struct{ notApplied, unknown int }
}

func (c *caller) cycle(ctx context.Context, hits int64) error {
	c.total += hits
	c.merged += hits
	b := c.pending
	if b == nil {
		c.seq++
		b = &strategy.Batch{ID: fmt.Sprintf("%s-%d-%d", c.ns, time.Now().UnixNano(), c.seq), Namespace: c.ns,
			Diffs: []strategy.Diff{diff("k", time.Minute, base, c.merged)}}
		c.merged = 0
	}
	_, err := c.s.PushDiffs(ctx, b)
	switch {
	case err == nil:
		c.pending = nil
	case c.pending == nil && errors.Is(err, strategy.ErrNotApplied):
		c.errs.notApplied++
		c.merged += b.Diffs[0].Delta
	default:
		// A re-sent batch stays pending even if this attempt was surely
		// not applied: an earlier one may have been.
		c.errs.unknown++
		c.pending = b
	}
	return err
}

// With the store unreachable for several cycles (connections refused, or
// black-holed so statements leave and nothing comes back), no hit is lost or
// counted twice once it is back.
func TestOutage(t *testing.T) {
	dsn := testDSN(t)
	p, pool := newProxy(t, dsn, func(cfg *pgxpool.Config) { cfg.MaxConns = 1 })
	s := newStore(t, pool, Options{})
	ctx := context.Background()
	c := &caller{s: s, ns: "outage"}
	require.NoError(t, c.cycle(ctx, 1))

	p.setDown(true)
	for range 4 {
		require.Error(t, c.cycle(ctx, 10))
		for _, err := range s.GetCounters(ctx, strategy.Query{Namespace: c.ns, Sizes: []time.Duration{time.Minute}, Now: base}) {
			require.Error(t, err)
		}
	}
	// The first cycle may have gone out on the pooled connection the proxy
	// just closed, which looks exactly like a lost reply; a fresh batch on a
	// refused connection was surely not applied.
	_, err := s.PushDiffs(ctx, &strategy.Batch{ID: "refused", Namespace: c.ns, Diffs: []strategy.Diff{diff("k", time.Minute, base, 1)}})
	require.ErrorIs(t, err, strategy.ErrNotApplied)
	p.setDown(false)
	for c.pending != nil || c.merged != 0 {
		require.NoError(t, c.cycle(ctx, 0))
	}
	require.Equal(t, map[string]int64{"k": c.total}, totals(t, s, c.ns, time.Minute, base))

	// Black hole: the first statement leaves and no answer comes before the
	// deadline (unknown outcome); then new connections hang in the
	// handshake (nothing sent: not applied).
	c.errs.notApplied, c.errs.unknown = 0, 0
	p.blackhole.Store(true)
	for range 4 {
		short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		err := c.cycle(short, 100)
		cancel()
		require.Error(t, err)
	}
	require.Equal(t, 4, c.errs.unknown, "a batch once sent stays unknown until it succeeds")
	p.blackhole.Store(false)
	p.closeAll()
	for c.pending != nil || c.merged != 0 {
		require.NoError(t, c.cycle(ctx, 0))
	}
	require.Equal(t, map[string]int64{"k": c.total}, totals(t, s, c.ns, time.Minute, base))

	// A fresh connection that hangs in the handshake sent nothing.
	freshPool := p.newPool(t)
	fresh := newStore(t, freshPool, Options{Table: s.opts.Table})
	freshPool.Reset() // drop the connection New used
	p.blackhole.Store(true)
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	_, err = fresh.PushDiffs(short, &strategy.Batch{ID: "never", Namespace: c.ns, Diffs: []strategy.Diff{diff("k", time.Minute, base, 1)}})
	require.ErrorIs(t, err, strategy.ErrNotApplied)
	p.blackhole.Store(false)
}
