package shm

import (
	"errors"
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ratesync/ratelimit/internal/slidelog"
	"github.com/ratesync/ratelimit/strategy"
)

// Logs is a table of sliding logs of one window size, one per key: every
// admitted request's instant and cost, so a limit counts exactly the requests
// of the last window. A log holds at most twice its limit's Max entries (see
// slidelog.Log.Add), so memory is bounded per key by the limit. Its methods
// are safe for concurrent use.
type Logs struct {
	window    int64 // ms
	seed      maphash.Seed
	shards    []lshard
	mask      uint64
	seq       atomic.Uint64
	evictions atomic.Int64
}

type lshard struct {
	mu  sync.RWMutex
	m   map[string]*logEntry
	cap int
	_   [64]byte
}

type logEntry struct {
	key  string
	ref  atomic.Bool
	mu   sync.Mutex
	dead bool         // removed from the table (guarded by mu)
	log  slidelog.Log // guarded by mu
	seqs []uint64     // seqs[i] identifies log.Entries[i] for Remove (guarded by mu)
	// A store's answer (synchronous mode): a request of blockCost does not
	// fit before block.Fits (guarded by mu).
	blockCost int64
	block     strategy.LogState
}

// NewLogs returns an empty table of logs of the given window, holding at most
// maxKeys keys (0 means 1<<20).
func NewLogs(window time.Duration, maxKeys int) (*Logs, error) {
	if window <= 0 || window%time.Millisecond != 0 {
		return nil, errors.Join(ErrConfig, errors.New("shm: a log window must be a positive whole number of milliseconds"))
	}
	if maxKeys == 0 {
		maxKeys = 1 << 20
	}
	if maxKeys < 0 {
		return nil, errors.Join(ErrConfig, errors.New("shm: MaxKeys must not be negative"))
	}
	n := 1
	for n < 256 && n*64 <= maxKeys {
		n *= 2
	}
	l := &Logs{window: window.Milliseconds(), seed: maphash.MakeSeed(), shards: make([]lshard, n), mask: uint64(n - 1)}
	for i := range l.shards {
		l.shards[i].m = make(map[string]*logEntry)
		l.shards[i].cap = maxKeys / n
		if i < maxKeys%n {
			l.shards[i].cap++
		}
	}
	return l, nil
}

// Evictions returns how many logs the key cap evicted.
func (l *Logs) Evictions() int64 { return l.evictions.Load() }

// Len returns how many logs the table holds.
func (l *Logs) Len() int {
	n := 0
	for i := range l.shards {
		s := &l.shards[i]
		s.mu.RLock()
		n += len(s.m)
		s.mu.RUnlock()
	}
	return n
}

func (l *Logs) get(key string, now int64) *logEntry {
	s := &l.shards[maphash.String(l.seed, key)&l.mask]
	s.mu.RLock()
	e := s.m[key]
	s.mu.RUnlock()
	if e != nil {
		if !e.ref.Load() {
			e.ref.Store(true)
		}
		return e
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if e = s.m[key]; e != nil {
		return e
	}
	if len(s.m) >= s.cap {
		l.makeRoom(s, now)
	}
	e = &logEntry{key: cloneKey(key)}
	s.m[e.key] = e
	return e
}

// locked returns key's log locked, created when missing. A log is removed
// (makeRoom) maybe between the lookup and the lock: one found dead is looked
// up again, so nothing is added to a log the table has dropped.
func (l *Logs) locked(key string, now int64) *logEntry {
	for {
		e := l.get(key, now)
		if testHookFound != nil {
			testHookFound()
		}
		e.mu.Lock()
		if !e.dead {
			return e
		}
		e.mu.Unlock()
	}
}

// makeRoom removes one log from a full shard: an empty one, or the first not
// used since the walk last passed. The caller holds s.mu for writing.
func (l *Logs) makeRoom(s *lshard, now int64) {
	for pass := 0; pass < 2; pass++ {
		for k, e := range s.m {
			// Decided and marked under e.mu: what a Try adds before is in
			// the log judged, and a Try after finds it dead.
			e.mu.Lock()
			e.prune(now, l.window)
			empty := len(e.log.Entries) == 0
			evict := empty || !e.ref.Load()
			e.dead = evict
			e.mu.Unlock()
			if evict {
				if !empty {
					l.evictions.Add(1)
				}
				delete(s.m, k)
				return
			}
			e.ref.Store(false)
		}
	}
}

// prune drops the entries that left the window at now. The caller holds e.mu.
func (e *logEntry) prune(now, window int64) {
	n := len(e.log.Entries)
	e.log.Prune(now, window)
	if gone := n - len(e.log.Entries); gone > 0 {
		e.seqs = append(e.seqs[:0], e.seqs[gone:]...)
	}
}

// LogTicket identifies an entry Try added, for Remove.
type LogTicket uint64

// Try judges a request of cost at now on key's log, against max: it returns
// the log's state at now for that cost (before the request) and whether it
// fits, and adds the request when add is set and it fits, or when force is
// set. The ticket names the added entry (0 when none was added).
func (l *Logs) Try(key string, now, max, cost int64, add, force bool) (st strategy.LogState, fits bool, ticket LogTicket) {
	e := l.locked(key, now)
	defer e.mu.Unlock()
	e.prune(now, l.window)
	st = e.log.State(now, l.window, max, cost)
	fits = st.Count+cost <= max
	if force || (add && fits) {
		n := len(e.log.Entries)
		e.log.Add(slidelog.Entry{At: now, Cost: cost}, max)
		if len(e.log.Entries) > n {
			ticket = LogTicket(l.seq.Add(1))
			e.seqs = append(e.seqs, uint64(ticket))
		} else if n > 0 {
			// Merged into the newest entry: the ticket names it.
			ticket = LogTicket(e.seqs[n-1])
		}
	}
	return st, fits, ticket
}

// Remove takes back cost from the entry ticket names in key's log: a request
// Try added and another limit rejected.
func (l *Logs) Remove(key string, ticket LogTicket, cost int64) {
	if ticket == 0 {
		return
	}
	e := l.locked(key, 0)
	defer e.mu.Unlock()
	for i, s := range e.seqs {
		if s != uint64(ticket) {
			continue
		}
		if en := &e.log.Entries[i]; en.Cost > cost {
			en.Cost -= cost
			return
		}
		e.log.Entries = append(e.log.Entries[:i], e.log.Entries[i+1:]...)
		e.seqs = append(e.seqs[:i], e.seqs[i+1:]...)
		return
	}
}

// TakeBack takes cost back from the newest entries of key's log (Refund).
func (l *Logs) TakeBack(key string, now, cost int64) {
	e := l.locked(key, now)
	defer e.mu.Unlock()
	e.log.TakeBack(cost)
	e.seqs = e.seqs[:len(e.log.Entries)]
}

// State returns key's log state at now for a request of cost under max,
// without adding anything, and whether the table holds the key.
func (l *Logs) State(key string, now, max, cost int64) (strategy.LogState, bool) {
	s := &l.shards[maphash.String(l.seed, key)&l.mask]
	s.mu.RLock()
	e := s.m[key]
	s.mu.RUnlock()
	if e == nil {
		return strategy.LogState{Fits: now, Empty: now}, false
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.prune(now, l.window)
	return e.log.State(now, l.window, max, cost), true
}

// Block records that the store found key's log, at now, in state st for a
// request of cost: full until st.Fits. No such request fits before it, since
// other nodes only add entries. Synchronous mode answers such requests from
// memory (its circuit breaker).
func (l *Logs) Block(key string, now, cost int64, st strategy.LogState) {
	e := l.locked(key, now)
	e.blockCost, e.block = cost, st
	e.mu.Unlock()
}

// Blocked returns the state the store last reported for key's log for a
// request of cost, and whether that request is known not to fit at now. Only
// a request of the cost the store judged is answered, so that the instant it
// fits is the true one for it.
func (l *Logs) Blocked(key string, now, cost int64) (strategy.LogState, bool) {
	s := &l.shards[maphash.String(l.seed, key)&l.mask]
	s.mu.RLock()
	e := s.m[key]
	s.mu.RUnlock()
	if e == nil {
		return strategy.LogState{}, false
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if cost == e.blockCost && now < e.block.Fits {
		return e.block, true
	}
	return strategy.LogState{}, false
}
