package ratelimit

import (
	"context"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratesync/ratelimit/shm"
	"github.com/stretchr/testify/require"
)

// TestDecisionWindowsMatchesDecision: the lean path's judgement and
// Decision (admitsWindows, decisionWindows) give the general functions'
// answers (admits, decision) on any views, limits, cost and verdict: with
// the general state laid out as the lean path once did (each limit its own
// owner) and as resolve does (two limits of one window share an owner).
// Views include negative counts and windows behind or ahead of now; ok
// contradicts the judgement on purpose, to reach the branch where a
// rejected call has nothing to wait for.
func TestDecisionWindowsMatchesDecision(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	sizes := []int64{1000, 60000, 7, 1}
	pick := func(n int64) int64 { return rng.Int64N(2*n+1) - n }
	hits := map[string]int{}
	for n := range 100_000 {
		nl := 1 + rng.IntN(2)
		limits := make([]Limit, nl)
		var ws [2]wstate
		var old, gen [2]lstate
		var views [2]shm.View
		now := int64(1_700_000_000_000) + pick(5000)
		for w := range 2 {
			size := sizes[rng.IntN(len(sizes))]
			start := (now/size)*size + size*pick(3)
			views[w] = shm.View{Start: start, Cur: pick(20), Prev: pick(20)}
		}
		var idxs [2]int
		for j := range nl {
			limits[j] = Limit{Window: time.Second, Max: 1 + rng.Int64N(15)}
			switch rng.IntN(3) {
			case 1:
				limits[j].Algorithm = FixedWindow
			case 2:
				limits[j].Fixed = true
			}
			idxs[j] = rng.IntN(2)
			if j == 1 && rng.IntN(2) == 0 {
				idxs[1] = idxs[0] // same window size
			}
		}
		size := [2]int64{sizes[rng.IntN(len(sizes))], sizes[rng.IntN(len(sizes))]}
		for j := range nl {
			w := idxs[j]
			ws[j] = wstate{size: size[w], idx: w, w: w}
			old[j] = lstate{kind: kindWindow, idx: w, size: size[w], owner: j, w: w, v: views[w]}
			owner := j
			if j == 1 && idxs[1] == idxs[0] {
				owner = 0
			}
			gen[j] = lstate{kind: kindWindow, idx: w, size: size[w], owner: owner, w: w}
			if owner == j {
				gen[j].v = views[w]
			}
		}
		cost := rng.Int64N(16)
		counted := rng.IntN(2) == 0
		ok := rng.IntN(2) == 0
		if n%3 == 0 {
			ok = admitsWindows(ws[:nl], &views, limits, now, cost, counted)
		}
		a := admitsWindows(ws[:nl], &views, limits, now, cost, counted)
		require.Equal(t, admits(old[:nl], limits, now, cost, counted), a, "admits old %d", n)
		require.Equal(t, admits(gen[:nl], limits, now, cost, counted), a, "admits gen %d", n)
		var dn, do, dg Decision
		bn := decisionWindows(&dn, ws[:nl], &views, limits, now, cost, ok, counted)
		bo := decision(&do, old[:nl], limits, now, cost, ok, counted)
		bg := decision(&dg, gen[:nl], limits, now, cost, ok, counted)
		require.Equal(t, do, dn, "old %d", n)
		require.Equal(t, bo, bn, "old bind %d", n)
		require.Equal(t, dg, dn, "gen %d", n)
		require.Equal(t, bg, bn, "gen bind %d", n)
		if !ok && dn.RetryAfter == 0 {
			hits["bind<0"]++
		}
		if !ok {
			hits["rejected"]++
		}
	}
	t.Log(hits)
	require.Greater(t, hits["bind<0"], 1000, "the branch with nothing to wait for")
}

// TestDecideWindowsMatchesGeneralPathExtremes is
// TestDecideWindowsMatchesGeneralPath on what it does not draw: the clock
// going back by up to 25 s, negative counts through Increment, Limit.Fixed,
// two limits of one window half the time, and costs and limits near
// MaxValue (wide entries).
func TestDecideWindowsMatchesGeneralPathExtremes(t *testing.T) {
	ctx := context.Background()
	var clk atomic.Int64
	clock := func() time.Time { return time.Unix(0, clk.Load()) }
	sizes := []time.Duration{time.Second, time.Minute, 10 * time.Second}
	for _, periodic := range []bool{false, true} {
		pair := newLeanPair(t, periodic, clock, sizes...)
		fast, general := pair.fast, pair.general
		rng := rand.New(rand.NewPCG(3, 4))
		now := time.UnixMilli(1_700_000_000_000)
		clk.Store(now.UnixNano())
		keys := []string{"a", "b", "c", "d"}
		var admitted, rejected, wide, back int
		for n := range 50_000 {
			step := time.Duration(rng.Int64N(300)) * time.Millisecond
			if rng.IntN(8) == 0 {
				step = -time.Duration(rng.Int64N(25_000)) * time.Millisecond
				back++
			}
			now = now.Add(step)
			clk.Store(now.UnixNano())
			big := rng.IntN(20) == 0
			limit := func() Limit {
				l := Limit{Window: sizes[rng.IntN(len(sizes))], Max: 1 + rng.Int64N(12)}
				if big {
					l.Max = MaxValue - rng.Int64N(3)
				}
				switch rng.IntN(3) {
				case 1:
					l.Algorithm = FixedWindow
				case 2:
					l.Fixed = true
				}
				return l
			}
			limits := []Limit{limit()}
			if rng.IntN(2) == 0 {
				l := limit()
				if rng.IntN(2) == 0 {
					l.Window = limits[0].Window
				}
				limits = append(limits, l)
			}
			key := keys[rng.IntN(len(keys))]
			cost := rng.Int64N(6)
			if big {
				cost = MaxValue / (1 + rng.Int64N(3))
			}
			count := rng.IntN(4) != 0
			switch rng.IntN(12) {
			case 0:
				v := -rng.Int64N(8)
				if big {
					v = -MaxValue / 2
				}
				w := sizes[rng.IntN(len(sizes))]
				_, e1 := fast.Increment(ctx, key, w, v)
				_, e2 := general.Increment(ctx, key, w, v)
				require.Equal(t, e1, e2)
				continue
			case 1:
				_ = fast.Refund(ctx, key, cost, limits...)
				_ = general.Refund(ctx, key, cost, limits...)
				continue
			}
			d, ok := pair.decideBoth(t, n, key, cost, limits, count)
			switch {
			case !ok:
			case !d.Allowed:
				rejected++
			case big:
				wide++
			default:
				admitted++
			}
		}
		t.Logf("periodic %v: admitted %d (near MaxValue %d), rejected %d, clock back %d", periodic, admitted, wide, rejected, back)
		require.Greater(t, admitted, 1_000, "admissions exercised")
		require.Greater(t, rejected, 1_000, "rejections exercised")
		require.Positive(t, wide, "costs near MaxValue admitted: wide counts exercised")
		require.Greater(t, back, 1_000, "the clock went back")
	}
}
