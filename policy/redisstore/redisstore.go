// Package redisstore keeps policy versions in Redis, so every node of a
// cluster follows one policy: a hash holds the versions, a key the current
// one, and a pub/sub channel announces changes (watchers also poll, so a lost
// message only delays a change by one poll interval).
//
// Keys, for Options.Prefix p: "{p}:seq" (the last version number),
// "{p}:versions" (a hash of version number to document), "{p}:current" (the
// current version number); the channel is "{p}:changed". The hash tag keeps
// them in one Cluster slot.
//
// Append is not idempotent: give the client MaxRetries -1 (no retry) or
// accept that a retried Append whose first reply was lost stores the
// document twice, as two equal versions.
package redisstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"

	goredis "github.com/redis/go-redis/v9"

	"github.com/ratesync/ratelimit/policy"
)

// Options configure a Store.
type Options struct {
	// Prefix names the keys and the channel. Default "ratelimit:policy".
	Prefix string
}

// Store is a policy.Store in Redis (standalone, Sentinel or Cluster).
type Store struct {
	c                              goredis.UniversalClient
	seq, versions, current, chname string
}

var _ policy.Store = (*Store)(nil)

// New returns a Store on c.
func New(c goredis.UniversalClient, opts Options) *Store {
	p := opts.Prefix
	if p == "" {
		p = "ratelimit:policy"
	}
	t := "{" + p + "}:"
	return &Store{c: c, seq: t + "seq", versions: t + "versions", current: t + "current", chname: t + "changed"}
}

var appendScript = goredis.NewScript(`
local n = redis.call('INCR', KEYS[1])
redis.call('HSET', KEYS[2], n, ARGV[1])
redis.call('SET', KEYS[3], n)
if ARGV[3] == '1' then redis.call('PUBLISH', ARGV[2], n) end
return n`)

var setCurrentScript = goredis.NewScript(`
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then return 0 end
redis.call('SET', KEYS[2], ARGV[1])
redis.call('PUBLISH', ARGV[2], ARGV[1])
return 1`)

// Current implements policy.Store.
func (s *Store) Current(ctx context.Context) (int64, error) {
	n, err := s.c.Get(ctx, s.current).Int64()
	if errors.Is(err, goredis.Nil) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("redisstore: current: %w", err)
	}
	return n, nil
}

// Get implements policy.Store.
func (s *Store) Get(ctx context.Context, n int64) (policy.Version, error) {
	doc, err := s.c.HGet(ctx, s.versions, strconv.FormatInt(n, 10)).Bytes()
	if errors.Is(err, goredis.Nil) {
		return policy.Version{}, fmt.Errorf("%w: %d", policy.ErrNoVersion, n)
	}
	if err != nil {
		return policy.Version{}, fmt.Errorf("redisstore: get %d: %w", n, err)
	}
	return policy.Version{Number: n, Doc: doc}, nil
}

// Versions implements policy.Store.
func (s *Store) Versions(ctx context.Context) ([]int64, error) {
	keys, err := s.c.HKeys(ctx, s.versions).Result()
	if err != nil {
		return nil, fmt.Errorf("redisstore: versions: %w", err)
	}
	vs := make([]int64, 0, len(keys))
	for _, k := range keys {
		if n, err := strconv.ParseInt(k, 10, 64); err == nil {
			vs = append(vs, n)
		}
	}
	slices.Sort(vs)
	return vs, nil
}

// Append implements policy.Store.
func (s *Store) Append(ctx context.Context, doc []byte) (int64, error) {
	return s.append(ctx, doc, true)
}

func (s *Store) append(ctx context.Context, doc []byte, notify bool) (int64, error) {
	flag := "0"
	if notify {
		flag = "1"
	}
	n, err := appendScript.Run(ctx, s.c, []string{s.seq, s.versions, s.current}, doc, s.chname, flag).Int64()
	if err != nil {
		return 0, fmt.Errorf("redisstore: append: %w", err)
	}
	return n, nil
}

// SetCurrent implements policy.Store.
func (s *Store) SetCurrent(ctx context.Context, n int64) error {
	ok, err := setCurrentScript.Run(ctx, s.c, []string{s.versions, s.current}, n, s.chname).Int64()
	if err != nil {
		return fmt.Errorf("redisstore: set current %d: %w", n, err)
	}
	if ok == 0 {
		return fmt.Errorf("%w: %d", policy.ErrNoVersion, n)
	}
	return nil
}

// Subscribe implements policy.Store. It returns once Redis confirmed the
// subscription.
func (s *Store) Subscribe(ctx context.Context) (<-chan struct{}, error) {
	ps := s.c.Subscribe(ctx, s.chname)
	if _, err := ps.Receive(ctx); err != nil {
		_ = ps.Close()
		return nil, fmt.Errorf("redisstore: subscribe: %w", err)
	}
	msgs := ps.Channel()
	out := make(chan struct{}, 1)
	go func() {
		defer close(out)
		defer ps.Close()
		for {
			select {
			case <-ctx.Done():
				return
			case _, ok := <-msgs:
				if !ok {
					return
				}
				select {
				case out <- struct{}{}:
				default:
				}
			}
		}
	}()
	return out, nil
}
