package store

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit"
	"github.com/ratesync/ratelimit/strategy"
	"github.com/ratesync/ratelimit/strategy/strategytest"
)

// Redis topologies (Cluster, Sentinel) the tests start and kill themselves,
// on ports 7501-7599 (and, for Cluster, their bus ports 17501-17599), apart
// from the servers CI starts with .ci/redis-topology.sh and from the
// single servers of startRedis (7301-7399).

const topoFirstPort, topoLastPort = 7501, 7599

var (
	topoPortMu   sync.Mutex
	topoNextPort = topoFirstPort
)

// topoPort returns a port of 7501-7599 that is free now (and whose Cluster
// bus port, +10000, is free too). Ports are handed out in turn, wrapping
// around, so a port freed by a finished test is reused last.
func topoPort(t *testing.T) int {
	t.Helper()
	topoPortMu.Lock()
	defer topoPortMu.Unlock()
	for range topoLastPort - topoFirstPort + 1 {
		port := topoNextPort
		topoNextPort++
		if topoNextPort > topoLastPort {
			topoNextPort = topoFirstPort
		}
		if portFree(port) && portFree(port+10000) {
			return port
		}
	}
	t.Fatalf("no free port in %d-%d", topoFirstPort, topoLastPort)
	return 0
}

func portFree(port int) bool {
	ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
	if err != nil {
		return false
	}
	_ = ln.Close()
	return true
}

// needRedisBinaries skips (or fails, under RATELIMIT_TEST_REQUIRE_SERVICES)
// a test when redis-server or redis-cli is missing.
func needRedisBinaries(t *testing.T) {
	t.Helper()
	redisAddr(t) // the shared server being configured says Redis is expected here
	for _, bin := range []string{"redis-server", "redis-cli"} {
		if _, err := exec.LookPath(bin); err != nil {
			if strategytest.RequireServices() {
				t.Fatalf("%s is not installed (RATELIMIT_TEST_REQUIRE_SERVICES=1)", bin)
			}
			t.Skipf("%s is not installed", bin)
		}
	}
}

// redisProc is a redis-server (or a Sentinel) child process of the test.
type redisProc struct {
	t    *testing.T
	port int
	dir  string   // its working directory (config files, cluster state)
	args []string // after the config file (if any) and the port
	conf string   // a config file to pass first (Sentinel needs one)
	cmd  *exec.Cmd
	log  *os.File
}

// startProc starts a server on a port of its own with args and waits until
// it answers; the test's cleanup kills it.
func startProc(t *testing.T, conf string, args ...string) *redisProc {
	t.Helper()
	p := &redisProc{t: t, port: topoPort(t), dir: t.TempDir(), args: args, conf: conf}
	t.Cleanup(p.kill)
	require.NoError(t, p.start())
	return p
}

func (p *redisProc) addr() string { return "127.0.0.1:" + strconv.Itoa(p.port) }

func (p *redisProc) start() error {
	var args []string
	if p.conf != "" {
		path := filepath.Join(p.dir, "server.conf")
		if err := os.WriteFile(path, []byte(p.conf), 0o600); err != nil {
			return err
		}
		args = append(args, path)
	}
	args = append(args, "--port", strconv.Itoa(p.port), "--bind", "127.0.0.1", "--dir", p.dir,
		"--daemonize", "no", "--protected-mode", "no", "--save", "", "--appendonly", "no")
	args = append(args, p.args...)
	log, err := os.OpenFile(filepath.Join(p.dir, "server.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	p.log = log
	p.cmd = exec.Command("redis-server", args...)
	p.cmd.Dir, p.cmd.Stdout, p.cmd.Stderr = p.dir, log, log
	dieWithTest(p.cmd)
	if err := p.cmd.Start(); err != nil {
		p.cmd = nil
		return err
	}
	c := goredis.NewClient(&goredis.Options{Addr: p.addr(), MaxRetries: -1, DialTimeout: 200 * time.Millisecond,
		ReadTimeout: time.Second, WriteTimeout: time.Second, ContextTimeoutEnabled: true})
	defer c.Close()
	pid := "process_id:" + strconv.Itoa(p.cmd.Process.Pid) + "\r\n"
	if pollUntil(10*time.Second, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		defer cancel()
		info, err := c.Info(ctx, "server").Result()
		return err == nil && strings.Contains(info, pid)
	}) {
		return nil
	}
	p.kill()
	return fmt.Errorf("redis-server on port %d did not answer in 10 s (log: %s)", p.port, p.tail())
}

// tail returns the last lines of the server's log.
func (p *redisProc) tail() string {
	b, _ := os.ReadFile(filepath.Join(p.dir, "server.log"))
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return strings.Join(lines[max(0, len(lines)-5):], " | ")
}

// kill stops the server at once (SIGKILL).
func (p *redisProc) kill() {
	if p.cmd == nil {
		return
	}
	_ = p.cmd.Process.Kill()
	_ = p.cmd.Wait()
	_ = p.log.Close()
	p.cmd = nil
}

// client is a plain client to the process, for test commands.
func (p *redisProc) client() *goredis.Client {
	c := goredis.NewClient(redisOptions(p.addr()))
	p.t.Cleanup(func() { _ = c.Close() })
	return c
}

// info returns the INFO section's fields.
func (p *redisProc) info(section string) map[string]string {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	c := goredis.NewClient(&goredis.Options{Addr: p.addr(), MaxRetries: -1, DialTimeout: 200 * time.Millisecond,
		ReadTimeout: time.Second, WriteTimeout: time.Second, ContextTimeoutEnabled: true})
	defer c.Close()
	s, err := c.Info(ctx, section).Result()
	if err != nil {
		return nil
	}
	return parseInfo(s)
}

func parseInfo(s string) map[string]string {
	m := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		if k, v, ok := strings.Cut(strings.TrimSpace(sc.Text()), ":"); ok {
			m[k] = v
		}
	}
	return m
}

// redisCLI runs redis-cli with args and returns its output.
func redisCLI(t *testing.T, timeout time.Duration, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, "redis-cli", args...).CombinedOutput()
	return string(out), err
}

// ---------------------------------------------------------------------------
// Counting: several nodes count hits through the public API while a fault
// happens; then the store's total is compared with the hits counted.

// countingNode is one registry and its namespace.
type countingNode struct {
	reg   *ratelimit.Registry
	ns    *ratelimit.Namespace
	sync  bool        // synchronous mode (SyncRate 0)
	trace *cycleTrace // its cycles, counted by drain
}

// counting drives hits on keys of an hour window through several nodes.
type counting struct {
	t      *testing.T
	nodes  []*countingNode
	keys   int
	window time.Duration
	from   time.Time

	counted  atomic.Int64 // hits counted by a node (returned nil or ErrStoreUnavailable)
	degraded atomic.Int64 // calls answered with ErrStoreUnavailable
	maxCall  [2]atomic.Int64
	stop     chan struct{}
	stopOnce sync.Once
	wg       sync.WaitGroup
}

// countingConfig is the namespace configuration of every node: one hour
// window (a test never sees it expire), SyncRate 100 ms for asynchronous
// nodes, 0 for synchronous ones.
func countingConfig(st strategy.Strategy, synchronous bool) ratelimit.Config {
	cfg := ratelimit.Config{Namespace: "topo", WindowSizes: []time.Duration{time.Hour}, Strategy: st,
		SyncRate: 100 * time.Millisecond, SyncTimeout: 500 * time.Millisecond, MaxBackoff: time.Second,
		RetryInterval: 200 * time.Millisecond}
	if synchronous {
		cfg.SyncRate = 0
	}
	return cfg
}

// newCounting starts one node per strategy; the last sync of them are
// synchronous (SyncRate 0), the others asynchronous.
func newCounting(t *testing.T, strategies []strategy.Strategy, synchronous int, keys int) *counting {
	t.Helper()
	c := &counting{t: t, keys: keys, window: time.Hour, stop: make(chan struct{})}
	for i, st := range strategies {
		n := &countingNode{reg: ratelimit.NewRegistry(), sync: i >= len(strategies)-synchronous, trace: &cycleTrace{}}
		cfg := countingConfig(st, n.sync)
		cfg.Observer = n.trace
		ns, err := n.reg.New(cfg)
		require.NoError(t, err)
		n.ns = ns
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = n.reg.Close(ctx)
		})
		c.nodes = append(c.nodes, n)
	}
	return c
}

// run starts the traffic: every node increments random keys, a few thousand
// hits per second for an asynchronous node, as fast as the store answers for
// a synchronous one.
func (c *counting) run() {
	c.from = time.Now()
	// A test that fails before finish stops the traffic before the nodes
	// close (cleanups run last in, first out).
	c.t.Cleanup(c.halt)
	for i, n := range c.nodes {
		c.wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(i), uint64(c.from.UnixNano())))
			mode := 0
			if n.sync {
				mode = 1
			}
			for k := 0; ; k++ {
				select {
				case <-c.stop:
					return
				default:
				}
				t0 := time.Now()
				_, err := n.ns.Increment(context.Background(), "k"+strconv.Itoa(rng.IntN(c.keys)), c.window, 1)
				d := int64(time.Since(t0))
				for m := c.maxCall[mode].Load(); d > m && !c.maxCall[mode].CompareAndSwap(m, d); m = c.maxCall[mode].Load() {
				}
				switch {
				case err == nil:
				case errors.Is(err, ratelimit.ErrStoreUnavailable):
					c.degraded.Add(1)
					if n.sync {
						// Answered locally at once: pace it like the others.
						time.Sleep(time.Millisecond)
					}
				default:
					c.t.Errorf("Increment: %v", err)
					return
				}
				c.counted.Add(1)
				if !n.sync && k%4 == 0 {
					time.Sleep(time.Millisecond)
				}
			}
		})
	}
}

// halt stops the traffic.
func (c *counting) halt() {
	c.stopOnce.Do(func() { close(c.stop) })
	c.wg.Wait()
}

// maxCalls returns the longest Increment of an asynchronous node and of a
// synchronous one.
func (c *counting) maxCalls() (async, sync time.Duration) {
	return time.Duration(c.maxCall[0].Load()), time.Duration(c.maxCall[1].Load())
}

// drain waits (up to d) until no node has pending hits, and returns for each
// node the sync cycles it began until its own pending hits reached 0 (for a
// synchronous node: its retries), the one in flight when drain began
// included. A node that drained early keeps running empty cycles while
// another waits out its backoff: those are not counted.
func (c *counting) drain(d time.Duration) (cycles []int64, ok bool) {
	cycles = make([]int64, len(c.nodes))
	for i, n := range c.nodes {
		n.trace.begin()
		cycles[i] = -1
	}
	ok = pollUntil(d, func() bool {
		all := true
		for i, n := range c.nodes {
			if cycles[i] >= 0 {
				continue
			}
			if n.ns.Stats().PendingHits == 0 {
				cycles[i] = int64(n.trace.cycles())
			} else {
				all = false
			}
		}
		return all
	})
	return cycles, ok
}

// pending returns every node's pending hits.
func (c *counting) pending() (n int64) {
	for _, nd := range c.nodes {
		n += nd.ns.Stats().PendingHits
	}
	return n
}

// stored returns the store's total of every key over the hours of the run,
// read through direct.
func (c *counting) stored(direct strategy.Strategy) (int64, error) {
	keys := make([]string, c.keys)
	for i := range keys {
		keys[i] = "k" + strconv.Itoa(i)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	size := c.window.Milliseconds()
	var total int64
	for w := strategy.WindowStart(c.from.UnixMilli(), c.window); w <= time.Now().UnixMilli(); w += size {
		for ctr, err := range direct.GetCounters(ctx, strategy.Query{Namespace: "topo", Sizes: []time.Duration{c.window},
			Now: w, Keys: keys}) {
			if err != nil {
				return 0, err
			}
			if ctr.Start == w {
				total += ctr.Count
			}
		}
	}
	return total, nil
}

// outcome is what a counting run measured.
type outcome struct {
	counted, stored, lost, excess int64
	degraded                      int64
	maxAsync, maxSync             time.Duration
	cycles                        []int64
	drained                       bool
}

func (o outcome) String() string {
	return fmt.Sprintf("%d hits counted, store %d (lost %d, excess %d); %d degraded calls; longest Increment %v async, %v sync; cycles to drain %v (drained %v)",
		o.counted, o.stored, o.lost, o.excess, o.degraded, o.maxAsync.Round(time.Millisecond),
		o.maxSync.Round(time.Millisecond), o.cycles, o.drained)
}

// finish stops the traffic, waits for the nodes to drain (up to d) and
// compares the store's total (read through direct, polled until it stops
// changing) with the hits counted.
func (c *counting) finish(direct strategy.Strategy, d time.Duration) outcome {
	c.t.Helper()
	c.halt()
	var o outcome
	o.cycles, o.drained = c.drain(d)
	o.counted, o.degraded = c.counted.Load(), c.degraded.Load()
	o.maxAsync, o.maxSync = c.maxCalls()
	var err error
	ok := pollUntil(10*time.Second, func() bool {
		o.stored, err = c.stored(direct)
		return err == nil
	})
	require.True(c.t, ok, "reading the store's totals: %v", err)
	o.lost, o.excess = max(0, o.counted-o.stored), max(0, o.stored-o.counted)
	return o
}

// check asserts the promise: no hit counted twice, every node drained within
// maxCycles cycles, every call bounded: a synchronous call by SyncTimeout
// (500 ms) plus slack for a loaded CI machine (async calls were seen taking
// 800 ms there), still well below what an unbounded call takes (go-redis
// waiting ReadTimeout, 1 s, for each of its 4 attempts).
func (o outcome) check(t *testing.T, maxCycles int64) {
	t.Helper()
	require.True(t, o.drained, "pending hits did not drain: %s", o)
	require.LessOrEqual(t, o.stored, o.counted, "hits counted twice: %s", o)
	for i, n := range o.cycles {
		require.LessOrEqual(t, n, maxCycles, "node %d needed %d cycles to drain", i, n)
	}
	o.checkBounded(t)
}

// checkBounded asserts that no call waited on the store past its bound.
func (o outcome) checkBounded(t *testing.T) {
	t.Helper()
	require.Less(t, o.maxAsync, 2*time.Second, "an asynchronous Increment waited")
	require.Less(t, o.maxSync, 3*time.Second, "a synchronous Increment outlived SyncTimeout (500 ms) by over 2.5 s")
}
