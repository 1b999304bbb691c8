package ratelimit_test

import (
	"context"
	"iter"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit"
	"github.com/ratesync/ratelimit/strategy"
	"github.com/ratesync/ratelimit/strategy/memory"
)

// A Refund on a key this node does not hold (never seen here, or evicted
// since its Allow) must leave the key cold: the next decision still reads
// the store's totals. A take-back made after eviction is marked unread for
// that reason (flagUnread); a Refund creates the entry through Table.Add and
// makes the key "held" with no totals, so the next Allows get a fresh budget.
func TestColdRefundLeavesKeyCold(t *testing.T) {
	leakCheck(t)
	lim := ratelimit.Limit{Window: time.Minute, Max: 5}
	a, b := twoNodes(t, memory.New(), ratelimit.ColdReadOn)
	spend(t, a, "client", 5, lim) // the store holds 5
	require.NoError(t, b.Refund(ctx, "client", 1, lim))
	// The store's total after B's refund is 4: one more admission at most.
	admitted := allowed(t, b, "client", 10, lim)
	require.LessOrEqual(t, admitted, 1, "B admitted %d after a refund of 1 under a limit of 5 the store shows spent", admitted)
}

// The same for a token bucket: a Refund creates the bucket, which Holds then
// reports held, and the next Allow skips the cold read.
func TestColdBucketRefundLeavesKeyCold(t *testing.T) {
	leakCheck(t)
	lim := ratelimit.Limit{Window: time.Minute, Max: 5, Algorithm: ratelimit.TokenBucket}
	a, b := twoNodes(t, memory.New(), ratelimit.ColdReadOn)
	spend(t, a, "client", 5, lim)
	d, err := b.Peek(ctx, "other", 1, lim) // sanity: B reads cold buckets
	require.NoError(t, err)
	require.True(t, d.Allowed)
	require.NoError(t, b.Refund(ctx, "client", 1, lim))
	admitted := allowed(t, b, "client", 10, lim)
	require.LessOrEqual(t, admitted, 1, "B admitted %d after a refund of 1 of a bucket of 5 the store shows empty", admitted)
}

// cancellingStore cancels a caller's context from inside its first
// GetCounters (a client that hangs up while its cold read is in flight).
// The read goes on (it is not the caller's: see coldReader) unless its own
// context ends.
type cancellingStore struct {
	strategy.Strategy
	cancel atomic.Pointer[context.CancelFunc]
}

func (s *cancellingStore) GetCounters(ctx context.Context, q strategy.Query) iter.Seq2[strategy.Counter, error] {
	if c := s.cancel.Swap(nil); c != nil {
		(*c)()
		if ctx.Err() != nil {
			return func(yield func(strategy.Counter, error) bool) { yield(strategy.Counter{}, ctx.Err()) }
		}
	}
	return s.Strategy.GetCounters(ctx, q)
}

// A client that spent its budget on node A reaches node B and hangs up while
// B's cold read is in flight. Before KeepCold, the hit was counted in a new
// entry that B then held without the store's totals: every later request
// of that client on B got a fresh budget until B's next sync, the store
// healthy throughout. (Before the cold reader's reads stopped ending with
// the caller that sent them, the read itself was cut short too.)
func TestColdCancelledCallerGivesFreshBudget(t *testing.T) {
	leakCheck(t)
	lim := ratelimit.Limit{Window: time.Minute, Max: 5}
	store := &cancellingStore{Strategy: memory.New()}
	a, b := twoNodes(t, store, ratelimit.ColdReadOn)
	spend(t, a, "client", 5, lim)
	cctx, cancel := context.WithCancel(ctx)
	store.cancel.Store(&cancel)
	_, err := b.Allow(cctx, "client", 1, lim) // hangs up during the read
	require.NoError(t, err)
	admitted := allowed(t, b, "client", 10, lim)
	require.Zero(t, admitted, "B admitted %d requests of a client the store shows spent (store healthy)", admitted)
}
