package ratelimit

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit/shm"
)

// bruteRetry scans every millisecond for the first instant a request fits.
func bruteRetry(v shm.View, size, now, cost int64, l Limit) int64 {
	for t := now; ; t++ {
		if fits(project(v, size, t), size, t, cost, &l) {
			return t - now
		}
	}
}

func checkRetry(t *testing.T, v shm.View, size, now, cost int64, l Limit) {
	t.Helper()
	got := retryAfter(v, size, now, cost, &l)
	if want := bruteRetry(v, size, now, cost, l); got != want {
		t.Fatalf("retryAfter(%+v, size %d, now %d, cost %d, %+v) = %d, want %d", v, size, now, cost, l, got, want)
	}
	// The load never grows without hits: the answer stays admitted after.
	for _, d := range []int64{1, 7, size / 3, size, 2 * size} {
		if tt := now + got + d; !fits(project(v, size, tt), size, tt, cost, &l) {
			t.Fatalf("rejected again %d ms after RetryAfter: %+v size %d now %d cost %d %+v", d, v, size, now, cost, l)
		}
	}
}

func TestRetryAfterMatchesBruteForce(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for range 20000 {
		size := 1 + rng.Int64N(400)
		start := (rng.Int64N(1<<40) / size) * size
		now := start + rng.Int64N(size)
		l := Limit{Max: 1 + rng.Int64N(40), Fixed: rng.IntN(4) == 0}
		cost := rng.Int64N(l.Max + 1)
		v := shm.View{Start: start, Cur: rng.Int64N(60) - 5, Prev: rng.Int64N(60) - 5}
		checkRetry(t, v, size, now, cost, l)
	}
}

// TestResetAfter: at Reset the load is 0, a millisecond before it is not.
func TestResetAfter(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for range 20000 {
		size := 1 + rng.Int64N(400)
		start := (rng.Int64N(1<<40) / size) * size
		now := start + rng.Int64N(size)
		fixed := rng.IntN(3) == 0
		v := shm.View{Start: start, Cur: rng.Int64N(4), Prev: rng.Int64N(4)}
		r := resetAfter(v, size, now, fixed)
		if got := load(project(v, size, now+r), size, now+r, 0, fixed); got != 0 {
			t.Fatalf("load %v at reset %d: %+v size %d now %d fixed %v", got, r, v, size, now, fixed)
		}
		if r > 0 {
			if got := load(project(v, size, now+r-1), size, now+r-1, 0, fixed); got == 0 {
				t.Fatalf("load 0 before reset %d: %+v size %d now %d fixed %v", r, v, size, now, fixed)
			}
		}
	}
}

func FuzzRetryAfter(f *testing.F) {
	f.Add(int64(1000), int64(230), int64(25), int64(45), int64(25), int64(11), false)
	f.Add(int64(60000), int64(59999), int64(0), int64(1), int64(1), int64(1), true)
	f.Fuzz(func(t *testing.T, size, offset, cur, prev, max, cost int64, fixed bool) {
		if size <= 0 || size > 5000 || max <= 0 || max > 1<<20 || cost < 0 || cost > max ||
			cur < -1<<20 || cur > 1<<20 || prev < -1<<20 || prev > 1<<20 {
			return
		}
		start := int64(1_700_000_000_000) / size * size
		now := start + ((offset%size)+size)%size
		checkRetry(t, shm.View{Start: start, Cur: cur, Prev: prev}, size, now, cost, Limit{Max: max, Fixed: fixed})
	})
}

func TestApplyLocalManyLimitsCountsOnce(t *testing.T) {
	reg := NewRegistry()
	ns, err := reg.New(Config{WindowSizes: []time.Duration{time.Second, time.Minute, time.Hour}, SyncRate: -1})
	require.NoError(t, err)
	limits := make([]Limit, 0, 100)
	for i := range 100 {
		limits = append(limits, Limit{Window: []time.Duration{time.Second, time.Minute, time.Hour}[i%3], Max: 1000})
	}
	d, err := ns.Allow(context.Background(), "k", 1, limits...)
	require.NoError(t, err)
	require.True(t, d.Allowed)
	for _, w := range []time.Duration{time.Second, time.Minute, time.Hour} {
		r, err := ns.SlidingWindow(context.Background(), "k", w)
		require.NoError(t, err)
		require.Equal(t, 1.0, r, "a hit counts once per window however many limits name it (%v)", w)
	}
}
