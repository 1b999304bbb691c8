// Package ratelimitotel reports rate-limiter namespaces through OpenTelemetry:
// metrics through the metrics API, and spans, when a tracer provider is
// given, for each sync cycle and each synchronous-mode check, with the store
// calls they make as child spans.
//
//	obs, err := ratelimitotel.New(ratelimitotel.Options{TracerProvider: tp})
//	ns, err := reg.New(ratelimit.Config{..., Observer: obs})
//	err = obs.Register(ns) // the gauges read ns.Stats at collection
//
// Names and units follow the OpenTelemetry semantic-convention style:
// dot-separated names under "ratelimit.", durations in seconds ("s"), counts
// in curly-brace units ("{decision}"). Attributes are bounded by the
// configuration: namespace, policy, outcome, store operation, error type. No
// key is ever an attribute. See docs/metrics.md in the repository for the
// list.
//
// This package is its own module, so that the ratelimit module does not
// depend on OpenTelemetry.
package ratelimitotel

import (
	"context"
	"errors"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/ratesync/ratelimit"
)

// ScopeName is the instrumentation scope of the meter and tracer.
const ScopeName = "github.com/ratesync/ratelimit/ratelimitotel"

// Attribute keys.
const (
	AttrNamespace = attribute.Key("ratelimit.namespace")
	AttrPolicy    = attribute.Key("ratelimit.policy")
	AttrDecision  = attribute.Key("ratelimit.decision") // "allowed" or "rejected"
	AttrDegraded  = attribute.Key("ratelimit.degraded") // the store had failed
	AttrOperation = attribute.Key("ratelimit.store.operation")
	AttrErrorType = attribute.Key("error.type")
)

// Histogram bucket boundaries, in seconds (see metrics.DecisionBuckets and
// friends in the ratelimit module: the same figures, the same buckets).
var (
	DecisionBuckets   = []float64{1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25}
	RetryAfterBuckets = []float64{0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 900, 3600, 86400}
	StoreBuckets      = []float64{1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}
)

// Options configure an Observer. The zero value of every field is its
// documented default.
type Options struct {
	// MeterProvider makes the instruments. Default otel.GetMeterProvider().
	MeterProvider metric.MeterProvider
	// TracerProvider makes the spans. Default nil: no spans.
	TracerProvider trace.TracerProvider
}

// Observer is a ratelimit.Observer that records OpenTelemetry metrics and
// spans. Set it as Config.Observer of each namespace to observe, and
// Register them for the gauges. It is safe for concurrent use.
type Observer struct {
	tracer trace.Tracer // nil: no spans

	decisions   metric.Int64Counter
	decisionDur metric.Float64Histogram
	retryAfter  metric.Float64Histogram
	syncDur     metric.Float64Histogram
	storeDur    metric.Float64Histogram
	pushed      metric.Int64Counter
	delta       metric.Int64Counter

	pending, tracked, unresolved metric.Int64ObservableGauge
	syncAge, hottest             metric.Float64ObservableGauge
	syncs, syncErrors, evictions metric.Int64ObservableCounter

	attrs sync.Map // attrKey -> attribute.Set, so a decision builds no set

	mu     sync.Mutex
	spaces []*ratelimit.Namespace // GUARDED_BY(mu)
	reg    metric.Registration
}

type attrKey struct {
	ns, policy string
	allowed    bool
	degraded   bool
	kind       uint8 // 0: decision counter, 1: per policy
}

// New returns an Observer with its instruments made.
func New(opts Options) (*Observer, error) {
	mp := opts.MeterProvider
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	m := mp.Meter(ScopeName)
	o := &Observer{}
	if opts.TracerProvider != nil {
		o.tracer = opts.TracerProvider.Tracer(ScopeName)
	}
	var errs []error
	add := func(err error) { errs = append(errs, err) }
	var err error
	o.decisions, err = m.Int64Counter("ratelimit.decisions", metric.WithUnit("{decision}"),
		metric.WithDescription("Allow decisions by namespace, binding policy, decision (allowed, rejected) and degraded (the store had failed)."))
	add(err)
	o.decisionDur, err = m.Float64Histogram("ratelimit.decision.duration", metric.WithUnit("s"),
		metric.WithDescription("Latency of Allow, by namespace and binding policy."), metric.WithExplicitBucketBoundaries(DecisionBuckets...))
	add(err)
	o.retryAfter, err = m.Float64Histogram("ratelimit.retry_after", metric.WithUnit("s"),
		metric.WithDescription("Retry-After of rejected decisions: the true wait until the request would be admitted."),
		metric.WithExplicitBucketBoundaries(RetryAfterBuckets...))
	add(err)
	o.syncDur, err = m.Float64Histogram("ratelimit.sync.duration", metric.WithUnit("s"),
		metric.WithDescription("Duration of sync cycles; failed ones carry error.type."), metric.WithExplicitBucketBoundaries(StoreBuckets...))
	add(err)
	o.storeDur, err = m.Float64Histogram("ratelimit.store.duration", metric.WithUnit("s"),
		metric.WithDescription("Duration of store round trips by operation (push, fetch, get_window, purge); failed ones carry error.type."),
		metric.WithExplicitBucketBoundaries(StoreBuckets...))
	add(err)
	o.pushed, err = m.Int64Counter("ratelimit.pushed.counters", metric.WithUnit("{counter}"),
		metric.WithDescription("Counters pushed to the store (each key and window size once per push)."))
	add(err)
	o.delta, err = m.Int64Counter("ratelimit.pushed.delta", metric.WithUnit("{hit}"),
		metric.WithDescription("Sum of the increments pushed to the store (a hit counts once per window size)."))
	add(err)
	o.pending, err = m.Int64ObservableGauge("ratelimit.pending_hits", metric.WithUnit("{hit}"),
		metric.WithDescription("Hits counted on this node that the store has not confirmed yet."))
	add(err)
	o.tracked, err = m.Int64ObservableGauge("ratelimit.tracked_keys", metric.WithUnit("{key}"),
		metric.WithDescription("Keys held in memory."))
	add(err)
	o.unresolved, err = m.Int64ObservableGauge("ratelimit.unresolved_pushes", metric.WithUnit("{push}"),
		metric.WithDescription("Pushes whose outcome is unknown, waiting to be re-sent."))
	add(err)
	o.syncAge, err = m.Float64ObservableGauge("ratelimit.sync.age", metric.WithUnit("s"),
		metric.WithDescription("Time since the last sync cycle ended."))
	add(err)
	o.syncs, err = m.Int64ObservableCounter("ratelimit.sync.cycles", metric.WithUnit("{cycle}"),
		metric.WithDescription("Sync cycles run."))
	add(err)
	o.syncErrors, err = m.Int64ObservableCounter("ratelimit.sync.errors", metric.WithUnit("{cycle}"),
		metric.WithDescription("Sync cycles that failed."))
	add(err)
	o.evictions, err = m.Int64ObservableCounter("ratelimit.evictions", metric.WithUnit("{key}"),
		metric.WithDescription("Keys evicted by the MaxKeys cap."))
	add(err)
	o.hottest, err = m.Float64ObservableGauge("ratelimit.hottest_key.rate", metric.WithUnit("{check}/s"),
		metric.WithDescription("Checks per second, over the last minute, of this node's busiest key (Config.HotKeys on; no key attribute)."))
	add(err)
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	o.reg, err = m.RegisterCallback(o.observe, o.pending, o.tracked, o.unresolved, o.syncAge, o.syncs, o.syncErrors, o.evictions, o.hottest)
	if err != nil {
		return nil, err
	}
	return o, nil
}

var _ ratelimit.Observer = (*Observer)(nil)

// Register adds namespaces to the gauges, which read their Stats at each
// collection.
func (o *Observer) Register(spaces ...*ratelimit.Namespace) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.spaces = append(o.spaces, spaces...)
}

// Unregister removes a namespace from the gauges.
func (o *Observer) Unregister(ns *ratelimit.Namespace) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for i, s := range o.spaces {
		if s == ns {
			o.spaces = append(o.spaces[:i], o.spaces[i+1:]...)
			return
		}
	}
}

// Shutdown unregisters the gauges' callback from the meter.
func (o *Observer) Shutdown() error { return o.reg.Unregister() }

func (o *Observer) observe(_ context.Context, obs metric.Observer) error {
	o.mu.Lock()
	spaces := append([]*ratelimit.Namespace(nil), o.spaces...)
	o.mu.Unlock()
	now := time.Now()
	for _, ns := range spaces {
		st := ns.Stats()
		set := metric.WithAttributeSet(attribute.NewSet(AttrNamespace.String(ns.Name())))
		obs.ObserveInt64(o.pending, st.PendingHits, set)
		obs.ObserveInt64(o.tracked, int64(st.TrackedKeys), set)
		obs.ObserveInt64(o.unresolved, int64(st.UnresolvedPushes), set)
		obs.ObserveInt64(o.syncs, st.Syncs, set)
		obs.ObserveInt64(o.syncErrors, st.SyncErrors, set)
		obs.ObserveInt64(o.evictions, st.Evictions, set)
		if !st.LastSync.IsZero() {
			obs.ObserveFloat64(o.syncAge, now.Sub(st.LastSync).Seconds(), set)
		}
		if hk := ns.HotKeys(1); len(hk.ByChecks) > 0 {
			obs.ObserveFloat64(o.hottest, hk.ByChecks[0].Count/hk.Window.Seconds(), set)
		}
	}
	return nil
}

// spanned marks a context holding a span this Observer started, and for
// which operation, so End and Decision end only their own spans, never a
// caller's.
type spanned struct {
	span trace.Span
	op   ratelimit.Op
}

type spanKey struct{}

// Start implements ratelimit.Observer: with a tracer, it starts the span
// "ratelimit.<op>" (kind client for store calls, internal otherwise).
func (o *Observer) Start(ctx context.Context, op ratelimit.Op) context.Context {
	if o.tracer == nil {
		return ctx
	}
	kind := trace.SpanKindClient
	if op == ratelimit.OpCheck || op == ratelimit.OpSync {
		kind = trace.SpanKindInternal
	}
	ctx, span := o.tracer.Start(ctx, "ratelimit."+string(op), trace.WithSpanKind(kind))
	return context.WithValue(ctx, spanKey{}, spanned{span: span, op: op})
}

// ownSpan returns the span Start opened for op in ctx, if any.
func ownSpan(ctx context.Context, op ratelimit.Op) (trace.Span, bool) {
	s, ok := ctx.Value(spanKey{}).(spanned)
	if !ok || s.op != op {
		return nil, false
	}
	return s.span, true
}

// errorType is the error.type attribute of a failure: the error's chain
// classified coarsely (the store's own messages would be unbounded).
func errorType(err error) string {
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	case errors.Is(err, context.Canceled):
		return "canceled"
	}
	return "store_error"
}

// End implements ratelimit.Observer: it records a sync cycle or a store call
// and ends its span.
func (o *Observer) End(ctx context.Context, e ratelimit.Event) {
	attrs := []attribute.KeyValue{AttrNamespace.String(e.Namespace)}
	if e.Op != ratelimit.OpSync {
		attrs = append(attrs, AttrOperation.String(string(e.Op)))
	}
	if e.Err != nil {
		attrs = append(attrs, AttrErrorType.String(errorType(e.Err)))
	}
	set := metric.WithAttributeSet(attribute.NewSet(attrs...))
	if e.Op == ratelimit.OpSync {
		o.syncDur.Record(ctx, e.Duration.Seconds(), set)
	} else {
		o.storeDur.Record(ctx, e.Duration.Seconds(), set)
	}
	if e.Op == ratelimit.OpPush && e.Err == nil {
		nsSet := metric.WithAttributeSet(attribute.NewSet(AttrNamespace.String(e.Namespace)))
		o.pushed.Add(ctx, int64(e.Diffs), nsSet)
		if e.Delta > 0 {
			o.delta.Add(ctx, e.Delta, nsSet)
		}
	}
	if span, ok := ownSpan(ctx, e.Op); ok {
		span.SetAttributes(attrs...)
		if e.Op == ratelimit.OpPush {
			span.SetAttributes(attribute.Int("ratelimit.push.diffs", e.Diffs), attribute.Int("ratelimit.push.reads", e.Reads))
		}
		if e.Err != nil {
			span.RecordError(e.Err)
			span.SetStatus(codes.Error, e.Err.Error())
		}
		span.End()
	}
}

func (o *Observer) set(k attrKey) attribute.Set {
	if s, ok := o.attrs.Load(k); ok {
		return s.(attribute.Set)
	}
	var s attribute.Set
	if k.kind == 0 {
		decision := "rejected"
		if k.allowed {
			decision = "allowed"
		}
		s = attribute.NewSet(AttrNamespace.String(k.ns), AttrPolicy.String(k.policy), AttrDecision.String(decision), AttrDegraded.Bool(k.degraded))
	} else {
		s = attribute.NewSet(AttrNamespace.String(k.ns), AttrPolicy.String(k.policy))
	}
	o.attrs.Store(k, s)
	return s
}

// Decision implements ratelimit.Observer: it counts the decision and records
// its latency and Retry-After; in synchronous mode it ends the check's span.
func (o *Observer) Decision(ctx context.Context, e ratelimit.DecisionEvent) {
	span, traced := ownSpan(ctx, ratelimit.OpCheck)
	if e.Err != nil {
		if traced {
			span.RecordError(e.Err)
			span.SetStatus(codes.Error, e.Err.Error())
			span.End()
		}
		return
	}
	d := e.Decision
	policy := d.Limit.PolicyName()
	o.decisions.Add(ctx, 1, metric.WithAttributeSet(o.set(attrKey{ns: e.Namespace, policy: policy, allowed: d.Allowed, degraded: d.Degraded})))
	per := metric.WithAttributeSet(o.set(attrKey{ns: e.Namespace, policy: policy, kind: 1}))
	o.decisionDur.Record(ctx, e.Duration.Seconds(), per)
	if !d.Allowed {
		o.retryAfter.Record(ctx, d.RetryAfter.Seconds(), per)
	}
	if traced {
		span.SetAttributes(AttrNamespace.String(e.Namespace), AttrPolicy.String(policy),
			attribute.Bool("ratelimit.allowed", d.Allowed), AttrDegraded.Bool(d.Degraded))
		if !d.Allowed {
			span.SetAttributes(attribute.Float64("ratelimit.retry_after", d.RetryAfter.Seconds()))
		}
		span.End()
	}
}
