package store

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit"
	"github.com/ratesync/ratelimit/strategy/memory"
)

// Stats.PendingHits tells an operator how many hits wait for the store. In
// periodic mode it counted only write-throughs in flight, so it stayed 0
// while a push of unknown outcome held hits during an outage.
func TestPendingHitsInPeriodicMode(t *testing.T) {
	noLeaks(t)
	store := memory.New()
	reg := ratelimit.NewRegistry()
	// SyncRate of an hour: the test runs the only cycle itself.
	ns, err := reg.New(ratelimit.Config{Namespace: "pending", WindowSizes: []time.Duration{time.Minute},
		SyncRate: time.Hour, Strategy: store})
	require.NoError(t, err)
	t.Cleanup(func() { _ = reg.Close(context.Background()) })
	ctx := context.Background()
	for range 5 {
		_, err := ns.Increment(ctx, "k", time.Minute, 1)
		require.NoError(t, err)
	}
	store.SetFaults(func(memory.Op) memory.Fault { return memory.LoseRequest }) // outcome unknown
	require.ErrorIs(t, ns.Sync(ctx), ratelimit.ErrStoreUnavailable)
	st := ns.Stats()
	require.Equal(t, 1, st.UnresolvedPushes, "the push is kept, to be re-sent")
	assert.Equal(t, int64(5), st.PendingHits, "the unresolved push holds 5 hits")
	store.SetFaults(nil)
	require.NoError(t, ns.Sync(ctx))
	assert.Zero(t, ns.Stats().PendingHits)
}
