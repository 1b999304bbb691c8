package ratefields_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit"
	"github.com/ratesync/ratelimit/internal/ratefields"
	"github.com/ratesync/ratelimit/policy"
)

func TestCheckPolicyOptions(t *testing.T) {
	p := policy.NewHolder(nil)
	limits := []ratelimit.Limit{{Window: time.Second, Max: 1}}
	require.NoError(t, ratefields.CheckPolicyOptions("pkg", p, nil, 0, 0))
	require.EqualError(t, ratefields.CheckPolicyOptions("pkg", nil, nil, 0, 0), "pkg: PolicyOptions.Policy is required")
	const fromPolicy = "pkg: PolicyOptions: Limits, Rules and Cost come from the policy and must be empty"
	require.EqualError(t, ratefields.CheckPolicyOptions("pkg", p, limits, 0, 0), fromPolicy)
	require.EqualError(t, ratefields.CheckPolicyOptions("pkg", p, nil, 1, 0), fromPolicy)
	require.EqualError(t, ratefields.CheckPolicyOptions("pkg", p, nil, 0, 1), fromPolicy)
	// The policy is checked first.
	require.EqualError(t, ratefields.CheckPolicyOptions("pkg", nil, limits, 1, 1), "pkg: PolicyOptions.Policy is required")
}
