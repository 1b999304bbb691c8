package postgres

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit/strategy"
)

// Takes while pg_terminate_backend kills the store's connections every 20-60
// ms: a Take of unknown outcome is re-sent under its ID until it is answered,
// and every Take is decided once: the bucket and the log hold exactly the
// admitted ones, and no more are admitted than the limits allow.
func TestTerminateBackendMidTake(t *testing.T) {
	dsn := testDSN(t)
	app := uniqueTable(t)
	pool := newPool(t, dsn, func(cfg *pgxpool.Config) {
		cfg.ConnConfig.RuntimeParams["application_name"] = app
		cfg.MaxConns = 4
	})
	s := newStore(t, pool, Options{Table: app})
	const burst, maxLog = 300, 250
	limits := func(tk *strategy.Take) {
		tk.Buckets = []strategy.TakeBucket{{Period: time.Hour, Interval: 1000, Burst: burst}}
		tk.Logs = []strategy.TakeLog{{Window: time.Hour, Max: maxLog}}
	}
	deadline := time.Now().Add(3 * time.Second)
	stop := terminator(t, dsn, app, 20*time.Millisecond, deadline)
	var admitted, unknown atomic.Int64
	var wg sync.WaitGroup
	for c := range 4 {
		wg.Go(func() {
			for i := 0; time.Now().Before(deadline); i++ {
				tk := &strategy.Take{ID: fmt.Sprintf("%s-%d-%d", app, c, i), Namespace: "ns", Key: "k", Now: base, Cost: 1}
				limits(tk)
				for {
					ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
					res, err := s.Take(ctx, tk)
					cancel()
					if err == nil {
						if res.Allowed {
							admitted.Add(1)
						}
						break
					}
					if !errors.Is(err, strategy.ErrNotApplied) {
						unknown.Add(1)
					}
				}
			}
		})
	}
	wg.Wait()
	killed := stop()
	// Checked through a pool whose connections were not killed.
	check := newStore(t, newPool(t, dsn), Options{Table: app})
	peek := &strategy.Take{Namespace: "ns", Key: "k", Now: base, Cost: 0, Peek: true}
	limits(peek)
	res, err := check.Take(context.Background(), peek)
	require.NoError(t, err)
	t.Logf("RESULT %s: %d backends terminated; %d takes of unknown outcome re-sent; %d admitted; bucket TAT base+%v, log %d",
		t.Name(), killed, unknown.Load(), admitted.Load(), res.Buckets[0].TAT-float64(base), res.Logs[0].Count)
	require.Positive(t, killed)
	require.LessOrEqual(t, admitted.Load(), int64(maxLog))
	require.Equal(t, admitted.Load(), res.Logs[0].Count, "every admitted take logged once")
	require.Equal(t, float64(base+admitted.Load()*1000), res.Buckets[0].TAT, "every admitted take spent once")
}

// Pushes of counter and bucket diffs with watches (batches in parts, too)
// while pg_terminate_backend kills the store's connections every 15-45 ms:
// each node re-sends a batch of unknown
// outcome unchanged (same ID, same cursors) and folds the answers into its
// view; once the killing stops, one more watch brings every view to the
// store's totals, and the buckets hold every spend once.
func TestTerminateBackendMidWatch(t *testing.T) {
	dsn := testDSN(t)
	app := uniqueTable(t)
	pool := newPool(t, dsn, func(cfg *pgxpool.Config) {
		cfg.ConnConfig.RuntimeParams["application_name"] = app
		cfg.MaxConns = 4
	})
	s := newStore(t, pool, Options{Table: app, MaxPushRows: 30}) // batches in parts too
	const nodes, keys = 4, 80
	w := time.Minute
	type node struct {
		view   map[string]int64
		cursor string
		spent  int64
	}
	ns := make([]*node, nodes)
	deadline := time.Now().Add(2 * time.Second)
	stop := terminator(t, dsn, app, 15*time.Millisecond, deadline)
	var wg sync.WaitGroup
	var unknown atomic.Int64
	step := func(n *node, b *strategy.Batch) error {
		b.Watches = []strategy.Watch{{Size: w, Start: base, Cursor: n.cursor, Limit: 1000}}
		for {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			res, err := s.PushDiffs(ctx, b)
			cancel()
			if err != nil {
				if !errors.Is(err, strategy.ErrNotApplied) {
					unknown.Add(1)
				}
				continue // re-sent unchanged: the merge of a not-applied batch is the core's business
			}
			for i, d := range b.Diffs {
				n.view[d.Key] = res.Totals[i]
			}
			c := res.Changes[0]
			if c.Overflow {
				return fmt.Errorf("overflow with a limit above the keys")
			}
			for _, ctr := range c.Counters {
				n.view[ctr.Key] = ctr.Count
			}
			n.cursor = c.Cursor
			return nil
		}
	}
	errs := make(chan error, nodes)
	for i := range ns {
		n := &node{view: map[string]int64{}}
		ns[i] = n
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(i), 3))
			for seq := 0; time.Now().Before(deadline); seq++ {
				b := &strategy.Batch{ID: fmt.Sprintf("%s-%d-%d", app, i, seq), Namespace: "ns", Now: base}
				for _, k := range rng.Perm(keys)[:1+rng.IntN(60)] {
					b.Diffs = append(b.Diffs, diff(fmt.Sprint("k", k), w, base, 1+rng.Int64N(3)))
				}
				b.BucketDiffs = []strategy.BucketDiff{strategy.SpendDiff(strategy.BucketID{Key: "b", Period: time.Hour}, 1, 10, base)}
				if err := step(n, b); err != nil {
					errs <- err
					return
				}
				n.spent++
			}
		})
	}
	wg.Wait()
	killed := stop()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	// Checked through a pool whose connections were not killed.
	check := newStore(t, newPool(t, dsn), Options{Table: app})
	want := totals(t, check, "ns", w, base)
	var spent int64
	for i, n := range ns {
		require.NoError(t, step(n, &strategy.Batch{ID: fmt.Sprintf("%s-%d-final", app, i), Namespace: "ns", Now: base}))
		require.Equal(t, want, n.view, "node %d", i)
		spent += n.spent
	}
	res, err := check.PushDiffs(context.Background(), &strategy.Batch{ID: "read", Namespace: "ns", BucketReads: []strategy.BucketID{{Key: "b", Period: time.Hour}}})
	require.NoError(t, err)
	t.Logf("RESULT %s: %d backends terminated; %d pushes of unknown outcome re-sent; %d pushes; every view exact", t.Name(), killed, unknown.Load(), spent)
	require.Positive(t, killed)
	require.Equal(t, float64(base+spent*10), res.BucketReads[0].TAT, "every bucket spend applied once")
}
