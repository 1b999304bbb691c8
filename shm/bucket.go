package shm

import (
	"errors"
	"hash/maphash"
	"math"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/ratesync/ratelimit/strategy"
)

// Buckets is a table of token buckets of one period, one per key: the
// node-side state of token-bucket limits. Without Track (local mode) a
// bucket is its TAT. With Track each bucket keeps
//
//   - synced: the store's state as last learned (strategy.BucketState);
//   - fresh: the spends (and refunds) counted here since the last push, as one
//     map of the TAT (see strategy.BucketDiff);
//   - flight: the spends handed to the push in flight.
//
// The node's view of the bucket's TAT is fresh(flight(synced)): the store's
// state with this node's unconfirmed spends applied. A decision reads the view
// and spends under the bucket's lock, so concurrent requests on one node never
// overdraw it. Its methods are safe for concurrent use; Collect, Ack and
// Release are called by one sync loop at a time.
type Buckets struct {
	period time.Duration
	track  bool
	seed   maphash.Seed
	shards []bshard
	mask   uint64

	evictions atomic.Int64
	dropped   atomic.Int64 // tokens of retired spends dropped past the cap
	sealed    atomic.Bool  // see Seal

	retMu   sync.Mutex
	retired map[*bucket]struct{} // evicted buckets whose spends wait for a push (guarded by retMu)
	retCap  int
}

// bucket flag bits.
const (
	bflagRef      uint32 = 1 << iota // used since the eviction hand last passed
	bflagDead                        // evicted: its spends are retired
	bflagInFlight                    // its flight composite is in a push not settled yet
	bflagUsed                        // used since the last Collect
)

// comp is a map of a TAT of the form tat -> max(tat + add, floor): the
// composition of spends and refunds (see strategy.BucketDiff).
type comp struct {
	add, floor float64
}

var identity = comp{floor: math.Inf(-1)}

func (c comp) isIdentity() bool { return c.add == 0 && math.IsInf(c.floor, -1) }

// then returns c followed by d.
func (c comp) then(d comp) comp {
	return comp{add: c.add + d.add, floor: math.Max(c.floor+d.add, d.floor)}
}

func (c comp) apply(tat float64) float64 { return math.Max(tat+c.add, c.floor) }

// rescale converts c, kept at interval from, to interval to at now: the
// tokens it adds stay the same number of tokens.
func (c comp) rescale(from, to float64, now int64) comp {
	if c.isIdentity() || from == to || from <= 0 {
		return c
	}
	return comp{add: c.add * to / from, floor: strategy.ConvertTAT(c.floor, from, to, now)}
}

// inlineBucketKey is the longest key a bucket holds in its own memory.
const inlineBucketKey = 24

// longKey is a bucket's klen for a key longer than inlineBucketKey, kept in
// its bucketExt.
const longKey = 0xff

// bucket is one key's token bucket: 64 bytes, one cache line (the
// allocator's 64-byte class keeps it aligned to one), checked by a test. It
// holds all that a table without Track (local mode) touches: the key (up to
// inlineBucketKey bytes inline), the lock and the TAT. The sync's state, and a
// longer key, are in its bucketExt.
type bucket struct {
	// Guarded by mu:
	tat      float64 // without Track, the bucket's TAT; unused with it
	interval float64 // the interval tat, fresh and flight are kept at
	ext      *bucketExt
	flags    atomic.Uint32
	mu       sync.Mutex
	buf      [inlineBucketKey]byte
	klen     uint8 // the key's length when in buf, or longKey
}

// bucketExt is the part of a bucket that only a table with Track, or a long
// key, needs.
type bucketExt struct {
	key string // a key longer than inlineBucketKey
	// Guarded by the bucket's mu, with Track:
	synced strategy.BucketState
	// learned is set once synced holds a state the store reported (an
	// Ack, a synchronous answer or a cold read): a cold read, answered
	// before it, must not overwrite it (see LearnCold).
	learned bool
	fresh   comp
	flight  comp
}

// key returns bk's key.
func (bk *bucket) key() string {
	switch bk.klen {
	case longKey:
		return bk.ext.key
	case 0:
		return ""
	}
	return unsafe.String(&bk.buf[0], int(bk.klen)) // buf is never written again
}

// keyIs reports whether bk's key is key, without copying it.
func (bk *bucket) keyIs(key string) bool {
	if len(key) > inlineBucketKey {
		return bk.klen == longKey && bk.ext.key == key
	}
	return int(bk.klen) == len(key) && string(bk.buf[:len(key)]) == key
}

// BucketOptions configure a Buckets table.
type BucketOptions struct {
	// Period is the buckets' period (the limits' Window): a positive whole
	// number of milliseconds.
	Period time.Duration
	// MaxKeys caps the buckets held; 0 means 1<<20.
	MaxKeys int
	// Track keeps what a sync needs: the spends not yet pushed, and those of
	// evicted buckets. Without it (local-only mode) a bucket is its view.
	Track bool
}

// NewBuckets returns an empty table.
func NewBuckets(opts BucketOptions) (*Buckets, error) {
	if opts.Period <= 0 || opts.Period%time.Millisecond != 0 {
		return nil, errors.Join(ErrConfig, errors.New("shm: a bucket period must be a positive whole number of milliseconds"))
	}
	maxKeys := opts.MaxKeys
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
	b := &Buckets{period: opts.Period, track: opts.Track, seed: maphash.MakeSeed(), shards: make([]bshard, n), mask: uint64(n - 1),
		retired: make(map[*bucket]struct{}), retCap: max(maxKeys/8, 1024)}
	for i := range b.shards {
		b.shards[i].cap = maxKeys / n
		if i < maxKeys%n {
			b.shards[i].cap++
		}
	}
	return b, nil
}

// Period returns the table's period.
func (b *Buckets) Period() time.Duration { return b.period }

// Evictions returns how many buckets the key cap has evicted.
func (b *Buckets) Evictions() int64 { return b.evictions.Load() }

// DroppedTokens returns how many spent tokens of evicted buckets the table
// dropped to keep its retired buckets within their cap.
func (b *Buckets) DroppedTokens() int64 { return b.dropped.Load() }

// Len returns how many buckets the table holds.
func (b *Buckets) Len() int {
	n := 0
	for i := range b.shards {
		s := &b.shards[i]
		s.mu.RLock()
		n += s.n
		s.mu.RUnlock()
	}
	return n
}

// get returns key's bucket, creating it (with a copy of key) when missing.
func (b *Buckets) get(key string, now int64) *bucket {
	h := maphash.String(b.seed, key)
	s := &b.shards[h&b.mask]
	s.mu.RLock()
	bk := s.find(h, key)
	s.mu.RUnlock()
	if bk != nil {
		if bk.flags.Load()&bflagRef == 0 {
			bk.flags.Or(bflagRef)
		}
		return bk
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if bk = s.find(h, key); bk != nil {
		return bk
	}
	if s.n >= s.cap {
		b.makeRoom(s, now)
	}
	bk = b.newBucket(key)
	s.add(bk, tagOf(h))
	return bk
}

// newBucket returns a full bucket for key, holding a copy of key: the
// caller's string may share a large buffer.
func (b *Buckets) newBucket(key string) *bucket {
	bk := &bucket{tat: math.Inf(-1)}
	if b.track {
		bk.ext = &bucketExt{fresh: identity, flight: identity}
	}
	if len(key) <= inlineBucketKey {
		bk.klen = uint8(copy(bk.buf[:], key))
	} else {
		if bk.ext == nil {
			bk.ext = &bucketExt{}
		}
		bk.ext.key, bk.klen = cloneKey(key), longKey
	}
	return bk
}

// lookup returns key's bucket, or nil.
func (b *Buckets) lookup(key string) *bucket {
	h := maphash.String(b.seed, key)
	s := &b.shards[h&b.mask]
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.find(h, key)
}

// Holds reports whether the table holds a bucket for key.
//
// A tracked bucket is held once it has learned the store's state (a cold
// read, a sync's read or push): one that a Refund made, or a decision whose
// cold read failed, holds this node's spends but not the cluster's, so the
// key is still cold.
func (b *Buckets) Holds(key string) bool {
	bk := b.lookup(key)
	if bk == nil || !b.track {
		return bk != nil
	}
	bk.mu.Lock()
	defer bk.mu.Unlock()
	return bk.ext.learned
}

// testHookFound, when set (by tests), runs between finding a bucket or log
// and locking it: where a concurrent eviction may remove it.
var testHookFound func()

// locked returns key's bucket locked, creating it when missing if create
// is set (else nil when missing). A bucket found is removed only under its
// lock (remove), maybe between the lookup and the lock: one found dead is
// looked up again, so no spend goes into a bucket the table has dropped.
func (b *Buckets) locked(key string, now int64, create bool) *bucket {
	for {
		var bk *bucket
		if create {
			bk = b.get(key, now)
		} else if bk = b.lookup(key); bk == nil {
			return nil
		}
		if testHookFound != nil {
			testHookFound()
		}
		bk.mu.Lock()
		if bk.flags.Load()&bflagDead == 0 {
			return bk
		}
		bk.mu.Unlock()
	}
}

// makeRoom removes one bucket from a full shard: the first the CLOCK hand
// meets that is full with nothing to push, or not used since the hand last
// passed (an eviction). A bucket in a push in flight is never removed. The
// caller holds s.mu for writing.
func (b *Buckets) makeRoom(s *bshard, now int64) {
	var victim *bucket
	for range 2*len(s.slots) + 1 {
		sl := s.slots[s.hand&(len(s.slots)-1)]
		s.hand++
		if sl.tag == 0 {
			continue
		}
		f := sl.bk.flags.Load()
		if f&bflagInFlight != 0 {
			continue
		}
		if f&bflagRef == 0 || b.idle(sl.bk, now) {
			victim = sl.bk
			break
		}
		sl.bk.flags.And(^bflagRef)
	}
	if victim == nil {
		return // every bucket is in the push in flight: exceed the cap by one
	}
	if !b.idle(victim, now) {
		b.evictions.Add(1)
	}
	b.remove(s, victim)
}

// remove takes bk out of s, retiring its unpushed spends. The caller holds
// s.mu for writing.
func (b *Buckets) remove(s *bshard, bk *bucket) {
	s.del(bk, tagOf(maphash.String(b.seed, bk.key())))
	bk.mu.Lock()
	bk.flags.Or(bflagDead)
	unpushed := b.track && !bk.ext.fresh.isIdentity()
	bk.mu.Unlock()
	if unpushed {
		b.retire(bk)
	}
}

// idle reports whether bk is full at now with nothing to push: forgetting it
// loses nothing.
func (b *Buckets) idle(bk *bucket, now int64) bool {
	bk.mu.Lock()
	defer bk.mu.Unlock()
	if !b.track {
		return bk.tat <= float64(now)
	}
	return bk.ext.fresh.isIdentity() && bk.ext.flight.isIdentity() && b.view(bk, now) <= float64(now)
}

// retire keeps an evicted bucket's unpushed spends for the next Collect.
// Past the cap, the retired buckets whose spends matter least go.
func (b *Buckets) retire(bk *bucket) {
	b.retMu.Lock()
	defer b.retMu.Unlock()
	b.retired[bk] = struct{}{}
	if len(b.retired) <= b.retCap {
		return
	}
	for r := range b.retired { // map order: an arbitrary quarter
		if len(b.retired) <= b.retCap*3/4 {
			break
		}
		r.mu.Lock()
		if r.flags.Load()&bflagInFlight == 0 {
			if r.interval > 0 {
				b.dropped.Add(int64(math.Round(math.Abs(r.ext.fresh.add) / r.interval)))
			}
			delete(b.retired, r)
		}
		r.mu.Unlock()
	}
}

// markUsed records a use for Collect, which keeps used buckets.
func (bk *bucket) markUsed() {
	if bk.flags.Load()&bflagUsed == 0 {
		bk.flags.Or(bflagUsed)
	}
}

// view returns the TAT this node sees, at the bucket's interval. The caller
// holds bk.mu.
func (b *Buckets) view(bk *bucket, now int64) float64 {
	if !b.track {
		return bk.tat
	}
	tat := math.Inf(-1)
	if bk.ext.synced.Held() {
		tat = strategy.ConvertTAT(bk.ext.synced.TAT, bk.ext.synced.Interval, bk.interval, now)
	}
	return bk.ext.fresh.apply(bk.ext.flight.apply(tat))
}

// setInterval moves bk's state to interval at now: a limit whose rate
// changed keeps the tokens owed. The caller holds bk.mu.
func (b *Buckets) setInterval(bk *bucket, interval float64, now int64) {
	if bk.interval == interval {
		return
	}
	if bk.interval > 0 {
		if b.track {
			bk.ext.fresh = bk.ext.fresh.rescale(bk.interval, interval, now)
			bk.ext.flight = bk.ext.flight.rescale(bk.interval, interval, now)
		} else {
			bk.tat = strategy.ConvertTAT(bk.tat, bk.interval, interval, now)
		}
	}
	bk.interval = interval
}

// count applies a spend or refund d to bk: to its unpushed spends with
// Track, else to its TAT (what the composite would make of it). The caller
// holds bk.mu.
func (b *Buckets) count(bk *bucket, d strategy.BucketDiff) {
	c := comp{add: d.Add, floor: d.Floor}
	if b.track {
		bk.ext.fresh = bk.ext.fresh.then(c)
	} else {
		bk.tat = c.apply(bk.tat)
	}
}

// TryMode says what Try does with a request's cost.
type TryMode int

// The modes of Try.
const (
	// Peek spends nothing.
	Peek TryMode = iota
	// SpendIfFits spends the cost when it fits.
	SpendIfFits
	// SpendAlways spends the cost whether it fits or not (a penalty).
	SpendAlways
)

// Try judges a request of cost tokens on key's bucket at now, for a limit
// refilling one token per interval milliseconds with burst tokens at most:
// it returns the bucket's TAT before the request (the node's view, at
// interval) and whether the request fits, and spends the cost as mode says.
// The bucket is created when missing.
func (b *Buckets) Try(key string, now int64, interval float64, burst, cost int64, mode TryMode) (tat float64, fits bool, spent bool) {
	return b.TryLearning(key, now, nil, interval, burst, cost, mode)
}

// TryLearning is Try for a decision that read key's bucket from the store
// just before (a cold read, which found st): when the table has lost that
// bucket since (an eviction made room for another key), st is learned
// again under the bucket's lock, before the try, so the decision is not
// made on a bucket that forgot the store's state. A nil st is Try.
func (b *Buckets) TryLearning(key string, now int64, st *strategy.BucketState, interval float64, burst, cost int64, mode TryMode) (tat float64, fits bool, spent bool) {
	bk := b.locked(key, now, true)
	if st != nil && b.track && !bk.ext.learned {
		bk.ext.synced, bk.ext.learned = *st, true
	}
	return b.tryLocked(bk, now, interval, burst, cost, mode)
}

// Seal makes the table refuse what TryOpen would spend from now on. A call
// of TryOpen decides and spends holding its bucket's lock, and checks the
// seal there: one that found the table open has spent before a Collect that
// follows Seal locks the bucket. A namespace's Close seals its tables before
// its last collection (see Table.Seal).
func (b *Buckets) Seal() { b.sealed.Store(true) }

// TryOpen is Try that spends nothing and returns open false once the table
// is sealed. Without create it does nothing for a key the table does not
// hold (in Holds's sense), and returns held false: one lookup, where Holds then Try take two.
func (b *Buckets) TryOpen(key string, now int64, interval float64, burst, cost int64, mode TryMode, create bool) (tat float64, fits, spent, held, open bool) {
	bk := b.locked(key, now, create)
	if bk != nil && !create && b.track && !bk.ext.learned {
		bk.mu.Unlock() // not held in Holds's sense: the key is cold
		bk = nil
	}
	if bk == nil {
		return 0, false, false, false, !b.sealed.Load()
	}
	if b.sealed.Load() {
		bk.mu.Unlock()
		return 0, false, false, true, false
	}
	tat, fits, spent = b.tryLocked(bk, now, interval, burst, cost, mode)
	return tat, fits, spent, true, true
}

// tryLocked is Try on bk, which the caller has locked; it unlocks bk.
func (b *Buckets) tryLocked(bk *bucket, now int64, interval float64, burst, cost int64, mode TryMode) (tat float64, fits, spent bool) {
	bk.markUsed()
	b.setInterval(bk, interval, now)
	tat = b.view(bk, now)
	fits = strategy.BucketFits(strategy.BucketState{TAT: tat, Interval: interval}, interval, burst, cost, now)
	if mode == SpendAlways || (mode == SpendIfFits && fits) {
		b.count(bk, strategy.SpendDiff(strategy.BucketID{}, cost, interval, now))
		spent = true
	}
	bk.mu.Unlock()
	return tat, fits, spent
}

// Refund gives cost tokens back to key's bucket at now (never past full).
func (b *Buckets) Refund(key string, now int64, interval float64, cost int64) {
	bk := b.locked(key, now, true)
	bk.markUsed()
	b.setInterval(bk, interval, now)
	b.count(bk, strategy.RefundDiff(strategy.BucketID{}, cost, interval, now))
	bk.mu.Unlock()
}

// View returns key's TAT as this node sees it at now, at interval, and
// whether the table holds the bucket.
func (b *Buckets) View(key string, now int64, interval float64) (float64, bool) {
	bk := b.lookup(key)
	if bk == nil {
		return math.Inf(-1), false
	}
	bk.mu.Lock()
	defer bk.mu.Unlock()
	b.setInterval(bk, interval, now)
	return b.view(bk, now), true
}

// Learn records a state the store reported for key's bucket (a synchronous
// decision's answer, or a cold read), creating the bucket when create is set.
func (b *Buckets) Learn(key string, now int64, st strategy.BucketState, create bool) {
	var bk *bucket
	if create {
		bk = b.get(key, now)
	} else if bk = b.lookup(key); bk == nil {
		return
	}
	if !b.track {
		return // no store state to learn: a bucket is its TAT
	}
	bk.mu.Lock()
	bk.ext.synced, bk.ext.learned = st, true
	bk.mu.Unlock()
}

// LearnCold records what a cold read found for key's bucket, creating the
// bucket when missing, unless the bucket learned a state already: then a
// sync (or another cold read) learned one at least as recent, and this one,
// read before it, may miss spends that sync confirmed (and took out of the
// bucket's unpushed spends).
func (b *Buckets) LearnCold(key string, now int64, st strategy.BucketState) {
	if !b.track {
		b.get(key, now)
		return
	}
	bk := b.locked(key, now, true)
	if !bk.ext.learned {
		bk.ext.synced, bk.ext.learned = st, true
	}
	bk.mu.Unlock()
}

// BucketBatch is the buckets' part of a push, built by Collect. Reuse it
// across cycles.
type BucketBatch struct {
	Diffs    []strategy.BucketDiff
	Reads    []strategy.BucketID
	diffRefs []*bucket
	readRefs []*bucket
}

// Reset empties bb, dropping its references.
func (bb *BucketBatch) Reset() {
	bb.Diffs, bb.diffRefs = resetBuf(bb.Diffs), resetBuf(bb.diffRefs)
	bb.Reads, bb.readRefs = resetBuf(bb.Reads), resetBuf(bb.readRefs)
}

// Collect adds to bb every bucket's unpushed spends (moving them to flight)
// and, with reads, a read of every other bucket held: the retired buckets
// first, then the shards. A bucket full with nothing to push and not used
// since the last Collect leaves the table. Settle bb with Ack or Release
// before the next Collect.
func (b *Buckets) Collect(now int64, reads bool, bb *BucketBatch) {
	b.retMu.Lock()
	for bk := range b.retired {
		bk.mu.Lock()
		b.collectOne(bk, bb)
		bk.mu.Unlock()
	}
	b.retMu.Unlock()
	var idle []*bucket
	for i := range b.shards {
		s := &b.shards[i]
		idle = idle[:0]
		s.mu.RLock()
		s.each(func(bk *bucket) {
			bk.mu.Lock()
			used := bk.flags.Load()&bflagUsed != 0
			bk.flags.And(^bflagUsed)
			switch {
			case b.collectOne(bk, bb):
			case !used && bk.ext.flight.isIdentity() && b.view(bk, now) <= float64(now):
				idle = append(idle, bk)
			case reads:
				bb.Reads = append(bb.Reads, strategy.BucketID{Key: bk.key(), Period: b.period})
				bb.readRefs = append(bb.readRefs, bk)
			}
			bk.mu.Unlock()
		})
		s.mu.RUnlock()
		if len(idle) > 0 {
			s.mu.Lock()
			for _, bk := range idle {
				if bk.flags.Load()&bflagDead == 0 && bk.flags.Load()&bflagUsed == 0 && b.idle(bk, now) {
					b.remove(s, bk)
				}
			}
			s.mu.Unlock()
		}
	}
	clear(idle)
}

// collectOne adds bk's fresh spends to bb as a diff, if it has any and no
// push holds its spends already, and reports whether it did. The caller holds
// bk.mu.
func (b *Buckets) collectOne(bk *bucket, bb *BucketBatch) bool {
	if bk.ext.fresh.isIdentity() || bk.flags.Load()&bflagInFlight != 0 {
		return false
	}
	bk.ext.flight, bk.ext.fresh = bk.ext.fresh, identity
	bk.flags.Or(bflagInFlight)
	bb.Diffs = append(bb.Diffs, strategy.BucketDiff{BucketID: strategy.BucketID{Key: bk.key(), Period: b.period},
		Add: bk.ext.flight.add, Floor: bk.ext.flight.floor, Interval: bk.interval})
	bb.diffRefs = append(bb.diffRefs, bk)
	return true
}

// Ack settles a successful push of bb: diffs[i] is bb.Diffs[i]'s bucket after
// the push, reads[i] bb.Reads[i]'s.
func (b *Buckets) Ack(bb *BucketBatch, diffs, reads []strategy.BucketState) {
	for i, bk := range bb.diffRefs {
		bk.mu.Lock()
		bk.ext.flight = identity
		bk.flags.And(^bflagInFlight)
		bk.ext.synced, bk.ext.learned = diffs[i], true
		dead := bk.flags.Load()&bflagDead != 0 && bk.ext.fresh.isIdentity()
		bk.mu.Unlock()
		if dead {
			b.retMu.Lock()
			delete(b.retired, bk)
			b.retMu.Unlock()
		}
	}
	for i, bk := range bb.readRefs {
		bk.mu.Lock()
		if bk.flags.Load()&bflagInFlight == 0 {
			bk.ext.synced, bk.ext.learned = reads[i], true
		}
		bk.mu.Unlock()
	}
}

// Release settles a push of bb that surely was not applied: the spends go
// back to be pushed with newer ones.
func (b *Buckets) Release(bb *BucketBatch) {
	for _, bk := range bb.diffRefs {
		bk.mu.Lock()
		bk.ext.fresh = bk.ext.flight.then(bk.ext.fresh)
		bk.ext.flight = identity
		bk.flags.And(^bflagInFlight)
		bk.mu.Unlock()
	}
}

// Pending returns the tokens this table spent that the store has not
// confirmed, rounded: in unpushed and in-flight spends of held and retired
// buckets. For monitoring.
func (b *Buckets) Pending() (tokens int64) {
	if !b.track {
		return 0 // nothing to push
	}
	add := func(bk *bucket) {
		bk.mu.Lock()
		for _, c := range [2]comp{bk.ext.fresh, bk.ext.flight} {
			if !c.isIdentity() && bk.interval > 0 {
				// At least one: a spend taken back still has a floor to push.
				tokens += max(1, int64(math.Round(math.Abs(c.add)/bk.interval)))
			}
		}
		bk.mu.Unlock()
	}
	b.retMu.Lock()
	for bk := range b.retired {
		add(bk)
	}
	b.retMu.Unlock()
	for i := range b.shards {
		s := &b.shards[i]
		s.mu.RLock()
		s.each(add)
		s.mu.RUnlock()
	}
	return tokens
}

// cloneKey copies key, so the table never keeps a caller's buffer alive.
func cloneKey(key string) string {
	return string(append([]byte(nil), key...))
}
