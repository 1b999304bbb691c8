package store

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit"
	"github.com/ratesync/ratelimit/strategy"
	"github.com/ratesync/ratelimit/strategy/redis"
)

// Close racing traffic: 4 registries (3 asynchronous, 1 synchronous; two of
// them holding a third of the keys, so that they evict all the time), each
// with its own namespace on one Redis behind a proxy that adds latency, and
// 8 goroutines per registry calling Allow and Increment as fast as they can,
// while Registry.Close runs on every registry at once. No call panics; every
// call that starts after Close returned gets ErrClosed; Close returns by its
// deadline (plus scheduling slack); and no hit is counted and lost: when Close
// returns nil the store holds every hit a call reported counted, and when it
// returns an UnpushedError the hits missing from the store are at most its
// Hits. Two cases: latency well within the deadline (Close flushes
// everything), and latency close to it (Close often gives up and says how
// many hits it could not push).
func TestCloseRacingTraffic(t *testing.T) {
	noLeaks(t)
	needRedisBinaries(t)
	rounds := pick(10, 3)
	cases := []struct {
		name              string
		latency, deadline time.Duration
	}{
		{"latency-30ms-deadline-1s", 30 * time.Millisecond, time.Second},
		{"latency-100ms-deadline-150ms", 100 * time.Millisecond, 150 * time.Millisecond},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			srv := startProc(t, "")
			px := newProxy(t, srv.addr())
			px.SetLatency(tc.latency)
			for round := range rounds {
				runCloseRace(t, srv, px.Addr(), round, tc.latency, tc.deadline)
			}
		})
	}
}

// closeNode is one registry of the Close race.
type closeNode struct {
	reg      *ratelimit.Registry
	ns       *ratelimit.Namespace
	counted  atomic.Int64 // hits a call reported counted
	closeErr error
	took     time.Duration
}

func runCloseRace(t *testing.T, srv *redisProc, proxyAddr string, round int, latency, deadline time.Duration) {
	const (
		registries = 4
		workers    = 8
		keys       = 50
	)
	opts := redis.Options{KeyPrefix: "close" + strconv.Itoa(round), Shards: 8}
	limit := ratelimit.Limit{Window: time.Hour, Max: 1 << 40}
	var nodes []*closeNode
	for i := range registries {
		cl := goredis.NewClient(redisOptions(proxyAddr))
		t.Cleanup(func() { _ = cl.Close() })
		st, err := redis.New(cl, opts)
		require.NoError(t, err)
		cfg := countingConfig(st, i == registries-1)
		cfg.Namespace = "race" + strconv.Itoa(i)
		// Far above the slack Close is given: a Close that waited for a push
		// to time out would stand out from scheduling delays.
		cfg.SyncTimeout = 3 * time.Second
		if i%2 == 1 {
			// Room for a third of the keys: evictions all the time, racing
			// Increment's lock-free additions and, at Close, the seal that
			// takes every entry out of the table.
			cfg.MaxKeys = keys / 3
		}
		n := &closeNode{reg: ratelimit.NewRegistry()}
		n.ns, err = n.reg.New(cfg)
		require.NoError(t, err)
		nodes = append(nodes, n)
	}
	from := time.Now()
	var closedAt atomic.Int64 // when the last Close returned (UnixNano), 0 before
	var lateOK atomic.Int64   // calls started after every Close returned that did not get ErrClosed
	var wg sync.WaitGroup
	for _, n := range nodes {
		for w := range workers {
			wg.Go(func() {
				ctx := context.Background()
				for k := 0; ; k++ {
					key := "k" + strconv.Itoa((w*31+k)%keys)
					var err error
					started := time.Now().UnixNano()
					if k%2 == 0 {
						var d ratelimit.Decision
						d, err = n.ns.Allow(ctx, key, 1, limit)
						if err == nil && !d.Allowed {
							t.Errorf("Allow rejected under a limit of 2^40")
						}
					} else {
						_, err = n.ns.Increment(ctx, key, time.Hour, 1)
					}
					switch {
					case errors.Is(err, ratelimit.ErrClosed):
						return
					case err == nil, errors.Is(err, ratelimit.ErrStoreUnavailable):
						n.counted.Add(1)
						if at := closedAt.Load(); at != 0 && started > at {
							lateOK.Add(1)
						}
					default:
						t.Errorf("call: %v", err)
						return
					}
					// Paced: 32 goroutines that never sleep would starve Close
					// itself of the 2 cores for hundreds of milliseconds.
					if err != nil || k%16 == 15 {
						time.Sleep(time.Millisecond)
					}
				}
			})
		}
	}
	// Traffic before Close, long enough for pushes to land through the proxy
	// (a connection's setup takes a few round trips).
	time.Sleep(max(300*time.Millisecond, 10*latency))
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	var cw sync.WaitGroup
	for _, n := range nodes {
		cw.Go(func() {
			t0 := time.Now()
			n.closeErr = n.reg.Close(ctx)
			n.took = time.Since(t0)
		})
	}
	cw.Wait()
	cancel()
	closedAt.Store(time.Now().UnixNano())
	wg.Wait()

	// Every call after Close: ErrClosed.
	for _, n := range nodes {
		_, err := n.ns.Increment(context.Background(), "k0", time.Hour, 1)
		require.ErrorIs(t, err, ratelimit.ErrClosed)
		_, err = n.ns.Allow(context.Background(), "k0", 1, limit)
		require.ErrorIs(t, err, ratelimit.ErrClosed)
	}
	require.Zero(t, lateOK.Load(), "calls counted after Close returned")

	direct, err := redis.New(srv.client(), opts)
	require.NoError(t, err)
	type got struct {
		counted, stored int64
		unpushed        *ratelimit.UnpushedError
	}
	var gots []got
	var report string
	for i, n := range nodes {
		g := got{counted: n.counted.Load(), stored: closeStored(t, direct, n.ns.Name(), keys, from)}
		errors.As(n.closeErr, &g.unpushed)
		gots = append(gots, g)
		var h int64
		if g.unpushed != nil {
			h = g.unpushed.Hits
		}
		report += fmt.Sprintf(" [%d: counted %d, stored %d, Close nil %v in %v, unpushed %d]", i, g.counted, g.stored,
			n.closeErr == nil, n.took.Round(time.Millisecond), h)
	}
	result(t, "round %d, latency %v, deadline %v:%s", round, latency, deadline, report)
	for i, n := range nodes {
		g := gots[i]
		switch {
		case n.closeErr == nil:
			require.Equal(t, g.counted, g.stored, "registry %d: Close returned nil, the store has %d of %d hits", i, g.stored, g.counted)
		case g.unpushed != nil:
			require.LessOrEqual(t, g.counted-g.stored, g.unpushed.Hits,
				"registry %d: %d hits missing from the store, Close said %d", i, g.counted-g.stored, g.unpushed.Hits)
		default:
			t.Fatalf("registry %d: Close: %v", i, n.closeErr)
		}
		require.LessOrEqual(t, g.stored, g.counted, "registry %d: hits counted twice", i)
		require.Less(t, n.took, deadline+time.Second, "registry %d: Close took %v", i, n.took)
	}
}

// closeStored returns the store's total of a namespace's keys over the hours
// since from.
func closeStored(t *testing.T, s strategy.Strategy, ns string, keys int, from time.Time) int64 {
	t.Helper()
	names := make([]string, keys)
	for i := range names {
		names[i] = "k" + strconv.Itoa(i)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var total int64
	for w := strategy.WindowStart(from.UnixMilli(), time.Hour); w <= time.Now().UnixMilli(); w += time.Hour.Milliseconds() {
		for c, err := range s.GetCounters(ctx, strategy.Query{Namespace: ns, Sizes: []time.Duration{time.Hour}, Now: w, Keys: names}) {
			require.NoError(t, err)
			if c.Start == w {
				total += c.Count
			}
		}
	}
	return total
}
