package ratelimit

import (
	"context"
	"time"
)

// Op names an operation an Observer is told about.
type Op string

// The operations an Observer sees.
const (
	// OpCheck is one synchronous-mode Allow (SyncRate 0): the decision and
	// the store round trips it makes.
	OpCheck Op = "check"
	// OpSync is one sync cycle: by the background loop, Sync or Close.
	OpSync Op = "sync"
	// OpPush, OpFetch, OpGetWindow, OpPurge and OpTake are one store call
	// each: Strategy.PushDiffs, GetCounters (the whole iteration),
	// GetWindow, Purge, and strategy.Taker's Take.
	OpPush      Op = "push"
	OpFetch     Op = "fetch"
	OpGetWindow Op = "get_window"
	OpPurge     Op = "purge"
	OpTake      Op = "take"
)

// Observer is told what a namespace does, for metrics and tracing. Set it in
// Config.Observer; a nil Observer (the default) costs nothing. Its methods are
// called from the goroutines doing the work, concurrently, and must be quick
// and must not call back into the namespace's counting methods.
type Observer interface {
	// Start is called when an operation begins: an OpCheck, an OpSync, or a
	// store call. It returns the context the operation passes on, so that a
	// tracer can open a span whose children are the store calls made for it
	// (return ctx itself to add nothing). Every Start is followed by one End,
	// or, for OpCheck, by one Decision, with the returned context.
	Start(ctx context.Context, op Op) context.Context
	// End is called when a sync cycle or a store call ends.
	End(ctx context.Context, e Event)
	// Decision is called when Allow returns (Peek is not reported). In
	// synchronous mode it ends the OpCheck that Start began. When Allow
	// returned an error (bad arguments, a closed namespace), e.Err holds it
	// and e.Decision is empty.
	Decision(ctx context.Context, e DecisionEvent)
}

// Event describes a sync cycle or a store call that ended.
type Event struct {
	Op        Op
	Namespace string
	Start     time.Time     // when it began (wall clock)
	Duration  time.Duration // how long it took
	Err       error         // nil on success
	// Diffs and Reads are the counters an OpPush sent to add to and to read.
	Diffs, Reads int
	// Delta is the sum of the deltas an OpPush sent (a hit counts once per
	// window size it is counted in).
	Delta int64
}

// DecisionEvent describes one decision of Allow.
type DecisionEvent struct {
	Namespace string
	// Key is the key as the namespace stores it: the caller's, or its hash
	// when longer than MaxKeyLength. It may be personal data: keep it out of
	// metric labels.
	Key      string
	Cost     int64
	Decision Decision
	// Start and Duration time the whole call (wall clock).
	Start    time.Time
	Duration time.Duration
	// Err is the error Allow returned; nil for a decision.
	Err error
}

// Observers returns an Observer that tells each of obs in turn (nil ones are
// skipped); Start's contexts are chained.
func Observers(obs ...Observer) Observer {
	list := make(multiObserver, 0, len(obs))
	for _, o := range obs {
		if o != nil {
			list = append(list, o)
		}
	}
	return list
}

type multiObserver []Observer

func (m multiObserver) Start(ctx context.Context, op Op) context.Context {
	for _, o := range m {
		ctx = o.Start(ctx, op)
	}
	return ctx
}

func (m multiObserver) End(ctx context.Context, e Event) {
	for _, o := range m {
		o.End(ctx, e)
	}
}

func (m multiObserver) Decision(ctx context.Context, e DecisionEvent) {
	for _, o := range m {
		o.Decision(ctx, e)
	}
}

// observedSync is syncOnce told to the Observer as an OpSync.
func (ns *Namespace) observedSync(ctx context.Context, reads bool) error {
	obs := ns.cfg.Observer
	if obs == nil {
		return ns.syncOnce(ctx, reads)
	}
	start := time.Now()
	octx := obs.Start(ctx, OpSync)
	err := ns.syncOnce(octx, reads)
	obs.End(octx, Event{Op: OpSync, Namespace: ns.name, Start: start, Duration: time.Since(start), Err: err})
	return err
}

// observedDecide is decide told to the Observer.
func (ns *Namespace) observedDecide(ctx context.Context, key string, cost int64, limits []Limit) (Decision, error) {
	obs := ns.cfg.Observer
	start := time.Now()
	if ctx == nil { // decide refuses it; the Observer still gets a context
		var d Decision
		err := ns.decide(ctx, &d, key, cost, limits, true)
		obs.Decision(context.Background(), DecisionEvent{Namespace: ns.name, Cost: cost, Start: start, Duration: time.Since(start), Err: err})
		return d, err
	}
	octx := ctx
	if ns.mode == modeSync {
		octx = obs.Start(ctx, OpCheck)
	}
	var d Decision
	err := ns.decide(octx, &d, key, cost, limits, true)
	obs.Decision(octx, DecisionEvent{Namespace: ns.name, Key: ns.storedKeyIfValid(key), Cost: cost, Decision: d,
		Start: start, Duration: time.Since(start), Err: err})
	return d, err
}

// storedKeyIfValid returns the key as stored, or "" for an invalid key.
func (ns *Namespace) storedKeyIfValid(key string) string {
	if key == "" {
		return ""
	}
	return ns.storedKey(key)
}
