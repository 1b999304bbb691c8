package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/ratesync/ratelimit/strategy"
	"github.com/ratesync/ratelimit/strategy/memory"
	"github.com/ratesync/ratelimit/strategy/strategytest"
)

// TestService: the routes and limits the startup message promises.
func TestService(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	now := time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)
	for _, syncRate := range []time.Duration{0, 100 * time.Millisecond} {
		h, closeNS, err := newHandler(memory.New(), syncRate, func() time.Time { return now }, slog.New(slog.DiscardHandler))
		require.NoError(t, err)
		srv := httptest.NewServer(h)
		codes := func(path string, n int) []int {
			var out []int
			for range n {
				resp, err := http.Get(srv.URL + path)
				require.NoError(t, err)
				resp.Body.Close()
				out = append(out, resp.StatusCode)
			}
			return out
		}
		require.Equal(t, []int{200, 200, 200, 200, 200, 200, 200}, codes("/healthz", 7), "the readiness probe is not limited")
		require.Equal(t, []int{200, 200, 200, 200, 200, 429, 429}, codes("/search", 7))
		require.Equal(t, []int{200, 200, 200, 429}, codes("/hello", 4))
		require.Equal(t, []int{429}, codes("/hello", 1))

		// The metrics show the decisions by policy, outside the limiter.
		resp, err := http.Get(srv.URL + "/metrics")
		require.NoError(t, err)
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, err)
		require.Equal(t, 200, resp.StatusCode)
		require.Contains(t, string(body), `ratelimit_policy_decisions_total{decision="rejected",degraded="false",namespace="example-http",policy="search"} 2`)
		require.Contains(t, string(body), `ratelimit_policy_decisions_total{decision="allowed",degraded="false",namespace="example-http",policy="search"} 5`)
		require.Contains(t, string(body), `ratelimit_retry_after_seconds_count{namespace="example-http",policy="search"} 2`)
		require.Contains(t, string(body), `ratelimit_hottest_key_checks_per_second{namespace="example-http"}`)
		resp, err = http.Get(srv.URL + "/debug/ratelimit/hotkeys?n=1")
		require.NoError(t, err)
		body, err = io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, err)
		require.Contains(t, string(body), `"key":"GET /search\u0000ip:127.0.0.1","count":7`)
		srv.Close()
		require.NoError(t, closeNS(context.Background()))
	}
}

// -redis-db and -redis-prefix decide where the counters go.
func TestOpenStoreRedisFlags(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	mr := miniredis.RunT(t)
	st, closeStore, err := openStore(context.Background(), storeFlags{name: "redis", redisAddr: mr.Addr(), redisDB: 3, redisPrefix: "myapp"})
	require.NoError(t, err)
	defer closeStore()
	hitSearch(t, st, 0)
	require.Empty(t, mr.DB(0).Keys(), "nothing in DB 0")
	keys := mr.DB(3).Keys()
	require.NotEmpty(t, keys)
	for _, k := range keys {
		require.True(t, strings.HasPrefix(k, "myapp:"), k)
	}
}

// -postgres-schema and -postgres-table decide where the counters go.
func TestOpenStorePostgresFlags(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	dsn := os.Getenv("RATELIMIT_TEST_POSTGRES_DSN")
	if dsn == "" {
		strategytest.SkipOrFail(t, "RATELIMIT_TEST_POSTGRES_DSN")
	}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dsn)
	require.NoError(t, err)
	defer pool.Close()
	schema := fmt.Sprintf("example_http_%d", time.Now().UnixNano())
	_, err = pool.Exec(ctx, "CREATE SCHEMA "+schema)
	require.NoError(t, err)
	defer func() { _, _ = pool.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE") }()

	st, closeStore, err := openStore(ctx, storeFlags{name: "postgres", postgresDSN: dsn, postgresSchema: schema, postgresTable: "limits"})
	require.NoError(t, err)
	hitSearch(t, st, 0)
	closeStore()
	var n int64
	require.NoError(t, pool.QueryRow(ctx, "SELECT sum(count)::bigint FROM "+schema+".limits").Scan(&n))
	require.Equal(t, int64(1), n, "the one GET /search, counted in %s.limits", schema)
}

// hitSearch sends one GET /search through a handler on st, synchronously
// (syncRate 0 writes it through to the store).
func hitSearch(t *testing.T, st strategy.Strategy, syncRate time.Duration) {
	t.Helper()
	h, closeNS, err := newHandler(st, syncRate, nil, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/search", nil))
	require.Equal(t, http.StatusOK, rec.Code)
	require.NoError(t, closeNS(context.Background()))
}
