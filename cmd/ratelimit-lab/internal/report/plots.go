package report

import (
	"cmp"
	"fmt"
	"image/color"
	"math"
	"os"
	"slices"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgsvg"

	"github.com/ratesync/ratelimit/cmd/ratelimit-lab/internal/lab"
)

// plot sizes
const (
	plotW = 8 * vg.Inch
	plotH = 4.5 * vg.Inch
)

// PlotWindows draws, per aligned window of the first limit, what key 0 was
// offered and admitted, the most it admitted in one reference window ending
// there, the same maximum over all keys, and the limit. The file's extension
// (.png, .svg) picks the format.
func PlotWindows(r *lab.Result, file string) error {
	a := r.PrimaryAccuracy()
	if len(a.Series) == 0 {
		return fmt.Errorf("no recorded hits to plot")
	}
	p := plot.New()
	p.Title.Text = "Admitted per window vs the limit: " + Describe(r.Config)
	p.Title.TextStyle.Font.Size = vg.Points(8)
	p.X.Label.Text = "window start (s from the run's start)"
	p.Y.Label.Text = "hits"
	w0 := float64(r.Config.Limits[0].Window) / 1e9
	pts := func(get func(i int) int64) plotter.XYs {
		xy := make(plotter.XYs, len(a.Series))
		for i := range a.Series {
			xy[i].X = float64(i) * w0
			xy[i].Y = float64(get(i))
		}
		return xy
	}
	capacity := float64(r.Config.Limits[0].Max)
	if a.Reference == "token-bucket" && r.Config.Burst > 0 {
		capacity = float64(r.Config.Burst)
	}
	limit := make(plotter.XYs, 2)
	limit[0] = plotter.XY{X: 0, Y: capacity}
	limit[1] = plotter.XY{X: float64(len(a.Series)-1) * w0, Y: capacity}
	err := plotutil.AddLines(p,
		"key 0 offered", pts(func(i int) int64 { return a.Series[i].Offered }),
		"key 0 admitted (aligned window)", pts(func(i int) int64 { return a.Series[i].Admitted }),
		"key 0 most admitted in one "+a.Reference+" window", pts(func(i int) int64 { return a.Series[i].MaxTrailing }),
		"all keys: most admitted in one "+a.Reference+" window", pts(func(i int) int64 { return a.AllKeys[i].MaxTrailing }),
	)
	if err != nil {
		return err
	}
	l, err := plotter.NewLine(limit)
	if err != nil {
		return err
	}
	l.Color = color.Black
	l.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
	p.Add(l)
	p.Legend.Add("limit", l)
	p.Legend.Top = true
	p.Legend.TextStyle.Font.Size = vg.Points(8)
	p.Y.Min = 0
	p.Y.Max *= 1.15 // room for the legend above the lines
	return p.Save(plotW, plotH, file)
}

// PlotLatency draws the latency percentile distribution of each run, as
// HdrHistogram does: the x axis is 1/(1-q) on a log scale, so p50, p90, p99,
// p99.9 and p99.99 are evenly spaced, and the y axis is the latency (log).
func PlotLatency(rs []*lab.Result, labels []string, file string) error {
	p := plot.New()
	p.Title.Text = "Check latency (Allow) by percentile"
	p.X.Label.Text = "percentile"
	p.Y.Label.Text = "latency (µs, log scale)"
	p.X.Scale, p.Y.Scale = plot.LogScale{}, plot.LogScale{}
	p.X.Tick.Marker = percentileTicks{}
	p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	var vs []any
	xmax, ymax := 10.0, 1.0
	for i, r := range rs {
		n := float64(r.Hist.Count())
		if n == 0 {
			continue
		}
		var xy plotter.XYs
		var cum float64
		for _, b := range r.Hist.Buckets() {
			cum += float64(b.Count)
			q := math.Min(cum/n, 1-1/n) // the last bucket holds the max: draw it at 1-1/n
			xy = append(xy, plotter.XY{X: 1 / (1 - q), Y: math.Max(float64(b.High), 1) / 1e3})
		}
		xmax = math.Max(xmax, n)
		ymax = math.Max(ymax, float64(r.Hist.Max())/1e3)
		vs = append(vs, labels[i], xy)
	}
	if err := plotutil.AddLines(p, vs...); err != nil {
		return err
	}
	p.X.Min, p.X.Max = 1, xmax
	p.Y.Max = ymax * math.Pow(10, 0.15*float64(len(rs))+0.1) // room for the legend above the lines
	p.Legend.Top = true
	p.Legend.Left = true
	p.Legend.TextStyle.Font.Size = vg.Points(8)
	return p.Save(plotW, plotH, file)
}

// percentileTicks labels a 1/(1-q) axis with percentiles.
type percentileTicks struct{}

func (percentileTicks) Ticks(lo, hi float64) []plot.Tick {
	var ts []plot.Tick
	for _, t := range []struct {
		x     float64
		label string
	}{{1, "0%"}, {2, "50%"}, {10, "90%"}, {100, "99%"}, {1e3, "99.9%"}, {1e4, "99.99%"}, {1e5, "99.999%"}, {1e6, "99.9999%"}, {1e7, "99.99999%"}} {
		if t.x >= lo && t.x <= hi {
			ts = append(ts, plot.Tick{Value: t.x, Label: t.label})
		}
	}
	return ts
}

// PlotSweep draws the largest over-admission per window against SyncRate,
// one line per node count (and per algorithm, when the runs have several),
// with the bound nodes x per-node rate x SyncRate. Both axes are
// logarithmic; an over-admission of 0 is drawn at 0.5.
func PlotSweep(rs []*lab.Result, file string) error {
	type series struct {
		alg   string
		nodes int
	}
	byNodes := map[series]plotter.XYs{}
	bound := map[float64]float64{}
	algs := map[string]bool{}
	for _, r := range rs {
		algs[r.Config.Algorithm] = true
	}
	for _, r := range rs {
		if r.Config.SyncRate <= 0 {
			continue
		}
		x := r.Config.SyncRate.Seconds()
		s := series{nodes: r.Config.Nodes}
		if len(algs) > 1 {
			s.alg = r.Config.Algorithm
		}
		byNodes[s] = append(byNodes[s], plotter.XY{X: x, Y: math.Max(float64(r.PrimaryAccuracy().MaxOver), 0.5)})
		bound[x] = math.Max(bound[x], r.Accuracy.Bound)
	}
	if len(byNodes) == 0 {
		return fmt.Errorf("no async runs to plot")
	}
	p := plot.New()
	c := rs[0].Config
	p.Title.Text = fmt.Sprintf("Worst over-admission per window vs SyncRate (%s, limit %v, %.3g hits/s per key, %s)", c.Strategy, c.Limits[0], c.Rate, c.LB)
	p.Title.TextStyle.Font.Size = vg.Points(9)
	p.X.Label.Text = "SyncRate (s, log scale)"
	p.Y.Label.Text = "most hits over the limit in a window"
	p.X.Scale, p.Y.Scale = plot.LogScale{}, plot.LogScale{}
	p.X.Tick.Marker = plot.LogTicks{Prec: -1}
	p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	if len(algs) > 1 {
		p.Title.Text = fmt.Sprintf("Worst over-admission per window vs SyncRate by algorithm (%s, limit %v, %.3g hits/s per key, %s)", c.Strategy, c.Limits[0], c.Rate, c.LB)
		p.Y.Label.Text = "most over the limit in a window (hits or tokens)"
	}
	var keys []series
	for n := range byNodes {
		keys = append(keys, n)
	}
	slices.SortFunc(keys, func(a, b series) int { return cmp.Or(cmp.Compare(a.alg, b.alg), cmp.Compare(a.nodes, b.nodes)) })
	var vs []any
	for _, k := range keys {
		xy := byNodes[k]
		slices.SortFunc(xy, byX)
		name := fmt.Sprintf("%d nodes", k.nodes)
		if k.alg != "" {
			name = k.alg + ", " + name
		}
		vs = append(vs, name, xy)
	}
	if err := plotutil.AddLinePoints(p, vs...); err != nil {
		return err
	}
	ymax := 1.0
	for _, xy := range byNodes {
		for _, pt := range xy {
			ymax = math.Max(ymax, pt.Y)
		}
	}
	for i, k := range []float64{1, 2} {
		var bxy plotter.XYs
		for x, y := range bound {
			bxy = append(bxy, plotter.XY{X: x, Y: math.Max(k*y, 0.5)})
			ymax = math.Max(ymax, k*y)
		}
		slices.SortFunc(bxy, byX)
		l, err := plotter.NewLine(bxy)
		if err != nil {
			return err
		}
		l.Color = color.Black
		l.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
		name := "bound B = nodes x per-node rate x SyncRate"
		if i == 1 {
			l.Color = color.Gray{Y: 140}
			l.Dashes = []vg.Length{vg.Points(1), vg.Points(2)}
			name = "2B (one push-and-read per cycle)"
		}
		p.Add(l)
		p.Legend.Add(name, l)
	}
	p.Y.Min, p.Y.Max = 0.4, ymax*1.5
	p.Legend.Top = false
	p.Legend.Left = false
	p.Legend.XOffs = -vg.Points(5)
	p.Legend.YOffs = vg.Points(5)
	p.Legend.TextStyle.Font.Size = vg.Points(8)
	p.Title.Text += "; 0 drawn as 0.5"
	return p.Save(plotW, plotH, file)
}

// byX orders points by X.
func byX(a, b plotter.XY) int { return cmp.Compare(a.X, b.X) }

// PlotFleet draws, against the node count, the store's CPU per second (top;
// skipped when not measured) and the over-admission (bottom: the worst and
// the mean over key-windows), one above the other in one file.
func PlotFleet(rs []*lab.Result, file string) error {
	if len(rs) == 0 {
		return fmt.Errorf("no fleet runs to plot")
	}
	c := rs[0].Config
	var cpu, maxOver, meanOver, cycleP99 plotter.XYs
	for _, r := range rs {
		x := float64(r.Config.Nodes)
		if r.Store.CPUPerSec >= 0 {
			cpu = append(cpu, plotter.XY{X: x, Y: r.Store.CPUPerSec})
		}
		if r.Sync != nil {
			cycleP99 = append(cycleP99, plotter.XY{X: x, Y: float64(r.Sync.P99) / 1e9})
		}
		a := r.PrimaryAccuracy()
		maxOver = append(maxOver, plotter.XY{X: x, Y: float64(a.MaxOver)})
		meanOver = append(meanOver, plotter.XY{X: x, Y: a.MeanOver})
	}
	var rows []*plot.Plot
	top := plot.New()
	top.Title.Text = fmt.Sprintf("Fleet: %d keys (%s s=%.2g), %.0f hits/s offered, limit %v, %s sync-rate %v, %s",
		c.Keys, c.Dist, c.ZipfS, c.Rate*float64(c.Keys), c.Limits[0], c.Strategy, c.SyncRate, c.LB)
	top.Title.TextStyle.Font.Size = vg.Points(9)
	top.X.Label.Text = "nodes"
	top.Y.Label.Text = "store CPU s/s; sync cycle p99 (s)"
	var vs []any
	if len(cpu) > 0 {
		vs = append(vs, "store CPU seconds per wall second (INFO cpu)", cpu)
	}
	if len(cycleP99) > 0 {
		vs = append(vs, "sync cycle p99 (s)", cycleP99)
	}
	if len(vs) > 0 {
		if err := plotutil.AddLinePoints(top, vs...); err != nil {
			return err
		}
		top.Y.Min = 0
		top.Legend.Top, top.Legend.Left = true, true
		top.Legend.TextStyle.Font.Size = vg.Points(8)
		top.Y.Max *= 1.3
		rows = append(rows, top)
	}
	bottom := plot.New()
	bottom.X.Label.Text = "nodes"
	bottom.Y.Label.Text = "over the limit in a window (hits)"
	if err := plotutil.AddLinePoints(bottom, "worst key-window", maxOver, "mean over key-windows", meanOver); err != nil {
		return err
	}
	bottom.Y.Min = 0
	bottom.Legend.Top, bottom.Legend.Left = true, true
	bottom.Legend.TextStyle.Font.Size = vg.Points(8)
	bottom.Y.Max = bottom.Y.Max*1.3 + 1
	rows = append(rows, bottom)
	if len(rows) == 1 {
		bottom.Title = top.Title
		return bottom.Save(plotW, plotH, file)
	}
	return saveStack(rows, file)
}

// saveStack draws plots one above the other in one file (svg or png by its
// extension).
func saveStack(ps []*plot.Plot, file string) error {
	w, h := plotW, plotH*vg.Length(len(ps))*0.75
	var canvas vg.CanvasWriterTo
	if strings.HasSuffix(file, ".png") {
		canvas = vgimg.PngCanvas{Canvas: vgimg.New(w, h)}
	} else {
		canvas = vgsvg.New(w, h)
	}
	grid := make([][]*plot.Plot, len(ps))
	for i, p := range ps {
		grid[i] = []*plot.Plot{p}
	}
	tiles := draw.Tiles{Rows: len(ps), Cols: 1, PadX: vg.Millimeter, PadY: 4 * vg.Millimeter, PadTop: 2 * vg.Millimeter, PadBottom: 2 * vg.Millimeter, PadLeft: 2 * vg.Millimeter, PadRight: 2 * vg.Millimeter}
	cs := plot.Align(grid, tiles, draw.New(canvas))
	for i, p := range ps {
		p.Draw(cs[i][0])
	}
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	if _, err := canvas.WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
