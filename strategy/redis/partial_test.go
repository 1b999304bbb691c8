package redis

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit/strategy"
)

// noScriptSecond lets the first command of the next pipeline through, answers
// the second one NOSCRIPT without sending it (as a cluster node that lost its
// script cache would), and then calls cancel: the push's NOSCRIPT re-send
// finds its context done and is not sent.
type noScriptSecond struct {
	armed  atomic.Bool
	cancel context.CancelFunc
}

func (h *noScriptSecond) DialHook(next goredis.DialHook) goredis.DialHook { return next }

func (h *noScriptSecond) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook { return next }

func (h *noScriptSecond) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		if len(cmds) < 2 || !h.armed.CompareAndSwap(true, false) {
			return next(ctx, cmds)
		}
		err := next(ctx, cmds[:1])
		for _, c := range cmds[1:] {
			c.SetErr(goredis.ErrNoScript)
		}
		h.cancel()
		return err
	}
}

// A push whose first part was applied and whose second part was never sent
// has an unknown outcome: its error must not match ErrNotApplied, or the
// caller re-sends the applied part under a new batch ID and counts it twice.
func TestPartlyAppliedPushIsNotNotApplied(t *testing.T) {
	c := realClient(t)
	s := newStore(t, c, Options{})
	// Two keys in two shards: two parts, one pipeline.
	keys := []string{"a"}
	for i := 0; len(keys) < 2; i++ {
		if k := "k" + strconv.Itoa(i); s.shardOf(keyHash(k)) != s.shardOf(keyHash(keys[0])) {
			keys = append(keys, k)
		}
	}
	batch := func(id string) *strategy.Batch {
		return &strategy.Batch{ID: id, Namespace: "partial", Diffs: []strategy.Diff{
			diff(keys[0], time.Minute, base, 1), diff(keys[1], time.Minute, base, 1)}}
	}
	_, err := s.PushDiffs(context.Background(), batch("warm")) // the script is cached
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	h := &noScriptSecond{cancel: cancel}
	h.armed.Store(true)
	c.AddHook(h)
	_, err = s.PushDiffs(ctx, batch("b1"))
	require.Error(t, err)
	require.False(t, h.armed.Load(), "the hook ran")
	var sum int64
	for _, k := range keys {
		n, err := s.GetWindow(context.Background(), "partial", strategy.CounterID{Key: k, Size: time.Minute, Start: base})
		require.NoError(t, err)
		sum += n
	}
	require.Equal(t, int64(3), sum, "the warm-up's 2 and the first part's 1")
	require.NotErrorIs(t, err, strategy.ErrNotApplied, "a push with an applied part reported as not applied")
}
