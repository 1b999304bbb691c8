// Package report prints the lab's results as tables and writes them as JSON,
// CSV and plots.
package report

import (
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/ratesync/ratelimit/cmd/ratelimit-lab/internal/lab"
)

// ns formats nanoseconds for a table.
func ns(v int64) string {
	d := time.Duration(v)
	switch {
	case d < time.Microsecond:
		return fmt.Sprintf("%dns", v)
	case d < time.Millisecond:
		return fmt.Sprintf("%.1fµs", float64(v)/1e3)
	}
	return fmt.Sprintf("%.2fms", float64(v)/1e6)
}

func pct(f float64) string { return strconv.FormatFloat(100*f, 'f', 4, 64) + "%" }

// Describe returns a one-line description of a run's configuration.
func Describe(c lab.Config) string {
	var limits []string
	for _, l := range c.Limits {
		limits = append(limits, l.String())
	}
	mode := c.Algorithm
	switch {
	case mode == "":
		mode = "sliding_window"
		if c.Fixed {
			mode = "fixed_window"
		}
	case c.Burst > 0:
		mode += fmt.Sprintf(" burst %d", c.Burst)
	}
	load := fmt.Sprintf("%.4g hits/s per key (load %.2f)", c.Rate, c.Load)
	if c.Unpaced {
		load = fmt.Sprintf("unpaced, %d workers", c.Workers)
	}
	arr := "even"
	if c.Poisson {
		arr = "poisson"
	}
	return fmt.Sprintf("%d nodes, %s, %s sync-rate %v, limit %s %s, %d keys %s, lb %s, %s, %s arrivals",
		c.Nodes, c.Strategy, c.Mode(), c.SyncRate, strings.Join(limits, "+"), mode, c.Keys, c.Dist, c.LB, load, arr)
}

// Table writes a readable summary of one run.
func Table(w io.Writer, r *lab.Result) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	p := func(k, format string, a ...any) { fmt.Fprintf(tw, "%s\t"+format+"\n", append([]any{k}, a...)...) }
	p("run", "%s", Describe(r.Config))
	p("clock", "%s, %v of traffic in %v wall", r.Clock, r.RunTime.Round(time.Millisecond), r.Wall.Round(time.Millisecond))
	p("checks", "%d (%d admitted, %d degraded, %d errors)", r.Checks, r.Admitted, r.Degraded, r.Errors)
	p("checks/s (wall)", "%.0f total; per node %s", r.ChecksPerSec, perNode(r.NodeChecksPerSec))
	l := r.Latency
	p("check latency", "p50 %s  p90 %s  p99 %s  p99.9 %s  max %s  mean %s", ns(l.P50), ns(l.P90), ns(l.P99), ns(l.P999), ns(l.Max), ns(int64(l.Mean)))
	s := r.Store
	p("store", "%d pushes (%d failed), %d diffs, %d reads, %d fetches (%d counters); %.1f ops/s, %.0f counters/s, ~%.0f B/s",
		s.Pushes, s.PushErrors, s.Diffs, s.Reads, s.Fetches, s.Fetched, s.OpsPerSec, s.CountersPerSec, s.BytesPerSec)
	p("tracked keys", "%d over all nodes (%s per node); %d sync errors", s.TrackedKeys, perNodeInt(s.TrackedKeysNodes), s.SyncErrors)
	a := r.Accuracy
	if r.Config.Warmup > 0 {
		p("accuracy", "after a warm-up of %v", r.Config.Warmup)
	}
	if a.Partial {
		p("accuracy", "on the first %d recorded hits only (MaxRecords)", a.Recorded)
	}
	limit := r.Config.Limits[0]
	type ref struct {
		name, window string
		v            *lab.AccuracyView
	}
	refs := []ref{
		{"vs sliding log", "trailing window (t-W, t]", lab.View(&a.Sliding)},
		{"vs fixed window", "aligned window", lab.View(&a.Fixed)},
	}
	if a.Bucket != nil {
		refs = append([]ref{{"vs token bucket", "", lab.View(a.Bucket)}}, refs...)
	}
	for _, ref := range refs {
		v := ref.v
		p(ref.name, "admitted %d; an exact limiter admits %d of the same hits: ratio %.4f", v.Admitted, v.RefAdmitted, v.AdmittedRatio)
		if ref.window == "" {
			burst := r.Config.Burst
			if burst == 0 {
				burst = limit.Max
			}
			p("", "false rejections %d (%s of hits): rejected although the bucket (burst %d, %d per %v), fed the admitted hits, held a token",
				v.FalseRejections, pct(v.FalseRejectionRate), burst, limit.Max, limit.Window)
			p("", "excess admissions %d (%s of hits): admitted although that bucket was empty", v.ExcessAdmissions, pct(v.ExcessAdmissionRate))
			p("", "overdrawn per window: at most %d tokens, %.3f on average; %d of %d key-windows overdrew",
				v.MaxOver, v.MeanOver, v.WindowsOver, v.Windows)
			continue
		}
		p("", "false rejections %d (%s of hits): rejected although the %s held fewer than %d admitted hits",
			v.FalseRejections, pct(v.FalseRejectionRate), ref.window, limit.Max)
		p("", "excess admissions %d (%s of hits): admitted although the %s already held %d admitted hits",
			v.ExcessAdmissions, pct(v.ExcessAdmissionRate), ref.window, limit.Max)
		p("", "over the limit per window: at most %d hits, %.3f on average; %d of %d key-windows went over",
			v.MaxOver, v.MeanOver, v.WindowsOver, v.Windows)
	}
	switch {
	case a.Bound > 0:
		p("bound", "%.1f hits per window: nodes x per-node rate x SyncRate (hottest key %.4g hits/s), the most one key should go over its limit in one window; up to twice that at window boundaries", a.Bound, a.HotKeyRate)
	case a.Bound == 0:
		p("bound", "0 (synchronous, or each key on one node)")
	default:
		p("bound", "none (local mode: nodes share nothing)")
	}
	tw.Flush()
}

// Legend explains the figures Table prints.
func Legend(w io.Writer) {
	fmt.Fprint(w, `
How to read the accuracy figures: every hit the nodes decided is replayed
through an exact limiter that sees all hits at once (a sliding log of each
key's admitted hits; the fixed-window line uses aligned windows instead).
  ratio              admitted / what the exact limiter admits: 1.0000 is
                     exact, 1.06 is 6% more admitted than the limit allows.
  false rejections   requests a client saw refused that an exact limiter
                     would have served: the cost of the approximation to users.
  excess admissions  hits admitted once the nodes had already admitted the
                     limit in that window. When a key runs even one hit over
                     its limit in a window, every later admission in that
                     window counts, so this share is high whenever keys sit at
                     their limit; how far over they go is the next line.
  over the limit     hits admitted beyond the limit in one window, per key:
                     compare the maximum with the bound.
  bound              in periodic sync, nodes learn each other's hits one
                     SyncRate late, so a key may be over-admitted by about
                     the traffic of one SyncRate (twice that at window
                     boundaries). README.md, Limitations; docs/benchmarks.md.
`)
}

func perNode(v []float64) string {
	var s []string
	for _, x := range v {
		s = append(s, strconv.FormatFloat(x, 'f', 0, 64))
	}
	return strings.Join(s, " ")
}

func perNodeInt(v []int) string {
	var s []string
	for _, x := range v {
		s = append(s, strconv.Itoa(x))
	}
	return strings.Join(s, " ")
}

// SweepTable writes one line per run of a sweep.
func SweepTable(w io.Writer, rs []*lab.Result) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "algorithm\tnodes\tsync-rate\tchecks\tadmitted/exact\tmax over\tmean over\tkey-windows over\tbound\tfalse rej.\tstore ops/s\t")
	for _, r := range rs {
		v := lab.View(r.PrimaryAccuracy())
		fmt.Fprintf(tw, "%s\t%d\t%v\t%d\t%.4f\t%d\t%.2f\t%d/%d\t%.1f\t%s\t%.1f\t\n", r.Config.Algorithm, r.Config.Nodes, r.Config.SyncRate, r.Checks,
			v.AdmittedRatio, v.MaxOver, v.MeanOver, v.WindowsOver, v.Windows, r.Accuracy.Bound, pct(v.FalseRejectionRate), r.Store.OpsPerSec)
	}
	tw.Flush()
}

// WriteJSON writes v, indented, to dir/name.
func WriteJSON(dir, name string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, name), append(b, '\n'), 0o644)
}

// SummaryHeader names the columns of SummaryRow.
var SummaryHeader = []string{"nodes", "strategy", "mode", "sync_rate_ms", "limits", "fixed", "keys", "dist", "lb", "rate_per_key", "load", "unpaced", "clock",
	"checks", "admitted", "checks_per_sec", "p50_ns", "p99_ns", "p999_ns", "store_ops_per_sec", "store_bytes_per_sec", "tracked_keys",
	"ref_admitted", "false_rejections", "false_rejection_rate", "excess_admissions", "max_over", "mean_over", "windows_over", "windows", "bound", "algorithm", "burst", "reference"}

// SummaryRow is one run as a CSV row (the primary reference's accuracy).
func SummaryRow(r *lab.Result) []string {
	c := r.Config
	var limits []string
	for _, l := range c.Limits {
		limits = append(limits, l.String())
	}
	v := lab.View(r.PrimaryAccuracy())
	f := func(x float64) string { return strconv.FormatFloat(x, 'g', 6, 64) }
	i := func(x int64) string { return strconv.FormatInt(x, 10) }
	return []string{strconv.Itoa(c.Nodes), c.Strategy, c.Mode(), i(c.SyncRate.Milliseconds()), strings.Join(limits, " "), strconv.FormatBool(c.Fixed),
		strconv.Itoa(c.Keys), c.Dist, c.LB, f(c.Rate), f(c.Load), strconv.FormatBool(c.Unpaced), r.Clock,
		i(r.Checks), i(r.Admitted), f(r.ChecksPerSec), i(r.Latency.P50), i(r.Latency.P99), i(r.Latency.P999), f(r.Store.OpsPerSec), f(r.Store.BytesPerSec), strconv.Itoa(r.Store.TrackedKeys),
		i(v.RefAdmitted), i(v.FalseRejections), f(v.FalseRejectionRate), i(v.ExcessAdmissions), i(v.MaxOver), f(v.MeanOver), i(v.WindowsOver), i(v.Windows), f(r.Accuracy.Bound), c.Algorithm, i(c.Burst), v.Reference}
}

// WriteCSV writes rows under header to dir/name.
func WriteCSV(dir, name string, header []string, rows [][]string) error {
	f, err := os.Create(filepath.Join(dir, name))
	if err != nil {
		return err
	}
	w := csv.NewWriter(f)
	_ = w.Write(header)
	_ = w.WriteAll(rows)
	if err := w.Error(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// WindowRows returns the per-window series of a run (Limits[0]'s aligned
// windows, primary reference) as CSV rows under WindowHeader.
func WindowRows(r *lab.Result) [][]string {
	a := r.PrimaryAccuracy()
	var rows [][]string
	for i, p := range a.AllKeys {
		s := a.Series[i]
		rows = append(rows, []string{
			strconv.FormatFloat(float64(p.Start-a.AllKeys[0].Start)/1e9, 'f', 3, 64),
			strconv.FormatInt(s.Offered, 10), strconv.FormatInt(s.Admitted, 10), strconv.FormatInt(s.MaxTrailing, 10),
			strconv.FormatInt(p.Offered, 10), strconv.FormatInt(p.Admitted, 10), strconv.FormatInt(p.MaxTrailing, 10),
			strconv.FormatInt(r.Config.Limits[0].Max, 10),
		})
	}
	return rows
}

// WindowHeader names the columns of WindowRows.
var WindowHeader = []string{"window_start_s", "key0_offered", "key0_admitted", "key0_max_trailing", "all_offered", "all_admitted", "all_max_trailing", "limit"}

// LatencyRows returns the latency histogram's buckets as CSV rows.
func LatencyRows(r *lab.Result) [][]string {
	var rows [][]string
	for _, b := range r.Hist.Buckets() {
		rows = append(rows, []string{strconv.FormatInt(b.High, 10), strconv.FormatUint(b.Count, 10)})
	}
	return rows
}

// ThroughputTable writes one line per run: checks/s, latency and store
// traffic.
func ThroughputTable(w io.Writer, rs []*lab.Result, labels []string) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "mode\tnodes\tworkers\tchecks/s\tp50\tp99\tp99.9\tmax\tstore ops/s\tcounters/s\tfailed pushes\tdegraded\terrors\t")
	for i, r := range rs {
		l := r.Latency
		fmt.Fprintf(tw, "%s\t%d\t%d\t%.0f\t%s\t%s\t%s\t%s\t%.1f\t%.0f\t%d\t%d\t%d\t\n", labels[i], r.Config.Nodes, r.Config.Workers, r.ChecksPerSec,
			ns(l.P50), ns(l.P99), ns(l.P999), ns(l.Max), r.Store.OpsPerSec, r.Store.CountersPerSec, r.Store.PushErrors, r.Degraded, r.Errors)
	}
	tw.Flush()
}

// FleetHeader names the columns of FleetRow.
var FleetHeader = []string{"nodes", "keys", "offered_per_sec", "checks", "checks_per_sec", "admitted", "store_cpu_per_sec", "store_ops_per_sec", "store_counters_per_sec",
	"sync_cycles", "sync_mean_ns", "sync_p50_ns", "sync_p99_ns", "sync_max_ns", "sync_errors", "tracked_keys", "tracked_keys_per_node",
	"admitted_over_exact", "excess_admission_rate", "false_rejection_rate", "max_over", "mean_over", "windows_over", "windows", "bound", "p99_check_ns"}

// FleetRow is one fleet run as a CSV row.
func FleetRow(r *lab.Result) []string {
	c := r.Config
	v := lab.View(r.PrimaryAccuracy())
	f := func(x float64) string { return strconv.FormatFloat(x, 'g', 6, 64) }
	i := func(x int64) string { return strconv.FormatInt(x, 10) }
	var sc lab.SyncCycles
	if r.Sync != nil {
		sc = *r.Sync
	}
	return []string{strconv.Itoa(c.Nodes), strconv.Itoa(c.Keys), f(c.Rate * float64(c.Keys)), i(r.Checks), f(r.ChecksPerSec), i(r.Admitted),
		f(r.Store.CPUPerSec), f(r.Store.OpsPerSec), f(r.Store.CountersPerSec),
		i(sc.Cycles), f(sc.Mean), i(sc.P50), i(sc.P99), i(sc.Max), i(sc.Errors), strconv.Itoa(r.Store.TrackedKeys), f(float64(r.Store.TrackedKeys) / float64(c.Nodes)),
		f(v.AdmittedRatio), f(v.ExcessAdmissionRate), f(v.FalseRejectionRate), i(v.MaxOver), f(v.MeanOver), i(v.WindowsOver), i(v.Windows), f(r.Accuracy.Bound), i(r.Latency.P99)}
}

// FleetTable writes one line per node count of a fleet run. "traffic took"
// is the run time of the traffic (wall, or simulated): on the wall clock it
// is longer than -duration when the generator could not keep pace (late hits
// go at once), and then the checks/s delivered fall short of the offered
// rate.
func FleetTable(w io.Writer, rs []*lab.Result) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "nodes\toffered/s\ttraffic took\tchecks/s\tstore CPU/s\tstore ops/s\tcounters/s\tcycles\tcycle mean\tcycle p99\tcycle max\tkeys/node\tadmitted/exact\texcess adm.\tmax over\tmean over\tbound\t")
	for _, r := range rs {
		v := lab.View(r.PrimaryAccuracy())
		var sc lab.SyncCycles
		if r.Sync != nil {
			sc = *r.Sync
		}
		cpu := "n/a"
		if r.Store.CPUPerSec >= 0 {
			cpu = fmt.Sprintf("%.3f", r.Store.CPUPerSec)
		}
		fmt.Fprintf(tw, "%d\t%.0f\t%v\t%.0f\t%s\t%.1f\t%.0f\t%d\t%s\t%s\t%s\t%.0f\t%.4f\t%s\t%d\t%.3f\t%.1f\t\n", r.Config.Nodes,
			r.Config.Rate*float64(r.Config.Keys), r.RunTime.Round(100*time.Millisecond), r.ChecksPerSec, cpu, r.Store.OpsPerSec, r.Store.CountersPerSec,
			sc.Cycles, ns(int64(sc.Mean)), ns(sc.P99), ns(sc.Max), float64(r.Store.TrackedKeys)/float64(r.Config.Nodes),
			v.AdmittedRatio, pct(v.ExcessAdmissionRate), v.MaxOver, v.MeanOver, r.Accuracy.Bound)
	}
	tw.Flush()
}
