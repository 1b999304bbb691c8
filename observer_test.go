package ratelimit_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit"
	"github.com/ratesync/ratelimit/strategy/memory"
)

type spanKey struct{}

// recorder is an Observer that logs what it is told; each Start puts a span
// name in the context, nested in the parent's, so the log shows parentage.
type recorder struct {
	mu        sync.Mutex
	log       []string
	decisions []ratelimit.DecisionEvent
	events    []ratelimit.Event
}

func span(ctx context.Context) string { s, _ := ctx.Value(spanKey{}).(string); return s }

func (r *recorder) Start(ctx context.Context, op ratelimit.Op) context.Context {
	name := span(ctx) + "/" + string(op)
	r.mu.Lock()
	r.log = append(r.log, "start "+name)
	r.mu.Unlock()
	return context.WithValue(ctx, spanKey{}, name)
}

func (r *recorder) End(ctx context.Context, e ratelimit.Event) {
	r.mu.Lock()
	r.log = append(r.log, fmt.Sprintf("end %s err=%v", span(ctx), e.Err != nil))
	r.events = append(r.events, e)
	r.mu.Unlock()
}

func (r *recorder) Decision(ctx context.Context, e ratelimit.DecisionEvent) {
	r.mu.Lock()
	r.log = append(r.log, fmt.Sprintf("decision %s allowed=%v err=%v", span(ctx), e.Decision.Allowed, e.Err != nil))
	r.decisions = append(r.decisions, e)
	r.mu.Unlock()
}

func (r *recorder) take() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	l := r.log
	r.log = nil
	return l
}

func TestObserverSynchronous(t *testing.T) {
	leakCheck(t)
	rec := &recorder{}
	store := memory.New()
	clk := &fakeClock{t: minute}
	ns := newNS(t, ratelimit.Config{WindowSizes: []time.Duration{time.Minute}, Strategy: store, Clock: clk.Now,
		RetryInterval: time.Hour, Observer: rec, Namespace: "obs"})
	lim := ratelimit.Limit{Window: time.Minute, Max: 1, Name: "p"}

	_, err := ns.Allow(ctx, "k", 1, lim)
	require.NoError(t, err)
	// The check is the parent of its store call.
	require.Equal(t, []string{"start /check", "start /check/push", "end /check/push err=false", "decision /check allowed=true err=false"}, rec.take())
	d, err := ns.Allow(ctx, "k", 1, lim)
	require.NoError(t, err)
	require.False(t, d.Allowed)
	// Known over the limit: answered from memory, no store call.
	require.Equal(t, []string{"start /check", "decision /check allowed=false err=false"}, rec.take())

	last := rec.decisions[len(rec.decisions)-1]
	require.Equal(t, "obs", last.Namespace)
	require.Equal(t, "k", last.Key)
	require.Equal(t, int64(1), last.Cost)
	require.Equal(t, "p", last.Decision.Limit.PolicyName())
	require.Positive(t, last.Decision.RetryAfter)
	push := rec.events[0]
	require.Equal(t, ratelimit.OpPush, push.Op)
	require.Equal(t, "obs", push.Namespace)
	require.Equal(t, 1, push.Diffs)
	require.Equal(t, int64(1), push.Delta)
	require.False(t, push.Start.IsZero())

	// A failing store shows as an error on the store call.
	store.SetFaults(func(memory.Op) memory.Fault { return memory.Refuse })
	_, err = ns.Allow(ctx, "other", 1, lim)
	require.NoError(t, err)
	require.Equal(t, []string{"start /check", "start /check/push", "end /check/push err=true", "decision /check allowed=true err=false"}, rec.take())

	// Bad arguments are reported with their error, and still end the check.
	_, err = ns.Allow(ctx, "", 1, lim)
	require.Error(t, err)
	require.Equal(t, []string{"start /check", "decision /check allowed=false err=true"}, rec.take())
	//lint:ignore SA1012 a nil context is the bad argument under test
	_, err = ns.Allow(nil, "k", 1, lim)
	require.ErrorIs(t, err, ratelimit.ErrNilContext)
	require.Equal(t, []string{"decision  allowed=false err=true"}, rec.take())
	// Peek is not a decision to report.
	_, err = ns.Peek(ctx, "k", 1, lim)
	require.NoError(t, err)
	for _, l := range rec.take() {
		require.False(t, strings.HasPrefix(l, "decision"), l)
	}
}

func TestObserverSyncCycle(t *testing.T) {
	leakCheck(t)
	rec := &recorder{}
	clk := &fakeClock{t: minute}
	ns := newNS(t, ratelimit.Config{WindowSizes: []time.Duration{time.Second, time.Minute}, Strategy: memory.New(), Clock: clk.Now,
		SyncRate: time.Hour, Observer: ratelimit.Observers(nil, rec)})
	lim := ratelimit.Limit{Window: time.Minute, Max: 5}
	for range 3 {
		_, err := ns.Allow(ctx, "k", 1, lim, ratelimit.Limit{Window: time.Second, Max: 5})
		require.NoError(t, err)
	}
	// Asynchronous decisions open no check; only the first, on a cold key,
	// reads the key from the store (a fetch), and later ones make no store call.
	require.Equal(t, []string{"start /fetch", "end /fetch err=false",
		"decision  allowed=true err=false", "decision  allowed=true err=false", "decision  allowed=true err=false"}, rec.take())
	require.NoError(t, ns.Sync(ctx))
	got := rec.take()
	require.Equal(t, "start /sync", got[0])
	require.Equal(t, "end /sync err=false", got[len(got)-1])
	require.Contains(t, got, "start /sync/push")
	var pushed, delta int64
	for _, e := range rec.events {
		if e.Op == ratelimit.OpPush {
			pushed += int64(e.Diffs)
			delta += e.Delta
		}
	}
	require.Equal(t, int64(2), pushed) // one counter per window size
	require.Equal(t, int64(6), delta)
	sync := rec.events[len(rec.events)-1]
	require.Equal(t, ratelimit.OpSync, sync.Op)
	require.Equal(t, "default", sync.Namespace)
}

func TestObserverLocal(t *testing.T) {
	rec := &recorder{}
	ns := newNS(t, ratelimit.Config{WindowSizes: []time.Duration{time.Minute}, SyncRate: -1, Observer: rec})
	_, err := ns.Allow(ctx, strings.Repeat("x", 300), 1, ratelimit.Limit{Window: time.Minute, Max: 5})
	require.NoError(t, err)
	require.NoError(t, ns.Sync(ctx)) // nothing to do in local mode
	require.Equal(t, []string{"decision  allowed=true err=false"}, rec.take())
	require.True(t, strings.HasPrefix(rec.decisions[0].Key, "sha256:"), "long keys are reported hashed")
}
