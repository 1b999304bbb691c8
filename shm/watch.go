package shm

import (
	"github.com/ratesync/ratelimit/strategy"
)

// With Options.Watch, a periodic sync learns what other nodes changed from
// the store's change logs (strategy.Watch) instead of reading every key it
// holds each cycle: a cycle then costs what changed, not what the node holds.
//
//   - Collect visits only the entries used since the last Collect (their
//     hits to push), and reads a window of theirs only while this node has
//     never learned its total (a key new here, a window it just rotated to);
//   - Watches lists, per window size, the current window, the previous one
//     until it has settled, and the next one near the current one's end (the
//     read-ahead that follows nodes whose clocks are ahead), each with the
//     cursor the store answered last;
//   - LoadChanges applies an answer: the totals of the counters changed since
//     the cursor, for the keys this node holds. When the store cannot list
//     the changes (too many, or it lost the window's log), the next Collect
//     reads every key held in that window instead: a full read, the old
//     protocol, once.

// wkey names one window of one size index.
type wkey struct {
	w     uint8
	start int64
}

// Watches appends to dst the windows this table watches at now, with their
// cursors, and forgets the cursors of windows it no longer watches. One
// caller at a time (the sync loop).
func (t *Table) Watches(now int64, dst []strategy.Watch) []strategy.Watch {
	if !t.watch {
		return dst
	}
	t.cycle = (t.cycle + 1) & (1<<(32-cycleShift) - 1) // a new cycle: see markDiff
	if t.cycle == 0 {
		// The cycle numbers start over: no entry may keep a mark of a
		// cycle numbered as one to come (an idle key held 2^19 cycles
		// would have its full read skipped).
		t.clearMarks()
	}
	// After a cycle whose watches overflowed (high churn), this pass (which
	// Watches begins) reads every watched window in full, as the protocol
	// before change logs did, and the watches go along to tell when churn
	// has fallen: a cycle then costs what it did before, not a pass for the
	// diffs and another for the reads.
	churn := t.overflowed
	t.overflowed = false
	// Past half the keys held, listing the changes costs about what reading
	// every key does (and more when most of them are this node's own diffs,
	// whose totals come back anyway): the store answers an overflow, and the
	// next pass reads the window in full. High churn falls back to the old
	// protocol by itself.
	limit := max(t.Len()/2, 256)
	keep := make(map[wkey]string, 3*t.n)
	for w := range t.n {
		size := t.sizeMS[w]
		cur := windowStart(now, size)
		starts := [3]int64{cur, noWindow, noWindow}
		if t.settle == 0 || now-cur < t.settle {
			starts[1] = cur - size
		}
		if t.readAhead > 0 && now >= cur+size-t.readAhead {
			starts[2] = cur + size
		}
		for _, x := range starts {
			if x == noWindow {
				continue
			}
			k := wkey{uint8(w), x}
			keep[k] = t.cursors[k]
			if churn {
				if t.passFull == nil {
					t.passFull = make(map[wkey]bool)
				}
				t.passFull[k], t.passWalk = true, true
			}
			dst = append(dst, strategy.Watch{Size: t.sizes[w], Start: x, Cursor: t.cursors[k], Limit: limit})
		}
	}
	t.cursors = keep
	return dst
}

// LoadChanges applies ch, the store's answer to w (one of the table's
// Watches), at now: each changed counter's total becomes the synced count of
// the key's window if this node holds it. After an overflow, the next
// Collect reads every key held in the window.
func (t *Table) LoadChanges(w strategy.Watch, ch strategy.Changes, now int64) {
	wi := -1
	for i := range t.n {
		if t.sizes[i] == w.Size {
			wi = i
		}
	}
	if wi < 0 {
		return
	}
	k := wkey{uint8(wi), w.Start}
	if _, watched := t.cursors[k]; watched {
		t.cursors[k] = ch.Cursor
	}
	if ch.Overflow {
		t.skipped.Add(1) // a full read skips keys not held yet
		t.overflowed = true
		if !t.passFull[k] { // this pass does not read the window in full already
			t.fullRead[k] = true
		}
		return
	}
	skipped := false
	defer func() {
		if skipped {
			t.skipped.Add(1)
		}
	}()
	for _, c := range ch.Counters {
		s, e := t.lookup(c.Key)
		if e == nil {
			skipped = true
			continue
		}
		ref := counterRef{e: e, w: uint8(wi), start: w.Start}
		t.lockEntry(e)
		t.setSynced(&ref, c.Count)
		e.unlockEntry()
		s.mu.RUnlock()
	}
}

// FullReads returns how many windows wait for a full read.
func (t *Table) FullReads() int { return len(t.fullRead) + len(t.passFull) }

// startPass begins a Collect pass: the windows due for a full read are read
// in this pass, which then walks every entry. A pass cut short by an error
// gives them back (see Rewind).
func (t *Table) startPass() {
	if !t.watch {
		return
	}
	for k := range t.passFull {
		t.fullRead[k] = true
	}
	t.passFull, t.fullRead = t.fullRead, make(map[wkey]bool)
	t.passWalk = len(t.passFull) > 0
}

// fullReading reports whether this pass reads the window of size index w
// starting at x for every key held.
func (t *Table) fullReading(w int, x int64) bool {
	return t.passFull[wkey{uint8(w), x}]
}

// PassDone records that the pushes of the pass the last Rewind began all
// succeeded: its full reads are done. One caller at a time (the sync loop).
func (t *Table) PassDone() {
	t.passFull, t.passWalk = nil, false
}
