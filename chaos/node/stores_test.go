package node

import (
	"context"
	"fmt"
	"iter"
	"sync"
	"time"

	"github.com/ratesync/ratelimit/strategy"
	"github.com/ratesync/ratelimit/strategy/memory"
)

// slowStore wraps a store: each PushDiffs reports on entered, then waits
// until its context is done (and fails with an unknown outcome, as a
// timeout would) or until release is closed (and goes through).
type slowStore struct {
	*memory.Store
	entered chan struct{} // one value per PushDiffs that started waiting
	release chan struct{}
	once    sync.Once
}

func newSlowStore() *slowStore {
	return &slowStore{Store: memory.New(), entered: make(chan struct{}, 64), release: make(chan struct{})}
}

// Release lets every waiting and later push through.
func (s *slowStore) Release() { s.once.Do(func() { close(s.release) }) }

func (s *slowStore) PushDiffs(ctx context.Context, b *strategy.Batch) (strategy.Result, error) {
	select {
	case s.entered <- struct{}{}:
	default:
	}
	select {
	case <-ctx.Done():
		return strategy.Result{}, fmt.Errorf("slow store: push: %w", ctx.Err())
	case <-s.release:
		return s.Store.PushDiffs(ctx, b)
	}
}

func (s *slowStore) GetCounters(ctx context.Context, q strategy.Query) iter.Seq2[strategy.Counter, error] {
	return func(yield func(strategy.Counter, error) bool) {
		select {
		case <-ctx.Done():
			yield(strategy.Counter{}, fmt.Errorf("slow store: get counters: %w", ctx.Err()))
			return
		case <-s.release:
		}
		for c, err := range s.Store.GetCounters(ctx, q) {
			if !yield(c, err) {
				return
			}
		}
	}
}

// storeTotal returns the store's total for key over the current and previous
// window of size, now.
func storeTotal(s strategy.Strategy, ns, key string, size time.Duration) (int64, error) {
	q := strategy.Query{Namespace: ns, Keys: []string{key}, Sizes: []time.Duration{size}, Now: time.Now().UnixMilli()}
	var n int64
	for c, err := range s.GetCounters(context.Background(), q) {
		if err != nil {
			return 0, err
		}
		n += c.Count
	}
	return n, nil
}
