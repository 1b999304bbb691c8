package ratelimit_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit"
	"github.com/ratesync/ratelimit/strategy"
	"github.com/ratesync/ratelimit/strategy/memory"
)

// TestCloseRacingLeanPaths: the lean decision paths (one window limit, one
// token bucket) and Increment on a held key do not register as calls in
// flight; Close seals the tables instead, which waits for the calls
// counting in them. Workers call Allow and Increment until they get
// ErrClosed, Close runs meanwhile, and the store then holds exactly what
// was admitted or counted: every window hit and every bucket spend.
func TestCloseRacingLeanPaths(t *testing.T) {
	at := time.UnixMilli(1_700_000_000_000)
	// An interval of exactly 0.25 ms per token, so a bucket's TAT adds up
	// without rounding; a frozen clock, so nothing refills.
	bucket := ratelimit.Limit{Window: time.Hour, Max: 4 * 3_600_000, Algorithm: ratelimit.TokenBucket}
	const workers, keys = 8, 4
	// "idle": the loop never syncs before Close. "syncing": a sync every
	// millisecond settles pushes under the calls (and under Increment's
	// lock-free additions), and a window limit of 300 rejects calls, whose
	// counts are taken back (adopted from a review).
	for _, run := range []struct {
		name   string
		rate   time.Duration
		max    int64
		rounds int
	}{{"idle", time.Hour, 1 << 40, 20}, {"syncing", time.Millisecond, 300, 5}} {
		window := ratelimit.Limit{Window: time.Hour, Max: run.max}
		for _, mode := range []string{"cold-reads", "no-cold-reads"} {
			t.Run(run.name+"/"+mode, func(t *testing.T) {
				testCloseRacingLeanPaths(t, at, window, bucket, run.rate, mode == "cold-reads", run.rounds, workers, keys)
			})
		}
	}
}

// testCloseRacingLeanPaths runs rounds of TestCloseRacingLeanPaths with
// one set of limits and SyncRate.
func testCloseRacingLeanPaths(t *testing.T, at time.Time, window, bucket ratelimit.Limit, rate time.Duration, cold bool, rounds, workers, keys int) {
	for round := range rounds {
		store := memory.New()
		cfg := ratelimit.Config{Namespace: fmt.Sprint("lean", round), WindowSizes: []time.Duration{time.Hour},
			SyncRate: rate, Strategy: store, Clock: func() time.Time { return at }}
		if !cold {
			cfg.ColdRead = ratelimit.ColdReadOff
		}
		reg := ratelimit.NewRegistry()
		ns, err := reg.New(cfg)
		require.NoError(t, err)
		admitted := make([][]atomic.Int64, 3) // window, bucket, Increment
		for kind := range admitted {
			admitted[kind] = make([]atomic.Int64, keys)
		}
		var calls atomic.Int64
		busy := make(chan struct{}) // closed by the 2,000th call
		var wg sync.WaitGroup
		for w := range workers {
			wg.Go(func() {
				for i := 0; ; i++ {
					kind, k := i%3, (w+i)%keys
					var d ratelimit.Decision
					var err error
					switch kind {
					case 0:
						d, err = ns.Allow(context.Background(), fmt.Sprint("k", k), 1, window)
					case 1:
						d, err = ns.Allow(context.Background(), fmt.Sprint("k", k), 1, bucket)
					case 2:
						_, err = ns.Increment(context.Background(), fmt.Sprint("i", k), time.Hour, 1)
						d.Allowed = true
					}
					if errors.Is(err, ratelimit.ErrClosed) {
						return
					}
					if err != nil {
						t.Error(err)
						return
					}
					if d.Allowed {
						admitted[kind][k].Add(1)
					}
					if calls.Add(1) == 2000 {
						close(busy)
					}
				}
			})
		}
		<-busy
		require.NoError(t, reg.Close(context.Background()))
		wg.Wait()
		var reads []strategy.BucketID
		for k := range keys {
			for kind, prefix := range map[int]string{0: "k", 2: "i"} {
				n, err := store.GetWindow(context.Background(), cfg.Namespace, strategy.CounterID{Key: fmt.Sprint(prefix, k), Size: time.Hour, Start: strategy.WindowStart(at.UnixMilli(), time.Hour)})
				require.NoError(t, err)
				require.Equal(t, admitted[kind][k].Load(), n, "round %d key %s%d: window hits", round, prefix, k)
				if kind == 0 {
					require.LessOrEqual(t, n, window.Max, "round %d key k%d: over the limit", round, k)
				}
			}
			reads = append(reads, strategy.BucketID{Key: fmt.Sprint("k", k), Period: time.Hour})
		}
		res, err := store.PushDiffs(context.Background(), &strategy.Batch{ID: fmt.Sprint("read", round), Namespace: cfg.Namespace, Now: at.UnixMilli(), BucketReads: reads})
		require.NoError(t, err)
		for k, st := range res.BucketReads {
			want := float64(at.UnixMilli()) + 0.25*float64(admitted[1][k].Load())
			if admitted[1][k].Load() == 0 {
				want = 0 // never spent on: the store holds no bucket
			}
			require.Equal(t, want, st.TAT, "round %d key %d: bucket spends", round, k)
		}
	}
}
