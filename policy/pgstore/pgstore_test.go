package pgstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/ratesync/ratelimit/policy"
	"github.com/ratesync/ratelimit/policy/storetest"
)

const dsnEnv = "RATELIMIT_TEST_POSTGRES_DSN"

func testDSN(t *testing.T) string {
	t.Helper()
	t.Cleanup(func() { goleak.VerifyNone(t) })
	dsn := os.Getenv(dsnEnv)
	if dsn == "" {
		storetest.SkipOrFail(t, dsnEnv)
	}
	return dsn
}

func newPool(t *testing.T, dsn string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dsn)
	require.NoError(t, err)
	cfg.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// uniqueTable returns a fresh table name, dropped when the test ends.
func uniqueTable(t *testing.T, dsn string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "rlt_policy_" + hex.EncodeToString(b[:])
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			return
		}
		defer conn.Close(ctx)
		_, _ = conn.Exec(ctx, "DROP TABLE IF EXISTS "+name+"_current, "+name)
	})
	return name
}

func TestPostgres(t *testing.T) {
	dsn := testDSN(t)
	storetest.Run(t, func(t *testing.T) storetest.Env {
		table := uniqueTable(t, dsn)
		s, err := New(context.Background(), newPool(t, dsn), Options{Table: table})
		require.NoError(t, err)
		return storetest.Env{
			Store: s,
			// Each node has its own pool, as separate processes would.
			NewNodeStore: func(t *testing.T) policy.Store {
				ns, err := New(context.Background(), newPool(t, dsn), Options{Table: table})
				require.NoError(t, err)
				return ns
			},
			AppendQuietly: func(t *testing.T, doc []byte) int64 {
				n, err := s.append(context.Background(), doc, false)
				require.NoError(t, err)
				return n
			},
		}
	})
}

func TestErrors(t *testing.T) {
	dsn := testDSN(t)
	ctx := context.Background()
	pool := newPool(t, dsn)
	_, err := New(ctx, pool, Options{Table: "bad name"})
	require.Error(t, err)
	s, err := New(ctx, pool, Options{Table: uniqueTable(t, dsn)})
	require.NoError(t, err)
	n, err := s.Current(ctx)
	require.NoError(t, err)
	require.Zero(t, n)
	_, err = s.Get(ctx, 3)
	require.ErrorIs(t, err, policy.ErrNoVersion)
	require.ErrorIs(t, s.SetCurrent(ctx, 3), policy.ErrNoVersion)
}
