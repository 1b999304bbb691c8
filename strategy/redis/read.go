package redis

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"slices"
	"strconv"

	goredis "github.com/redis/go-redis/v9"

	"github.com/ratesync/ratelimit/strategy"
)

// hgetallPerPipeline bounds the HGETALLs of one pipeline when reading a whole
// namespace, since each may return many fields.
const hgetallPerPipeline = 128

// GetCounters returns q's counters. With q.Keys it reads only those keys (an
// HMGET per hash), else every counter of the namespace's current and previous
// window of each size (an HGETALL per shard and window). Replies are pipelined
// in batches of at most Options.BatchSize counters; counters are yielded as
// each pipeline answers.
func (s *Store) GetCounters(ctx context.Context, q strategy.Query) iter.Seq2[strategy.Counter, error] {
	return func(yield func(strategy.Counter, error) bool) {
		fail := func(err error) { yield(strategy.Counter{}, fmt.Errorf("redis: get counters %q: %w", q.Namespace, err)) }
		if err := ctx.Err(); err != nil {
			fail(err)
			return
		}
		var windows []window
		for _, size := range q.Sizes {
			if err := checkSize(size); err != nil {
				fail(err)
				return
			}
			cur := strategy.WindowStart(q.Now, size)
			for _, w := range [2]window{{size, cur}, {size, cur - size.Milliseconds()}} {
				if !slices.Contains(windows, w) {
					windows = append(windows, w)
				}
			}
		}
		var err error
		if q.Keys != nil {
			err = s.getKeys(ctx, q, windows, yield)
		} else {
			err = s.getAll(ctx, q, windows, yield)
		}
		if err != nil && !errors.Is(err, errStopped) {
			fail(err)
		}
	}
}

var errStopped = errors.New("redis: iteration stopped")

type hashRef struct {
	shard int
	window
}

// getKeys yields the counters of q.Keys, reading them with pipelined HMGETs.
func (s *Store) getKeys(ctx context.Context, q strategy.Query, windows []window, yield func(strategy.Counter, error) bool) error {
	if len(q.Keys) == 0 || len(windows) == 0 {
		return nil
	}
	prefixes := s.shardPrefixes(q.Namespace)
	fields := make(map[hashRef][]string)
	var order []hashRef
	for _, key := range q.Keys {
		sh := s.shardOf(keyHash(key))
		for _, w := range windows {
			r := hashRef{sh, w}
			if _, ok := fields[r]; !ok {
				order = append(order, r)
			}
			fields[r] = append(fields[r], key)
		}
	}
	type get struct {
		ref  hashRef
		keys []string
		cmd  *goredis.SliceCmd
	}
	var gets []get
	flush := func() error {
		if len(gets) == 0 {
			return nil
		}
		cmds := make([]goredis.Cmder, len(gets))
		for i, g := range gets {
			cmds[i] = g.cmd
		}
		if err := s.sendReads(ctx, cmds); err != nil {
			return err
		}
		for _, g := range gets {
			for i, v := range g.cmd.Val() {
				if v == nil {
					continue
				}
				n, err := parseCount(v)
				if err != nil {
					return err
				}
				c := strategy.Counter{CounterID: strategy.CounterID{Key: g.keys[i], Size: g.ref.size, Start: g.ref.start}, Count: n}
				if !yield(c, nil) {
					return errStopped
				}
			}
		}
		gets = gets[:0]
		return nil
	}
	counters := 0
	for _, r := range order {
		keys := fields[r]
		name := hashKey(prefixes[r.shard], r.size, r.start)
		for lo := 0; lo < len(keys); lo += s.scriptPerCall {
			part := keys[lo:min(lo+s.scriptPerCall, len(keys))]
			if counters+len(part) > s.opts.BatchSize {
				if err := flush(); err != nil {
					return err
				}
				counters = 0
			}
			args := make([]any, 0, 2+len(part))
			args = append(args, "hmget", name)
			for _, k := range part {
				args = append(args, k)
			}
			gets = append(gets, get{r, part, goredis.NewSliceCmd(ctx, args...)})
			counters += len(part)
		}
	}
	return flush()
}

// sendReads sends read commands in one round trip (see send) and returns the
// first error among them.
func (s *Store) sendReads(ctx context.Context, cmds []goredis.Cmder) error {
	s.send(ctx, cmds)
	for _, c := range cmds {
		if err := c.Err(); err != nil {
			return err
		}
	}
	return nil
}

// getAll yields every counter of the namespace in windows, reading each
// shard's hash with HGETALL.
func (s *Store) getAll(ctx context.Context, q strategy.Query, windows []window, yield func(strategy.Counter, error) bool) error {
	prefixes := s.shardPrefixes(q.Namespace)
	type get struct {
		w   window
		cmd *goredis.MapStringStringCmd
	}
	gets := make([]get, 0, hgetallPerPipeline)
	flush := func() error {
		if len(gets) == 0 {
			return nil
		}
		cmds := make([]goredis.Cmder, len(gets))
		for i, g := range gets {
			cmds[i] = g.cmd
		}
		if err := s.sendReads(ctx, cmds); err != nil {
			return err
		}
		for _, g := range gets {
			for k, v := range g.cmd.Val() {
				n, err := parseCount(v)
				if err != nil {
					return err
				}
				if !yield(strategy.Counter{CounterID: strategy.CounterID{Key: k, Size: g.w.size, Start: g.w.start}, Count: n}, nil) {
					return errStopped
				}
			}
		}
		gets = gets[:0]
		return nil
	}
	for _, w := range windows {
		for sh := range prefixes {
			if len(gets) == hgetallPerPipeline {
				if err := flush(); err != nil {
					return err
				}
			}
			gets = append(gets, get{w, goredis.NewMapStringStringCmd(ctx, "hgetall", hashKey(prefixes[sh], w.size, w.start))})
		}
	}
	return flush()
}

// GetWindow returns one counter's total, 0 when Redis does not hold it.
func (s *Store) GetWindow(ctx context.Context, namespace string, id strategy.CounterID) (int64, error) {
	if err := checkSize(id.Size); err != nil {
		return 0, fmt.Errorf("redis: get window %q %q: %w", namespace, id.Key, err)
	}
	prefix := s.shardPrefixes(namespace)[s.shardOf(keyHash(id.Key))]
	v, err := s.client.HGet(ctx, hashKey(prefix, id.Size, id.Start), id.Key).Result()
	if errors.Is(err, goredis.Nil) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("redis: get window %q %q: %w", namespace, id.Key, err)
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("redis: get window %q %q: %w", namespace, id.Key, err)
	}
	return n, nil
}

// Purge does nothing but check ctx: every hash the Store writes expires by
// its TTL (twice its window plus Options.ExpiryMargin after its last write).
func (s *Store) Purge(ctx context.Context, now int64) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("redis: purge: %w", err)
	}
	return nil
}
