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
	// Clock returns the current time. Default: time.Now, to the millisecond,
	// read more cheaply: one monotonic clock read per call plus an offset to
	// the wall clock that is refreshed every second, so a step of the wall
	// clock shows within a second. Set it to inject a clock in tests, or to a
	// CoarseClock's Now where even one clock read per call costs too much.
	Clock func() time.Time
	// MaxKeys caps the keys the namespace tracks in memory; beyond it the
	// least recently used keys are evicted (their unsynced hits are kept and
	// pushed). Default 1<<20.
	MaxKeys int
	// MaxKeyLength: keys longer than this many bytes are replaced by a hash of
	// themselves (SHA-256). Default 256.
	MaxKeyLength int
	// SyncTimeout bounds each store call: a sync cycle's push, a fetch, and in
	// synchronous mode each write-through. Default 1 s.
	SyncTimeout time.Duration
	// FetchScope selects which counters a node reads from the store. Default
	// FetchSeen.
	FetchScope FetchScope
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
	if c.Clock == nil {
		c.Clock = time.Now
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
	if c.FetchScope != FetchSeen && c.FetchScope != FetchAll {
		return bad("FetchScope", "unknown scope %d", c.FetchScope)
	}
	return nil
}
