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
	mode := "sliding"
	if c.Fixed {
		mode = "fixed"
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
	for _, ref := range []struct {
		name string
		v    *lab.AccuracyView
	}{{"vs sliding log", lab.View(&a.Sliding)}, {"vs fixed window", lab.View(&a.Fixed)}} {
		v := ref.v
		p(ref.name, "admitted %d vs exact %d (%.4f); false rejections %d (%s of hits); excess admissions %d (%s)",
			v.Admitted, v.RefAdmitted, v.AdmittedRatio, v.FalseRejections, pct(v.FalseRejectionRate), v.ExcessAdmissions, pct(v.ExcessAdmissionRate))
		p("", "over-admission per window: max %d, mean %.3f; %d of %d key-windows over the limit", v.MaxOver, v.MeanOver, v.WindowsOver, v.Windows)
	}
	switch {
	case a.Bound > 0:
		p("bound", "nodes x per-node rate x SyncRate = %.1f hits per window (hottest key %.4g hits/s)", a.Bound, a.HotKeyRate)
	case a.Bound == 0:
		p("bound", "0 (synchronous, or each key on one node)")
	default:
		p("bound", "none (local mode: nodes share nothing)")
	}
	tw.Flush()
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
	fmt.Fprintln(tw, "nodes\tsync-rate\tchecks\tadmitted/exact\tmax over\tmean over\tkey-windows over\tbound\tfalse rej.\tstore ops/s\t")
	for _, r := range rs {
		v := lab.View(r.PrimaryAccuracy())
		fmt.Fprintf(tw, "%d\t%v\t%d\t%.4f\t%d\t%.2f\t%d/%d\t%.1f\t%s\t%.1f\t\n", r.Config.Nodes, r.Config.SyncRate, r.Checks,
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
	"ref_admitted", "false_rejections", "false_rejection_rate", "excess_admissions", "max_over", "mean_over", "windows_over", "windows", "bound"}

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
		i(v.RefAdmitted), i(v.FalseRejections), f(v.FalseRejectionRate), i(v.ExcessAdmissions), i(v.MaxOver), f(v.MeanOver), i(v.WindowsOver), i(v.Windows), f(r.Accuracy.Bound)}
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
