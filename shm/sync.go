package shm

import (
	"github.com/ratesync/ratelimit/strategy"
)

// counterRef names one window of one entry: a counter as the sync sees it. It stays
// valid after the window rotates out or the entry is evicted, when it names
// the retired record that holds the window's unconfirmed hits.
type counterRef struct {
	e     *entry
	w     uint8
	start int64
}

// Batch is a push being built by Collect: diffs and reads, each with the counterRef
// its answer belongs to. Reuse a Batch across cycles to avoid allocations.
type Batch struct {
	Diffs    []strategy.Diff
	diffRefs []counterRef
	Reads    []strategy.CounterID
	readRefs []counterRef
	// runs splits the counters into runs of one entry each, in the order
	// they were added, so that Ack settles a run under one hold of its
	// entry's lock.
	runs []run
}

// run is a run of counters of one entry in a Batch: the diffs and reads from
// the end of the run before up to Diffs[:diffs] and Reads[:reads].
type run struct {
	e            *entry
	diffs, reads int
	// reread: Collect cleared e's flagReread for this push's reads; a
	// push the store refused (Release) sets it again.
	reread bool
}

// extend adds the counter just appended for e to b's runs.
func (b *Batch) extend(e *entry) {
	if n := len(b.runs); n > 0 && b.runs[n-1].e == e {
		b.runs[n-1].diffs, b.runs[n-1].reads = len(b.Diffs), len(b.Reads)
		return
	}
	b.runs = append(b.runs, run{e: e, diffs: len(b.Diffs), reads: len(b.Reads)})
}

// Reset empties b. It drops every entry pointer and key, so evicted entries
// can be freed, and keeps the buffers for the next batch unless they are much
// larger than this one needed (after a burst, memory goes back).
func (b *Batch) Reset() {
	b.Diffs, b.diffRefs = resetBuf(b.Diffs), resetBuf(b.diffRefs)
	b.Reads, b.readRefs = resetBuf(b.Reads), resetBuf(b.readRefs)
	b.runs = resetBuf(b.runs)
}

func resetBuf[T any](s []T) []T {
	if cap(s) > 4096 && cap(s) > 4*len(s) {
		return nil
	}
	clear(s)
	return s[:0]
}

func (t *Table) id(ref counterRef, key string) strategy.CounterID {
	return strategy.CounterID{Key: key, Size: t.sizes[ref.w], Start: ref.start}
}

// addDiff appends the unconfirmed, not yet pending part d of ref to b and
// records it as pending.
func (t *Table) addDiff(b *Batch, ref counterRef, key string, d int64) {
	if t.wt {
		t.penMu.Lock()
		a := t.pending[ref]
		a.add(d)
		t.pending[ref] = a
		t.penMu.Unlock()
	} else {
		ref.e.flags.Or(flagInFlight)
	}
	b.Diffs = append(b.Diffs, strategy.Diff{CounterID: t.id(ref, key), Delta: d})
	b.diffRefs = append(b.diffRefs, ref)
	b.extend(ref.e)
}

// pend returns the hits of ref handed to pushes still in flight (always 0
// without WriteThrough: then every push is settled before the next Collect).
func (t *Table) pend(ref counterRef) int64 {
	if !t.wt {
		return 0
	}
	t.penMu.Lock()
	defer t.penMu.Unlock()
	a := t.pending[ref]
	return a.pos + a.neg
}

// pendNeg returns the take-backs of ref in pushes still in flight (0 or
// less; always 0 without WriteThrough).
func (t *Table) pendNeg(ref counterRef) int64 {
	if !t.wt {
		return 0
	}
	t.penMu.Lock()
	defer t.penMu.Unlock()
	return t.pending[ref].neg
}

// add adds a diff of d.
func (a *pendAmt) add(d int64) {
	if d > 0 {
		a.pos += d
	} else {
		a.neg += d
	}
}

// unsettled reports whether ref may have hits in a push not settled yet:
// with WriteThrough, exactly; otherwise, whether some window of ref's entry is
// in the push in flight.
func (t *Table) unsettled(ref counterRef) bool {
	if t.wt {
		return t.pend(ref) != 0
	}
	return ref.e.flags.Load()&flagInFlight != 0
}

// settleFlags clears flagInFlight on b's entries once b is settled.
func (t *Table) settleFlags(b *Batch) {
	if t.wt {
		return
	}
	for _, run := range b.runs {
		run.e.flags.And(^flagInFlight)
	}
}

// unpend removes d from ref's pending amount.
func (t *Table) unpend(ref counterRef, d int64) {
	if !t.wt {
		return
	}
	t.penMu.Lock()
	defer t.penMu.Unlock()
	a := t.pending[ref]
	if d > 0 { // each diff settles once, with the delta it was added with
		a.pos -= d
	} else {
		a.neg -= d
	}
	if a != (pendAmt{}) {
		t.pending[ref] = a
	} else {
		delete(t.pending, ref)
	}
}

// worthReading reports whether a sync should read the window starting at x
// (held in c) of size size, when now falls in the window starting at cur: the
// current window always; the previous one until it has settled, or while this
// node has not learned its total.
func (t *Table) worthReading(x, now, cur, size int64, c cnt) bool {
	if x >= cur {
		return true
	}
	return x == cur-size && (t.settle == 0 || now-cur < t.settle || c.synced() == unknown)
}

func (t *Table) addRead(b *Batch, ref counterRef, key string) {
	b.Reads = append(b.Reads, t.id(ref, key))
	b.readRefs = append(b.readRefs, ref)
	b.extend(ref.e)
}

// Keys appends to dst the keys seen (read or written) in the current or
// previous window at now, and returns the extended slice.
func (t *Table) Keys(now int64, dst []string) []string {
	for i := range t.shards {
		s := &t.shards[i]
		s.mu.RLock()
		s.each(func(e *entry) {
			if !e.expired(t, now) {
				dst = append(dst, e.key())
			}
		})
		s.mu.RUnlock()
	}
	return dst
}

// collectAll appends to b every hit not yet handed to a push (from every entry
// with Walk, else from the entries used since the last Collect, and from
// retired records) and marks it pending. With reads, it also appends reads of
// those entries' windows that have no diff: the current window, the previous
// one until it has settled, and the next one near the current one's end (see
// ReadAhead). Settle b with Ack or Release.
func (t *Table) collectAll(now int64, reads bool, b *Batch) {
	t.Rewind()
	for !t.CollectSome(now, reads, b, 0) {
	}
}

// Rewind makes the next CollectSome start a pass over the whole table: the
// retired records, then every shard. A sync cycle starts with it, so a pass
// that an error cut short is never taken for a finished one.
//
// With Watch, the pass also takes the windows due for a full read (see
// LoadChanges); the caller confirms them with PassDone once every push of
// the pass succeeded, or the next pass reads them again.
func (t *Table) Rewind() {
	t.cursor, t.passRetired = 0, 0
	t.startPass()
}

// CollectSome is collectAll in chunks: it stops once b holds at least max diffs
// and reads (0: no limit) and reports whether it went through the whole
// table. The next call goes on where it stopped; settle b before it. One
// caller at a time (the sync loop). The retired records come first, at most
// max of them per chunk; then the shards; then (with max > 0) the records
// retired while the shards were walked, in chunks of their own.
func (t *Table) CollectSome(now int64, reads bool, b *Batch, max int) (done bool) {
	defer t.opened(b)
	if t.cursor == 0 {
		if !t.collectRetired(b, max) {
			return false // more retired records than one chunk holds
		}
		t.cursor = 1
	}
	if t.cursor > len(t.shards) {
		// The windows retired while the shards were walked (keys evicted,
		// windows rotated by traffic meanwhile) hold hits counted before
		// the pass began: push them too, in chunks of their own, so that
		// no window collected from its entry is collected again from its
		// record before that push is settled.
		if !t.collectRetired(b, max) {
			return false
		}
		t.cursor = 0
		return true
	}
	c := t.newCollector(now, reads, b)
	for t.cursor <= len(t.shards) {
		t.collectShard(&t.shards[t.cursor-1], &c)
		t.cursor++
		if max > 0 && len(b.Diffs)+len(b.Reads) >= max && t.cursor <= len(t.shards) {
			return false
		}
	}
	if max > 0 && t.retiredLen() > 0 {
		return false // the retired records next (see above)
	}
	t.cursor = 0
	return true
}

// PassShare reports how far a pass of CollectSome that is not done has
// gone: the shards it has collected, of all the table's, and the diffs it
// took from retired records (which come first, and say nothing of the
// shards). Keys spread evenly over the shards, so a caller can extrapolate
// from the diffs the pass collected from shards so far what the whole pass
// will. Between passes (CollectSome reported done) collected is 0.
func (t *Table) PassShare() (collected, shards, retired int) {
	if t.cursor == 0 {
		return 0, len(t.shards), t.passRetired
	}
	return min(t.cursor-1, len(t.shards)), len(t.shards), t.passRetired
}

// retiredLen returns the number of retired records.
func (t *Table) retiredLen() int {
	t.retMu.Lock()
	defer t.retMu.Unlock()
	return len(t.retired)
}

// collector holds what one CollectSome call needs for every entry: the start
// of the window now falls in, per size, worked out once instead of per entry.
type collector struct {
	b     *Batch
	now   int64
	reads bool
	cur   [2]int64 // windowStart(now, t.sizeMS[w])
}

func (t *Table) newCollector(now int64, reads bool, b *Batch) collector {
	c := collector{b: b, now: now, reads: reads}
	for w := range t.n {
		c.cur[w] = windowStart(now, t.sizeMS[w])
	}
	return c
}

// opened records b as handed to a push until Ack or Release settles it.
func (t *Table) opened(b *Batch) {
	if len(b.Diffs) > 0 {
		t.retMu.Lock()
		t.open[b] = struct{}{}
		t.retMu.Unlock()
	}
}

// settled forgets b as an open batch.
func (t *Table) settled(b *Batch) {
	t.retMu.Lock()
	delete(t.open, b)
	t.retMu.Unlock()
}

// collectRetired adds the retired records' unpushed hits to b, stopping at
// max counters (0: no limit), and reports whether it added every one. The
// caller settles b before the next call: a record whose hits were pushed then
// has none left to add, so each call takes the next ones.
func (t *Table) collectRetired(b *Batch, max int) bool {
	t.retMu.Lock()
	defer t.retMu.Unlock()
	n := len(b.Diffs)
	defer func() { t.passRetired += len(b.Diffs) - n }()
	for ref, r := range t.retired {
		if max > 0 && len(b.Diffs)+len(b.Reads) >= max {
			return false
		}
		pending := t.pend(ref)
		if d := r.local - r.acked - pending; d != 0 {
			t.addDiff(b, ref, r.key, d)
		} else if pending == 0 {
			delete(t.retired, ref) // confirmed in full
		}
	}
	return true
}

// collectShard adds s's share of a cycle to c.b. With Walk it visits every
// entry s holds (a node refreshes every key it has seen in the current or
// previous window, every cycle, so its view is never more than one cycle
// behind the cluster's: the bound nodes × rate × SyncRate holds however thinly
// a key's traffic is spread over the nodes); otherwise the entries on s's
// active list.
func (t *Table) collectShard(s *shard, c *collector) {
	if t.walk || t.passWalk {
		t.walkShard(s, c)
		return
	}
	s.dirtyMu.Lock()
	active := s.dirty
	s.dirty = nil
	s.dirtyMu.Unlock()
	carry := active[:0] // entries used since the last Collect stay listed
	for _, e := range active {
		if t.unlist(e) {
			carry = append(carry, e)
		}
		t.collectEntry(e, c)
	}
	clear(active[len(carry):])
	s.dirtyMu.Lock()
	if s.dirty != nil { // entries listed while this Collect ran
		carry = append(carry, s.dirty...)
	}
	s.dirty = carry // the backing array is reused: no allocation next cycle
	s.dirtyMu.Unlock()
}

// walkShard collects every entry of s, and drops s's expired entries when
// they are a quarter of it or more.
func (t *Table) walkShard(s *shard, c *collector) {
	expired := 0
	s.mu.RLock()
	s.each(func(e *entry) {
		if t.collectEntry(e, c) {
			expired++
		}
	})
	drop := expired > 0 && expired*4 >= s.count
	s.mu.RUnlock()
	if drop {
		s.mu.Lock()
		t.dropExpired(s, c.now)
		s.mu.Unlock()
	}
}

// unlist takes e's use since the last Collect: it reports true, and keeps e
// listed for one more Collect, if e was used; otherwise it takes e off the
// list (a racing use lists it again).
func (t *Table) unlist(e *entry) bool {
	for {
		f := e.flags.Load()
		if f&flagDead != 0 {
			return false // evicted: its hits are in retired records
		}
		if f&flagUsed != 0 {
			if e.flags.CompareAndSwap(f, f&^flagUsed) {
				return true
			}
			continue
		}
		if e.flags.CompareAndSwap(f, f&^flagListed) {
			return false
		}
	}
}

// heldParities returns the slot indexes of the windows starting at lat and
// lat-size: parity(lat, size) and parity(lat-size, size), with one division
// when lat is a window boundary (it always is, but a store could answer
// otherwise).
func heldParities(lat, size int64) (int, int) {
	q := lat / size
	if q*size == lat {
		return int(q & 1), int((q - 1) & 1)
	}
	return int(q & 1), parity(lat-size, size)
}

// collectEntry adds e's unpushed hits (and, with reads, its seen windows) to
// c.b, and reports whether e has expired: no window of it is current or
// previous at c.now. It visits the windows eachHeld visits, in the same order,
// under one hold of e's gate.
func (t *Table) collectEntry(e *entry, c *collector) (expired bool) {
	t.lockEntry(e)
	if e.flags.Load()&flagDead != 0 {
		e.unlockEntry()
		return e.expired(t, c.now) // its hits were retired; Collect pushes them from there
	}
	expired = true
	for w := range t.n {
		p := &e.w[w]
		lat := p.latest.Load()
		if lat == noWindow {
			continue
		}
		size, cur := t.sizeMS[w], c.cur[w]
		if lat >= cur-size {
			expired = false
		}
		par0, par1 := heldParities(lat, size)
		t.collectSlot(e, c, w, lat, t.slotOf(e, w, par0), true)
		t.collectSlot(e, c, w, lat-size, t.slotOf(e, w, par1), false)
	}
	if c.reads && e.flags.Load()&flagReread != 0 {
		e.flags.And(^flagReread) // read (or diffed) in this push
		if n := len(c.b.runs); n > 0 && c.b.runs[n-1].e == e {
			c.b.runs[n-1].reread = true
		}
	}
	e.unlockEntry()
	return expired
}

// collectSlot is collectEntry for the held window of size index w starting at
// x, with counts s; newest tells whether x is the newest window e holds. The
// caller holds e's gate.
func (t *Table) collectSlot(e *entry, c *collector, w int, x int64, s cnt, newest bool) {
	ref := counterRef{e: e, w: uint8(w), start: x}
	size, cur := t.sizeMS[w], c.cur[w]
	d := s.local()
	if t.wt {
		d -= t.pend(ref)
	}
	bit := uint32(1) << (2*w + parity(x, size))
	switch {
	case d != 0:
		t.addDiff(c.b, ref, e.key(), d)
		if t.watch {
			e.markDiff(t.cycle, bit)
		}
	case !c.reads:
	case t.watch:
		// Changes come from the watches; read what they cannot tell: a
		// window whose total this node never learned, and a full read's
		// (but for the windows this cycle pushed a diff of: their totals
		// came back with it, after the cursor).
		// And a window a cold read loaded from before a change a watch
		// skipped (flagReread).
		if (t.fullReading(w, x) && !e.diffed(t.cycle, bit)) ||
			((s.synced() == unknown || e.flags.Load()&flagReread != 0) && t.worthReading(x, c.now, cur, size, s)) {
			t.addRead(c.b, ref, e.key())
		}
	case t.worthReading(x, c.now, cur, size, s):
		t.addRead(c.b, ref, e.key())
	}
	if c.reads && t.readAhead > 0 && newest && x >= cur && c.now >= x+size-t.readAhead &&
		(!t.watch || t.fullReading(w, x+size) || e.flags.Load()&flagReread != 0 || s.synced() == unknown) {
		// (Under watches: a full read's, and a key new here, whose next
		// window the watches may have listed before it was held.)
		// The window after the newest held: hits there mean other
		// nodes' clocks are ahead of this one's.
		t.addRead(c.b, counterRef{e: e, w: uint8(w), start: x + size}, e.key())
	}
}

// Ack settles a successful push of b: its diffs are confirmed and the store's
// totals become the synced counts. It goes through b's runs in order, one
// hold of the entry's lock each, and settles a run's diffs before its reads
// (a read may move the entry to a newer window); entries do not depend on
// each other.
func (t *Table) Ack(b *Batch, res strategy.Result) {
	defer t.settled(b)
	d, r := 0, 0
	for _, run := range b.runs {
		t.lockEntry(run.e)
		for ; d < run.diffs; d++ {
			t.ack(&b.diffRefs[d], b.Diffs[d].Delta, res.Totals[d])
		}
		for ; r < run.reads; r++ {
			t.setSynced(&b.readRefs[r], res.Reads[r])
		}
		run.e.unlockEntry()
	}
	t.settleFlags(b)
}

// ack settles one diff of ref: d confirmed, total learned. The caller holds
// the gate of ref.e, which makes the pending and local changes one step for
// collectEntry.
func (t *Table) ack(ref *counterRef, d, total int64) {
	e := ref.e
	if e.flags.Load()&flagDead == 0 {
		if par, ok := e.w[ref.w].held(ref.start, t.sizeMS[ref.w]); ok {
			if t.wt {
				t.unpend(*ref, d)
			}
			// The count that grows first, so a view spanning the two
			// counts the moved hits twice, never zero times (see view).
			// (A total a narrow count cannot hold widens e first.)
			w := int(ref.w)
			if d >= 0 {
				t.storeSynced(e, w, par, total, false)
				t.addLocal(e, w, par, -d)
			} else {
				t.addLocal(e, w, par, -d)
				t.storeSynced(e, w, par, total, false)
			}
			return
		}
	}
	t.retMu.Lock()
	t.unpend(*ref, d)
	if r := t.retired[*ref]; r != nil {
		r.acked += d
		if r.acked == r.local && t.pend(*ref) == 0 {
			delete(t.retired, *ref)
		}
	} else if !t.wt && d != 0 {
		// shed dropped the record while these hits were being collected
		// (before the batch was registered as open): they reached the
		// store after all.
		t.dropped.Add(-abs(d))
	}
	t.retMu.Unlock()
}

// setSynced records total as ref's synced count. The caller holds the gate of ref.e.
func (t *Table) setSynced(ref *counterRef, total int64) {
	e := ref.e
	if e.flags.Load()&flagDead != 0 {
		return
	}
	p := &e.w[ref.w]
	if total != 0 && ref.start > p.latest.Load() {
		// The store has hits in a window newer than this node's newest:
		// nodes whose clocks are ahead are in it. Follow them, so this
		// node's hits count there too and the window before it weighs in
		// fully until this node's clock catches up.
		e.rotate(t, int(ref.w), ref.start)
	}
	if par, ok := p.held(ref.start, t.sizeMS[ref.w]); ok {
		t.storeSynced(e, int(ref.w), par, total, false)
	}
}

// Release settles a push of b that surely was not applied: its diffs are no
// longer pending, and the next Collect takes them again, merged with newer hits,
// and reads again the entries a cold read marked (flagReread).
func (t *Table) Release(b *Batch) {
	defer t.settled(b)
	t.settleFlags(b)
	for _, run := range b.runs {
		if run.reread && run.e.flags.Load()&flagDead == 0 {
			// The reads were never answered: the next Collect reads again.
			run.e.flags.Or(flagReread)
			t.remark(run.e)
		}
	}
	for i, ref := range b.diffRefs {
		e := ref.e
		t.lockEntry(e)
		t.unpend(ref, b.Diffs[i].Delta)
		e.unlockEntry()
		if e.flags.Load()&flagDead == 0 {
			t.remark(e)
		}
	}
}

// remark puts e back on its shard's dirty list, unless it was evicted
// meanwhile (then its hits are in a retired record, which Collect always reads).
func (t *Table) remark(e *entry) {
	if t.walk {
		return // the next Collect visits every entry anyway
	}
	s, found := t.lookup(e.key())
	if found == nil {
		return
	}
	if found == e {
		t.touch(s, e)
	}
	s.mu.RUnlock()
}

// Load stores a count the store reported for key's window of size index w
// starting at start, as learned at now. With insert, a missing key is created
// (fetch scope "all"); without, only keys this node holds are updated.
func (t *Table) Load(key string, w int, start, count, now int64, insert bool) {
	var s *shard
	var e *entry
	excl := false
	if insert {
		s, e, excl = t.lock(key, now)
	} else if s, e = t.lookup(key); e == nil {
		return
	}
	defer s.unlock(excl)
	size := t.sizeMS[w]
	t.lockEntry(e)
	defer e.unlockEntry()
	p := &e.w[w]
	if lat := p.latest.Load(); start > lat && start <= windowStart(now, size) {
		e.rotate(t, w, start)
	}
	if par, ok := p.held(start, size); ok {
		t.storeSynced(e, w, par, count, false)
	}
}

// Pending returns the hits counted in this table that the store has not
// confirmed yet (waiting for a push, in flight, or in retired windows), and how
// many retired records wait for a push. It walks the table: for monitoring,
// not for hot paths.
func (t *Table) Pending() (hits int64, retired int) {
	t.retMu.Lock()
	for _, r := range t.retired {
		if r.local != r.acked { // not a record kept only for a push in flight
			hits += r.local - r.acked
			retired++
		}
	}
	t.retMu.Unlock()
	for i := range t.shards {
		s := &t.shards[i]
		s.mu.RLock()
		s.each(func(e *entry) {
			t.lockEntry(e)
			e.eachHeld(t, func(w int, _ int64, par int) { hits += t.slotOf(e, w, par).local() })
			e.unlockEntry()
		})
		s.mu.RUnlock()
	}
	return hits, retired
}
