package policy_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit/policy"
)

func TestPenaltyCacheExpires(t *testing.T) {
	var c policy.PenaltyCache
	t0 := time.Unix(1_700_000_000, 0)
	require.Zero(t, c.Get("k", t0))
	c.Put("k", policy.Penalty{CooldownUntil: t0.Add(time.Second), Strikes: 1}, t0)
	require.Equal(t, t0.Add(time.Second), c.Get("k", t0).CooldownUntil)
	c.Put("k", policy.Penalty{CooldownUntil: t0.Add(time.Millisecond)}, t0) // never shrinks
	require.Equal(t, t0.Add(time.Second), c.Get("k", t0).CooldownUntil)
	require.Zero(t, c.Get("k", t0.Add(time.Second)), "expired")

	// Keys never looked up again are swept by later puts.
	for i := range 2048 {
		c.Put(fmt.Sprint(i), policy.Penalty{DenyUntil: t0.Add(time.Second)}, t0.Add(time.Duration(i)*time.Millisecond))
	}
	require.Zero(t, c.Get("0", t0.Add(3*time.Second)))
	require.Equal(t, t0.Add(time.Second), c.Get("2047", t0).DenyUntil)
}

func TestMemoryPenaltiesStrikeWindow(t *testing.T) {
	m := policy.NewMemoryPenalties()
	cfg := &policy.Escalation{StrikeWindow: policy.Duration(time.Minute), MaxCooldown: policy.Duration(time.Hour), DenyFor: policy.Duration(time.Hour)}
	t0 := time.Unix(1_700_000_000, 0)
	ctx := context.Background()
	p, err := m.Reject(ctx, "k", t0, cfg, time.Second)
	require.NoError(t, err)
	require.Zero(t, p.Strikes, "the first rejection is no strike")
	p, _ = m.Reject(ctx, "k", t0.Add(time.Second), cfg, time.Second)
	require.EqualValues(t, 1, p.Strikes)
	// Past the strike window, the count starts again.
	p, _ = m.Reject(ctx, "k", t0.Add(2*time.Minute), cfg, time.Second)
	require.Zero(t, p.Strikes)
	require.Zero(t, p.CooldownUntil, "the old cooldown has expired")
}
