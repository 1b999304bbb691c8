package ratelimit_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit"
	"github.com/ratesync/ratelimit/strategy"
	"github.com/ratesync/ratelimit/strategy/memory"
)

// slowFirstBucketRead answers the first cold bucket read (a push of bucket
// reads only) with the store's state at the time it arrived, but holds the
// answer until release is closed.
type slowFirstBucketRead struct {
	strategy.Strategy
	once    sync.Once
	arrived chan struct{}
	release chan struct{}
}

func (s *slowFirstBucketRead) Capabilities() strategy.Capabilities {
	return strategy.CapabilitiesOf(s.Strategy)
}

func (s *slowFirstBucketRead) PushDiffs(ctx context.Context, b *strategy.Batch) (strategy.Result, error) {
	res, err := s.Strategy.PushDiffs(ctx, b)
	if len(b.BucketReads) > 0 && len(b.BucketDiffs) == 0 && len(b.Diffs) == 0 {
		first := false
		s.once.Do(func() { first = true })
		if first {
			close(s.arrived)
			<-s.release
		}
	}
	return res, err
}

// TestColdBucketReadStaleLearn: one node, one token bucket of 1 token per
// minute. Two requests find the key cold together and each reads the store;
// one read is slow. The other request is admitted and spends the token, and
// a sync pushes the spend and learns the store's bucket. The slow read,
// answered before that push, then overwrites the bucket's learned state with
// the older one: the spend the sync confirmed is forgotten, and the second
// request is admitted too. Two admitted with a burst of 1, on one node.
func TestColdBucketReadStaleLearn(t *testing.T) {
	store := &slowFirstBucketRead{Strategy: memory.New(), arrived: make(chan struct{}), release: make(chan struct{})}
	clk := &fakeClock{t: minute.Add(10 * time.Second)}
	ns := newNS(t, ratelimit.Config{WindowSizes: []time.Duration{time.Minute}, SyncRate: time.Hour,
		SyncTimeout: 30 * time.Second, Strategy: store, Clock: clk.Now})
	lim := ratelimit.Limit{Window: time.Minute, Max: 1, Algorithm: ratelimit.TokenBucket}

	slow := make(chan ratelimit.Decision, 1)
	slowErr := make(chan error, 1)
	go func() {
		d, err := ns.Allow(ctx, "k", 1, lim)
		slowErr <- err
		slow <- d
	}()
	select {
	case <-store.arrived: // the slow request's read has its answer: a full bucket
	case err := <-slowErr:
		t.Fatalf("the slow request ended without a cold read: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("no cold read")
	}

	d, err := ns.Allow(ctx, "k", 1, lim)
	require.NoError(t, err)
	require.True(t, d.Allowed, "the first request spends the token")
	require.NoError(t, ns.Sync(ctx)) // pushes the spend and learns the bucket
	d, err = ns.Peek(ctx, "k", 1, lim)
	require.NoError(t, err)
	require.False(t, d.Allowed, "the bucket is empty, as the store says")

	close(store.release)
	require.NoError(t, <-slowErr)
	d = <-slow
	require.False(t, d.Allowed, "the token was spent: a burst of 1 admits one request")
}
