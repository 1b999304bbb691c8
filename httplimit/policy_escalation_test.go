package httplimit_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/jackc/pgx/v5/pgxpool"
	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit"
	"github.com/ratesync/ratelimit/httplimit"
	"github.com/ratesync/ratelimit/policy"
	"github.com/ratesync/ratelimit/policy/pgstore"
	"github.com/ratesync/ratelimit/policy/redisstore"
	"github.com/ratesync/ratelimit/policy/storetest"
)

const escalationPolicy = `
default: {limits: [{window: 1s, max: 2}]}
escalation: {strike_window: 1m, max_cooldown: 8s, deny_after: 4, deny_for: 1m}
`

// escalationNodes returns two nodes (each its own namespace, so only the
// penalties are shared) on one clock. The penalties are made after the
// namespaces, so that the leak checks run after their cleanups.
func escalationNodes(t *testing.T, clk *clock, mk func() [2]policy.Penalties) [2]http.Handler {
	t.Helper()
	s, err := policy.Load([]byte(escalationPolicy), 1, policy.Options{})
	require.NoError(t, err)
	nss := [2]*ratelimit.Namespace{}
	for i := range nss {
		nss[i], _ = newNS(t, "local", clk)
	}
	var nodes [2]http.Handler
	for i, pen := range mk() {
		ns := nss[i]
		l, err := httplimit.NewWithPolicy(httplimit.PolicyOptions{
			Options:   httplimit.Options{Namespace: ns, KeyFunc: httplimit.KeyByHeader("X-Key"), Clock: clk.Now, Logger: slog.New(slog.DiscardHandler)},
			Policy:    policy.NewHolder(s),
			Penalties: pen,
		})
		require.NoError(t, err)
		nodes[i] = l.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	}
	return nodes
}

func send(h http.Handler, key string) (int, string) {
	r := httptest.NewRequest("GET", "/", nil)
	r.Header.Set("X-Key", key)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w.Code, w.Header().Get("Retry-After")
}

// testEscalation drives one client across two nodes: its cooldown doubles
// with each request sent while told to wait, whichever node gets it, then it
// is denied on both; both expire by themselves. learned waits until node B
// knows the penalty node A recorded.
func testEscalation(t *testing.T, clk *clock, nodes [2]http.Handler, learned func(until time.Time)) {
	a, b := nodes[0], nodes[1]
	code, _ := send(a, "c")
	require.Equal(t, 200, code)
	code, _ = send(a, "c")
	require.Equal(t, 200, code)
	code, ra := send(a, "c") // over the limit: told to wait (the sliding window's 1.5 s), no strike yet
	require.Equal(t, 429, code)
	require.Equal(t, "2", ra)
	code, ra = send(a, "c") // strike 1: a cooldown of the window, 1 s (the limit's own wait is longer)
	require.Equal(t, 429, code)
	require.Equal(t, "2", ra)
	learned(clk.Now().Add(time.Second))

	// Node B has counted nothing for c, yet it knows the cooldown; another
	// request there is strike 2: 2 s.
	code, ra = send(b, "c")
	require.Equal(t, 429, code)
	require.Equal(t, "2", ra)
	code, ra = send(a, "c") // strike 3: 4 s
	require.Equal(t, 429, code)
	require.Equal(t, "4", ra)
	learned(clk.Now().Add(4 * time.Second))
	// Strike 4 reaches deny_after: denied for a minute, on both nodes.
	code, ra = send(b, "c")
	require.Equal(t, 429, code)
	require.Equal(t, "8", ra, "capped at max_cooldown")
	learned(clk.Now().Add(8 * time.Second))
	for _, h := range nodes {
		code, ra = send(h, "c")
		require.Equal(t, http.StatusForbidden, code)
		require.Equal(t, "60", ra)
	}
	// Another client is not affected.
	code, _ = send(b, "other")
	require.Equal(t, 200, code)

	// Both penalties expire by themselves.
	clk.Advance(61 * time.Second)
	for _, h := range nodes {
		code, _ = send(h, "c")
		require.Equal(t, 200, code)
	}
}

func TestEscalationMemory(t *testing.T) {
	clk := newClock(epoch)
	pen := policy.NewMemoryPenalties()
	testEscalation(t, clk, escalationNodes(t, clk, func() [2]policy.Penalties { return [2]policy.Penalties{pen, pen} }), func(time.Time) {})
}

func TestEscalateMath(t *testing.T) {
	cfg := &policy.Escalation{StrikeWindow: policy.Duration(time.Minute), MaxCooldown: policy.Duration(10 * time.Second), DenyAfter: 3, DenyFor: policy.Duration(time.Hour)}
	now := epoch
	p := policy.Escalate(cfg, 1, now, time.Second, policy.Penalty{})
	require.Zero(t, p.CooldownUntil)
	for strikes, want := range map[int64]time.Duration{1: time.Second, 2: 2 * time.Second, 3: 4 * time.Second, 5: 10 * time.Second, 100: 10 * time.Second} {
		p = policy.Escalate(cfg, strikes+1, now, time.Second, policy.Penalty{})
		require.Equal(t, now.Add(want), p.CooldownUntil, "strikes %d", strikes)
		require.Equal(t, strikes >= 3, !p.DenyUntil.IsZero())
	}
	// A penalty never shrinks.
	long := policy.Penalty{CooldownUntil: now.Add(time.Hour)}
	require.Equal(t, long.CooldownUntil, policy.Escalate(cfg, 2, now, time.Second, long).CooldownUntil)
}

func TestEscalationRedis(t *testing.T) {
	t.Run("miniredis", func(t *testing.T) {
		escalationRedis(t, func() string { return miniredis.RunT(t).Addr() })
	})
	t.Run("redis", func(t *testing.T) {
		addr := os.Getenv("RATELIMIT_TEST_REDIS_ADDR")
		if addr == "" {
			storetest.SkipOrFail(t, "RATELIMIT_TEST_REDIS_ADDR")
		}
		escalationRedis(t, func() string { return addr })
	})
}

// escalationRedis runs testEscalation on two nodes, each with its own Redis
// client and Penalties: node B learns node A's penalties over pub/sub.
func escalationRedis(t *testing.T, server func() string) {
	clk := newClock(epoch)
	var b [6]byte
	_, _ = rand.Read(b[:])
	prefix := "rlt-esc-" + hex.EncodeToString(b[:])
	var pens [2]*redisstore.Penalties
	nodes := escalationNodes(t, clk, func() [2]policy.Penalties {
		addr := server()
		for i := range pens {
			c := goredis.NewClient(&goredis.Options{Addr: addr, MaxRetries: -1, MinRetryBackoff: -1, MaxRetryBackoff: -1,
				DialTimeout: 2 * time.Second, ReadTimeout: 3 * time.Second, WriteTimeout: 3 * time.Second,
				PoolTimeout: 4 * time.Second, ContextTimeoutEnabled: true})
			t.Cleanup(func() { _ = c.Close() })
			p, err := redisstore.NewPenalties(context.Background(), c, redisstore.Options{Prefix: prefix})
			require.NoError(t, err)
			t.Cleanup(func() { _ = p.Close() })
			pens[i] = p
		}
		return [2]policy.Penalties{pens[0], pens[1]}
	})
	testEscalation(t, clk, nodes, func(until time.Time) {
		require.Eventually(t, func() bool {
			return !pens[0].Check("c", clk.Now()).CooldownUntil.Before(until) && !pens[1].Check("c", clk.Now()).CooldownUntil.Before(until)
		}, 2*time.Second, time.Millisecond, "both nodes learn the cooldown")
	})
}

// TestEscalationPostgres runs testEscalation on two nodes, each with its own
// pool and Penalties: node B learns node A's penalties over LISTEN/NOTIFY.
func TestEscalationPostgres(t *testing.T) {
	dsn := os.Getenv("RATELIMIT_TEST_POSTGRES_DSN")
	if dsn == "" {
		storetest.SkipOrFail(t, "RATELIMIT_TEST_POSTGRES_DSN")
	}
	clk := newClock(epoch)
	var b [6]byte
	_, _ = rand.Read(b[:])
	table := "rlt_esc_" + hex.EncodeToString(b[:])
	var pens [2]*pgstore.Penalties
	nodes := escalationNodes(t, clk, func() [2]policy.Penalties {
		t.Cleanup(func() {
			pool, err := pgxpool.New(context.Background(), dsn)
			if err != nil {
				return
			}
			defer pool.Close()
			_, _ = pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+table+"_strikes, "+table+"_penalties")
		})
		for i := range pens {
			pool, err := pgxpool.New(context.Background(), dsn)
			require.NoError(t, err)
			t.Cleanup(pool.Close)
			p, err := pgstore.NewPenalties(context.Background(), pool, pgstore.Options{Table: table})
			require.NoError(t, err)
			t.Cleanup(func() { _ = p.Close() })
			pens[i] = p
		}
		return [2]policy.Penalties{pens[0], pens[1]}
	})
	testEscalation(t, clk, nodes, func(until time.Time) {
		require.Eventually(t, func() bool {
			return !pens[0].Check("c", clk.Now()).CooldownUntil.Before(until) && !pens[1].Check("c", clk.Now()).CooldownUntil.Before(until)
		}, 2*time.Second, time.Millisecond, "both nodes learn the cooldown")
	})
}
