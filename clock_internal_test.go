package ratelimit

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
)

func TestTickClockFollowsTimeNow(t *testing.T) {
	c := newTickClock()
	defer c.close()
	for range 1000 {
		before := time.Now().UnixMilli()
		got := c.unixMilli()
		after := time.Now().UnixMilli()
		// Never ahead; behind by a tick, or by however long the tick
		// goroutine is starved of a core (a loaded machine running the
		// race detector: tens of milliseconds). The exact lag is checked
		// under synctest (TestTickClockIdlesAndWakes).
		require.GreaterOrEqual(t, got, before-time.Second.Milliseconds())
		require.LessOrEqual(t, got, after)
	}
}

// The tick goroutine runs while the clock is read, stops after idleTicks
// without a read, and a read after that reads the time itself and starts it
// again; close stops it for good.
func TestTickClockIdlesAndWakes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newTickClock()
		defer c.close()
		require.Equal(t, time.Now().UnixMilli(), c.unixMilli())
		require.True(t, c.on.Load())
		time.Sleep(10 * time.Millisecond)
		// The tick of this very instant may run after this goroutine wakes.
		require.InDelta(t, time.Now().UnixMilli(), c.unixMilli(), 1, "ticks keep it current")
		time.Sleep(time.Hour) // no read: the goroutine ends after idleTicks
		synctest.Wait()
		require.False(t, c.on.Load())
		require.Equal(t, time.Now().UnixMilli(), c.unixMilli(), "a read after the idle reads the time itself")
		require.True(t, c.on.Load())
		c.close()
		require.False(t, c.on.Load())
		time.Sleep(time.Second)
		require.Equal(t, time.Now().UnixMilli(), c.unixMilli(), "closed: every read reads the time")
		require.False(t, c.on.Load())
	})
}

// A tick never moves the clock back past a reading stored meanwhile, unless
// the wall clock stepped back by a second or more.
func TestTickClockStore(t *testing.T) {
	c := newTickClock()
	defer c.close()
	now := c.ms.Load()
	require.Equal(t, now+5, c.store(now+5))
	require.Equal(t, now+5, c.store(now+4), "a late tick")
	require.Equal(t, now-5000, c.store(now-5000), "a step back")
}

// Config.clock picks the system clock when Clock is nil, whether normalize
// ran before it or not, and Config.Clock's reading otherwise.
func TestConfigClockIndependentOfNormalize(t *testing.T) {
	for _, normalizeFirst := range []bool{true, false} {
		cfg := Config{WindowSizes: []time.Duration{time.Second}, SyncRate: -1}
		if normalizeFirst {
			if err := cfg.normalize(); err != nil {
				t.Fatal(err)
			}
		}
		ms, tick := cfg.clock()
		if tick != nil {
			defer tick.close()
		}
		if cfg.Clock == nil {
			t.Fatal("Clock not filled in")
		}
		if d := time.Now().UnixMilli() - ms(); d < -1000 || d > 1000 {
			t.Fatalf("normalize first %v: the default clock is %d ms off", normalizeFirst, d)
		}

		fixed := time.UnixMilli(1_700_000_000_123)
		cfg = Config{WindowSizes: []time.Duration{time.Second}, SyncRate: -1, Clock: func() time.Time { return fixed }}
		if normalizeFirst {
			if err := cfg.normalize(); err != nil {
				t.Fatal(err)
			}
		}
		ms, tick = cfg.clock()
		if tick != nil {
			t.Fatal("an injected clock needs no tick clock")
		}
		if got := ms(); got != fixed.UnixMilli() {
			t.Fatalf("normalize first %v: clock() = %d, want the injected %d", normalizeFirst, got, fixed.UnixMilli())
		}
	}
}
