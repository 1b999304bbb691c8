package postgres

import (
	"context"
	"fmt"
)

// Purge deletes the counters whose window is older than the previous window at
// now (window_start + 2*window_size <= now) and the batch IDs that expired by
// now, in DELETE statements of at most Options.PurgeBatchSize rows that skip
// rows another purger holds. It does real work at most once per
// Options.PurgeInterval of now (and at once when now goes backwards by more
// than that); other calls, including concurrent ones, return nil at once. A
// failed purge is retried by the next call.
func (s *Store) Purge(ctx context.Context, now int64) error {
	interval := s.opts.PurgeInterval.Milliseconds()
	last := s.lastPurge.Load()
	if last != noPurge && now-last < interval && last-now < interval {
		return nil
	}
	// Claim this purge; a concurrent caller that loses does nothing.
	if !s.lastPurge.CompareAndSwap(last, now) {
		return nil
	}
	if err := s.purge(ctx, now); err != nil {
		s.lastPurge.CompareAndSwap(now, last)
		return fmt.Errorf("postgres: purge at %d: %w", now, err)
	}
	return nil
}

func (s *Store) purge(ctx context.Context, now int64) error {
	var sizes []int64
	r, err := s.pool.Query(ctx, s.purgeSizesSQL)
	if err != nil {
		return err
	}
	for r.Next() {
		var size int64
		if err := r.Scan(&size); err != nil {
			r.Close()
			return err
		}
		sizes = append(sizes, size)
	}
	if err := r.Err(); err != nil {
		return err
	}
	for _, size := range sizes {
		// start + 2*size <= now, as a range on the primary key.
		if err := s.deleteAll(ctx, s.purgeCountersSQL, size, now-2*size); err != nil {
			return err
		}
	}
	return s.deleteAll(ctx, s.purgeBatchesSQL, now)
}

// deleteAll runs a bounded DELETE (its last argument is the bound) until one
// removes fewer rows than the bound: nothing unlocked is left.
func (s *Store) deleteAll(ctx context.Context, sql string, args ...any) error {
	args = append(args, s.opts.PurgeBatchSize)
	for {
		tag, err := s.pool.Exec(ctx, sql, args...)
		if err != nil {
			return err
		}
		if tag.RowsAffected() < int64(s.opts.PurgeBatchSize) {
			return nil
		}
	}
}
