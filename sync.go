package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/ratesync/ratelimit/shm"
	"github.com/ratesync/ratelimit/strategy"
)

// pushSize bounds the counters (diffs and reads) of one push: MaxKeys/8,
// between 1,024 and 16,384. A larger cycle sends several, one after another.
func (ns *Namespace) pushSize() int { return min(max(ns.cfg.MaxKeys/8, 1024), 16384) }

// push is one batch sent to the store: a part per table, joined into one
// strategy.Batch so a sync cycle is one round trip.
type push struct {
	parts []shm.Batch
	// watches are the watches of table watchTable (see shm.Table.Watches),
	// sent with the first push of its pass.
	watches    []strategy.Watch
	watchTable int
	// bparts[i] is the part of the token buckets of window size i.
	bparts  []shm.BucketBatch
	batch   strategy.Batch
	unknown bool // an attempt's outcome was unknown: only a success settles it now
	// res is the store's answer to the attempt that succeeded (write-throughs
	// judge their windows from it; see throughView).
	res strategy.Result
}

func (ns *Namespace) newPush() *push {
	p := &push{parts: make([]shm.Batch, len(ns.tables))}
	p.batch.ID, p.batch.Namespace = ns.newBatchID(), ns.name
	return p
}

// bucketPart returns p's part for the token buckets of window size i.
func (p *push) bucketPart(ns *Namespace, i int) *shm.BucketBatch {
	if p.bparts == nil {
		p.bparts = make([]shm.BucketBatch, len(ns.cfg.WindowSizes))
	}
	return &p.bparts[i]
}

// assemble joins the parts into p.batch, at now (the batch's Now: kept by a
// re-send, which does not assemble again).
func (p *push) assemble(now int64) {
	p.batch.Now = now
	if len(p.parts) == 1 {
		p.batch.Diffs, p.batch.Reads = p.parts[0].Diffs, p.parts[0].Reads
	} else {
		p.batch.Diffs, p.batch.Reads = p.batch.Diffs[:0], p.batch.Reads[:0]
		for i := range p.parts {
			p.batch.Diffs = append(p.batch.Diffs, p.parts[i].Diffs...)
			p.batch.Reads = append(p.batch.Reads, p.parts[i].Reads...)
		}
	}
	p.batch.Watches = p.watches
	p.batch.BucketDiffs, p.batch.BucketReads = p.batch.BucketDiffs[:0], p.batch.BucketReads[:0]
	for i := range p.bparts {
		p.batch.BucketDiffs = append(p.batch.BucketDiffs, p.bparts[i].Diffs...)
		p.batch.BucketReads = append(p.batch.BucketReads, p.bparts[i].Reads...)
	}
}

func (p *push) empty() bool {
	return len(p.batch.Diffs) == 0 && len(p.batch.Reads) == 0 && len(p.batch.BucketDiffs) == 0 && len(p.batch.BucketReads) == 0 &&
		len(p.batch.Watches) == 0
}

// send makes one attempt at p and settles it when the answer is definite: on
// success the tables learn the totals; when the store surely applied nothing
// (and no earlier attempt had an unknown outcome) the hits go back to be merged
// with newer ones. Otherwise p stays unsettled and must be sent again.
func (ns *Namespace) send(ctx context.Context, p *push) error {
	cctx, cancel := context.WithTimeout(ctx, ns.cfg.SyncTimeout)
	res, err := ns.store.PushDiffs(cctx, &p.batch)
	cancel()
	if err == nil && (len(res.Totals) != len(p.batch.Diffs) || len(res.Reads) != len(p.batch.Reads) ||
		len(res.Buckets) != len(p.batch.BucketDiffs) || len(res.BucketReads) != len(p.batch.BucketReads) ||
		len(res.Changes) != len(p.batch.Watches)) {
		err = fmt.Errorf("store answered %d totals, %d reads, %d buckets and %d bucket reads for %d diffs, %d reads, %d bucket diffs and %d bucket reads",
			len(res.Totals), len(res.Reads), len(res.Buckets), len(res.BucketReads),
			len(p.batch.Diffs), len(p.batch.Reads), len(p.batch.BucketDiffs), len(p.batch.BucketReads))
	}
	if err == nil {
		ns.throughDown.Store(false)
		p.res = res
		d, r := 0, 0
		for i := range p.parts {
			part := &p.parts[i]
			nd, nr := len(part.Diffs), len(part.Reads)
			ns.tables[i].Ack(part, strategy.Result{Totals: res.Totals[d : d+nd], Reads: res.Reads[r : r+nr]})
			d, r = d+nd, r+nr
		}
		if len(p.batch.Watches) > 0 {
			t := ns.tables[p.watchTable]
			for k, w := range p.batch.Watches {
				t.LoadChanges(w, res.Changes[k], p.batch.Now)
			}
		}
		d, r = 0, 0
		for i := range p.bparts {
			part := &p.bparts[i]
			nd, nr := len(part.Diffs), len(part.Reads)
			if nd+nr > 0 {
				ns.bucketTable(i).Ack(part, res.Buckets[d:d+nd], res.BucketReads[r:r+nr])
			}
			d, r = d+nd, r+nr
		}
		return nil
	}
	if !p.unknown && errors.Is(err, strategy.ErrNotApplied) {
		ns.release(p)
	} else {
		p.unknown = true
	}
	return fmt.Errorf("%w: push %s: %w", ErrStoreUnavailable, p.batch.ID, err)
}

// keepSpare keeps a settled push for its buffers, emptied at once so that it
// holds no entry or key between cycles.
func (ns *Namespace) keepSpare(p *push) {
	for i := range p.parts {
		p.parts[i].Reset()
	}
	for i := range p.bparts {
		p.bparts[i].Reset()
	}
	p.batch.Diffs, p.batch.Reads = nil, nil
	p.batch.BucketDiffs, p.batch.BucketReads = nil, nil
	p.watches, p.batch.Watches = p.watches[:0], nil
	p.batch.PassDiffs = 0
	p.res = strategy.Result{}
	ns.spare = p
}

// keepUnresolved keeps a push whose outcome is unknown, to be re-sent before anything newer.
func (ns *Namespace) keepUnresolved(p *push) {
	ns.unresMu.Lock()
	ns.unresolved = append(ns.unresolved, p)
	ns.unresMu.Unlock()
}

func (ns *Namespace) firstUnresolved() *push {
	ns.unresMu.Lock()
	defer ns.unresMu.Unlock()
	if len(ns.unresolved) == 0 {
		return nil
	}
	return ns.unresolved[0]
}

func (ns *Namespace) dropUnresolved(p *push) {
	ns.unresMu.Lock()
	defer ns.unresMu.Unlock()
	if i := slices.Index(ns.unresolved, p); i >= 0 {
		ns.unresolved = slices.Delete(ns.unresolved, i, i+1)
	}
}

// syncOnce runs one cycle: re-send the pushes whose outcome is unknown, then
// push every hit not yet pushed (with reads of the keys this node has seen),
// then, with FetchAll, fetch the namespace. The caller holds syncSem.
func (ns *Namespace) syncOnce(ctx context.Context, reads bool) error {
	now := ns.now()
	for p := ns.firstUnresolved(); p != nil; p = ns.firstUnresolved() {
		err := ns.send(ctx, p)
		if err != nil && p.unknown {
			return err // newer hits wait until this batch has a definite answer
		}
		ns.dropUnresolved(p)
	}
	// Hits are pushed in chunks of at most pushSize counters (plus one
	// shard's share), one after another, each settled before the next is
	// collected: the memory a cycle needs is bounded whatever the traffic
	// since the last one. Each cycle is a whole pass over every table, so a
	// cycle that returns nil pushed every hit counted before it began.
	for i, t := range ns.tables {
		if err := ns.syncTable(ctx, i, now, reads, true); err != nil {
			return err
		}
		if reads && t.FullReads() > 0 {
			// The store could not list a window's changes: read it in
			// full now, after the cursor it answered, rather than a cycle
			// late.
			if err := ns.syncTable(ctx, i, now, reads, false); err != nil {
				return err
			}
		}
	}
	if err := ns.syncBuckets(ctx, now, reads); err != nil {
		return err
	}
	if ns.mode == modeSync {
		if err := ns.settleTakes(ctx); err != nil {
			return err
		}
	}
	if ns.cfg.FetchScope == FetchAll && reads {
		if err := ns.fetchLocked(ctx, now); err != nil {
			return err
		}
	}
	if t := time.UnixMilli(now); t.Sub(ns.lastPurge) >= ns.cfg.PurgeInterval {
		ns.lastPurge = t
		cctx, cancel := context.WithTimeout(ctx, ns.cfg.SyncTimeout)
		err := ns.store.Purge(cctx, now)
		cancel()
		if err != nil && ns.log != nil {
			ns.log.Warn("ratelimit: purge failed", "namespace", ns.name, "error", err)
		}
	}
	return nil
}

// syncTable runs one pass over table i: it pushes every hit not yet pushed,
// in chunks of at most pushSize counters, with the reads the pass needs and,
// with watch set, the table's watches in its first push. The caller holds
// syncSem.
func (ns *Namespace) syncTable(ctx context.Context, i int, now int64, reads, watch bool) error {
	t := ns.tables[i]
	t.Rewind()
	// Each push tells the store how many diffs the whole pass is expected
	// to push: a store with change logs then marks a window's versions
	// instead of logging each change when the pass changes most of the
	// window's counters there (high churn). Every watch over a marked
	// window reads it in full, which at that churn costs about what listing
	// it would, while the log would cost the store as much again. The
	// estimate rests on this node's own pushes, never on its watches
	// overflowing: its own markers overflow its next watch, and an estimate
	// from that would keep a node that churned once reading in full. It is
	// the larger of what the last regular cycle pushed, with the early
	// cycles before it (a burst of evictions runs early cycles that push
	// part of the churn, see runCycle), and this pass's own diffs so far
	// extrapolated to the whole table (see passEstimate): the first pass of
	// high churn marks from its first push, the first of low churn after
	// it may still mark.
	var passDiffs int
	if watch {
		passDiffs = ns.passDiffs[i]
	}
	diffs, watched := 0, false
	defer func() {
		if !watched {
			return
		}
		ns.cycleDiffs[i] += diffs
		if !ns.earlyCycle {
			ns.passDiffs[i], ns.cycleDiffs[i] = ns.cycleDiffs[i], 0
		}
	}()
	for first, done := true, false; !done; first = false {
		p := ns.spare
		ns.spare = nil
		if p == nil {
			p = ns.newPush()
		} else {
			p.batch.ID, p.unknown = ns.newBatchID(), false
		}
		if first && reads && watch {
			// The watches go with the pass's first push: the changes of
			// the cycle are learned in one round trip.
			p.watches, p.watchTable = t.Watches(now, p.watches[:0]), i
			watched = len(p.watches) > 0
		}
		done = t.CollectSome(now, reads, &p.parts[i], ns.pushSize())
		diffs += len(p.parts[i].Diffs)
		p.batch.PassDiffs = max(passDiffs, passEstimate(t, diffs, done))
		p.assemble(now)
		if !p.empty() {
			if err := ns.send(ctx, p); err != nil {
				if p.unknown {
					ns.keepUnresolved(p)
				} else {
					ns.keepSpare(p)
				}
				return err
			}
		}
		ns.keepSpare(p)
	}
	t.PassDone()
	return nil
}

// passEstimate returns how many diffs the pass under way over t is expected
// to push, from the diffs it collected so far (this push's included): their
// count once the pass is done, else those of retired records plus those of
// t's shards scaled by the share of the shards collected (keys spread evenly
// over them; the retired records come first, and say nothing of the rest).
func passEstimate(t *shm.Table, diffs int, done bool) int {
	if done {
		return diffs
	}
	collected, shards, retired := t.PassShare()
	if collected == 0 {
		return diffs
	}
	return retired + int(min(int64(diffs-retired)*int64(shards)/int64(collected), math.MaxInt32))
}

// syncBuckets pushes the token buckets' unpushed spends and, with reads,
// reads every bucket this node holds: one push per bucket table. The caller
// holds syncSem, and every earlier push is settled.
func (ns *Namespace) syncBuckets(ctx context.Context, now int64, reads bool) error {
	for _, b := range ns.bucketTables() {
		p := ns.spare
		ns.spare = nil
		if p == nil {
			p = ns.newPush()
		} else {
			p.batch.ID, p.unknown = ns.newBatchID(), false
		}
		b.t.Collect(now, reads, p.bucketPart(ns, b.i))
		p.assemble(now)
		if !p.empty() {
			if err := ns.send(ctx, p); err != nil {
				if p.unknown {
					ns.keepUnresolved(p)
				} else {
					ns.keepSpare(p)
				}
				return err
			}
		}
		ns.keepSpare(p)
	}
	return nil
}

// usesStore checks the arguments of a call that talks to the store: it
// reports false, with the error to return (nil in local mode, where there is
// nothing to do), when the call should not proceed.
func (ns *Namespace) usesStore(ctx context.Context) (bool, error) {
	switch {
	case ctx == nil:
		return false, ErrNilContext
	case ns.closed.Load():
		return false, ErrClosed
	case ns.mode == modeLocal:
		return false, nil
	}
	return true, nil
}

// lockSync waits for the sync semaphore, or for ctx to be done.
func (ns *Namespace) lockSync(ctx context.Context) error {
	select {
	case ns.syncSem <- struct{}{}:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("%w: waiting for a sync in flight: %w", ErrStoreUnavailable, ctx.Err())
	}
}

func (ns *Namespace) unlockSync() { <-ns.syncSem }

// Sync runs one sync cycle now: it re-sends pushes whose outcome is unknown,
// pushes every hit not yet pushed, and learns the totals of the keys this node
// has seen. It waits for a cycle already running. It does nothing in local
// mode.
//
// Sync returns nil only when every hit counted on this node before it began
// is in the store. Otherwise its error matches ErrStoreUnavailable, and
// errors.As finds an *UnpushedError that says how many hits wait for a push.
func (ns *Namespace) Sync(ctx context.Context) error {
	if ok, err := ns.usesStore(ctx); !ok {
		return err
	}
	return ns.unpushed(ns.runCycle(ctx, true, false))
}

// unpushed wraps a failed cycle's error in an UnpushedError that counts the
// hits this node still holds for the store.
func (ns *Namespace) unpushed(err error) error {
	if err == nil {
		return nil
	}
	hits, _ := ns.pendingHits()
	return &UnpushedError{Hits: hits, Err: err}
}

// runCycle runs one sync cycle under syncSem and records its outcome: in
// Stats, and in storeDown, which marks local answers Degraded while the
// store fails. early says the cycle runs before its time because evicted
// keys' hits pile up: its diffs count towards the next regular cycle's in
// the estimate of a pass's diffs (see syncTable), so that a burst of early
// cycles, each pushing part of the churn, does not hide it.
func (ns *Namespace) runCycle(ctx context.Context, reads, early bool) error {
	if err := ns.lockSync(ctx); err != nil {
		return err
	}
	ns.earlyCycle = early
	start := time.Now()
	err := ns.observedSync(ctx, reads)
	ns.unlockSync()
	ns.stats.recordSync(start, err)
	ns.storeDown.Store(err != nil)
	if err == nil && ns.cold != nil {
		ns.cold.down[0].Store(false) // the store answers again (a bucket-only namespace sends no window probe)
		ns.cold.down[1].Store(false)
	}
	return err
}

// Fetch loads from the store the current and previous window, at now, of every
// window size, for the keys of the fetch scope. At most one fetch or sync runs
// at a time per namespace; a second caller waits for the first. It does
// nothing in local mode.
func (ns *Namespace) Fetch(ctx context.Context, now time.Time) error {
	if ok, err := ns.usesStore(ctx); !ok {
		return err
	}
	if err := ns.lockSync(ctx); err != nil {
		return err
	}
	defer ns.unlockSync()
	return ns.fetchLocked(ctx, now.UnixMilli())
}

func (ns *Namespace) fetchLocked(ctx context.Context, now int64) error {
	q := strategy.Query{Namespace: ns.name, Sizes: ns.cfg.WindowSizes, Now: now}
	all := ns.cfg.FetchScope == FetchAll
	if !all {
		q.Keys = []string{}
		for _, t := range ns.tables {
			q.Keys = t.Keys(now, q.Keys)
		}
		if len(ns.tables) > 1 {
			slices.Sort(q.Keys)
			q.Keys = slices.Compact(q.Keys)
		}
		if len(q.Keys) == 0 {
			return nil
		}
	}
	cctx, cancel := context.WithTimeout(ctx, ns.cfg.SyncTimeout)
	defer cancel()
	for c, err := range ns.store.GetCounters(cctx, q) {
		if err != nil {
			return fmt.Errorf("%w: fetch: %w", ErrStoreUnavailable, err)
		}
		if i := slices.Index(ns.cfg.WindowSizes, c.Size); i >= 0 {
			ns.tables[i/2].Load(c.Key, i%2, c.Start, c.Count, now, all)
		}
	}
	return nil
}

// through is Increment (write) and SlidingWindow (!write) in synchronous
// mode: one round trip that adds value to key's window i and reads its
// previous window, or reads both windows; then the rate from the views.
func (ns *Namespace) through(ctx context.Context, t *shm.Table, i int, key string, now, value int64, write bool) (float64, error) {
	p := ns.newPush()
	var v shm.View
	if write {
		v = t.AddPending(key, i%2, now, value, &p.parts[i/2])
	} else {
		v = t.PeekReads(key, i%2, now, &p.parts[i/2])
	}
	err := ns.sendThrough(ctx, p)
	d, r := int32(-1), int32(0)
	if write {
		d = 0
	}
	v = p.throughView(t, i/2, i%2, key, v, d, r, err == nil)
	return slidingRate(v.Cur, v.Prev, now, v.Start, ns.sizeMS[i]), err
}

// throughView returns the view a write-through judges after its push p:
// the view of the window its hit counted in (start fb.Start), not of the
// window newest now, which a call at a later instant may have rotated to
// during the push (found by review: a fixed limit of 1 a second admitted a
// second call in a spent second).
//
// When p succeeded (ok) and asked for a count, the count is the store's
// reply plus what this node counts that the reply may lack (see
// shm.Table.ViewAt): the total of p's diff d of table part i (d < 0: none),
// and the read r of the window before it (with no diff, r reads the window
// itself and r+1 the one before). Not the node's view: its total may be
// another push's, older than this one's or learned by an entry made again
// since the count (an eviction during the push), and its local count may
// still subtract a take-back the store applied before this push (both
// found by review). Without a reply, a count is the node's view where it
// learned the store's total, else the larger of the view and fb, the view
// at the count: a window rotated out during the push is never judged on 0.
func (p *push) throughView(t *shm.Table, i, w int, key string, fb shm.View, d, r int32, ok bool) shm.View {
	var reply [2]int64
	var replied [2]bool
	if ok {
		do, ro := p.offsets(i)
		switch {
		case d >= 0:
			reply[0], replied[0] = p.res.Totals[do+int(d)], true
			if r >= 0 {
				reply[1], replied[1] = p.res.Reads[ro+int(r)], true
			}
		case r >= 0:
			reply = [2]int64{p.res.Reads[ro+int(r)], p.res.Reads[ro+int(r)+1]}
			replied = [2]bool{true, true}
		}
	}
	v, learned, beyond := t.ViewAt(key, w, fb.Start)
	for k, n := range [2]*int64{&v.Cur, &v.Prev} {
		switch {
		case replied[k]:
			*n = reply[k] + beyond[k]
		case learned[k]:
		default:
			*n = max(*n, [2]int64{fb.Cur, fb.Prev}[k])
		}
	}
	return v
}

// offsets returns where part i's diffs and reads begin in p's batch.
func (p *push) offsets(i int) (d, r int) {
	for k := range i {
		d, r = d+len(p.parts[k].Diffs), r+len(p.parts[k].Reads)
	}
	return d, r
}

// sendThrough sends a synchronous-mode push. One that carried hits and whose
// outcome is unknown is kept, for the retry loop to re-send before anything
// newer; a read has nothing to re-send.
//
// While write-throughs fail, one at a time goes to the store, as a probe; the
// others are answered from local state at once, their hits left for the
// retry loop to push. So a call waits for a failing store at most as long as
// one probe, the first call after the store is back finds it, and the pushes
// of unknown outcome kept for re-sending stay bounded however long the outage
// (see probeDue).
func (ns *Namespace) sendThrough(ctx context.Context, p *push) error {
	p.assemble(ns.now())
	if ns.throughDown.Load() {
		if !ns.probeDue() {
			ns.release(p)
			return fmt.Errorf("%w: the store is failing; answered from local state", ErrStoreUnavailable)
		}
		defer ns.probing.Store(false)
	}
	err := ns.send(ctx, p)
	if err != nil {
		ns.throughDown.Store(true)
	}
	if err != nil && p.unknown && len(p.batch.Diffs) > 0 {
		ns.keepUnresolved(p)
	}
	return err
}

// maxProbesKept bounds the pushes of unknown outcome that a synchronous-mode
// namespace keeps while its store fails; past it no write-through probes the
// store, and the retry loop, which re-sends them, finds it back.
const maxProbesKept = 16

// probeDue reports whether a write-through may go to a store that has been
// failing, and if so marks it as the probe in flight: one at a time, and none
// while maxProbesKept pushes of unknown outcome wait. Any successful push
// ends the outage (see send).
func (ns *Namespace) probeDue() bool {
	ns.unresMu.Lock()
	kept := len(ns.unresolved)
	ns.unresMu.Unlock()
	return kept < maxProbesKept && ns.probing.CompareAndSwap(false, true)
}

// release settles a push that was never sent: its hits are pushed later,
// with newer ones.
func (ns *Namespace) release(p *push) {
	for i := range p.parts {
		ns.tables[i].Release(&p.parts[i])
	}
	for i := range p.bparts {
		if len(p.bparts[i].Diffs) > 0 {
			ns.bucketTable(i).Release(&p.bparts[i])
		}
	}
}

// loop runs sync cycles until Close: every SyncRate, aligned to SyncRate
// boundaries of the clock so every node fires together (in synchronous mode,
// every RetryInterval, to push what failed to write through). The next tick is
// armed only after a cycle ends, so a slow store never piles cycles up; while
// the store keeps failing, the delay doubles (with jitter) up to MaxBackoff.
func (ns *Namespace) loop() {
	defer close(ns.loopDone)
	interval, reads := ns.cfg.SyncRate, true
	if ns.mode == modeSync {
		interval, reads = ns.cfg.RetryInterval, false
	}
	failures := 0
	for {
		timer := time.NewTimer(ns.delay(interval, failures))
		trigger := ns.trigger
		if failures > 0 {
			trigger = nil // while the store fails, the backoff decides
		}
		early := false
		select {
		case <-ns.done:
			timer.Stop()
			return
		case <-timer.C:
		case <-trigger: // evictions outrun the syncs: push their hits now
			timer.Stop()
			early = true
		}
		if ns.closed.Load() {
			return // Close flushes; no cycle may start after it began
		}
		if err := ns.runCycle(ns.ctx, reads, early); err != nil {
			failures++
			ns.logFailure(failures, err)
		} else {
			if failures > 0 && ns.log != nil {
				ns.log.Info("ratelimit: sync recovered", "namespace", ns.name, "failed_cycles", failures)
			}
			failures = 0
		}
	}
}

// delay returns how long to wait before the next cycle: the next boundary of
// interval, or while the store keeps failing, interval doubled per failure up
// to MaxBackoff (never less than interval), with jitter.
func (ns *Namespace) delay(interval time.Duration, failures int) time.Duration {
	if failures > 0 {
		return backoff(interval, ns.cfg.MaxBackoff, failures)
	}
	d := interval - time.Duration(ns.cfg.Clock().UnixNano()%int64(interval))
	if d <= 0 {
		d = interval
	}
	return d
}

// backoff doubles interval per failure, saturating at max (or at interval,
// if that is larger), and draws a jittered delay in [b/2, b] so that nodes do
// not retry in step. It never overflows, whatever the durations.
func backoff(interval, limit time.Duration, failures int) time.Duration {
	limit = max(limit, interval)
	b := interval
	for i := 0; i < failures && b < limit; i++ {
		if b > limit/2 {
			b = limit
			break
		}
		b *= 2
	}
	return b/2 + rand.N(b/2+1)
}

// logFailure logs the first failing cycle of an outage and then every 10th, so
// an outage does not flood the log.
func (ns *Namespace) logFailure(failures int, err error) {
	if ns.log != nil && (failures == 1 || failures%10 == 0) {
		ns.log.Warn("ratelimit: sync failed", "namespace", ns.name, "consecutive_failures", failures, "error", err)
	}
}

// flush pushes everything before Close returns, retrying until ctx is done
// (or three attempts, when ctx has no deadline).
func (ns *Namespace) flush(ctx context.Context) error {
	if err := ns.lockSync(ctx); err != nil {
		return err
	}
	defer ns.unlockSync()
	_, hasDeadline := ctx.Deadline()
	for attempt := 1; ; attempt++ {
		err := ns.syncOnce(ctx, false)
		if err == nil {
			return nil // every unresolved push settled and every hit pushed
		}
		if ctx.Err() != nil || (!hasDeadline && attempt >= 3) {
			return err
		}
		timer := time.NewTimer(ns.delay(50*time.Millisecond, attempt))
		select {
		case <-ctx.Done():
			timer.Stop()
			return err
		case <-timer.C:
		}
	}
}

func (ns *Namespace) pendingHits() (hits int64, retired int) {
	if ns.mode == modeLocal {
		return 0, 0 // no store to confirm anything
	}
	for _, t := range ns.tables {
		h, r := t.Pending()
		hits, retired = hits+h, retired+r
	}
	for _, b := range ns.bucketTables() {
		hits += b.t.Pending()
	}
	_, cost := ns.pendingTakes()
	return hits + cost, retired
}
