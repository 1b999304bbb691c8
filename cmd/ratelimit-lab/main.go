// Command ratelimit-lab runs a simulated cluster of rate-limiter nodes (one
// registry per node, in one process) against a store, drives traffic through
// Allow and reports what the configuration costs and buys: checks/s, check
// latency, store traffic, memory per key, and accuracy against an exact
// sliding-log (or fixed-window) limiter fed the same hits.
//
// With no flags it runs 4 nodes on the in-process memory store for 10 s of
// wall time; no server is needed:
//
//	go run ./cmd/ratelimit-lab
//	go run ./cmd/ratelimit-lab -clock sim -nodes 8 -sync-rate 1s -limit 100/1s -load 2 -duration 2m
//	go run ./cmd/ratelimit-lab -strategy redis -sync-rate 0 -rate max -duration 5s
//	go run ./cmd/ratelimit-lab -clock sim -sweep-nodes 1,2,4,8,16 -sweep-sync 10ms,100ms,1s,10s -out out/
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
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "ratelimit-lab:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("ratelimit-lab", flag.ContinueOnError)
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
	mode := fs.String("mode", "sliding", "algorithm: sliding or fixed window")
	fs.IntVar(&cfg.Workers, "workers", 0, "goroutines sending checks (wall clock); default GOMAXPROCS, 32 in synchronous mode")
	fs.Uint64Var(&cfg.Seed, "seed", 1, "random seed")
	fs.IntVar(&cfg.MaxRecords, "max-records", 20_000_000, "most hits recorded for the accuracy analysis (16 bytes each)")
	out := fs.String("out", "", "directory for JSON, CSV and plots (created if missing)")
	format := fs.String("plot-format", "svg", "plot format: svg or png")
	prog := fs.Bool("progress", false, "print a progress line every second (stderr)")
	sweepNodes := fs.String("sweep-nodes", "", "comma-separated node counts: run once per node count and -sweep-sync value")
	sweepSync := fs.String("sweep-sync", "", "comma-separated SyncRates for the sweep (default 10ms,100ms,1s,10s)")
	suite := fs.Bool("throughput-suite", false, "run unpaced wall-clock checks in local, async (memory, redis, postgres) and synchronous (redis, postgres) modes, one after another, with -nodes, -keys, -duration and -limit; print one table and plot their latencies together")
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
	if cfg.Fixed, err = either("mode", *mode, "sliding", "fixed"); err != nil {
		return err
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
	if *suite {
		return throughputSuite(ctx, cfg, *out, *format)
	}
	if *sweepNodes != "" || *sweepSync != "" {
		return sweep(ctx, cfg, *sweepNodes, *sweepSync, *out, *format)
	}
	res, err := lab.Run(ctx, cfg)
	if *prog {
		fmt.Fprintln(os.Stderr)
	}
	if err != nil {
		return err
	}
	report.Table(os.Stdout, res)
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

func sweep(ctx context.Context, base lab.Config, nodesFlag, syncFlag, out, format string) error {
	if nodesFlag == "" {
		nodesFlag = "1,2,4,8,16"
	}
	if syncFlag == "" {
		syncFlag = "10ms,100ms,1s,10s"
	}
	var nodes []int
	for s := range strings.SplitSeq(nodesFlag, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			return fmt.Errorf("-sweep-nodes: %q is not a positive integer", s)
		}
		nodes = append(nodes, n)
	}
	var rates []time.Duration
	for s := range strings.SplitSeq(syncFlag, ",") {
		d, err := time.ParseDuration(strings.TrimSpace(s))
		if err != nil {
			return fmt.Errorf("-sweep-sync: %w", err)
		}
		rates = append(rates, d)
	}
	base.Progress = nil
	rs, err := lab.Sweep(ctx, base, nodes, rates, func(c lab.Config) {
		fmt.Fprintf(os.Stderr, "running %d nodes, sync-rate %v\n", c.Nodes, c.SyncRate)
	})
	if err != nil {
		return err
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
