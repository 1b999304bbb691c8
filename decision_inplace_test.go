package ratelimit_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit"
)

type revObs struct {
	mu sync.Mutex
	ev []ratelimit.DecisionEvent
}

func (o *revObs) Start(ctx context.Context, _ ratelimit.Op) context.Context { return ctx }
func (o *revObs) End(context.Context, ratelimit.Event)                      {}
func (o *revObs) Decision(_ context.Context, e ratelimit.DecisionEvent) {
	o.mu.Lock()
	o.ev = append(o.ev, e)
	o.mu.Unlock()
}

// Every path (lean windows, lean bucket, general, sync) with and without an
// Observer: the Observer sees the Decision Allow returns; an error returns
// the zero Decision, also after a valid call on the same goroutine.
func TestDecisionInPlace(t *testing.T) {
	lims := map[string][]ratelimit.Limit{
		"window": {{Window: time.Minute, Max: 2}},
		"two":    {{Window: time.Minute, Max: 2}, {Window: time.Second, Max: 5, Fixed: true}},
		"bucket": {{Window: time.Minute, Max: 2, Algorithm: ratelimit.TokenBucket}},
		"mixed":  {{Window: time.Minute, Max: 2}, {Window: time.Minute, Max: 3, Algorithm: ratelimit.TokenBucket}},
		"log":    {{Window: time.Minute, Max: 2, Algorithm: ratelimit.SlidingLog}},
	}
	for _, mode := range decModes {
		for name, ls := range lims {
			for _, observed := range []bool{false, true} {
				if name == "log" && mode == "async" {
					continue // not supported in periodic mode
				}
				t.Run(mode+"/"+name, func(t *testing.T) {
					clk := newDecClock(decEpoch.Add(10 * time.Second))
					ns, store := newDecNS(t, mode, clk, time.Second, time.Minute)
					obs := &revObs{}
					if observed {
						cfg := ratelimit.Config{WindowSizes: []time.Duration{time.Second, time.Minute}, Clock: clk.Now, Observer: obs, SyncTimeout: 30 * time.Second}
						switch mode {
						case "local":
							cfg.SyncRate = -1
						case "sync":
							cfg.Strategy, cfg.SyncRate, cfg.RetryInterval = store, 0, time.Hour
						case "async":
							cfg.Strategy, cfg.SyncRate = store, time.Hour
						}
						cfg.Namespace = "obs"
						ns = newNS(t, cfg)
					}
					var got []ratelimit.Decision
					for range 4 {
						d, err := ns.Allow(ctx, "k", 1, ls...)
						require.NoError(t, err)
						got = append(got, d)
					}
					require.True(t, got[0].Allowed)
					require.False(t, got[3].Allowed)
					require.NotZero(t, got[3].RetryAfter)
					d, err := ns.Allow(ctx, "", 1, ls...)
					require.Error(t, err)
					require.Zero(t, d)
					d, err = ns.Allow(ctx, "k", 99, ls...)
					require.Error(t, err)
					require.Zero(t, d)
					if observed {
						require.Len(t, obs.ev, 6)
						for i, g := range got {
							require.Equal(t, g, obs.ev[i].Decision, "event %d", i)
						}
						require.Zero(t, obs.ev[4].Decision)
						require.Zero(t, obs.ev[5].Decision)
					}
				})
			}
		}
	}
}
