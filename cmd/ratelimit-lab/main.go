// Command ratelimit-lab runs a simulated cluster of rate-limiter nodes (one
// registry per node, in one process) against a store, drives traffic through
// Allow and reports what the configuration costs and buys: checks/s, check
// latency, store traffic, memory per key, and accuracy against an exact
// limiter of the run's algorithm (sliding log, fixed window or token bucket)
// fed the same hits.
//
// The lab is a module of its own (its plotting dependencies stay out of the
// library's go.mod), so run it from its directory:
//
//	cd cmd/ratelimit-lab
//	go run .
//	go run . -clock sim -nodes 8 -sync-rate 1s -limit 100/1s -load 2 -duration 2m
//	go run . -strategy redis -sync-rate 0 -rate max -duration 5s
//	go run . -clock sim -sweep-nodes 1,2,4,8,16 -sweep-sync 10ms,100ms,1s,10s -out out/
//	go run . -clock sim -algorithm token_bucket -burst 20 -sync-rate 0
//	go run . -clock sim -sweep-nodes 4 -sweep-sync 10ms,100ms,1s -sweep-algorithms sliding_window,token_bucket
//	go run . -fleet -strategy redis -redis-addr 127.0.0.1:6392 -fleet-rate 5000 -duration 60s -warmup 5s
//
// With no flags it runs 4 nodes on the in-process memory store for 10 s of
// wall time; no server is needed.
//
// -clock sim runs on an injected clock that the generator advances, syncing
// every node at each SyncRate boundary of that clock: accuracy figures are
// reproducible for a seed and cost no waiting. -clock wall (the default) is
// for throughput and latency. See docs/benchmarks.md.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/ratesync/ratelimit"
	"github.com/ratesync/ratelimit/cmd/ratelimit-lab/internal/lab"
	"github.com/ratesync/ratelimit/cmd/ratelimit-lab/internal/report"
)

// limitsFlag collects repeated -limit flags.
type limitsFlag []lab.Limit

func (l *limitsFlag) String() string {
	var s []string
	for _, x := range *l {
		s = append(s, x.String())
	}
	return strings.Join(s, ",")
}

func (l *limitsFlag) Set(v string) error {
	for part := range strings.SplitSeq(v, ",") {
		x, err := lab.ParseLimit(strings.TrimSpace(part))
		if err != nil {
			return err
		}
		*l = append(*l, x)
	}
	return nil
}

func main() {
	os.Exit(exitCode(run(os.Args[1:])))
}

// exitCode is 0 for success and for -h (the usage was asked for, and
// printed), 1 for an error, which it prints.
func exitCode(err error) int {
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	}
	fmt.Fprintln(os.Stderr, "ratelimit-lab:", err)
	return 1
}

func run(args []string) error {
	fs := flag.NewFlagSet("ratelimit-lab", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `Usage: ratelimit-lab [flags]

Runs a simulated cluster of rate-limiter nodes against a store, drives
traffic through Allow, and prints checks/s, latency, store traffic and the
accuracy against an exact limiter fed the same hits, with a legend. With no
flags: 4 nodes on the in-process memory store for 10 s; no server needed.
See docs/benchmarks.md.

Flags:
`)
		fs.PrintDefaults()
	}
	var cfg lab.Config
	var limits limitsFlag
	fs.IntVar(&cfg.Nodes, "nodes", 4, "nodes (registries) sharing the store")
	fs.StringVar(&cfg.Strategy, "strategy", "memory", "store: memory, redis or postgres")
	fs.StringVar(&cfg.RedisAddr, "redis-addr", "127.0.0.1:6379", "Redis address (-strategy redis)")
	fs.StringVar(&cfg.PostgresDSN, "postgres-dsn", "postgres://postgres@127.0.0.1:5432/test", "PostgreSQL DSN (-strategy postgres)")
	fs.DurationVar(&cfg.SyncRate, "sync-rate", 100*time.Millisecond, "SyncRate: > 0 async, 0 synchronous (write-through), < 0 local only")
	fs.DurationVar(&cfg.SyncTimeout, "sync-timeout", 0, "the nodes' SyncTimeout, the bound on each store call (0: the core's default, 1s)")
	fs.Var(&limits, "limit", "limit MAX/WINDOW, e.g. 100/1s; repeat (or comma-separate) for several (default 100/1s)")
	fs.DurationVar(&cfg.Duration, "duration", 10*time.Second, "traffic duration (simulated time with -clock sim)")
	fs.DurationVar(&cfg.Warmup, "warmup", 0, "leave the first part of the run out of the accuracy figures (its hits still fill the reference windows)")
	fs.IntVar(&cfg.Keys, "keys", 100, "distinct keys")
	fs.StringVar(&cfg.Dist, "dist", "uniform", "key distribution: uniform or zipf")
	fs.Float64Var(&cfg.ZipfS, "zipf-s", 1.1, "Zipf exponent (> 1)")
	fs.StringVar(&cfg.LB, "lb", "round-robin", "load balancing: round-robin, random or hash (by key)")
	rate := fs.String("rate", "", `offered hits/s per key (mean), or "max" for unpaced checks as fast as the workers go; default: -load`)
	fs.Float64Var(&cfg.Load, "load", 1.5, "offered rate per key relative to the first limit (0.9 = 90% of it), when -rate is not set")
	arrival := fs.String("arrival", "even", "arrivals per key: even (every 1/rate, random phase) or poisson")
	clock := fs.String("clock", "wall", "wall (real time) or sim (simulated clock, explicit syncs, deterministic)")
	mode := fs.String("mode", "", "old name for -algorithm: sliding (sliding_window) or fixed (fixed_window)")
	fs.StringVar(&cfg.Algorithm, "algorithm", "sliding_window", "every limit's algorithm: sliding_window, fixed_window, token_bucket (= gcra) or sliding_log (local or synchronous mode only: -sync-rate < 0 or 0)")
	fs.Int64Var(&cfg.Burst, "burst", 0, "token bucket capacity (-algorithm token_bucket); 0 means the limit's MAX")
	fs.IntVar(&cfg.Workers, "workers", 0, "goroutines sending checks (wall clock); default GOMAXPROCS, 32 in synchronous mode")
	fs.Uint64Var(&cfg.Seed, "seed", 1, "random seed")
	fs.IntVar(&cfg.MaxRecords, "max-records", 20_000_000, "most hits recorded for the accuracy analysis (16 bytes each)")
	out := fs.String("out", "", "directory for JSON, CSV and plots (created if missing)")
	format := fs.String("plot-format", "svg", "plot format: svg or png")
	prog := fs.Bool("progress", false, "print a progress line every second (stderr)")
	sweepNodes := fs.String("sweep-nodes", "", "comma-separated node counts: run once per node count and -sweep-sync value")
	sweepSync := fs.String("sweep-sync", "", "comma-separated SyncRates for the sweep (default 10ms,100ms,1s,10s)")
	sweepAlgs := fs.String("sweep-algorithms", "", "comma-separated algorithms: run the -sweep-nodes x -sweep-sync sweep once per algorithm and plot them together (e.g. sliding_window,token_bucket)")
	suite := fs.Bool("throughput-suite", false, "run unpaced wall-clock checks in local, async (memory, redis, postgres) and synchronous (redis, postgres) modes, one after another, with -nodes, -keys, -duration and -limit; print one table and plot their latencies together")
	fleet := fs.Bool("fleet", false, "the fleet scenario (seed 002, scaled): -fleet-keys keys on one store, Zipf (most idle, a few hot), Poisson, periodic sync, limit 100/1m unless -limit; run once per -fleet-nodes count; report store CPU/s (Redis INFO cpu), sync cycle times and over-admission. Use a Redis of its own (-strategy redis -redis-addr)")
	fleetNodes := fs.String("fleet-nodes", "2,4,8,16", "comma-separated node counts for -fleet")
	fleetKeys := fs.Int("fleet-keys", 1_000_000, "keys for -fleet")
	fleetRate := fs.Float64("fleet-rate", 20_000, "offered hits/s over all keys for -fleet")
	memKeys := fs.Int("memkeys", 0, "measure heap per tracked key over this many keys (local and async namespaces) and exit")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if len(limits) == 0 {
		limits = limitsFlag{{Window: time.Second, Max: 100}}
	}
	cfg.Limits = limits
	switch *rate {
	case "":
	case "max":
		cfg.Unpaced = true
	default:
		r, err := strconv.ParseFloat(*rate, 64)
		if err != nil || r <= 0 {
			return fmt.Errorf("-rate %q: want a positive number or max", *rate)
		}
		cfg.Rate = r
	}
	var err error
	if cfg.Poisson, err = either("arrival", *arrival, "even", "poisson"); err != nil {
		return err
	}
	if cfg.Simulated, err = either("clock", *clock, "wall", "sim"); err != nil {
		return err
	}
	if *mode != "" {
		fixed, err := either("mode", *mode, "sliding", "fixed")
		if err != nil {
			return err
		}
		set := false
		fs.Visit(func(f *flag.Flag) { set = set || f.Name == "algorithm" })
		if set {
			return errors.New("-mode and -algorithm: give one (-mode is the old name)")
		}
		cfg.Algorithm = "sliding_window"
		if fixed {
			cfg.Algorithm = "fixed_window"
		}
	}
	if *format != "svg" && *format != "png" {
		return fmt.Errorf("-plot-format %q: want svg or png", *format)
	}
	if *prog {
		cfg.Progress = func(s string) { fmt.Fprintf(os.Stderr, "\r%s   ", s) }
	}
	if *out != "" {
		if err := os.MkdirAll(*out, 0o755); err != nil {
			return err
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()

	if *memKeys > 0 {
		return measureMemory(*memKeys, cfg.Limits, *out)
	}
	if *fleet {
		limitSet := false
		fs.Visit(func(f *flag.Flag) { limitSet = limitSet || f.Name == "limit" })
		if !limitSet {
			cfg.Limits = nil
		}
		return runFleet(ctx, cfg, *fleetNodes, *fleetKeys, *fleetRate, *out, *format)
	}
	if *suite {
		return throughputSuite(ctx, cfg, *out, *format)
	}
	if *sweepNodes != "" || *sweepSync != "" || *sweepAlgs != "" {
		return sweep(ctx, cfg, *sweepNodes, *sweepSync, *sweepAlgs, *out, *format)
	}
	res, err := lab.Run(ctx, cfg)
	if *prog {
		fmt.Fprintln(os.Stderr)
	}
	if err != nil {
		return err
	}
	report.Table(os.Stdout, res)
	report.Legend(os.Stdout)
	if *out == "" {
		return nil
	}
	return errors.Join(
		report.WriteJSON(*out, "result.json", res),
		report.WriteCSV(*out, "summary.csv", report.SummaryHeader, [][]string{report.SummaryRow(res)}),
		report.WriteCSV(*out, "windows.csv", report.WindowHeader, report.WindowRows(res)),
		report.WriteCSV(*out, "latency.csv", []string{"latency_ns_at_most", "count"}, report.LatencyRows(res)),
		report.PlotWindows(res, filepath.Join(*out, "admitted."+*format)),
		report.PlotLatency([]*lab.Result{res}, []string{report.Describe(res.Config)}, filepath.Join(*out, "latency."+*format)),
	)
}

// either reads v, the value of flag -name, which is off or on.
func either(name, v, off, on string) (bool, error) {
	switch v {
	case off:
		return false, nil
	case on:
		return true, nil
	}
	return false, fmt.Errorf("-%s %q: want %s or %s", name, v, off, on)
}

func sweep(ctx context.Context, base lab.Config, nodesFlag, syncFlag, algsFlag, out, format string) error {
	if nodesFlag == "" {
		nodesFlag = "1,2,4,8,16"
	}
	if syncFlag == "" {
		syncFlag = "10ms,100ms,1s,10s"
	}
	nodes, err := parseNodes("-sweep-nodes", nodesFlag)
	if err != nil {
		return err
	}
	var rates []time.Duration
	for s := range strings.SplitSeq(syncFlag, ",") {
		d, err := time.ParseDuration(strings.TrimSpace(s))
		if err != nil {
			return fmt.Errorf("-sweep-sync: %w", err)
		}
		rates = append(rates, d)
	}
	algs := []string{base.Algorithm}
	if algsFlag != "" {
		algs = nil
		for s := range strings.SplitSeq(algsFlag, ",") {
			if _, err := ratelimit.ParseAlgorithm(strings.TrimSpace(s)); err != nil {
				return fmt.Errorf("-sweep-algorithms: %w", err)
			}
			algs = append(algs, strings.TrimSpace(s))
		}
	}
	base.Progress = nil
	var rs []*lab.Result
	for _, alg := range algs {
		c := base
		c.Algorithm = alg
		if alg != "token_bucket" && alg != "gcra" {
			c.Burst = 0 // -burst is the bucket's alone
		}
		r, err := lab.Sweep(ctx, c, nodes, rates, func(c lab.Config) {
			fmt.Fprintf(os.Stderr, "running %s, %d nodes, sync-rate %v\n", alg, c.Nodes, c.SyncRate)
		})
		if err != nil {
			return fmt.Errorf("%s: %w", alg, err)
		}
		rs = append(rs, r...)
	}
	fmt.Println(report.Describe(rs[0].Config))
	report.SweepTable(os.Stdout, rs)
	if out == "" {
		return nil
	}
	var rows [][]string
	for _, r := range rs {
		rows = append(rows, report.SummaryRow(r))
	}
	return errors.Join(
		report.WriteJSON(out, "sweep.json", rs),
		report.WriteCSV(out, "sweep.csv", report.SummaryHeader, rows),
		report.PlotSweep(rs, filepath.Join(out, "sweep."+format)),
	)
}

// parseNodes reads a comma-separated list of node counts.
func parseNodes(name, v string) ([]int, error) {
	var nodes []int
	for s := range strings.SplitSeq(v, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("%s: %q is not a positive integer", name, s)
		}
		nodes = append(nodes, n)
	}
	return nodes, nil
}

func runFleet(ctx context.Context, base lab.Config, nodesFlag string, keys int, total float64, out, format string) error {
	nodes, err := parseNodes("-fleet-nodes", nodesFlag)
	if err != nil {
		return err
	}
	if keys < 1 || total <= 0 {
		return errors.New("-fleet-keys and -fleet-rate: must be positive")
	}
	lab.FleetDefaults(&base, keys, total)
	base.Progress = nil
	rs, err := lab.Fleet(ctx, base, nodes, func(c lab.Config) {
		fmt.Fprintf(os.Stderr, "running the fleet on %d nodes\n", c.Nodes)
	})
	if err != nil {
		return err
	}
	fmt.Println(report.Describe(rs[0].Config))
	report.FleetTable(os.Stdout, rs)
	if out == "" {
		return nil
	}
	var rows [][]string
	for _, r := range rs {
		rows = append(rows, report.FleetRow(r))
	}
	return errors.Join(
		report.WriteCSV(out, "fleet.csv", report.FleetHeader, rows),
		report.PlotFleet(rs, filepath.Join(out, "fleet."+format)),
	)
}

func measureMemory(n int, limits []lab.Limit, out string) error {
	var windows []time.Duration
	for _, l := range limits {
		windows = append(windows, l.Window)
	}
	var rs []*lab.MemoryResult
	for _, async := range []bool{false, true} {
		r, err := lab.MeasureMemory(n, windows, async)
		if err != nil {
			return err
		}
		fmt.Printf("%s namespace, windows %v: %d keys tracked, heap +%d B, %.1f B/key\n", r.Mode, r.Windows, r.TrackedKeys, r.HeapBytes, r.BytesPerKey)
		rs = append(rs, r)
	}
	if out == "" {
		return nil
	}
	return report.WriteJSON(out, "memory.json", rs)
}

// suiteRuns are the modes the throughput suite compares.
var suiteRuns = []struct {
	label, strategy string
	syncRate        time.Duration
}{
	{"local", "memory", -1},
	{"async memory 100ms", "memory", 100 * time.Millisecond},
	{"async redis 100ms", "redis", 100 * time.Millisecond},
	{"async postgres 100ms", "postgres", 100 * time.Millisecond},
	{"sync redis", "redis", 0},
	{"sync postgres", "postgres", 0},
}

func throughputSuite(ctx context.Context, base lab.Config, out, format string) error {
	base.Unpaced = true
	var rs []*lab.Result
	var labels []string
	var rows [][]string
	for _, sr := range suiteRuns {
		c := base
		c.Strategy, c.SyncRate = sr.strategy, sr.syncRate
		c.Limits = append([]lab.Limit(nil), base.Limits...)
		if sr.syncRate == 0 {
			c.Workers = 0 // the synchronous default: 32 goroutines
		}
		fmt.Fprintf(os.Stderr, "running %s\n", sr.label)
		r, err := lab.Run(ctx, c)
		if err != nil {
			return fmt.Errorf("%s: %w", sr.label, err)
		}
		rs, labels = append(rs, r), append(labels, fmt.Sprintf("%s (%d workers)", sr.label, r.Config.Workers))
		rows = append(rows, report.SummaryRow(r))
	}
	report.ThroughputTable(os.Stdout, rs, labels)
	if out == "" {
		return nil
	}
	return errors.Join(
		report.WriteJSON(out, "throughput.json", rs),
		report.WriteCSV(out, "throughput.csv", report.SummaryHeader, rows),
		report.PlotLatency(rs, labels, filepath.Join(out, "latency."+format)),
	)
}
