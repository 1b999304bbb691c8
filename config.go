package ratelimit

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/ratesync/ratelimit/strategy"
)

// DefaultNamespace is the namespace an empty Config.Namespace means.
const DefaultNamespace = "default"

// FetchScope says which counters a node learns from the store.
type FetchScope int

const (
	// FetchSeen, the default, reads the keys this node has seen (read or
	// written, by Increment or SlidingWindow) in the current or previous
	// window. Memory follows this node's traffic.
	FetchSeen FetchScope = iota
	// FetchAll reads every key of the namespace, as Kong does: each node holds
	// the whole namespace (up to MaxKeys).
	FetchAll
)

// ColdRead says whether a periodic namespace reads a cold key's totals from
// the store before its first decision.
type ColdRead int

const (
	// ColdReadOn, the default, makes the first decision (Allow, Peek,
	// Increment, SlidingWindow) for a key this node does not hold (never seen,
	// or evicted since) in periodic mode wait for one read of the key's
	// current and previous windows from the store, so a client that spent
	// its budget on another node is not given a fresh one here. Concurrent
	// cold keys share one round trip. The wait is bounded by SyncTimeout; on
	// a store error or timeout the decision is made from this node's state
	// (Allow's Decision has Degraded set) and the hit is counted. Local and
	// synchronous modes never read a cold key first (synchronous mode reads
	// every key through).
	ColdReadOn ColdRead = iota
	// ColdReadOff judges a cold key from this node's state alone, as if no
	// other node had counted it, until the next sync cycle reads it.
	ColdReadOff
)

// MaxWindow is the longest window size: 100 years. A store keeps a window
// for twice its size and more, and 2 × 146 years would overflow a
// time.Duration.
const MaxWindow = strategy.MaxWindow

// Config defines a namespace. The zero value of every field but WindowSizes
// (and Strategy, unless SyncRate < 0) is a documented default.
type Config struct {
	// Namespace names the namespace; "" means "default".
	Namespace string
	// WindowSizes lists the window sizes the namespace counts, each a positive
	// whole number of milliseconds. Required.
	WindowSizes []time.Duration
	// SyncRate selects the mode: > 0 syncs in the background every SyncRate
	// (aligned to SyncRate boundaries on the clock); 0 writes every Increment
	// through to the store; < 0 keeps counters local, with no store and no
	// goroutine. Default 0 (synchronous).
	SyncRate time.Duration
	// Strategy is the central store. It may be nil only when SyncRate < 0.
	Strategy strategy.Strategy
	// Clock returns the current time. Default: time.Now to the millisecond,
	// cached as Kong's ngx.now() is: a goroutine of the namespace stores the
	// time every millisecond while the namespace is in use, and a check reads
	// it in one atomic load (readings lag by a millisecond at most, and Wait
	// reads the time itself). Set it to inject a clock in tests (Wait then
	// sleeps on the system clock: inject a clock that follows it).
	Clock func() time.Time
	// MaxKeys caps the keys the namespace tracks in memory; beyond it the
	// least recently used keys are evicted (their unsynced hits are kept and
	// pushed). Default 1<<20.
	MaxKeys int
	// MaxKeyLength: keys longer than this many bytes are replaced by a hash of
	// themselves (SHA-256). Default 256; at least 64, the length of a hashed key.
	MaxKeyLength int
	// SyncTimeout bounds each store call: a sync cycle's push, a fetch, and in
	// synchronous mode each write-through. Default 1 s.
	SyncTimeout time.Duration
	// FetchScope selects which counters a node reads from the store. Default
	// FetchSeen.
	FetchScope FetchScope
	// ColdRead selects whether, in periodic mode, a key this node does not
	// hold is read from the store before its first decision. Default
	// ColdReadOn; the zero value is on so that a periodic namespace does not
	// over-admit clients moving between nodes unless asked to.
	ColdRead ColdRead
	// RetryInterval is how often a synchronous-mode namespace (SyncRate 0)
	// pushes hits whose write-through failed. Default 1 s.
	RetryInterval time.Duration
	// MaxBackoff caps the delay between sync attempts while the store keeps
	// failing (the delay doubles from SyncRate, with jitter). Default 5 s.
	MaxBackoff time.Duration
	// MaxClockSkew is the largest difference expected between node clocks.
	// Within MaxClockSkew of a window's end, each periodic sync also reads the
	// next window, so a node whose clock is behind follows the nodes already
	// in it instead of spending a limit of its own. Default 5 s; negative
	// disables it.
	MaxClockSkew time.Duration
	// PurgeInterval is how often the sync loop asks the store to purge
	// expired windows. Default 1 min.
	PurgeInterval time.Duration
	// Logger receives one line per failing sync (rate limited) and recovery.
	// Default: no logging.
	Logger *slog.Logger
	// Observer is told about every decision of Allow, sync cycle and store
	// call, for metrics and tracing (see metrics.Collector and the
	// ratelimitotel module). Default nil: nothing is observed, at no cost.
	Observer Observer
	// HotKeys configures the hot-key report (Namespace.HotKeys). Default:
	// off, at no cost.
	HotKeys HotKeysConfig
}

func (c *Config) normalize() error {
	bad := func(field, format string, args ...any) error {
		return fmt.Errorf("%w: %s: %s", ErrInvalidConfig, field, fmt.Sprintf(format, args...))
	}
	if len(c.WindowSizes) == 0 {
		return bad("WindowSizes", "at least one window size is required")
	}
	seen := map[time.Duration]bool{}
	for _, w := range c.WindowSizes {
		if w <= 0 || w%time.Millisecond != 0 {
			return bad("WindowSizes", "%v is not a positive whole number of milliseconds", w)
		}
		if w > MaxWindow {
			return bad("WindowSizes", "%v is longer than MaxWindow (%v)", w, MaxWindow)
		}
		if seen[w] {
			return bad("WindowSizes", "%v is listed twice", w)
		}
		seen[w] = true
	}
	c.WindowSizes = append([]time.Duration(nil), c.WindowSizes...)
	if c.SyncRate >= 0 && c.Strategy == nil {
		return bad("Strategy", "required unless SyncRate < 0")
	}
	if c.SyncRate > 0 && c.SyncRate < time.Millisecond {
		return bad("SyncRate", "%v is below the 1 ms minimum", c.SyncRate)
	}
	for _, f := range []struct {
		name string
		v    *time.Duration
		def  time.Duration
	}{
		{"SyncTimeout", &c.SyncTimeout, time.Second},
		{"RetryInterval", &c.RetryInterval, time.Second},
		{"MaxBackoff", &c.MaxBackoff, 5 * time.Second},
		{"PurgeInterval", &c.PurgeInterval, time.Minute},
	} {
		if *f.v < 0 {
			return bad(f.name, "must not be negative")
		}
		if *f.v == 0 {
			*f.v = f.def
		}
	}
	if c.MaxClockSkew == 0 {
		c.MaxClockSkew = 5 * time.Second
	}
	if c.MaxKeys < 0 {
		return bad("MaxKeys", "must not be negative")
	}
	if c.MaxKeys == 0 {
		c.MaxKeys = 1 << 20
	}
	if c.MaxKeyLength < 0 {
		return bad("MaxKeyLength", "must not be negative")
	}
	if c.MaxKeyLength == 0 {
		c.MaxKeyLength = 256
	}
	if c.MaxKeyLength < 64 {
		return bad("MaxKeyLength", "must be at least 64, the length of a hashed key")
	}
	if err := c.HotKeys.normalize(); err != nil {
		return err
	}
	if c.FetchScope != FetchSeen && c.FetchScope != FetchAll {
		return bad("FetchScope", "unknown scope %d", c.FetchScope)
	}
	if c.ColdRead != ColdReadOn && c.ColdRead != ColdReadOff {
		return bad("ColdRead", "unknown setting %d", c.ColdRead)
	}
	return nil
}

// clock fills the default of Clock (time.Now) and returns the namespace's
// clock in Unix milliseconds: a tickClock's cached reading when Clock was
// nil (returned too, for the namespace to close), Clock's otherwise.
// normalize leaves Clock alone, so the two may run in either order.
func (c *Config) clock() (unixMilli func() int64, tick *tickClock) {
	if c.Clock == nil {
		c.Clock = time.Now
		tick = newTickClock()
		return tick.unixMilli, tick
	}
	clock := c.Clock
	return func() int64 { return clock().UnixMilli() }, nil
}
