package store

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit/internal/faultproxy"
	"github.com/ratesync/ratelimit/strategy"
	"github.com/ratesync/ratelimit/strategy/redis"
)

// usedMemory returns the server's used_memory in bytes.
func usedMemory(t *testing.T, p *redisProc) int64 {
	t.Helper()
	n, err := strconv.ParseInt(p.info("memory")["used_memory"], 10, 64)
	require.NoError(t, err)
	return n
}

func configSet(t *testing.T, c *goredis.Client, key, value string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	require.NoError(t, c.ConfigSet(ctx, key, value).Err())
}

// syncErrors returns the failed cycles of every node.
func (c *counting) syncErrors() (n int64) {
	for _, nd := range c.nodes {
		n += nd.ns.Stats().SyncErrors
	}
	return n
}

// Redis out of memory with maxmemory-policy noeviction: every push is
// refused with OOM (the script's first write, its batch-part id, is refused,
// so nothing of it is written). Twice while 4 nodes (3 asynchronous, 1
// synchronous) count on 200 keys: filler keys bring memory to maxmemory and
// are then deleted; then maxmemory is set below the memory in use and raised
// again. The nodes keep every hit through the refusals and push them once
// Redis accepts writes again: the store ends with exactly the hits counted,
// and every node drains within 5 cycles.
func TestMaxmemoryNoEviction(t *testing.T) {
	noLeaks(t)
	needRedisBinaries(t)
	srv := startProc(t, "", "--maxmemory-policy", "noeviction")
	opts := redis.Options{KeyPrefix: "topo", Shards: 16}
	var nodes []strategy.Strategy
	for range 4 {
		s, err := redis.New(srv.client(), opts)
		require.NoError(t, err)
		nodes = append(nodes, s)
	}
	admin := srv.client()
	direct, err := redis.New(admin, opts)
	require.NoError(t, err)
	c := newCounting(t, nodes, 1, 200)
	c.run()
	hold := pick(5*time.Second, time.Second)
	ctx := context.Background()

	// refused waits until every asynchronous node has failed a cycle since
	// errs0, then lets the refusals go on for hold.
	refused := func(what string, errs0 int64) {
		t.Helper()
		require.True(t, pollUntil(10*time.Second, func() bool { return c.syncErrors()-errs0 >= 3 }),
			"%s: the nodes' pushes were not refused", what)
		time.Sleep(hold)
		result(t, "%s: %d failed cycles, %d hits pending", what, c.syncErrors()-errs0, c.pending())
	}

	time.Sleep(time.Second) // traffic before
	// 1. Filler keys reach maxmemory; then they are deleted.
	configSet(t, admin, "maxmemory", strconv.FormatInt(usedMemory(t, srv)+2<<20, 10))
	errs0 := c.syncErrors()
	value := strings.Repeat("x", 64<<10)
	var fillers []string
	for i := 0; ; i++ {
		require.Less(t, i, 1000, "maxmemory never reached")
		k := "filler:" + strconv.Itoa(i)
		err := admin.Set(ctx, k, value, 0).Err()
		if err != nil {
			require.True(t, goredis.HasErrorPrefix(err, "OOM"), "SET: %v", err)
			break
		}
		fillers = append(fillers, k)
	}
	refused("fillers", errs0)
	require.NoError(t, admin.Del(ctx, fillers...).Err())

	// 2. maxmemory below the memory in use, then raised.
	time.Sleep(time.Second)
	errs0 = c.syncErrors()
	configSet(t, admin, "maxmemory", "1")
	refused("maxmemory 1", errs0)
	configSet(t, admin, "maxmemory", "0")

	time.Sleep(time.Second) // traffic after
	o := c.finish(direct, 20*time.Second)
	result(t, "%s", o)
	o.check(t, 5)
	require.Equal(t, o.counted, o.stored, "hits lost through OOM refusals: %s", o)
}

// Redis evicting keys under memory pressure (allkeys-lru, volatile-lru):
// filler keys without a TTL are written without pause into a Redis whose
// maxmemory is a few MB above the limiter's data, while 4 nodes (3
// asynchronous, 1 synchronous) count on 200 keys through a proxy. Redis
// evicts the limiter's counters (hits lost) and its batch-part ids. Several
// times, the reply of an applied push is lost and the proxy black-holes for
// 700 ms, so the push is re-sent after its id may have been evicted: it is
// then applied twice. Eviction breaks both promises (no hit lost, none
// counted twice), which is why the strategy's documentation asks for
// noeviction (or a Redis of the limiter's own); the test measures how much,
// and checks that no node is stuck and no call outlives its bound.
func TestMaxmemoryEviction(t *testing.T) {
	noLeaks(t)
	needRedisBinaries(t)
	var cases []namedCase
	for _, policy := range []string{"allkeys-lru", "volatile-lru"} {
		cases = append(cases, namedCase{policy, func(t *testing.T) { runEviction(t, policy) }})
	}
	concurrently(t, false, cases...)
}

func runEviction(t *testing.T, policy string) {
	srv := startProc(t, "", "--maxmemory-policy", policy)
	px := newProxy(t, srv.addr())
	opts := redis.Options{KeyPrefix: "topo", Shards: 16}
	var nodes []strategy.Strategy
	for range 4 {
		cl := goredis.NewClient(redisOptions(px.Addr()))
		t.Cleanup(func() { _ = cl.Close() })
		s, err := redis.New(cl, opts)
		require.NoError(t, err)
		nodes = append(nodes, s)
	}
	admin := srv.client()
	direct, err := redis.New(admin, opts)
	require.NoError(t, err)
	c := newCounting(t, nodes, 1, 200)
	c.run()
	time.Sleep(time.Second) // traffic before
	configSet(t, admin, "maxmemory", strconv.FormatInt(usedMemory(t, srv)+4<<20, 10))

	// Fillers: 16 KB each, written without pause, never read again.
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		ctx := context.Background()
		value := strings.Repeat("f", 16<<10)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			_ = admin.Set(ctx, "filler:"+strconv.Itoa(i), value, 0).Err() // OOM once nothing is left to evict
			if i%8 == 0 {
				time.Sleep(time.Millisecond)
			}
		}
	}()

	episodes := pick(10, 4)
	var cuts, parts, evictedParts int
	var twice int64
	for range episodes {
		time.Sleep(500 * time.Millisecond)
		var happened bool
		cut := make(chan struct{})
		var sent []scriptPart
		// The reply of the next applied script call (or pipeline of them)
		// is lost, and the proxy black-holes at that moment: go-redis's
		// retries time out, and the node re-sends the push in a later
		// cycle, after its ids may have been evicted.
		px.Arm(faultproxy.Cut{
			Match: func(chunk []byte) bool {
				if !isScriptCall(chunk) {
					return false
				}
				sent = scriptParts(chunk)
				return true
			},
			ReplyDone: func([]byte) bool {
				px.SetMode(faultproxy.BlackHole)
				close(cut)
				return true
			}})
		select {
		case <-cut:
			happened = true
		case <-time.After(5 * time.Second):
			px.Disarm()
		}
		if happened {
			cuts++
			time.Sleep(700 * time.Millisecond)
			// Before the re-send: a part whose id is gone will be applied
			// again.
			for _, p := range sent {
				parts++
				n, err := admin.Exists(context.Background(), p.id).Result()
				require.NoError(t, err)
				if n == 0 {
					evictedParts++
					twice += p.hits
				}
			}
		}
		px.SetMode(faultproxy.Forward)
	}
	close(stop)
	<-done
	evicted := srv.info("stats")["evicted_keys"]
	configSet(t, admin, "maxmemory", "0") // no more eviction while the nodes drain
	time.Sleep(time.Second)
	o := c.finish(direct, 20*time.Second)
	result(t, "%s, %d lost replies each followed by a 700 ms black hole; %s keys evicted; %d of the %d parts re-sent had lost their id, so %d hits were applied twice: %s",
		policy, cuts, evicted, evictedParts, parts, twice, o)
	require.NotEqual(t, "0", evicted, "nothing was evicted")
	require.Positive(t, cuts, "no reply was lost")
	require.True(t, o.drained, "pending hits did not drain: %s", o)
	for i, n := range o.cycles {
		require.LessOrEqual(t, n, int64(5), "node %d needed %d cycles to drain", i, n)
	}
	o.checkBounded(t)
}

// scriptPart is a push script call seen on the wire: its batch-part id key
// and the sum of its diffs.
type scriptPart struct {
	id   string
	hits int64
}

// scriptParts parses the EVALSHA/EVAL commands of a chunk a client wrote
// (RESP arrays of bulk strings) and returns each call's batch-part id and the
// sum of its deltas (see the push script's arguments in strategy/redis).
func scriptParts(chunk []byte) []scriptPart {
	var out []scriptPart
	for len(chunk) > 0 {
		args, rest, ok := parseRESPArray(chunk)
		if !ok {
			break
		}
		chunk = rest
		if len(args) < 5 {
			continue
		}
		if name := strings.ToLower(args[0]); name != "evalsha" && name != "eval" {
			continue
		}
		nkeys, _ := strconv.Atoi(args[2])
		p := scriptPart{id: args[3]}
		a := 3 + nkeys + 2 // ARGV[3]: the first window's ttl
		for w := 1; w < nkeys && a+2 < len(args); w++ {
			nd, _ := strconv.Atoi(args[a+1])
			nr, _ := strconv.Atoi(args[a+2])
			a += 3
			for i := 0; i < nd && a+1 < len(args); i++ {
				d, _ := strconv.ParseInt(args[a+1], 10, 64)
				p.hits += d
				a += 2
			}
			a += nr
		}
		out = append(out, p)
	}
	return out
}

// parseRESPArray parses one "*n\r\n" array of "$len\r\n...\r\n" bulk strings.
func parseRESPArray(b []byte) (args []string, rest []byte, ok bool) {
	line := func() (string, bool) {
		i := strings.Index(string(b), "\r\n")
		if i < 0 {
			return "", false
		}
		l := string(b[:i])
		b = b[i+2:]
		return l, true
	}
	l, ok := line()
	if !ok || len(l) < 2 || l[0] != '*' {
		return nil, nil, false
	}
	n, err := strconv.Atoi(l[1:])
	if err != nil {
		return nil, nil, false
	}
	for range n {
		l, ok := line()
		if !ok || len(l) < 2 || l[0] != '$' {
			return nil, nil, false
		}
		size, err := strconv.Atoi(l[1:])
		if err != nil || len(b) < size+2 {
			return nil, nil, false
		}
		args = append(args, string(b[:size]))
		b = b[size+2:]
	}
	return args, b, true
}
