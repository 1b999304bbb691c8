package policy_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit/policy"
)

func TestDiff(t *testing.T) {
	a, err := policy.Parse([]byte(`
default: {limits: [{window: 1m, max: 100}]}
rules:
  - {id: pro, match: {tier: pro}, limits: [{window: 1m, max: 1000}]}
  - {id: old, match: {route: /old}, limits: [{window: 1m, max: 1}]}
overrides: {k1: {limits: [{window: 1m, max: 5}]}}
allow: [a]
deny: {keys: [x]}
`))
	require.NoError(t, err)
	b, err := policy.Parse([]byte(`
default: {limits: [{window: 1m, max: 100}]}
rules:
  - {id: pro, match: {tier: pro}, limits: [{window: 1m, max: 500}]}
  - {id: new, match: {route: /new}, limits: [{window: 1m, max: 1}]}
overrides: {k2: {limits: [{window: 1m, max: 5}]}}
allow: [a, b]
deny: {keys: [x], status: 429}
`))
	require.NoError(t, err)
	require.Empty(t, policy.Diff(a, a))
	require.Equal(t, []string{
		`+ rule "new": {"id":"new","match":{"route":"/new"},"limits":[{"window":"1m0s","max":1}]}`,
		`- rule "old": {"id":"old","match":{"route":"/old"},"limits":[{"window":"1m0s","max":1}]}`,
		`~ rule "pro": {"id":"pro","match":{"tier":"pro"},"limits":[{"window":"1m0s","max":1000}]} -> {"id":"pro","match":{"tier":"pro"},"limits":[{"window":"1m0s","max":500}]}`,
		`- override "k1": {"limits":[{"window":"1m0s","max":5}]}`,
		`+ override "k2": {"limits":[{"window":"1m0s","max":5}]}`,
		`+ allow "b"`,
		`+ deny.status: 429`,
	}, policy.Diff(a, b))
}
