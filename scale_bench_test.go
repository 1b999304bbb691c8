package ratelimit_test

import (
	"context"
	"fmt"
	"iter"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	goredis "github.com/redis/go-redis/v9"

	"github.com/ratesync/ratelimit"
	"github.com/ratesync/ratelimit/strategy"
	"github.com/ratesync/ratelimit/strategy/memory"
	"github.com/ratesync/ratelimit/strategy/postgres"
	rlredis "github.com/ratesync/ratelimit/strategy/redis"
)

// oldProtocol hides a store's capabilities: a namespace over it reads every
// key it holds each cycle, as before change logs.
type oldProtocol struct{ s strategy.Strategy }

func (o oldProtocol) PushDiffs(ctx context.Context, b *strategy.Batch) (strategy.Result, error) {
	return o.s.PushDiffs(ctx, b)
}

func (o oldProtocol) GetCounters(ctx context.Context, q strategy.Query) iter.Seq2[strategy.Counter, error] {
	return o.s.GetCounters(ctx, q)
}

func (o oldProtocol) GetWindow(ctx context.Context, ns string, id strategy.CounterID) (int64, error) {
	return o.s.GetWindow(ctx, ns, id)
}

func (o oldProtocol) Purge(ctx context.Context, now int64) error { return o.s.Purge(ctx, now) }

// countingConn counts the bytes a Redis client sends and receives.
type countingConn struct {
	net.Conn
	n *atomic.Int64
}

func (c countingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.n.Add(int64(n))
	return n, err
}

func (c countingConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.n.Add(int64(n))
	return n, err
}

// redisUsec returns the CPU time Redis spent in commands so far (INFO
// commandstats: the sum of usec), in microseconds.
func redisUsec(b *testing.B, c *goredis.Client) int64 {
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	var total int64
	for _, line := range strings.Split(info, "\n") {
		_, rest, ok := strings.Cut(line, ",usec=")
		if !ok {
			continue
		}
		v, _, _ := strings.Cut(rest, ",")
		n, err := strconv.ParseInt(v, 10, 64)
		if err == nil {
			total += n
		}
	}
	return total
}

// BenchmarkSyncScale measures one node's sync cycle as a function of the keys
// it holds and the share of them that changed since the last cycle (here, and
// as much again on another node), with the old protocol (every held key read
// each cycle) and with change logs (watches), side by side in one run. It
// reports per cycle the store's CPU (Redis: INFO commandstats) and the wire
// bytes (Redis), and the cycle's duration as ns/op, with the medians of the
// cycles' durations (p50-ms) and Redis CPU (redis-p50-ms), which a shared
// machine moves less than the means. RATELIMIT_BENCH_KEYS
// sets the keys held (default 100000) and RATELIMIT_BENCH_CHANGED the shares
// changed, in percent (default 0,1,100).
//
//	RATELIMIT_BENCH_KEYS=100000,1000000 RATELIMIT_TEST_REDIS_ADDR=127.0.0.1:6379 \
//	RATELIMIT_TEST_POSTGRES_DSN=postgres://postgres@127.0.0.1:5432/test \
//	go test -run '^$' -bench BenchmarkSyncScale -benchtime 5x -timeout 60m .
func BenchmarkSyncScale(b *testing.B) {
	sizes := []int{100_000}
	if v := os.Getenv("RATELIMIT_BENCH_KEYS"); v != "" {
		sizes = nil
		for _, f := range strings.Split(v, ",") {
			n, err := strconv.Atoi(f)
			if err != nil {
				b.Fatal(err)
			}
			sizes = append(sizes, n)
		}
	}
	type backend struct {
		name  string
		store func(b *testing.B) (strategy.Strategy, *goredis.Client, *atomic.Int64)
	}
	backends := []backend{{"memory", func(*testing.B) (strategy.Strategy, *goredis.Client, *atomic.Int64) {
		return memory.New(), nil, nil
	}}}
	if addr := os.Getenv("RATELIMIT_TEST_REDIS_ADDR"); addr != "" {
		backends = append(backends, backend{"redis", func(b *testing.B) (strategy.Strategy, *goredis.Client, *atomic.Int64) {
			var wire atomic.Int64
			client := goredis.NewClient(&goredis.Options{Addr: addr, MaxRetries: -1, DialTimeout: 5 * time.Second,
				ReadTimeout: time.Minute, WriteTimeout: time.Minute, PoolTimeout: time.Minute, ContextTimeoutEnabled: true,
				Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
					c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
					if err != nil {
						return nil, err
					}
					return countingConn{c, &wire}, nil
				}})
			b.Cleanup(func() { _ = client.Close() })
			st, err := rlredis.New(client, rlredis.Options{KeyPrefix: fmt.Sprintf("scale%d", time.Now().UnixNano())})
			if err != nil {
				b.Fatal(err)
			}
			return st, client, &wire
		}})
	}
	if dsn := os.Getenv("RATELIMIT_TEST_POSTGRES_DSN"); dsn != "" {
		backends = append(backends, backend{"postgres", func(b *testing.B) (strategy.Strategy, *goredis.Client, *atomic.Int64) {
			pool, err := pgxpool.New(context.Background(), dsn)
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(pool.Close)
			table := fmt.Sprintf("rl_scale_%d", time.Now().UnixNano())
			st, err := postgres.New(context.Background(), pool, postgres.Options{Table: table})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() {
				_, _ = pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+table+", "+table+"_batches")
			})
			return st, nil, nil
		}})
	}
	shares := []int{0, 1, 100}
	if v := os.Getenv("RATELIMIT_BENCH_CHANGED"); v != "" {
		shares = nil
		for _, f := range strings.Split(v, ",") {
			n, err := strconv.Atoi(f)
			if err != nil || n < 0 || n > 100 {
				b.Fatalf("RATELIMIT_BENCH_CHANGED: %q is not a percentage", f)
			}
			shares = append(shares, n)
		}
	}
	ctx := context.Background()
	for _, be := range backends {
		for _, keys := range sizes {
			for _, pct := range shares {
				for _, proto := range []string{"old", "changes"} {
					b.Run(fmt.Sprintf("%s/keys=%d/changed=%d%%/%s", be.name, keys, pct, proto), func(b *testing.B) {
						st, client, wire := be.store(b)
						var prof *cycleProfile
						if client != nil && os.Getenv("RATELIMIT_BENCH_PROFILE") != "" {
							prof = &cycleProfile{}
						}
						if proto == "old" {
							st = oldProtocol{st}
						}
						// A minute window far from its end: no read-ahead, no
						// rotation during the run.
						clk := newDecClock(time.Now().Truncate(time.Minute).Add(5 * time.Second))
						newNode := func() *ratelimit.Namespace {
							reg := ratelimit.NewRegistry()
							b.Cleanup(func() { _ = reg.Close(ctx) })
							ns, err := reg.New(ratelimit.Config{Namespace: "scale", WindowSizes: []time.Duration{time.Minute},
								SyncRate: time.Hour, Strategy: st, Clock: clk.Now, SyncTimeout: 10 * time.Minute,
								MaxKeys: 2 * keys, ColdRead: ratelimit.ColdReadOff})
							if err != nil {
								b.Fatal(err)
							}
							return ns
						}
						here, there := newNode(), newNode()
						names := make([]string, keys)
						for i := range names {
							names[i] = "user:" + strconv.Itoa(i)
							if _, err := here.Increment(ctx, names[i], time.Minute, 1); err != nil {
								b.Fatal(err)
							}
						}
						// Settle: pushed, read, cursors in place, past the
						// full reads that follow the first watches'
						// overflow.
						for range 3 {
							if err := here.Sync(ctx); err != nil {
								b.Fatal(err)
							}
						}
						changed := keys * pct / 100
						var usec, bytes int64
						// Per cycle, for the medians: the machine may be
						// shared, and one slow cycle moves a mean of ten.
						var walls, redisMS []float64
						b.ResetTimer()
						for i := range b.N {
							b.StopTimer()
							for k := range changed {
								name := names[(i*changed+k)%keys]
								_, _ = here.Increment(ctx, name, time.Minute, 1)
								_, _ = there.Increment(ctx, names[(i*changed+k+keys/2)%keys], time.Minute, 1)
							}
							if changed > 0 {
								if err := there.Sync(ctx); err != nil {
									b.Fatal(err)
								}
							}
							var u0, w0 int64
							if prof != nil {
								prof.start(b, client)
							}
							if client != nil {
								u0, w0 = redisUsec(b, client), wire.Load()
							}
							b.StartTimer()
							t0 := time.Now()
							if err := here.Sync(ctx); err != nil {
								b.Fatal(err)
							}
							walls = append(walls, float64(time.Since(t0))/1e6)
							b.StopTimer()
							if client != nil {
								u := redisUsec(b, client) - u0
								usec += u
								redisMS = append(redisMS, float64(u)/1000)
								bytes += wire.Load() - w0
							}
							if prof != nil {
								prof.stop(b, client)
							}
							b.StartTimer()
						}
						if prof != nil {
							prof.report(b)
						}
						if client != nil {
							b.ReportMetric(float64(usec)/float64(b.N)/1000, "redis-ms/cycle")
							b.ReportMetric(float64(bytes)/float64(b.N)/1e6, "wire-MB/cycle")
							b.ReportMetric(median(redisMS), "redis-p50-ms")
						}
						b.ReportMetric(median(walls), "p50-ms")
					})
				}
			}
		}
	}
}

// median returns the median of xs (which it sorts), 0 for none.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	slices.Sort(xs)
	if n := len(xs); n%2 == 0 {
		return (xs[n/2-1] + xs[n/2]) / 2
	}
	return xs[len(xs)/2]
}
