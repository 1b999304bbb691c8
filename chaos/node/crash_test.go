package node

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit"
	"github.com/ratesync/ratelimit/strategy/redis"
)

// Scenario 6: a node crashes. The test binary re-executes itself as a child
// node (TestMain sees envCrashNode) that counts hits against the real Redis
// and prints one line per admitted hit; the parent SIGKILLs it mid-traffic
// and compares what the child admitted with what reached Redis.

const (
	envCrashNode   = "RATELIMIT_CHAOS_CRASHNODE" // set in the child: the namespace to count in
	envCrashPrefix = "RATELIMIT_CHAOS_CRASHNODE_PREFIX"
	crashWindow    = time.Hour // one window holds the whole run (and GetCounters reads two)
	crashKey       = "crash"
	crashSyncRate  = refSyncRate
	crashRate      = refRate
)

func TestMain(m *testing.M) {
	if ns := os.Getenv(envCrashNode); ns != "" {
		os.Exit(crashNode(ns))
	}
	os.Exit(m.Run())
}

// crashNode is the child: it counts crashRate hits per second, printing
// "hit <unix ns>" after each admitted one and "sync <n>" when it sees that
// the loop has completed n sync cycles, until it is killed or reads "close"
// on stdin, when it stops, closes the namespace and prints "closed <error or
// ok>".
func crashNode(namespace string) int {
	client := goredisClient(os.Getenv(envRedis))
	defer func() { _ = client.Close() }()
	store, err := redis.New(client, redis.Options{KeyPrefix: os.Getenv(envCrashPrefix)})
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	ns, err := ratelimit.NewRegistry().New(ratelimit.Config{Namespace: namespace, WindowSizes: []time.Duration{crashWindow},
		SyncRate: crashSyncRate, Strategy: store})
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	stop := make(chan struct{})
	go func() {
		s := bufio.NewScanner(os.Stdin)
		for s.Scan() {
			if s.Text() == "close" {
				close(stop)
				return
			}
		}
	}()
	out := bufio.NewWriter(os.Stdout)
	fmt.Fprintln(out, "ready")
	_ = out.Flush()
	tick := time.NewTicker(time.Second / crashRate)
	defer tick.Stop()
	limit := ratelimit.Limit{Window: crashWindow, Max: ratelimit.MaxValue}
	var syncs int64
	for {
		select {
		case <-stop:
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			err := ns.Close(ctx)
			cancel()
			if err != nil {
				fmt.Fprintln(out, "closed", err)
			} else {
				fmt.Fprintln(out, "closed ok")
			}
			_ = out.Flush()
			return 0
		case <-tick.C:
		}
		d, err := ns.Allow(context.Background(), crashKey, 1, limit)
		if err != nil || !d.Allowed {
			fmt.Fprintln(out, "error", err, d.Allowed)
			_ = out.Flush()
			return 1
		}
		// One write per hit: a line printed is a hit the node admitted.
		fmt.Fprintln(out, "hit", time.Now().UnixNano())
		if n := ns.Stats().Syncs; n != syncs {
			syncs = n
			fmt.Fprintln(out, "sync", n)
		}
		_ = out.Flush()
	}
}

// child is a running child node.
type child struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines *bufio.Scanner
	hits  []time.Time // admitted hits, as reported
	// syncs[i] is how many hits had been reported when the child saw its
	// loop's (i+1)th completed cycle.
	syncs []int
}

func startChild(t *testing.T, addr, prefix, namespace string) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envCrashNode+"="+namespace, envCrashPrefix+"="+prefix, envRedis+"="+addr)
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	c := &child{cmd: cmd, stdin: stdin, lines: bufio.NewScanner(stdout)}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	require.True(t, c.lines.Scan(), "the child node did not start")
	require.Equal(t, "ready", c.lines.Text())
	return c
}

// next reads the child's next line, recording hits; it returns false at EOF.
func (c *child) next(t *testing.T) (string, bool) {
	t.Helper()
	if !c.lines.Scan() {
		return "", false
	}
	line := c.lines.Text()
	if ts, ok := strings.CutPrefix(line, "hit "); ok {
		ns, err := strconv.ParseInt(ts, 10, 64)
		require.NoError(t, err)
		c.hits = append(c.hits, time.Unix(0, ns))
	} else if strings.HasPrefix(line, "sync ") {
		c.syncs = append(c.syncs, len(c.hits))
	} else if strings.HasPrefix(line, "error") {
		t.Fatalf("child: %s", line)
	}
	return line, true
}

// redisTotal reads the cluster's count of key in namespace.
func redisTotal(t *testing.T, addr, prefix, namespace, key string, size time.Duration) int64 {
	t.Helper()
	store, err := redis.New(newRedisClient(t, addr), redis.Options{KeyPrefix: prefix})
	require.NoError(t, err)
	n, err := storeTotal(store, namespace, key, size)
	require.NoError(t, err)
	return n
}

func TestCrashKilledNode(t *testing.T) {
	noLeaks(t)
	addr := redisAddr(t)
	kills := 2
	if heavy() {
		kills = 8
	}
	prefix := uniquePrefix(t)
	var lostAll []int64
	for i := range kills {
		namespace := fmt.Sprintf("crash-%d", i)
		c := startChild(t, addr, prefix, namespace)
		// Kill at a random point: after 0.5 s to 1.5 s of traffic, so kills
		// land in every phase of the sync cycle.
		want := crashRate/2 + rand.IntN(crashRate)
		for len(c.hits) < want {
			_, ok := c.next(t)
			require.True(t, ok, "the child died early")
		}
		killAt := time.Now()
		require.NoError(t, c.cmd.Process.Kill()) // SIGKILL
		for {
			if _, ok := c.next(t); !ok {
				break
			}
		}
		_ = c.cmd.Wait()

		admitted := int64(len(c.hits))
		total := redisTotal(t, addr, prefix, namespace, crashKey, crashWindow)
		lost := admitted - total
		// Hits the last completed cycle collected reached Redis: only hits
		// counted after the previous cycle ended may die with the node.
		// (The child notices a completed cycle at its next hit, so up to
		// two hits counted before a mark may also be after that cycle.)
		require.GreaterOrEqual(t, len(c.syncs), 2, "the child completed sync cycles")
		bound := int64(len(c.hits)-c.syncs[len(c.syncs)-2]) + 2
		var recent int64 // hits in the last SyncRate
		for _, h := range c.hits {
			if h.After(killAt.Add(-crashSyncRate)) {
				recent++
			}
		}
		t.Logf("kill %d: admitted %d, in Redis %d, lost %d (counted since the cycle before the last: %d; in the last SyncRate: %d; one SyncRate of traffic: %d)",
			i, admitted, total, lost, bound, recent, int64(crashRate*crashSyncRate.Seconds()))
		assert.LessOrEqual(t, total, admitted+1, "counted more than admitted (one hit may be admitted and not yet reported)")
		assert.LessOrEqual(t, lost, bound, "lost a hit that a completed sync cycle had collected")
		lostAll = append(lostAll, lost)
	}
	logResult(t, "crash/sigkill", fmt.Sprintf("hits lost per kill %v (one SyncRate of traffic = %d)", lostAll, int64(crashRate*crashSyncRate.Seconds())))
}

func TestCrashCloseLiveStoreLosesNone(t *testing.T) {
	noLeaks(t)
	addr := redisAddr(t)
	prefix := uniquePrefix(t)
	c := startChild(t, addr, prefix, "close")
	for len(c.hits) < crashRate/2+rand.IntN(crashRate/2) {
		_, ok := c.next(t)
		require.True(t, ok, "the child died early")
	}
	_, err := io.WriteString(c.stdin, "close\n")
	require.NoError(t, err)
	var last string
	for {
		line, ok := c.next(t)
		if !ok {
			break
		}
		last = line
	}
	require.NoError(t, c.cmd.Wait())
	require.Equal(t, "closed ok", last)
	admitted := int64(len(c.hits))
	total := redisTotal(t, addr, prefix, "close", crashKey, crashWindow)
	t.Logf("Close on a live store: admitted %d, in Redis %d", admitted, total)
	assert.Equal(t, admitted, total)
	logResult(t, "crash/close-live", fmt.Sprintf("admitted %d, in Redis %d", admitted, total))
}

// deadRedis returns the address of a Redis that is not there: "refused"
// (nothing listens) or "blackhole" (connections are accepted and never
// answered).
func deadRedis(t *testing.T, kind string) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	if kind == "refused" {
		require.NoError(t, l.Close())
		return addr
	}
	var mu sync.Mutex
	var conns []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		_ = l.Close()
		<-done
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
	})
	return addr
}

func TestCrashCloseDeadStore(t *testing.T) {
	for _, kind := range []string{"refused", "blackhole"} {
		for _, rate := range []time.Duration{crashSyncRate, 0} {
			t.Run(fmt.Sprintf("%s/SyncRate=%v", kind, rate), func(t *testing.T) {
				noLeaks(t, ignoreRedisRedial)
				addr := deadRedis(t, kind)
				store, err := redis.New(newRedisClient(t, addr), redis.Options{KeyPrefix: uniquePrefix(t)})
				require.NoError(t, err)
				ns, err := ratelimit.NewRegistry().New(ratelimit.Config{Namespace: "dead", WindowSizes: []time.Duration{crashWindow},
					SyncRate: rate, Strategy: store, SyncTimeout: 50 * time.Millisecond})
				require.NoError(t, err)
				// Synchronous mode waits SyncTimeout per hit: a few suffice.
				for range 5 {
					d, err := ns.Allow(context.Background(), crashKey, 1, ratelimit.Limit{Window: crashWindow, Max: 1000})
					require.NoError(t, err)
					require.True(t, d.Allowed)
				}
				deadline := 200 * time.Millisecond
				took, err := closeWithin(ns, deadline)
				t.Logf("Close on a dead store (%s): %v after %v", kind, err, took)
				require.ErrorIs(t, err, ratelimit.ErrStoreUnavailable)
				assert.Less(t, took, deadline+closeSlack, "Close returns by its deadline")
				logResult(t, "crash/close-dead/"+kind+"/"+rate.String(), fmt.Sprintf("returned after %v (deadline %v): %v", took.Round(time.Millisecond), deadline, err))
			})
		}
	}
}
