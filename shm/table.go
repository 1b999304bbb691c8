// Package shm is the rate limiter's in-memory counter table: the Go analogue of
// the nginx shared-memory zone (lua_shared_dict) that Kong's library keeps its
// counters in. Only the root package, ratelimit, uses it: a Namespace holds one
// Table per pair of window sizes. Applications use the root package instead.
//
// In Kong's terms:
//
//   - a Table is the shared dict, keyed by (key, window size, window start);
//   - an entry's "local" count is Kong's diff: hits counted here
//     and not yet confirmed by the store; "synced" is the total Kong's sync
//     last read back from the store;
//   - a Batch is one sync's push (Kong's diffs table with the reads of its
//     fetch): CollectSome fills it, and Ack settles it with the store's
//     totals (or Release hands its hits back when the store surely applied
//     none of it);
//   - a View is what Kong's get returns for the current and previous window.
//
// A Table is split into shards, each an open-addressing hash table of *entry
// behind its own RWMutex, so no lock is shared by all keys. The hot path takes a
// shard's read lock, finds the entry and updates it with atomics; incrementing
// an existing key allocates nothing. Each entry holds the current and previous
// window of up to two window sizes; older windows are dropped when an entry
// rotates, expired entries leave a shard before it grows, and a key cap evicts
// with the CLOCK algorithm (and counts evictions). Hits that were never
// confirmed by the store are kept as retired records until a sync pushes them,
// so rotation and eviction lose nothing; in a long store outage the retired
// records are capped (Options.MaxRetired) and what is dropped is counted.
package shm

import (
	"errors"
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ratesync/ratelimit/internal/floor"
)

// ErrConfig is returned (joined with the reason) by New when Options is
// invalid.
var ErrConfig = errors.New("shm: invalid configuration")

// Options configure a Table.
type Options struct {
	// Sizes are the window sizes an entry holds: one or two, each a positive
	// whole number of milliseconds.
	Sizes []time.Duration
	// MaxKeys caps the number of entries; 0 means 1<<20. The cap is split
	// over the shards (the shares add up to MaxKeys), so a table may evict
	// slightly before it holds MaxKeys entries when keys hash unevenly.
	MaxKeys int
	// Track keeps the bookkeeping a sync needs: dirty lists, and retired
	// records for unconfirmed hits of rotated or evicted windows. Without it
	// (local-only mode) old windows are simply dropped.
	Track bool
	// WriteThrough records, per counter, the hits handed to pushes still in
	// flight, so that Collect can run while write-throughs (AddPending) are
	// unsettled. Without it, the caller must settle every Batch before the
	// next Collect, as a single sync loop does.
	WriteThrough bool
	// Settle is how long after a window ends Collect still reads it (as the
	// previous window) for keys whose total this node already learned: by
	// then every node has pushed its last hits of it. 0 means always.
	Settle time.Duration
	// Walk makes every Collect visit every entry the table holds, instead of
	// the entries used since the last Collect; the table then keeps no
	// active lists, and using a key costs no bookkeeping. A periodic sync,
	// which reads every key it holds each cycle, wants this.
	Walk bool
	// Watch makes the sync learn other nodes' changes through the store's
	// change logs (see Watches): Collect visits only the entries used since
	// the last Collect and reads only the windows whose total this node has
	// not learned. It needs Track, and excludes Walk.
	Watch bool
	// ReadAhead makes Collect also read, for every key it reads, the window
	// after the current one during the last ReadAhead of the current window:
	// when the store already has hits there, nodes whose clocks are ahead (by
	// up to ReadAhead) are in it, and Ack moves the entry forward to follow
	// them. 0 never reads ahead.
	ReadAhead time.Duration
	// Pressure, when not nil, is called whenever retired records exceed
	// MaxKeys/16 (at least 64): evictions are outrunning the syncs, and a
	// sync now would free them. It is called with table locks held, so it
	// must return at once (a non-blocking channel send).
	Pressure func()
	// MaxRetired caps the retired records, whose number otherwise grows
	// without bound while the store is out and keys rotate or are evicted.
	// Past it the table drops the records of windows too old to weigh in any
	// decision, then the records with the fewest hits, down to three
	// quarters of the cap, and counts the hits dropped (DroppedHits). It
	// keeps the records a push in flight holds: while they are more than
	// three quarters of the cap, the records may exceed it by a quarter.
	// 0 means MaxKeys/8, at least 1,024 (a burst of evictions between two
	// syncs of a healthy store must fit).
	MaxRetired int
}

// Table is a sharded counter table. Its methods are safe for concurrent use.
type Table struct {
	n         int
	sizes     [2]time.Duration
	sizeMS    [2]int64
	track     bool
	wt        bool
	settle    int64 // ms
	readAhead int64 // ms
	walk      bool
	watch     bool
	// With watch (guarded by the sync loop: one caller at a time):
	cursors  map[wkey]string // the store's cursor per watched window
	fullRead map[wkey]bool   // windows the next pass reads for every key held
	passFull map[wkey]bool   // the windows the current pass reads in full
	passWalk bool            // the current pass walks every entry
	cycle    uint32          // the watch cycle's number (see entry.markDiff)
	// overflowed is set when a watch of the last cycle overflowed: the next
	// cycle reads every watched window in full (see Watches).
	overflowed bool
	// skipped counts the watch answers that listed a key this table did
	// not hold (or overflowed): a cold read sent before one of them may
	// hold a total from before a change the watch has moved past (see
	// LoadColdSince).
	skipped  atomic.Uint64
	pressure func()
	maxRet   int // retired records beyond which pressure is called
	retCap   int // retired records beyond which retire sheds some (see shed)
	shedAt   int // retCap, or more while a push holds records shed keeps (guarded by retMu)
	seed     maphash.Seed
	shards   []shard
	mask     uint64
	cursor   int // the next shard CollectSome visits
	// passRetired counts the diffs the pass under way took from retired
	// records (see PassShare)
	passRetired int

	evictions atomic.Int64
	sealed    atomic.Bool // see Seal
	// wides holds the 64-bit counts of the entries gone wide (*entry to
	// *wide; see widen), and widened counts them.
	wides   sync.Map
	widened atomic.Int64
	// lastQ[w] is the number (start / size) of the window of size index w
	// that the last call to windowOf found; see windowOf.
	lastQ [2]atomic.Int64

	// newest is the latest window start the table has rotated to: a lower
	// bound of its callers' clock, for shed.
	newest  atomic.Int64
	dropped atomic.Int64 // unconfirmed hits shed dropped

	retMu   sync.Mutex
	retired map[counterRef]*retired
	open    map[*Batch]struct{} // batches collected and not settled yet (guarded by retMu)

	penMu   sync.Mutex
	pending map[counterRef]pendAmt
}

// pendAmt is what a counter has in pushes not settled yet: hits added
// (pos) and taken back (neg) apart, because a reply from the store may
// hold either already (see Table.BeyondReply).
type pendAmt struct{ pos, neg int64 }

type shard struct {
	mu sync.RWMutex
	// ix is the shard's index, replaced whole when it grows. Writers hold mu
	// for writing; lock-free readers (see addOpenFast) load it and its slots
	// with atomics, so they never see a torn slice.
	ix    atomic.Pointer[index]
	count int
	cap   int // the shard's share of MaxKeys
	hand  int

	dirtyMu sync.Mutex
	dirty   []*entry

	_ [64]byte // keep neighbouring shards' locks off one cache line
}

// New returns an empty Table.
func New(opts Options) (*Table, error) {
	if len(opts.Sizes) < 1 || len(opts.Sizes) > 2 {
		return nil, errors.Join(ErrConfig, errors.New("shm: a table holds one or two window sizes"))
	}
	t := &Table{n: len(opts.Sizes), track: opts.Track || opts.WriteThrough, wt: opts.WriteThrough,
		settle: opts.Settle.Milliseconds(), readAhead: opts.ReadAhead.Milliseconds(), walk: opts.Walk && !opts.Watch, watch: opts.Watch,
		cursors: make(map[wkey]string), fullRead: make(map[wkey]bool), pressure: opts.Pressure, seed: maphash.MakeSeed(),
		retired: make(map[counterRef]*retired), open: make(map[*Batch]struct{}), pending: make(map[counterRef]pendAmt)}
	for i, s := range opts.Sizes {
		if s <= 0 || s%time.Millisecond != 0 {
			return nil, errors.Join(ErrConfig, errors.New("shm: window sizes must be positive whole milliseconds"))
		}
		t.sizes[i], t.sizeMS[i] = s, s.Milliseconds()
	}
	maxKeys := opts.MaxKeys
	if maxKeys == 0 {
		maxKeys = 1 << 20
	}
	if maxKeys < 0 {
		return nil, errors.Join(ErrConfig, errors.New("shm: MaxKeys must not be negative"))
	}
	// Enough shards to keep lock contention low, few enough that each shard
	// still holds a useful share of the cap.
	nShards := 1
	for nShards < 256 && nShards*64 <= maxKeys {
		nShards *= 2
	}
	t.shards = make([]shard, nShards)
	t.mask = uint64(nShards - 1)
	t.maxRet = max(maxKeys/16, 64)
	t.retCap = opts.MaxRetired
	if t.retCap <= 0 {
		t.retCap = max(maxKeys/8, 1024)
	}
	t.retCap = max(t.retCap, 4) // shed needs room to bring it down to 3/4
	t.shedAt = t.retCap
	t.newest.Store(noWindow)
	// The shares add up to MaxKeys exactly: the table never holds more.
	for i := range t.shards {
		t.shards[i].cap = maxKeys / nShards
		if i < maxKeys%nShards {
			t.shards[i].cap++
		}
	}
	return t, nil
}

// Sizes returns the table's window sizes.
func (t *Table) Sizes() []time.Duration { return t.sizes[:t.n] }

// Evictions returns how many entries the key cap has evicted.
func (t *Table) Evictions() int64 { return t.evictions.Load() }

// Len returns how many entries the table holds.
func (t *Table) Len() int {
	n := 0
	for i := range t.shards {
		s := &t.shards[i]
		s.mu.RLock()
		n += s.count
		s.mu.RUnlock()
	}
	return n
}

func windowStart(t, size int64) int64 { return floor.Div(t, size) * size }

func (t *Table) shardOf(h uint64) *shard { return &t.shards[h&t.mask] }

// hash returns key's hash: it picks the shard and the place in its index.
func (t *Table) hash(key string) uint64 { return maphash.String(t.seed, key) }

// tagOf returns the 32-bit tag of a bucket key's hash (see bshard): its
// high half, never 0 (0 marks an empty slot). The low half picks the shard.
func tagOf(h uint64) uint32 {
	if tag := uint32(h >> 32); tag != 0 {
		return tag
	}
	return 1
}

// insert adds a new entry for key (copied), with flags set before it is
// published. The caller holds s.mu for writing.
func (t *Table) insert(s *shard, key string, h uint64, now int64, flags uint32) *entry {
	if s.count >= s.cap {
		t.makeRoom(s, now)
	}
	// The load factor stays at most 7/8, and a shard at its cap does not
	// double for a few entries.
	if (s.count+1)*8 > s.size()*7 {
		// Before growing, drop what has expired: the shard is walked once per
		// doubling at most, so the cost is amortised over the inserts.
		t.dropExpired(s, now)
		if (s.count+1)*8 > s.size()*7 {
			t.resize(s, max(minGroups, 2*s.groups()))
		}
	}
	e := newEntry(key)
	e.flags.Store(flags)
	if t.sealed.Load() {
		// Seal has dropped (or is dropping) the entries a lean call may
		// count in without the lock; one created after it is not for them
		// (see addOpenFast).
		e.flags.Or(flagBornSealed)
	}
	s.ix.Load().place(e, h)
	s.count++
	return e
}

// dropEntry retires e's unconfirmed hits, marks it dead and removes it from
// slot i. The caller holds s.mu for writing.
func (t *Table) dropEntry(s *shard, i uint32) {
	ix := s.ix.Load()
	e := ix.slot(i).Load()
	e.retire(t)
	ix.remove(i, t.hash(e.key()))
	s.count--
}

// dropExpired removes every entry of s whose windows are all too old to be
// read. The caller holds s.mu for writing.
func (t *Table) dropExpired(s *shard, now int64) {
	ix := s.ix.Load()
	if ix == nil {
		return
	}
	for i := range ix.slots() {
		if e := ix.slot(i).Load(); e != nil && e.expired(t, now) {
			t.dropEntry(s, i)
		}
	}
}

// makeRoom removes one entry from a full shard: an expired one if the CLOCK
// hand meets one first, else the first one not used since the hand last
// passed (counted as an eviction). The caller holds s.mu for writing.
func (t *Table) makeRoom(s *shard, now int64) {
	ix := s.ix.Load()
	if ix == nil {
		return
	}
	n := ix.slots()
	for range 2*n + 1 {
		i := uint32(s.hand) % n
		s.hand++
		e := ix.slot(i).Load()
		if e == nil {
			continue
		}
		if !e.expired(t, now) {
			if e.flags.Load()&flagRef != 0 {
				e.flags.And(^flagRef)
				continue
			}
			t.evictions.Add(1)
		}
		t.dropEntry(s, i)
		return
	}
}
