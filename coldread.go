package ratelimit

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ratesync/ratelimit/shm"
	"github.com/ratesync/ratelimit/strategy"
)

// A cold key is a key this node does not hold: never seen here, or evicted
// since. In periodic mode its counts here are only this node's hits, so a
// client that spent its budget on another node would be given a fresh one.
// With Config.ColdRead on (the default), the first decision for a cold key
// waits for one read of its current and previous windows from the store.
//
// The coldReader batches those reads, in two lanes: windows (GetCounters)
// and token buckets (a push of bucket reads only), each with at most one
// read in flight. A caller that finds no read in flight in a lane starts
// one at once (a lone caller whose context cannot end sends it itself, with
// no hand-off); callers that arrive while a read is in flight queue their
// keys for the next one, which a goroutine sends as soon as the read in
// flight ends; a caller whose key is already queued or in flight waits for
// that read instead of adding its own. So concurrent cold keys share a
// round trip per kind and a key is read once however many callers find it
// cold together. A read is never cut short by the caller that started it:
// others may be waiting on it.
//
// Every wait is bounded by SyncTimeout, by the caller's context and by Close;
// a read
// that fails or times out leaves the decision to this node's state (Degraded)
// and never loses the hit. While reads fail (or the sync loop's cycles do),
// callers do not wait: one read at a time goes to the store as a probe, and
// the first to succeed lets callers wait again.
type coldReader struct {
	ns *Namespace

	mu     sync.Mutex
	queued map[coldKey]*coldBatch // keys queued or in flight, with their batch (guarded by mu)
	// lanes[0] reads windows (GetCounters), lanes[1] token buckets (a
	// push of bucket reads): each has its own read in flight and queue, so
	// one kind's slow or failing read neither delays nor fails the
	// other's keys.
	lanes [2]coldLane

	// down[l] is set while lane l's last read failed: callers of that
	// lane's keys then do not wait (the other lane's still do).
	down [2]atomic.Bool

	// runs counts the goroutines sending reads (run), which Close waits
	// for: they are started only by calls in flight, which Close waits
	// for first.
	runs sync.WaitGroup
}

// goRun sends b, then what queues behind it, in a goroutine Close waits for.
func (c *coldReader) goRun(b *coldBatch) {
	c.runs.Add(1)
	go func() {
		defer c.runs.Done()
		c.run(b)
	}()
}

// waitRuns waits, until ctx is done, for the reads sent in goroutines.
func (c *coldReader) waitRuns(ctx context.Context) {
	done := make(chan struct{})
	go func() {
		c.runs.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
	}
}

// coldLane is one kind's reads (guarded by the coldReader's mu).
type coldLane struct {
	next *coldBatch // keys waiting for the read in flight to end
	busy bool       // a read is in flight
}

// coldKey is a key cold in one table: the window table tables[ti], or
// (bucket) the token buckets of the window size WindowSizes[ti].
type coldKey struct {
	key    string
	ti     int
	bucket bool
}

// holds reports whether the table of k holds k's key now.
func (c *coldReader) holds(k coldKey) bool {
	if k.bucket {
		return c.ns.bucketTable(k.ti).Holds(k.key)
	}
	return c.ns.tables[k.ti].Holds(k.key)
}

// coldBatch is the keys of one read, all of one kind.
type coldBatch struct {
	bucket bool // token buckets' keys (lanes[1]), else windows'
	keys   []coldKey
	done   chan struct{} // closed once the read ended and its totals are loaded
	err    error         // the read's error; written before done is closed
	// What the read found, for relearn (written before done is closed):
	// states[i] is the bucket keys[i] held in the store (bucket batches);
	// counts[i] the totals of keys[i] and seqs[i] its table's SkipSeq
	// before the read (window batches).
	states []strategy.BucketState
	counts [][2][2]int64
	seqs   []uint64
	now    int64 // the time the windows' totals were read at (window batches)
	// Room for a lone caller's key, its query and its totals, allocated
	// with the batch.
	keyBuf   [1]coldKey
	qKeyBuf  [1]string
	countBuf [1][2][2]int64
	seqBuf   [1]uint64
}

func newColdBatch(bucket bool) *coldBatch {
	b := &coldBatch{bucket: bucket, done: make(chan struct{})}
	b.keys = b.keyBuf[:0]
	return b
}

// newColdReader returns the namespace's cold reader: nil (no cold reads)
// unless the namespace syncs periodically with ColdRead on.
func newColdReader(ns *Namespace) *coldReader {
	if ns.mode != modeAsync || ns.cfg.ColdRead == ColdReadOff {
		return nil
	}
	return &coldReader{ns: ns, queued: make(map[coldKey]*coldBatch)}
}

// applyWarm is Increment's step on this node (SlidingWindow's, with peek)
// for a namespace that reads cold keys: one lookup counts the hit and tells
// whether the key is held; a cold key is read first, then counted. It
// returns the view and the time it was taken at.
func (ns *Namespace) applyWarm(ctx context.Context, t *shm.Table, i int, key string, now, value int64, peek bool) (shm.View, int64) {
	views, ok := t.AddWindowsIfHeld(key, now, 1<<(i%2), [2]int64{value, value}, peek)
	if ok {
		return views[i%2], now
	}
	keys := [1]coldKey{{key: key, ti: i / 2}}
	degraded := ns.cold.warm(ctx, keys[:], nil)
	now = ns.now() // the read may have waited
	var v shm.View
	if peek {
		v = t.Peek(key, i%2, now)
	} else {
		v = t.Add(key, i%2, now, value)
	}
	t.Unref(key) // seen once, as without the cold read
	if degraded {
		t.KeepCold(key)
	}
	return v, now
}

// decideWarm is decideIn's first step (counting value, or reading with
// peek) for a namespace that reads cold keys. When every limit's window
// lives in one table (up to two window sizes: the common case), one lookup
// counts and tells whether the key is held. Otherwise, or when the key is
// cold, it reads the key first and leaves the counting to the caller
// (applied false). It reports whether the key was cold, and whether the
// read failed (Degraded).
func (ns *Namespace) decideWarm(ctx context.Context, key string, st []lstate, now, value int64, peek bool) (cold, degraded, applied bool) {
	if bcold, bdeg := ns.warmBuckets(ctx, key, st); bcold {
		if bdeg {
			// The windows were read with the buckets, in the same wait: a
			// second wait could take SyncTimeout again.
			return true, true, false
		}
		cold = true
	}
	var mask uint8
	var owners [2]int
	one, first := true, -1
	for j := range st {
		if st[j].owner != j || st[j].kind != kindWindow {
			continue
		}
		if first < 0 {
			first = j
		}
		if st[j].ti != st[first].ti {
			one = false
			break
		}
		mask |= 1 << st[j].w
		owners[st[j].w] = j
	}
	switch {
	case first < 0:
		return cold, degraded, false // no window limits
	case !one:
		wcold, wdeg := ns.warmLimits(ctx, key, st)
		return cold || wcold, degraded || wdeg, false
	}
	views, ok := st[first].t.AddWindowsIfHeld(key, now, mask, [2]int64{value, value}, peek)
	if ok {
		for w := range 2 {
			if mask&(1<<w) != 0 {
				st[owners[w]].v = views[w]
			}
		}
		return cold, degraded, true
	}
	keys := [1]coldKey{{key: key, ti: st[first].ti}}
	return true, ns.cold.warm(ctx, keys[:], nil) || degraded, false
}

// warmBuckets reads, before a decision, the store's state of every token
// bucket of st this node does not hold, bounded by SyncTimeout and
// coalesced with other callers' cold reads as a window's are, and with
// them the windows of st cold here, in the same wait. It reports whether
// any bucket was cold, and whether the read failed or was not waited for
// (Degraded).
func (ns *Namespace) warmBuckets(ctx context.Context, key string, st []lstate) (cold, degraded bool) {
	var buf [maxInlineLimits]coldKey
	var ownerBuf [maxInlineLimits]int
	keys, owners := buf[:0], ownerBuf[:0]
	for j := range st {
		if s := &st[j]; s.owner == j && s.kind == kindBucket && !s.bt.Holds(key) {
			keys = append(keys, coldKey{key: key, ti: s.idx, bucket: true}) // past maxInlineLimits, both grow
			owners = append(owners, j)
		}
	}
	if len(keys) == 0 {
		return false, false
	}
	for j := range st {
		s := &st[j]
		k := coldKey{key: key, ti: s.ti}
		if s.owner == j && s.kind == kindWindow && !slices.Contains(keys, k) && !s.t.Holds(key) {
			keys = append(keys, k)
		}
	}
	var stateBuf [maxInlineLimits]*strategy.BucketState
	states := stateBuf[:0]
	for range keys {
		states = append(states, nil)
	}
	degraded = ns.cold.warm(ctx, keys, states)
	for i, j := range owners {
		st[j].learned = states[i]
	}
	return true, degraded
}

// warmLimits reads key first in the tables of a decision's limits where it
// is cold. It reports whether the key was cold in any, and whether the read
// failed (Degraded).
func (ns *Namespace) warmLimits(ctx context.Context, key string, st []lstate) (cold, degraded bool) {
	var buf [maxInlineLimits]coldKey
	keys := buf[:0]
	for j := range st {
		s := &st[j]
		k := coldKey{key: key, ti: s.ti}
		if s.owner != j || s.kind != kindWindow || slices.Contains(keys, k) {
			continue
		}
		if !s.t.Holds(key) {
			keys = append(keys, k)
		}
	}
	if len(keys) == 0 {
		return false, false
	}
	return true, ns.cold.warm(ctx, keys, nil)
}

// unrefLimits undoes, after the first decision on a cold key, the reference
// mark that finding the entry the cold read created set: a key seen once is
// evicted before keys seen again, with or without a cold read.
func unrefLimits(key string, st []lstate) {
	first := -1
	for j := range st {
		if st[j].owner != j || st[j].kind != kindWindow {
			continue
		}
		if first < 0 || st[j].ti != st[first].ti {
			st[j].t.Unref(key)
		}
		if first < 0 {
			first = j
		}
	}
}

// warm reads the store's state of keys (one key, cold in each of their
// tables) and loads it; it reports whether the decision must be made
// without it (Degraded): the read failed, timed out, or was not waited for.
// When states is not nil, states[i] is set to what the read found for
// keys[i] when it is a token bucket's (the decision's try learns it again
// if the table lost the bucket since).
func (c *coldReader) warm(ctx context.Context, keys []coldKey, states []*strategy.BucketState) (degraded bool) {
	storeDown := c.ns.storeDown.Load()
	var laneDown [2]bool
	for l := range laneDown {
		laneDown[l] = storeDown || c.down[l].Load()
	}
	var owns [2]*coldBatch // the reads this caller sends, per lane
	var buf [maxInlineLimits]*coldBatch
	waits := buf[:0]
	var fromBuf [maxInlineLimits]*coldBatch
	from := fromBuf[:0] // from[i] is the batch reading keys[i] that the caller waits for, or nil
	c.mu.Lock()
	for _, k := range keys {
		from = append(from, nil) // past maxInlineLimits, it grows
		if b := c.queued[k]; b != nil {
			if laneDown[laneOf(k.bucket)] {
				degraded = true // a probe: not waited for
				continue
			}
			if !slices.Contains(waits, b) {
				waits = append(waits, b)
			}
			from[len(from)-1] = b
			continue
		}
		if c.holds(k) {
			continue // a read loaded it since the caller looked
		}
		l := laneOf(k.bucket)
		lane := &c.lanes[l]
		degraded = degraded || laneDown[l] // its read, if any, is a probe
		var b *coldBatch
		switch {
		case !lane.busy:
			if owns[l] == nil {
				owns[l] = newColdBatch(k.bucket)
				if !laneDown[l] {
					waits = append(waits, owns[l])
				}
			}
			b = owns[l]
		case laneDown[l]:
			continue // a probe is in flight: do not queue behind it
		default:
			if lane.next == nil {
				lane.next = newColdBatch(k.bucket)
			}
			b = lane.next
			if !slices.Contains(waits, b) {
				waits = append(waits, b)
			}
		}
		b.keys = append(b.keys, k)
		c.queued[k] = b
		if !laneDown[l] {
			from[len(from)-1] = b
		}
	}
	inline := -1 // the lane whose read this caller sends itself, if any
	for l, own := range owns {
		if own != nil {
			c.lanes[l].busy = true
			if !laneDown[l] {
				inline = l
			}
		}
	}
	c.mu.Unlock()

	// A read others may come to wait on must not end with its caller (a
	// client that hung up): it is bounded by SyncTimeout and Close only.
	// So a caller sends its read itself, with no hand-off, only when its
	// context cannot end and it has no other read to wait for; otherwise
	// a goroutine sends it and the caller waits as the others do.
	// (Its only read: its wait for any other starts only after the
	// send, and would add up to SyncTimeout to the call.)
	if inline >= 0 && (ctx.Done() != nil || len(waits) != 1 || waits[0] != owns[inline]) {
		inline = -1
	}
	for l, own := range owns {
		if own != nil && l != inline {
			c.goRun(own) // while the store fails, a probe nobody waits for
		}
	}
	if inline >= 0 {
		if next := c.send(owns[inline]); next != nil {
			c.goRun(next)
		}
	}
	var timer *time.Timer
	for _, b := range waits {
		select {
		case <-b.done:
			degraded = degraded || b.err != nil
			continue
		default:
		}
		if timer == nil {
			timer = time.NewTimer(c.ns.cfg.SyncTimeout)
			defer timer.Stop()
		}
		select {
		case <-b.done:
			degraded = degraded || b.err != nil
		case <-timer.C:
			return true
		case <-ctx.Done():
			return true
		case <-c.ns.closing.Done(): // closed
			return true
		}
	}
	// A batch loads all its keys before any of their callers decides, and
	// loading its later keys may make room by evicting its earlier ones
	// (what was read lives in the table, not in the caller): a window
	// entry evicted since is loaded again, a bucket's state goes to the
	// decision's try.
	for i, k := range keys {
		b := from[i]
		if b == nil || b.err != nil {
			continue
		}
		j := slices.Index(b.keys, k)
		switch {
		case j < 0:
		case k.bucket && states != nil && j < len(b.states):
			states[i] = &b.states[j]
		case !k.bucket && j < len(b.counts) && !c.holds(k):
			t := c.ns.tables[k.ti]
			// At the read's time: its totals are of the windows then.
			t.LoadColdSince(k.key, b.now, uint8(1)<<len(t.Sizes())-1, b.counts[j], b.seqs[j])
		}
	}
	return degraded
}

// laneOf returns the index in coldReader.lanes of a kind of key.
func laneOf(bucket bool) int {
	if bucket {
		return 1
	}
	return 0
}

// run sends b, then every batch queued behind it in its lane, until none
// is left.
func (c *coldReader) run(b *coldBatch) {
	for b != nil {
		b = c.send(b)
	}
}

// send reads b, bounded by SyncTimeout and Close, and settles it; it
// returns the batch queued behind it (see settle).
func (c *coldReader) send(b *coldBatch) *coldBatch {
	ctx, cancel := context.WithTimeout(c.ns.closing, c.ns.cfg.SyncTimeout)
	defer cancel()
	c.read(ctx, b)
	return c.settle(b)
}

// settle ends b's read: its keys may be queued again (they are held now,
// unless the read failed), and its callers are released. It returns the batch
// to send next, or nil when none is queued (then no read is in flight).
func (c *coldReader) settle(b *coldBatch) *coldBatch {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, k := range b.keys {
		if c.queued[k] == b {
			delete(c.queued, k)
		}
	}
	close(b.done)
	lane := &c.lanes[laneOf(b.bucket)]
	next := lane.next
	lane.next = nil
	lane.busy = next != nil
	return next
}

// read reads b's keys from the store and loads what it found into the
// tables: one GetCounters call for window keys, one PushDiffs call (bucket
// reads only) for token buckets. A failure marks the store down, unless
// Close cut the read short.
func (c *coldReader) read(ctx context.Context, b *coldBatch) {
	var err error
	if b.bucket {
		err = c.readBuckets(ctx, b)
	} else {
		err = c.readWindows(ctx, b, b.keys)
	}
	if err != nil {
		b.err = fmt.Errorf("%w: cold read: %w", ErrStoreUnavailable, err)
		if c.ns.closing.Err() == nil {
			c.down[laneOf(b.bucket)].Store(true)
		}
		return
	}
	c.down[laneOf(b.bucket)].Store(false)
}

// readBuckets reads the token buckets of cb (all cold in a bucket table) in
// one PushDiffs call that pushes nothing, and records what the store holds.
func (c *coldReader) readBuckets(ctx context.Context, cb *coldBatch) error {
	ns, keys := c.ns, cb.keys
	now := ns.now()
	b := strategy.Batch{Namespace: ns.name, ID: ns.newBatchID(), Now: now, BucketReads: make([]strategy.BucketID, len(keys))}
	for i, k := range keys {
		b.BucketReads[i] = strategy.BucketID{Key: k.key, Period: ns.cfg.WindowSizes[k.ti]}
	}
	res, err := ns.store.PushDiffs(ctx, &b)
	if err != nil {
		return err
	}
	if len(res.BucketReads) != len(keys) {
		return fmt.Errorf("the store answered %d bucket reads of %d", len(res.BucketReads), len(keys))
	}
	for i, k := range keys {
		ns.bucketTable(k.ti).LearnCold(k.key, now, res.BucketReads[i])
	}
	cb.states = res.BucketReads
	return nil
}

// readWindows makes one GetCounters call for keys (all cold in a window
// table) and loads the totals into the tables.
func (c *coldReader) readWindows(ctx context.Context, b *coldBatch, keys []coldKey) error {
	ns := c.ns
	now := ns.now()
	q := strategy.Query{Namespace: ns.name, Now: now}
	var tableBuf [4]int
	tables := tableBuf[:0]
	if len(keys) == 1 { // the common case of a lone caller: no allocation here
		b.qKeyBuf[0] = keys[0].key
		q.Keys = b.qKeyBuf[:]
	} else {
		q.Keys = make([]string, 0, len(keys))
	}
	for _, k := range keys {
		if len(keys) > 1 && (len(keys) > 16 || !slices.Contains(q.Keys, k.key)) {
			q.Keys = append(q.Keys, k.key)
		}
		if !slices.Contains(tables, k.ti) {
			tables = append(tables, k.ti)
		}
	}
	if len(tables) == 1 {
		q.Sizes = ns.tables[tables[0]].Sizes()
	} else {
		for _, ti := range tables {
			q.Sizes = append(q.Sizes, ns.tables[ti].Sizes()...)
		}
	}
	if len(keys) > 16 {
		slices.Sort(q.Keys)
		q.Keys = slices.Compact(q.Keys)
	}
	// counts[j] are keys[j]'s totals: [size index in the table][current, previous].
	counts := b.countBuf[:]
	if len(keys) > 1 {
		counts = make([][2][2]int64, len(keys))
	}
	var index map[coldKey]int
	if len(keys) > 16 {
		index = make(map[coldKey]int, len(keys))
		for j, k := range keys {
			index[k] = j
		}
	}
	// The watch answers that skipped keys not held, before the read: a
	// later one may skip this read's key after it changed (see
	// shm.Table.LoadColdSince).
	var seqBuf [4]uint64
	seqs := seqBuf[:0]
	for _, ti := range tables {
		seqs = append(seqs, ns.tables[ti].SkipSeq())
	}
	for cnt, err := range ns.store.GetCounters(ctx, q) {
		if err != nil {
			// Kept in b (read wraps it) and returned after the loop: a
			// return here, or a local, would move to the heap.
			b.err = err
			break
		}
		i := slices.Index(ns.cfg.WindowSizes, cnt.Size)
		if i < 0 {
			continue
		}
		k := coldKey{key: cnt.Key, ti: i / 2}
		j := -1
		if index != nil {
			if n, ok := index[k]; ok {
				j = n
			}
		} else {
			j = slices.Index(keys, k)
		}
		if j < 0 {
			continue // a key or size this read did not ask for
		}
		switch cur := strategy.WindowStart(now, cnt.Size); cnt.Start {
		case cur:
			counts[j][i%2][0] = cnt.Count
		case cur - ns.sizeMS[i]:
			counts[j][i%2][1] = cnt.Count
		}
	}
	if b.err != nil {
		return b.err
	}
	keySeqs := b.seqBuf[:]
	if len(keys) > 1 {
		keySeqs = make([]uint64, len(keys))
	}
	for j, k := range keys {
		t := ns.tables[k.ti]
		keySeqs[j] = seqs[slices.Index(tables, k.ti)]
		t.LoadColdSince(k.key, now, uint8(1)<<len(t.Sizes())-1, counts[j], keySeqs[j])
	}
	b.counts, b.seqs, b.now = counts, keySeqs, now
	return nil
}

// keepCold marks key unread in the window tables of st after a decision
// whose cold read failed.
func keepCold(key string, st []lstate) {
	for j := range st {
		if st[j].owner == j && st[j].kind == kindWindow {
			st[j].t.KeepCold(key)
		}
	}
}
