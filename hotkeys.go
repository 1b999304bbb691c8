package ratelimit

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"
)

// HotKeysConfig turns on the hot-key report (Namespace.HotKeys): a bounded
// heavy-hitter sketch of the keys with the most checks and the most
// rejections over the last minute. Off by default.
//
// Keys may be personal data: they stay in this process's memory and are shown
// only where the operator asks (Namespace.HotKeys, metrics.HotKeysHandler, the
// Collector's opt-in key gauge).
type HotKeysConfig struct {
	// Capacity is how many keys the sketch holds for each measure (checks,
	// rejections) and each of the two minutes it keeps (the current and the
	// previous): the memory budget, about 4 × Capacity × (60 bytes + key).
	// It is split over 16 shards by key, at least 8 keys each. 0 (the
	// default) turns the report off; otherwise at least 16. Within a shard,
	// a key whose sampled count exceeds the shard's sampled checks divided
	// by its capacity is always held (the space-saving guarantee).
	Capacity int
	// SampleRate records one check in SampleRate, chosen at random, and
	// scales the counts back up: a power of two, default 64. Heavy hitters
	// are the keys with many checks, so sampling loses them no accuracy that
	// matters, and keeps the cost per check to a random number and a branch.
	SampleRate int
}

func (c *HotKeysConfig) normalize() error {
	if c.Capacity == 0 {
		return nil
	}
	if c.Capacity < 16 {
		return fmt.Errorf("%w: HotKeys.Capacity: %d is below 16", ErrInvalidConfig, c.Capacity)
	}
	if c.SampleRate == 0 {
		c.SampleRate = 64
	}
	if c.SampleRate < 1 || c.SampleRate&(c.SampleRate-1) != 0 {
		return fmt.Errorf("%w: HotKeys.SampleRate: %d is not a power of two", ErrInvalidConfig, c.SampleRate)
	}
	return nil
}

// HotKey is one key of the hot-key report.
type HotKey struct {
	Key string
	// Count estimates the key's checks (or rejections) over the last minute,
	// sliding: the current minute's plus the previous minute's weighted by the
	// part of it still inside the last 60 s. Sampled counts are scaled by the
	// sample rate.
	Count float64
	// Error bounds how much Count may overstate: the space-saving sketch
	// credits a newly tracked key with the count of the key it replaced.
	Error float64
}

// HotKeys is the hot-key report of a namespace.
type HotKeys struct {
	// Window is the span the counts cover: one minute.
	Window time.Duration
	// ByChecks and ByRejections list the keys with the most decisions of
	// Allow, and the most rejections, highest first.
	ByChecks, ByRejections []HotKey
}

const (
	hotWindowMS = 60_000
	hotShards   = decisionStripes // a key's shard is its decision stripe
)

// hotKeys is the sketch: per shard, two space-saving summaries (checks,
// rejections) for the current and the previous minute.
type hotKeys struct {
	mask   uint32 // a check is sampled when rand & mask == 0
	scale  float64
	perCap int
	now    func() int64 // Unix ms
	shards [hotShards]hotShard
}

type hotShard struct {
	mu    sync.Mutex
	epoch int64          // GUARDED_BY(mu): minute of cur, Unix ms / 60,000
	cur   [2]spaceSaving // GUARDED_BY(mu): checks, rejections
	prev  [2]spaceSaving // GUARDED_BY(mu)
	_     [32]byte       // keep shards' locks off one another's lines
}

func newHotKeys(c HotKeysConfig, now func() int64) *hotKeys {
	if c.Capacity == 0 {
		return nil
	}
	h := &hotKeys{mask: uint32(c.SampleRate - 1), scale: float64(c.SampleRate), now: now,
		perCap: max((c.Capacity+hotShards-1)/hotShards, 8)}
	for i := range h.shards {
		s := &h.shards[i]
		for m := range 2 {
			s.cur[m].init(h.perCap)
			s.prev[m].init(h.perCap)
		}
	}
	return h
}

// record counts one decision for key (as stored). It is the hot path: most
// calls return after one random number.
func (h *hotKeys) record(key string, rejected bool) {
	if rand.Uint32()&h.mask != 0 {
		return
	}
	s := &h.shards[stripeOf(key)]
	now := h.now()
	s.mu.Lock()
	s.rotate(now)
	s.cur[0].add(key)
	if rejected {
		s.cur[1].add(key)
	}
	s.mu.Unlock()
}

// rotate moves the summaries on to the minute holding now.
func (s *hotShard) rotate(now int64) {
	epoch := now / hotWindowMS
	switch {
	case epoch == s.epoch:
	case epoch == s.epoch+1:
		s.cur, s.prev = s.prev, s.cur
		s.cur[0].reset()
		s.cur[1].reset()
	case epoch > s.epoch:
		for m := range 2 {
			s.cur[m].reset()
			s.prev[m].reset()
		}
	default:
		return // the clock went back: keep counting in the current minute
	}
	s.epoch = epoch
}

// report returns the n hottest keys of each measure.
func (h *hotKeys) report(n int) HotKeys {
	now := h.now()
	weight := 1 - float64(now%hotWindowMS)/hotWindowMS
	r := HotKeys{Window: time.Minute}
	var lists [2][]HotKey
	for i := range h.shards {
		s := &h.shards[i]
		s.mu.Lock()
		s.rotate(now)
		for m := range 2 {
			merged := map[string]HotKey{}
			for _, it := range s.cur[m].items {
				merged[it.key] = HotKey{Key: it.key, Count: float64(it.count), Error: float64(it.err)}
			}
			for _, it := range s.prev[m].items {
				k := merged[it.key]
				k.Key = it.key
				k.Count += float64(it.count) * weight
				k.Error += float64(it.err) * weight
				merged[it.key] = k
			}
			for _, k := range merged {
				k.Count *= h.scale
				k.Error *= h.scale
				lists[m] = append(lists[m], k)
			}
		}
		s.mu.Unlock()
	}
	for m := range 2 {
		l := lists[m]
		slices.SortFunc(l, func(a, b HotKey) int {
			if c := cmp.Compare(b.Count, a.Count); c != 0 {
				return c
			}
			return cmp.Compare(a.Key, b.Key)
		})
		lists[m] = l[:min(n, len(l))]
	}
	r.ByChecks, r.ByRejections = lists[0], lists[1]
	return r
}

// spaceSaving is the space-saving summary (Metwally et al.) of a stream: at
// most cap keys with counts; a new key replaces the one with the least count
// and inherits that count as its error bound. A key whose true count exceeds
// the stream's length divided by cap is always held.
type spaceSaving struct {
	idx   map[string]int32
	items []ssItem
	cap   int
}

type ssItem struct {
	key        string
	count, err int64
}

func (s *spaceSaving) init(capacity int) {
	s.cap = capacity
	s.idx = make(map[string]int32, capacity)
	s.items = make([]ssItem, 0, capacity)
}

func (s *spaceSaving) reset() {
	clear(s.idx)
	s.items = s.items[:0]
}

func (s *spaceSaving) add(key string) {
	if i, ok := s.idx[key]; ok {
		s.items[i].count++
		return
	}
	if len(s.items) < s.cap {
		s.idx[key] = int32(len(s.items))
		s.items = append(s.items, ssItem{key: key, count: 1})
		return
	}
	// Evict the least count: a linear scan of a small array costs less than
	// keeping a heap ordered on every increment.
	low := 0
	for i := 1; i < len(s.items); i++ {
		if s.items[i].count < s.items[low].count {
			low = i
		}
	}
	old := s.items[low]
	delete(s.idx, old.key)
	s.idx[key] = int32(low)
	s.items[low] = ssItem{key: key, count: old.count + 1, err: old.count}
}

// HotKeys returns the n keys with the most checks and the n with the most
// rejections over the last minute (n <= 0: all the sketch holds), or a
// report with empty lists when Config.HotKeys is off.
func (ns *Namespace) HotKeys(n int) HotKeys {
	if ns.hot == nil {
		return HotKeys{Window: time.Minute}
	}
	if n <= 0 {
		n = hotShards * ns.hot.perCap
	}
	return ns.hot.report(n)
}
