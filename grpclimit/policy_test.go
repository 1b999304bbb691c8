package grpclimit_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/ratesync/ratelimit"
	"github.com/ratesync/ratelimit/grpclimit"
	"github.com/ratesync/ratelimit/policy"
	"github.com/ratesync/ratelimit/strategy/memory"
)

// grpcPolicy's route patterns name the health service's methods as
// ServeMux patterns: POST and the full method.
const grpcPolicy = `
default: {limits: [{window: 1m, max: 6}]}
rules:
  - {id: check, match: {route: "POST /grpc.health.v1.Health/Check"}, limits: [{window: 1m, max: 2}]}
  - {id: pro, match: {tier: pro}, limits: [{window: 1m, max: 3}]}
  - {id: watch-shadow, match: {route: "/grpc.health.v1.Health/Watch"}, shadow: true, limits: [{window: 1m, max: 1}]}
overrides: {vip: {limits: [{window: 1m, max: 4}]}}
allow: ["internal-*"]
deny: {keys: ["bad"], status: %d}
`

func load(t *testing.T, doc string, version int64) *policy.Snapshot {
	t.Helper()
	s, err := policy.Load([]byte(doc), version, policy.Options{})
	require.NoError(t, err)
	return s
}

// tierFromMetadata reads the tier from "x-tier" metadata, as a service would
// from a header its gateway sets.
func tierFromMetadata(ctx context.Context, _ string) string {
	md, _ := metadata.FromIncomingContext(ctx)
	if v := md.Get("x-tier"); len(v) > 0 {
		return v[0]
	}
	return ""
}

func mustPolicyLimiter(t *testing.T, ns *ratelimit.Namespace, src policy.Provider, clk *clock) *grpclimit.PolicyLimiter {
	t.Helper()
	p, err := grpclimit.NewWithPolicy(grpclimit.PolicyOptions{
		Options: grpclimit.Options{Namespace: ns, KeyFunc: grpclimit.KeyByMetadata("x-key"),
			Logger: slog.New(slog.DiscardHandler)},
		Policy: src,
		Tier:   tierFromMetadata,
		Clock:  clk.Now,
	})
	require.NoError(t, err)
	return p
}

// as returns a context whose calls carry key and tier (each omitted when "").
func as(t *testing.T, key, tier string) context.Context {
	ctx := ctx10(t)
	if key != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "x-key", key)
	}
	if tier != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "x-tier", tier)
	}
	return ctx
}

// check makes a unary call and returns its header metadata and error.
func check(t *testing.T, c healthpb.HealthClient, key, tier string) (metadata.MD, error) {
	var hdr metadata.MD
	_, err := c.Check(as(t, key, tier), checkReq, grpc.Header(&hdr))
	return hdr, err
}

// watch opens a stream, reads its first message and closes it.
func watch(t *testing.T, c healthpb.HealthClient, key, tier string) error {
	ctx, cancel := context.WithCancel(as(t, key, tier))
	defer cancel()
	s, err := c.Watch(ctx, checkReq)
	if err != nil {
		return err
	}
	_, err = s.Recv()
	return err
}

// admitted makes calls until one is refused (at most 30) and returns how
// many were admitted and the refusal.
func admitted(f func() error) (int, error) {
	for n := range 30 {
		if err := f(); err != nil {
			return n, err
		}
	}
	return 30, nil
}

func subject(t *testing.T, err error) string {
	t.Helper()
	_, qf := details(t, err)
	return qf.GetViolations()[0].GetSubject()
}

// Each resolution level decides the calls it should, unary and streaming,
// with the route of a call being its full method.
func TestPolicyResolutionLevels(t *testing.T) {
	clk := newClock(epoch)
	ns, _ := newNS(t, "local", clk)
	p := mustPolicyLimiter(t, ns, policy.NewHolder(load(t, fmt.Sprintf(grpcPolicy, 403), 1)), clk)
	c := serve(t, p)

	unaryAs := func(key, tier string) func() error {
		return func() error { _, err := check(t, c, key, tier); return err }
	}
	watchAs := func(key, tier string) func() error { return func() error { return watch(t, c, key, tier) } }
	for _, tc := range []struct {
		name      string
		call      func() error
		admitted  int
		rule      string
		wantLevel policy.Level
	}{
		{"route rule: exact method", unaryAs("bob", ""), 2, "check", policy.LevelRoute},
		{"tier rule over route rule", unaryAs("alice", "pro"), 3, "pro", policy.LevelTier},
		{"override over tier rule", unaryAs("vip", "pro"), 4, "override", policy.LevelOverride},
		{"default for a method no route names (stream)", watchAs("carol", ""), 6, "default", policy.LevelDefault},
		{"tier rule without a route, on a stream", watchAs("dave", "pro"), 3, "pro", policy.LevelTier},
	} {
		n, err := admitted(tc.call)
		require.Equal(t, tc.admitted, n, tc.name)
		require.Equal(t, tc.rule, subject(t, err), tc.name)
		ri, _ := details(t, err)
		require.Positive(t, ri.GetRetryDelay().AsDuration(), tc.name)
	}

	// The allow list passes, spends nothing and sends no metadata.
	for range 30 {
		hdr, err := check(t, c, "internal-ci", "")
		require.NoError(t, err)
		require.Empty(t, hdr.Get(grpclimit.MDPolicy))
	}
	// The deny list refuses at once, whatever the tier.
	_, err := check(t, c, "bad", "pro")
	requireCode(t, codes.PermissionDenied, err)
	// No key: the key error code, never ResourceExhausted, counted nowhere.
	_, err = check(t, c, "", "")
	requireCode(t, codes.InvalidArgument, err)

	st := p.Stats()
	require.Equal(t, int64(1), st.Version)
	require.Equal(t, uint64(1), st.Requests[policy.LevelDeny])
	require.Equal(t, uint64(30), st.Requests[policy.LevelAllow])
	require.Equal(t, uint64(5), st.Requests[policy.LevelOverride])
	require.Equal(t, uint64(4+4), st.Requests[policy.LevelTier])
	require.Equal(t, uint64(3), st.Requests[policy.LevelRoute])
	require.Equal(t, uint64(7), st.Requests[policy.LevelDefault])
	require.Equal(t, uint64(5), st.Rejected)
	// The shadow rule on Watch (1 per minute) would have refused every
	// stream of carol's but the first, and of dave's too: it refused none.
	require.Equal(t, uint64(6+3), st.ShadowRejected)
}

// A deny status of 429 is ResourceExhausted without RetryInfo: no wait
// admits the key, so the client interceptor does not wait.
func TestPolicyDenyAs429(t *testing.T) {
	clk := newClock(epoch)
	ns, _ := newNS(t, "local", clk)
	p := mustPolicyLimiter(t, ns, policy.NewHolder(load(t, fmt.Sprintf(grpcPolicy, 429), 1)), clk)
	waits := 0
	c := serve(t, p, grpc.WithUnaryInterceptor(grpclimit.UnaryClientInterceptor(grpclimit.ClientOptions{
		Wait: func(context.Context, time.Duration) error { waits++; return nil }})))
	_, err := check(t, c, "bad", "")
	requireCode(t, codes.ResourceExhausted, err)
	_, ok := grpclimit.RetryDelay(err)
	require.False(t, ok)
	st, _ := status.FromError(err)
	require.Len(t, st.Details(), 1)
	qf, ok := st.Details()[0].(*errdetails.QuotaFailure)
	require.True(t, ok)
	require.Equal(t, "deny", qf.GetViolations()[0].GetQuotaId())
	require.Equal(t, "deny", qf.GetViolations()[0].GetSubject())
	require.Zero(t, waits)
}

// A version published on the store applies to the next call once the
// watcher installs it: a raised limit keeps what the client spent (counters
// are keyed by rule id), and a new service-wide route takes the streams.
func TestPolicyHotReload(t *testing.T) {
	clk := newClock(epoch)
	ns, _ := newNS(t, "local", clk)
	ctx := ctx10(t)
	store := policy.NewMemoryStore()
	v1 := fmt.Sprintf(grpcPolicy, 403)
	_, err := policy.Publish(ctx, store, []byte(v1), grpclimit.CheckPolicy(ns))
	require.NoError(t, err)
	installed := make(chan int64, 4)
	w, err := policy.NewWatcher(ctx, store, policy.WatchOptions{Check: grpclimit.CheckPolicy(ns),
		Logger: slog.New(slog.DiscardHandler), OnInstall: func(s *policy.Snapshot) { installed <- s.Version() }})
	require.NoError(t, err)
	t.Cleanup(func() { _ = w.Close() })
	require.Equal(t, int64(1), <-installed)
	p := mustPolicyLimiter(t, ns, w, clk)
	c := serve(t, p)

	n, err := admitted(func() error { _, err := check(t, c, "erin", ""); return err })
	require.Equal(t, 2, n)
	require.Equal(t, "check", subject(t, err))
	require.NoError(t, watch(t, c, "erin", ""))

	// A limit that does not fit the namespace is refused at publication.
	_, err = policy.Publish(ctx, store, []byte(`default: {limits: [{window: 1h, max: 6}]}`), grpclimit.CheckPolicy(ns))
	require.ErrorIs(t, err, policy.ErrInvalid)

	v2 := `
default: {limits: [{window: 1m, max: 6}]}
rules:
  - {id: check, match: {route: "POST /grpc.health.v1.Health/Check"}, limits: [{window: 1m, max: 5}]}
  - {id: health, match: {route: "/grpc.health.v1.Health/"}, limits: [{window: 1m, max: 1, name: health}]}
`
	n2, err := policy.Publish(ctx, store, []byte(v2), grpclimit.CheckPolicy(ns))
	require.NoError(t, err)
	select {
	case v := <-installed:
		require.Equal(t, n2, v)
	case <-ctx.Done():
		t.Fatal("version 2 was never installed")
	}

	// Raised from 2 to 5: erin spent 2, so this call leaves 2.
	hdr, err := check(t, c, "erin", "")
	require.NoError(t, err)
	require.Equal(t, []string{`"per-minute";q=5;w=60`}, hdr.Get(grpclimit.MDPolicy))
	require.Equal(t, []string{`"per-minute";r=2;t=120`}, hdr.Get(grpclimit.MDRateLimit))
	// Watch now matches the service pattern, with counters of its own.
	require.NoError(t, watch(t, c, "erin", ""))
	err = watch(t, c, "erin", "")
	require.Equal(t, "health", subject(t, err))
	require.Equal(t, n2, p.Stats().Version)
	require.Equal(t, n2, w.Stats().Version)
}

// A client that keeps calling after a refusal is cooled down, each cooldown
// twice the last, then denied for a while, as httplimit does; both expire.
func TestPolicyEscalation(t *testing.T) {
	clk := newClock(epoch)
	ns, _ := newNS(t, "local", clk)
	doc := `
default: {limits: [{window: 1m, max: 1}]}
escalation: {strike_window: 1m, max_cooldown: 10m, deny_after: 3, deny_for: 15m}
`
	p := mustPolicyLimiter(t, ns, policy.NewHolder(load(t, doc, 1)), clk)
	c := serve(t, p)
	call := func() error { _, err := check(t, c, "frank", ""); return err }
	quota := func(err error) (string, time.Duration) {
		ri, qf := details(t, err)
		return qf.GetViolations()[0].GetQuotaId(), ri.GetRetryDelay().AsDuration()
	}

	require.NoError(t, call())
	id, d := quota(call()) // refused by the limit: not a strike yet
	require.Equal(t, "per-minute", id)
	require.Equal(t, 2*time.Minute, d)
	_, _ = quota(call()) // the first strike: a cooldown of the limit's window
	id, d = quota(call())
	require.Equal(t, "cooldown", id) // a strike during the cooldown doubles it
	require.Equal(t, 2*time.Minute, d)
	id, d = quota(call())
	require.Equal(t, "cooldown", id)
	require.Equal(t, 4*time.Minute, d) // the third strike: denied from now on
	requireCode(t, codes.PermissionDenied, call())

	st := p.Stats()
	require.Equal(t, uint64(2), st.Rejected)
	require.Equal(t, uint64(2), st.Cooldowns)
	require.Equal(t, uint64(1), st.TempDenied)
	require.Equal(t, uint64(4), st.Strikes)

	clk.Advance(15 * time.Minute) // the deny and the window are over
	require.NoError(t, call())
}

// An entry whose limits the namespace does not count lets its calls pass,
// counted as misfits (CheckPolicy refuses such a policy on a watcher).
func TestPolicyMisfit(t *testing.T) {
	clk := newClock(epoch)
	ns, _ := newNS(t, "local", clk)
	p := mustPolicyLimiter(t, ns, policy.NewHolder(load(t, `default: {limits: [{window: 1h, max: 1}]}`, 1)), clk)
	c := serve(t, p)
	for range 3 {
		_, err := check(t, c, "gina", "")
		require.NoError(t, err)
	}
	require.Equal(t, uint64(3), p.Stats().Misfits)
}

// No snapshot: every call passes.
func TestPolicyNone(t *testing.T) {
	clk := newClock(epoch)
	ns, _ := newNS(t, "local", clk)
	p := mustPolicyLimiter(t, ns, policy.NewHolder(nil), clk)
	c := serve(t, p)
	for range 3 {
		_, err := check(t, c, "hank", "")
		require.NoError(t, err)
	}
	require.Equal(t, uint64(3), p.Stats().Requests[policy.LevelNone])
}

// Calls from many goroutines while the snapshot changes: each key is held
// to its limit, and the race detector sees the shared route requests.
func TestPolicyConcurrent(t *testing.T) {
	clk := newClock(epoch)
	ns, _ := newNS(t, "local", clk)
	holder := policy.NewHolder(load(t, fmt.Sprintf(grpcPolicy, 403), 1))
	p := mustPolicyLimiter(t, ns, holder, clk)
	c := serve(t, p)
	var wg sync.WaitGroup
	counts := make([]int, 8)
	for g := range counts {
		wg.Go(func() {
			for range 10 {
				if _, err := check(t, c, fmt.Sprint("k", g), ""); err == nil {
					counts[g]++
				} else if status.Code(err) != codes.ResourceExhausted {
					t.Error(err)
				}
			}
		})
	}
	holder.Store(load(t, fmt.Sprintf(grpcPolicy, 403), 2)) // same rules: same counters
	wg.Wait()
	for g, n := range counts {
		require.Equal(t, 2, n, "key k%d", g)
	}
}

func TestNewWithPolicyValidation(t *testing.T) {
	clk := newClock(epoch)
	ns, _ := newNS(t, "local", clk)
	holder := policy.NewHolder(nil)
	for _, opts := range []grpclimit.PolicyOptions{
		{Options: grpclimit.Options{Namespace: ns}},
		{Options: grpclimit.Options{Namespace: ns, Limits: []ratelimit.Limit{{Window: time.Minute, Max: 1}}}, Policy: holder},
		{Options: grpclimit.Options{Namespace: ns, Cost: 2}, Policy: holder},
		{Options: grpclimit.Options{Namespace: ns, Rules: []grpclimit.Rule{{Method: "/a.B/*"}}}, Policy: holder},
		{Options: grpclimit.Options{}, Policy: holder},
	} {
		_, err := grpclimit.NewWithPolicy(opts)
		require.Error(t, err)
	}
}

// Options.FailClosed applies to every entry: a call whose decision is
// degraded (the store failed) is refused with Unavailable.
func TestPolicyFailClosed(t *testing.T) {
	clk := newClock(epoch)
	ns, store := newNS(t, "sync", clk)
	var failing atomic.Bool
	store.SetFaults(func(memory.Op) memory.Fault {
		if failing.Load() {
			return memory.Refuse
		}
		return memory.NoFault
	})
	p, err := grpclimit.NewWithPolicy(grpclimit.PolicyOptions{
		Options: grpclimit.Options{Namespace: ns, KeyFunc: grpclimit.KeyByMetadata("x-key"), FailClosed: true,
			Logger: slog.New(slog.DiscardHandler)},
		Policy: policy.NewHolder(load(t, fmt.Sprintf(grpcPolicy, 403), 1)),
	})
	require.NoError(t, err)
	c := serve(t, p)
	_, err = check(t, c, "ivan", "")
	require.NoError(t, err)
	failing.Store(true)
	hdr, err := check(t, c, "ivan", "")
	requireCode(t, codes.Unavailable, err)
	require.Equal(t, []string{"?1"}, hdr.Get(grpclimit.MDDegraded))
	// The allow list never touches the store.
	_, err = check(t, c, "internal-ci", "")
	require.NoError(t, err)
}

// TestPolicyAddsNoAllocation decides the same calls through New (one
// default limit) and through a policy (a method rule, a tier rule, an
// override, the default): the policy allocates no more than New.
func TestPolicyAddsNoAllocation(t *testing.T) {
	ns, _ := newNS(t, "local", newClock(epoch))
	lim, err := grpclimit.New(grpclimit.Options{Namespace: ns, KeyFunc: grpclimit.KeyByMetadata("x-key"),
		Limits: []ratelimit.Limit{{Window: time.Minute, Max: 1 << 40}}})
	require.NoError(t, err)
	snap := load(t, `
default: {limits: [{window: 1m, max: 1099511627776}]}
rules:
  - {id: m, match: {route: "/a.S/M"}, limits: [{window: 1m, max: 1099511627776}]}
  - {id: pro, match: {tier: pro}, limits: [{window: 1m, max: 1099511627776}]}
overrides: {vip: {limits: [{window: 1m, max: 1099511627776}]}}
`, 1)
	type tierKey struct{}
	plim, err := grpclimit.NewWithPolicy(grpclimit.PolicyOptions{
		Options: grpclimit.Options{Namespace: ns, KeyFunc: grpclimit.KeyByMetadata("x-key")},
		Policy:  policy.NewHolder(snap),
		// tierFromMetadata copies the metadata: its allocations are not the
		// policy's.
		Tier: func(ctx context.Context, _ string) string { s, _ := ctx.Value(tierKey{}).(string); return s },
	})
	require.NoError(t, err)
	handler := func(context.Context, any) (any, error) { return nil, nil }
	for _, c := range []struct{ method, key, tier string }{
		{"/a.S/M", "k1", ""}, {"/a.S/N", "k2", "pro"}, {"/a.S/N", "vip", ""}, {"/a.S/N", "k3", ""},
	} {
		ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("x-key", c.key))
		ctx = context.WithValue(ctx, tierKey{}, c.tier)
		ctx = grpc.NewContextWithServerTransportStream(ctx, nopStream{})
		info := &grpc.UnaryServerInfo{FullMethod: c.method}
		call := func(ic grpc.UnaryServerInterceptor) func() {
			return func() {
				if _, err := ic(ctx, nil, info, handler); err != nil {
					t.Fatal(err)
				}
			}
		}
		call(plim.UnaryServerInterceptor())() // compiles the entry, caches the method
		want := testing.AllocsPerRun(200, call(lim.UnaryServerInterceptor()))
		got := testing.AllocsPerRun(200, call(plim.UnaryServerInterceptor()))
		require.LessOrEqual(t, got, want, "%+v: the policy allocates %v, New %v", c, got, want)
	}
}

// A shadow rule is decided even when no enforced rule or default matches the
// call.
func TestPolicyShadowWithoutEnforcedRule(t *testing.T) {
	clk := newClock(epoch)
	ns, _ := newNS(t, "local", clk)
	p := mustPolicyLimiter(t, ns, policy.NewHolder(load(t, `
rules:
  - {id: trial, match: {route: "POST /grpc.health.v1.Health/Check"}, shadow: true, limits: [{window: 1m, max: 2}]}
`, 1)), clk)
	c := serve(t, p)
	for range 5 {
		_, err := check(t, c, "k", "")
		require.NoError(t, err)
	}
	require.Equal(t, uint64(3), p.Stats().ShadowRejected)
}
