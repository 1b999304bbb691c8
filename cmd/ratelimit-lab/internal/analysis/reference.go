package analysis

import (
	"math"
	"slices"
)

// Decision flags of a recorded Hit.
const (
	// Allowed: the node admitted the hit.
	Allowed uint8 = 1 << iota
	// Degraded: the decision was made from local state because the store
	// failed (synchronous mode).
	Degraded
	// Failed: Allow returned an error; the hit counts as neither admitted
	// nor rejected.
	Failed
)

// Hit is one check as the lab records it: 16 bytes, so a run can keep
// millions of them.
type Hit struct {
	T     int64  // Unix nanoseconds (simulated or wall) of the check
	Key   uint32 // key index
	Node  uint16 // node that decided
	Flags uint8  // Allowed, Degraded, Failed
	_     uint8
}

// Limit is one policy in nanoseconds: at most Max cost per Window. For the
// token-bucket reference it is a bucket of Burst tokens (Max when 0) that
// refills Max tokens per Window.
type Limit struct {
	Window int64 // ns, > 0
	Max    int64 // > 0
	Burst  int64 // token bucket only: capacity; 0 means Max
}

// capacity is the most cost l admits at once: Max, or a bucket's burst.
func (l Limit) capacity(kind Kind) int64 {
	if kind == TokenBucket && l.Burst > 0 {
		return l.Burst
	}
	return l.Max
}

// Kind selects the exact reference limiter Analyze judges against.
type Kind uint8

// The references.
const (
	// SlidingLog: a hit at t is admissible when the cost admitted in
	// (t-W, t] before it, plus its own, is at most Max.
	SlidingLog Kind = iota
	// FixedWindow: the same over the aligned window [floor(t/W)*W, +W).
	FixedWindow
	// TokenBucket: GCRA on Unix milliseconds, as the library keeps a bucket
	// (strategy.BucketFits): interval = Window/Max ms per token, TAT starts
	// at or before now (a full bucket); a hit of cost c at now (ms) is
	// admissible when max(TAT - now, 0) <= (Burst - c) * interval, and
	// admitting it moves TAT to max(TAT, now) + c*interval.
	TokenBucket
)

// String names the reference as Result.Reference does.
func (k Kind) String() string {
	switch k {
	case FixedWindow:
		return "fixed-window"
	case TokenBucket:
		return "token-bucket"
	}
	return "sliding-log"
}

// Options configures Analyze.
type Options struct {
	// Limits are the policies every hit was checked against.
	Limits []Limit
	// Cost is the cost of every hit (1 when 0).
	Cost int64
	// Kind is the reference: SlidingLog (the zero value), FixedWindow or
	// TokenBucket.
	Kind Kind
	// Fixed selects the fixed-window reference (the same as Kind
	// FixedWindow).
	Fixed bool
	// Resolution, in ns, floors every hit's time to a multiple of it before
	// judging (0 or 1: nanoseconds). 1e6 judges on milliseconds, as the
	// library's sliding log and token bucket count. The token-bucket
	// reference works on milliseconds whatever it is.
	Resolution int64
	// SeriesKey is the key whose per-window series Analyze returns.
	SeriesKey uint32
	// From, in Unix ns, leaves the earlier hits out of every count (they
	// still fill the reference windows) and the aligned windows that start
	// earlier out of the over-admission figures: a warm-up. The series keep
	// every window.
	From int64
}

// Result is what Analyze finds. Over-admission figures are about Limits[0]'s
// window; decisions are judged against every limit.
type Result struct {
	Reference string `json:"reference"` // "sliding-log", "fixed-window" or "token-bucket"

	Hits     int64 `json:"hits"`     // decided hits (Failed ones excluded)
	Admitted int64 `json:"admitted"` // hits the nodes admitted
	Failed   int64 `json:"failed"`   // hits whose Allow returned an error

	// FalseRejections counts hits the nodes rejected although the hits they
	// had admitted left room: for every limit, the cost admitted in the
	// reference window before the hit, plus the hit's cost, was <= Max.
	FalseRejections int64 `json:"false_rejections"`
	// ExcessAdmissions counts hits the nodes admitted although, for some
	// limit, the cost admitted in the reference window before the hit plus
	// its own cost exceeded Max.
	ExcessAdmissions int64 `json:"excess_admissions"`
	// RefAdmitted is how many of the same hits an exact limiter (the
	// reference applied to its own decisions, from the start) admits.
	RefAdmitted int64 `json:"ref_admitted"`

	// MaxOver is the largest over-admission of any key: the most cost the
	// nodes admitted in one reference window (a trailing window (t-W, t] for
	// the sliding log, an aligned window for the fixed reference) beyond Max.
	// For the token bucket, it is the most tokens the nodes' admissions
	// overdrew the bucket by (fed the nodes' admitted hits, its level after
	// a hit, below zero, rounded up to whole tokens).
	MaxOver int64 `json:"max_over"`
	// MeanOver is the mean over-admission over the (key, aligned window)
	// pairs that admitted anything, where a pair's over-admission is the
	// largest count of reference windows ending in it, beyond Max (0 if none).
	MeanOver float64 `json:"mean_over"`
	// Windows counts those (key, aligned window) pairs; WindowsOver, those
	// with a positive over-admission.
	Windows     int64 `json:"windows"`
	WindowsOver int64 `json:"windows_over"`

	// Series is SeriesKey's per-aligned-window history; AllKeys the same
	// summed (Offered, Admitted) or maximised (MaxTrailing) over keys.
	Series  []WindowPoint `json:"series"`
	AllKeys []WindowPoint `json:"all_keys"`
}

// WindowPoint describes one aligned window of Limits[0].
type WindowPoint struct {
	Start       int64 `json:"start_ns"`     // Unix ns of the window's start
	Offered     int64 `json:"offered"`      // hits
	Admitted    int64 `json:"admitted"`     // hits the nodes admitted
	MaxTrailing int64 `json:"max_trailing"` // the most cost admitted in one reference window ending in this window (token bucket: the most tokens owed, to compare with the burst)
}

// FalseRejectionRate returns FalseRejections / Hits (0 when no hits).
func (r *Result) FalseRejectionRate() float64 { return ratio(r.FalseRejections, r.Hits) }

// ExcessAdmissionRate returns ExcessAdmissions / Hits (0 when no hits).
func (r *Result) ExcessAdmissionRate() float64 { return ratio(r.ExcessAdmissions, r.Hits) }

func ratio(a, b int64) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}

// window is the cost admitted in one limit's reference window, for one key:
// the admitted hits' times and costs from lo on (sliding), or the current
// aligned window's total (fixed).
type window struct {
	times []int64
	costs []int64
	lo    int
	sum   int64   // cost of times[lo:], or of the current aligned window
	start int64   // fixed: the current aligned window's start
	tat   float64 // token bucket: theoretical arrival time, Unix ms
}

// msPerNs converts the hits' nanoseconds to the library's milliseconds.
const msPerNs = int64(1e6)

// interval returns a token bucket's emission interval in milliseconds per
// token, as the library computes it: Window in whole ms over Max.
func (l Limit) interval() float64 {
	return float64(l.Window/msPerNs) / float64(l.Max)
}

// fits reports whether a hit of cost at t (ns) is admissible under l given
// what w holds: load + cost <= Max for the windows, the GCRA rule for the
// bucket.
func (w *window) fits(t, cost int64, l Limit, kind Kind) bool {
	if kind != TokenBucket {
		return w.load(t, l, kind == FixedWindow)+cost <= l.Max
	}
	now := floorDiv(t, msPerNs)
	burst := l.capacity(kind)
	owed := w.tat - float64(now)
	if owed <= 0 {
		return cost <= burst
	}
	return owed <= float64(float64(burst-cost)*l.interval())
}

// add counts an admitted hit at t (after fits at t).
func (w *window) add(t, cost int64, l Limit, kind Kind) {
	if kind != TokenBucket {
		w.admit(t, cost, kind == FixedWindow)
		return
	}
	now := float64(floorDiv(t, msPerNs))
	w.tat = float64(math.Max(w.tat, now) + float64(float64(cost)*l.interval()))
}

// level returns the cost w holds at t, after add at t: the window's load
// including the hit, or the tokens the bucket owes (burst minus its level),
// rounded up to whole tokens; compare it with l.capacity.
func (w *window) level(t int64, l Limit, kind Kind) int64 {
	if kind != TokenBucket {
		return w.sum
	}
	// A TAT of 1.7e12 ms is exact to about 2e-4 ms: a thousandth of a token
	// of slack keeps a bucket that is exactly full from reading as one over.
	owed := (w.tat - float64(floorDiv(t, msPerNs))) / l.interval()
	return max(int64(math.Ceil(owed-1e-3)), 0)
}

// load returns the cost admitted in the reference window that ends at t,
// excluding t's own hit: (t-W, t] for the sliding log, or t's aligned window.
func (w *window) load(t int64, l Limit, fixed bool) int64 {
	if fixed {
		if s := floorDiv(t, l.Window) * l.Window; s != w.start {
			w.start, w.sum = s, 0
		}
		return w.sum
	}
	for w.lo < len(w.times) && w.times[w.lo] <= t-l.Window {
		w.sum -= w.costs[w.lo]
		w.lo++
	}
	if w.lo > 1024 && w.lo > len(w.times)/2 { // keep the slice from growing without bound
		n := copy(w.times, w.times[w.lo:])
		copy(w.costs, w.costs[w.lo:])
		w.times, w.costs, w.lo = w.times[:n], w.costs[:n], 0
	}
	return w.sum
}

// admit counts an admitted hit at t (after load at t).
func (w *window) admit(t, cost int64, fixed bool) {
	w.sum += cost
	if !fixed {
		w.times = append(w.times, t)
		w.costs = append(w.costs, cost)
	}
}

type keyState struct {
	lab, ref []window // per limit: the nodes' admitted hits, the reference's own
	// current aligned window of Limits[0] and its largest trailing load
	curWin    int64
	curMax    int64
	hasWindow bool
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}

// Analyze judges recorded hits against the reference limiter. Hits need not
// be sorted; Analyze sorts a copy by time (stable, so hits at the same instant
// keep their recorded order). The reference, per key and limit:
//
//   - sliding log: a hit at t is admissible when the cost admitted in (t-W, t]
//     before it, plus its own cost, is at most Max;
//   - fixed window: the same over the aligned window [floor(t/W)*W, +W);
//   - token bucket: GCRA on milliseconds (see TokenBucket): admissible when
//     the bucket, fed the admitted hits before it, holds the hit's cost.
//
// "Admitted before it" means by the nodes, for FalseRejections,
// ExcessAdmissions and the over-admission figures (each decision is judged
// against what was really admitted), and by the reference itself for
// RefAdmitted.
func Analyze(hits []Hit, opt Options) Result {
	cost := opt.Cost
	if cost <= 0 {
		cost = 1
	}
	kind := opt.Kind
	if opt.Fixed {
		kind = FixedWindow
	}
	res := Result{Reference: kind.String()}
	if len(opt.Limits) == 0 || len(hits) == 0 {
		return res
	}
	sorted := slices.Clone(hits)
	slices.SortStableFunc(sorted, func(a, b Hit) int {
		switch {
		case a.T < b.T:
			return -1
		case a.T > b.T:
			return 1
		}
		return 0
	})
	if r := opt.Resolution; r > 1 {
		for i := range sorted {
			sorted[i].T = floorDiv(sorted[i].T, r) * r
		}
	}
	cap0 := opt.Limits[0].capacity(kind)
	w0 := opt.Limits[0].Window
	first := floorDiv(sorted[0].T, w0)
	nwin := int(floorDiv(sorted[len(sorted)-1].T, w0)-first) + 1
	res.AllKeys = make([]WindowPoint, nwin)
	res.Series = make([]WindowPoint, nwin)
	for i := range nwin {
		res.AllKeys[i].Start = (first + int64(i)) * w0
		res.Series[i].Start = res.AllKeys[i].Start
	}
	states := map[uint32]*keyState{}
	var sumOver float64
	closeWindow := func(st *keyState) {
		if !st.hasWindow || st.curWin*w0 < opt.From {
			st.hasWindow = false
			return
		}
		res.Windows++
		over := st.curMax - cap0
		if over > 0 {
			res.WindowsOver++
			sumOver += float64(over)
			res.MaxOver = max(res.MaxOver, over)
		}
		st.hasWindow = false
	}
	for _, h := range sorted {
		counted := h.T >= opt.From
		if h.Flags&Failed != 0 {
			if counted {
				res.Failed++
			}
			continue
		}
		st := states[h.Key]
		if st == nil {
			st = &keyState{lab: make([]window, len(opt.Limits)), ref: make([]window, len(opt.Limits)), curWin: -1 << 62}
			for i := range st.lab {
				st.lab[i].start, st.ref[i].start = -1<<62, -1<<62
			}
			states[h.Key] = st
		}
		admitted := h.Flags&Allowed != 0
		fits, refFits := true, true
		for i, l := range opt.Limits {
			if !st.lab[i].fits(h.T, cost, l, kind) {
				fits = false
			}
			if !st.ref[i].fits(h.T, cost, l, kind) {
				refFits = false
			}
		}
		if refFits {
			if counted {
				res.RefAdmitted++
			}
			for i, l := range opt.Limits {
				st.ref[i].add(h.T, cost, l, kind)
			}
		}
		win := floorDiv(h.T, w0)
		if win != st.curWin {
			closeWindow(st)
			st.curWin, st.curMax = win, 0
		}
		wi := int(win - first)
		res.AllKeys[wi].Offered++
		if h.Key == opt.SeriesKey {
			res.Series[wi].Offered++
		}
		if counted {
			res.Hits++
			switch {
			case !admitted && fits:
				res.FalseRejections++
			case admitted && !fits:
				res.ExcessAdmissions++
			}
			if admitted {
				res.Admitted++
			}
		}
		if !admitted {
			continue
		}
		for i, l := range opt.Limits {
			st.lab[i].add(h.T, cost, l, kind)
		}
		lvl := st.lab[0].level(h.T, opt.Limits[0], kind)
		st.hasWindow = true
		st.curMax = max(st.curMax, lvl)
		res.AllKeys[wi].Admitted++
		res.AllKeys[wi].MaxTrailing = max(res.AllKeys[wi].MaxTrailing, lvl)
		if h.Key == opt.SeriesKey {
			res.Series[wi].Admitted++
			res.Series[wi].MaxTrailing = max(res.Series[wi].MaxTrailing, lvl)
		}
	}
	for _, st := range states {
		closeWindow(st)
	}
	if res.Windows > 0 {
		res.MeanOver = sumOver / float64(res.Windows)
	}
	return res
}
