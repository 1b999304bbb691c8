package pginstance_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit/internal/pginstance"
)

// A server started, crashed and restarted keeps committed rows.
func TestStartCrashRestart(t *testing.T) {
	start := time.Now()
	s := pginstance.Start(t)
	t.Logf("initdb + start took %v", time.Since(start).Round(time.Millisecond))
	s.Exec("", "CREATE TABLE t (v int)", "INSERT INTO t VALUES (42)")
	start = time.Now()
	s.Stop("immediate")
	s.Restart()
	t.Logf("crash + restart took %v", time.Since(start).Round(time.Millisecond))
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, s.DSN(""))
	require.NoError(t, err)
	defer conn.Close(ctx)
	var v int
	require.NoError(t, conn.QueryRow(ctx, "SELECT v FROM t").Scan(&v))
	require.Equal(t, 42, v)
}
