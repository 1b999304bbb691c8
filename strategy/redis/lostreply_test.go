package redis

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit/internal/faultproxy"
	"github.com/ratesync/ratelimit/strategy"
)

// newProxy starts a faultproxy to target, closed when the test ends.
func newProxy(t *testing.T, target string) *faultproxy.Proxy {
	t.Helper()
	p, err := faultproxy.New(target)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, p.Close()) })
	return p
}

// newScriptDropper starts a proxy to Redis that, for the script calls drop
// chooses, forwards the request and then cuts both connections as soon as
// Redis starts answering: Redis ran the script, the client never learns it.
// drop is asked once per forwarded request with a script call, never
// concurrently; scripts counts those requests, p.Cuts() the lost replies.
func newScriptDropper(t *testing.T, target string, drop func() bool) (p *faultproxy.Proxy, scripts *atomic.Int64) {
	t.Helper()
	p, scripts = newProxy(t, target), new(atomic.Int64)
	p.Arm(faultproxy.Cut{Times: -1, Match: func(chunk []byte) bool {
		if !bytes.Contains(chunk, []byte("\r\nevalsha\r\n")) && !bytes.Contains(chunk, []byte("\r\neval\r\n")) {
			return false
		}
		scripts.Add(1)
		return drop()
	}})
	return p, scripts
}

type lostReplyRun struct {
	want, got   map[string]int64
	drops       int64
	scripts     int64
	pushes      int
	storeErrors int // pushes the client's own retries could not complete
	mismatches  int // successful pushes whose totals were not the expected ones
}

// runLostReplies pushes random batches through a script dropper that loses
// about half of the script replies, re-sending a batch after an error as the
// core does, until minDrops replies were lost. The client keeps go-redis's
// default retries, which re-send a script whose reply was lost.
func runLostReplies(t *testing.T, target string, idempotent, single bool, minDrops int64) lostReplyRun {
	rng := rand.New(rand.NewPCG(1, 2))
	proxy, scripts := newScriptDropper(t, target, func() bool { return rng.IntN(2) == 0 })
	// Default MaxRetries (3) and backoff on purpose: the retries that re-send
	// a script whose reply was lost are what this test is about.
	c := goredis.NewClient(&goredis.Options{
		Addr:         proxy.Addr(),
		DialTimeout:  testDialTimeout,
		ReadTimeout:  testReadTimeout,
		WriteTimeout: testWriteTimeout,
		PoolTimeout:  testPoolTimeout,

		ContextTimeoutEnabled: true,
	})
	defer c.Close()
	require.Equal(t, 3, c.Options().MaxRetries)
	s := newStore(t, c, Options{Shards: 4})
	s.noIdempotent = !idempotent

	ctx := context.Background()
	ns := "lost-replies"
	keys := []string{"a", "b", "c", "d", "e", "f", "g", "h"}
	run := lostReplyRun{want: map[string]int64{}, got: map[string]int64{}}
	for run.pushes = 0; proxy.Cuts() < minDrops; run.pushes++ {
		require.Less(t, run.pushes, 20*int(minDrops), "too few replies dropped")
		b := &strategy.Batch{ID: fmt.Sprintf("lost-%s-%d", s.opts.KeyPrefix, run.pushes), Namespace: ns}
		if single {
			// A synchronous-mode push: one key, its current window and the
			// previous one's read, one script call sent on its own.
			k := keys[rng.IntN(len(keys))]
			d := int64(rng.IntN(5) + 1)
			b.Diffs = append(b.Diffs, diff(k, time.Minute, base, d))
			b.Reads = append(b.Reads, strategy.CounterID{Key: k, Size: time.Minute, Start: base - 60_000})
			run.want[k] += d
		}
		for _, k := range keys {
			if single {
				break
			}
			if rng.IntN(3) > 0 {
				d := int64(rng.IntN(5) + 1)
				b.Diffs = append(b.Diffs, diff(k, time.Minute, base, d))
				run.want[k] += d
			} else {
				b.Reads = append(b.Reads, strategy.CounterID{Key: k, Size: time.Minute, Start: base})
			}
		}
		for attempt := 0; ; attempt++ {
			require.Less(t, attempt, 100, "push %d never succeeded", run.pushes)
			res, err := s.PushDiffs(ctx, b)
			if err != nil {
				// Unknown outcome or not applied: re-send unchanged, same ID.
				run.storeErrors++
				continue
			}
			for i, d := range b.Diffs {
				if res.Totals[i] != run.want[d.Key] {
					run.mismatches++
				}
			}
			for i, r := range b.Reads {
				if r.Start == base && res.Reads[i] != run.want[r.Key] {
					run.mismatches++
				}
			}
			break
		}
	}
	run.drops, run.scripts = proxy.Cuts(), scripts.Load()

	// Read the totals directly, not through the proxy.
	direct := newStore(t, realClient(t), s.opts)
	for cnt, err := range direct.GetCounters(ctx, strategy.Query{Namespace: ns, Sizes: []time.Duration{time.Minute}, Now: base}) {
		require.NoError(t, err)
		run.got[cnt.Key] = cnt.Count
	}
	t.Logf("idempotent=%v single=%v: %d pushes, %d requests with script calls forwarded, %d replies lost, %d pushes failed after the client's retries, %d wrong totals returned",
		idempotent, single, run.pushes, run.scripts, run.drops, run.storeErrors, run.mismatches)
	return run
}

// Hundreds of lost replies, a client with default retries: the stored totals
// still equal the hits exactly. Without the batch-part ids the same run
// counts hits twice, which shows the test can fail.
func TestLostReplies(t *testing.T) {
	noLeaks(t)
	target := realAddr(t)

	t.Run("ExactlyOnce", func(t *testing.T) {
		run := runLostReplies(t, target, true, false, 300)
		require.Equal(t, run.want, run.got)
		require.Zero(t, run.mismatches)
		require.Greater(t, run.scripts, int64(run.pushes), "go-redis re-sent scripts")
	})

	t.Run("ExactlyOnceSingleCommand", func(t *testing.T) {
		run := runLostReplies(t, target, true, true, 150)
		require.Equal(t, run.want, run.got)
		require.Zero(t, run.mismatches)
	})

	t.Run("WithoutIdempotencyItDoubleCounts", func(t *testing.T) {
		run := runLostReplies(t, target, false, false, 30)
		var want, got int64
		for k := range run.want {
			want += run.want[k]
			got += run.got[k]
		}
		require.Greater(t, got, want, "re-sent scripts are applied again")
	})
}

// A proxy that fails the way the tests expect: sanity check of the helper.
func TestScriptDropperForwards(t *testing.T) {
	noLeaks(t)
	target := realAddr(t)
	p, scripts := newScriptDropper(t, target, func() bool { return false })
	c := newClient(t, p.Addr())
	require.NoError(t, c.Ping(context.Background()).Err())
	require.NoError(t, c.Eval(context.Background(), "return 1", nil).Err())
	require.Equal(t, int64(1), scripts.Load())
	require.Zero(t, p.Cuts())
}
