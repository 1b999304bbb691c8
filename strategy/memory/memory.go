// Package memory is an in-process strategy.Strategy. One Store shared by several
// registries in one process behaves as one central store: this is how tests and
// demos simulate a cluster without servers. It can inject faults (refused
// requests, lost requests, lost replies) so callers can prove they neither lose
// nor double-count hits.
package memory

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"iter"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ratesync/ratelimit/internal/slidelog"
	"github.com/ratesync/ratelimit/strategy"
)

// Op names a store operation, for fault injection.
type Op int

// The operations a fault can target.
const (
	OpPush Op = iota
	OpGetCounters
	OpGetWindow
	OpPurge
	OpTake
)

// Fault is what an injected fault does to one operation.
type Fault int

const (
	// NoFault lets the operation run.
	NoFault Fault = iota
	// Refuse fails the operation before it touches the data, with an error
	// that matches strategy.ErrNotApplied.
	Refuse
	// LoseRequest fails the operation before it touches the data, but reports
	// an unknown outcome (as a timeout would).
	LoseRequest
	// LoseReply applies the operation and then reports an unknown outcome (as
	// a connection dropped after the store answered would).
	LoseReply
)

// ErrInjected is returned by a call that an injected fault made fail.
var ErrInjected = errors.New("memory: injected fault")

// window names a window of one size; a namespace maps windows to their counters.
type window struct {
	size  time.Duration
	start int64
}

type windows map[window]*counters

// Store is an in-process central store. The zero value is not usable; call New.
type Store struct {
	mu sync.Mutex
	// counters[namespace][window] holds the window's counters by key. Nesting
	// lets Purge drop whole windows, and a push to look a window up once per
	// run of counters in it.
	counters map[string]windows
	// applied maps a batch ID to the end of the latest window it touched, so
	// Purge can forget IDs whose windows are gone.
	applied map[string]int64
	seed    maphash.Seed
	hashes  []uint64 // a push's key hashes, reused (guarded by mu)
	// incarnations numbers the windows' tables as they are created, so a
	// cursor of a purged window is never taken for one of its successor's.
	incarnations uint64
	buckets      map[string]map[strategy.BucketID]strategy.BucketState // by namespace
	logs         map[string]map[logID]*slidelog.Log                    // by namespace
	takes        map[string]takeRecord                                 // decided Take IDs

	faults atomic.Pointer[func(Op) Fault]
	pushes atomic.Int64
}

// New returns an empty Store, safe for concurrent use.
func New() *Store {
	return &Store{counters: make(map[string]windows), applied: make(map[string]int64), seed: maphash.MakeSeed(),
		buckets: make(map[string]map[strategy.BucketID]strategy.BucketState), logs: make(map[string]map[logID]*slidelog.Log),
		takes: make(map[string]takeRecord)}
}

var (
	_ strategy.Strategy = (*Store)(nil)
	_ strategy.Capable  = (*Store)(nil)
	_ strategy.Taker    = (*Store)(nil)
)

// Capabilities reports that the memory store implements every part of the
// contract.
func (s *Store) Capabilities() strategy.Capabilities {
	return strategy.Capabilities{Watch: true, Buckets: true, Take: true}
}

// SetFaults installs f, called before every operation to decide its fault; nil
// removes it. f must be safe for concurrent use.
func (s *Store) SetFaults(f func(Op) Fault) {
	if f == nil {
		s.faults.Store(nil)
		return
	}
	s.faults.Store(&f)
}

// Pushes returns how many PushDiffs calls reached the store (including faulty ones).
func (s *Store) Pushes() int64 { return s.pushes.Load() }

func (s *Store) fault(op Op) Fault {
	if f := s.faults.Load(); f != nil {
		return (*f)(op)
	}
	return NoFault
}

func faultError(f Fault, op string) error {
	if f == Refuse {
		return fmt.Errorf("memory: %s: %w: %w", op, ErrInjected, strategy.ErrNotApplied)
	}
	return fmt.Errorf("memory: %s: %w: outcome unknown", op, ErrInjected)
}

// PushDiffs applies b's diffs once per batch ID and reads b's counters.
func (s *Store) PushDiffs(ctx context.Context, b *strategy.Batch) (strategy.Result, error) {
	s.pushes.Add(1)
	if err := ctx.Err(); err != nil {
		return strategy.Result{}, fmt.Errorf("memory: push: %w: %w", err, strategy.ErrNotApplied)
	}
	f := s.fault(OpPush)
	if f == Refuse || f == LoseRequest {
		return strategy.Result{}, faultError(f, "push")
	}
	// One allocation for both answers.
	nd := len(b.Diffs)
	buf := make([]int64, nd+len(b.Reads))
	res := strategy.Result{Totals: buf[:nd:nd], Reads: buf[nd:]}
	s.mu.Lock()
	_, seen := s.applied[b.ID]
	ws := s.counters[b.Namespace]
	if ws == nil {
		ws = make(windows)
		s.counters[b.Namespace] = ws
	}
	// Every key is hashed once, in a pass of its own: the misses on the
	// keys' bytes overlap, and so do the lookups' below.
	hs := s.hashKeys(b)
	var end int64
	var last window
	var c *counters
	for i := range b.Diffs {
		d := &b.Diffs[i]
		if w := (window{d.Size, d.Start}); i == 0 || w != last {
			last, c = w, ws[w]
			if c == nil && !seen {
				s.incarnations++
				c = &counters{inc: s.incarnations}
				ws[w] = c
			}
			if !seen {
				c.bump(b.ID)
			}
			end = max(end, d.Start+2*d.Size.Milliseconds())
		}
		if seen {
			res.Totals[i] = c.get(hs[i], d.Key)
			continue
		}
		n := c.add(hs[i], d.Key, d.Delta)
		res.Totals[i] = n
	}
	if len(b.BucketDiffs) > 0 {
		res.Buckets = s.applyBuckets(b, seen)
		for i := range b.BucketDiffs {
			end = max(end, strategy.BucketExpiry(res.Buckets[i], b.BucketDiffs[i].Period))
		}
	}
	if !seen && b.ID != "" {
		s.applied[b.ID] = end
	}
	hs = hs[nd:]
	for i := range b.Reads {
		id := &b.Reads[i]
		if w := (window{id.Size, id.Start}); i == 0 || w != last {
			last, c = w, ws[w]
		}
		res.Reads[i] = c.get(hs[i], id.Key)
	}
	if len(b.BucketReads) > 0 {
		res.BucketReads = make([]strategy.BucketState, len(b.BucketReads))
		for i, id := range b.BucketReads {
			res.BucketReads[i] = s.buckets[b.Namespace][id]
		}
	}
	if len(b.Watches) > 0 {
		res.Changes = make([]strategy.Changes, len(b.Watches))
		for i, w := range b.Watches {
			res.Changes[i] = ws[window{w.Size, w.Start}].since(w)
		}
	}
	s.mu.Unlock()
	if f == LoseReply {
		return strategy.Result{}, faultError(f, "push")
	}
	return res, nil
}

// GetCounters returns the current and previous windows of q's sizes at q.Now.
func (s *Store) GetCounters(ctx context.Context, q strategy.Query) iter.Seq2[strategy.Counter, error] {
	return func(yield func(strategy.Counter, error) bool) {
		if err := ctx.Err(); err != nil {
			yield(strategy.Counter{}, fmt.Errorf("memory: get counters: %w", err))
			return
		}
		if f := s.fault(OpGetCounters); f != NoFault {
			yield(strategy.Counter{}, faultError(f, "get counters"))
			return
		}
		var hs []uint64
		if q.Keys != nil {
			hs = make([]uint64, len(q.Keys))
			for i, key := range q.Keys {
				hs[i] = s.hash(key)
			}
		}
		var out []strategy.Counter
		s.mu.Lock()
		ws := s.counters[q.Namespace]
		for _, size := range q.Sizes {
			cur := strategy.WindowStart(q.Now, size)
			for _, start := range [2]int64{cur, cur - size.Milliseconds()} {
				c := ws[window{size, start}]
				if c == nil {
					continue
				}
				id := strategy.CounterID{Size: size, Start: start}
				if q.Keys == nil {
					for i := range c.slots {
						if sl := &c.slots[i]; sl.hash != 0 {
							id.Key = sl.key
							out = append(out, strategy.Counter{CounterID: id, Count: sl.n})
						}
					}
					continue
				}
				for i, key := range q.Keys {
					if n, ok := c.lookup(hs[i], key); ok {
						id.Key = key
						out = append(out, strategy.Counter{CounterID: id, Count: n})
					}
				}
			}
		}
		s.mu.Unlock()
		for _, c := range out {
			if !yield(c, nil) {
				return
			}
		}
	}
}

// GetWindow returns one counter's total.
func (s *Store) GetWindow(ctx context.Context, namespace string, id strategy.CounterID) (int64, error) {
	if err := ctx.Err(); err != nil {
		return 0, fmt.Errorf("memory: get window: %w", err)
	}
	if f := s.fault(OpGetWindow); f != NoFault {
		return 0, faultError(f, "get window")
	}
	h := s.hash(id.Key)
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.counters[namespace][window{id.Size, id.Start}].get(h, id.Key), nil
}

// Purge removes counters older than the previous window at now, and forgets
// the batch IDs that only touched such windows.
func (s *Store) Purge(ctx context.Context, now int64) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("memory: purge: %w", err)
	}
	if f := s.fault(OpPurge); f != NoFault {
		return faultError(f, "purge")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for ns, ws := range s.counters {
		for w := range ws {
			if w.start+2*w.size.Milliseconds() <= now {
				delete(ws, w)
			}
		}
		if len(ws) == 0 {
			delete(s.counters, ns)
		}
	}
	for id, end := range s.applied {
		if end <= now {
			delete(s.applied, id)
		}
	}
	s.purgeBuckets(now)
	s.purgeLogs(now)
	return nil
}

// Len returns how many counters the store holds.
func (s *Store) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, ws := range s.counters {
		for _, c := range ws {
			n += c.n
		}
	}
	return n
}

// hashKeys returns the hashes of b's diff keys followed by its read keys, in
// s.hashes when they fit. The caller holds s.mu.
func (s *Store) hashKeys(b *strategy.Batch) []uint64 {
	n := len(b.Diffs) + len(b.Reads)
	if n > maxKeptHashes {
		return s.hashInto(make([]uint64, n), b) // not kept: a burst's memory goes back
	}
	if cap(s.hashes) < n {
		s.hashes = make([]uint64, n, min(max(n, 2*cap(s.hashes)), maxKeptHashes))
	}
	return s.hashInto(s.hashes[:n], b)
}

// maxKeptHashes bounds the hash buffer a Store keeps between pushes (512 KiB).
const maxKeptHashes = 1 << 16

func (s *Store) hashInto(hs []uint64, b *strategy.Batch) []uint64 {
	for i := range b.Diffs {
		hs[i] = s.hash(b.Diffs[i].Key)
	}
	rs := hs[len(b.Diffs):]
	for i := range b.Reads {
		rs[i] = s.hash(b.Reads[i].Key)
	}
	return hs
}

// hash returns key's hash, never 0 (which marks an empty slot).
func (s *Store) hash(key string) uint64 {
	if h := maphash.String(s.seed, key); h != 0 {
		return h
	}
	return 1
}

// counters is one window's counters: an open-addressing hash table with
// linear probing. Keys are never removed one by one (Purge drops whole
// windows), so it needs no tombstones. Each slot holds the key's hash, so a
// lookup usually touches one cache line and rehashing on growth hashes
// nothing.
type counters struct {
	slots []counter // len is a power of two, or 0
	n     int
	// inc is the table's incarnation, unique in its Store; ver counts the
	// pushes that changed it; log lists the changes, oldest first (see
	// watch.go).
	inc, ver  uint64
	log       []change
	lastBatch string // the batch that last bumped ver
}

type counter struct {
	hash uint64 // 0 for an empty slot
	key  string
	n    int64
	ver  uint64 // the version of the counter's last change
}

// get returns key's total (h is its hash), 0 when absent. c may be nil.
func (c *counters) get(h uint64, key string) int64 {
	n, _ := c.lookup(h, key)
	return n
}

// lookup returns key's total (h is its hash) and whether c holds it. c may
// be nil.
func (c *counters) lookup(h uint64, key string) (int64, bool) {
	if c == nil || len(c.slots) == 0 {
		return 0, false
	}
	m := uint64(len(c.slots) - 1)
	for i := h & m; ; i = (i + 1) & m {
		sl := &c.slots[i]
		if sl.hash == h && sl.key == key {
			return sl.n, true
		}
		if sl.hash == 0 {
			return 0, false
		}
	}
}

// add adds d to key's total (h is its hash), creating the counter if needed,
// and returns the new total.
func (c *counters) add(h uint64, key string, d int64) int64 {
	if (c.n+1)*4 > len(c.slots)*3 { // load factor at most 3/4
		c.grow()
	}
	m := uint64(len(c.slots) - 1)
	for i := h & m; ; i = (i + 1) & m {
		sl := &c.slots[i]
		if sl.hash == h && sl.key == key {
			sl.n = saturatingAdd(sl.n, d)
			c.changed(sl)
			return sl.n
		}
		if sl.hash == 0 {
			// A copy: the caller's key may share memory the store must not
			// keep alive (the counter table stores short keys inside its
			// entries, which an evicted entry would otherwise outlive).
			*sl = counter{hash: h, key: strings.Clone(key), n: saturatingAdd(0, d)}
			c.n++
			c.changed(sl)
			return sl.n
		}
	}
}

func (c *counters) grow() {
	old := c.slots
	c.slots = make([]counter, max(8, 2*len(old)))
	m := uint64(len(c.slots) - 1)
	for _, sl := range old {
		if sl.hash == 0 {
			continue
		}
		i := sl.hash & m
		for c.slots[i].hash != 0 {
			i = (i + 1) & m
		}
		c.slots[i] = sl
	}
}

// saturatingAdd returns n+d, kept within ±strategy.MaxTotal.
func saturatingAdd(n, d int64) int64 {
	// |n| <= MaxTotal and a diff is far below 2^62 in magnitude in practice;
	// clamp d first so that even a hostile diff cannot overflow the sum.
	d = min(max(d, -2*strategy.MaxTotal), 2*strategy.MaxTotal)
	return min(max(n+d, -strategy.MaxTotal), strategy.MaxTotal)
}
