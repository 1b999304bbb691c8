package ratelimit_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit"
)

// A node keeps a window's counts in 32 bits until one outgrows them, then
// in 64 (shm's widening). Counts past 2^31 (a limit on bytes, say), counted
// on two nodes through the real stores, come back exact on both, and a
// limit over them still binds.
func TestWideCountsRealStores(t *testing.T) {
	for name, newStore := range realStores("widecounts") {
		t.Run(name, func(t *testing.T) {
			leakCheck(t)
			cfg := ratelimit.Config{WindowSizes: []time.Duration{time.Minute}, SyncRate: time.Hour, Strategy: newStore(t),
				SyncTimeout: 5 * time.Second}
			a, b, c := newNS(t, cfg), newNS(t, cfg), newNS(t, cfg)
			const gib = int64(1) << 30
			limit := ratelimit.Limit{Window: time.Minute, Max: 20 * gib}
			// Small counts first (narrow), then large ones (wide), on both.
			for _, ns := range []*ratelimit.Namespace{a, b} {
				for range 3 {
					d, err := ns.Allow(ctx, "bytes", 1, limit)
					require.NoError(t, err)
					require.True(t, d.Allowed)
				}
			}
			for range 3 {
				d, err := a.Allow(ctx, "bytes", 3*gib, limit) // a: 9 GiB + 3
				require.NoError(t, err)
				require.True(t, d.Allowed)
			}
			d, err := b.Allow(ctx, "bytes", 2*gib+5, limit) // b: 2 GiB + 8
			require.NoError(t, err)
			require.True(t, d.Allowed)
			_, err = a.Increment(ctx, "plain", time.Minute, 5*gib)
			require.NoError(t, err)
			_, err = b.Increment(ctx, "plain", time.Minute, -gib)
			require.NoError(t, err)
			for range 2 { // the second sync reads back what the other pushed
				require.NoError(t, a.Sync(ctx))
				require.NoError(t, b.Sync(ctx))
			}
			const total = 11*gib + 11
			// c counts nothing: its counts stay small while the totals it
			// learns (by a cold read, then by a sync) do not.
			for range 2 {
				for _, ns := range []*ratelimit.Namespace{a, b, c} {
					got, err := ns.SlidingWindow(ctx, "bytes", time.Minute)
					require.NoError(t, err)
					require.InDelta(t, float64(total), got, 0, "every node holds the exact total")
					got, err = ns.SlidingWindow(ctx, "plain", time.Minute)
					require.NoError(t, err)
					require.InDelta(t, float64(4*gib), got, 0)
				}
				require.NoError(t, c.Sync(ctx))
			}
			// 9 GiB - 11 bytes are left: 9 GiB does not fit, 9 GiB - 11 does.
			d, err = b.Allow(ctx, "bytes", 9*gib, limit)
			require.NoError(t, err)
			require.False(t, d.Allowed)
			d, err = b.Allow(ctx, "bytes", 9*gib-11, limit)
			require.NoError(t, err)
			require.True(t, d.Allowed)
			require.Zero(t, d.Remaining)
		})
	}
}
