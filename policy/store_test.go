package policy_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/ratesync/ratelimit/policy"
	"github.com/ratesync/ratelimit/policy/storetest"
)

func TestMemoryStore(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	storetest.Run(t, func(t *testing.T) storetest.Env {
		m := policy.NewMemoryStore()
		return storetest.Env{Store: m, AppendQuietly: func(t *testing.T, doc []byte) int64 {
			m.SetQuiet(true)
			defer m.SetQuiet(false)
			n, err := m.Append(context.Background(), doc)
			require.NoError(t, err)
			return n
		}}
	})
}

func TestRollbackErrors(t *testing.T) {
	ctx := context.Background()
	m := policy.NewMemoryStore()
	_, err := policy.Rollback(ctx, m)
	require.ErrorIs(t, err, policy.ErrNoVersion)
	_, err = policy.Publish(ctx, m, storetest.Doc(1), nil)
	require.NoError(t, err)
	_, err = policy.Rollback(ctx, m)
	require.ErrorIs(t, err, policy.ErrNoVersion)
	require.ErrorIs(t, m.SetCurrent(ctx, 9), policy.ErrNoVersion)
	_, err = m.Get(ctx, 0)
	require.ErrorIs(t, err, policy.ErrNoVersion)
}
