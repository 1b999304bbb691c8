package shm

import "runtime"

// An entry's gate is its lock and its pending judged counts in one word:
//
//	locked:1 | generation:31 | pending count of size 1:16 | of size 0:16
//
// Every locked operation on an entry (rotation, sync, retirement, widening,
// the locked counting paths) holds the gate: it sets the locked bit with a
// compare-and-swap that also moves the generation on, and first of all folds
// the pending counts into the local counts of the windows they belong to (the
// newest of each size, which only a holder of the gate moves). Under the gate
// an entry's counts are what they were under a mutex, so the code that holds
// it never sees a pending count.
//
// A judged count on a hot key (addWindowsFast) does not take the gate. It
// loads the gate, reads the views (each newest window's view plus its pending
// count), judges them with its cost added and, when they admit it, adds the
// cost to the pending counts with one compare-and-swap of the loaded gate: one
// locked instruction where a locked count took four (the lock, its release
// and one addition per window). The swap succeeds only if nothing came
// between: no other judged count (which changes the pending counts) and no
// holder of the gate (which moves the generation, and holds the locked bit
// while it works). So the views judged are the counts the cost is added to,
// but for lock-free additions (Increment), which may come between and are
// counted anyway, as they may come just after a locked count. A rejected call
// counts nothing and takes nothing back; it checks only that the gate did not
// move while it read. A retirement (eviction, expiry, Seal) holds the gate,
// so it carries every pending count that came before it into its record, and
// a count that comes after it fails its swap and finds the entry dead.
const (
	gateLocked   uint64 = 1 << 63
	gateGenShift        = 32
	gateGenMask  uint64 = (1<<31 - 1) << gateGenShift
	gateHalf            = 16        // bits of one size's pending count
	gateHalfMax  int64  = 1<<16 - 1 // a pending count never exceeds it
	gatePending  uint64 = 1<<32 - 1 // both pending counts
)

// pendingOf returns the pending count of size index w in gate word g.
func pendingOf(g uint64, w int) int64 {
	return int64(g >> (gateHalf * uint(w&1)) & uint64(gateHalfMax))
}

// nextGen returns g with its generation moved on (wrapping), the rest kept.
func nextGen(g uint64) uint64 {
	return g&^gateGenMask | (g+1<<gateGenShift)&gateGenMask
}

// lockEntry takes e's gate: it waits for any other holder to release it, then
// folds e's pending counts into its newest windows (see tryLockEntry). A
// holder works briefly (at most it waits for the table's retired-record or
// pending-push lock, which no holder of a gate waits for in turn), so a
// waiter spins and yields instead of sleeping.
func (t *Table) lockEntry(e *entry) {
	for spins := 0; !t.tryLockEntry(e); spins++ {
		if spins >= 8 {
			runtime.Gosched()
		}
	}
}

// foldPending adds the pending counts of gate word g, which e's gate held
// when the caller took it, to the local counts of e's newest windows, and
// clears them. The caller holds e's gate.
func (t *Table) foldPending(e *entry, g uint64) {
	for w := range t.n {
		if d := pendingOf(g, w); d != 0 {
			lat := e.w[w].latest.Load() // (a pending count is in a held window)
			t.addLocal(e, w, parity(lat, t.sizeMS[w]), d)
		}
	}
	e.gate.Store(nextGen(g)&^gatePending | gateLocked)
}

// unlockEntry releases e's gate, which the caller holds.
func (e *entry) unlockEntry() {
	e.gate.And(^gateLocked)
}

// pendingView returns the pending count of e's newest window of size index
// w, for a reader without the gate. A holder folds a pending count into
// local before it clears it from the gate, so a reader that loads the gate
// before it loads local counts a pending count at least once (twice while
// a fold is under way, never zero times), locked or not.
func (e *entry) pendingView(w int) int64 {
	return pendingOf(e.gate.Load(), w)
}

// tryLockEntry takes e's gate if no one holds it, and reports whether it
// did: one compare-and-swap sets the locked bit and moves the generation on,
// then the pending counts are folded.
func (t *Table) tryLockEntry(e *entry) bool {
	g := e.gate.Load()
	if g&gateLocked != 0 || !e.gate.CompareAndSwap(g, nextGen(g)|gateLocked) {
		return false
	}
	if g&gatePending != 0 {
		t.foldPending(e, g)
	}
	return true
}
