package node

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit"
	"github.com/ratesync/ratelimit/strategy"
)

// outageSink is a sinkStore that can be taken down: while down, every push
// fails with an unknown outcome, as a timeout against a black-holed server
// would.
type outageSink struct {
	*sinkStore
	down    atomic.Bool
	largest atomic.Int64
}

func (s *outageSink) PushDiffs(ctx context.Context, b *strategy.Batch) (strategy.Result, error) {
	if s.down.Load() {
		return strategy.Result{}, errors.New("sink: down (outcome unknown)")
	}
	n := int64(len(b.Diffs) + len(b.Reads))
	for m := s.largest.Load(); n > m && !s.largest.CompareAndSwap(m, n); m = s.largest.Load() {
	}
	return s.sinkStore.PushDiffs(ctx, b)
}

// A unique-key flood while the store is out (case 3 of the hostile-store
// issue): the heap stays within MaxKeys × the per-key budget + 20% however
// many keys arrive (before, a flood of 2 M keys held 1.99 M retired windows,
// +526 MB, with MaxKeys 10,000); once the store is back every push respects
// the per-push cap, the pending hits drain within 10 cycles, and every hit
// is either in the store or counted as dropped in Stats.
func TestKeyFloodDuringOutage(t *testing.T) {
	noLeaks(t)
	keys, maxKeys := 2_000_000, 10_000
	switch {
	case raceEnabled && heavy():
		keys = 400_000
	case raceEnabled || !heavy():
		keys = 100_000
	}
	const window = time.Minute
	base := int64(1_700_000_000_000) / window.Milliseconds() * window.Milliseconds()
	var now atomic.Int64
	now.Store(base)
	store := &outageSink{sinkStore: newSinkStore()}
	store.down.Store(true)
	baseline := heapInUse()
	reg := ratelimit.NewRegistry()
	ns, err := reg.New(ratelimit.Config{Namespace: "outage-flood", WindowSizes: []time.Duration{time.Second, window},
		SyncRate: floodSyncRate, Strategy: store, MaxKeys: maxKeys,
		Clock: func() time.Time { return time.UnixMilli(now.Load()) }})
	require.NoError(t, err)
	ctx := context.Background()
	limits := []ratelimit.Limit{{Window: time.Second, Max: 100}, {Window: window, Max: 1000}}
	var peak uint64
	key := []byte("flood:")
	for i := range keys {
		now.Store(base + int64(i)*30_000/int64(keys)) // 30 s of outage on the node's clock
		key = strconv.AppendInt(key[:len("flood:")], int64(i), 10)
		_, err := ns.Allow(ctx, string(key), 1, limits...)
		require.NoError(t, err)
		if (i+1)%(keys/10) == 0 {
			h := heapInUse()
			peak = max(peak, h-min(baseline, h))
		}
	}
	during := ns.Stats()
	budget := uint64((maxKeys*floodKeyBudget + floodFixedBudget) * 12 / 10)

	store.down.Store(false)
	syncs := ns.Stats().Syncs
	cycles := 0
	for ; ns.Stats().PendingHits != 0 && cycles < 10; cycles++ {
		_ = ns.Sync(ctx)
	}
	after := ns.Stats()
	require.NoError(t, reg.Close(ctx))
	store.mu.Lock()
	stored := store.flood
	store.mu.Unlock()
	logResult(t, "outage-flood", fmt.Sprintf("%d unique keys during a 30 s outage, MaxKeys %d, race=%v: heap peak %.1f MB = %.0f B per tracked key (budget %.1f MB); retired windows %d, dropped %d hits; after recovery: %d cycles (+%d by the loop) to drain, largest push %d counters; store %d + dropped %d = %d of %d hits",
		keys, maxKeys, raceEnabled, float64(peak)/1e6, float64(peak)/float64(maxKeys), float64(budget)/1e6,
		during.RetiredWindows, during.DroppedHits, cycles, after.Syncs-syncs-int64(cycles), store.largest.Load(),
		stored, after.DroppedHits, stored+after.DroppedHits, 2*keys))
	assert.LessOrEqual(t, peak, budget, "heap within (MaxKeys × %d B + 1 MiB) + 20%%", floodKeyBudget)
	assert.Zero(t, after.PendingHits, "pending hits drained within 10 cycles")
	assert.LessOrEqual(t, store.largest.Load(), int64(2*max(maxKeys/8, 1024)), "a push beyond the per-push cap")
	assert.Equal(t, int64(2*keys), stored+after.DroppedHits, "every hit is in the store or counted as dropped")
}
