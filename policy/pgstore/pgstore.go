// Package pgstore keeps policy versions in PostgreSQL, so every node of a
// cluster follows one policy: a table holds the versions, a one-row table
// the current one, and NOTIFY announces changes on a channel the watchers
// LISTEN to (they also poll, so a lost notification only delays a change by
// one poll interval).
package pgstore

import (
	"context"
	"errors"
	"fmt"
	"regexp"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ratesync/ratelimit/policy"
)

// Options configure a Store.
type Options struct {
	// Table names the versions table; the current version is in Table plus
	// "_current", and the channel is Table. Letters, digits and '_', starting
	// with a letter or '_', at most 50 bytes. Default "ratelimit_policy".
	Table string
}

// Store is a policy.Store in PostgreSQL.
type Store struct {
	pool           *pgxpool.Pool
	table, current string // quoted identifiers
	channel        string
}

var _ policy.Store = (*Store)(nil)

var identRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,49}$`)

// New returns a Store on pool, creating its tables when missing.
func New(ctx context.Context, pool *pgxpool.Pool, opts Options) (*Store, error) {
	t := opts.Table
	if t == "" {
		t = "ratelimit_policy"
	}
	if !identRE.MatchString(t) {
		return nil, fmt.Errorf("pgstore: Options.Table %q: want letters, digits and '_', at most 50 bytes", t)
	}
	s := &Store{pool: pool, table: pgx.Identifier{t}.Sanitize(), current: pgx.Identifier{t + "_current"}.Sanitize(), channel: t}
	_, err := pool.Exec(ctx, fmt.Sprintf(`
CREATE TABLE IF NOT EXISTS %s (
	version bigserial PRIMARY KEY,
	doc bytea NOT NULL,
	created_at timestamptz NOT NULL DEFAULT now());
CREATE TABLE IF NOT EXISTS %s (
	id boolean PRIMARY KEY DEFAULT true CHECK (id),
	version bigint NOT NULL REFERENCES %s (version))`, s.table, s.current, s.table))
	if err != nil {
		return nil, fmt.Errorf("pgstore: create tables: %w", err)
	}
	return s, nil
}

// Current implements policy.Store.
func (s *Store) Current(ctx context.Context) (int64, error) {
	var n int64
	err := s.pool.QueryRow(ctx, "SELECT version FROM "+s.current).Scan(&n)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("pgstore: current: %w", err)
	}
	return n, nil
}

// Get implements policy.Store.
func (s *Store) Get(ctx context.Context, n int64) (policy.Version, error) {
	var doc []byte
	err := s.pool.QueryRow(ctx, "SELECT doc FROM "+s.table+" WHERE version = $1", n).Scan(&doc)
	if errors.Is(err, pgx.ErrNoRows) {
		return policy.Version{}, fmt.Errorf("%w: %d", policy.ErrNoVersion, n)
	}
	if err != nil {
		return policy.Version{}, fmt.Errorf("pgstore: get %d: %w", n, err)
	}
	return policy.Version{Number: n, Doc: doc}, nil
}

// Versions implements policy.Store.
func (s *Store) Versions(ctx context.Context) ([]int64, error) {
	rows, err := s.pool.Query(ctx, "SELECT version FROM "+s.table+" ORDER BY version")
	if err != nil {
		return nil, fmt.Errorf("pgstore: versions: %w", err)
	}
	vs, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("pgstore: versions: %w", err)
	}
	return vs, nil
}

// Append implements policy.Store: one transaction inserts the version, makes
// it current and notifies (NOTIFY is delivered at commit).
func (s *Store) Append(ctx context.Context, doc []byte) (int64, error) {
	return s.append(ctx, doc, true)
}

func (s *Store) append(ctx context.Context, doc []byte, notify bool) (int64, error) {
	var n int64
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, "INSERT INTO "+s.table+" (doc) VALUES ($1) RETURNING version", doc).Scan(&n); err != nil {
			return err
		}
		return s.setCurrent(ctx, tx, n, notify)
	})
	if err != nil {
		return 0, fmt.Errorf("pgstore: append: %w", err)
	}
	return n, nil
}

func (s *Store) setCurrent(ctx context.Context, tx pgx.Tx, n int64, notify bool) error {
	if _, err := tx.Exec(ctx, "INSERT INTO "+s.current+" (id, version) VALUES (true, $1) ON CONFLICT (id) DO UPDATE SET version = EXCLUDED.version", n); err != nil {
		return err
	}
	if notify {
		_, err := tx.Exec(ctx, "SELECT pg_notify($1, $2)", s.channel, fmt.Sprint(n))
		return err
	}
	return nil
}

// SetCurrent implements policy.Store.
func (s *Store) SetCurrent(ctx context.Context, n int64) error {
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var ok bool
		if err := tx.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM "+s.table+" WHERE version = $1)", n).Scan(&ok); err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("%w: %d", policy.ErrNoVersion, n)
		}
		return s.setCurrent(ctx, tx, n, true)
	})
	if errors.Is(err, policy.ErrNoVersion) {
		return err
	}
	if err != nil {
		return fmt.Errorf("pgstore: set current %d: %w", n, err)
	}
	return nil
}

// Subscribe implements policy.Store: it takes one connection out of the pool
// for LISTEN, until ctx ends or the connection breaks.
func (s *Store) Subscribe(ctx context.Context) (<-chan struct{}, error) {
	pc, err := s.pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("pgstore: subscribe: %w", err)
	}
	conn := pc.Hijack()
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{s.channel}.Sanitize()); err != nil {
		_ = conn.Close(context.Background())
		return nil, fmt.Errorf("pgstore: listen: %w", err)
	}
	out := make(chan struct{}, 1)
	go func() {
		defer close(out)
		defer func() { _ = conn.Close(context.Background()) }()
		for {
			if _, err := conn.WaitForNotification(ctx); err != nil {
				return
			}
			select {
			case out <- struct{}{}:
			default:
			}
		}
	}()
	return out, nil
}
