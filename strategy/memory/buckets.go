package memory

import (
	"github.com/ratesync/ratelimit/strategy"
)

// applyBuckets applies b's bucket diffs (unless the batch was seen before) and
// returns the buckets after. The caller holds s.mu.
func (s *Store) applyBuckets(b *strategy.Batch, seen bool) []strategy.BucketState {
	bs := s.bucketsOf(b.Namespace)
	out := make([]strategy.BucketState, len(b.BucketDiffs))
	for i, d := range b.BucketDiffs {
		if !seen {
			bs[d.BucketID] = strategy.ApplyBucket(bs[d.BucketID], d, b.Now)
		}
		out[i] = bs[d.BucketID]
	}
	return out
}

// bucketsOf returns namespace's buckets, creating the map. The caller holds
// s.mu.
func (s *Store) bucketsOf(namespace string) map[strategy.BucketID]strategy.BucketState {
	bs := s.buckets[namespace]
	if bs == nil {
		bs = make(map[strategy.BucketID]strategy.BucketState)
		s.buckets[namespace] = bs
	}
	return bs
}

// purgeBuckets forgets the buckets that have been full long enough (see
// strategy.BucketExpiry). The caller holds s.mu.
func (s *Store) purgeBuckets(now int64) {
	for ns, bs := range s.buckets {
		for id, st := range bs {
			if strategy.BucketExpiry(st, id.Period) <= now {
				delete(bs, id)
			}
		}
		if len(bs) == 0 {
			delete(s.buckets, ns)
		}
	}
}
