package ratefields_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit"
	"github.com/ratesync/ratelimit/internal/ratefields"
)

// newNS is a namespace of this node alone that counts 1 s and 1 min windows.
func newNS(t *testing.T) *ratelimit.Namespace {
	t.Helper()
	reg := ratelimit.NewRegistry()
	t.Cleanup(func() { _ = reg.Close(context.Background()) })
	ns, err := reg.New(ratelimit.Config{WindowSizes: []time.Duration{time.Second, time.Minute}, SyncRate: -1})
	require.NoError(t, err)
	return ns
}

func TestCompile(t *testing.T) {
	ns := newNS(t)
	in := append([]ratelimit.Limit(nil), twoLimits...)
	limits, f, err := ratefields.Compile("pkg: Options", ns, 1, in)
	require.NoError(t, err)
	require.Equal(t, twoLimits, limits)
	require.Equal(t, `"per-second";q=2;w=1, "per-minute";q=3;w=60`, f.Policy)
	in[0].Max = 99 // the rule keeps a copy
	require.Equal(t, int64(2), limits[0].Max)
}

func TestCompileNoLimits(t *testing.T) {
	// An exempt rule: nothing to check, so no namespace is needed.
	limits, f, err := ratefields.Compile("pkg: Options", nil, 1, []ratelimit.Limit{})
	require.NoError(t, err)
	require.Nil(t, limits)
	require.Equal(t, ratefields.Fields{}, f)
}

func TestCompileErrors(t *testing.T) {
	ns := newNS(t)
	_, _, err := ratefields.Compile(`pkg: Options.Rules[0] ("x")`, ns, 1, []ratelimit.Limit{{Window: time.Hour, Max: 1}})
	require.Error(t, err)
	require.True(t, strings.HasPrefix(err.Error(), `pkg: Options.Rules[0] ("x"): Limits: `), err.Error())

	_, _, err = ratefields.Compile("pkg: Options", ns, -1, twoLimits)
	require.ErrorIs(t, err, ratelimit.ErrInvalidCost)
	require.True(t, strings.HasPrefix(err.Error(), "pkg: Options: Limits: "), err.Error())
}
