package postgres

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit"
	"github.com/ratesync/ratelimit/internal/faultproxy"
	"github.com/ratesync/ratelimit/strategy"
)

// slack is what a bounded wait may exceed its bound by on a loaded machine.
const slack = 1500 * time.Millisecond

// blackHoleDSN returns a proxy to the test server and dsn rewritten to go
// through it, with no TLS (the proxy forwards bytes; TLS would work too, but
// plain framing keeps failures readable) and the given extra parameters.
func blackHoleDSN(t *testing.T, dsn string, params ...string) (*faultproxy.Proxy, string) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dsn)
	require.NoError(t, err)
	p, err := faultproxy.New(net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port))))
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	u, err := url.Parse(dsn)
	require.NoError(t, err)
	u.Host = p.Addr()
	q := u.Query()
	q.Set("sslmode", "disable")
	for i := 0; i+1 < len(params); i += 2 {
		q.Set(params[i], params[i+1])
	}
	u.RawQuery = q.Encode()
	return p, u.String()
}

// within runs f and fails the test unless it returns within bound (+slack).
// A call that never returns fails the test at bound+slack instead of hanging.
func within(t *testing.T, bound time.Duration, what string, f func()) time.Duration {
	t.Helper()
	start := time.Now()
	done := make(chan struct{})
	go func() { defer close(done); f() }()
	select {
	case <-done:
	case <-time.After(bound + slack):
		t.Fatalf("%s did not return within %v", what, bound+slack)
	}
	took := time.Since(start)
	t.Logf("%s returned after %v (bound %v)", what, took.Round(time.Millisecond), bound)
	return took
}

// New against a server that accepts TCP and never answers returns within
// SetupTimeout when the caller's context has no deadline, and by the
// caller's deadline when it has one (issue 11, case 4). The pool is built
// with pgxpool's defaults: no connect_timeout.
func TestNewBlackHole(t *testing.T) {
	dsn := testDSN(t)
	p, bh := blackHoleDSN(t, dsn)
	p.SetMode(faultproxy.BlackHole)
	for _, params := range [][]string{nil, {"connect_timeout", "0"}, {"pool_max_conns", "1"}} {
		t.Run(fmt.Sprint(params), func(t *testing.T) {
			u := bh
			if params != nil {
				_, u = blackHoleDSN(t, dsn, params...)
				p2, _ := url.Parse(u)
				p2.Host = p.Addr()
				u = p2.String()
			}
			pool, err := pgxpool.New(context.Background(), u)
			require.NoError(t, err)
			defer pool.Close()
			var newErr error
			within(t, 300*time.Millisecond, "New (SetupTimeout)", func() {
				_, newErr = New(context.Background(), pool, Options{SetupTimeout: 300 * time.Millisecond})
			})
			require.ErrorIs(t, newErr, context.DeadlineExceeded)
			ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			defer cancel()
			within(t, 200*time.Millisecond, "New (caller's deadline)", func() {
				_, newErr = New(ctx, pool, Options{})
			})
			require.Error(t, newErr)
		})
	}
	o, err := Options{}.withDefaults()
	require.NoError(t, err)
	require.Equal(t, DefaultSetupTimeout, o.SetupTimeout)
}

// Every call of a store whose server went silent (connections open and
// pooled, then black-holed; or new connections that hang in the handshake)
// returns by its context's deadline, with pgxpool's default options.
func TestCallsBlackHole(t *testing.T) {
	dsn := testDSN(t)
	p, bh := blackHoleDSN(t, dsn)
	pool, err := pgxpool.New(context.Background(), bh)
	require.NoError(t, err)
	defer pool.Close()
	s := newStore(t, pool, Options{PurgeInterval: time.Millisecond})
	ctx := context.Background()
	b := &strategy.Batch{ID: "bh", Namespace: "ns", Diffs: []strategy.Diff{diff("k", time.Second, base, 1)}}
	_, err = s.PushDiffs(ctx, b)
	require.NoError(t, err)

	const bound = 250 * time.Millisecond
	calls := map[string]func(context.Context) error{
		"PushDiffs": func(ctx context.Context) error {
			b.ID += "x"
			_, err := s.PushDiffs(ctx, b)
			return err
		},
		"GetCounters": func(ctx context.Context) error {
			for _, err := range s.GetCounters(ctx, strategy.Query{Namespace: "ns", Sizes: []time.Duration{time.Second}, Now: base}) {
				if err != nil {
					return err
				}
			}
			return nil
		},
		"GetWindow": func(ctx context.Context) error {
			_, err := s.GetWindow(ctx, "ns", id("k", time.Second, base))
			return err
		},
		"Purge": func(ctx context.Context) error { return s.Purge(ctx, time.Now().UnixMilli()) },
	}
	for _, phase := range []string{"pooled", "handshake"} {
		if phase == "handshake" {
			p.SetMode(faultproxy.Forward)
			pool.Reset()
		}
		p.SetMode(faultproxy.BlackHole)
		for name, call := range calls {
			for range 2 { // also once every pooled connection is stuck or gone
				cctx, cancel := context.WithTimeout(ctx, bound)
				var err error
				within(t, bound, phase+" "+name, func() { err = call(cctx) })
				cancel()
				require.Error(t, err, "%s %s", phase, name)
			}
		}
	}
	p.SetMode(faultproxy.Forward)
}

// Registry.Close with a deadline returns by it when the PostgreSQL behind
// every namespace went silent, with one namespace or ten, and says hits were
// not pushed (issue 11, case 4, through the public API).
func TestRegistryCloseBlackHole(t *testing.T) {
	dsn := testDSN(t)
	for _, spaces := range []int{1, 10} {
		t.Run(fmt.Sprint(spaces), func(t *testing.T) {
			p, bh := blackHoleDSN(t, dsn)
			pool, err := pgxpool.New(context.Background(), bh)
			require.NoError(t, err)
			defer pool.Close()
			s := newStore(t, pool, Options{})
			reg := ratelimit.NewRegistry()
			ctx := context.Background()
			var nss []*ratelimit.Namespace
			for i := range spaces {
				ns, err := reg.New(ratelimit.Config{Namespace: fmt.Sprint("close-", i), WindowSizes: []time.Duration{time.Minute},
					SyncRate: time.Hour, Strategy: s})
				require.NoError(t, err)
				nss = append(nss, ns)
			}
			for _, ns := range nss {
				_, err := ns.Increment(ctx, "k", time.Minute, 1)
				require.NoError(t, err)
				require.NoError(t, ns.Sync(ctx))
				_, err = ns.Increment(ctx, "k", time.Minute, 1)
				require.NoError(t, err)
			}
			p.SetMode(faultproxy.BlackHole)
			const bound = 200 * time.Millisecond
			cctx, cancel := context.WithTimeout(ctx, bound)
			defer cancel()
			within(t, bound, fmt.Sprintf("Registry.Close of %d namespaces", spaces), func() { err = reg.Close(cctx) })
			require.ErrorIs(t, err, ratelimit.ErrStoreUnavailable)
			p.SetMode(faultproxy.Forward)
		})
	}
}

// A pool whose connections react to a done context only after a delay would
// make every call outlast its deadline by that much on a silent server (3.2 s
// for a 200 ms deadline with a 3 s DeadlineDelay): New refuses it and names
// the setting. pgx's default handler and a delay of 0 are accepted.
func TestNewRefusesDelayedDeadlines(t *testing.T) {
	dsn := testDSN(t)
	pool := func(h func(*pgconn.PgConn) ctxwatch.Handler) *pgxpool.Pool {
		cfg, err := pgxpool.ParseConfig(dsn)
		require.NoError(t, err)
		if h != nil {
			cfg.ConnConfig.BuildContextWatcherHandler = h
		}
		p, err := pgxpool.NewWithConfig(context.Background(), cfg)
		require.NoError(t, err)
		t.Cleanup(p.Close)
		return p
	}
	for name, h := range map[string]func(*pgconn.PgConn) ctxwatch.Handler{
		"deadline": func(c *pgconn.PgConn) ctxwatch.Handler {
			return &pgconn.DeadlineContextWatcherHandler{Conn: c.Conn(), DeadlineDelay: 3 * time.Second}
		},
		"cancel request": func(c *pgconn.PgConn) ctxwatch.Handler {
			return &pgconn.CancelRequestContextWatcherHandler{Conn: c, DeadlineDelay: time.Second}
		},
	} {
		_, err := New(context.Background(), pool(h), Options{})
		require.ErrorIs(t, err, ErrInvalidPool, name)
		require.Contains(t, err.Error(), "DeadlineDelay", name)
	}
	for name, h := range map[string]func(*pgconn.PgConn) ctxwatch.Handler{
		"default": nil,
		"no delay": func(c *pgconn.PgConn) ctxwatch.Handler {
			return &pgconn.CancelRequestContextWatcherHandler{Conn: c}
		},
		"panics when probed": func(c *pgconn.PgConn) ctxwatch.Handler {
			if c.PID() == 0 {
				panic("not connected")
			}
			return &pgconn.DeadlineContextWatcherHandler{Conn: c.Conn()}
		},
	} {
		s := newStore(t, pool(h), Options{})
		_, err := s.PushDiffs(context.Background(), &strategy.Batch{ID: "w", Namespace: name, Diffs: []strategy.Diff{diff("k", time.Second, base, 1)}})
		require.NoError(t, err, name)
	}
}

// With every pooled connection taken (MaxConns 1, held by someone else), a
// push waits for a connection only until its deadline, and reports the
// batch not applied: nothing was sent.
func TestAcquireWaitBounded(t *testing.T) {
	pool := newPool(t, testDSN(t), func(cfg *pgxpool.Config) { cfg.MaxConns = 1 })
	s := newStore(t, pool, Options{})
	held, err := pool.Acquire(context.Background())
	require.NoError(t, err)
	defer held.Release()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	within(t, 200*time.Millisecond, "PushDiffs waiting for a connection", func() {
		_, err = s.PushDiffs(ctx, &strategy.Batch{ID: "acq", Namespace: "ns", Diffs: []strategy.Diff{diff("k", time.Second, base, 1)}})
	})
	require.ErrorIs(t, err, strategy.ErrNotApplied)
	require.ErrorIs(t, err, context.DeadlineExceeded)
}
