package postgres

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit/strategy"
)

// BenchmarkPushDiffs100k pushes one sync cycle of 100,000 dirty keys, each
// with its previous window read in the same push, against the server of
// RATELIMIT_TEST_POSTGRES_DSN. "insert" creates every counter (a new window
// each iteration), "update" adds to existing counters.
//
//	go test -run '^$' -bench PushDiffs100k -benchtime=3x ./strategy/postgres/
func BenchmarkPushDiffs100k(b *testing.B) {
	const n = 100_000
	pool := newPool(b, testDSN(b))
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("user-%08d", i)
	}
	for _, mode := range []string{"insert", "update"} {
		b.Run(mode, func(b *testing.B) {
			s := newStore(b, pool, Options{})
			ctx := context.Background()
			batch := func(i int) *strategy.Batch {
				start := base
				if mode == "insert" {
					start += int64(i) * 60_000
				}
				diffs := make([]strategy.Diff, n)
				reads := make([]strategy.CounterID, n)
				for j, k := range keys {
					diffs[j] = diff(k, time.Minute, start, 1)
					reads[j] = id(k, time.Minute, start-60_000)
				}
				return &strategy.Batch{ID: fmt.Sprintf("bench-%s-%d", mode, i), Namespace: "bench", Diffs: diffs, Reads: reads}
			}
			if mode == "update" {
				_, err := s.PushDiffs(ctx, batch(-1))
				require.NoError(b, err)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				bt := batch(i)
				b.StartTimer()
				if _, err := s.PushDiffs(ctx, bt); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(n*b.N)/b.Elapsed().Seconds(), "counters/s")
		})
	}
}

// BenchmarkGetCounters100k fetches 100,000 counters (the current and previous
// window of 50,000 keys): "all" reads the namespace, "seen" names the keys.
//
//	go test -run '^$' -bench GetCounters100k -benchtime=3x ./strategy/postgres/
func BenchmarkGetCounters100k(b *testing.B) {
	const n = 50_000
	pool := newPool(b, testDSN(b))
	s := newStore(b, pool, Options{})
	ctx := context.Background()
	keys := make([]string, n)
	var diffs []strategy.Diff
	for i := range keys {
		keys[i] = fmt.Sprintf("user-%08d", i)
		diffs = append(diffs, diff(keys[i], time.Minute, base, 1), diff(keys[i], time.Minute, base-60_000, 1))
	}
	_, err := s.PushDiffs(ctx, &strategy.Batch{ID: "fill", Namespace: "bench", Diffs: diffs})
	require.NoError(b, err)
	for _, scope := range []string{"all", "seen"} {
		b.Run(scope, func(b *testing.B) {
			q := strategy.Query{Namespace: "bench", Sizes: []time.Duration{time.Minute}, Now: base + 1}
			if scope == "seen" {
				q.Keys = keys
			}
			b.ReportAllocs()
			for b.Loop() {
				got := 0
				for _, err := range s.GetCounters(ctx, q) {
					if err != nil {
						b.Fatal(err)
					}
					got++
				}
				if got != 2*n {
					b.Fatalf("got %d counters", got)
				}
			}
			b.ReportMetric(float64(2*n*b.N)/b.Elapsed().Seconds(), "counters/s")
		})
	}
}

// BenchmarkPushDiffsParallel is many nodes' small sync cycles at once: each
// push carries 100 diffs over 10,000 shared keys (uniformly drawn), from as
// many goroutines as GOMAXPROCS, each push its own batch.
//
//	go test -run '^$' -bench PushDiffsParallel -benchtime=200x ./strategy/postgres/
func BenchmarkPushDiffsParallel(b *testing.B) {
	const nkeys, perPush = 10_000, 100
	pool := newPool(b, testDSN(b))
	s := newStore(b, pool, Options{})
	ctx := context.Background()
	var seq atomic.Int64
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		rng := rand.New(rand.NewPCG(uint64(seq.Add(1)), 7))
		diffs := make([]strategy.Diff, perPush)
		for pb.Next() {
			for i, k := range rng.Perm(nkeys)[:perPush] {
				diffs[i] = diff(fmt.Sprintf("user-%05d", k), time.Minute, base, 1)
			}
			bt := &strategy.Batch{ID: fmt.Sprintf("par-%d", seq.Add(1)), Namespace: "bench", Diffs: diffs}
			if _, err := s.PushDiffs(ctx, bt); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(perPush*b.N)/b.Elapsed().Seconds(), "counters/s")
}
