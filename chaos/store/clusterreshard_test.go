package store

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit/strategy"
	"github.com/ratesync/ratelimit/strategy/redis"
)

// replyCounter is a go-redis hook on every node client of a ClusterClient:
// it counts the error replies the nodes sent, by code (MOVED, ASK,
// TRYAGAIN, NOSCRIPT, ...), before the client follows or retries them.
type replyCounter struct {
	mu     sync.Mutex
	codes  map[string]int
	sample map[string]string // one message per code
}

func (r *replyCounter) note(cmds ...goredis.Cmder) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, c := range cmds {
		var rerr goredis.Error
		// CLIENT SETINFO, which go-redis sends on connect, is unknown to Redis 7.0.
		if err := c.Err(); err != nil && c.Name() != "client" && errors.As(err, &rerr) {
			code, _, _ := strings.Cut(rerr.Error(), " ")
			r.codes[code]++
			if r.sample[code] == "" {
				r.sample[code] = rerr.Error()
			}
		}
	}
}

func (r *replyCounter) DialHook(next goredis.DialHook) goredis.DialHook { return next }
func (r *replyCounter) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		err := next(ctx, cmd)
		r.note(cmd)
		return err
	}
}
func (r *replyCounter) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		err := next(ctx, cmds)
		r.note(cmds...)
		return err
	}
}

func (r *replyCounter) String() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return fmt.Sprint(r.codes, " ", r.sample)
}

// migrateSlot moves slot from src to dst by hand, as redis-cli --cluster
// reshard does, but slowly: a few keys per MIGRATE with a pause between, so
// that traffic meets the slot half moved (ASK for keys gone, TRYAGAIN for a
// script whose keys are split between the nodes).
func migrateSlot(t *testing.T, rc *redisCluster, slot int, src, dst *redisProc, perStep int, pause time.Duration) (moved int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	sc, dc := src.client(), dst.client()
	srcID, err := sc.ClusterMyID(ctx).Result()
	require.NoError(t, err)
	dstID, err := dc.ClusterMyID(ctx).Result()
	require.NoError(t, err)
	s := strconv.Itoa(slot)
	require.NoError(t, dc.Do(ctx, "cluster", "setslot", s, "importing", srcID).Err())
	require.NoError(t, sc.Do(ctx, "cluster", "setslot", s, "migrating", dstID).Err())
	host, port := "127.0.0.1", strconv.Itoa(dst.port)
	for {
		keys, err := sc.ClusterGetKeysInSlot(ctx, slot, perStep).Result()
		require.NoError(t, err)
		if len(keys) == 0 {
			break
		}
		args := []any{"migrate", host, port, "", 0, 5000, "replace", "keys"}
		for _, k := range keys {
			args = append(args, k)
		}
		require.NoError(t, sc.Do(ctx, args...).Err(), "MIGRATE")
		moved += len(keys)
		time.Sleep(pause)
	}
	// The new owner first, then the old one, then every other master, as
	// redis-cli does.
	require.NoError(t, dc.Do(ctx, "cluster", "setslot", s, "node", dstID).Err())
	require.NoError(t, sc.Do(ctx, "cluster", "setslot", s, "node", dstID).Err())
	for _, m := range rc.byRole("master") {
		if m != src && m != dst {
			require.NoError(t, m.client().Do(ctx, "cluster", "setslot", s, "node", dstID).Err())
		}
	}
	return moved
}

// slotOwner returns the master that serves slot, as every master sees it.
func (rc *redisCluster) slotOwner(t *testing.T, slot int) *redisProc {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var owner *redisProc
	for _, m := range rc.byRole("master") {
		shards, err := m.client().ClusterShards(ctx).Result()
		require.NoError(t, err)
		var port int64
		for _, sh := range shards {
			for _, r := range sh.Slots {
				if int64(slot) < r.Start || int64(slot) > r.End {
					continue
				}
				for _, n := range sh.Nodes {
					if n.Role == "master" {
						port = n.Port
					}
				}
			}
		}
		var p *redisProc
		for _, n := range rc.nodes {
			if int64(n.port) == port {
				p = n
			}
		}
		require.NotNil(t, p, "%s: no owner for slot %d", m.addr(), slot)
		require.True(t, owner == nil || owner == p, "the masters disagree on the owner of slot %d", slot)
		owner = p
	}
	return owner
}

// Cluster resharding under traffic: the slots of every hash tag the
// limiter writes (16 shards of one namespace) move to another master, each
// slot a few keys at a time, while 4 nodes (3 asynchronous, 1 synchronous)
// count hits through ClusterClients with go-redis's default retries and
// redirects. Scripts meet MOVED, ASK and TRYAGAIN (their batch-part id is
// a new key, their hash an old one: split between the nodes mid-move). No
// hit is lost or counted twice: resharding loses no acknowledged write. Every
// node drains within 5 cycles; no call outlives its bound.
func TestClusterReshard(t *testing.T) {
	if raceEnabled {
		// go-redis v9.23's ClusterClient reads one command's reply from two
		// goroutines while a pipeline is redirected during a slot migration
		// (osscluster.go pipelineReadCmds): the race detector stops the test
		// on the client library's race, not the limiter's. .ci/run runs this
		// test without -race.
		t.Skip("go-redis races inside ClusterClient pipelines during resharding; run without -race (.ci/run does)")
	}
	noLeaks(t)
	rc := startCluster(t, 3)
	opts := redis.Options{KeyPrefix: "topo", Shards: 16}
	replies := &replyCounter{codes: map[string]int{}, sample: map[string]string{}}
	newClient := func() *goredis.ClusterClient {
		c := rc.client()
		c.OnNewNode(func(n *goredis.Client) { n.AddHook(replies) })
		return c
	}
	var nodes []strategy.Strategy
	for range 4 {
		s, err := redis.New(newClient(), opts)
		require.NoError(t, err)
		nodes = append(nodes, s)
	}
	direct, err := redis.New(rc.client(), opts)
	require.NoError(t, err)

	// The slot of each shard's hash tag.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var slots []int
	for sh := range opts.Shards {
		n, err := rc.nodes[0].client().ClusterKeySlot(ctx, fmt.Sprintf("{topo.%d}", sh)).Result()
		require.NoError(t, err)
		slots = append(slots, int(n))
	}

	c := newCounting(t, nodes, 1, 200)
	c.run()
	time.Sleep(time.Second) // traffic before: every slot holds keys
	rounds := pick(2, 1)
	var keysMoved int
	start := time.Now()
	for range rounds {
		masters := rc.byRole("master")
		for _, slot := range slots {
			src := rc.slotOwner(t, slot)
			var dst *redisProc
			for i, m := range masters {
				if m == src {
					dst = masters[(i+1)%len(masters)]
				}
			}
			require.NotNil(t, dst)
			keysMoved += migrateSlot(t, rc, slot, src, dst, 20, 10*time.Millisecond)
		}
	}
	took := time.Since(start)
	time.Sleep(time.Second) // traffic after
	o := c.finish(direct, 20*time.Second)
	result(t, "%d rounds of moving %d slots (%d keys, %v): %s; error replies from the nodes: %s",
		rounds, len(slots), keysMoved, took.Round(time.Millisecond), o, replies)
	o.check(t, 5)
	require.Zero(t, o.lost, "resharding lost hits: %s", o)
}
