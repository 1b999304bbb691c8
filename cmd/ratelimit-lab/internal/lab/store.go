package lab

import (
	"context"
	"fmt"
	"iter"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	goredis "github.com/redis/go-redis/v9"

	"github.com/ratesync/ratelimit/strategy"
	"github.com/ratesync/ratelimit/strategy/memory"
	"github.com/ratesync/ratelimit/strategy/postgres"
	"github.com/ratesync/ratelimit/strategy/redis"
)

// StoreCounts are the store operations of a run, summed over its nodes.
type StoreCounts struct {
	Pushes        atomic.Int64 // PushDiffs calls
	PushErrors    atomic.Int64
	Diffs         atomic.Int64 // diffs sent
	Reads         atomic.Int64 // counters read within pushes
	Fetches       atomic.Int64 // GetCounters calls
	Fetched       atomic.Int64 // counters GetCounters returned
	Windows       atomic.Int64 // GetWindow calls
	Takes         atomic.Int64 // strategy.Taker calls (synchronous token buckets and sliding logs)
	BucketDiffs   atomic.Int64 // token-bucket diffs sent within pushes
	BucketReads   atomic.Int64 // token buckets read within pushes
	Purges        atomic.Int64
	BytesSent     atomic.Int64 // payload estimate, see counting
	BytesReceived atomic.Int64
}

// Payload estimate per counter, in bytes: a counter identity is its key, the
// window size and start (8 bytes each); a diff adds its delta (8); every total
// returned is 8 bytes. Namespaces and batch IDs are counted once per call.
// Protocol framing (RESP, the PostgreSQL wire format, the Lua script's SHA)
// is left out, so wire bytes are higher.
const (
	idBytes    = 16
	valueBytes = 8
)

// counting wraps a strategy.Strategy and counts its calls into c. It passes
// the store's capabilities (watches, token buckets, Take) on, so the nodes
// use the same protocol as they would on the bare store.
type counting struct {
	inner strategy.Strategy
	c     *StoreCounts
}

func (s counting) PushDiffs(ctx context.Context, b *strategy.Batch) (strategy.Result, error) {
	sent := int64(len(b.ID) + len(b.Namespace))
	for i := range b.Diffs {
		sent += int64(len(b.Diffs[i].Key)) + idBytes + valueBytes
	}
	for i := range b.Reads {
		sent += int64(len(b.Reads[i].Key)) + idBytes
	}
	for i := range b.BucketDiffs {
		sent += int64(len(b.BucketDiffs[i].Key)) + idBytes + 3*valueBytes
	}
	for i := range b.BucketReads {
		sent += int64(len(b.BucketReads[i].Key)) + idBytes
	}
	s.c.Pushes.Add(1)
	s.c.Diffs.Add(int64(len(b.Diffs)))
	s.c.Reads.Add(int64(len(b.Reads)))
	s.c.BucketDiffs.Add(int64(len(b.BucketDiffs)))
	s.c.BucketReads.Add(int64(len(b.BucketReads)))
	s.c.BytesSent.Add(sent)
	res, err := s.inner.PushDiffs(ctx, b)
	if err != nil {
		s.c.PushErrors.Add(1)
	} else {
		s.c.BytesReceived.Add(int64(len(res.Totals)+len(res.Reads)+2*len(res.Buckets)) * valueBytes)
	}
	return res, err
}

func (s counting) GetCounters(ctx context.Context, q strategy.Query) iter.Seq2[strategy.Counter, error] {
	sent := int64(len(q.Namespace)) + int64(len(q.Sizes))*valueBytes + valueBytes
	for _, k := range q.Keys {
		sent += int64(len(k))
	}
	s.c.Fetches.Add(1)
	s.c.BytesSent.Add(sent)
	return func(yield func(strategy.Counter, error) bool) {
		for c, err := range s.inner.GetCounters(ctx, q) {
			if err == nil {
				s.c.Fetched.Add(1)
				s.c.BytesReceived.Add(int64(len(c.Key)) + idBytes + valueBytes)
			}
			if !yield(c, err) {
				return
			}
		}
	}
}

func (s counting) GetWindow(ctx context.Context, namespace string, id strategy.CounterID) (int64, error) {
	s.c.Windows.Add(1)
	s.c.BytesSent.Add(int64(len(namespace)+len(id.Key)) + idBytes)
	s.c.BytesReceived.Add(valueBytes)
	return s.inner.GetWindow(ctx, namespace, id)
}

// Capabilities are the wrapped store's.
func (s counting) Capabilities() strategy.Capabilities { return strategy.CapabilitiesOf(s.inner) }

// Take counts a strategy.Taker call; the namespace makes one only when the
// wrapped store's capabilities include Take.
func (s counting) Take(ctx context.Context, t *strategy.Take) (strategy.TakeResult, error) {
	s.c.Takes.Add(1)
	s.c.BytesSent.Add(int64(len(t.ID)+len(t.Namespace)+len(t.Key)) + idBytes)
	s.c.BytesReceived.Add(2 * valueBytes)
	return s.inner.(strategy.Taker).Take(ctx, t)
}

func (s counting) Purge(ctx context.Context, now int64) error {
	s.c.Purges.Add(1)
	return s.inner.Purge(ctx, now)
}

// stores makes each node's store: one shared memory.Store, or a client (and
// its connection pool) per node for Redis and PostgreSQL, as separate
// processes would have.
type stores struct {
	cfg    *Config
	mem    *memory.Store
	closer []func()
}

func (s *stores) node(ctx context.Context, c *StoreCounts) (strategy.Strategy, error) {
	var inner strategy.Strategy
	switch s.cfg.Strategy {
	case "memory":
		if s.mem == nil {
			s.mem = memory.New()
		}
		inner = s.mem
	case "redis":
		client := goredis.NewClient(&goredis.Options{
			Addr:         s.cfg.RedisAddr,
			DialTimeout:  2 * time.Second,
			ReadTimeout:  time.Second,
			WriteTimeout: time.Second,
			PoolTimeout:  2 * time.Second,
			MaxRetries:   2, // safe: every push carries a batch ID
			PoolSize:     max(10, s.cfg.Workers+4),

			ContextTimeoutEnabled: true,
		})
		if err := client.Ping(ctx).Err(); err != nil {
			_ = client.Close()
			return nil, fmt.Errorf("redis %s: %w", s.cfg.RedisAddr, err)
		}
		s.closer = append(s.closer, func() { _ = client.Close() })
		st, err := redis.New(client, redis.Options{})
		if err != nil {
			return nil, err
		}
		inner = st
	case "postgres":
		pc, err := pgxpool.ParseConfig(s.cfg.PostgresDSN)
		if err != nil {
			return nil, fmt.Errorf("postgres DSN: %w", err)
		}
		pc.MaxConns = int32(min(max(4, s.cfg.Workers+2), 16))
		pool, err := pgxpool.NewWithConfig(ctx, pc)
		if err != nil {
			return nil, fmt.Errorf("postgres: %w", err)
		}
		s.closer = append(s.closer, pool.Close)
		st, err := postgres.New(ctx, pool, postgres.Options{})
		if err != nil {
			return nil, err
		}
		inner = st
	default:
		return nil, fmt.Errorf("unknown strategy %q (memory, redis, postgres)", s.cfg.Strategy)
	}
	return counting{inner: inner, c: c}, nil
}

func (s *stores) close() {
	for _, f := range s.closer {
		f()
	}
}
