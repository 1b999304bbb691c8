package policy

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// Penalty is a key's escalation state.
type Penalty struct {
	// CooldownUntil: until then every request of the key is answered 429.
	CooldownUntil time.Time
	// DenyUntil: until then the key is denied, as if on the deny list.
	DenyUntil time.Time
	// Strikes is the number of strikes in the strike window, as of the last
	// rejection recorded.
	Strikes int64
}

// Penalties keeps escalation state (see Escalation) and shares it across
// the nodes of a cluster: MemoryPenalties in one process,
// redisstore.Penalties across processes.
type Penalties interface {
	// Check returns the key's penalty in force at now. It must be cheap and
	// never wait on the network: the middleware calls it on every request
	// when the policy escalates.
	Check(key string, now time.Time) Penalty
	// Reject records that a request of key was rejected at now (base is the
	// binding limit's window) and returns the penalty in force after it.
	// Every node learns the penalty soon after.
	Reject(ctx context.Context, key string, now time.Time, cfg *Escalation, base time.Duration) (Penalty, error)
}

// Escalate computes a penalty: given the rejections of a key inside the
// strike window (this one included), the first of which is not a strike,
// and the penalty in force, it returns the new penalty. The cooldown is
// base doubled per strike after the first, at most MaxCooldown; DenyAfter
// strikes deny the key for DenyFor. A penalty never shrinks.
func Escalate(cfg *Escalation, rejections int64, now time.Time, base time.Duration, cur Penalty) Penalty {
	strikes := rejections - 1
	p := cur
	p.Strikes = max(strikes, 0)
	if strikes < 1 {
		return p
	}
	cd := cfg.MaxCooldown.D()
	if strikes-1 < 62 {
		if d := base << (strikes - 1); d > 0 && d < cd {
			cd = d
		}
	}
	if until := now.Add(cd); until.After(p.CooldownUntil) {
		p.CooldownUntil = until
	}
	if cfg.DenyAfter > 0 && strikes >= cfg.DenyAfter {
		if until := now.Add(cfg.DenyFor.D()); until.After(p.DenyUntil) {
			p.DenyUntil = until
		}
	}
	return p
}

// PenaltyCache is the local view of penalties a node keeps, for Check. It is
// safe for concurrent use; a lookup costs one atomic load while no key is
// penalized.
type PenaltyCache struct {
	n    atomic.Int64
	mu   sync.RWMutex
	m    map[string]Penalty // GUARDED_BY(mu)
	puts int                // GUARDED_BY(mu)
}

// Get returns key's penalty in force at now.
func (c *PenaltyCache) Get(key string, now time.Time) Penalty {
	if c.n.Load() == 0 {
		return Penalty{}
	}
	c.mu.RLock()
	p, ok := c.m[key]
	c.mu.RUnlock()
	if !ok || now.Before(p.CooldownUntil) || now.Before(p.DenyUntil) {
		return p
	}
	c.mu.Lock() // expired: forget it
	if q, ok := c.m[key]; ok && !now.Before(q.CooldownUntil) && !now.Before(q.DenyUntil) {
		delete(c.m, key)
		c.n.Store(int64(len(c.m)))
	}
	c.mu.Unlock()
	return Penalty{}
}

// Put records key's penalty (keeping the later of each deadline). Every
// 1,024 puts, penalties expired at now are forgotten, so the cache holds
// about the keys penalized lately.
func (c *PenaltyCache) Put(key string, p Penalty, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[string]Penalty{}
	}
	if c.puts++; c.puts%1024 == 0 {
		for k, q := range c.m {
			if !now.Before(q.CooldownUntil) && !now.Before(q.DenyUntil) {
				delete(c.m, k)
			}
		}
	}
	q := c.m[key]
	if p.CooldownUntil.After(q.CooldownUntil) {
		q.CooldownUntil = p.CooldownUntil
	}
	if p.DenyUntil.After(q.DenyUntil) {
		q.DenyUntil = p.DenyUntil
	}
	q.Strikes = p.Strikes
	c.m[key] = q
	c.n.Store(int64(len(c.m)))
}

// MemoryPenalties is Penalties in one process; nodes that share one share
// their penalties. Rejection times are kept per key until the strike window
// forgets them.
type MemoryPenalties struct {
	cache PenaltyCache
	mu    sync.Mutex
	rej   map[string][]time.Time // GUARDED_BY(mu)
	calls int                    // GUARDED_BY(mu)
}

var _ Penalties = (*MemoryPenalties)(nil)

// NewMemoryPenalties returns an empty MemoryPenalties.
func NewMemoryPenalties() *MemoryPenalties {
	return &MemoryPenalties{rej: map[string][]time.Time{}}
}

// Check implements Penalties.
func (m *MemoryPenalties) Check(key string, now time.Time) Penalty { return m.cache.Get(key, now) }

// Reject implements Penalties.
func (m *MemoryPenalties) Reject(_ context.Context, key string, now time.Time, cfg *Escalation, base time.Duration) (Penalty, error) {
	m.mu.Lock()
	from := now.Add(-cfg.StrikeWindow.D())
	rs := m.rej[key]
	i := 0
	for i < len(rs) && !rs[i].After(from) {
		i++
	}
	rs = append(rs[i:], now)
	m.rej[key] = rs
	n := int64(len(rs))
	if m.calls++; m.calls%1024 == 0 { // forget keys the strike window forgot
		for k, ts := range m.rej {
			if !ts[len(ts)-1].After(from) {
				delete(m.rej, k)
			}
		}
	}
	m.mu.Unlock()
	p := Escalate(cfg, n, now, base, m.cache.Get(key, now))
	m.cache.Put(key, p, now)
	return p, nil
}
