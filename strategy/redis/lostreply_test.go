package redis

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit/strategy"
)

// replyDropper is a TCP proxy to Redis that, for the script calls it
// chooses, forwards the request and then closes both connections as soon as
// Redis starts answering: Redis ran the script, the client never learns it.
type replyDropper struct {
	ln     net.Listener
	target string
	drop   func() bool // asked once per forwarded script call

	scripts, drops atomic.Int64
	down           atomic.Bool // close every connection at once

	mu    sync.Mutex
	conns map[net.Conn]bool
	wg    sync.WaitGroup
}

func newReplyDropper(t *testing.T, target string, drop func() bool) *replyDropper {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &replyDropper{ln: ln, target: target, drop: drop, conns: map[net.Conn]bool{}}
	p.wg.Go(p.accept)
	t.Cleanup(p.close)
	return p
}

func (p *replyDropper) addr() string { return p.ln.Addr().String() }

func (p *replyDropper) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conns == nil {
		return false
	}
	p.conns[c] = true
	return true
}

// setDown starts (true) or ends an outage: while down, every connection is
// closed as soon as it is accepted; going down closes the open ones.
func (p *replyDropper) setDown(down bool) {
	p.down.Store(down)
	if !down {
		return
	}
	p.mu.Lock()
	for c := range p.conns {
		_ = c.Close()
		delete(p.conns, c)
	}
	p.mu.Unlock()
}

func (p *replyDropper) close() {
	_ = p.ln.Close()
	p.mu.Lock()
	for c := range p.conns {
		_ = c.Close()
	}
	p.conns = nil
	p.mu.Unlock()
	p.wg.Wait()
}

func (p *replyDropper) accept() {
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		if p.down.Load() {
			_ = client.Close()
			continue
		}
		server, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = client.Close()
			continue
		}
		if !p.track(client) || !p.track(server) {
			_ = client.Close()
			_ = server.Close()
			return
		}
		var dropNext atomic.Bool
		closeBoth := func() { _ = client.Close(); _ = server.Close() }
		p.wg.Go(func() { // client -> Redis
			defer closeBoth()
			buf := make([]byte, 64<<10)
			for {
				n, err := client.Read(buf)
				if n > 0 {
					if bytes.Contains(buf[:n], []byte("\r\nevalsha\r\n")) || bytes.Contains(buf[:n], []byte("\r\neval\r\n")) {
						p.scripts.Add(1)
						if p.drop() {
							dropNext.Store(true) // before forwarding: the reply cannot overtake it
						}
					}
					if _, err := server.Write(buf[:n]); err != nil {
						return
					}
				}
				if err != nil {
					return
				}
			}
		})
		p.wg.Go(func() { // Redis -> client
			defer closeBoth()
			buf := make([]byte, 64<<10)
			for {
				n, err := server.Read(buf)
				if n > 0 {
					if dropNext.Load() {
						p.drops.Add(1)
						return // Redis answered (so it ran the script): lose the answer
					}
					if _, err := client.Write(buf[:n]); err != nil {
						return
					}
				}
				if err != nil {
					return
				}
			}
		})
	}
}

type lostReplyRun struct {
	want, got   map[string]int64
	drops       int64
	scripts     int64
	pushes      int
	storeErrors int // pushes the client's own retries could not complete
	mismatches  int // successful pushes whose totals were not the expected ones
}

// runLostReplies pushes random batches through a replyDropper that loses
// about half of the script replies, re-sending a batch after an error as the
// core does, until minDrops replies were lost. The client keeps go-redis's
// default retries, which re-send a script whose reply was lost.
func runLostReplies(t *testing.T, target string, idempotent, single bool, minDrops int64) lostReplyRun {
	rng := rand.New(rand.NewPCG(1, 2))
	var rngMu sync.Mutex
	proxy := newReplyDropper(t, target, func() bool {
		rngMu.Lock()
		defer rngMu.Unlock()
		return rng.IntN(2) == 0
	})
	// Default MaxRetries (3) and backoff on purpose: the retries that re-send
	// a script whose reply was lost are what this test is about.
	c := goredis.NewClient(&goredis.Options{
		Addr:         proxy.addr(),
		DialTimeout:  testDialTimeout,
		ReadTimeout:  testReadTimeout,
		WriteTimeout: testWriteTimeout,
		PoolTimeout:  testPoolTimeout,
	})
	defer c.Close()
	require.Equal(t, 3, c.Options().MaxRetries)
	s := newStore(t, c, Options{Shards: 4})
	s.noIdempotent = !idempotent

	ctx := context.Background()
	ns := "lost-replies"
	keys := []string{"a", "b", "c", "d", "e", "f", "g", "h"}
	run := lostReplyRun{want: map[string]int64{}, got: map[string]int64{}}
	for run.pushes = 0; proxy.drops.Load() < minDrops; run.pushes++ {
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
	run.drops, run.scripts = proxy.drops.Load(), proxy.scripts.Load()

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
func TestReplyDropperForwards(t *testing.T) {
	noLeaks(t)
	target := realAddr(t)
	p := newReplyDropper(t, target, func() bool { return false })
	c := newClient(t, p.addr())
	require.NoError(t, c.Ping(context.Background()).Err())
	require.NoError(t, c.Eval(context.Background(), "return 1", nil).Err())
	require.Equal(t, int64(1), p.scripts.Load())
	require.Zero(t, p.drops.Load())
}
