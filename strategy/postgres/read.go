package postgres

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ratesync/ratelimit/strategy"
)

type queryer interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// GetCounters streams the counters of q.Namespace in the current and previous
// window of each of q.Sizes at q.Now, restricted to q.Keys when that is not
// nil. It holds one pooled connection until the sequence ends or the caller
// stops ranging.
func (s *Store) GetCounters(ctx context.Context, q strategy.Query) iter.Seq2[strategy.Counter, error] {
	return func(yield func(strategy.Counter, error) bool) {
		fail := func(err error) {
			yield(strategy.Counter{}, fmt.Errorf("postgres: get counters of %q: %w", q.Namespace, err))
		}
		if err := ctx.Err(); err != nil {
			fail(err)
			return
		}
		var sizes, starts []int64
		seen := make(map[time.Duration]bool, len(q.Sizes))
		for _, size := range q.Sizes {
			if size <= 0 || seen[size] {
				continue // duplicates would return rows twice
			}
			seen[size] = true
			cur := strategy.WindowStart(q.Now, size)
			ms := size.Milliseconds()
			sizes = append(sizes, ms, ms)
			starts = append(starts, cur, cur-ms)
		}
		sql, args := s.getCountersSQL, []any{encodeText(q.Namespace), sizes, starts}
		if q.Keys != nil {
			keys := make([]string, len(q.Keys))
			for i, k := range q.Keys {
				keys[i] = encodeText(k)
			}
			if len(keys) == 0 {
				return
			}
			sql, args = s.getCountersKeysSQL, append(args, keys)
		}
		if len(sizes) == 0 {
			return
		}
		r, err := s.pool.Query(ctx, sql, args...)
		if err != nil {
			fail(err)
			return
		}
		defer r.Close()
		var (
			c    strategy.Counter
			size int64
		)
		for r.Next() {
			if err := r.Scan(&c.Key, &size, &c.Start, &c.Count); err != nil {
				fail(err)
				return
			}
			if c.Key, err = decodeText(c.Key); err != nil {
				fail(err)
				return
			}
			c.Size = time.Duration(size) * time.Millisecond
			if !yield(c, nil) {
				return
			}
		}
		if err := r.Err(); err != nil {
			fail(err)
		}
	}
}

// GetWindow returns one counter's total, 0 when the store does not hold it.
func (s *Store) GetWindow(ctx context.Context, namespace string, id strategy.CounterID) (int64, error) {
	if err := ctx.Err(); err != nil {
		return 0, fmt.Errorf("postgres: get window %q %q: %w", namespace, id.Key, err)
	}
	if id.Size <= 0 {
		return 0, nil
	}
	var n int64
	err := s.pool.QueryRow(ctx, s.getWindowSQL, id.Size.Milliseconds(), id.Start, encodeText(namespace), encodeText(id.Key)).Scan(&n)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("postgres: get window %q %q: %w", namespace, id.Key, err)
	}
	return n, nil
}
