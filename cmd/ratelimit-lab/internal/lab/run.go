package lab

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	mrand "math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ratesync/ratelimit"
	"github.com/ratesync/ratelimit/cmd/ratelimit-lab/internal/analysis"
)

// simStart is the simulated clock's origin: a fixed instant, so simulated runs
// align their windows the same way every time.
var simStart = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano()

// Latency summarises the check latency, in nanoseconds.
type Latency struct {
	P50  int64   `json:"p50_ns"`
	P90  int64   `json:"p90_ns"`
	P99  int64   `json:"p99_ns"`
	P999 int64   `json:"p999_ns"`
	Max  int64   `json:"max_ns"`
	Mean float64 `json:"mean_ns"`
}

// Store summarises the store traffic of a run. Rates are per second of run
// time (simulated time in simulated runs).
type Store struct {
	Pushes         int64   `json:"pushes"`
	PushErrors     int64   `json:"push_errors"`
	Diffs          int64   `json:"diffs"`
	Reads          int64   `json:"reads"`
	Fetches        int64   `json:"fetches"`
	Fetched        int64   `json:"fetched"`
	Takes          int64   `json:"takes"`
	BucketDiffs    int64   `json:"bucket_diffs"`
	BucketReads    int64   `json:"bucket_reads"`
	BytesSent      int64   `json:"bytes_sent"`
	BytesReceived  int64   `json:"bytes_received"`
	OpsPerSec      float64 `json:"ops_per_sec"`
	BytesPerSec    float64 `json:"bytes_per_sec"`
	CountersPerSec float64 `json:"counters_per_sec"`
	SyncErrors     int64   `json:"sync_errors"`
	// CPUSeconds is the Redis server's CPU time over the traffic (INFO cpu:
	// used_cpu_sys + used_cpu_user), CPUPerSec the same per wall second: on
	// a server the run shares with nobody, the store's cost. -1 when not
	// measured (not Redis, or INFO cpu unavailable).
	CPUSeconds       float64 `json:"cpu_seconds"`
	CPUPerSec        float64 `json:"cpu_per_sec"`
	TrackedKeys      int     `json:"tracked_keys"`
	TrackedKeysNodes []int   `json:"tracked_keys_per_node"`
}

// Accuracy compares the nodes' decisions with the exact reference limiters.
type Accuracy struct {
	// Sliding is judged against the sliding log (on milliseconds when the
	// run's algorithm is the sliding log, as the library counts it; on
	// nanoseconds otherwise); Fixed against fixed windows; Bucket, in
	// token-bucket runs only, against a token bucket (GCRA) of the same
	// rate and burst. Primary is the one matching the run's algorithm:
	// "sliding" (sliding_window, sliding_log), "fixed" or "bucket".
	Sliding analysis.Result  `json:"sliding"`
	Fixed   analysis.Result  `json:"fixed"`
	Bucket  *analysis.Result `json:"bucket,omitempty"`
	Primary string           `json:"primary"`
	// KeyRate is the mean offered rate per key, HotKeyRate the largest
	// (hits/s).
	KeyRate    float64 `json:"key_rate"`
	HotKeyRate float64 `json:"hot_key_rate"`
	// Bound is nodes x per-node rate x SyncRate for the hottest key, the
	// most a key can be over-admitted by in one window in async mode:
	// nodes that have not yet heard of each other's hits each admit at most
	// their own traffic of one sync period. The per-node rate is the key's
	// rate over the nodes it is spread on (1 node with hash balancing). 0 in
	// synchronous mode; -1 (no bound) in local mode with several nodes.
	Bound float64 `json:"bound"`
	// Recorded hits (all of them unless Partial, when only hits before
	// Cutoff were analysed).
	Recorded int64 `json:"recorded"`
	Partial  bool  `json:"partial"`
}

// Result is what Run measures.
type Result struct {
	Config    Config `json:"config"`
	Clock     string `json:"clock"` // "simulated" or "wall"
	Namespace string `json:"namespace"`
	// Wall is the wall time the traffic took; RunTime the run's own time
	// (simulated or wall).
	Wall    time.Duration `json:"wall_ns"`
	RunTime time.Duration `json:"run_time_ns"`

	Checks   int64 `json:"checks"`
	Admitted int64 `json:"admitted"`
	Degraded int64 `json:"degraded"`
	Errors   int64 `json:"errors"`
	// ChecksPerSec is checks per wall second (in simulated runs it includes
	// the syncs the generator runs inline, so it is not a throughput figure).
	ChecksPerSec     float64   `json:"checks_per_sec"`
	NodeChecks       []int64   `json:"node_checks"`
	NodeChecksPerSec []float64 `json:"node_checks_per_sec"`

	Latency  Latency             `json:"latency"`
	Sync     *SyncCycles         `json:"sync,omitempty"` // with Config.SyncCycles
	Hist     *analysis.Histogram `json:"-"`
	Store    Store               `json:"store"`
	Accuracy Accuracy            `json:"accuracy"`
}

// worker is one goroutine's share of a run.
type worker struct {
	hist       analysis.Histogram
	hits       []analysis.Hit
	limit      int   // most hits to record
	full       bool  // stopped recording: limit reached
	lastT      int64 // time of the last recorded hit
	nodeChecks []int64
	n          int64        // checks
	checks     atomic.Int64 // n, for progress, updated every 256 checks
	admitted   int64
	degraded   int64
	errors     int64
}

func (w *worker) record(h analysis.Hit) {
	if w.full {
		return
	}
	if len(w.hits) >= w.limit {
		w.full = true
		return
	}
	w.hits = append(w.hits, h)
	w.lastT = h.T
}

// cluster is a run's nodes.
type cluster struct {
	obs    *cycleObserver // with Config.SyncCycles
	sim    *simClock      // released before Close, which waits for the sync loops
	regs   []*ratelimit.Registry
	nodes  []*ratelimit.Namespace
	stores stores
	counts StoreCounts
}

func (c *cluster) close() {
	if c.sim != nil {
		c.sim.release()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, r := range c.regs {
		_ = r.Close(ctx)
	}
	c.stores.close()
}

func newCluster(ctx context.Context, cfg *Config, name string, clock func() time.Time, sim *simClock) (*cluster, error) {
	c := &cluster{stores: stores{cfg: cfg}, sim: sim}
	if cfg.SyncCycles {
		c.obs = &cycleObserver{}
	}
	windows := []time.Duration{}
	for _, l := range cfg.Limits {
		if !slices.Contains(windows, l.Window) {
			windows = append(windows, l.Window)
		}
	}
	for range cfg.Nodes {
		rc := ratelimit.Config{
			Namespace:   name,
			WindowSizes: windows,
			SyncRate:    cfg.SyncRate,
			Clock:       clock,
			MaxKeys:     max(1<<20, 2*cfg.Keys),
			SyncTimeout: cfg.SyncTimeout,
		}
		if c.obs != nil {
			rc.Observer = c.obs
		}
		if cfg.SyncRate >= 0 {
			s, err := c.stores.node(ctx, &c.counts)
			if err != nil {
				c.close()
				return nil, err
			}
			rc.Strategy = s
		}
		reg := ratelimit.NewRegistry()
		c.regs = append(c.regs, reg)
		ns, err := reg.New(rc)
		if err != nil {
			c.close()
			return nil, err
		}
		c.nodes = append(c.nodes, ns)
	}
	return c, nil
}

// keyName is the key string of key index i.
func keyName(i int) string { return "user:" + strconv.Itoa(1_000_000+i) }

// Run runs one configuration and measures it.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	if err := cfg.Normalize(); err != nil {
		return nil, err
	}
	var id [4]byte
	_, _ = rand.Read(id[:])
	res := &Result{Config: cfg, Namespace: "lab-" + hex.EncodeToString(id[:]), Clock: "wall"}
	clock := time.Now
	var sim *simClock
	if cfg.Simulated {
		res.Clock = "simulated"
		sim = newSimClock(simStart)
		clock = sim.Now
	}
	cl, err := newCluster(ctx, &cfg, res.Namespace, clock, sim)
	if err != nil {
		return nil, err
	}
	defer cl.close()
	if sim != nil {
		if cfg.SyncRate >= 0 {
			if err := sim.awaitParked(cfg.Nodes); err != nil {
				return nil, err
			}
		} else {
			// Local nodes run no loop: nothing to park, and a parked clock
			// would block the first check for ever.
			sim.parking.Store(false)
		}
	}

	keys := make([]string, cfg.Keys)
	for i := range keys {
		keys[i] = keyName(i)
	}
	rates := keyRates(cfg.Keys, cfg.Rate, cfg.Dist, cfg.ZipfS)
	limits := make([]ratelimit.Limit, len(cfg.Limits))
	for i, l := range cfg.Limits {
		limits[i] = ratelimit.Limit{Window: l.Window, Max: l.Max, Algorithm: cfg.Alg(), Burst: cfg.Burst}
	}
	// The library refuses some limits in some modes (a sliding log with a
	// periodic sync): say so before any traffic, with its error.
	if err := cl.nodes[0].CheckLimits(1, limits...); err != nil {
		return nil, fmt.Errorf("%s limits in %s mode (sync-rate %v) are refused by the library: %w", cfg.Algorithm, cfg.Mode(), cfg.SyncRate, err)
	}

	cpu0 := -1.0
	if cfg.Strategy == "redis" {
		if v, err := redisCPU(ctx, cfg.RedisAddr); err == nil {
			cpu0 = v
		}
	}
	if cl.obs != nil {
		if cfg.Simulated || cfg.Warmup == 0 {
			cl.obs.set(true)
		} else {
			// The cycles of the warm-up (dialing, loading scripts) are left
			// out, as its hits are.
			t := time.AfterFunc(cfg.Warmup, func() { cl.obs.set(true) })
			defer t.Stop()
		}
	}
	var workers []*worker
	start := time.Now()
	from := start.Add(cfg.Warmup).UnixNano()
	if cfg.Simulated {
		from = simStart + int64(cfg.Warmup)
		workers = []*worker{runSimulated(ctx, &cfg, cl, keys, rates, limits, &sim.now)}
		res.RunTime = cfg.Duration
	} else {
		workers = runWall(ctx, &cfg, cl, keys, rates, limits)
		res.RunTime = time.Since(start)
	}
	res.Wall = time.Since(start)
	if cl.obs != nil {
		cl.obs.set(false) // Close's flush is not a cycle of the run
		sc := cl.obs.summary()
		res.Sync = &sc
	}
	res.Store.CPUSeconds, res.Store.CPUPerSec = -1, -1
	if cpu0 >= 0 {
		if v, err := redisCPU(ctx, cfg.RedisAddr); err == nil {
			res.Store.CPUSeconds = v - cpu0
			res.Store.CPUPerSec = res.Store.CPUSeconds / res.Wall.Seconds()
		}
	}

	// Node state before Close flushes and forgets it.
	res.Store.TrackedKeysNodes = make([]int, len(cl.nodes))
	for i, ns := range cl.nodes {
		st := ns.Stats()
		res.Store.TrackedKeysNodes[i] = st.TrackedKeys
		res.Store.TrackedKeys += st.TrackedKeys
		res.Store.SyncErrors += st.SyncErrors
	}
	summarise(res, &cfg, workers, rates, cl, from)
	return res, nil
}

// runSimulated drives every hit from one goroutine on the simulated clock,
// syncing every node at each SyncRate boundary before the first hit after it.
func runSimulated(ctx context.Context, cfg *Config, cl *cluster, keys []string, rates []float64, limits []ratelimit.Limit, now *atomic.Int64) *worker {
	rng := mrand.New(mrand.NewPCG(cfg.Seed, 0x1ab))
	all := make([]uint32, len(keys))
	for i := range all {
		all[i] = uint32(i)
	}
	gen := newArrivals(all, rates, cfg.Poisson, rng)
	lb := newBalancer(cfg.LB, cfg.Nodes, len(keys), rng)
	w := &worker{nodeChecks: make([]int64, cfg.Nodes), limit: cfg.MaxRecords}
	end := int64(cfg.Duration)
	nextSync := int64(-1)
	if cfg.SyncRate > 0 {
		nextSync = int64(cfg.SyncRate)
	}
	rot := 0
	stopProgress := progress(cfg, func() string {
		t := time.Duration(now.Load() - simStart)
		return fmt.Sprintf("simulated %v / %v, %d checks", t.Round(time.Millisecond), cfg.Duration, w.checks.Load())
	})
	defer stopProgress()
	for {
		t, k, ok := gen.next()
		if !ok || t >= end || ctx.Err() != nil {
			break
		}
		for nextSync >= 0 && nextSync <= t {
			now.Store(simStart + nextSync)
			// Every node syncs at the boundary; the order rotates so no node
			// is always the one that learns least.
			for range max(1, cfg.SyncPasses) {
				for i := range cl.nodes {
					_ = cl.nodes[(i+rot)%len(cl.nodes)].Sync(ctx)
				}
			}
			rot++
			nextSync += int64(cfg.SyncRate)
		}
		now.Store(simStart + t)
		n := lb.pick(k)
		check(ctx, w, cl.nodes[n], n, keys[k], k, simStart+t, limits)
	}
	return w
}

// check runs one Allow and records it.
func check(ctx context.Context, w *worker, ns *ratelimit.Namespace, node int, key string, k uint32, t int64, limits []ratelimit.Limit) {
	s := time.Now()
	d, err := ns.Allow(ctx, key, 1, limits...)
	lat := time.Since(s)
	if t == 0 {
		t = s.UnixNano()
	}
	w.hist.Record(int64(lat))
	w.nodeChecks[node]++
	h := analysis.Hit{T: t, Key: k, Node: uint16(node)}
	switch {
	case err != nil:
		h.Flags = analysis.Failed
		w.errors++
	case d.Allowed:
		h.Flags = analysis.Allowed
		w.admitted++
	}
	if d.Degraded {
		h.Flags |= analysis.Degraded
		w.degraded++
	}
	w.record(h)
	if w.n++; w.n&255 == 1 {
		w.checks.Store(w.n)
	}
}

// runWall drives checks from cfg.Workers goroutines on the wall clock. Paced,
// worker i owns the keys k with k mod Workers == i and sends each hit at its
// scheduled time (late hits go at once); unpaced, every worker sends checks
// back to back, drawing keys from the distribution.
func runWall(ctx context.Context, cfg *Config, cl *cluster, keys []string, rates []float64, limits []ratelimit.Limit) []*worker {
	ws := make([]*worker, cfg.Workers)
	for i := range ws {
		ws[i] = &worker{nodeChecks: make([]int64, cfg.Nodes), limit: max(1, cfg.MaxRecords/cfg.Workers)}
	}
	start := time.Now()
	end := start.Add(cfg.Duration)
	stopProgress := progress(cfg, func() string {
		var n int64
		for _, w := range ws {
			n += w.checks.Load()
		}
		el := time.Since(start)
		return fmt.Sprintf("%v / %v, %d checks, %.0f checks/s", el.Round(time.Second), cfg.Duration, n, float64(n)/el.Seconds())
	})
	defer stopProgress()
	var wg sync.WaitGroup
	for wi, w := range ws {
		wg.Go(func() {
			rng := mrand.New(mrand.NewPCG(cfg.Seed, uint64(wi)+1))
			lb := newBalancer(cfg.LB, cfg.Nodes, len(keys), rng)
			if cfg.Unpaced {
				var zipf *mrand.Zipf
				if cfg.Dist == "zipf" && len(keys) > 1 {
					zipf = mrand.NewZipf(rng, cfg.ZipfS, 1, uint64(len(keys)-1))
				}
				for i := 0; ; i++ {
					if i&63 == 0 && (time.Now().After(end) || ctx.Err() != nil) {
						return
					}
					k := uint32(rng.IntN(len(keys)))
					if zipf != nil {
						k = uint32(zipf.Uint64())
					}
					n := lb.pick(k)
					check(ctx, w, cl.nodes[n], n, keys[k], k, 0, limits)
				}
			}
			var mine []uint32
			for k := wi; k < len(keys); k += cfg.Workers {
				mine = append(mine, uint32(k))
			}
			gen := newArrivals(mine, rates, cfg.Poisson, rng)
			for {
				t, k, ok := gen.next()
				if !ok || t >= int64(cfg.Duration) || ctx.Err() != nil {
					return
				}
				if d := time.Until(start.Add(time.Duration(t))); d > 0 {
					time.Sleep(d) // pacing the offered load, not waiting for logic
				}
				n := lb.pick(k)
				check(ctx, w, cl.nodes[n], n, keys[k], k, 0, limits)
			}
		})
	}
	wg.Wait()
	return ws
}

// progress prints line() every second through cfg.Progress until stopped.
func progress(cfg *Config, line func() string) (stop func()) {
	if cfg.Progress == nil {
		return func() {}
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				cfg.Progress(line())
			}
		}
	})
	return func() { close(done); wg.Wait() }
}

// summarise merges the workers' measurements into res.
func summarise(res *Result, cfg *Config, ws []*worker, rates []float64, cl *cluster, from int64) {
	res.Hist = &analysis.Histogram{}
	res.NodeChecks = make([]int64, cfg.Nodes)
	var hits []analysis.Hit
	cutoff := int64(1<<63 - 1)
	for _, w := range ws {
		res.Hist.Merge(&w.hist)
		for i, c := range w.nodeChecks {
			res.NodeChecks[i] += c
			res.Checks += c
		}
		res.Admitted += w.admitted
		res.Degraded += w.degraded
		res.Errors += w.errors
		if w.full {
			cutoff = min(cutoff, w.lastT)
		}
	}
	for _, w := range ws {
		for _, h := range w.hits {
			if h.T < cutoff {
				hits = append(hits, h)
			}
		}
		w.hits = nil
	}
	wall := res.Wall.Seconds()
	res.ChecksPerSec = float64(res.Checks) / wall
	res.NodeChecksPerSec = make([]float64, cfg.Nodes)
	for i, c := range res.NodeChecks {
		res.NodeChecksPerSec[i] = float64(c) / wall
	}
	h := res.Hist
	res.Latency = Latency{P50: h.Quantile(0.5), P90: h.Quantile(0.9), P99: h.Quantile(0.99), P999: h.Quantile(0.999), Max: h.Max(), Mean: h.Mean()}

	c := &cl.counts
	st := &res.Store
	st.Pushes, st.PushErrors = c.Pushes.Load(), c.PushErrors.Load()
	st.Diffs, st.Reads = c.Diffs.Load(), c.Reads.Load()
	st.Fetches, st.Fetched = c.Fetches.Load(), c.Fetched.Load()
	st.Takes, st.BucketDiffs, st.BucketReads = c.Takes.Load(), c.BucketDiffs.Load(), c.BucketReads.Load()
	st.BytesSent, st.BytesReceived = c.BytesSent.Load(), c.BytesReceived.Load()
	rt := res.RunTime.Seconds()
	st.OpsPerSec = float64(st.Pushes+st.Fetches+c.Windows.Load()+st.Takes) / rt
	st.BytesPerSec = float64(st.BytesSent+st.BytesReceived) / rt
	st.CountersPerSec = float64(st.Diffs+st.Reads+st.Fetched+st.BucketDiffs+st.BucketReads) / rt

	acc := &res.Accuracy
	acc.Recorded = int64(len(hits))
	acc.Partial = cutoff != int64(1<<63-1)
	limits := make([]analysis.Limit, len(cfg.Limits))
	for i, l := range cfg.Limits {
		limits[i] = analysis.Limit{Window: int64(l.Window), Max: l.Max}
	}
	var res0 int64 // the sliding log's resolution: ns, or ms as the library's log counts
	if cfg.Alg() == ratelimit.SlidingLog {
		res0 = int64(time.Millisecond)
	}
	acc.Sliding = analysis.Analyze(hits, analysis.Options{Limits: limits, SeriesKey: 0, From: from, Resolution: res0})
	acc.Fixed = analysis.Analyze(hits, analysis.Options{Limits: limits, Fixed: true, SeriesKey: 0, From: from})
	acc.Primary = "sliding"
	switch cfg.Alg() {
	case ratelimit.FixedWindow:
		acc.Primary = "fixed"
	case ratelimit.TokenBucket:
		for i := range limits {
			limits[i].Burst = cfg.Burst
		}
		b := analysis.Analyze(hits, analysis.Options{Limits: limits, Kind: analysis.TokenBucket, SeriesKey: 0, From: from})
		acc.Bucket, acc.Primary = &b, "bucket"
	}
	acc.KeyRate = cfg.Rate
	acc.HotKeyRate = slices.Max(rates)
	if cfg.Unpaced {
		acc.KeyRate, acc.HotKeyRate = 0, 0
		if len(hits) > 0 {
			acc.KeyRate = float64(res.Checks) / float64(cfg.Keys) / rt
		}
	}
	switch {
	case cfg.SyncRate > 0:
		// Nodes x per-node rate is the key's rate, whatever it is spread on.
		acc.Bound = acc.HotKeyRate * cfg.SyncRate.Seconds()
	case cfg.SyncRate == 0 || cfg.Nodes == 1 || cfg.LB == "hash":
		acc.Bound = 0
	default:
		acc.Bound = -1
	}
}

// PrimaryAccuracy returns the accuracy result of the run's algorithm.
func (r *Result) PrimaryAccuracy() *analysis.Result {
	switch {
	case r.Accuracy.Primary == "bucket" && r.Accuracy.Bucket != nil:
		return r.Accuracy.Bucket
	case r.Config.Fixed:
		return &r.Accuracy.Fixed
	}
	return &r.Accuracy.Sliding
}

// AccuracyView is an analysis.Result with its derived ratios.
type AccuracyView struct {
	*analysis.Result
	// AdmittedRatio is Admitted / RefAdmitted: above 1 the nodes admitted
	// more than an exact limiter would have, below 1 less.
	AdmittedRatio       float64
	FalseRejectionRate  float64
	ExcessAdmissionRate float64
}

// View returns r with its ratios.
func View(r *analysis.Result) *AccuracyView {
	v := &AccuracyView{Result: r, FalseRejectionRate: r.FalseRejectionRate(), ExcessAdmissionRate: r.ExcessAdmissionRate()}
	if r.RefAdmitted > 0 {
		v.AdmittedRatio = float64(r.Admitted) / float64(r.RefAdmitted)
	}
	return v
}
