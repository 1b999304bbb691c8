// Package storetest is the contract test suite of policy.Store
// implementations: several watchers (nodes) follow published updates and
// rollbacks, a lost notification is healed by polling, and a bad document
// never replaces a good one.
package storetest

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/ratesync/ratelimit/policy"
)

// Env is a store under test.
type Env struct {
	// Store is the store every node watches.
	Store policy.Store
	// NewNodeStore returns a store handle for one more node (its own
	// connection); nil means every node uses Store.
	NewNodeStore func(t *testing.T) policy.Store
	// AppendQuietly appends doc as the current version without notifying
	// the watchers: a lost notification.
	AppendQuietly func(t *testing.T, doc []byte) int64
}

// SkipOrFail skips a test that needs the server named by env, or fails it
// when RATELIMIT_TEST_REQUIRE_SERVICES=1.
func SkipOrFail(t testing.TB, env string) {
	t.Helper()
	if os.Getenv("RATELIMIT_TEST_REQUIRE_SERVICES") == "1" {
		t.Fatalf("%s is not set and RATELIMIT_TEST_REQUIRE_SERVICES=1", env)
	}
	t.Skipf("%s is not set", env)
}

// Deadline is how long a node may take to follow a change.
const Deadline = 2 * time.Second

// Doc returns a valid document whose default limit is max per minute.
func Doc(max int) []byte {
	return fmt.Appendf(nil, "default: {limits: [{window: 1m, max: %d}]}\n", max)
}

type node struct {
	w        *policy.Watcher
	installs chan int64
	rejects  chan int64
}

func startNodes(t *testing.T, env Env, n int, poll time.Duration) []*node {
	t.Helper()
	var nodes []*node
	for range n {
		st := env.Store
		if env.NewNodeStore != nil {
			st = env.NewNodeStore(t)
		}
		nd := &node{installs: make(chan int64, 1024), rejects: make(chan int64, 1024)}
		w, err := policy.NewWatcher(context.Background(), st, policy.WatchOptions{
			PollInterval: poll,
			Logger:       slog.New(slog.NewTextHandler(io.Discard, nil)),
			OnInstall:    func(s *policy.Snapshot) { nd.installs <- s.Version() },
			OnReject:     func(v int64, _ error) { nd.rejects <- v },
		})
		require.NoError(t, err)
		t.Cleanup(func() { _ = w.Close() })
		nd.w = w
		nodes = append(nodes, nd)
	}
	return nodes
}

// await waits until every node reported version v on ch(node), or fails
// after Deadline.
func await(t *testing.T, nodes []*node, v int64, ch func(*node) chan int64, what string) {
	t.Helper()
	awaitWithin(t, Deadline, nodes, v, ch, what)
}

func awaitWithin(t *testing.T, deadline time.Duration, nodes []*node, v int64, ch func(*node) chan int64, what string) {
	t.Helper()
	timeout := time.NewTimer(deadline)
	defer timeout.Stop()
	for i, nd := range nodes {
		for {
			select {
			case got := <-ch(nd):
				if got != v {
					continue
				}
			case <-timeout.C:
				t.Fatalf("node %d did not %s version %d within %v (stats %+v)", i, what, v, deadline, nd.w.Stats())
			}
			break
		}
	}
}

// Run runs the suite. newEnv returns a fresh, empty store.
func Run(t *testing.T, newEnv func(t *testing.T) Env) {
	t.Run("Follow", func(t *testing.T) { testFollow(t, newEnv(t)) })
	t.Run("BadDocument", func(t *testing.T) { testBad(t, newEnv(t)) })
	t.Run("LostNotification", func(t *testing.T) { testLost(t, newEnv(t)) })
	t.Run("BigPolicy", func(t *testing.T) { testBig(t, newEnv(t)) })
}

// BigDoc returns a policy of 1,000 rules (half on routes, half on tiers)
// and 100,000 per-key overrides, rendered in YAML by yaml.v3 (8.6 MB); max
// is the default limit.
func BigDoc(max int) []byte {
	return bytes.Replace(bigDoc(), []byte("max: 1\n"), fmt.Appendf(nil, "max: %d\n", max), 1)
}

// bigDoc is BigDoc(1), rendered once: yaml.v3 takes seconds.
var bigDoc = sync.OnceValue(func() []byte {
	lim := func(n int) []policy.Limit {
		return []policy.Limit{{Window: policy.Duration(time.Minute), Max: int64(n)}}
	}
	doc := &policy.Document{Default: &policy.Target{Limits: lim(1)}, Overrides: map[string]policy.Target{}}
	for i := range 1000 {
		r := policy.Rule{ID: fmt.Sprintf("r%d", i), Limits: lim(10 + i), Match: policy.Match{Route: fmt.Sprintf("GET /api/v1/r%d", i/2)}}
		if i%2 == 1 {
			r.Match.Tier = fmt.Sprintf("t%d", i%5)
		}
		doc.Rules = append(doc.Rules, r)
	}
	for i := range 100_000 {
		doc.Overrides[fmt.Sprintf("sk_ovr_%d", i)] = policy.Target{Limits: lim(1000 + i%10)}
	}
	b, err := yaml.Marshal(doc)
	if err != nil {
		panic(err)
	}
	return b
})

// testBig: a policy of 1,000 rules and 100,000 overrides (8.6 MB of YAML)
// reaches a node through the fast reader (it parses none slowly). The time
// the node took to install it (get, parse, compile, swap) is logged; what
// is tested is the path, so the wait is long enough for the race detector
// on a loaded machine.
func testBig(t *testing.T, env Env) {
	ctx := context.Background()
	_, err := policy.Publish(ctx, env.Store, BigDoc(1), nil)
	require.NoError(t, err)
	nodes := startNodes(t, env, 1, time.Minute)
	v, err := policy.Publish(ctx, env.Store, BigDoc(2), nil)
	require.NoError(t, err)
	awaitWithin(t, time.Minute, nodes, v, func(n *node) chan int64 { return n.installs }, "install")
	for i, nd := range nodes {
		st := nd.w.Stats()
		require.Equal(t, v, st.Version)
		require.Zero(t, st.SlowParses, "node %d parsed a version slowly", i)
		require.EqualValues(t, 2, nd.w.Load().Document().Default.Limits[0].Max)
		t.Logf("node %d installed the 100,000-override policy in %v", i, st.LoadTime)
	}
}

// testFollow publishes 100 updates and 20 rollbacks; 3 nodes follow each
// within Deadline. The latencies (from the publisher's call to the last
// node's install) are logged.
func testFollow(t *testing.T, env Env) {
	ctx := context.Background()
	v0, err := policy.Publish(ctx, env.Store, Doc(1), nil)
	require.NoError(t, err)
	// A long poll: what is measured is the notification path.
	nodes := startNodes(t, env, 3, time.Minute)
	for _, nd := range nodes {
		require.Equal(t, v0, nd.w.Stats().Version)
	}
	var updates, rollbacks []time.Duration
	for i := range 100 {
		start := time.Now()
		v, err := policy.Publish(ctx, env.Store, Doc(i+2), nil)
		require.NoError(t, err)
		await(t, nodes, v, func(n *node) chan int64 { return n.installs }, "install")
		updates = append(updates, time.Since(start))
	}
	for i := range 20 {
		_, err := policy.Publish(ctx, env.Store, Doc(1000+i), nil)
		require.NoError(t, err)
		await(t, nodes, mustCurrent(t, env.Store), func(n *node) chan int64 { return n.installs }, "install")
		start := time.Now()
		to, err := policy.Rollback(ctx, env.Store)
		require.NoError(t, err)
		await(t, nodes, to, func(n *node) chan int64 { return n.installs }, "roll back to")
		rollbacks = append(rollbacks, time.Since(start))
		for _, nd := range nodes {
			require.Equal(t, to, nd.w.Stats().Version)
			require.Equal(t, to, nd.w.Load().Version())
		}
	}
	t.Logf("3 nodes follow an update: p50 %v p99 %v max %v (100 updates); a rollback: p50 %v p99 %v max %v (20)",
		pct(updates, 50), pct(updates, 99), pct(updates, 100), pct(rollbacks, 50), pct(rollbacks, 99), pct(rollbacks, 100))
	vs, err := env.Store.Versions(ctx)
	require.NoError(t, err)
	require.Len(t, vs, 121, "every version is kept")
}

func mustCurrent(t *testing.T, s policy.Store) int64 {
	n, err := s.Current(context.Background())
	require.NoError(t, err)
	return n
}

// testBad: Publish refuses a bad document; one written past Publish is
// refused by every node, which stays on the last good version.
func testBad(t *testing.T, env Env) {
	ctx := context.Background()
	good, err := policy.Publish(ctx, env.Store, Doc(5), nil)
	require.NoError(t, err)
	nodes := startNodes(t, env, 3, time.Minute)

	_, err = policy.Publish(ctx, env.Store, []byte("default: {limits: [{window: 1m, max: 0}]}"), nil)
	require.ErrorIs(t, err, policy.ErrInvalid)
	require.Equal(t, good, mustCurrent(t, env.Store), "a refused document is not stored")

	bad, err := env.Store.Append(ctx, []byte("default: {limits: [{window: 1m, max: 0}]}"))
	require.NoError(t, err)
	await(t, nodes, bad, func(n *node) chan int64 { return n.rejects }, "reject")
	for _, nd := range nodes {
		st := nd.w.Stats()
		require.Equal(t, good, st.Version)
		require.Equal(t, good, nd.w.Load().Version())
		require.Equal(t, bad, st.LastRejected)
		require.Contains(t, st.LastError, "would reject all traffic")
	}
	// A node starting now refuses to start on the bad version.
	_, err = policy.NewWatcher(ctx, env.Store, policy.WatchOptions{Logger: slog.New(slog.DiscardHandler)})
	require.Error(t, err)

	// The next good version is followed.
	next, err := policy.Publish(ctx, env.Store, Doc(6), nil)
	require.NoError(t, err)
	await(t, nodes, next, func(n *node) chan int64 { return n.installs }, "install")
}

// testLost: a version appended without notification reaches every node by
// polling.
func testLost(t *testing.T, env Env) {
	ctx := context.Background()
	_, err := policy.Publish(ctx, env.Store, Doc(5), nil)
	require.NoError(t, err)
	nodes := startNodes(t, env, 3, 200*time.Millisecond)
	v := env.AppendQuietly(t, Doc(9))
	await(t, nodes, v, func(n *node) chan int64 { return n.installs }, "install (by polling)")
	for _, nd := range nodes {
		require.Positive(t, nd.w.Stats().InstalledByPoll)
	}
}

func pct(ds []time.Duration, p int) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	i := (len(s)*p + 99) / 100
	return s[max(min(i, len(s))-1, 0)]
}
