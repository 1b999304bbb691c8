package store

import (
	"context"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// redisCluster is a Redis Cluster of test-owned servers: masters with one
// replica each, a cluster-node-timeout of 1 s so that a dead master's
// replica is promoted within about 2 s.
type redisCluster struct {
	t     *testing.T
	nodes []*redisProc
}

// startCluster starts 2×masters servers and joins them with redis-cli
// --cluster create (one replica per master), then waits until every node
// says the cluster is ok and every replica is in sync.
func startCluster(t *testing.T, masters int) *redisCluster {
	t.Helper()
	needRedisBinaries(t)
	rc := &redisCluster{t: t}
	args := []string{"--cluster", "create"}
	for range 2 * masters {
		p := startProc(t, "", "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", "1000")
		rc.nodes = append(rc.nodes, p)
		args = append(args, p.addr())
	}
	args = append(args, "--cluster-replicas", "1", "--cluster-yes")
	out, err := redisCLI(t, 30*time.Second, args...)
	require.NoError(t, err, "redis-cli --cluster create: %s", out)
	rc.waitHealthy(masters, 45*time.Second)
	return rc
}

// waitHealthy waits until every running node reports cluster_state:ok and
// there are masters masters, each with a replica whose link is up.
func (rc *redisCluster) waitHealthy(masters int, d time.Duration) {
	rc.t.Helper()
	var why string
	ok := pollUntil(d, func() bool {
		ms := 0
		for _, p := range rc.nodes {
			if p.cmd == nil {
				continue
			}
			ci := p.clusterInfo()
			if ci["cluster_state"] != "ok" {
				why = p.addr() + " cluster_state " + ci["cluster_state"]
				return false
			}
			repl := p.info("replication")
			switch repl["role"] {
			case "master":
				if repl["connected_slaves"] != "1" {
					why = p.addr() + " master without a replica"
					return false
				}
				ms++
			case "slave":
				if repl["master_link_status"] != "up" || repl["master_sync_in_progress"] != "0" {
					why = p.addr() + " replica not in sync"
					return false
				}
			default:
				why = p.addr() + " no role"
				return false
			}
		}
		if ms != masters {
			why = "masters: " + strings.Repeat("x", ms)
			return false
		}
		return true
	})
	require.True(rc.t, ok, "cluster not healthy after %v: %s", d, why)
}

// clusterInfo returns CLUSTER INFO's fields.
func (p *redisProc) clusterInfo() map[string]string {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	c := goredis.NewClient(&goredis.Options{Addr: p.addr(), MaxRetries: -1, DialTimeout: 200 * time.Millisecond,
		ReadTimeout: time.Second, WriteTimeout: time.Second, ContextTimeoutEnabled: true})
	defer c.Close()
	s, err := c.ClusterInfo(ctx).Result()
	if err != nil {
		return nil
	}
	return parseInfo(s)
}

// role returns "master" or "slave" (empty when the node does not answer).
func (p *redisProc) role() string { return p.info("replication")["role"] }

// byRole returns the running nodes that have the role.
func (rc *redisCluster) byRole(role string) []*redisProc {
	var out []*redisProc
	for _, p := range rc.nodes {
		if p.cmd != nil && p.role() == role {
			out = append(out, p)
		}
	}
	return out
}

// replicaOf returns the replica of master m.
func (rc *redisCluster) replicaOf(m *redisProc) *redisProc {
	rc.t.Helper()
	for _, p := range rc.byRole("slave") {
		repl := p.info("replication")
		if repl["master_port"] == m.addr()[strings.LastIndexByte(m.addr(), ':')+1:] {
			return p
		}
	}
	rc.t.Fatalf("no replica of %s", m.addr())
	return nil
}

func (rc *redisCluster) addrs() []string {
	var out []string
	for _, p := range rc.nodes {
		out = append(out, p.addr())
	}
	return out
}

// clusterOptions sets every timeout and retry option explicitly: go-redis's
// defaults for retries and redirects (3 each), short timeouts, and
// ContextTimeoutEnabled as the strategy requires.
func clusterOptions(addrs []string) *goredis.ClusterOptions {
	return &goredis.ClusterOptions{
		Addrs:                 addrs,
		MaxRedirects:          3,
		MaxRetries:            3,
		MinRetryBackoff:       5 * time.Millisecond,
		MaxRetryBackoff:       100 * time.Millisecond,
		DialTimeout:           500 * time.Millisecond,
		ReadTimeout:           time.Second,
		WriteTimeout:          time.Second,
		PoolTimeout:           time.Second,
		ContextTimeoutEnabled: true,
	}
}

func (rc *redisCluster) client() *goredis.ClusterClient {
	c := goredis.NewClusterClient(clusterOptions(rc.addrs()))
	rc.t.Cleanup(func() { _ = c.Close() })
	return c
}
