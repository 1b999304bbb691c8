package pgstore

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ratesync/ratelimit/policy"
)

// Penalties is policy.Penalties in PostgreSQL: a node records a rejection in
// one transaction (the key's rejection times in Table+"_strikes", its
// deadlines in Table+"_penalties") and announces a new penalty with NOTIFY on
// the channel Table+"_penalties"; every node LISTENs into a local cache that
// Check reads, so checking a request never waits on the database. A node that
// missed a notification learns the penalty at the key's next rejection there.
type Penalties struct {
	pool                        *pgxpool.Pool
	strikes, penalties, channel string
	cache                       policy.PenaltyCache
	cancel                      context.CancelFunc
	done                        chan struct{}
	once                        sync.Once
	mu                          sync.Mutex
	calls                       int // GUARDED_BY(mu)
}

var _ policy.Penalties = (*Penalties)(nil)

// NewPenalties creates the tables when missing, starts listening and
// returns Penalties on pool; Close stops listening.
func NewPenalties(ctx context.Context, pool *pgxpool.Pool, opts Options) (*Penalties, error) {
	t := opts.Table
	if t == "" {
		t = "ratelimit_policy"
	}
	if !identRE.MatchString(t) {
		return nil, fmt.Errorf("pgstore: Options.Table %q: want letters, digits and '_', at most 50 bytes", t)
	}
	p := &Penalties{pool: pool, strikes: pgx.Identifier{t + "_strikes"}.Sanitize(),
		penalties: pgx.Identifier{t + "_penalties"}.Sanitize(), channel: t + "_penalties", done: make(chan struct{})}
	_, err := pool.Exec(ctx, fmt.Sprintf(`
CREATE TABLE IF NOT EXISTS %s (key text NOT NULL, at bigint NOT NULL);
CREATE INDEX IF NOT EXISTS %s ON %s (key, at);
CREATE TABLE IF NOT EXISTS %s (key text PRIMARY KEY, cd bigint NOT NULL, dn bigint NOT NULL)`,
		p.strikes, pgx.Identifier{t + "_strikes_key"}.Sanitize(), p.strikes, p.penalties))
	if err != nil {
		return nil, fmt.Errorf("pgstore: penalties: create tables: %w", err)
	}
	conn, err := p.listen(ctx)
	if err != nil {
		return nil, err
	}
	lctx, cancel := context.WithCancel(context.Background())
	p.cancel = cancel
	go p.loop(lctx, conn)
	return p, nil
}

func (p *Penalties) listen(ctx context.Context) (*pgx.Conn, error) {
	pc, err := p.pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("pgstore: penalties: %w", err)
	}
	conn := pc.Hijack()
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{p.channel}.Sanitize()); err != nil {
		_ = conn.Close(context.Background())
		return nil, fmt.Errorf("pgstore: penalties: listen: %w", err)
	}
	return conn, nil
}

// loop receives notifications; when the connection breaks it listens again,
// once a second, until Close.
func (p *Penalties) loop(ctx context.Context, conn *pgx.Conn) {
	defer close(p.done)
	for {
		for conn != nil {
			n, err := conn.WaitForNotification(ctx)
			if err != nil {
				_ = conn.Close(context.Background())
				conn = nil
				break
			}
			if key, pen, ok := parseMessage(n.Payload); ok {
				p.cache.Put(key, pen, time.Now())
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
		conn, _ = p.listen(ctx)
	}
}

// Close stops listening. Idempotent.
func (p *Penalties) Close() error {
	p.once.Do(func() {
		p.cancel()
		<-p.done
	})
	return nil
}

// A message is "cooldownUntilMs deniedUntilMs strikes key".
func parseMessage(s string) (string, policy.Penalty, bool) {
	f := strings.SplitN(s, " ", 4)
	if len(f) != 4 {
		return "", policy.Penalty{}, false
	}
	cd, err1 := strconv.ParseInt(f[0], 10, 64)
	dn, err2 := strconv.ParseInt(f[1], 10, 64)
	st, err3 := strconv.ParseInt(f[2], 10, 64)
	if err1 != nil || err2 != nil || err3 != nil {
		return "", policy.Penalty{}, false
	}
	return f[3], policy.Penalty{CooldownUntil: msTime(cd), DenyUntil: msTime(dn), Strikes: st}, true
}

func msTime(ms int64) time.Time {
	if ms == 0 {
		return time.Time{}
	}
	return time.UnixMilli(ms)
}

func unixMS(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMilli()
}

// Check implements policy.Penalties.
func (p *Penalties) Check(key string, now time.Time) policy.Penalty { return p.cache.Get(key, now) }

// Reject implements policy.Penalties: one transaction records the rejection,
// computes the penalty with policy.Escalate under a row lock, and notifies
// when it grew.
func (p *Penalties) Reject(ctx context.Context, key string, now time.Time, cfg *policy.Escalation, base time.Duration) (policy.Penalty, error) {
	nowMS, from := now.UnixMilli(), now.Add(-cfg.StrikeWindow.D()).UnixMilli()
	p.mu.Lock()
	p.calls++
	purge := p.calls%256 == 0
	p.mu.Unlock()
	var pen policy.Penalty
	err := pgx.BeginFunc(ctx, p.pool, func(tx pgx.Tx) error {
		// Lock the key's row first (creating it), so that concurrent
		// rejections of one key are counted one after the other.
		var cd, dn int64
		if err := tx.QueryRow(ctx, "INSERT INTO "+p.penalties+" (key, cd, dn) VALUES ($1, 0, 0) ON CONFLICT (key) DO UPDATE SET key = EXCLUDED.key RETURNING cd, dn", key).Scan(&cd, &dn); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, "DELETE FROM "+p.strikes+" WHERE key = $1 AND at <= $2", key, from); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, "INSERT INTO "+p.strikes+" (key, at) VALUES ($1, $2)", key, nowMS); err != nil {
			return err
		}
		var n int64
		if err := tx.QueryRow(ctx, "SELECT count(*) FROM "+p.strikes+" WHERE key = $1", key).Scan(&n); err != nil {
			return err
		}
		cur := policy.Penalty{CooldownUntil: msTime(cd), DenyUntil: msTime(dn)}
		pen = policy.Escalate(cfg, n, now, base, cur)
		if pen.CooldownUntil.Equal(cur.CooldownUntil) && pen.DenyUntil.Equal(cur.DenyUntil) {
			return nil
		}
		ncd, ndn := unixMS(pen.CooldownUntil), unixMS(pen.DenyUntil)
		if _, err := tx.Exec(ctx, "UPDATE "+p.penalties+" SET cd = $2, dn = $3 WHERE key = $1", key, ncd, ndn); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, "SELECT pg_notify($1, $2)", p.channel, fmt.Sprintf("%d %d %d %s", ncd, ndn, pen.Strikes, key))
		return err
	})
	if err != nil {
		return policy.Penalty{}, fmt.Errorf("pgstore: reject %q: %w", key, err)
	}
	if purge { // forget what has expired, whatever the key
		_, _ = p.pool.Exec(ctx, "DELETE FROM "+p.penalties+" WHERE greatest(cd, dn) < $1 AND key NOT IN (SELECT key FROM "+p.strikes+")", nowMS)
		_, _ = p.pool.Exec(ctx, "DELETE FROM "+p.strikes+" WHERE at <= $1", from)
	}
	p.cache.Put(key, pen, now) // this node knows at once, whatever NOTIFY does
	return pen, nil
}
