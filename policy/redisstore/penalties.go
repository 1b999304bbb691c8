package redisstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/ratesync/ratelimit/policy"
)

// Penalties is policy.Penalties in Redis: each node records rejections with
// one script call (a sorted set of rejection times per key, and the key's
// penalty deadlines), and every node learns new penalties from a pub/sub
// channel into a local cache that Check reads, so checking a request never
// waits on Redis. A node that missed a message learns the penalty at the
// key's next rejection there, since the script returns the penalty in force.
//
// Keys, for Options.Prefix p and client key k: "{p:esc:k}:r" (rejections)
// and "{p:esc:k}:p" (deadlines), expiring with them; channel "{p}:penalties".
type Penalties struct {
	c       goredis.UniversalClient
	prefix  string
	channel string
	cache   policy.PenaltyCache
	cancel  context.CancelFunc
	done    chan struct{}
	once    sync.Once
}

var _ policy.Penalties = (*Penalties)(nil)

// NewPenalties subscribes to the penalties channel and returns Penalties on
// c; Close stops it.
func NewPenalties(ctx context.Context, c goredis.UniversalClient, opts Options) (*Penalties, error) {
	p := opts.Prefix
	if p == "" {
		p = "ratelimit:policy"
	}
	pen := &Penalties{c: c, prefix: p, channel: "{" + p + "}:penalties", done: make(chan struct{})}
	ps := c.Subscribe(ctx, pen.channel)
	if _, err := ps.Receive(ctx); err != nil {
		_ = ps.Close()
		return nil, fmt.Errorf("redisstore: penalties: subscribe: %w", err)
	}
	lctx, cancel := context.WithCancel(context.Background())
	pen.cancel = cancel
	go pen.listen(lctx, ps)
	return pen, nil
}

// Close stops listening. Idempotent.
func (p *Penalties) Close() error {
	p.once.Do(func() {
		p.cancel()
		<-p.done
	})
	return nil
}

func (p *Penalties) listen(ctx context.Context, ps *goredis.PubSub) {
	defer close(p.done)
	defer ps.Close()
	msgs := ps.Channel()
	for {
		select {
		case <-ctx.Done():
			return
		case m, ok := <-msgs:
			if !ok {
				return
			}
			if key, pen, ok := parseMessage(m.Payload); ok {
				p.cache.Put(key, pen, time.Now())
			}
		}
	}
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
	return f[3], policy.Penalty{CooldownUntil: time.UnixMilli(cd), DenyUntil: time.UnixMilli(dn), Strikes: st}, true
}

// Check implements policy.Penalties.
func (p *Penalties) Check(key string, now time.Time) policy.Penalty { return p.cache.Get(key, now) }

// rejectScript records a rejection and computes the penalty, as
// policy.Escalate does.
var rejectScript = goredis.NewScript(`
local now, sw, base, maxcd = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local denyAfter, denyFor = tonumber(ARGV[5]), tonumber(ARGV[6])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - sw)
redis.call('ZADD', KEYS[1], now, ARGV[7])
redis.call('PEXPIRE', KEYS[1], sw + 1000)
local strikes = redis.call('ZCARD', KEYS[1]) - 1
local cd = tonumber(redis.call('HGET', KEYS[2], 'cd') or '0')
local dn = tonumber(redis.call('HGET', KEYS[2], 'dn') or '0')
local changed = false
if strikes >= 1 then
  local d = maxcd
  if strikes - 1 < 62 then
    local b = base * (2 ^ (strikes - 1))
    if b < d then d = b end
  end
  if now + d > cd then cd = now + d; changed = true end
  if denyAfter > 0 and strikes >= denyAfter and now + denyFor > dn then dn = now + denyFor; changed = true end
end
if changed then
  redis.call('HSET', KEYS[2], 'cd', cd, 'dn', dn)
  redis.call('PEXPIRE', KEYS[2], math.max(cd, dn) - now + 1000)
  redis.call('PUBLISH', ARGV[8], string.format('%d %d %d %s', cd, dn, strikes, ARGV[9]))
end
return {cd, dn, strikes}`)

// Reject implements policy.Penalties.
func (p *Penalties) Reject(ctx context.Context, key string, now time.Time, cfg *policy.Escalation, base time.Duration) (policy.Penalty, error) {
	tag := "{" + p.prefix + ":esc:" + key + "}:"
	var id [8]byte
	_, _ = rand.Read(id[:])
	res, err := rejectScript.Run(ctx, p.c, []string{tag + "r", tag + "p"},
		now.UnixMilli(), cfg.StrikeWindow.D().Milliseconds(), base.Milliseconds(), cfg.MaxCooldown.D().Milliseconds(),
		cfg.DenyAfter, cfg.DenyFor.D().Milliseconds(), hex.EncodeToString(id[:]), p.channel, key).Int64Slice()
	if err != nil || len(res) != 3 {
		return policy.Penalty{}, fmt.Errorf("redisstore: reject %q: %w", key, err)
	}
	pen := policy.Penalty{Strikes: res[2]}
	if res[0] > 0 {
		pen.CooldownUntil = time.UnixMilli(res[0])
	}
	if res[1] > 0 {
		pen.DenyUntil = time.UnixMilli(res[1])
	}
	p.cache.Put(key, pen, now) // this node knows at once, whatever the channel does
	return pen, nil
}
