package postgres

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit/strategy"
)

// BenchmarkSyncCycle is one node's sync cycle at the store: the node holds
// held keys, each with a counter in the current and the previous minute
// window; before each cycle another node changes a share of the keys in the
// current window, and the node itself pushes diffs of the same share.
//
//   - protocol "old": diffs + Reads of every key held (the current window's
//     keys not in the diffs, and the previous window's): what the core sends
//     without watches.
//   - protocol "new": diffs + a Watch of each window (Limit: a quarter of the
//     keys held); on an Overflow, a second push reads the window's keys not
//     in the diffs, as the core falls back to Reads.
//
// Each iteration runs one cycle of each protocol, old then new, on two
// namespaces of one table (each with its own other node), and reports both
// times and their ratio: the protocols are compared in the same run, under
// the same load. ns/op is the sum of the two. 1,000,000 keys are left out
// under -short.
//
//	go test -run '^$' -bench SyncCycle -benchtime=3x -count=5 -timeout=2h ./strategy/postgres/ | tee cycle.txt
//	benchstat cycle.txt
func BenchmarkSyncCycle(b *testing.B) {
	pool := newPool(b, testDSN(b))
	for _, held := range []int{100_000, 1_000_000} {
		if held > 100_000 && testing.Short() {
			continue
		}
		s := newStore(b, pool, Options{})
		nodes := map[string]*cycleNode{}
		for _, protocol := range []string{"old", "new"} {
			nodes[protocol] = newCycleNode(b, s, "cycle-"+protocol, held)
		}
		for _, changed := range []float64{0, 0.01, 1} {
			b.Run(fmt.Sprintf("held=%s/changed=%g%%", count(held), changed*100), func(b *testing.B) {
				var old, neu time.Duration
				for i := 0; b.Loop(); i++ {
					b.StopTimer()
					nodes["old"].other(b, changed)
					bt := nodes["old"].oldBatch(changed)
					b.StartTimer()
					start := time.Now()
					nodes["old"].push(b, bt)
					old += time.Since(start)
					b.StopTimer()
					nodes["new"].other(b, changed)
					nb := nodes["new"].newBatch(changed)
					b.StartTimer()
					neu += nodes["new"].newCycle(b, nb)
				}
				n := float64(b.N)
				b.ReportMetric(float64(old.Milliseconds())/n, "old-ms/cycle")
				b.ReportMetric(float64(neu.Milliseconds())/n, "new-ms/cycle")
				b.ReportMetric(float64(neu)/float64(old), "new/old")
			})
		}
	}
}

func count(n int) string {
	if n >= 1_000_000 {
		return fmt.Sprintf("%dM", n/1_000_000)
	}
	return fmt.Sprintf("%dk", n/1000)
}

// cycleNode is one node of BenchmarkSyncCycle, and the other node that
// changes its keys.
type cycleNode struct {
	s       *Store
	ns      string
	keys    []string
	rng     *rand.Rand
	seq     int
	idx     []int
	cursors [2]string // of the current and the previous window
}

var cycleWindows = [2]int64{base, base - 60_000}

func newCycleNode(b *testing.B, s *Store, ns string, held int) *cycleNode {
	n := &cycleNode{s: s, ns: ns, keys: make([]string, held), rng: rand.New(rand.NewPCG(uint64(held), 1)), idx: make([]int, held)}
	for i := range n.keys {
		n.keys[i] = fmt.Sprintf("user-%08d", i)
		n.idx[i] = i
	}
	for _, start := range cycleWindows {
		for lo := 0; lo < held; lo += 100_000 {
			var diffs []strategy.Diff
			for _, k := range n.keys[lo:min(lo+100_000, held)] {
				diffs = append(diffs, diff(k, time.Minute, start, 1))
			}
			n.push(b, &strategy.Batch{ID: n.id(), Namespace: ns, Diffs: diffs})
		}
	}
	// The node's cursors, as its first cycle would leave them.
	res := n.push(b, &strategy.Batch{ID: n.id(), Namespace: ns, Watches: n.watches()})
	for w, c := range res.Changes {
		n.cursors[w] = c.Cursor
	}
	return n
}

func (n *cycleNode) id() string {
	n.seq++
	return fmt.Sprintf("%s-%d-%d", n.ns, time.Now().UnixNano(), n.seq)
}

func (n *cycleNode) push(b *testing.B, bt *strategy.Batch) strategy.Result {
	res, err := n.s.PushDiffs(context.Background(), bt)
	require.NoError(b, err)
	return res
}

// pick returns a random share of the keys' indexes.
func (n *cycleNode) pick(share float64) []int {
	k := int(share * float64(len(n.keys)))
	for i := range k { // a partial shuffle
		j := i + n.rng.IntN(len(n.idx)-i)
		n.idx[i], n.idx[j] = n.idx[j], n.idx[i]
	}
	return n.idx[:k]
}

// other is the other node's push: a share of the keys changed.
func (n *cycleNode) other(b *testing.B, share float64) {
	var diffs []strategy.Diff
	for _, i := range n.pick(share) {
		diffs = append(diffs, diff(n.keys[i], time.Minute, base, 1))
	}
	if len(diffs) > 0 {
		n.push(b, &strategy.Batch{ID: n.id(), Namespace: n.ns, Diffs: diffs})
	}
}

// diffs returns the node's own diffs of a share of its keys, and which keys
// they are.
func (n *cycleNode) diffs(share float64) ([]strategy.Diff, map[int]bool) {
	picked := n.pick(share)
	in := make(map[int]bool, len(picked))
	diffs := make([]strategy.Diff, 0, len(picked))
	for _, i := range picked {
		in[i] = true
		diffs = append(diffs, diff(n.keys[i], time.Minute, base, 1))
	}
	return diffs, in
}

// reads returns reads of the window's keys not in the diffs.
func (n *cycleNode) reads(start int64, in map[int]bool) []strategy.CounterID {
	out := make([]strategy.CounterID, 0, len(n.keys))
	for i, k := range n.keys {
		if start != base || !in[i] {
			out = append(out, id(k, time.Minute, start))
		}
	}
	return out
}

func (n *cycleNode) oldBatch(share float64) *strategy.Batch {
	diffs, in := n.diffs(share)
	return &strategy.Batch{ID: n.id(), Namespace: n.ns, Diffs: diffs,
		Reads: append(n.reads(base, in), n.reads(base-60_000, nil)...)}
}

func (n *cycleNode) watches() []strategy.Watch {
	var ws []strategy.Watch
	for w, start := range cycleWindows {
		ws = append(ws, strategy.Watch{Size: time.Minute, Start: start, Cursor: n.cursors[w], Limit: len(n.keys) / 4})
	}
	return ws
}

// newCycleBatch is a new-protocol cycle's push, and the keys it changes.
type newCycleBatch struct {
	*strategy.Batch
	in map[int]bool
}

func (n *cycleNode) newBatch(share float64) newCycleBatch {
	diffs, in := n.diffs(share)
	return newCycleBatch{&strategy.Batch{ID: n.id(), Namespace: n.ns, Diffs: diffs, Watches: n.watches()}, in}
}

// newCycle pushes bt and, for each window whose watch overflowed, reads the
// window's keys not in the diffs. It returns the time spent in pushes.
func (n *cycleNode) newCycle(b *testing.B, bt newCycleBatch) time.Duration {
	start := time.Now()
	res := n.push(b, bt.Batch)
	took := time.Since(start)
	var reads []strategy.CounterID
	b.StopTimer() // building the batch is left out, as for the old protocol
	for w, c := range res.Changes {
		n.cursors[w] = c.Cursor
		if c.Overflow {
			reads = append(reads, n.reads(cycleWindows[w], bt.in)...)
		}
	}
	b.StartTimer()
	if len(reads) > 0 {
		start = time.Now()
		n.push(b, &strategy.Batch{ID: n.id(), Namespace: n.ns, Reads: reads})
		took += time.Since(start)
	}
	return took
}

// BenchmarkChangeLogCost is what the change log adds to a push: pushes of
// rows diffs to existing counters, each iteration one push as the store
// sends it and one without the change log's insert (the statement of the
// version before watches, otherwise the same), on two namespaces of one
// table; both times and their ratio are reported.
//
//	go test -run '^$' -bench ChangeLogCost -benchtime=10x -count=5 ./strategy/postgres/ | tee log.txt
//	benchstat log.txt
func BenchmarkChangeLogCost(b *testing.B) {
	pool := newPool(b, testDSN(b))
	logged := newStore(b, pool, Options{})
	bare := newStore(b, pool, Options{Table: logged.opts.Table})
	// The change log's common table expression, "lg AS (...)", before "bu".
	lo, hi := strings.Index(bare.pushSQL, "lg AS ("), strings.Index(bare.pushSQL, "), bu AS (")
	require.True(b, lo > 0 && hi > lo)
	bare.pushSQL = bare.pushSQL[:lo] + "lg AS (SELECT 1" + bare.pushSQL[hi:]
	require.NotContains(b, bare.pushSQL, "INSERT INTO "+logged.changes)
	for _, rows := range []int{10_000, 100_000} {
		b.Run(fmt.Sprintf("rows=%s", count(rows)), func(b *testing.B) {
			batch := func(s *Store, ns string, i int) *strategy.Batch {
				diffs := make([]strategy.Diff, rows)
				for j := range diffs {
					diffs[j] = diff(fmt.Sprintf("user-%08d", j), time.Minute, base, 1)
				}
				return &strategy.Batch{ID: fmt.Sprintf("%s-%d-%d", ns, time.Now().UnixNano(), i), Namespace: ns, Diffs: diffs}
			}
			ctx := context.Background()
			for _, s := range []*Store{logged, bare} { // the counters exist
				_, err := s.PushDiffs(ctx, batch(s, fmt.Sprint("log-", s == logged, rows), -1))
				require.NoError(b, err)
			}
			var with, without time.Duration
			for i := 0; b.Loop(); i++ {
				for _, s := range []*Store{logged, bare} {
					b.StopTimer()
					bt := batch(s, fmt.Sprint("log-", s == logged, rows), i)
					b.StartTimer()
					start := time.Now()
					_, err := s.PushDiffs(ctx, bt)
					require.NoError(b, err)
					if s == logged {
						with += time.Since(start)
					} else {
						without += time.Since(start)
					}
				}
			}
			n := float64(b.N)
			b.ReportMetric(float64(with.Microseconds())/1000/n, "logged-ms/push")
			b.ReportMetric(float64(without.Microseconds())/1000/n, "bare-ms/push")
			b.ReportMetric(float64(with)/float64(without), "logged/bare")
		})
	}
}
