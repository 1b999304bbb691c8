package ratelimit_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit"
	"github.com/ratesync/ratelimit/strategy/memory"
)

// A caller whose context cannot end, cold in a token bucket and in a
// window, while another caller's window read is in flight: its bucket
// lane is free, so it sends the bucket read inline (up to SyncTimeout),
// and only then starts the SyncTimeout timer for its window key queued
// behind the read in flight. On a store answering every read in
// 0.8 × SyncTimeout the call waited 1.6 × SyncTimeout, not degraded. A
// caller now sends inline only a read that is all it waits for.
func TestInlineSendThenQueuedWaitPastSyncTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const timeout = 100 * time.Millisecond
		mem := memory.New()
		store := &coldGate{Strategy: mem, delay: timeout * 8 / 10}
		_, b := coldNodes(t, mem, store, timeout)
		var wg sync.WaitGroup
		wg.Go(func() { _, _ = b.Allow(context.Background(), "first", 1, coldWindowLimit) }) // window read in flight
		synctest.Wait()
		start := time.Now()
		d, err := b.Allow(context.Background(), "client", 1, coldBucketLimit, coldWindowLimit)
		took := time.Since(start)
		require.NoError(t, err)
		wg.Wait()
		t.Logf("waited %v (SyncTimeout %v), degraded %v; %d window reads, %d bucket reads", took, timeout, d.Degraded,
			store.winReads.Load(), store.bktReads.Load())
		require.LessOrEqual(t, took, timeout, "one call waited past SyncTimeout")
	})
}

// One lane failing set the reader's shared down flag, so the other lane's
// callers did not wait: with bucket reads refused and window reads healthy,
// each window key a client spent on node A was admitted on B (Degraded)
// right after a failed bucket read, against the docs: "one kind's slow or
// failing read neither delays nor fails the other's keys". Each lane has
// its own down flag now.
func TestBucketLaneDownDegradesWindows(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const clients = 5
		mem := memory.New()
		store := &coldGate{Strategy: mem, failBuckets: true}
		a, b := coldNodes(t, mem, store, time.Second)
		for i := range clients {
			require.Equal(t, 5, allowed(t, a, fmt.Sprintf("client%d", i), 5, coldWindowLimit))
		}
		require.NoError(t, a.Sync(context.Background()))
		ctx := context.Background()
		admitted, degraded := 0, 0
		for i := range clients {
			_, _ = b.Allow(ctx, fmt.Sprintf("bkt%d", i), 1, coldBucketLimit) // its read is refused
			synctest.Wait()
			d, err := b.Allow(ctx, fmt.Sprintf("client%d", i), 1, coldWindowLimit)
			require.NoError(t, err)
			synctest.Wait()
			if d.Allowed {
				admitted++
			}
			if d.Degraded {
				degraded++
			}
		}
		t.Logf("%d of %d spent window clients admitted (%d degraded); %d window reads (all answered), %d bucket reads (refused)",
			admitted, clients, degraded, store.winReads.Load(), store.bktReads.Load())
		require.Zero(t, admitted, "window reads are healthy; the bucket lane's failure admitted spent clients")
	})
}

var _ = ratelimit.Limit{}
