package grpclimit_test

import (
	"context"
	"io"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/ratesync/ratelimit"
	"github.com/ratesync/ratelimit/grpclimit"
	"github.com/ratesync/ratelimit/strategy/memory"
)

func ctx10(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestUnaryHeadersAndRejection(t *testing.T) {
	clk := newClock(epoch)
	ns, _ := newNS(t, "local", clk)
	lim := mustLimiter(t, grpclimit.Options{Namespace: ns, Limits: []ratelimit.Limit{{Window: time.Minute, Max: 2}}})
	c := serve(t, lim)
	ctx := ctx10(t)

	for want := 1; want >= 0; want-- {
		var hdr metadata.MD
		resp, err := c.Check(ctx, checkReq, grpc.Header(&hdr))
		require.NoError(t, err)
		require.Equal(t, healthpb.HealthCheckResponse_SERVING, resp.GetStatus())
		require.Equal(t, []string{`"per-minute";q=2;w=60`}, hdr.Get(grpclimit.MDPolicy))
		require.Equal(t, []string{`"per-minute";r=` + string(rune('0'+want)) + `;t=120`}, hdr.Get(grpclimit.MDRateLimit))
		require.Empty(t, hdr.Get(grpclimit.MDRetryAfter))
	}
	var hdr metadata.MD
	_, err := c.Check(ctx, checkReq, grpc.Header(&hdr))
	ri, qf := details(t, err)
	// Two hits at the start of a minute: the third fits when the sliding
	// window has forgotten half of them, 90 s later.
	require.Equal(t, 90*time.Second, ri.GetRetryDelay().AsDuration())
	require.Len(t, qf.GetViolations(), 1)
	v := qf.GetViolations()[0]
	require.Equal(t, "per-minute", v.GetQuotaId())
	require.Equal(t, int64(2), v.GetQuotaValue())
	require.Equal(t, "(default)", v.GetSubject())
	require.Contains(t, v.GetDescription(), `"per-minute" exceeded`)
	require.Equal(t, []string{"90"}, hdr.Get(grpclimit.MDRetryAfter))
	require.Equal(t, []string{`"per-minute";r=0;t=120`}, hdr.Get(grpclimit.MDRateLimit))
	require.Equal(t, []string{`"per-minute";q=2;w=60`}, hdr.Get(grpclimit.MDPolicy))
}

// TestTokenBucketPolicyLikeHTTP: a token bucket is advertised as httplimit
// advertises it: its Burst per the time the Burst takes to refill.
func TestTokenBucketPolicyLikeHTTP(t *testing.T) {
	clk := newClock(epoch)
	ns, _ := newNS(t, "local", clk)
	l := ratelimit.Limit{Algorithm: ratelimit.TokenBucket, Window: time.Minute, Max: 60, Burst: 10, Name: "api"}
	lim := mustLimiter(t, grpclimit.Options{Namespace: ns, Limits: []ratelimit.Limit{l}})
	c := serve(t, lim)
	var hdr metadata.MD
	_, err := c.Check(ctx10(t), checkReq, grpc.Header(&hdr))
	require.NoError(t, err)
	require.Equal(t, []string{`"api";q=10;w=10`}, hdr.Get(grpclimit.MDPolicy))
	require.Equal(t, []string{`"api";r=9;t=1`}, hdr.Get(grpclimit.MDRateLimit))
}

func TestRetryInfoIsTruthful(t *testing.T) {
	clk := newClock(epoch.Add(17 * time.Second))
	ns, _ := newNS(t, "local", clk)
	limits := []ratelimit.Limit{{Window: time.Second, Max: 3}, {Window: time.Minute, Max: 5}}
	lim := mustLimiter(t, grpclimit.Options{Namespace: ns, Limits: limits})
	var waited []time.Duration
	// The client "waits" by moving the server's clock by exactly the delay.
	exact := grpclimit.ClientOptions{Wait: func(_ context.Context, d time.Duration) error {
		waited = append(waited, d)
		clk.Advance(d)
		return nil
	}}
	c := serve(t, lim, grpc.WithUnaryInterceptor(grpclimit.UnaryClientInterceptor(exact)))
	ctx := context.Background() // no deadline: the waits are on the fake clock
	for i := range 12 {
		_, err := c.Check(ctx, checkReq)
		require.NoError(t, err, "call %d", i)
		clk.Advance(150 * time.Millisecond)
	}
	require.NotEmpty(t, waited, "the limits were never reached")
	for _, d := range waited {
		require.Positive(t, d)
	}

	// One millisecond short of the delay is still refused: the delay is the
	// earliest admission, not a guess.
	var short []time.Duration
	early := grpclimit.ClientOptions{MaxRetries: 1, Wait: func(_ context.Context, d time.Duration) error {
		short = append(short, d)
		clk.Advance(d - time.Millisecond)
		return nil
	}}
	c2 := serve(t, lim, grpc.WithUnaryInterceptor(grpclimit.UnaryClientInterceptor(early)))
	for {
		_, err := c2.Check(ctx, checkReq)
		if err != nil {
			requireCode(t, codes.ResourceExhausted, err)
			break
		}
		require.Empty(t, short, "admitted after waiting less than the delay")
	}
	require.Len(t, short, 1)
	// The millisecond still missing is exactly what the server now asks for.
	d, ok := grpclimit.RetryDelay(errorAfter(t, c2, ctx))
	require.True(t, ok)
	require.Equal(t, time.Millisecond, d)
	require.Len(t, short, 2) // it retried once more after a 0 ms wait, refused
	// Having waited the whole delay, the call is admitted.
	clk.Advance(time.Millisecond)
	_, err := c2.Check(ctx, checkReq)
	require.NoError(t, err)
	require.Len(t, short, 2)
}

// errorAfter makes one more call that must be refused and returns its error.
func errorAfter(t *testing.T, c healthpb.HealthClient, ctx context.Context) error {
	t.Helper()
	_, err := c.Check(ctx, checkReq)
	require.Error(t, err)
	return err
}

func TestClientDoesNotWaitPastDeadline(t *testing.T) {
	clk := newClock(epoch)
	ns, _ := newNS(t, "local", clk)
	lim := mustLimiter(t, grpclimit.Options{Namespace: ns, Limits: []ratelimit.Limit{{Window: time.Minute, Max: 1}}})
	var waits atomic.Int64
	c := serve(t, lim, grpc.WithUnaryInterceptor(grpclimit.UnaryClientInterceptor(grpclimit.ClientOptions{
		Wait: func(context.Context, time.Duration) error { waits.Add(1); return nil },
	})))
	_, err := c.Check(ctx10(t), checkReq)
	require.NoError(t, err)
	// The server says 90 s; the deadline is 10 s away: fail at once.
	_, err = c.Check(ctx10(t), checkReq)
	_, _ = details(t, err)
	require.Zero(t, waits.Load())

	// MaxDelay refuses long waits too, even without a deadline.
	c2 := serve(t, lim, grpc.WithUnaryInterceptor(grpclimit.UnaryClientInterceptor(grpclimit.ClientOptions{
		MaxDelay: time.Second,
		Wait:     func(context.Context, time.Duration) error { waits.Add(1); return nil },
	})))
	_, err = c2.Check(context.Background(), checkReq)
	requireCode(t, codes.ResourceExhausted, err)
	require.Zero(t, waits.Load())

	// A real wait that the caller cancels ends with the caller's error.
	ctx, cancel := context.WithCancel(context.Background())
	c3 := serve(t, lim, grpc.WithUnaryInterceptor(grpclimit.UnaryClientInterceptor(grpclimit.ClientOptions{
		Wait: func(ctx context.Context, d time.Duration) error { cancel(); <-ctx.Done(); return ctx.Err() },
	})))
	_, err = c3.Check(ctx, checkReq)
	require.ErrorIs(t, err, context.Canceled)
	requireCode(t, codes.ResourceExhausted, err) // the server's refusal is kept too
}

func TestStreaming(t *testing.T) {
	clk := newClock(epoch)
	ns, _ := newNS(t, "local", clk)
	lim := mustLimiter(t, grpclimit.Options{Namespace: ns, Rules: []grpclimit.Rule{
		{Method: healthpb.Health_Watch_FullMethodName, Limits: []ratelimit.Limit{{Window: time.Minute, Max: 1, Name: "watchers"}}},
	}})
	c := serve(t, lim)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := c.Watch(ctx, checkReq)
	require.NoError(t, err)
	resp, err := s.Recv()
	require.NoError(t, err)
	require.Equal(t, healthpb.HealthCheckResponse_SERVING, resp.GetStatus())
	hdr, err := s.Header()
	require.NoError(t, err)
	require.Equal(t, []string{`"watchers";q=1;w=60`}, hdr.Get(grpclimit.MDPolicy))
	require.Equal(t, []string{`"watchers";r=0;t=120`}, hdr.Get(grpclimit.MDRateLimit))

	s2, err := c.Watch(ctx, checkReq)
	require.NoError(t, err)
	_, err = s2.Recv()
	ri, qf := details(t, err)
	// One hit at the start of a minute with Max 1: the next fits when the
	// sliding window has forgotten it, at the end of the next minute.
	require.Equal(t, 120*time.Second, ri.GetRetryDelay().AsDuration())
	require.Equal(t, "watchers", qf.GetViolations()[0].GetQuotaId())
	require.Equal(t, healthpb.Health_Watch_FullMethodName, qf.GetViolations()[0].GetSubject())
	hdr, err = s2.Header()
	require.NoError(t, err)
	require.Equal(t, []string{"120"}, hdr.Get(grpclimit.MDRetryAfter))

	// Unary calls match no rule and the default has no limits: unlimited.
	for range 5 {
		var h metadata.MD
		_, err := c.Check(ctx, checkReq, grpc.Header(&h))
		require.NoError(t, err)
		require.Empty(t, h.Get(grpclimit.MDPolicy))
	}
	cancel()
	_, err = s.Recv()
	requireCode(t, codes.Canceled, err)
}

func TestRulePrecedence(t *testing.T) {
	clk := newClock(epoch)
	ns, _ := newNS(t, "local", clk)
	per := func(n int64) []ratelimit.Limit { return []ratelimit.Limit{{Window: time.Minute, Max: n}} }
	lim := mustLimiter(t, grpclimit.Options{Namespace: ns, Limits: per(5), Rules: []grpclimit.Rule{
		{Method: "/grpc.health.v1.Health/*", Limits: per(3)},
		{Method: healthpb.Health_Check_FullMethodName, Limits: per(1)},
	}})
	c := serve(t, lim)
	ctx := ctx10(t)
	admitted := func(call func() error) int {
		n := 0
		for range 10 {
			if err := call(); err != nil {
				requireCode(t, codes.ResourceExhausted, err)
				return n
			}
			n++
		}
		return n
	}
	// The exact rule wins over the service wildcard; each rule counts apart.
	require.Equal(t, 1, admitted(func() error { _, err := c.Check(ctx, checkReq); return err }))
	require.Equal(t, 3, admitted(func() error { _, err := c.List(ctx, &healthpb.HealthListRequest{}); return err }))
}

func TestKeysThroughServer(t *testing.T) {
	clk := newClock(epoch)
	ns, _ := newNS(t, "local", clk)
	trusted, err := grpclimit.KeyByPeer(grpclimit.IPOptions{TrustedProxies: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}})
	require.NoError(t, err)
	one := []ratelimit.Limit{{Window: time.Minute, Max: 1}}
	lim := mustLimiter(t, grpclimit.Options{Namespace: ns, Rules: []grpclimit.Rule{
		{Method: healthpb.Health_Check_FullMethodName, Limits: one, KeyFunc: trusted},
		{Method: healthpb.Health_List_FullMethodName, Limits: one, KeyFunc: grpclimit.Compose(grpclimit.KeyByMetadata("x-tenant"), grpclimit.KeyByMethod())},
	}})
	c := serve(t, lim)
	ctx := ctx10(t)
	from := func(xff string) context.Context { return metadata.AppendToOutgoingContext(ctx, "x-forwarded-for", xff) }

	// Behind a trusted proxy (the loopback peer), clients are told apart by
	// the forwarded address; a forged left-hand entry does not help.
	_, err = c.Check(from("203.0.113.1"), checkReq)
	require.NoError(t, err)
	_, err = c.Check(from("203.0.113.2"), checkReq)
	require.NoError(t, err)
	_, err = c.Check(from("198.51.100.9, 203.0.113.1"), checkReq)
	requireCode(t, codes.ResourceExhausted, err)
	// No forwarded address: the proxy itself is the client.
	_, err = c.Check(ctx, checkReq)
	require.NoError(t, err)

	tenant := func(id string) context.Context { return metadata.AppendToOutgoingContext(ctx, "x-tenant", id) }
	_, err = c.List(tenant("a"), &healthpb.HealthListRequest{})
	require.NoError(t, err)
	_, err = c.List(tenant("b"), &healthpb.HealthListRequest{})
	require.NoError(t, err)
	_, err = c.List(tenant("a"), &healthpb.HealthListRequest{})
	requireCode(t, codes.ResourceExhausted, err)
	// No tenant: the call has no key, which is not a rate-limit refusal.
	_, err = c.List(ctx, &healthpb.HealthListRequest{})
	requireCode(t, codes.InvalidArgument, err)
}

func TestUntrustedPeerIgnoresForwarding(t *testing.T) {
	clk := newClock(epoch)
	ns, _ := newNS(t, "local", clk)
	lim := mustLimiter(t, grpclimit.Options{Namespace: ns, Limits: []ratelimit.Limit{{Window: time.Minute, Max: 1}}})
	c := serve(t, lim)
	ctx := ctx10(t)
	_, err := c.Check(metadata.AppendToOutgoingContext(ctx, "x-forwarded-for", "203.0.113.1"), checkReq)
	require.NoError(t, err)
	// The default key is the peer (127.0.0.1); a forged header changes nothing.
	_, err = c.Check(metadata.AppendToOutgoingContext(ctx, "x-forwarded-for", "203.0.113.2"), checkReq)
	requireCode(t, codes.ResourceExhausted, err)
}

func TestStoreFailure(t *testing.T) {
	clk := newClock(epoch)
	ns, store := newNS(t, "sync", clk)
	var failing atomic.Bool
	store.SetFaults(func(memory.Op) memory.Fault {
		if failing.Load() {
			return memory.Refuse
		}
		return memory.NoFault
	})
	limits := []ratelimit.Limit{{Window: time.Minute, Max: 5}}
	lim := mustLimiter(t, grpclimit.Options{Namespace: ns, Limits: limits, Rules: []grpclimit.Rule{
		{Method: healthpb.Health_List_FullMethodName, Limits: limits, FailClosed: true},
	}})
	c := serve(t, lim)
	ctx := ctx10(t)

	var hdr metadata.MD
	_, err := c.Check(ctx, checkReq, grpc.Header(&hdr))
	require.NoError(t, err)
	require.Empty(t, hdr.Get(grpclimit.MDDegraded))

	failing.Store(true)
	// Fail open: served, decided from local counts, visibly.
	_, err = c.Check(ctx, checkReq, grpc.Header(&hdr))
	require.NoError(t, err)
	require.Equal(t, []string{"?1"}, hdr.Get(grpclimit.MDDegraded))
	// Fail closed: Unavailable, the handler never runs.
	for range 3 {
		_, err = c.List(ctx, &healthpb.HealthListRequest{}, grpc.Header(&hdr))
		requireCode(t, codes.Unavailable, err)
		require.Equal(t, []string{"?1"}, hdr.Get(grpclimit.MDDegraded))
	}

	failing.Store(false)
	// The store is back; a sync pushes what waited (the retry loop would,
	// within RetryInterval).
	require.NoError(t, ns.Sync(ctx))
	_, err = c.List(ctx, &healthpb.HealthListRequest{}, grpc.Header(&hdr))
	require.NoError(t, err)
	require.Empty(t, hdr.Get(grpclimit.MDDegraded))
	// The refused calls were not counted: 5 - 1 = 4 remain after this one.
	require.Equal(t, []string{`"per-minute";r=4;t=120`}, hdr.Get(grpclimit.MDRateLimit))
}

func TestClosedNamespace(t *testing.T) {
	clk := newClock(epoch)
	ns, _ := newNS(t, "local", clk)
	limits := []ratelimit.Limit{{Window: time.Minute, Max: 5}}
	lim := mustLimiter(t, grpclimit.Options{Namespace: ns, Limits: limits, Rules: []grpclimit.Rule{
		{Method: healthpb.Health_List_FullMethodName, Limits: limits, FailClosed: true},
	}})
	c := serve(t, lim)
	require.NoError(t, ns.Close(context.Background()))
	_, err := c.Check(ctx10(t), checkReq)
	require.NoError(t, err)
	_, err = c.List(ctx10(t), &healthpb.HealthListRequest{})
	requireCode(t, codes.Unavailable, err)
}

func TestNewValidation(t *testing.T) {
	clk := newClock(epoch)
	ns, _ := newNS(t, "local", clk)
	ok := []ratelimit.Limit{{Window: time.Minute, Max: 5}}
	for _, tc := range []struct {
		opts grpclimit.Options
		want string
	}{
		{grpclimit.Options{}, "Namespace is required"},
		{grpclimit.Options{Namespace: ns, Limits: []ratelimit.Limit{{Window: time.Hour, Max: 1}}}, "Options: Limits"},
		{grpclimit.Options{Namespace: ns, Cost: -1, Limits: ok}, "negative"},
		{grpclimit.Options{Namespace: ns, KeyErrorCode: codes.ResourceExhausted}, "KeyErrorCode"},
		{grpclimit.Options{Namespace: ns, KeyErrorCode: 99}, "KeyErrorCode"},
		{grpclimit.Options{Namespace: ns, LogInterval: -1}, "LogInterval"},
		{grpclimit.Options{Namespace: ns, Rules: []grpclimit.Rule{{Method: "pkg.S/M"}}}, "Method"},
		{grpclimit.Options{Namespace: ns, Rules: []grpclimit.Rule{{Method: "/pkg.S/"}}}, "Method"},
		{grpclimit.Options{Namespace: ns, Rules: []grpclimit.Rule{{Method: "/pkg.S/M*"}}}, "Method"},
		{grpclimit.Options{Namespace: ns, Rules: []grpclimit.Rule{{Method: ""}}}, "Method"},
		{grpclimit.Options{Namespace: ns, Rules: []grpclimit.Rule{{Method: "/a.S/*"}, {Method: "/a.S/*"}}}, "same method"},
		{grpclimit.Options{Namespace: ns, Rules: []grpclimit.Rule{{Method: "/a.S/M", Limits: ok, Cost: 6}}}, "Rules[0]"},
	} {
		_, err := grpclimit.New(tc.opts)
		require.ErrorContains(t, err, tc.want)
	}
	_, err := grpclimit.KeyByPeer(grpclimit.IPOptions{IPv4Prefix: 33})
	require.ErrorContains(t, err, "IPv4Prefix")
}

func TestRetryDelayOnOtherErrors(t *testing.T) {
	for _, err := range []error{nil, io.EOF, status.Error(codes.ResourceExhausted, "no details"), status.Error(codes.Unavailable, "x")} {
		_, ok := grpclimit.RetryDelay(err)
		require.False(t, ok, "%v", err)
	}
	require.True(t, strings.HasPrefix(grpclimit.MDPolicy, "ratelimit"))
}
