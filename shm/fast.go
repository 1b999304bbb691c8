package shm

import "hash/maphash"

// testHookFast, when set (by tests), runs in addOpenFast just before the
// addition.
var testHookFast func()

// testHeldOnly, set by tests, sends every judged count under the entry's
// gate (judgedHeld), as before judged counts could pend.
var testHeldOnly bool

// AddOpen is AddWindowsOpen for one window size (index w) and a caller that
// only counts (no judge): it adds v to key's window at now and returns the
// view after it. A key held, in a window already open, is counted without
// the shard's lock (see addOpenFast); anything else (a new key, a new
// window, a value over maxFast, a wide entry) takes AddWindowsOpen's path. held and open are
// AddWindowsOpen's.
func (t *Table) AddOpen(key string, w int, now, v int64, ifHeld, sealable bool) (vw View, held, open bool) {
	if !sealable || !t.sealed.Load() {
		if vw, ok := t.addOpenFast(key, w, now, v); ok {
			return vw, true, true
		}
	}
	out, _, held, open := t.AddWindowsOpen(key, now, 1<<w, [2]int64{v, v}, false, ifHeld, sealable, nil)
	return out[w], held, open
}

// addOpenFast counts v in key's window of size index w at now without
// locking the shard, and reports false (having counted nothing) when it
// cannot: the key is not found, its entry is dead or was created after
// Seal, now is in a window the entry has not opened yet (rotating needs
// the entry's lock), |v| > maxFast, or the entry is wide (its narrow
// counts are poison, so the locked path counts for it). An addition that
// takes a narrow count past its range widens the entry itself.
//
// Without the shard's lock, the entry may leave the table (evicted,
// expired, or taken by Seal) while the addition is made. retireAll swaps
// each local count for poison under the entry's lock, the newest window
// first, so the addition's result tells which came first: a result near
// poison means the hit is not in the retired record, and it is taken back
// and counted through the locked path, on the key's new entry (or refused,
// sealed); any other result means the swap came after and carried the hit
// into the record, which the next Collect pushes. Either way the hit is
// counted once.
//
// The window before is read before the addition, so that it is read before
// the swaps too. Only if a rotation and a retirement both came between the
// two does it read poison: the hit was counted, in an entry that is gone,
// and the view reports the window before as empty.
func (t *Table) addOpenFast(key string, w int, now, v int64) (View, bool) {
	if v > maxFast || v < -maxFast {
		return View{}, false
	}
	s, e, x, par, ok := t.findFast(key, w, now)
	if !ok {
		return View{}, false
	}
	prev, cur := &e.w[w].slot[par^1], &e.w[w].slot[par]
	pl := prev.local.Load()
	pv := prev.viewFrom(pl)
	if testHookFast != nil {
		testHookFast()
	}
	n := cur.local.Add(int32(v))
	if poisoned(n) {
		cur.local.Add(-int32(v))
		return View{}, false
	}
	// A judged count pending in the gate (see gate.go) is in this window:
	// read before local's second load (see pendingView).
	pend := e.pendingView(w)
	if testHookView != nil {
		testHookView() // between the view's two loads (see nslot.view)
	}
	// Poison, retired since the addition, is never the larger local.
	vw := View{Start: x, Cur: cur.viewFrom(n) + pend}
	if !poisoned(pl) {
		vw.Prev = pv
	}
	if !fitsNarrow(int64(n)) {
		// The hit is counted, past the narrow range. It is not taken back:
		// a swap for poison (widen, retireAll) landing before the take-back
		// would already carry it, and the locked path would count it twice
		// (found by review). The entry widens under its lock instead; a
		// swap that came first carried the hit with it.
		t.lockEntry(e)
		if e.flags.Load()&flagDead == 0 {
			t.widen(e)
		}
		e.unlockEntry()
	}
	t.use(s, e)
	return vw, true
}

// findFast finds key's entry without the shard's lock, with its shard and
// the window of size index w that a call at now counts in: its start x and
// slot index par. It reports false when a lock-free call cannot use it: the
// key is not found, the entry is dead, was created after Seal or is unread
// (the locked path tells a cold read it is not held), or now is
// in a window the entry has not opened (rotating needs its lock). The
// results are separate values, not a struct: Go returns them in registers.
func (t *Table) findFast(key string, w int, now int64) (s *shard, e *entry, x int64, par int, ok bool) {
	h := maphash.String(t.seed, key)
	s = t.shardOf(h)
	e = s.find(key, h)
	if e == nil || e.flags.Load()&(flagDead|flagBornSealed|flagUnread) != 0 {
		return nil, nil, 0, 0, false
	}
	lat := e.w[w].latest.Load()
	x, par = t.windowOf(w, now)
	if lat == noWindow || x > lat {
		return nil, nil, 0, 0, false
	}
	if x < lat { // the clock went back: count in the newest window (see window)
		x, par = lat, parity(lat, t.sizeMS[w])
	}
	return s, e, x, par, true
}

// known returns a wide synced count, 0 while unknown.
func known(sy int64) int64 {
	if sy == unknown {
		return 0
	}
	return sy
}

// addWindowsFast is AddWindowsOpen for a key the table holds, without the
// shard's lock. It reports false (having done nothing) when it cannot: the
// key is not found, the entry is dead, was created after Seal or is unread,
// or the table is sealed and the caller sealable; the locked path then
// decides.
//
// A judged call that counts a narrow value in windows already open counts
// without the entry's gate (below); anything else, or a call that meets
// another's change too often, goes under it (judgedHeld).
func (t *Table) addWindowsFast(key string, now int64, mask uint8, v [2]int64, peek, sealable bool, judge func([2]View) bool) (out [2]View, ok, done bool) {
	if sealable && t.sealed.Load() {
		return out, false, false
	}
	h := maphash.String(t.seed, key)
	s := t.shardOf(h)
	e := s.find(key, h)
	if e == nil || e.flags.Load()&(flagDead|flagBornSealed|flagUnread) != 0 {
		return out, false, false
	}
	if !peek && judge != nil && !testHeldOnly {
		// The count without the gate (see gate.go). It reads the gate,
		// then the views of the windows now falls in, judges them with v
		// added and, if they admit it, adds v to the gate's pending counts
		// with one compare-and-swap. It needs the gate instead when a
		// holder has it, the entry is wide, or a pending count would
		// leave its range; a window that must open takes the locked
		// path. (In this function, not a call: returned through one
		// more frame, the views cost a hot Allow a tenth, measured.)
	pending:
		for range 4 {
			g := e.gate.Load()
			if g&gateLocked != 0 {
				break
			}
			// The flags after the gate: a retirement marks the entry
			// dead under it.
			if f := e.flags.Load(); f&flagDead != 0 {
				return out, false, false
			} else if f&flagWide != 0 {
				break
			}
			ng := g
			for w := range t.n {
				if mask&(1<<w) == 0 {
					continue
				}
				x, par, cached := t.lastWindow(w, now) // (windowOf does not inline)
				if !cached {
					x, par = t.newWindow(w, now)
				}
				p := &e.w[w]
				if lat := p.latest.Load(); x > lat {
					// Rotating needs the shard's lock (see judgedHeld),
					// and the newest window never moves back.
					return [2]View{}, false, false
				} else if x < lat { // the clock went back: the newest window (see window)
					x, par = lat, parity(lat, t.sizeMS[w])
				}
				pend := pendingOf(g, w)
				if v[w] < 0 || v[w] > gateHalfMax-pend {
					break pending
				}
				out[w].Start = x
				out[w].Prev = p.slot[par^1].viewStill()
				out[w].Cur = p.slot[par].viewStill() + pend + v[w]
				ng += uint64(v[w]) << (gateHalf * uint(w&1))
			}
			if testHookView != nil {
				testHookView() // after the views, before the judgement
			}
			if ok = judge(out); ok {
				if !e.gate.CompareAndSwap(g, ng) {
					continue // another call came between: judge again
				}
			} else if e.gate.Load() != g {
				continue // the views read may not hold: judge again
			} else { // rejected: nothing counted
				for w := range t.n {
					if mask&(1<<w) != 0 {
						out[w].Cur -= v[w]
					}
				}
			}
			t.use(s, e)
			return out, ok, true
		}
	}
	return t.judgedHeld(s, e, now, mask, v, peek, judge)
}

// judgedHeld is addWindowsFast under e's gate, which every retirement
// (eviction, expiry, Seal) and every rotation takes too. Holding it, a live
// entry stays live and no window rotates: the windows found, the counts, the
// views judged and a rejected call's take-back are one step.
//
// The shard's read lock, which this saves, was two atomic additions on a
// shared line per call (a third of a hot two-limit Allow, measured).
func (t *Table) judgedHeld(s *shard, e *entry, now int64, mask uint8, v [2]int64, peek bool, judge func([2]View) bool) (out [2]View, ok, done bool) {
	t.lockEntry(e)
	if e.flags.Load()&flagDead != 0 {
		e.unlockEntry()
		return out, false, false
	}
	// A call that would rotate the entry takes the locked path: dropExpired
	// and makeRoom judge an entry expired without its lock, under the
	// shard's write lock, which only the shard's read lock excludes.
	// Rotated here, an entry found expired there would leave the table
	// with the hit just counted (the next call then starts from 0).
	var pars [2]int
	for w := range t.n {
		if mask&(1<<w) == 0 {
			continue
		}
		x, par := t.windowOf(w, now)
		if lat := e.w[w].latest.Load(); x > lat {
			e.unlockEntry()
			return out, false, false
		} else if x < lat { // the clock went back: the newest window (see window)
			x, par = lat, parity(lat, t.sizeMS[w])
		}
		out[w].Start, pars[w] = x, par
	}
	e.markUsed()
	// Count and read the views here rather than through countJudged: with
	// the windows found above and the entry's lock held, the window counted
	// in is the newest and the one before it sits in the other slot, so
	// neither needs finding again (12% of a hot Allow, measured).
	narrow := e.flags.Load()&flagWide == 0 && fitsNarrow(v[0]) && fitsNarrow(v[1])
	for w := range t.n {
		if mask&(1<<w) == 0 {
			continue
		}
		par := pars[w]
		if !narrow {
			// A wide entry, or a large value: the general counting.
			if !peek {
				t.addLocal(e, w, par, v[w])
			}
			out[w].Cur, out[w].Prev = t.viewsAt(e, w, out[w].Start, par)
			continue
		}
		p := &e.w[w]
		out[w].Prev = p.slot[par^1].view()
		if peek {
			out[w].Cur = p.slot[par].view()
		} else if c, ok := p.slot[par].addView(v[w]); ok {
			out[w].Cur = c
		} else {
			out[w].Cur = t.addLocal(e, w, par, v[w]).view() // widens e
			narrow = false
		}
	}
	ok = judge == nil || judge(out)
	if !ok && !peek {
		out = t.takeBackViews(e, now, mask, [2]int64{out[0].Start, out[1].Start}, v)
	}
	e.unlockEntry()
	t.touch(s, e)
	return out, ok, true
}

// countJudged is the body of AddWindowsOpen on e, whose lock the caller
// holds: it counts v (none with peek) and judges the views; when judge
// rejects a count, it takes v back (takeBackViews). A nil judge admits.
func (t *Table) countJudged(e *entry, now int64, mask uint8, v [2]int64, peek bool, judge func([2]View) bool) (out [2]View, ok bool) {
	out = t.addWindowsLocked(e, now, mask, v, peek)
	ok = judge == nil || judge(out)
	if !ok && !peek {
		out = t.takeBackViews(e, now, mask, [2]int64{out[0].Start, out[1].Start}, v)
	}
	return out, ok
}

// takeBackViews takes a rejected count of v back from the windows it was
// counted in (their starts) on e, whose lock the caller holds, and returns
// the views after.
func (t *Table) takeBackViews(e *entry, now int64, mask uint8, starts, v [2]int64) [2]View {
	t.takeBackLocked(e, mask, starts, v)
	return t.addWindowsLocked(e, now, mask, [2]int64{}, true)
}
