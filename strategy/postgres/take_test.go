package postgres

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit/strategy"
	"github.com/ratesync/ratelimit/strategy/memory"
	"github.com/ratesync/ratelimit/strategy/strategytest"
)

// The store implements every capability the contract suite checks: were one
// missing, the suite would skip its part silently.
func TestCapabilities(t *testing.T) {
	pool := newPool(t, testDSN(t))
	s := newStore(t, pool, Options{})
	require.Equal(t, strategy.Capabilities{Watch: true, Buckets: true, Take: true}, strategy.CapabilitiesOf(s))
	var _ strategy.Taker = s
}

// The contract holds in every pgx query execution mode, including the ones
// used behind a transaction-mode pooler (exec, simple protocol), which send
// parameters and results as text.
func TestContractExecModes(t *testing.T) {
	dsn := testDSN(t)
	// TestContract runs the default mode, cache_statement.
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheDescribe,
		pgx.QueryExecModeDescribeExec, pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol} {
		t.Run(mode.String(), func(t *testing.T) {
			pool := newPool(t, dsn, func(c *pgxpool.Config) { c.ConnConfig.DefaultQueryExecMode = mode })
			strategytest.Run(t, func(t *testing.T) strategy.Strategy { return newStore(t, pool, Options{}) })
		})
	}
}

// A Take whose reply is lost after the server committed it (or as soon as
// it was delivered) is re-sent under its ID and decided once: the buckets
// and the logs hold each take once, and a re-send repeats the decision.
func TestTakeLostReply(t *testing.T) {
	dsn := testDSN(t)
	table := uniqueTable(t)
	for _, c := range []struct {
		name    string
		retries int
		mode    pgx.QueryExecMode
	}{
		{"CallerRetries", -1, 0},
		{"StoreRetries", 0, 0},
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
			ctx := context.Background()
			ns := "take-lost-" + c.name
			const n = 40
			limits := func(tk *strategy.Take) {
				tk.Buckets = []strategy.TakeBucket{{Period: time.Hour, Interval: 1000, Burst: n}}
				tk.Logs = []strategy.TakeLog{{Window: time.Hour, Max: n}}
			}
			for i := range n {
				tk := &strategy.Take{ID: fmt.Sprintf("%s-%d-%d", ns, time.Now().UnixNano(), i), Namespace: ns, Key: "k", Now: base, Cost: 1}
				limits(tk)
				p.cutAfter(tk.ID, 1, i%2 == 0)
				var res strategy.TakeResult
				resendUntilAnswered(t, tk.ID, func() (err error) {
					res, err = s.Take(ctx, tk)
					return err
				})
				require.True(t, res.Allowed, "take %d", i)
				require.Equal(t, float64(base+int64(i+1)*1000), res.Buckets[0].TAT, "take %d spent once", i)
				require.Equal(t, int64(i+1), res.Logs[0].Count, "take %d logged once", i)
			}
			require.Equal(t, int64(n), p.cutCount.Load(), "every take was cut once")
			tk := &strategy.Take{Namespace: ns, Key: "k", Now: base, Cost: 1, Peek: true}
			limits(tk)
			res, err := s.Take(ctx, tk)
			require.NoError(t, err)
			require.False(t, res.Allowed, "the bucket and the log are full: every take counted once")
			require.Equal(t, float64(base+n*1000), res.Buckets[0].TAT)
		})
	}
}

// resendUntilAnswered calls send, a request whose reply the proxy cuts,
// until it succeeds: every failure must leave the outcome unknown (the
// statement reached the server), never "not applied".
func resendUntilAnswered(t *testing.T, id string, send func() error) {
	t.Helper()
	for attempt := 0; ; attempt++ {
		require.Less(t, attempt, 10, "%s never succeeded", id)
		err := send()
		if err == nil {
			return
		}
		require.False(t, errors.Is(err, strategy.ErrNotApplied), "%s, attempt %d: %v", id, attempt, err)
	}
}

// A push of bucket diffs whose reply is lost is re-sent under its ID and
// applied once.
func TestBucketPushLostReply(t *testing.T) {
	dsn := testDSN(t)
	p, pool := newProxy(t, dsn, func(cfg *pgxpool.Config) { cfg.MaxConns = 2 })
	s := newStore(t, pool, Options{MaxRetries: -1})
	ctx := context.Background()
	a := strategy.BucketID{Key: "a", Period: time.Minute}
	const n = 30
	for i := range n {
		b := &strategy.Batch{ID: fmt.Sprintf("bucket-lost-%d-%d", time.Now().UnixNano(), i), Namespace: "ns", Now: base,
			BucketDiffs: []strategy.BucketDiff{strategy.SpendDiff(a, 1, 250, base)}, Diffs: []strategy.Diff{diff("a", time.Minute, base, 1)}}
		p.cutAfter(b.ID, 1, i%2 == 0)
		var res strategy.Result
		resendUntilAnswered(t, b.ID, func() (err error) {
			res, err = s.PushDiffs(ctx, b)
			return err
		})
		require.Equal(t, strategy.BucketState{TAT: float64(base + int64(i+1)*250), Interval: 250}, res.Buckets[0], "push %d", i)
		require.Equal(t, []int64{int64(i + 1)}, res.Totals)
	}
	require.Equal(t, int64(n), p.cutCount.Load())
}

// Differential test: the same random Takes and bucket pushes, on a few keys,
// against the memory store (the reference) and PostgreSQL; every answer must
// be the same, to the bit.
func TestTakeMatchesMemory(t *testing.T) {
	pool := newPool(t, testDSN(t))
	for seed := range uint64(8) {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			pg := newStore(t, pool, Options{PurgeInterval: time.Millisecond})
			ref := memory.New()
			rng := rand.New(rand.NewPCG(seed, 11))
			ctx := context.Background()
			ns := fmt.Sprint("diff-", seed)
			buckets := []strategy.TakeBucket{
				{Period: time.Second, Interval: 250, Burst: 4},
				{Period: time.Minute, Interval: 60_000.0 / 7, Burst: 7, Penalty: true},
				{Period: 10 * time.Second, Interval: 1000, Burst: 3},
			}
			logs := []strategy.TakeLog{
				{Window: time.Second, Max: 3},
				{Window: 10 * time.Second, Max: 5, Penalty: true},
				{Window: 2 * time.Second, Max: 1},
			}
			now := base
			var sent []*strategy.Take // takes that may be re-sent
			for op := range 600 {
				now += rng.Int64N(400) - 50 // mostly forward, sometimes back
				key := fmt.Sprint("k", rng.IntN(3))
				switch r := rng.IntN(20); {
				case r < 2:
					// A node's bucket diffs, as its async sync pushes them.
					var diffs []strategy.BucketDiff
					var reads []strategy.BucketID
					for _, b := range buckets {
						id := strategy.BucketID{Key: key, Period: b.Period}
						switch rng.IntN(3) {
						case 0:
							diffs = append(diffs, strategy.SpendDiff(id, rng.Int64N(3), b.Interval, now))
						case 1:
							diffs = append(diffs, strategy.RefundDiff(id, rng.Int64N(2), b.Interval, now))
						}
						reads = append(reads, id)
					}
					batch := &strategy.Batch{ID: fmt.Sprint(ns, "-push-", op), Namespace: ns, Now: now, BucketDiffs: diffs, BucketReads: reads}
					want, err := ref.PushDiffs(ctx, batch)
					require.NoError(t, err)
					got, err := pg.PushDiffs(ctx, batch)
					require.NoError(t, err)
					require.Equal(t, want.Buckets, got.Buckets, "op %d: push %+v", op, batch)
					require.Equal(t, want.BucketReads, got.BucketReads, "op %d: push %+v", op, batch)
					continue
				case r < 3:
					require.NoError(t, ref.Purge(ctx, now))
					require.NoError(t, pg.Purge(ctx, now))
					continue
				case r < 6 && len(sent) > 0:
					// A re-send, possibly with the node's own answer.
					tk := *sent[rng.IntN(len(sent))]
					if !tk.Peek && !tk.Refund && rng.IntN(2) == 0 {
						tk.Answered = strategy.Answer(1 + rng.IntN(2))
					}
					compareTake(t, op, ref, pg, &tk)
					continue
				}
				tk := &strategy.Take{ID: fmt.Sprint(ns, "-take-", op), Namespace: ns, Key: key, Now: now, Cost: rng.Int64N(3)}
				for _, b := range buckets {
					if rng.IntN(2) == 0 {
						tk.Buckets = append(tk.Buckets, b)
					}
				}
				for _, l := range logs {
					if rng.IntN(2) == 0 {
						tk.Logs = append(tk.Logs, l)
					}
				}
				switch rng.IntN(8) {
				case 0:
					tk.Peek, tk.ID = true, ""
				case 1:
					tk.Refund = true
				case 2:
					tk.Answered = strategy.Answer(1 + rng.IntN(2))
				}
				compareTake(t, op, ref, pg, tk)
				if !tk.Peek {
					sent = append(sent[max(0, len(sent)-20):], tk)
				}
			}
		})
	}
}

func compareTake(t *testing.T, op int, ref *memory.Store, pg *Store, tk *strategy.Take) {
	t.Helper()
	ctx := context.Background()
	want, err := ref.Take(ctx, tk)
	require.NoError(t, err)
	got, err := pg.Take(ctx, tk)
	require.NoError(t, err)
	require.Equal(t, want, got, "op %d: take %+v", op, tk)
}

// Takes are validated before anything is sent, as the memory store does, and
// the store's own rules (whole milliseconds) too.
func TestTakeInvalid(t *testing.T) {
	pool := newPool(t, testDSN(t))
	s := newStore(t, pool, Options{})
	for _, tk := range []*strategy.Take{
		{Cost: 1, Buckets: []strategy.TakeBucket{{Period: 1500 * time.Microsecond, Interval: 1, Burst: 1}}},
		{Cost: 1, Logs: []strategy.TakeLog{{Window: 1500 * time.Microsecond, Max: 1}}},
		{Cost: 1, Answered: 3},
	} {
		_, err := s.Take(context.Background(), tk)
		require.ErrorIs(t, err, ErrInvalidTake)
		require.ErrorIs(t, err, strategy.ErrNotApplied)
	}
}

// Purge forgets the buckets that have been full long enough, drops the
// sliding-log entries that left their window (and the logs left empty), and
// the Take decisions past their retention.
func TestPurgeBucketsAndLogs(t *testing.T) {
	pool := newPool(t, testDSN(t))
	s := newStore(t, pool, Options{PurgeInterval: time.Millisecond, BatchIDRetention: time.Millisecond})
	s.purgePages = 1 // a statement per page: the ranges cover every page once
	ctx := context.Background()
	take := func(key string, now int64, window time.Duration) {
		t.Helper()
		_, err := s.Take(ctx, &strategy.Take{ID: fmt.Sprint("purge-", key, now), Namespace: "ns", Key: key, Now: now, Cost: 1,
			Buckets: []strategy.TakeBucket{{Period: time.Second, Interval: 1000, Burst: 5}},
			Logs:    []strategy.TakeLog{{Window: window, Max: 5}}})
		require.NoError(t, err)
	}
	for i := range 300 { // several pages of each table
		take(fmt.Sprint("old-", i), base, time.Second)
	}
	take("live", base, time.Hour)          // its first entry stays in the window
	take("live", base+120_000, time.Hour)  // and its bucket owes a token
	take("mixed", base, 2*time.Minute)     // its entry leaves the window at base+120s
	take("mixed", base+100_000, time.Hour) // another window: another log
	_, err := s.PushDiffs(ctx, &strategy.Batch{ID: "owing", Namespace: "ns", Now: base,
		BucketDiffs: []strategy.BucketDiff{strategy.SpendDiff(strategy.BucketID{Key: "owing", Period: time.Minute}, 1000, 1000, base)}})
	require.NoError(t, err)
	now := base + 120_500
	require.NoError(t, s.Purge(ctx, now))

	// Buckets: old-* full since base+1s, forgettable a minute and a second
	// later; mixed's full at base+101s and live's at base+121s, kept;
	// owing's owes 1,000 s.
	require.Equal(t, int64(3), rowCount(t, pool, s.opts.Table+bucketsSuffix, "true"))
	require.Zero(t, rowCount(t, pool, s.opts.Table+bucketsSuffix, "key LIKE 'old-%'"))
	// Logs: old-* emptied and gone; live keeps both entries (one hour);
	// mixed's two-minute log lost its entry and is gone, its hour log kept.
	require.Equal(t, int64(2), rowCount(t, pool, s.opts.Table+logsSuffix, "true"))
	require.Equal(t, int64(1), rowCount(t, pool, s.opts.Table+logsSuffix, "key = 'live' AND cardinality(ats) = 2"))
	// Decisions: kept while a limit may hold their cost (an hour for the
	// hour logs, until base+120s for mixed's first), a minute at least.
	require.Equal(t, int64(3), rowCount(t, pool, s.opts.BatchTable, "allowed IS NOT NULL"))

	// A log whose oldest entries left the window is pruned in place.
	take("prune", now, 10*time.Second)
	take("prune", now+5_000, 10*time.Second)
	require.NoError(t, s.Purge(ctx, now+12_000))
	require.Equal(t, int64(1), rowCount(t, pool, s.opts.Table+logsSuffix, "key = 'prune' AND cardinality(ats) = 1 AND ats[1] = $1", now+5_000))
}

// Values no sane node pushes (an infinite or NaN TAT) neither make a push,
// a Take or a purge fail, nor stay with the batch ID forever.
func TestBucketsHostileValues(t *testing.T) {
	pool := newPool(t, testDSN(t))
	s := newStore(t, pool, Options{PurgeInterval: time.Millisecond})
	ctx := context.Background()
	inf, nan := math.Inf(1), math.NaN()
	for i, d := range []strategy.BucketDiff{
		{BucketID: strategy.BucketID{Key: "inf", Period: time.Second}, Add: inf, Floor: inf, Interval: 1},
		{BucketID: strategy.BucketID{Key: "nan", Period: time.Second}, Add: nan, Floor: nan, Interval: 1},
		{BucketID: strategy.BucketID{Key: "neg", Period: time.Second}, Add: math.Inf(-1), Floor: math.Inf(-1), Interval: 1},
	} {
		_, err := s.PushDiffs(ctx, &strategy.Batch{ID: fmt.Sprint("hostile-", i), Namespace: "ns", Now: base, BucketDiffs: []strategy.BucketDiff{d}})
		require.NoError(t, err, "%+v", d)
		_, err = s.Take(ctx, &strategy.Take{ID: fmt.Sprint("hostile-take-", i), Namespace: "ns", Key: d.Key, Now: base, Cost: 1,
			Buckets: []strategy.TakeBucket{{Period: time.Second, Interval: 1, Burst: 1}}})
		require.NoError(t, err, "%+v", d)
	}
	require.NoError(t, s.Purge(ctx, base+time.Hour.Milliseconds()))
}
