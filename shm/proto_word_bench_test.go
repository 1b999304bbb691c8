package shm

import (
	"hash/maphash"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"
)

// This file measures, for benchmarks only, what the entry's lock costs a
// judged two-window count on one hot key, against the design that would
// replace it (docs/hotpath.md): each window slot's local count in one
// 64-bit word beside the window's number, so that an addition or a
// take-back can tell which window it landed in without holding the lock.
// Every variant finds the key through the table, as addWindowsFast does;
// the prototypes then count in words of their own (protoWords), which
// nothing else in the table reads or rotates. They are not the table's
// code: a real miss (a rotation racing the call) would move the hit under
// the entry's lock, where these only report it.
//
//	go test -run '^$' -bench BenchmarkProtoJudgedHot ./shm

// protoWords is a key's window-tagged slots: per window size, two words
// (window number mod 2^32 in the high half, local count + protoBias in the
// low half) and two synced counts.
type protoWords struct {
	word   [2][2]atomic.Uint64
	synced [2][2]atomic.Int32
	// For the adaptive variant: set by a failed swap, after which calls
	// take mu around the same counting (a real design would clear it when
	// the window rotates).
	contended atomic.Bool
	mu        sync.Mutex
}

const protoBias = 1 << 31

func protoWord(q int64, local int64) uint64 {
	return uint64(uint32(q))<<32 | uint64(local+protoBias)
}

func protoLocal(w uint64) int64 { return int64(uint32(w)) - protoBias }

// protoFind finds key's entry as addWindowsFast does, or nil when a
// lock-free call could not use it.
func (t *Table) protoFind(key string) *entry {
	h := maphash.String(t.seed, key)
	e := t.shardOf(h).find(key, h)
	if e == nil || e.flags.Load()&(flagDead|flagBornSealed|flagUnread) != 0 {
		return nil
	}
	return e
}

// prevView returns the view of window q in slot i of size w, as
// nslot.view reads one (the local count twice), or 0 when the slot holds
// another window.
func (pw *protoWords) prevView(w, i int, q int64) int64 {
	word := &pw.word[w][i]
	prev := word.Load()
	if uint32(prev>>32) != uint32(q) {
		return 0
	}
	return known32(pw.synced[w][i].Load()) + max(protoLocal(prev), protoLocal(word.Load()))
}

// judgedCAS is the prototype's judged count: for each window size, the
// slot of now's window must hold it (else false: the locked path would
// rotate); v is added by compare-and-swap, the views judged, and a
// rejected count taken back by compare-and-swap on the same window.
func (t *Table) judgedCAS(pw *protoWords, key string, now int64, v int64, judge func([2]View) bool) (out [2]View, ok, done bool) {
	e := t.protoFind(key)
	if e == nil {
		return out, false, false
	}
	var qs [2]int64
	for w := range t.n {
		x, par := t.windowOf(w, now)
		q := x / t.sizeMS[w]
		word := &pw.word[w][par]
		for {
			old := word.Load()
			if uint32(old>>32) != uint32(q) {
				return out, false, false // (a real miss would take back what it added)
			}
			if word.CompareAndSwap(old, old+uint64(v)) {
				out[w].Start, qs[w] = x, q
				out[w].Cur = known32(pw.synced[w][par].Load()) + protoLocal(old) + v
				break
			}
			if !pw.contended.Load() {
				pw.contended.Store(true)
			}
		}
		out[w].Prev = pw.prevView(w, par^1, q-1)
	}
	e.markUsed()
	if ok = judge(out); !ok {
		for w := range t.n {
			word := &pw.word[w][int(qs[w]&1)]
			for {
				old := word.Load()
				if uint32(old>>32) != uint32(qs[w]) {
					break // moved: the locked path would take back from the record
				}
				if word.CompareAndSwap(old, old-uint64(v)) {
					break
				}
			}
		}
	}
	return out, ok, true
}

// judgedAdaptive is judgedCAS until a swap fails (another core counts on
// the key at the same time); from then on it does the same counting under
// a mutex, so that contending cores take turns on the key's line instead
// of moving it back and forth for every load and swap.
func (t *Table) judgedAdaptive(pw *protoWords, key string, now int64, v int64, judge func([2]View) bool) (out [2]View, ok, done bool) {
	if pw.contended.Load() {
		pw.mu.Lock()
		out, ok, done = t.judgedCAS(pw, key, now, v, judge)
		pw.mu.Unlock()
		return out, ok, done
	}
	return t.judgedCAS(pw, key, now, v, judge)
}

// judgedXadd is judgedCAS with additions instead of swaps: the addition
// returns the word, whose window number tells where the hit landed (the
// count's bias keeps it off the high half). A mismatch, which only a
// rotation racing the call makes, would take the entry's lock and move the
// hit to where it belongs.
func (t *Table) judgedXadd(pw *protoWords, key string, now int64, v int64, judge func([2]View) bool) (out [2]View, ok, done bool) {
	e := t.protoFind(key)
	if e == nil {
		return out, false, false
	}
	var qs [2]int64
	for w := range t.n {
		x, par := t.windowOf(w, now)
		q := x / t.sizeMS[w]
		word := &pw.word[w][par]
		n := word.Add(uint64(v))
		if uint32(n>>32) != uint32(q) {
			return out, false, false // (a real miss would move the hit under the lock)
		}
		out[w].Start, qs[w] = x, q
		out[w].Cur = known32(pw.synced[w][par].Load()) + protoLocal(n)
		out[w].Prev = pw.prevView(w, par^1, q-1)
	}
	e.markUsed()
	if ok = judge(out); !ok {
		for w := range t.n {
			pw.word[w][int(qs[w]&1)].Add(-uint64(v))
		}
	}
	return out, ok, true
}

// BenchmarkProtoJudgedHot compares a judged two-window count on one hot key
// under the entry's lock (the table's addWindowsFast) with the
// compare-and-swap prototype, both admitting every request.
func BenchmarkProtoJudgedHot(b *testing.B) {
	tb, err := New(Options{Sizes: []time.Duration{time.Second, time.Minute}, Track: true})
	if err != nil {
		b.Fatal(err)
	}
	const now = 1_000_500
	tb.AddWindowsOpen("k", now, 3, [2]int64{1, 1}, false, false, false, nil)
	// The words on one cache line, and straddling two lines, as an entry's
	// do in 3 of 4 allocations of its size class (80 bytes).
	block := make([]uint64, 32) // 256 bytes: a size class aligned to 256
	layouts := map[string]*protoWords{
		"line":     (*protoWords)(unsafe.Pointer(&block[0])),
		"straddle": (*protoWords)(unsafe.Pointer(&block[16+5])), // 40 bytes into a line
	}
	for _, pw := range layouts {
		protoInit(tb, pw, now)
	}
	judge := func(v [2]View) bool { return v[0].Cur+v[0].Prev <= 1<<40 && v[1].Cur+v[1].Prev <= 1<<40 }
	for _, par := range []bool{false, true} {
		run := "serial"
		if par {
			run = "parallel"
		}
		b.Run("lock/"+run, func(b *testing.B) {
			protoRun(b, par, func() bool {
				_, ok, done := tb.addWindowsFast("k", now, 3, [2]int64{1, 1}, false, true, judge)
				return ok && done
			})
		})
		for _, layout := range []string{"line", "straddle"} {
			pw := layouts[layout]
			for _, variant := range []struct {
				name string
				fn   func(*protoWords, string, int64, int64, func([2]View) bool) ([2]View, bool, bool)
			}{{"cas", tb.judgedCAS}, {"xadd", tb.judgedXadd}, {"adaptive", tb.judgedAdaptive}} {
				b.Run(variant.name+"-"+layout+"/"+run, func(b *testing.B) {
					pw.contended.Store(false)
					protoRun(b, par, func() bool {
						_, ok, done := variant.fn(pw, "k", now, 1, judge)
						return ok && done
					})
				})
			}
		}
	}
}

// protoInit opens now's windows in pw, as tb's entry for "k" holds them.
func protoInit(tb *Table, pw *protoWords, now int64) {
	for w := range 2 {
		x, par := tb.windowOf(w, now)
		q := x / tb.sizeMS[w]
		pw.word[w][par].Store(protoWord(q, 1))
		pw.word[w][par^1].Store(protoWord(q-1, 0))
		pw.synced[w][par].Store(unknown32)
		pw.synced[w][par^1].Store(unknown32)
	}
}

func protoRun(b *testing.B, parallel bool, op func() bool) {
	b.ReportAllocs()
	if !parallel {
		for b.Loop() {
			if !op() {
				b.Fatal("not admitted")
			}
		}
		return
	}
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if !op() {
				b.Error("not admitted")
				return
			}
		}
	})
}
