package ratelimit_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit"
)

func TestHotKeysOffByDefault(t *testing.T) {
	ns := newNS(t, ratelimit.Config{WindowSizes: []time.Duration{time.Minute}, SyncRate: -1})
	_, err := ns.Allow(ctx, "k", 1, ratelimit.Limit{Window: time.Minute, Max: 5})
	require.NoError(t, err)
	r := ns.HotKeys(10)
	require.Equal(t, time.Minute, r.Window)
	require.Empty(t, r.ByChecks)
	require.Empty(t, r.ByRejections)

	reg := ratelimit.NewRegistry()
	for _, hk := range []ratelimit.HotKeysConfig{{Capacity: 5}, {Capacity: 16, SampleRate: 3}, {Capacity: 16, SampleRate: -2}} {
		_, err := reg.New(ratelimit.Config{WindowSizes: []time.Duration{time.Minute}, SyncRate: -1, HotKeys: hk})
		require.ErrorIs(t, err, ratelimit.ErrInvalidConfig)
		require.ErrorContains(t, err, "HotKeys")
	}
}

func TestHotKeysExact(t *testing.T) {
	clk := &fakeClock{t: minute}
	ns := newNS(t, ratelimit.Config{WindowSizes: []time.Duration{time.Minute}, SyncRate: -1, Clock: clk.Now,
		HotKeys: ratelimit.HotKeysConfig{Capacity: 16, SampleRate: 1}})
	lim := ratelimit.Limit{Window: time.Minute, Max: 100}
	for range 1000 {
		_, err := ns.Allow(ctx, "hot", 1, lim)
		require.NoError(t, err)
	}
	for i := range 200 { // many cold keys, more than the sketch holds
		for range 3 {
			_, err := ns.Allow(ctx, fmt.Sprintf("cold-%d", i), 1, lim)
			require.NoError(t, err)
		}
	}
	_, err := ns.Peek(ctx, "hot", 1, lim) // Peek is not a check
	require.NoError(t, err)

	r := ns.HotKeys(3)
	require.Len(t, r.ByChecks, 3)
	require.Equal(t, ratelimit.HotKey{Key: "hot", Count: 1000}, r.ByChecks[0])
	require.Len(t, r.ByRejections, 1)
	require.Equal(t, ratelimit.HotKey{Key: "hot", Count: 900}, r.ByRejections[0])
	for _, k := range r.ByChecks[1:] {
		require.LessOrEqual(t, k.Count-k.Error, 3.0, k)
	}

	// Sliding: half way into the next minute, the previous one weighs half.
	clk.Set(minute.Add(90 * time.Second))
	r = ns.HotKeys(1)
	require.Equal(t, ratelimit.HotKey{Key: "hot", Count: 500}, r.ByChecks[0])
	_, err = ns.Allow(ctx, "new", 1, lim)
	require.NoError(t, err)
	r = ns.HotKeys(0)
	require.Equal(t, "hot", r.ByChecks[0].Key)
	require.Contains(t, r.ByChecks, ratelimit.HotKey{Key: "new", Count: 1})
	// Two minutes on, everything is forgotten.
	clk.Set(minute.Add(3 * time.Minute))
	r = ns.HotKeys(0)
	require.Empty(t, r.ByChecks)
	require.Empty(t, r.ByRejections)
	// A clock that goes back does not lose the counts.
	_, err = ns.Allow(ctx, "late", 1, lim)
	require.NoError(t, err)
	clk.Set(minute)
	_, err = ns.Allow(ctx, "late", 1, lim)
	require.NoError(t, err)
	clk.Set(minute.Add(3 * time.Minute))
	require.Equal(t, ratelimit.HotKey{Key: "late", Count: 2}, ns.HotKeys(1).ByChecks[0])
}

func TestHotKeysSampled(t *testing.T) {
	clk := &fakeClock{t: minute}
	ns := newNS(t, ratelimit.Config{WindowSizes: []time.Duration{time.Minute}, SyncRate: -1, Clock: clk.Now,
		HotKeys: ratelimit.HotKeysConfig{Capacity: 64}})
	lim := ratelimit.Limit{Window: time.Minute, Max: 1 << 40}
	for i := range 128_000 {
		key := "hot"
		if i%2 == 1 {
			key = fmt.Sprintf("cold-%d", i)
		}
		_, err := ns.Allow(ctx, key, 1, lim)
		require.NoError(t, err)
	}
	r := ns.HotKeys(1)
	require.Equal(t, "hot", r.ByChecks[0].Key)
	// 64,000 checks sampled 1 in 64: about 1,000 samples, standard deviation
	// about 31; 15% is more than 4 standard deviations.
	require.InDelta(t, 64_000, r.ByChecks[0].Count, 9_600)
}
