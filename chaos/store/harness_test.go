package store

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"iter"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/ratesync/ratelimit"
	"github.com/ratesync/ratelimit/internal/faultproxy"
	"github.com/ratesync/ratelimit/strategy"
	"github.com/ratesync/ratelimit/strategy/memory"
	"github.com/ratesync/ratelimit/strategy/postgres"
	"github.com/ratesync/ratelimit/strategy/redis"
	"github.com/ratesync/ratelimit/strategy/strategytest"
)

const (
	envRedis    = "RATELIMIT_TEST_REDIS_ADDR"
	envPostgres = "RATELIMIT_TEST_POSTGRES_DSN"
	envHeavy    = "RATELIMIT_TEST_HEAVY"
)

// The reference scenario: 3 nodes, 300 hits/s each, a limit of 1,000 per 10 s,
// SyncRate 100 ms (README.md, Failure behaviour).
const (
	refNodes    = 3
	refRate     = 300 // hits per second per node
	refLimit    = 1000
	refWindow   = 10 * time.Second
	refSyncRate = 100 * time.Millisecond
	// refSlack is B = nodes × rate × SyncRate: what a window can over-admit
	// before the other nodes sync.
	refSlack = refNodes * refRate * int64(refSyncRate) / int64(time.Second)
)

// tally is a second window, one hour long with a limit no test reaches:
// every admitted hit is also counted there, so the store's hour counters
// total every admitted hit of a test, long after its 10 s windows expired.
var tally = ratelimit.Limit{Window: time.Hour, Max: 1 << 40}

func heavy() bool { return os.Getenv(envHeavy) == "1" }

// pick returns full when RATELIMIT_TEST_HEAVY=1, else short.
func pick[T any](full, short T) T {
	if heavy() {
		return full
	}
	return short
}

// noLeaks registers the goroutine leak check; call it first, so that it runs
// after every other cleanup (nodes, clients, proxies, servers).
func noLeaks(t *testing.T) {
	t.Helper()
	t.Cleanup(func() { goleak.VerifyNone(t) })
	before := runtime.NumGoroutine()
	t.Cleanup(func() {
		// Runs after every other cleanup but goleak's: the end state.
		pollUntil(time.Second, func() bool { return runtime.NumGoroutine() <= before })
		result(t, "goroutines: %d at the start, %d after Close and cleanup", before, runtime.NumGoroutine())
	})
}

// namedCase is a subtest.
type namedCase struct {
	name string
	f    func(t *testing.T)
}

// concurrently runs the cases as subtests at the same time, or one after the
// other when sequential is set. Calling t.Run from several goroutines is
// allowed, and unlike t.Parallel it is not limited by -parallel (GOMAXPROCS
// by default, 2 here). The parent's goroutine leak check covers them all.
func concurrently(t *testing.T, sequential bool, cases ...namedCase) {
	t.Helper()
	if sequential {
		for _, c := range cases {
			t.Run(c.name, c.f)
		}
		return
	}
	var wg sync.WaitGroup
	for _, c := range cases {
		wg.Go(func() { t.Run(c.name, c.f) })
	}
	wg.Wait()
}

func unique(t testing.TB) string {
	t.Helper()
	var b [5]byte
	_, err := rand.Read(b[:])
	require.NoError(t, err)
	return hex.EncodeToString(b[:])
}

// result logs a measured figure with a prefix that is easy to grep for
// (RESULTS.md is written from these lines).
func result(t testing.TB, format string, args ...any) {
	t.Helper()
	t.Logf("RESULT %s: %s", t.Name(), fmt.Sprintf(format, args...))
}

// ---------------------------------------------------------------------------
// A probe wraps a node's strategy and counts what the node asks of it.

type probe struct {
	strategy.Strategy
	attempts, failures atomic.Int64
	inflight, maxIn    atomic.Int64
	// newIDs makes every PushDiffs call use a batch ID of its own, as a store
	// without idempotency would behave: the control of the lost-reply test.
	newIDs atomic.Bool

	mu     sync.Mutex
	starts []time.Time
}

func (p *probe) PushDiffs(ctx context.Context, b *strategy.Batch) (strategy.Result, error) {
	n := p.attempts.Add(1)
	p.mu.Lock()
	p.starts = append(p.starts, time.Now())
	p.mu.Unlock()
	in := p.inflight.Add(1)
	defer p.inflight.Add(-1)
	for m := p.maxIn.Load(); in > m && !p.maxIn.CompareAndSwap(m, in); m = p.maxIn.Load() {
	}
	if p.newIDs.Load() {
		c := *b
		c.ID = b.ID + "/" + strconv.FormatInt(n, 10)
		b = &c
	}
	res, err := p.Strategy.PushDiffs(ctx, b)
	if err != nil {
		p.failures.Add(1)
	}
	return res, err
}

// attemptsSince returns the start times of the PushDiffs calls at or after t.
func (p *probe) attemptsSince(t time.Time) []time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	i, _ := slices.BinarySearchFunc(p.starts, t, func(a, b time.Time) int { return a.Compare(b) })
	return slices.Clone(p.starts[i:])
}

// ---------------------------------------------------------------------------
// Backends: a store reached through a fault path, and a direct view of it.

type backend struct {
	name string
	// node returns the strategy one node uses (its own client or pool),
	// reached through the fault path.
	node func() strategy.Strategy
	// direct reads the store without faults.
	direct strategy.Strategy
	// outage starts (true) or ends a store outage.
	outage func(on bool)
	// lostReplyThenOutage starts an outage at the moment a push of
	// namespace was applied and its reply is being lost; it returns a
	// function that reports whether that has happened yet.
	lostReplyThenOutage func(namespace string) (happened func() bool)
	// latency adds d to every round trip to the store.
	latency func(d time.Duration)
	// proxy is the fault proxy in front of a real server (nil for memory).
	proxy *faultproxy.Proxy
	// windowsKept says the store keeps every window of a test (no TTL,
	// no purge within a minute), so per-window totals can be compared.
	windowsKept bool
	// pg is a direct pool to PostgreSQL (nil for other stores).
	pg *pgxpool.Pool
}

// memGate is the fault path of the memory store: a strategy in front of a
// memory.Store that can black-hole calls (they block until their context is
// done, with an unknown outcome), delay them, and swap the store for an empty
// one (a restart that loses every counter).
type memGate struct {
	cur     atomic.Pointer[memory.Store]
	hole    atomic.Bool
	latency atomic.Int64
	// loseThenHole: the next push is applied, its reply lost, and the
	// black hole starts.
	loseThenHole, lostThenHoled atomic.Bool
}

func newMemGate() *memGate {
	g := &memGate{}
	g.cur.Store(memory.New())
	return g
}

// wait applies the gate's faults; a non-nil error means the call never
// reached the store.
func (g *memGate) wait(ctx context.Context) error {
	if d := time.Duration(g.latency.Load()); d > 0 {
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("memgate: %w (outcome unknown)", ctx.Err())
		}
	}
	if g.hole.Load() {
		<-ctx.Done()
		return fmt.Errorf("memgate: black hole: %w (outcome unknown)", ctx.Err())
	}
	return nil
}

func (g *memGate) PushDiffs(ctx context.Context, b *strategy.Batch) (strategy.Result, error) {
	if err := g.wait(ctx); err != nil {
		return strategy.Result{}, err
	}
	res, err := g.cur.Load().PushDiffs(ctx, b)
	if err == nil && len(b.Diffs) > 0 && g.loseThenHole.CompareAndSwap(true, false) {
		g.hole.Store(true)
		g.lostThenHoled.Store(true)
		return strategy.Result{}, fmt.Errorf("memgate: reply lost (outcome unknown)")
	}
	return res, err
}

func (g *memGate) GetCounters(ctx context.Context, q strategy.Query) iter.Seq2[strategy.Counter, error] {
	if err := g.wait(ctx); err != nil {
		return func(yield func(strategy.Counter, error) bool) { yield(strategy.Counter{}, err) }
	}
	return g.cur.Load().GetCounters(ctx, q)
}

func (g *memGate) GetWindow(ctx context.Context, ns string, id strategy.CounterID) (int64, error) {
	if err := g.wait(ctx); err != nil {
		return 0, err
	}
	return g.cur.Load().GetWindow(ctx, ns, id)
}

func (g *memGate) Purge(ctx context.Context, now int64) error {
	if err := g.wait(ctx); err != nil {
		return err
	}
	return g.cur.Load().Purge(ctx, now)
}

// direct reads the current memory store without faults.
type memDirect struct{ g *memGate }

func (d memDirect) PushDiffs(ctx context.Context, b *strategy.Batch) (strategy.Result, error) {
	return d.g.cur.Load().PushDiffs(ctx, b)
}
func (d memDirect) GetCounters(ctx context.Context, q strategy.Query) iter.Seq2[strategy.Counter, error] {
	return d.g.cur.Load().GetCounters(ctx, q)
}
func (d memDirect) GetWindow(ctx context.Context, ns string, id strategy.CounterID) (int64, error) {
	return d.g.cur.Load().GetWindow(ctx, ns, id)
}
func (d memDirect) Purge(ctx context.Context, now int64) error {
	return d.g.cur.Load().Purge(ctx, now)
}

func memoryBackend(t *testing.T) (*backend, *memGate) {
	g := newMemGate()
	return &backend{
		name:        "memory",
		windowsKept: true,
		node:        func() strategy.Strategy { return g },
		direct:      memDirect{g},
		outage:      func(on bool) { g.hole.Store(on) },
		latency:     func(d time.Duration) { g.latency.Store(int64(d)) },
		lostReplyThenOutage: func(string) func() bool {
			g.loseThenHole.Store(true)
			return g.lostThenHoled.Load
		},
	}, g
}

// redisOptions sets every timeout and retry option explicitly, as the
// strategy's documentation asks. ContextTimeoutEnabled makes the namespace's
// SyncTimeout bound each call.
func redisOptions(addr string) *goredis.Options {
	return &goredis.Options{
		Addr:                  addr,
		MaxRetries:            3,
		MinRetryBackoff:       5 * time.Millisecond,
		MaxRetryBackoff:       100 * time.Millisecond,
		DialTimeout:           time.Second,
		ReadTimeout:           3 * time.Second,
		WriteTimeout:          3 * time.Second,
		PoolTimeout:           4 * time.Second,
		ContextTimeoutEnabled: true,
	}
}

func redisAddr(t *testing.T) string {
	t.Helper()
	addr := os.Getenv(envRedis)
	if addr == "" {
		strategytest.SkipOrFail(t, envRedis)
	}
	return addr
}

func newProxy(t *testing.T, target string) *faultproxy.Proxy {
	t.Helper()
	p, err := faultproxy.New(target)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, p.Close()) })
	return p
}

func redisClient(t *testing.T, addr string) *goredis.Client {
	t.Helper()
	c := goredis.NewClient(redisOptions(addr))
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// redisBackend puts a proxy in front of the Redis server at addr; every node
// has its own client. Keys get a prefix of their own.
func redisBackend(t *testing.T, addr string, configure ...func(*goredis.Options)) *backend {
	t.Helper()
	direct := redisClient(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	require.NoError(t, direct.Ping(ctx).Err(), "Redis at %s", addr)
	opts := redis.Options{KeyPrefix: "chaos-" + unique(t), Shards: 8}
	px := newProxy(t, addr)
	ds, err := redis.New(direct, opts)
	require.NoError(t, err)
	b := &backend{
		name:  "redis",
		proxy: px,
		node: func() strategy.Strategy {
			o := redisOptions(px.Addr())
			for _, f := range configure {
				f(o)
			}
			c := goredis.NewClient(o)
			t.Cleanup(func() { _ = c.Close() })
			s, err := redis.New(c, opts)
			require.NoError(t, err)
			return s
		},
		direct: ds,
		outage: func(on bool) {
			if on {
				px.SetMode(faultproxy.BlackHole)
			} else {
				px.SetMode(faultproxy.Forward)
			}
		},
		latency: px.SetLatency,
	}
	b.lostReplyThenOutage = func(string) func() bool {
		return armLostReplyThenOutage(b, isScriptCall, nil)
	}
	return b
}

func postgresDSN(t *testing.T) string {
	t.Helper()
	dsn := os.Getenv(envPostgres)
	if dsn == "" {
		strategytest.SkipOrFail(t, envPostgres)
	}
	return dsn
}

// postgresBackend puts a proxy in front of PostgreSQL; every node has its own
// pool through it. The tables are the test's own, dropped at the end. An
// outage is a stopped server: new connections refused, open ones dropped.
func postgresBackend(t *testing.T, configure ...func(*pgxpool.Config)) (*backend, string) {
	t.Helper()
	dsn := postgresDSN(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	directPool, err := pgxpool.New(ctx, dsn)
	require.NoError(t, err)
	t.Cleanup(directPool.Close)
	table := "chaos_" + unique(t)
	opts := postgres.Options{Table: table}
	ds, err := postgres.New(ctx, directPool, opts)
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err := directPool.Exec(ctx, fmt.Sprintf(`DROP TABLE IF EXISTS %q, %q`, table, table+"_batches"))
		require.NoError(t, err)
	})
	cfg, err := pgxpool.ParseConfig(dsn)
	require.NoError(t, err)
	px := newProxy(t, fmt.Sprintf("%s:%d", cfg.ConnConfig.Host, cfg.ConnConfig.Port))
	b := &backend{
		name:        "postgres",
		windowsKept: true,
		proxy:       px,
		pg:          directPool,
		node: func() strategy.Strategy {
			cfg, err := pgxpool.ParseConfig(dsn)
			require.NoError(t, err)
			cfg.ConnConfig.Host, cfg.ConnConfig.Port = "127.0.0.1", uint16(px.Port())
			cfg.ConnConfig.TLSConfig, cfg.ConnConfig.Fallbacks = nil, nil
			cfg.ConnConfig.ConnectTimeout = 2 * time.Second
			cfg.MaxConns = 4
			for _, f := range configure {
				f(cfg)
			}
			pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
			require.NoError(t, err)
			t.Cleanup(pool.Close)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			s, err := postgres.New(ctx, pool, opts)
			require.NoError(t, err)
			return s
		},
		direct: ds,
		outage: func(on bool) {
			if on {
				px.SetMode(faultproxy.Refuse)
				px.DropAll()
			} else {
				px.SetMode(faultproxy.Forward)
			}
		},
		latency: px.SetLatency,
	}
	b.lostReplyThenOutage = func(ns string) func() bool {
		return armLostReplyThenOutage(b, containsFunc(ns), readyForQuery)
	}
	return b, table
}

// armLostReplyThenOutage arms b's proxy to cut the next request that match
// accepts once done says the server answered it (it was applied), and to
// start b's outage at that moment, so the client's own retries fall into
// the outage. It returns whether the cut has happened.
func armLostReplyThenOutage(b *backend, match, done func([]byte) bool) func() bool {
	var happened atomic.Bool
	b.proxy.Arm(faultproxy.Cut{Match: match, ReplyDone: func(reply []byte) bool {
		if done != nil && !done(reply) {
			return false
		}
		b.outage(true)
		happened.Store(true)
		return true
	}})
	return happened.Load
}

// ---------------------------------------------------------------------------
// A cluster of nodes sharing a backend.

type node struct {
	ns    *ratelimit.Namespace
	probe *probe
}

type cluster struct {
	name  string
	nodes []*node
}

// newCluster starts n registries with one namespace each on b. cfg gives the
// namespace's settings; Namespace, WindowSizes and Strategy are filled in.
func newCluster(t *testing.T, b *backend, n int, cfg ratelimit.Config) *cluster {
	t.Helper()
	c := &cluster{name: "chaos-" + unique(t)}
	if cfg.SyncTimeout == 0 {
		cfg.SyncTimeout = time.Second
	}
	if cfg.Clock == nil {
		// The traffic brackets each decision between two time.Now readings
		// to know its window (traffic.run). The default clock is cached and
		// lags time.Now by a millisecond, by more on a starved machine, so
		// a hit decided just after a boundary would count in the window
		// before the bracket: the per-window checks would see a hit move
		// between windows (seen in CI under load, never a hit lost).
		cfg.Clock = time.Now
	}
	for range n {
		p := &probe{Strategy: b.node()}
		reg := ratelimit.NewRegistry()
		cfg := cfg
		cfg.Namespace, cfg.Strategy = c.name, p
		if len(cfg.WindowSizes) == 0 {
			cfg.WindowSizes = []time.Duration{refWindow, tally.Window}
		}
		ns, err := reg.New(cfg)
		require.NoError(t, err)
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_ = reg.Close(ctx)
		})
		c.nodes = append(c.nodes, &node{ns: ns, probe: p})
	}
	return c
}

// close closes every node within d and returns the first error.
func (c *cluster) close(d time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var first error
	for _, n := range c.nodes {
		if err := n.ns.Close(ctx); err != nil && first == nil {
			first = err
		}
	}
	return first
}

func (c *cluster) stats() (syncs, errs, pending int64, unresolved int) {
	for _, n := range c.nodes {
		s := n.ns.Stats()
		syncs += s.Syncs
		errs += s.SyncErrors
		pending += s.PendingHits
		unresolved += s.UnresolvedPushes
	}
	return
}

func (c *cluster) attempts() (n int64) {
	for _, nd := range c.nodes {
		n += nd.probe.attempts.Load()
	}
	return n
}

func (c *cluster) maxInflight() (m int64) {
	for _, nd := range c.nodes {
		m = max(m, nd.probe.maxIn.Load())
	}
	return m
}

// storeTotal returns the store's count of key in the tally window, which
// holds every admitted hit of a test (the test may cross an hour boundary,
// so the previous hour is added).
func storeTotal(ctx context.Context, s strategy.Strategy, ns, key string, from, to time.Time) (int64, error) {
	var sum int64
	for start := strategy.WindowStart(from.UnixMilli(), time.Hour); start <= to.UnixMilli(); start += time.Hour.Milliseconds() {
		n, err := s.GetWindow(ctx, ns, strategy.CounterID{Key: key, Size: time.Hour, Start: start})
		if err != nil {
			return 0, err
		}
		sum += n
	}
	return sum, nil
}

// ---------------------------------------------------------------------------
// Traffic: each node sends rate hits per second, round-robin over keys,
// through Allow with the reference limit (and the tally window).

type sample struct {
	phase   int32
	latency time.Duration
}

type traffic struct {
	keys  []string
	limit ratelimit.Limit
	phase atomic.Int32 // tags latency samples

	mu        sync.Mutex
	admitted  map[string]int64           // per key, every window
	perWindow map[int64]map[string]int64 // per limit-window start, per key
	samples   []sample
	degraded  int64
	straddled int64 // admitted hits decided across a window boundary
	errs      []error

	stop chan struct{}
	wg   sync.WaitGroup
	from time.Time
}

// start sends rate hits per second from every node of c until stop.
func start(c *cluster, keys []string, limit ratelimit.Limit, rate int) *traffic {
	tr := &traffic{keys: keys, limit: limit, admitted: map[string]int64{}, perWindow: map[int64]map[string]int64{},
		stop: make(chan struct{}), from: time.Now()}
	interval := time.Second / time.Duration(rate)
	for i, n := range c.nodes {
		tr.wg.Go(func() { tr.run(n.ns, i, interval) })
	}
	return tr
}

func (tr *traffic) run(ns *ratelimit.Namespace, offset int, interval time.Duration) {
	ctx := context.Background()
	local := make([]sample, 0, 1<<14)
	admitted := map[string]int64{}
	perWindow := map[int64]map[string]int64{}
	var degraded, straddled int64
	var errs []error
	defer func() {
		tr.mu.Lock()
		defer tr.mu.Unlock()
		tr.samples = append(tr.samples, local...)
		for k, v := range admitted {
			tr.admitted[k] += v
		}
		for w, m := range perWindow {
			if tr.perWindow[w] == nil {
				tr.perWindow[w] = map[string]int64{}
			}
			for k, v := range m {
				tr.perWindow[w][k] += v
			}
		}
		tr.degraded += degraded
		tr.straddled += straddled
		tr.errs = append(tr.errs, errs...)
	}()
	count := func(w int64, key string) {
		if perWindow[w] == nil {
			perWindow[w] = map[string]int64{}
		}
		perWindow[w][key]++
	}
	// Paced, not ticked: a node that fell behind (a loaded machine delays
	// timers) catches up with a burst, so every node sends rate hits per
	// second on average, whatever the scheduling.
	begin := time.Now()
	for i, sent := offset, int64(0); ; i++ {
		if due := int64(time.Since(begin) / interval); sent >= due {
			t := time.NewTimer(time.Until(begin.Add(time.Duration(sent+1) * interval)))
			select {
			case <-tr.stop:
				t.Stop()
				return
			case <-t.C:
			}
		} else {
			select {
			case <-tr.stop:
				return
			default:
			}
		}
		sent++
		key := tr.keys[i%len(tr.keys)]
		phase := tr.phase.Load()
		t0 := time.Now()
		d, err := ns.Allow(ctx, key, 1, tr.limit, tally)
		t1 := time.Now()
		if err != nil {
			errs = append(errs, err)
			continue
		}
		local = append(local, sample{phase, t1.Sub(t0)})
		if d.Degraded {
			degraded++
		}
		if d.Allowed {
			admitted[key]++
			// A hit decided across a window boundary counts in both windows:
			// the per-window bounds are upper bounds, so this is conservative.
			w0, w1 := strategy.WindowStart(t0.UnixMilli(), tr.limit.Window), strategy.WindowStart(t1.UnixMilli(), tr.limit.Window)
			count(w0, key)
			if w1 != w0 {
				count(w1, key)
				straddled++
			}
		}
	}
}

// halt stops the traffic and waits for it.
func (tr *traffic) halt() {
	close(tr.stop)
	tr.wg.Wait()
}

func (tr *traffic) total() (n int64) {
	for _, v := range tr.admitted {
		n += v
	}
	return n
}

// latencies returns the sorted Allow latencies of a phase.
func (tr *traffic) latencies(phase int32) []time.Duration {
	var out []time.Duration
	for _, s := range tr.samples {
		if s.phase == phase {
			out = append(out, s.latency)
		}
	}
	slices.Sort(out)
	return out
}

// quantile returns the q-quantile of sorted durations.
func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q * float64(len(sorted)-1))
	return sorted[i]
}

// checkExact polls (until deadline) the store until its tally counters equal
// the hits tr admitted, key by key, and returns how long that took. Each then
// is called as soon as they are equal.
func checkExact(t *testing.T, b *backend, c *cluster, tr *traffic, deadline time.Duration, then ...func()) time.Duration {
	t.Helper()
	startWait := time.Now()
	var got map[string]int64
	ok := pollUntil(deadline, func() bool {
		got = map[string]int64{}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		for _, k := range tr.keys {
			n, err := storeTotal(ctx, b.direct, c.name, k, tr.from, time.Now())
			if err != nil {
				return false
			}
			got[k] = n
		}
		for _, k := range tr.keys {
			if got[k] != tr.admitted[k] {
				return false
			}
		}
		for _, f := range then {
			f()
		}
		return true
	})
	require.True(t, ok, "store totals %v never equalled the admitted hits %v", got, tr.admitted)
	return time.Since(startWait)
}

// pollUntil calls f every few milliseconds until it returns true or d
// passes, and reports whether it returned true.
func pollUntil(d time.Duration, f func() bool) bool {
	end := time.Now().Add(d)
	for {
		if f() {
			return true
		}
		if time.Now().After(end) {
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func keysN(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s-%d", prefix, i)
	}
	return out
}

// cycleTrace records the sync cycles and store calls of one node once begin
// is called, to show why a node needed more cycles than expected, and counts
// the cycles begun since then (with the one in flight at begin).
type cycleTrace struct {
	mu       sync.Mutex
	on       bool
	inFlight bool // a sync cycle has started and not ended
	begun    int  // cycles begun since begin, with the one in flight then
	origin   time.Time
	lines    []string
}

func (c *cycleTrace) begin() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.on, c.origin = true, time.Now()
	if c.inFlight {
		c.begun = 1
	}
}

// cycles returns the cycles begun since begin.
func (c *cycleTrace) cycles() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.begun
}

func (c *cycleTrace) Start(ctx context.Context, op ratelimit.Op) context.Context {
	if op == ratelimit.OpSync {
		c.mu.Lock()
		c.inFlight = true
		if c.on {
			c.begun++
		}
		c.mu.Unlock()
	}
	return ctx
}

func (c *cycleTrace) End(_ context.Context, e ratelimit.Event) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e.Op == ratelimit.OpSync {
		c.inFlight = false
	}
	if !c.on || len(c.lines) > 200 {
		return
	}
	c.lines = append(c.lines, fmt.Sprintf("  +%v %s %v diffs %d reads %d delta %d err %v",
		e.Start.Sub(c.origin).Round(time.Millisecond), e.Op, e.Duration.Round(time.Millisecond), e.Diffs, e.Reads, e.Delta, e.Err))
}

func (c *cycleTrace) Decision(context.Context, ratelimit.DecisionEvent) {}

func (c *cycleTrace) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return strings.Join(c.lines, "\n")
}
