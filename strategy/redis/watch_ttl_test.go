package redis

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit/strategy"
)

// TestWatchCompanionsExpireWithTheHash (held): a window's version key,
// change log and markers keep the hash's TTL through a watch before the
// hash exists, a push that creates a field long after, a push that only
// updates one, and expiry: a cursor is never answered from a log that
// expired before its version key (an empty listing), only with the changes
// or, once the window is gone, with an Overflow.
func TestWatchCompanionsExpireWithTheHash(t *testing.T) {
	mr, c := miniClient(t)
	s := newStore(t, c, Options{Shards: 1})
	other := newStore(t, c, s.opts)
	ns := "revttl"
	h := hashKey(s.shardPrefixes(ns)[0], time.Minute, base)
	ttls := func() []time.Duration {
		return []time.Duration{mr.TTL(h), mr.TTL(h + versionSuffix), mr.TTL(h + logSuffix), mr.TTL(h + markSuffix)}
	}
	same := func(what string) {
		t.Helper()
		got := ttls()
		for i := 1; i < len(got); i++ {
			if mr.Exists(h) {
				require.Equal(t, got[0], got[i], "%s: hash, version, log, markers TTLs %v", what, got)
			}
		}
	}
	push := func(d strategy.Diff) {
		_, err := other.PushDiffs(context.Background(), &strategy.Batch{ID: batchID(t), Namespace: ns, Now: base, Diffs: []strategy.Diff{d}})
		require.NoError(t, err)
	}
	w := strategy.Watch{Size: time.Minute, Start: base, Limit: 1000}
	_, ch := watchOnce(t, s, ns, w) // before the hash exists
	require.False(t, ch.Overflow)
	w.Cursor = ch.Cursor

	mr.FastForward(100 * time.Second)
	push(diff("a", time.Minute, base, 1)) // creates the hash and its field
	same("after the first field")
	mr.FastForward(100 * time.Second) // past the watch's own TTL
	_, ch = watchOnce(t, s, ns, w)
	require.False(t, ch.Overflow)
	require.Equal(t, map[string]int64{"a": 1}, changedMap(t, ch))
	w.Cursor = ch.Cursor

	push(diff("a", time.Minute, base, 1)) // an update: no TTL change
	same("after an update")
	_, ch = watchOnce(t, s, ns, w)
	require.Equal(t, map[string]int64{"a": 2}, changedMap(t, ch))
	w.Cursor = ch.Cursor

	mr.FastForward(40 * time.Second) // the window's keys expire together
	require.False(t, mr.Exists(h))
	push(diff("a", time.Minute, base, 1)) // a new hash, not watched yet: not logged
	_, ch = watchOnce(t, s, ns, w)
	require.True(t, ch.Overflow, "a cursor of the expired window: %+v", ch)
}
