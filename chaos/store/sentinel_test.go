package store

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit/strategy"
	"github.com/ratesync/ratelimit/strategy/redis"
)

const sentinelMaster = "topo"

// redisSentinel is a primary, a replica and three Sentinels (quorum 2,
// down-after-milliseconds 1 s), all test-owned.
type redisSentinel struct {
	t         *testing.T
	servers   []*redisProc // the primary at the start, then the replica
	sentinels []*redisProc
}

func startSentinel(t *testing.T) *redisSentinel {
	t.Helper()
	needRedisBinaries(t)
	rs := &redisSentinel{t: t}
	primary := startProc(t, "")
	replica := startProc(t, "", "--replicaof", "127.0.0.1", strconv.Itoa(primary.port))
	rs.servers = []*redisProc{primary, replica}
	conf := fmt.Sprintf("sentinel monitor %s 127.0.0.1 %d 2\n"+
		"sentinel down-after-milliseconds %[1]s 1000\n"+
		"sentinel failover-timeout %[1]s 5000\n"+
		"sentinel parallel-syncs %[1]s 1\n", sentinelMaster, primary.port)
	for range 3 {
		rs.sentinels = append(rs.sentinels, startProc(t, conf, "--sentinel"))
	}
	rs.waitHealthy(45 * time.Second)
	return rs
}

// primary returns the server every Sentinel names as the primary, or nil
// while they disagree.
func (rs *redisSentinel) primary() *redisProc {
	var addr string
	for _, s := range rs.sentinels {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		a, err := s.sentinelClient().GetMasterAddrByName(ctx, sentinelMaster).Result()
		cancel()
		if err != nil || len(a) != 2 {
			return nil
		}
		got := net.JoinHostPort(a[0], a[1])
		if addr != "" && got != addr {
			return nil
		}
		addr = got
	}
	for _, p := range rs.servers {
		if p.addr() == addr {
			return p
		}
	}
	return nil
}

func (p *redisProc) sentinelClient() *goredis.SentinelClient {
	c := goredis.NewSentinelClient(&goredis.Options{Addr: p.addr(), MaxRetries: -1, DialTimeout: 200 * time.Millisecond,
		ReadTimeout: time.Second, WriteTimeout: time.Second, ContextTimeoutEnabled: true})
	p.t.Cleanup(func() { _ = c.Close() })
	return c
}

// waitHealthy waits until the Sentinels agree on a primary that is a master
// with its replica in sync, and every Sentinel knows the replica and the
// two other Sentinels.
func (rs *redisSentinel) waitHealthy(d time.Duration) *redisProc {
	rs.t.Helper()
	var p *redisProc
	var why string
	ok := pollUntil(d, func() bool {
		if p = rs.primary(); p == nil {
			why = "Sentinels disagree"
			return false
		}
		if repl := p.info("replication"); repl["role"] != "master" || repl["connected_slaves"] != "1" {
			why = p.addr() + " is not a master with a replica"
			return false
		}
		for _, q := range rs.servers {
			if q != p {
				if repl := q.info("replication"); repl["master_link_status"] != "up" || repl["master_sync_in_progress"] != "0" {
					why = q.addr() + " not in sync"
					return false
				}
			}
		}
		for _, s := range rs.sentinels {
			in := s.info("sentinel")["master0"]
			want := fmt.Sprintf("name=%s,status=ok,address=%s,slaves=1,sentinels=3", sentinelMaster, p.addr())
			if in != want {
				why = s.addr() + ": " + in
				return false
			}
		}
		return true
	})
	require.True(rs.t, ok, "Sentinel setup not healthy after %v: %s", d, why)
	return p
}

// client is a FailoverClient with every timeout and retry option set
// explicitly (go-redis's default of 3 retries).
func (rs *redisSentinel) client() *goredis.Client {
	var addrs []string
	for _, s := range rs.sentinels {
		addrs = append(addrs, s.addr())
	}
	c := goredis.NewFailoverClient(&goredis.FailoverOptions{
		MasterName:            sentinelMaster,
		SentinelAddrs:         addrs,
		MaxRetries:            3,
		MinRetryBackoff:       5 * time.Millisecond,
		MaxRetryBackoff:       100 * time.Millisecond,
		DialTimeout:           500 * time.Millisecond,
		ReadTimeout:           time.Second,
		WriteTimeout:          time.Second,
		PoolTimeout:           time.Second,
		ContextTimeoutEnabled: true,
	})
	rs.t.Cleanup(func() { _ = c.Close() })
	return c
}

// Sentinel failover under traffic: 4 nodes (3 asynchronous, 1 synchronous)
// count hits on 200 keys through FailoverClients while the primary is failed
// over with SENTINEL FAILOVER, or killed with SIGKILL (and restarted empty,
// to become the new primary's replica). Replication being asynchronous, the
// writes the old primary acknowledged and did not pass on are lost; with
// Options.WaitReplicas 1 a push counts only once a replica has it, so none
// is. No hit is counted twice in any case; every node drains within 5
// cycles once the topology is healthy again; no call outlives its bound.
func TestSentinelFailover(t *testing.T) {
	noLeaks(t)
	rounds := pick(2, 1)
	var cases []namedCase
	for _, kill := range []bool{false, true} {
		for _, wait := range []int{0, 1} {
			name := "sentinel-failover"
			if kill {
				name = "sigkill"
			}
			name += "/wait" + strconv.Itoa(wait)
			cases = append(cases, namedCase{name, func(t *testing.T) { runSentinelFailover(t, kill, wait, rounds) }})
		}
	}
	// At once: each case waits about 15 s for the Sentinels to make the old
	// primary a replica (they give it 8 s to change its role by itself).
	concurrently(t, false, cases...)
}

func runSentinelFailover(t *testing.T, kill bool, wait, rounds int) {
	rs := startSentinel(t)
	opts := redis.Options{KeyPrefix: "topo", Shards: 16, WaitReplicas: wait, WaitTimeout: 100 * time.Millisecond}
	var nodes []strategy.Strategy
	for range 4 {
		s, err := redis.New(rs.client(), opts)
		require.NoError(t, err)
		nodes = append(nodes, s)
	}
	direct, err := redis.New(rs.client(), redis.Options{KeyPrefix: "topo", Shards: 16})
	require.NoError(t, err)
	c := newCounting(t, nodes, 1, 200)
	c.run()
	for round := range rounds {
		time.Sleep(time.Second) // traffic before the fault
		old := rs.waitHealthy(45 * time.Second)
		at := time.Now()
		if kill {
			old.kill()
		} else {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			require.NoError(t, rs.sentinels[0].sentinelClient().Failover(ctx, sentinelMaster).Err())
			cancel()
		}
		var promoted *redisProc
		require.True(t, pollUntil(45*time.Second, func() bool {
			promoted = rs.primary()
			return promoted != nil && promoted != old
		}), "no new primary")
		took := time.Since(at)
		if kill {
			require.NoError(t, old.start()) // empty: the Sentinels make it a replica
		}
		rs.waitHealthy(45 * time.Second)
		result(t, "round %d: primary %s failed over to %s in %v, healthy after %v", round, old.addr(), promoted.addr(),
			took.Round(time.Millisecond), time.Since(at).Round(time.Millisecond))
	}
	time.Sleep(time.Second) // traffic after the last fault
	o := c.finish(direct, 20*time.Second)
	result(t, "WaitReplicas %d, %d rounds: %s", wait, rounds, o)
	o.check(t, 5)
	if wait > 0 && !kill {
		// A graceful failover promotes a replica that acknowledged every
		// confirmed push. (After a SIGKILL on a loaded machine the Sentinels
		// may fail back to the restarted, empty primary before it has synced,
		// and no WaitReplicas can keep what that loses; measured, not
		// asserted.)
		require.Zero(t, o.lost, "hits lost with WaitReplicas %d: %s", wait, o)
	}
}
