// Package memory is an in-process strategy.Strategy. One Store shared by several
// registries in one process behaves as one central store: this is how tests and
// demos simulate a cluster without servers. It can inject faults (refused
// requests, lost requests, lost replies) so callers can prove they neither lose
// nor double-count hits.
package memory

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ratesync/ratelimit/strategy"
)

// Op names a store operation, for fault injection.
type Op int

// The operations a fault can target.
const (
	OpPush Op = iota
	OpGetCounters
	OpGetWindow
	OpPurge
)

// Fault is what an injected fault does to one operation.
type Fault int

const (
	// NoFault lets the operation run.
	NoFault Fault = iota
	// Refuse fails the operation before it touches the data, with an error
	// that matches strategy.ErrNotApplied.
	Refuse
	// LoseRequest fails the operation before it touches the data, but reports
	// an unknown outcome (as a timeout would).
	LoseRequest
	// LoseReply applies the operation and then reports an unknown outcome (as
	// a connection dropped after the store answered would).
	LoseReply
)

// ErrInjected is the error an injected fault returns.
var ErrInjected = errors.New("memory: injected fault")

// window names a window of one size; a namespace maps windows to their counters.
type window struct {
	size  time.Duration
	start int64
}

type windows map[window]map[string]int64

// Store is an in-process central store. The zero value is not usable; call New.
type Store struct {
	mu sync.Mutex
	// counters[namespace][window][key] is a counter's total. Nesting keeps a
	// push to hashing each key once, and lets Purge drop whole windows.
	counters map[string]windows
	// applied maps a batch ID to the end of the latest window it touched, so
	// Purge can forget IDs whose windows are gone.
	applied map[string]int64

	faults atomic.Pointer[func(Op) Fault]
	pushes atomic.Int64
}

// New returns an empty Store, safe for concurrent use.
func New() *Store {
	return &Store{counters: make(map[string]windows), applied: make(map[string]int64)}
}

var _ strategy.Strategy = (*Store)(nil)

// SetFaults installs f, called before every operation to decide its fault; nil
// removes it. f must be safe for concurrent use.
func (s *Store) SetFaults(f func(Op) Fault) {
	if f == nil {
		s.faults.Store(nil)
		return
	}
	s.faults.Store(&f)
}

// Pushes returns how many PushDiffs calls reached the store (including faulty ones).
func (s *Store) Pushes() int64 { return s.pushes.Load() }

func (s *Store) fault(op Op) Fault {
	if f := s.faults.Load(); f != nil {
		return (*f)(op)
	}
	return NoFault
}

func faultError(f Fault, op string) error {
	if f == Refuse {
		return fmt.Errorf("memory: %s: %w: %w", op, ErrInjected, strategy.ErrNotApplied)
	}
	return fmt.Errorf("memory: %s: %w: outcome unknown", op, ErrInjected)
}

// PushDiffs applies b's diffs once per batch ID and reads b's counters.
func (s *Store) PushDiffs(ctx context.Context, b *strategy.Batch) (strategy.Result, error) {
	s.pushes.Add(1)
	if err := ctx.Err(); err != nil {
		return strategy.Result{}, fmt.Errorf("memory: push: %w: %w", err, strategy.ErrNotApplied)
	}
	f := s.fault(OpPush)
	if f == Refuse || f == LoseRequest {
		return strategy.Result{}, faultError(f, "push")
	}
	res := strategy.Result{Totals: make([]int64, len(b.Diffs)), Reads: make([]int64, len(b.Reads))}
	s.mu.Lock()
	_, seen := s.applied[b.ID]
	ws := s.counters[b.Namespace]
	if ws == nil {
		ws = make(windows)
		s.counters[b.Namespace] = ws
	}
	var end int64
	var last window
	var keys map[string]int64
	for i, d := range b.Diffs {
		if w := (window{d.Size, d.Start}); keys == nil || w != last {
			last, keys = w, ws[w]
			if keys == nil {
				keys = make(map[string]int64)
				ws[w] = keys
			}
		}
		n := keys[d.Key]
		if !seen {
			n += d.Delta
			keys[d.Key] = n
		}
		res.Totals[i] = n
		end = max(end, d.Start+2*d.Size.Milliseconds())
	}
	if !seen && b.ID != "" {
		s.applied[b.ID] = end
	}
	for i, id := range b.Reads {
		res.Reads[i] = ws[window{id.Size, id.Start}][id.Key]
	}
	s.mu.Unlock()
	if f == LoseReply {
		return strategy.Result{}, faultError(f, "push")
	}
	return res, nil
}

// GetCounters returns the current and previous windows of q's sizes at q.Now.
func (s *Store) GetCounters(ctx context.Context, q strategy.Query) iter.Seq2[strategy.Counter, error] {
	return func(yield func(strategy.Counter, error) bool) {
		if err := ctx.Err(); err != nil {
			yield(strategy.Counter{}, fmt.Errorf("memory: get counters: %w", err))
			return
		}
		if f := s.fault(OpGetCounters); f != NoFault {
			yield(strategy.Counter{}, faultError(f, "get counters"))
			return
		}
		var out []strategy.Counter
		s.mu.Lock()
		ws := s.counters[q.Namespace]
		for _, size := range q.Sizes {
			cur := strategy.WindowStart(q.Now, size)
			for _, start := range [2]int64{cur, cur - size.Milliseconds()} {
				keys := ws[window{size, start}]
				add := func(key string, n int64) {
					out = append(out, strategy.Counter{CounterID: strategy.CounterID{Key: key, Size: size, Start: start}, Count: n})
				}
				if q.Keys == nil {
					for key, n := range keys {
						add(key, n)
					}
					continue
				}
				for _, key := range q.Keys {
					if n, ok := keys[key]; ok {
						add(key, n)
					}
				}
			}
		}
		s.mu.Unlock()
		for _, c := range out {
			if !yield(c, nil) {
				return
			}
		}
	}
}

// GetWindow returns one counter's total.
func (s *Store) GetWindow(ctx context.Context, namespace string, id strategy.CounterID) (int64, error) {
	if err := ctx.Err(); err != nil {
		return 0, fmt.Errorf("memory: get window: %w", err)
	}
	if f := s.fault(OpGetWindow); f != NoFault {
		return 0, faultError(f, "get window")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.counters[namespace][window{id.Size, id.Start}][id.Key], nil
}

// Purge removes counters older than the previous window at now, and forgets
// the batch IDs that only touched such windows.
func (s *Store) Purge(ctx context.Context, now int64) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("memory: purge: %w", err)
	}
	if f := s.fault(OpPurge); f != NoFault {
		return faultError(f, "purge")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for ns, ws := range s.counters {
		for w := range ws {
			if w.start+2*w.size.Milliseconds() <= now {
				delete(ws, w)
			}
		}
		if len(ws) == 0 {
			delete(s.counters, ns)
		}
	}
	for id, end := range s.applied {
		if end <= now {
			delete(s.applied, id)
		}
	}
	return nil
}

// Len returns how many counters the store holds.
func (s *Store) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, ws := range s.counters {
		for _, keys := range ws {
			n += len(keys)
		}
	}
	return n
}
