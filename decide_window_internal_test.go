package ratelimit

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratesync/ratelimit/strategy/memory"
	"github.com/stretchr/testify/require"
)

// TestDecideWindowsMatchesGeneralPath: the lean window path gives the general
// path's answers (decision, stored key, window index, errors) on two
// namespaces fed the same random calls: one or two limits (sliding and fixed,
// of one size or two, of one table or two), costs (0, over Max, negative),
// peeks and allows, refunds, clock gaps, unknown windows, keys longer than
// MaxKeyLength and, in periodic mode, cold keys with totals in the store.
func TestDecideWindowsMatchesGeneralPath(t *testing.T) {
	for _, periodic := range []bool{false, true} {
		t.Run(map[bool]string{false: "local", true: "periodic"}[periodic], func(t *testing.T) {
			testDecideWindowsMatches(t, periodic)
		})
	}
}

// leanPair is two namespaces for the lean paths' tests, fed the same calls:
// local, or periodic with cold reads on (the default) on one memory store
// that neither writes to during the test (SyncRate of an hour). In periodic
// mode a third namespace, seeder, writes to the store: see coldKey.
type leanPair struct {
	fast, general, seeder *Namespace
	fresh                 int
}

func newLeanPair(t *testing.T, periodic bool, clock func() time.Time, sizes ...time.Duration) *leanPair {
	ctx := context.Background()
	cfg := Config{WindowSizes: sizes, SyncRate: -1, Clock: clock, MaxKeyLength: 64}
	if periodic {
		cfg.SyncRate, cfg.Strategy = time.Hour, memory.New()
	}
	newNS := func() *Namespace {
		reg := NewRegistry()
		t.Cleanup(func() { _ = reg.Close(ctx) })
		ns, err := reg.New(cfg)
		require.NoError(t, err)
		require.Equal(t, periodic, ns.cold != nil)
		return ns
	}
	p := &leanPair{fast: newNS(), general: newNS()}
	if periodic {
		p.seeder = newNS()
	}
	return p
}

// decideBoth makes call n through the lean path on p.fast and through the
// general path on p.general, and requires the same answers: the Decision,
// the stored key, the window index, the error. It returns the Decision, and
// false when both returned the same error.
func (p *leanPair) decideBoth(t *testing.T, n int, key string, cost int64, limits []Limit, count bool) (Decision, bool) {
	t.Helper()
	ctx := context.Background()
	require.True(t, p.fast.leanWindows(limits), "call %d", n)
	for j := range limits {
		require.True(t, leanLimit(&limits[j]), "call %d", n)
	}
	var gotD, wantD Decision
	gotKey, gotIdx, gotErr := p.fast.decideWindows(ctx, &gotD, key, cost, limits, count && cost > 0)
	wantKey, wantIdx, wantErr := p.general.decideAny(ctx, &wantD, key, cost, limits, count && cost > 0)
	if wantErr != nil {
		require.EqualError(t, gotErr, wantErr.Error(), "call %d", n)
		return wantD, false
	}
	require.NoError(t, gotErr, "call %d", n)
	require.Equal(t, wantD, gotD, "call %d: %+v cost %d count %v", n, limits, cost, count)
	require.Equal(t, wantKey, gotKey)
	require.Equal(t, wantIdx, gotIdx)
	return wantD, true
}

// coldKey returns a key neither namespace has seen. In periodic mode seed
// has first spent on it through the seeder, which pushed that to the store:
// the key's first decision reads those totals (a cold read), and a path
// that skipped the read would answer otherwise.
func (p *leanPair) coldKey(t *testing.T, seed func(seeder *Namespace, key string)) string {
	key := fmt.Sprint("cold-", p.fresh)
	p.fresh++
	if p.seeder != nil {
		seed(p.seeder, key)
		require.NoError(t, p.seeder.Sync(context.Background()))
	}
	return key
}

// leanTestKeys are the keys of the lean paths' tests: many, and one longer
// than MaxKeyLength.
func leanTestKeys() []string {
	keys := []string{"a-key-longer-than-sixty-four-bytes-so-that-the-namespace-stores-its-hash-instead"}
	for i := range 200 {
		keys = append(keys, fmt.Sprint("k", i))
	}
	return keys
}

func testDecideWindowsMatches(t *testing.T, periodic bool) {
	ctx := context.Background()
	var now time.Time
	var clk atomic.Int64 // now, for the namespaces' loops too
	clock := func() time.Time { return time.Unix(0, clk.Load()) }
	sizes := []time.Duration{time.Second, time.Minute, 10 * time.Second} // two tables
	pair := newLeanPair(t, periodic, clock, sizes...)
	fast, general := pair.fast, pair.general
	rng := rand.New(rand.NewPCG(9, 10))
	now = time.UnixMilli(1_700_000_000_000)
	clk.Store(now.UnixNano())
	keys := leanTestKeys()
	limit := func() Limit {
		l := Limit{Window: sizes[rng.IntN(len(sizes))], Max: 1 + rng.Int64N(12)}
		if rng.IntN(3) == 0 {
			l.Algorithm = FixedWindow
		}
		if rng.IntN(60) == 0 {
			l.Window = time.Hour // unknown to the namespaces
		}
		if rng.IntN(80) == 0 {
			l.Max = 0 // invalid
		}
		return l
	}
	var rejected int
	for n := range 200_000 {
		now = now.Add(time.Duration(rng.Int64N(300)) * time.Millisecond)
		clk.Store(now.UnixNano())
		limits := []Limit{limit()}
		if rng.IntN(2) == 0 {
			limits = append(limits, limit())
		}
		key := keys[min(rng.IntN(2*len(keys)), rng.IntN(len(keys)))] // a few keys often, many rarely
		if rng.IntN(50) == 0 {
			key = pair.coldKey(t, func(seeder *Namespace, key string) {
				for _, size := range sizes {
					_, err := seeder.Increment(ctx, key, size, 1+rng.Int64N(6))
					require.NoError(t, err)
				}
			})
		}
		cost := rng.Int64N(6) - 1
		count := rng.IntN(4) != 0
		if rng.IntN(10) == 0 {
			_ = fast.Refund(ctx, key, max(cost, 0), limits...)
			_ = general.Refund(ctx, key, max(cost, 0), limits...)
			continue
		}
		if d, ok := pair.decideBoth(t, n, key, cost, limits, count); ok && !d.Allowed {
			rejected++
		}
	}
	require.Greater(t, rejected, 2_000, "rejections exercised")
}

// TestLeanWindowsTakesOnlyItsCalls: penalties, other algorithms, three
// limits and synchronous mode keep the general path.
func TestLeanWindowsTakesOnlyItsCalls(t *testing.T) {
	ctx := context.Background()
	reg := NewRegistry()
	t.Cleanup(func() { _ = reg.Close(ctx) })
	ns, err := reg.New(Config{WindowSizes: []time.Duration{time.Second}, SyncRate: -1})
	require.NoError(t, err)
	w := Limit{Window: time.Second, Max: 5}
	require.True(t, ns.leanWindows([]Limit{w}))
	require.True(t, ns.leanWindows([]Limit{w, w}))
	require.False(t, ns.leanWindows(nil))
	require.False(t, ns.leanWindows([]Limit{w, w, w}))
	require.True(t, leanLimit(&w))
	require.True(t, leanLimit(&Limit{Window: time.Second, Max: 5, Algorithm: FixedWindow}))
	for _, l := range []Limit{
		{Window: time.Second, Max: 5, Penalty: true},
		{Window: time.Second, Max: 5, Algorithm: TokenBucket},
		{Window: time.Second, Max: 5, Algorithm: SlidingLog},
		{Window: time.Second, Max: 5, Algorithm: Algorithm(99)},
	} {
		require.False(t, leanLimit(&l), "%+v", l)
	}
	// decideWindows hands the call over to the general path: a penalty, a
	// log or a bucket is decided there, a bad algorithm refused there. Two
	// keys, one through each, answer alike call by call, rejections (which
	// a penalty counts) included.
	at := time.UnixMilli(1_700_000_000_250)
	byClock, err := reg.New(Config{Namespace: "by-clock", WindowSizes: []time.Duration{time.Second}, SyncRate: -1, Clock: func() time.Time { return at }})
	require.NoError(t, err)
	small := Limit{Window: time.Second, Max: 3}
	for _, l := range []Limit{
		{Window: time.Second, Max: 2, Penalty: true},
		{Window: time.Second, Max: 2, Algorithm: TokenBucket},
		{Window: time.Second, Max: 2, Algorithm: SlidingLog},
		{Window: time.Second, Max: 2, Algorithm: Algorithm(99)},
	} {
		for n, limits := range [][]Limit{{l}, {small, l}, {l, small}} {
			key := fmt.Sprintf("%v-%d", l, n)
			for call := range 5 {
				var lean, general Decision
				_, _, errLean := byClock.decideWindows(ctx, &lean, "lean-"+key, 1, limits, true)
				_, _, errGeneral := byClock.decideEntered(ctx, &general, "general-"+key, 1, limits, true)
				require.Equal(t, errGeneral, errLean, "%+v call %d", limits, call)
				require.Equal(t, general, lean, "%+v call %d", limits, call)
			}
		}
	}
	mode := ns.mode
	ns.mode = modeSync
	defer func() { ns.mode = mode }() // Close would flush a synchronous namespace
	require.False(t, ns.leanWindows([]Limit{w}))
}
