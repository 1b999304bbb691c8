package redis

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/ratesync/ratelimit/strategy"
)

// BenchmarkSyncCycle is one node's sync cycle at the store, the old
// protocol against the new one, for a node holding 100,000 or 1,000,000
// counters of one window:
//
//   - proto=old: the counters changed here as diffs, and a read of every
//     other counter the node holds (how a node learned what other nodes
//     changed before watches);
//   - proto=new: the same diffs and a watch of the window from the cursor
//     of the previous cycle, with a limit of a quarter of the counters held
//     (the batch's own counted), and after an Overflow the reads of
//     proto=old, as the core falls back (at 100%: nothing left to read).
//
// Before each cycle another node (a store of its own on another client,
// outside the figures) changes as many counters as this one: changed=0%,
// 1% (different random counters here and there) or 100%. The metrics are
// per cycle: redis-us, the CPU time Redis spent in the commands the node
// sent (INFO commandstats: the usec of every command name the node's client
// sent, scripts included with the commands they call); redis-cpu-ms, the
// Redis process's CPU time (INFO cpu, user + sys: parsing, replies and
// system calls too); wire-B, the bytes the node's client wrote and read;
// listed, the counters a watch answered (new). Run against a Redis of its
// own, or other clients' work is counted too (see NOTES.md for the command).
func BenchmarkSyncCycle(b *testing.B) {
	addr := benchClient(b).Options().Addr
	for _, held := range []int{100_000, 1_000_000} {
		if held > 100_000 && testing.Short() {
			continue
		}
		for _, pct := range []int{0, 1, 100} {
			for _, proto := range []string{"old", "new"} {
				b.Run(fmt.Sprintf("keys=%d/changed=%d%%/proto=%s", held, pct, proto), func(b *testing.B) {
					benchCycle(b, addr, held, pct, proto == "new")
				})
			}
		}
	}
}

// cycleData is the window a held-keys size works on, pushed once per
// process: every key of it holds a count.
type cycleData struct {
	prefix, ns string
	start      int64
	keys       []string
}

var (
	cycleMu    sync.Mutex
	cycleSetup = map[int]*cycleData{}
)

func cycleWindow(b *testing.B, addr string, held int) *cycleData {
	cycleMu.Lock()
	defer cycleMu.Unlock()
	if d := cycleSetup[held]; d != nil {
		return d
	}
	d := &cycleData{prefix: uniquePrefix(b), ns: "cycle", start: strategy.WindowStart(time.Now().UnixMilli(), time.Hour)}
	d.keys = make([]string, held)
	diffs := make([]strategy.Diff, held)
	for i := range d.keys {
		d.keys[i] = "user-" + strconv.Itoa(i)
		diffs[i] = diff(d.keys[i], time.Hour, d.start, 1)
	}
	c := goredis.NewClient(clientOptions(addr))
	defer c.Close()
	s := newStore(b, c, Options{KeyPrefix: d.prefix})
	if _, err := s.PushDiffs(context.Background(), &strategy.Batch{ID: benchBatchID(), Namespace: d.ns, Diffs: diffs}); err != nil {
		b.Fatal(err)
	}
	cycleSetup[held] = d
	return d
}

func benchCycle(b *testing.B, addr string, held, pct int, watch bool) {
	d := cycleWindow(b, addr, held)
	ctx := context.Background()
	opts := Options{KeyPrefix: d.prefix}
	stats := goredis.NewClient(clientOptions(addr))
	b.Cleanup(func() { _ = stats.Close() })
	other := goredis.NewClient(clientOptions(addr))
	b.Cleanup(func() { _ = other.Close() })
	elsewhere := newStore(b, other, opts)

	wire := &wireCounter{}
	sent := &sentNames{names: map[string]bool{}}
	co := clientOptions(addr)
	co.Dialer = wire.dial
	here := goredis.NewClient(co)
	b.Cleanup(func() { _ = here.Close() })
	here.AddHook(sent)
	s := newStore(b, here, opts)

	// The cursor a node would hold: a watch with a limit of 0 answers the
	// window's position without listing it.
	w := strategy.Watch{Size: time.Hour, Start: d.start, Limit: held / 4}
	res, err := s.PushDiffs(ctx, &strategy.Batch{ID: benchBatchID(), Namespace: d.ns, Now: d.start,
		Watches: []strategy.Watch{{Size: w.Size, Start: w.Start, Limit: 0}}})
	if err != nil {
		b.Fatal(err)
	}
	if watch && len(res.Changes) == 0 {
		b.Skip("the store does not answer watches")
	}
	if watch {
		w.Cursor = res.Changes[0].Cursor
	}

	rng := rand.New(rand.NewPCG(uint64(held), uint64(pct)))
	pick := func() []strategy.Diff {
		n := held * pct / 100
		diffs := make([]strategy.Diff, 0, n)
		if n == held {
			for _, k := range d.keys {
				diffs = append(diffs, diff(k, time.Hour, d.start, 1))
			}
			return diffs
		}
		for _, i := range rng.Perm(held)[:n] {
			diffs = append(diffs, diff(d.keys[i], time.Hour, d.start, 1))
		}
		return diffs
	}
	var usec, cpu, bytes, listed, overflows float64
	b.ReportAllocs()
	b.StopTimer()
	for range b.N {
		if pct > 0 {
			if _, err := elsewhere.PushDiffs(ctx, &strategy.Batch{ID: benchBatchID(), Namespace: d.ns, Now: d.start, Diffs: pick()}); err != nil {
				b.Fatal(err)
			}
		}
		diffs := pick()
		// What the node holds and did not change: it knows that without
		// the store (outside the figures).
		others := readsBesides(d, diffs)
		batch := &strategy.Batch{ID: benchBatchID(), Namespace: d.ns, Now: d.start, Diffs: diffs}
		if watch {
			batch.Watches = []strategy.Watch{w}
		} else {
			batch.Reads = others
		}
		u0, c0 := serverCost(b, stats)
		wire.n.Store(0)
		b.StartTimer()
		res, err := s.PushDiffs(ctx, batch)
		if err != nil {
			b.Fatal(err)
		}
		if watch {
			ch := res.Changes[0]
			if ch.Overflow {
				overflows++
				// The core's fallback: read what the node holds.
				if _, err := s.PushDiffs(ctx, &strategy.Batch{ID: benchBatchID(), Namespace: d.ns, Now: d.start,
					Reads: others}); err != nil {
					b.Fatal(err)
				}
			}
			w.Cursor = ch.Cursor
			listed += float64(len(ch.Counters))
		}
		b.StopTimer()
		bytes += float64(wire.n.Load())
		u1, c1 := serverCost(b, stats)
		sent.mu.Lock()
		for name := range sent.names {
			usec += u1[name] - u0[name]
		}
		sent.mu.Unlock()
		cpu += c1 - c0
	}
	n := float64(b.N)
	b.ReportMetric(usec/n, "redis-us/op")
	b.ReportMetric(cpu/n*1e3, "redis-cpu-ms/op")
	b.ReportMetric(bytes/n, "wire-B/op")
	if watch {
		b.ReportMetric(listed/n, "listed/op")
		b.ReportMetric(overflows/n, "overflows/op")
	}
}

// readsBesides returns a read of every key of d not in diffs.
func readsBesides(d *cycleData, diffs []strategy.Diff) []strategy.CounterID {
	changed := make(map[string]bool, len(diffs))
	for _, df := range diffs {
		changed[df.Key] = true
	}
	reads := make([]strategy.CounterID, 0, len(d.keys)-len(diffs))
	for _, k := range d.keys {
		if !changed[k] {
			reads = append(reads, strategy.CounterID{Key: k, Size: time.Hour, Start: d.start})
		}
	}
	return reads
}

// serverCost returns, from INFO, the microseconds Redis spent in commands
// of each name (a script's include the commands it calls) and the CPU
// seconds of the server process. The cycle's cost sums the names its node
// sent: scripts and reads, never the commands the scripts call.
func serverCost(b *testing.B, c *goredis.Client) (usec map[string]float64, cpu float64) {
	info, err := c.Info(context.Background(), "commandstats", "cpu").Result()
	if err != nil {
		b.Fatal(err)
	}
	usec = map[string]float64{}
	for line := range strings.SplitSeq(info, "\r\n") {
		if rest, ok := strings.CutPrefix(line, "cmdstat_"); ok {
			name, fields, _ := strings.Cut(rest, ":")
			for f := range strings.SplitSeq(fields, ",") {
				if v, ok := strings.CutPrefix(f, "usec="); ok {
					n, _ := strconv.ParseFloat(v, 64)
					usec[name] = n
				}
			}
			continue
		}
		for _, k := range []string{"used_cpu_user:", "used_cpu_sys:"} {
			if v, ok := strings.CutPrefix(line, k); ok {
				n, _ := strconv.ParseFloat(v, 64)
				cpu += n
			}
		}
	}
	return usec, cpu
}

// sentNames records the names of the commands a client sent.
type sentNames struct {
	mu    sync.Mutex
	names map[string]bool
}

func (s *sentNames) note(cmds ...goredis.Cmder) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range cmds {
		s.names[c.Name()] = true
	}
}

func (s *sentNames) DialHook(next goredis.DialHook) goredis.DialHook { return next }
func (s *sentNames) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		s.note(cmd)
		return next(ctx, cmd)
	}
}
func (s *sentNames) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		s.note(cmds...)
		return next(ctx, cmds)
	}
}

// wireCounter counts the bytes its connections write and read.
type wireCounter struct{ n atomic.Int64 }

func (w *wireCounter) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return &countingConn{Conn: c, n: &w.n}, nil
}

type countingConn struct {
	net.Conn
	n *atomic.Int64
}

func (c *countingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.n.Add(int64(n))
	return n, err
}

func (c *countingConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.n.Add(int64(n))
	return n, err
}
