package ratelimit

import (
	"context"
	"iter"
	"time"

	"github.com/ratesync/ratelimit/strategy"
)

// observedStore tells an Observer about every call to the Strategy it wraps.
// A namespace wraps its store in one only when Config.Observer is set.
type observedStore struct {
	inner strategy.Strategy
	obs   Observer
	ns    string
}

func (s *observedStore) end(ctx context.Context, e Event, start time.Time, err error) {
	e.Namespace, e.Start, e.Duration, e.Err = s.ns, start, time.Since(start), err
	s.obs.End(ctx, e)
}

func (s *observedStore) PushDiffs(ctx context.Context, b *strategy.Batch) (strategy.Result, error) {
	start := time.Now()
	ctx = s.obs.Start(ctx, OpPush)
	res, err := s.inner.PushDiffs(ctx, b)
	var delta int64
	for i := range b.Diffs {
		delta += b.Diffs[i].Delta
	}
	s.end(ctx, Event{Op: OpPush, Diffs: len(b.Diffs), Reads: len(b.Reads), Delta: delta}, start, err)
	return res, err
}

func (s *observedStore) GetCounters(ctx context.Context, q strategy.Query) iter.Seq2[strategy.Counter, error] {
	return func(yield func(strategy.Counter, error) bool) {
		start := time.Now()
		octx := s.obs.Start(ctx, OpFetch)
		var err error
		for c, e := range s.inner.GetCounters(octx, q) {
			if e != nil {
				err = e
			}
			if !yield(c, e) {
				break
			}
		}
		s.end(octx, Event{Op: OpFetch}, start, err)
	}
}

func (s *observedStore) GetWindow(ctx context.Context, namespace string, id strategy.CounterID) (int64, error) {
	start := time.Now()
	ctx = s.obs.Start(ctx, OpGetWindow)
	n, err := s.inner.GetWindow(ctx, namespace, id)
	s.end(ctx, Event{Op: OpGetWindow}, start, err)
	return n, err
}

func (s *observedStore) Purge(ctx context.Context, now int64) error {
	start := time.Now()
	ctx = s.obs.Start(ctx, OpPurge)
	err := s.inner.Purge(ctx, now)
	s.end(ctx, Event{Op: OpPurge}, start, err)
	return err
}

// Capabilities are the wrapped store's.
func (s *observedStore) Capabilities() strategy.Capabilities { return strategy.CapabilitiesOf(s.inner) }

// Take reports a Take as an OpTake store call. The namespace calls it only
// when the wrapped store is a strategy.Taker.
func (s *observedStore) Take(ctx context.Context, t *strategy.Take) (strategy.TakeResult, error) {
	start := time.Now()
	ctx = s.obs.Start(ctx, OpTake)
	res, err := s.inner.(strategy.Taker).Take(ctx, t)
	s.end(ctx, Event{Op: OpTake, Delta: t.Cost}, start, err)
	return res, err
}
