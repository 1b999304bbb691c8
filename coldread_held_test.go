package ratelimit_test

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit"
	"github.com/ratesync/ratelimit/strategy"
	"github.com/ratesync/ratelimit/strategy/memory"
)

// Attacks on the cold read that held (regression tests; they pass).

func storeTotal(t *testing.T, mem *memory.Store, key string, at time.Time) int64 {
	t.Helper()
	n, err := mem.GetWindow(context.Background(), "default", strategy.CounterID{Key: key, Size: time.Minute,
		Start: strategy.WindowStart(at.UnixMilli(), time.Minute)})
	require.NoError(t, err)
	return n
}

// A cold read in flight while a caller that stopped waiting counts the key
// and a sync pushes and settles that hit: whichever lands first, the read's
// older total does not overwrite the settled one, no hit is counted twice in
// the view, and the store ends with every admitted hit once.
func TestColdReadRacesSyncPush(t *testing.T) {
	for _, syncFirst := range []bool{true, false} {
		t.Run(map[bool]string{true: "sync settles first", false: "read lands first"}[syncFirst], func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				lim := ratelimit.Limit{Window: time.Minute, Max: 5, Algorithm: ratelimit.FixedWindow}
				mem := memory.New()
				store := &gatedReads{Strategy: mem}
				clk := &fakeClock{t: minute.Add(10 * time.Second)}
				cfg := ratelimit.Config{WindowSizes: []time.Duration{time.Minute}, SyncRate: time.Hour,
					SyncTimeout: time.Hour, Strategy: store, Clock: clk.Now}
				regA, regB := ratelimit.NewRegistry(), ratelimit.NewRegistry()
				a, err := regA.New(cfg)
				require.NoError(t, err)
				b, err := regB.New(cfg)
				require.NoError(t, err)
				spend(t, a, "client", 3, lim)

				release := store.arm()
				first := make(chan ratelimit.Decision, 1)
				go func() {
					d, err := b.Allow(context.Background(), "client", 1, lim)
					require.NoError(t, err)
					first <- d
				}()
				synctest.Wait()
				cctx, cancel := context.WithCancel(context.Background())
				second := make(chan ratelimit.Decision, 1)
				go func() {
					d, _ := b.Allow(cctx, "client", 1, lim)
					second <- d
				}()
				synctest.Wait()
				cancel()
				d2 := <-second
				require.True(t, d2.Allowed && d2.Degraded)
				if syncFirst {
					require.NoError(t, b.Sync(context.Background())) // pushes the hit, learns 4
					close(release)
				} else {
					close(release)
				}
				d1 := <-first
				require.True(t, d1.Allowed, "3 + 1 + 1 = 5")
				require.Equal(t, int64(0), d1.Remaining)
				d, err := b.Allow(context.Background(), "client", 1, lim)
				require.NoError(t, err)
				require.False(t, d.Allowed, "the sixth is rejected")
				require.NoError(t, b.Sync(context.Background()))
				require.Equal(t, int64(5), storeTotal(t, mem, "client", clk.Now()))
				require.NoError(t, regA.Close(context.Background()))
				require.NoError(t, regB.Close(context.Background()))
				require.Equal(t, int64(5), storeTotal(t, mem, "client", clk.Now()))
			})
		})
	}
}

// Two window sizes in different tables: the cold key is read for both in
// one round trip, and both limits see the other node's hits.
func TestColdTwoTablesOneRead(t *testing.T) {
	leakCheck(t)
	store := &readCountingStore{Strategy: memory.New()}
	clk := &fakeClock{t: minute.Add(10 * time.Second)}
	cfg := ratelimit.Config{WindowSizes: []time.Duration{time.Second, time.Minute, time.Hour, 24 * time.Hour},
		SyncRate: time.Hour, Strategy: store, Clock: clk.Now}
	a, b := newNS(t, cfg), newNS(t, cfg)
	perMin := ratelimit.Limit{Window: time.Minute, Max: 100}
	perHour := ratelimit.Limit{Window: time.Hour, Max: 5}
	for range 5 {
		d, err := a.Allow(ctx, "client", 1, perMin, perHour)
		require.NoError(t, err)
		require.True(t, d.Allowed)
	}
	require.NoError(t, a.Sync(ctx))
	reads := store.reads.Load()
	d, err := b.Allow(ctx, "client", 1, perMin, perHour)
	require.NoError(t, err)
	require.False(t, d.Allowed)
	require.Equal(t, perHour, d.Limit)
	require.Equal(t, reads+1, store.reads.Load(), "one read for both tables")
	// And a mixed call: a token bucket and a window, both cold.
	bucket := ratelimit.Limit{Window: time.Minute, Max: 3, Algorithm: ratelimit.TokenBucket}
	cfg.Strategy = memory.New() // readCountingStore hides the bucket capability
	a, b = newNS(t, cfg), newNS(t, cfg)
	for range 3 {
		d, err := a.Allow(ctx, "mixed", 1, bucket, perHour)
		require.NoError(t, err)
		require.True(t, d.Allowed)
	}
	require.NoError(t, a.Sync(ctx))
	d, err = b.Allow(ctx, "mixed", 1, bucket, perHour)
	require.NoError(t, err)
	require.False(t, d.Allowed, "B read A's bucket")
}

// Close while a cold read is in flight and another key is queued behind it:
// both callers are released, their hits reach the store once, and no
// goroutine outlives the bubble.
func TestColdCloseDuringRead(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		lim := ratelimit.Limit{Window: time.Minute, Max: 5}
		mem := memory.New()
		store := &gatedReads{Strategy: mem}
		clk := &fakeClock{t: minute.Add(10 * time.Second)}
		reg := ratelimit.NewRegistry()
		ns, err := reg.New(ratelimit.Config{WindowSizes: []time.Duration{time.Minute}, SyncRate: time.Hour,
			SyncTimeout: time.Hour, Strategy: store, Clock: clk.Now})
		require.NoError(t, err)
		store.arm()
		done := make(chan ratelimit.Decision, 3)
		for _, k := range []string{"k1", "k2", "k2"} {
			go func() {
				d, err := ns.Allow(context.Background(), k, 1, lim)
				require.NoError(t, err)
				done <- d
			}()
			synctest.Wait()
		}
		require.NoError(t, reg.Close(context.Background()))
		for range 3 {
			d := <-done
			require.True(t, d.Allowed && d.Degraded)
		}
		require.Equal(t, int64(1), storeTotal(t, mem, "k1", clk.Now()))
		require.Equal(t, int64(2), storeTotal(t, mem, "k2", clk.Now()))
	})
}

// A push whose reply is lost (applied, outcome unknown), then the key is
// evicted and read cold again while that push is unresolved: the read sees
// the applied hit, the new entry does not count it again, and once the push
// is re-sent (deduplicated) the store holds every admitted hit once.
func TestColdReadAfterLostReplyAndEviction(t *testing.T) {
	leakCheck(t)
	lim := ratelimit.Limit{Window: time.Minute, Max: 5, Algorithm: ratelimit.FixedWindow}
	mem := memory.New()
	clk := &fakeClock{t: minute.Add(10 * time.Second)}
	ns := newNS(t, ratelimit.Config{WindowSizes: []time.Duration{time.Minute}, SyncRate: time.Hour,
		Strategy: mem, Clock: clk.Now, MaxKeys: 1})
	admitted := 0
	allow := func(key string) ratelimit.Decision {
		d, err := ns.Allow(ctx, key, 1, lim)
		require.NoError(t, err)
		if d.Allowed && key == "client" {
			admitted++
		}
		return d
	}
	allow("client")
	mem.SetFaults(func(op memory.Op) memory.Fault {
		if op == memory.OpPush {
			return memory.LoseReply
		}
		return memory.NoFault
	})
	_ = ns.Sync(ctx) // applied, reply lost
	mem.SetFaults(nil)
	allow("other") // MaxKeys 1: "client" leaves
	// The failed cycle marks the store down, so this read is usually not
	// waited for (Degraded, documented); when the eviction's early cycle
	// already re-sent the push, it is.
	d := allow("client")
	if !d.Degraded {
		require.Equal(t, int64(3), d.Remaining, "the read saw the applied hit, counted once: 5 - 2")
	}
	for range 5 {
		allow("client")
	}
	require.NoError(t, ns.Sync(ctx))
	require.NoError(t, ns.Sync(ctx))
	require.Equal(t, int64(admitted), storeTotal(t, mem, "client", clk.Now()), "every admitted hit once")
	d = allow("client")
	require.False(t, d.Allowed)
}
