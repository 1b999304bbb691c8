package ratelimit_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/time/rate"

	"github.com/ratesync/ratelimit"
	"github.com/ratesync/ratelimit/strategy/memory"
)

func tb(window time.Duration, max, burst int64) ratelimit.Limit {
	return ratelimit.Limit{Algorithm: ratelimit.TokenBucket, Window: window, Max: max, Burst: burst}
}

func slog(window time.Duration, max int64) ratelimit.Limit {
	return ratelimit.Limit{Algorithm: ratelimit.SlidingLog, Window: window, Max: max}
}

// capacity is the most a limit admits at once.
func capacity(l ratelimit.Limit) int64 {
	if l.Algorithm == ratelimit.TokenBucket && l.Burst > 0 {
		return l.Burst
	}
	return l.Max
}

func TestTokenBucket(t *testing.T) {
	for _, mode := range decModes {
		t.Run(mode, func(t *testing.T) {
			clk := newDecClock(decEpoch)
			ns, _ := newDecNS(t, mode, clk, time.Second)
			ctx := context.Background()
			l := tb(time.Second, 4, 2) // one token per 250 ms, two at most
			for i := range 2 {
				d, err := ns.Allow(ctx, "k", 1, l)
				require.NoError(t, err)
				require.True(t, d.Allowed, "request %d", i)
				require.Equal(t, int64(1-i), d.Remaining)
				require.Equal(t, time.Duration(i+1)*250*time.Millisecond, d.Reset, "full again after the tokens refill")
			}
			d, err := ns.Allow(ctx, "k", 1, l)
			require.NoError(t, err)
			require.False(t, d.Allowed)
			require.Equal(t, 250*time.Millisecond, d.RetryAfter)
			require.Zero(t, d.Remaining)
			clk.Advance(249 * time.Millisecond)
			d, err = ns.Allow(ctx, "k", 1, l)
			require.NoError(t, err)
			require.False(t, d.Allowed)
			require.Equal(t, time.Millisecond, d.RetryAfter)
			clk.Advance(time.Millisecond)
			d, err = ns.Allow(ctx, "k", 1, l)
			require.NoError(t, err)
			require.True(t, d.Allowed, "one token back after 250 ms")
			// A cost of 2 waits for two tokens.
			d, err = ns.Allow(ctx, "k", 2, l)
			require.NoError(t, err)
			require.False(t, d.Allowed)
			require.Equal(t, 500*time.Millisecond, d.RetryAfter)
			p, err := ns.Peek(ctx, "k", 1, l)
			require.NoError(t, err)
			require.False(t, p.Allowed)
			require.NoError(t, ns.Refund(ctx, "k", 1, l))
			if mode == "sync" {
				// The store decides; it learns of the refund from the retry
				// loop (here, Sync).
				require.NoError(t, ns.Sync(ctx))
			}
			d, err = ns.Allow(ctx, "k", 2, l)
			require.NoError(t, err)
			require.False(t, d.Allowed, "a refund gives one token back, not two")
			require.Equal(t, 250*time.Millisecond, d.RetryAfter)
			d, err = ns.Allow(ctx, "k", 1, l)
			require.NoError(t, err)
			require.True(t, d.Allowed)
			_, err = ns.Allow(ctx, "k", 3, l)
			require.ErrorIs(t, err, ratelimit.ErrInvalidCost, "a cost above the burst never fits")
		})
	}
}

func TestSlidingLog(t *testing.T) {
	for _, mode := range []string{"local", "sync"} {
		t.Run(mode, func(t *testing.T) {
			clk := newDecClock(decEpoch)
			ns, _ := newDecNS(t, mode, clk, time.Second)
			ctx := context.Background()
			l := slog(time.Second, 3)
			for i, at := range []time.Duration{0, 100 * time.Millisecond, 900 * time.Millisecond} {
				clk.Set(decEpoch.Add(at))
				d, err := ns.Allow(ctx, "k", 1, l)
				require.NoError(t, err)
				require.True(t, d.Allowed, "request %d", i)
				require.Equal(t, int64(2-i), d.Remaining)
			}
			clk.Set(decEpoch.Add(950 * time.Millisecond))
			d, err := ns.Allow(ctx, "k", 1, l)
			require.NoError(t, err)
			require.False(t, d.Allowed)
			require.Equal(t, 50*time.Millisecond, d.RetryAfter, "the first request leaves the window at 1 s")
			require.Equal(t, 950*time.Millisecond, d.Reset, "the newest leaves at 1.9 s")
			d, err = ns.Allow(ctx, "k", 2, l)
			require.NoError(t, err)
			require.Equal(t, 150*time.Millisecond, d.RetryAfter, "a cost of 2 waits for two to leave")
			clk.Set(decEpoch.Add(time.Second))
			d, err = ns.Allow(ctx, "k", 1, l)
			require.NoError(t, err)
			require.True(t, d.Allowed, "exact: no boundary effect, no smoothing")
		})
	}
	t.Run("periodic", func(t *testing.T) {
		clk := newDecClock(decEpoch)
		ns, _ := newDecNS(t, "async", clk, time.Second)
		_, err := ns.Allow(context.Background(), "k", 1, slog(time.Second, 3))
		require.ErrorIs(t, err, ratelimit.ErrUnsupportedLimit)
		require.ErrorIs(t, err, ratelimit.ErrInvalidLimit)
		require.ErrorIs(t, ns.CheckLimits(1, slog(time.Second, 3)), ratelimit.ErrUnsupportedLimit)
		// One prefix (it read "ratelimit: invalid limit: ratelimit: limit not supported here: ...").
		require.Equal(t, "ratelimit: limit not supported here: per-second: a sliding log cannot be exact with a periodic sync; use local or synchronous mode",
			err.Error())
	})
}

func TestAlgorithmValidation(t *testing.T) {
	clk := newDecClock(decEpoch)
	ns, _ := newDecNS(t, "local", clk, time.Second, time.Minute)
	for _, c := range []struct {
		name   string
		limits []ratelimit.Limit
		err    error
	}{
		{"negative burst", []ratelimit.Limit{tb(time.Second, 5, -1)}, ratelimit.ErrInvalidLimit},
		{"burst on a window", []ratelimit.Limit{{Window: time.Second, Max: 5, Burst: 3}}, ratelimit.ErrInvalidLimit},
		{"fixed bucket", []ratelimit.Limit{{Algorithm: ratelimit.TokenBucket, Window: time.Second, Max: 5, Fixed: true}}, ratelimit.ErrInvalidLimit},
		{"too fast to refill", []ratelimit.Limit{tb(time.Second, 2_000_000, 0)}, ratelimit.ErrInvalidLimit},
		{"unknown algorithm", []ratelimit.Limit{{Algorithm: 9, Window: time.Second, Max: 5}}, ratelimit.ErrInvalidLimit},
		{"huge log", []ratelimit.Limit{slog(time.Second, 1<<20)}, ratelimit.ErrInvalidLimit},
		{"two buckets, one window", []ratelimit.Limit{tb(time.Second, 5, 0), tb(time.Second, 6, 0)}, ratelimit.ErrInvalidLimit},
		{"cost above burst", []ratelimit.Limit{tb(time.Second, 10, 2)}, ratelimit.ErrInvalidCost},
		{"unknown window", []ratelimit.Limit{tb(time.Hour, 10, 0)}, ratelimit.ErrUnknownWindow},
	} {
		err := ns.CheckLimits(3, c.limits...)
		require.ErrorIs(t, err, c.err, c.name)
		_, err = ns.Allow(context.Background(), "k", 3, c.limits...)
		require.ErrorIs(t, err, c.err, c.name)
	}
	require.NoError(t, ns.CheckLimits(3, tb(time.Second, 5, 0), tb(time.Second, 5, 0), slog(time.Minute, 9), ratelimit.Limit{Window: time.Second, Max: 4}),
		"equal buckets share their state; a window and a bucket of one size are separate")
	require.NoError(t, ns.CheckLimits(3, ratelimit.Limit{Algorithm: ratelimit.FixedWindow, Window: time.Second, Max: 4}))
	require.Equal(t, "token_bucket", ratelimit.GCRA.String())
}

// TestMixedAlgorithms: one request under a window, a bucket and a log; the
// tightest binds, and a rejection by one counts in none.
func TestMixedAlgorithms(t *testing.T) {
	for _, mode := range []string{"local", "sync"} {
		t.Run(mode, func(t *testing.T) {
			clk := newDecClock(decEpoch)
			ns, _ := newDecNS(t, mode, clk, time.Second, time.Minute)
			ctx := context.Background()
			limits := []ratelimit.Limit{{Window: time.Minute, Max: 10}, tb(time.Second, 2, 3), slog(time.Minute, 4)}
			admitted := 0
			for range 6 {
				d, err := ns.Allow(ctx, "k", 1, limits...)
				require.NoError(t, err)
				if d.Allowed {
					admitted++
				}
			}
			require.Equal(t, 3, admitted, "the bucket's burst binds first")
			d, err := ns.Peek(ctx, "k", 1, limits...)
			require.NoError(t, err)
			require.Equal(t, ratelimit.TokenBucket, d.Limit.Algorithm)
			require.Equal(t, 500*time.Millisecond, d.RetryAfter)
			clk.Advance(2 * time.Second) // the bucket is full again; the log holds 3 of 4
			admitted = 0
			for range 4 {
				d, err = ns.Allow(ctx, "k", 1, limits...)
				require.NoError(t, err)
				if d.Allowed {
					admitted++
				}
			}
			require.Equal(t, 1, admitted, "now the log binds")
			require.Equal(t, ratelimit.SlidingLog, d.Limit.Algorithm)
			w, err := ns.SlidingWindow(ctx, "k", time.Minute)
			require.NoError(t, err)
			require.Equal(t, 4.0, w, "rejected requests were taken back from the window")
		})
	}
}

// TestTokenBucketMatchesXTimeRate drives the namespace's token bucket (local
// mode) and golang.org/x/time/rate's Limiter with the same random requests,
// costs and gaps, and compares every decision. They may differ only on a
// boundary tie: where one admits and the other rejects, the other would have
// admitted within a millisecond. After a tie, both start afresh on a new key.
func TestTokenBucketMatchesXTimeRate(t *testing.T) {
	n := 100_000
	if testing.Short() {
		n = 10_000
	}
	clk := newDecClock(decEpoch)
	windows := []time.Duration{time.Second, 10 * time.Second, time.Minute, 250 * time.Millisecond}
	ns, _ := newDecNS(t, "local", clk, windows...)
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(11, 12))
	var ties, admitted, checked int
	for checked < n {
		w := windows[rng.IntN(len(windows))]
		max := 1 + rng.Int64N(50)
		burst := 1 + rng.Int64N(3*max)
		l := tb(w, max, burst)
		ref := rate.NewLimiter(rate.Limit(float64(max)/w.Seconds()), int(burst))
		key := fmt.Sprint("k", checked)
		start := clk.Now()
		// x/time/rate starts full at its first use; so does a new bucket.
		for range 200 {
			// Gaps from 0 to two refill intervals, in whole milliseconds.
			gap := rng.Int64N(2*w.Milliseconds()/max + 2)
			clk.Advance(time.Duration(gap) * time.Millisecond)
			cost := 1 + rng.Int64N(min(burst, 4))
			d, err := ns.Allow(ctx, key, cost, l)
			require.NoError(t, err)
			want := ref.AllowN(clk.Now(), int(cost))
			checked++
			if d.Allowed == want {
				if want {
					admitted++
				}
				continue
			}
			// A tie: the one that rejected must admit a millisecond later.
			if d.Allowed {
				r := ref.ReserveN(clk.Now().Add(time.Millisecond), int(cost))
				require.True(t, r.OK())
				require.Zero(t, r.DelayFrom(clk.Now().Add(time.Millisecond)), "x/time/rate rejected %d at %v after start, and still would 1 ms later", cost, clk.Now().Sub(start))
			} else {
				require.LessOrEqual(t, d.RetryAfter, time.Millisecond, "rejected %d at %v after start, x/time/rate admitted (%+v)", cost, clk.Now().Sub(start), l)
			}
			ties++
			break
		}
	}
	t.Logf("%d decisions, %d admitted, %d boundary ties", checked, admitted, ties)
	require.Less(t, ties, checked/1000+5, "ties are rare")
	require.Greater(t, admitted, checked/4)
}

// TestTokenBucketAcrossNodes: three nodes on one memory store, periodic sync.
// Each node spends locally; once they have synced, every node sees the
// cluster's spends, and the cluster admits at most the bucket plus what the
// nodes admitted within one sync period.
func TestTokenBucketAcrossNodes(t *testing.T) {
	clk := newDecClock(decEpoch)
	store := memory.New()
	ctx := context.Background()
	var nodes []*ratelimit.Namespace
	for range 3 {
		nodes = append(nodes, newDecNSOn(t, "async", clk, store, time.Minute))
	}
	l := tb(time.Minute, 60, 30) // one token per second, 30 at most
	admitted := 0
	for round := range 20 {
		for i, ns := range nodes {
			d, err := ns.Allow(ctx, "k", 1, l)
			require.NoError(t, err)
			require.False(t, d.Degraded)
			if d.Allowed {
				admitted++
			}
			_ = i
		}
		if round%5 == 4 { // sync every five rounds
			for _, ns := range nodes {
				require.NoError(t, ns.Sync(ctx))
			}
		}
	}
	// 60 requests in no time against a burst of 30: each node admitted
	// everything until it learned the others' spends.
	require.GreaterOrEqual(t, admitted, 30)
	require.LessOrEqual(t, admitted, 30+3*5, "at most a sync period of over-admission per node")
	for _, ns := range nodes {
		require.NoError(t, ns.Sync(ctx))
	}
	for i, ns := range nodes {
		d, err := ns.Peek(ctx, "k", 1, l)
		require.NoError(t, err)
		require.False(t, d.Allowed, "node %d sees the cluster's bucket empty", i)
	}
	// Time refills the bucket for everyone.
	clk.Advance(time.Minute)
	for i, ns := range nodes {
		d, err := ns.Peek(ctx, "k", 1, l)
		require.NoError(t, err)
		require.True(t, d.Allowed, "node %d", i)
	}
}

func TestWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		reg := ratelimit.NewRegistry()
		ns, err := reg.New(ratelimit.Config{WindowSizes: []time.Duration{time.Second, time.Minute}, SyncRate: -1})
		require.NoError(t, err)
		ctx := context.Background()
		l := tb(time.Second, 2, 1) // a token every 500 ms
		d, err := ns.Wait(ctx, "k", 1, l)
		require.NoError(t, err)
		require.True(t, d.Allowed)
		start := time.Now()
		d, err = ns.Wait(ctx, "k", 1, l)
		require.NoError(t, err)
		require.True(t, d.Allowed)
		require.Equal(t, 500*time.Millisecond, time.Since(start), "waited exactly for the next token")

		// A deadline the wait would pass: refused at once, without sleeping.
		dctx, cancel := context.WithTimeout(ctx, 499*time.Millisecond)
		start = time.Now()
		d, err = ns.Wait(dctx, "k", 1, l)
		cancel()
		require.ErrorIs(t, err, ratelimit.ErrWouldExceedDeadline)
		require.False(t, d.Allowed)
		require.Equal(t, 500*time.Millisecond, d.RetryAfter)
		require.Zero(t, time.Since(start))

		// Any algorithm: a sliding window waits for its window to slide.
		w := ratelimit.Limit{Window: time.Minute, Max: 1, Fixed: true}
		_, err = ns.Wait(ctx, "w", 1, w)
		require.NoError(t, err)
		start = time.Now()
		d, err = ns.Wait(ctx, "w", 1, w)
		require.NoError(t, err)
		require.True(t, d.Allowed)
		require.Equal(t, ratelimit.WindowStart(start, time.Minute).Add(time.Minute), time.Now(), "until the next minute")

		// Close ends a wait.
		_, err = ns.Wait(ctx, "w", 1, w)
		require.NoError(t, err)
		done := make(chan error)
		go func() {
			_, err := ns.Wait(ctx, "w", 1, w)
			done <- err
		}()
		synctest.Wait()
		require.NoError(t, reg.Close(ctx))
		require.ErrorIs(t, <-done, ratelimit.ErrClosed)
		_, err = ns.Wait(ctx, "k", 1, l)
		require.ErrorIs(t, err, ratelimit.ErrClosed)
	})
}
