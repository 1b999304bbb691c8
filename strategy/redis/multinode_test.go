package redis

import (
	"context"
	"fmt"
	"iter"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit"
	"github.com/ratesync/ratelimit/internal/faultproxy"
	"github.com/ratesync/ratelimit/strategy"
)

// ack is a push the store acknowledged: when, and how many hits it carried.
type ack struct {
	at   time.Time
	hits int64
}

// recorder wraps a Store to log acknowledged pushes and signal failed ones.
type recorder struct {
	strategy.Strategy
	mu       sync.Mutex
	acks     []ack
	failures int
	failed   chan struct{} // gets a value (if there is room) on each failed push
	acked    chan struct{} // gets a value (if there is room) on each acknowledged push
	fetchAll atomic.Int64  // GetCounters calls for the whole namespace
}

func (r *recorder) GetCounters(ctx context.Context, q strategy.Query) iter.Seq2[strategy.Counter, error] {
	if q.Keys == nil {
		r.fetchAll.Add(1)
	}
	return r.Strategy.GetCounters(ctx, q)
}

// signal sends on ch without blocking; ch has room for one value.
func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// wait receives n values from ch, failing t after a generous deadline.
func wait(t *testing.T, ch <-chan struct{}, n int, what string) bool {
	timeout := time.After(30 * time.Second)
	for range n {
		select {
		case <-ch:
		case <-timeout:
			t.Errorf("timed out waiting for %s", what)
			return false
		}
	}
	return true
}

func (r *recorder) PushDiffs(ctx context.Context, b *strategy.Batch) (strategy.Result, error) {
	res, err := r.Strategy.PushDiffs(ctx, b)
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	if err != nil {
		r.failures++
		signal(r.failed)
		return res, err
	}
	var hits int64
	for _, d := range b.Diffs {
		hits += d.Delta
	}
	r.acks = append(r.acks, ack{now, hits})
	signal(r.acked)
	return res, nil
}

// ackedBetween sums the hits of pushes acknowledged in [from, to].
func (r *recorder) ackedBetween(from, to time.Time) int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	var n int64
	for _, a := range r.acks {
		if !a.at.Before(from) && !a.at.After(to) {
			n += a.hits
		}
	}
	return n
}

type multiNode struct {
	t      *testing.T
	prefix string
	clock  func() time.Time
	nodes  []*ratelimit.Namespace
	regs   []*ratelimit.Registry
	recs   []*recorder
	keys   []string
	hits   map[string]int64
}

const (
	multiWindow = time.Hour
	multiNS     = "multi"
)

// multiOptions vary the nodes of a multi-node test.
type multiOptions struct {
	scope ratelimit.FetchScope
	store Options // KeyPrefix is set by newMultiNode
}

// newMultiNode starts one registry per client, all sharing counters through
// Redis (one Store per client, one key prefix), syncing every 50 ms. Their
// clock starts a minute into an hour window, so the test never crosses a
// window boundary and the sliding rate is the current window's count.
func newMultiNode(t *testing.T, clients []goredis.UniversalClient, opts multiOptions) *multiNode {
	start := time.Now()
	origin := time.UnixMilli(strategy.WindowStart(start.UnixMilli(), multiWindow)).Add(time.Minute)
	m := &multiNode{
		t:      t,
		prefix: uniquePrefix(t),
		clock:  func() time.Time { return origin.Add(time.Since(start)) },
		hits:   map[string]int64{},
	}
	for i := range 20 {
		m.keys = append(m.keys, fmt.Sprintf("client-%d", i))
	}
	for _, c := range clients {
		so := opts.store
		so.KeyPrefix = m.prefix
		s := newStore(t, c, so)
		rec := &recorder{Strategy: s, failed: make(chan struct{}, 1), acked: make(chan struct{}, 1)}
		reg := ratelimit.NewRegistry()
		ns, err := reg.New(ratelimit.Config{
			Namespace:   multiNS,
			WindowSizes: []time.Duration{multiWindow},
			SyncRate:    50 * time.Millisecond,
			Strategy:    rec,
			Clock:       m.clock,
			SyncTimeout: 2 * time.Second,
			MaxBackoff:  200 * time.Millisecond,
			FetchScope:  opts.scope,
		})
		require.NoError(t, err)
		m.regs, m.nodes, m.recs = append(m.regs, reg), append(m.nodes, ns), append(m.recs, rec)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		for _, reg := range m.regs {
			require.NoError(t, reg.Close(ctx))
		}
	})
	return m
}

// hitUntil sends hits round-robin over the nodes and keys, 30 hits every
// 2 ms, until done is closed and then for ten more sync periods.
func (m *multiNode) hitUntil(done <-chan struct{}) {
	ctx := context.Background()
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	j, extra := 0, -1
	for extra != 0 {
		<-tick.C
		if extra < 0 {
			select {
			case <-done:
				extra = 250 // ticks: ten 50 ms sync periods
			default:
			}
		} else {
			extra--
		}
		for range 30 {
			key := m.keys[j%len(m.keys)]
			_, err := m.nodes[j%len(m.nodes)].Increment(ctx, key, multiWindow, 1)
			require.NoError(m.t, err)
			m.hits[key]++
			j++
		}
	}
}

// settle runs a final Sync on every node (retrying while the store recovers)
// and a Fetch, and returns what Redis holds per key, after checking that
// every node reports exactly that.
func (m *multiNode) settle(store *Store) map[string]int64 {
	t := m.t
	ctx := context.Background()
	deadline := time.Now().Add(60 * time.Second) // after a failover, until a replica follows again
	for _, ns := range m.nodes {
		for {
			err := ns.Sync(ctx)
			if err == nil {
				break
			}
			require.True(t, time.Now().Before(deadline), "final sync keeps failing: %v", err)
		}
	}
	for _, ns := range m.nodes {
		for _, k := range m.keys {
			_, err := ns.SlidingWindow(ctx, k, multiWindow) // every key is seen by every node
			require.NoError(t, err)
		}
		require.NoError(t, ns.Fetch(ctx, m.clock()))
	}
	stored := map[string]int64{}
	for _, k := range m.keys {
		n, err := store.GetWindow(ctx, multiNS, strategy.CounterID{Key: k, Size: multiWindow,
			Start: strategy.WindowStart(m.clock().UnixMilli(), multiWindow)})
		require.NoError(t, err)
		stored[k] = n
		for i, ns := range m.nodes {
			rate, err := ns.SlidingWindow(ctx, k, multiWindow)
			require.NoError(t, err)
			require.Equal(t, float64(n), rate, "node %d, key %s", i, k)
		}
	}
	return stored
}

func (m *multiNode) total(counts map[string]int64) int64 {
	var n int64
	for _, k := range m.keys {
		n += counts[k]
	}
	return n
}

// testMultiNode: three nodes with separate clients, round-robin hits; after a
// final sync and fetch every node reports the exact totals.
func testMultiNode(t *testing.T, newClient func() goredis.UniversalClient, directClient goredis.UniversalClient, scope ratelimit.FetchScope) {
	clients := []goredis.UniversalClient{newClient(), newClient(), newClient()}
	m := newMultiNode(t, clients, multiOptions{scope: scope})
	done := make(chan struct{})
	close(done)
	m.hitUntil(done)
	stored := m.settle(newStore(t, directClient, Options{KeyPrefix: m.prefix}))
	require.Equal(t, m.hits, stored)
	for i, ns := range m.nodes {
		require.GreaterOrEqual(t, ns.Stats().Syncs, int64(5), "node %d synced in the background", i)
		if scope == ratelimit.FetchAll {
			require.Positive(t, m.recs[i].fetchAll.Load(), "node %d read the whole namespace", i)
		}
	}
	t.Logf("%d hits over %d keys on %d nodes, totals exact", m.total(m.hits), len(m.keys), len(m.nodes))
}

func TestMultiNodeRedis(t *testing.T) {
	noLeaks(t)
	addr := realAddr(t)
	testMultiNode(t, func() goredis.UniversalClient { return newClient(t, addr) }, realClient(t), ratelimit.FetchSeen)
}

// The same with FetchAll: every node reads the whole namespace (HGETALL of
// every shard of the current and previous window).
func TestMultiNodeFetchAll(t *testing.T) {
	noLeaks(t)
	addr := realAddr(t)
	testMultiNode(t, func() goredis.UniversalClient { return newClient(t, addr) }, realClient(t), ratelimit.FetchAll)
}

func TestMultiNodeCluster(t *testing.T) {
	noLeaks(t)
	direct := clusterClient(t)
	testMultiNode(t, func() goredis.UniversalClient { return clusterClient(t) }, direct, ratelimit.FetchSeen)
}

func TestMultiNodeSentinel(t *testing.T) {
	noLeaks(t)
	direct := sentinelClient(t)
	testMultiNode(t, func() goredis.UniversalClient { return sentinelClient(t) }, direct, ratelimit.FetchSeen)
}

// A Sentinel failover under load. Replication is asynchronous, so Redis
// itself may drop writes it acknowledged: those the old primary took after
// the replica stopped following it (SLAVEOF NO ONE) and before Sentinel
// turned it into a replica of the new primary, which discards them when it
// resyncs. Clients keep writing to the old primary until they hear
// +switch-master, and Sentinel converts it only about 10 s later. Such writes
// were acknowledged during the failover, so the loss is bounded by the hits of
// pushes acknowledged from shortly (0.5 s) before SENTINEL FAILOVER was sent
// until the old primary became a replica. The store must lose no more than that, and
// never count a hit twice: retries and re-sends of pushes whose reply was lost
// in the switch are deduplicated by their batch-part ids.
func TestMultiNodeSentinelFailover(t *testing.T) {
	run := failover(t, 0)
	require.LessOrEqual(t, run.total, run.hits, "no hit counted twice")
	require.GreaterOrEqual(t, run.total, run.hits-run.inFlight, "lost no more than Redis dropped")
}

// With Options.WaitReplicas 1 a push counts as done only once the replica
// has it, so the failover loses nothing: pushes the old primary took but did
// not replicate were never acknowledged, and are re-sent to the new primary.
func TestMultiNodeSentinelFailoverWaitReplicas(t *testing.T) {
	run := failover(t, 1)
	require.Equal(t, run.hits, run.total, "no hit lost, none counted twice")
}

type failoverRun struct{ hits, total, inFlight int64 }

// failover runs three nodes through a Sentinel failover under load and
// checks that every node agrees with the store afterwards.
func failover(t *testing.T, waitReplicas int) failoverRun {
	noLeaks(t)
	_, master := sentinelConfig(t)
	direct := sentinelClient(t)
	ctx := context.Background()
	sentinel := sentinelFor(t)
	waitFailoverReady(t, sentinel, master)

	clients := []goredis.UniversalClient{sentinelClient(t), sentinelClient(t), sentinelClient(t)}
	m := newMultiNode(t, clients, multiOptions{store: Options{WaitReplicas: waitReplicas}})
	done := make(chan struct{})
	var t0, t1 time.Time
	var oldPrimary, newPrimary string
	go func() {
		defer close(done)
		// Let the nodes sync a few times first.
		if !wait(t, m.recs[0].acked, 3, "pushes before the failover") {
			return
		}
		a, err := sentinel.GetMasterAddrByName(ctx, master).Result()
		if err != nil {
			t.Errorf("SENTINEL GET-MASTER-ADDR-BY-NAME: %v", err)
			return
		}
		oldPrimary = a[0] + ":" + a[1]
		t0 = time.Now()
		if err := sentinel.Failover(ctx, master).Err(); err != nil {
			t.Errorf("SENTINEL FAILOVER: %v", err)
			return
		}
		newPrimary, t1 = waitFailedOver(t, sentinel, master, oldPrimary)
	}()
	m.hitUntil(done)
	require.False(t, t.Failed())
	stored := m.settle(newStore(t, direct, Options{KeyPrefix: m.prefix}))

	hits, total := m.total(m.hits), m.total(stored)
	var inFlight int64
	for _, r := range m.recs {
		// From shortly before the failover (replication lag) until the old
		// primary refused writes.
		inFlight += r.ackedBetween(t0.Add(-500*time.Millisecond), t1)
	}
	t.Logf("WaitReplicas %d: failover %s -> %s took %v; %d hits, %d stored, %d lost; %d hits acknowledged during the failover",
		waitReplicas, oldPrimary, newPrimary, t1.Sub(t0).Round(time.Millisecond), hits, total, hits-total, inFlight)
	for _, k := range m.keys {
		require.LessOrEqual(t, stored[k], m.hits[k], k)
	}
	return failoverRun{hits, total, inFlight}
}

// sentinelFor returns a client to the Sentinel itself, or skips (or fails) t.
func sentinelFor(t *testing.T) *goredis.SentinelClient {
	addr, _ := sentinelConfig(t)
	s := goredis.NewSentinelClient(clientOptions(addr))
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// waitFailoverReady polls until the primary has a replica in sync, so that
// SENTINEL FAILOVER has a replica to promote (a previous failover may still
// be settling).
func waitFailoverReady(t *testing.T, s *goredis.SentinelClient, master string) {
	ctx := context.Background()
	deadline := time.Now().Add(30 * time.Second)
	for {
		replicas, err := s.Replicas(ctx, master).Result()
		if err == nil && len(replicas) > 0 && replicas[0]["flags"] == "slave" && replicas[0]["master-link-status"] == "ok" {
			r := goredis.NewClient(clientOptions(replicas[0]["ip"] + ":" + replicas[0]["port"]))
			info, err := r.Info(ctx, "replication").Result()
			_ = r.Close()
			if err == nil && strings.Contains(info, "master_link_status:up") {
				return
			}
		}
		require.True(t, time.Now().Before(deadline), "no replica ready for a failover: %v %v", replicas, err)
		time.Sleep(100 * time.Millisecond)
	}
}

// waitFailedOver polls until Sentinel names a new primary and the old one has
// been turned into a replica (from then on it refuses writes); it returns the
// new primary and that instant.
func waitFailedOver(t *testing.T, s *goredis.SentinelClient, master, old string) (string, time.Time) {
	ctx := context.Background()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		a, err := s.GetMasterAddrByName(ctx, master).Result()
		if err == nil && a[0]+":"+a[1] != old {
			r := goredis.NewClient(clientOptions(old))
			info, err := r.Info(ctx, "replication").Result()
			_ = r.Close()
			if err == nil && strings.Contains(info, "role:slave") {
				return a[0] + ":" + a[1], time.Now()
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Errorf("failover did not complete")
	return "", time.Now()
}

// A Redis outage of several sync cycles (every connection cut, new ones
// closed at once) loses no hit and counts none twice.
func TestMultiNodeOutage(t *testing.T) {
	noLeaks(t)
	target := realAddr(t)
	proxy := newProxy(t, target)
	clients := []goredis.UniversalClient{newClient(t, proxy.Addr()), newClient(t, proxy.Addr()), newClient(t, proxy.Addr())}
	m := newMultiNode(t, clients, multiOptions{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		if !wait(t, m.recs[0].acked, 3, "pushes before the outage") {
			return
		}
		// Every connection cut, new ones reset as soon as they are accepted.
		proxy.SetMode(faultproxy.Refuse)
		proxy.DropAll()
		defer proxy.SetMode(faultproxy.Forward)
		// Several failed cycles on every node.
		for i, r := range m.recs {
			if !wait(t, r.failed, 3, fmt.Sprintf("failed pushes of node %d", i)) {
				return
			}
		}
	}()
	m.hitUntil(done)
	stored := m.settle(newStore(t, realClient(t), Options{KeyPrefix: m.prefix}))
	require.Equal(t, m.hits, stored)
	fails := 0
	for _, r := range m.recs {
		fails += r.failures
	}
	t.Logf("%d hits, %d failed pushes during the outage, totals exact", m.total(m.hits), fails)
}
