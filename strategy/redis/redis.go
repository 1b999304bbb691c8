package redis

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/ratesync/ratelimit/strategy"
)

// Defaults for the zero values of Options.
const (
	DefaultKeyPrefix    = "rl"
	DefaultShards       = 64
	DefaultBatchSize    = 10_000
	DefaultExpiryMargin = 10 * time.Second
	DefaultBatchIDTTL   = 5 * time.Minute
	DefaultWaitTimeout  = 100 * time.Millisecond

	// MaxShards is the largest Options.Shards: Redis Cluster has 16384 slots.
	MaxShards = 16384
)

// maxScriptCounters bounds the diffs one script call applies, so that a large
// batch never holds Redis in one script for more than about a millisecond.
const maxScriptCounters = 1000

// Options configures a Store. The zero value of every field selects its
// documented default. Every node that shares counters must use the same
// KeyPrefix and Shards, or the nodes will not see each other's counters.
type Options struct {
	// KeyPrefix starts every key the Store writes. It must not contain '{'
	// or '}', which Redis Cluster reads as a hash tag.
	// Default: "rl".
	KeyPrefix string

	// Shards is the number of hashes (each with its own hash tag, hence its
	// own Cluster slot) the counters of one namespace-window are spread over,
	// between 1 and MaxShards. More shards spread the load of a busy window
	// over more Cluster nodes; fewer make a sync of few keys need fewer
	// script calls.
	// Default: 64.
	Shards int

	// BatchSize is the largest number of counters (diffs plus reads) sent in
	// one pipeline; a push or fetch of more is sent as several pipelines (a
	// push keeps up to three in flight, so Redis works while the next one is
	// encoded). A script call applies at most min(1000, BatchSize) diffs
	// (about: diffs are assigned to calls by key hash), so no call holds
	// Redis for long.
	// Default: 10,000.
	BatchSize int

	// ExpiryMargin is added to twice the window size to give every hash its
	// TTL (set when the hash is created, refreshed when a field is added),
	// and so covers clock skew between nodes: keep it above the largest
	// skew. It must not be negative.
	// Default: 10s.
	ExpiryMargin time.Duration

	// BatchIDTTL is how long Redis remembers that a batch part was applied,
	// and so how late a re-send of the batch is still recognised. Each push
	// leaves one small key per hash tag it writes, so memory grows with
	// pushes per second x Shards x BatchIDTTL; a part never remembers longer
	// than its longest window's TTL, after which its counters are past
	// reading. A re-send later than that (an outage longer than BatchIDTTL
	// right after Redis applied a push whose reply was lost) may count that
	// one batch twice. It must not be negative.
	// Default: 5m.
	BatchIDTTL time.Duration

	// WaitReplicas, when positive, makes every pipeline that writes end with
	// WAIT WaitReplicas WaitTimeout, and reports a push that fewer replicas
	// acknowledged in time as of unknown outcome, so the caller re-sends it
	// (the batch-part ids make that safe) until it is replicated. Replication
	// being asynchronous, a Sentinel failover otherwise loses the writes the
	// old primary acknowledged and did not pass on; with WaitReplicas 1 the
	// hits of such pushes are kept by the caller and land on the new primary.
	// The cost is a round trip to a replica per push, and pushes stall while
	// no replica follows the primary. Not available with a ClusterClient,
	// whose pipelines cannot carry a WAIT to every node. WaitTimeout must be
	// below the client's ReadTimeout.
	// Default: 0 (do not wait).
	WaitReplicas int

	// WaitTimeout bounds the WAIT of WaitReplicas.
	// Default: 100ms.
	WaitTimeout time.Duration
}

func (o Options) withDefaults() (Options, error) {
	if strings.ContainsAny(o.KeyPrefix, "{}") {
		return o, fmt.Errorf("redis: Options.KeyPrefix %q must not contain '{' or '}'", o.KeyPrefix)
	}
	if o.KeyPrefix == "" {
		o.KeyPrefix = DefaultKeyPrefix
	}
	switch {
	case o.Shards < 0 || o.Shards > MaxShards:
		return o, fmt.Errorf("redis: Options.Shards %d is out of range [1, %d]", o.Shards, MaxShards)
	case o.Shards == 0:
		o.Shards = DefaultShards
	}
	for _, err := range []error{
		orDefault("BatchSize", &o.BatchSize, DefaultBatchSize),
		orDefault("ExpiryMargin", &o.ExpiryMargin, DefaultExpiryMargin),
		orDefault("BatchIDTTL", &o.BatchIDTTL, DefaultBatchIDTTL),
		orDefault("WaitReplicas", &o.WaitReplicas, 0),
		orDefault("WaitTimeout", &o.WaitTimeout, DefaultWaitTimeout),
	} {
		if err != nil {
			return o, err
		}
	}
	if o.ExpiryMargin > maxExpiryMargin {
		return o, fmt.Errorf("redis: Options.ExpiryMargin %v is longer than %v", o.ExpiryMargin, maxExpiryMargin)
	}
	return o, nil
}

// maxExpiryMargin bounds Options.ExpiryMargin so that a TTL (twice the
// longest window plus the margin) cannot overflow.
const maxExpiryMargin = 365 * 24 * time.Hour

// orDefault sets *v to def when it is zero; a negative *v is an error that
// names field.
func orDefault[T int | time.Duration](field string, v *T, def T) error {
	if *v < 0 {
		return fmt.Errorf("redis: Options.%s %v is negative", field, *v)
	}
	if *v == 0 {
		*v = def
	}
	return nil
}

// rediser is the part of goredis.UniversalClient the Store uses.
type rediser interface {
	Pipeline() goredis.Pipeliner
	Process(ctx context.Context, cmd goredis.Cmder) error
	HGet(ctx context.Context, key, field string) *goredis.StringCmd
	Time(ctx context.Context) *goredis.TimeCmd
}

// Store is a strategy.Strategy on Redis. It is safe for concurrent use; it does
// not own the client, which the caller closes after the Store's last use.
type Store struct {
	client rediser
	opts   Options
	// noRetries is true when the client never re-sends a command, so a
	// connection that could not be made proves nothing was sent.
	noRetries     bool
	scriptPerCall int

	prefixes sync.Map // namespace -> []string: "<prefix>:{<namespace>.<shard>}:" per shard
	combiner combiner

	// Test hooks.
	now          func() time.Time // local clock, for Clock
	noIdempotent bool             // apply every send, as if batch ids did not exist
}

var _ strategy.Strategy = (*Store)(nil)

// ErrClientOptions is returned by New when the client's options would let a
// call outlive its context: the error names the option to set.
var ErrClientOptions = errors.New("redis: client options")

// New returns a Store that keeps its counters in Redis through client: a
// *goredis.Client, a Sentinel client from goredis.NewFailoverClient or a
// *goredis.ClusterClient. It returns an error naming the Options field that
// is out of range.
//
// The client must have ContextTimeoutEnabled set: without it go-redis lets a
// call to a Redis that accepts and never answers wait ReadTimeout for each of
// its attempts, whatever the context says, and the limiter could not keep its
// bounds (SyncTimeout for each store call, the deadline of Close). New
// refuses such a client with an error matching ErrClientOptions. (A client
// of another type, which New cannot inspect, must honour its context's
// deadline itself.)
//
// Configure the client's MaxRetries, ReadTimeout, WriteTimeout, DialTimeout
// and PoolTimeout explicitly. The Store stays exact with any of them, the
// default MaxRetries of 3 included, because every push is idempotent and an
// error after which an earlier attempt may have been applied is never taken
// for a refusal. MaxRetries -1 (no retries; with a ClusterClient, also
// MaxRedirects -1) lets a push that Redis refused, or that could not connect
// at all, report strategy.ErrNotApplied, so the caller may merge its hits with
// newer ones.
func New(client goredis.UniversalClient, opts Options) (*Store, error) {
	if client == nil {
		return nil, errors.New("redis: New: nil client")
	}
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	if _, ok := client.(*goredis.ClusterClient); ok && o.WaitReplicas > 0 {
		return nil, errors.New("redis: Options.WaitReplicas is not supported with a ClusterClient")
	}
	noRetries, err := inspectClient(client)
	if err != nil {
		return nil, err
	}
	s := &Store{client: client, opts: o, now: time.Now, noRetries: noRetries}
	s.scriptPerCall = min(maxScriptCounters, o.BatchSize)
	return s, nil
}

// inspectClient refuses a client that does not bound its calls by their
// context, and reports whether it makes a single attempt per command (no
// retries, no redirects), so that a failure proves nothing was applied.
func inspectClient(client goredis.UniversalClient) (noRetries bool, err error) {
	var ctxTimeout bool
	switch c := client.(type) {
	case *goredis.Client:
		o := c.Options() // normalized: MaxRetries 0 means no retries
		ctxTimeout, noRetries = o.ContextTimeoutEnabled, o.MaxRetries == 0
	case *goredis.ClusterClient:
		o := c.Options() // normalized: MaxRedirects 0 means none, MaxRetries -1 none
		ctxTimeout, noRetries = o.ContextTimeoutEnabled, o.MaxRedirects == 0 && o.MaxRetries <= 0
	case *goredis.Ring:
		ctxTimeout = c.Options().ContextTimeoutEnabled
	default:
		return false, nil
	}
	if !ctxTimeout {
		return false, fmt.Errorf("%w: set ContextTimeoutEnabled: true in the client's options, "+
			"so that every call returns by its context's deadline (SyncTimeout, Close's deadline); "+
			"without it a call to an unresponsive Redis waits ReadTimeout for each attempt", ErrClientOptions)
	}
	return noRetries, nil
}

// Options returns the Store's options, with defaults filled in.
func (s *Store) Options() Options { return s.opts }

// shardPrefixes returns, for each shard, the key prefix of namespace ns.
func (s *Store) shardPrefixes(ns string) []string {
	if p, ok := s.prefixes.Load(ns); ok {
		return p.([]string)
	}
	esc := escapeNamespace(ns)
	p := make([]string, s.opts.Shards)
	for i := range p {
		p[i] = s.opts.KeyPrefix + ":{" + esc + "." + strconv.Itoa(i) + "}:"
	}
	s.prefixes.Store(ns, p)
	return p
}

// escapeNamespace makes ns safe inside a hash tag: '{' and '}' would end or
// restart the tag, so they (and the escape character '%') are %-escaped.
func escapeNamespace(ns string) string {
	if !strings.ContainsAny(ns, "{}%") {
		return ns
	}
	var b strings.Builder
	for i := 0; i < len(ns); i++ {
		switch c := ns[i]; c {
		case '%':
			b.WriteString("%25")
		case '{':
			b.WriteString("%7B")
		case '}':
			b.WriteString("%7D")
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}

// hashKey returns the name of the hash holding window w of one shard.
func hashKey(prefix string, size time.Duration, start int64) string {
	buf := make([]byte, 0, len(prefix)+32)
	buf = append(buf, prefix...)
	buf = strconv.AppendInt(buf, size.Milliseconds(), 10)
	buf = append(buf, ':')
	buf = strconv.AppendInt(buf, start, 10)
	return string(buf)
}

// keyHash is a stable 64-bit hash of a counter key (FNV-1a, then a
// splitmix64 finalizer so that both halves are well mixed): the low half
// picks the shard, the high half the script call within a shard.
func keyHash(key string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(key); i++ {
		h ^= uint64(key[i])
		h *= 1099511628211
	}
	h ^= h >> 30
	h *= 0xbf58476d1ce4e5b9
	h ^= h >> 27
	h *= 0x94d049bb133111eb
	h ^= h >> 31
	return h
}

func (s *Store) shardOf(h uint64) int { return int(uint32(h) % uint32(s.opts.Shards)) }

// ttl is how long a hash of the given window size lives after a write.
func (s *Store) ttl(size time.Duration) int64 {
	return (2*size + s.opts.ExpiryMargin).Milliseconds()
}

func checkSize(size time.Duration) error {
	if size <= 0 || size%time.Millisecond != 0 {
		return fmt.Errorf("window size %v is not a positive whole number of milliseconds", size)
	}
	if size > strategy.MaxWindow {
		return fmt.Errorf("window size %v is longer than strategy.MaxWindow: its TTL would overflow", size)
	}
	return nil
}

func newBatchID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
