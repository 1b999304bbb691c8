package ratelimitotel_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit"
	"github.com/ratesync/ratelimit/strategy/memory"
)

// Every instrument the Observer makes is listed in docs/metrics.md.
func TestDocsListEveryInstrument(t *testing.T) {
	h := newHarness(t, false)
	ctx := context.Background()
	store := memory.New()
	reg := ratelimit.NewRegistry()
	t.Cleanup(func() { _ = reg.Close(ctx) })
	ns, err := reg.New(ratelimit.Config{WindowSizes: []time.Duration{time.Minute}, Strategy: store, SyncRate: time.Hour, Observer: h.obs,
		HotKeys: ratelimit.HotKeysConfig{Capacity: 16, SampleRate: 1}})
	require.NoError(t, err)
	h.obs.Register(ns)
	lim := ratelimit.Limit{Window: time.Minute, Max: 1}
	for range 2 {
		_, err := ns.Allow(ctx, "k", 1, lim)
		require.NoError(t, err)
	}
	require.NoError(t, ns.Sync(ctx))

	doc, err := os.ReadFile("../docs/metrics.md")
	require.NoError(t, err)
	ms := h.collect(t)
	require.GreaterOrEqual(t, len(ms), 15)
	require.Contains(t, ms, "ratelimit.hottest_key.rate")
	for name, m := range ms {
		require.True(t, strings.Contains(string(doc), "| `"+name+"` |"), "docs/metrics.md does not list %s", name)
		require.NotEmpty(t, m.Description, name)
		require.NotEmpty(t, m.Unit, name)
	}
}
