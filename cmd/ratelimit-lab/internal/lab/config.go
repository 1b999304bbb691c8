// Package lab runs simulated clusters of rate-limiter nodes against a store
// and measures what a configuration costs (checks/s, latency, store traffic,
// memory) and buys (accuracy against an exact reference limiter).
package lab

import (
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/ratesync/ratelimit"
)

// Limit is one policy of a run: at most Max hits per Window and key.
type Limit struct {
	Window time.Duration `json:"window"`
	Max    int64         `json:"max"`
}

// String formats l as the -limit flag reads it, for example "100/1s".
func (l Limit) String() string { return fmt.Sprintf("%d/%v", l.Max, l.Window) }

// ParseLimit reads "MAX/WINDOW", for example "100/1s" or "5000/1m".
func ParseLimit(s string) (Limit, error) {
	m, w, ok := strings.Cut(s, "/")
	if !ok {
		return Limit{}, fmt.Errorf("limit %q: want MAX/WINDOW, e.g. 100/1s", s)
	}
	n, err := strconv.ParseInt(m, 10, 64)
	if err != nil || n <= 0 {
		return Limit{}, fmt.Errorf("limit %q: MAX must be a positive integer", s)
	}
	d, err := time.ParseDuration(w)
	if err != nil || d <= 0 || d%time.Millisecond != 0 {
		return Limit{}, fmt.Errorf("limit %q: WINDOW must be a positive whole number of milliseconds", s)
	}
	return Limit{Window: d, Max: n}, nil
}

// Config describes one run. The zero value of every field but Limits is a
// documented default after Normalize.
type Config struct {
	// Nodes is how many registries (nodes) share the store. Default 4.
	Nodes int `json:"nodes"`
	// Strategy is "memory" (default: one in-process store shared by the
	// nodes), "redis" or "postgres".
	Strategy    string `json:"strategy"`
	RedisAddr   string `json:"redis_addr,omitempty"`   // default 127.0.0.1:6379
	PostgresDSN string `json:"postgres_dsn,omitempty"` // default postgres://postgres@127.0.0.1:5432/test
	// SyncRate is the nodes' SyncRate: > 0 asynchronous, 0 synchronous
	// (write-through), < 0 local only (the nodes share nothing).
	SyncRate time.Duration `json:"sync_rate"`
	// SyncTimeout is the nodes' SyncTimeout (each store call's bound). Default
	// 0: the core's default, 1 s.
	SyncTimeout time.Duration `json:"sync_timeout,omitempty"`
	// Limits are checked on every hit (Allow with all of them). Required.
	Limits []Limit `json:"limits"`
	// Algorithm is every limit's algorithm, as ratelimit.ParseAlgorithm
	// reads it: "sliding_window" (default), "fixed_window", "token_bucket"
	// (or "gcra") or "sliding_log". Normalize spells it as
	// ratelimit.Algorithm.String does.
	Algorithm string `json:"algorithm"`
	// Burst is the token bucket's capacity (Limit.Burst) for every limit;
	// 0 means Max. Only with the token bucket.
	Burst int64 `json:"burst,omitempty"`
	// Fixed checks fixed windows instead of sliding ones: the same as
	// Algorithm "fixed_window" (Normalize sets it from Algorithm).
	Fixed bool `json:"fixed"`
	// Duration is how long traffic runs: wall time, or simulated time when
	// Simulated. Default 10 s.
	Duration time.Duration `json:"duration"`
	// Keys is the number of distinct keys. Default 100.
	Keys int `json:"keys"`
	// Dist is how hits spread over keys: "uniform" (default) or "zipf".
	Dist string `json:"dist"`
	// ZipfS is the Zipf exponent (> 1). Default 1.1.
	ZipfS float64 `json:"zipf_s,omitempty"`
	// LB is the load-balancing policy: "round-robin" (default), "random" or
	// "hash" (by key: a key always goes to the same node).
	LB string `json:"lb"`
	// Rate is the mean offered rate per key in hits/s. When 0 it is Load
	// times the first limit's rate (Max/Window).
	Rate float64 `json:"rate"`
	// Load is the offered rate relative to the first limit; used when Rate
	// is 0. Default 1.5 (above the limit).
	Load float64 `json:"load,omitempty"`
	// Unpaced drives checks as fast as the workers can (wall time only):
	// keys are drawn from Dist and Rate/Load are ignored.
	Unpaced bool `json:"unpaced"`
	// Poisson makes arrivals a Poisson process; default: perfectly even
	// (every 1/rate, from a random phase per key).
	Poisson bool `json:"poisson"`
	// Warmup leaves the run's first Warmup of hits out of the accuracy counts
	// (they still fill the reference windows), and the windows that start in
	// it out of the over-admission figures: on the wall clock, the nodes'
	// first sync cycles (dialing, loading scripts) land late. Default 0.
	Warmup time.Duration `json:"warmup,omitempty"`
	// Simulated runs on an injected clock advanced by the generator, with
	// every node synced at each SyncRate boundary of that clock: the run is
	// deterministic for a seed and takes no longer than the work it does.
	Simulated bool `json:"simulated"`
	// SyncPasses is how many sync cycles every node runs at each boundary in
	// simulated runs. Default 1, as the core's loop does; 2 lets every node
	// learn the hits that nodes syncing after it pushed at the same boundary
	// (the ideal "everyone knows everything at the boundary" case).
	SyncPasses int `json:"sync_passes,omitempty"`
	// Workers is the number of goroutines that send checks in wall-time
	// runs. Default GOMAXPROCS, or 32 in synchronous mode.
	Workers int `json:"workers"`
	// Seed seeds every random choice. Default 1.
	Seed uint64 `json:"seed"`
	// MaxRecords caps the hits recorded for the accuracy analysis. Default
	// 20,000,000 (16 bytes each).
	MaxRecords int `json:"max_records"`
	// SyncCycles records every node's sync cycle durations (Result.Sync)
	// through Config.Observer, which costs an Observer call per check.
	SyncCycles bool `json:"sync_cycles,omitempty"`
	// Progress, when not nil, receives a progress line every second.
	Progress func(string) `json:"-"`
}

// Normalize fills in defaults and validates c.
func (c *Config) Normalize() error {
	if c.Nodes == 0 {
		c.Nodes = 4
	}
	if c.Nodes < 1 || c.Nodes > 1<<15 {
		return errors.New("nodes: must be between 1 and 32768")
	}
	if c.Strategy == "" {
		c.Strategy = "memory"
	}
	switch c.Strategy {
	case "memory", "redis", "postgres":
	default:
		return fmt.Errorf("strategy: %q is not memory, redis or postgres", c.Strategy)
	}
	if c.RedisAddr == "" {
		c.RedisAddr = "127.0.0.1:6379"
	}
	if c.PostgresDSN == "" {
		c.PostgresDSN = "postgres://postgres@127.0.0.1:5432/test"
	}
	if len(c.Limits) == 0 {
		return errors.New("limits: at least one is required")
	}
	if c.Algorithm == "" && c.Fixed {
		c.Algorithm = "fixed_window"
	}
	alg, err := ratelimit.ParseAlgorithm(c.Algorithm)
	if err != nil {
		return fmt.Errorf("algorithm: %w", err)
	}
	if c.Fixed && alg != ratelimit.FixedWindow {
		return fmt.Errorf("algorithm: fixed (mode fixed) and %s together", alg)
	}
	c.Algorithm, c.Fixed = alg.String(), alg == ratelimit.FixedWindow
	if c.Burst < 0 || (c.Burst != 0 && alg != ratelimit.TokenBucket) {
		return fmt.Errorf("burst: %d is for the token bucket only, and must be positive (0 means Max)", c.Burst)
	}
	if c.SyncRate > 0 && c.SyncRate < time.Millisecond {
		return errors.New("sync-rate: below the 1 ms minimum")
	}
	if c.Duration == 0 {
		c.Duration = 10 * time.Second
	}
	if c.Duration < 0 {
		return errors.New("duration: must be positive")
	}
	if c.Keys == 0 {
		c.Keys = 100
	}
	if c.Keys < 1 {
		return errors.New("keys: must be positive")
	}
	if c.Dist == "" {
		c.Dist = "uniform"
	}
	if c.Dist != "uniform" && c.Dist != "zipf" {
		return fmt.Errorf("dist: %q is not uniform or zipf", c.Dist)
	}
	if c.ZipfS == 0 {
		c.ZipfS = 1.1
	}
	if c.Dist == "zipf" && c.ZipfS <= 1 {
		return errors.New("zipf-s: must be above 1")
	}
	switch c.LB {
	case "":
		c.LB = "round-robin"
	case "round-robin", "random", "hash":
	default:
		return fmt.Errorf("lb: %q is not round-robin, random or hash", c.LB)
	}
	if c.Rate < 0 || c.Load < 0 {
		return errors.New("rate, load: must not be negative")
	}
	if c.Rate == 0 {
		if c.Load == 0 {
			c.Load = 1.5
		}
		c.Rate = c.Load * float64(c.Limits[0].Max) / c.Limits[0].Window.Seconds()
	} else {
		c.Load = c.Rate / (float64(c.Limits[0].Max) / c.Limits[0].Window.Seconds())
	}
	if c.Warmup < 0 || c.Warmup >= c.Duration {
		return errors.New("warmup: must be at least 0 and below duration")
	}
	if c.Unpaced && c.Simulated {
		return errors.New("unpaced: needs wall time, not a simulated run")
	}
	if c.Workers == 0 {
		c.Workers = runtime.GOMAXPROCS(0)
		if c.SyncRate == 0 {
			c.Workers = 32
		}
	}
	if c.Workers < 1 {
		return errors.New("workers: must be positive")
	}
	if c.Seed == 0 {
		c.Seed = 1
	}
	if c.MaxRecords == 0 {
		c.MaxRecords = 20_000_000
	}
	return nil
}

// Alg returns c's algorithm (after Normalize).
func (c *Config) Alg() ratelimit.Algorithm {
	a, _ := ratelimit.ParseAlgorithm(c.Algorithm)
	if c.Fixed {
		return ratelimit.FixedWindow
	}
	return a
}

// Mode names the sync mode of c.
func (c *Config) Mode() string {
	switch {
	case c.SyncRate > 0:
		return "async"
	case c.SyncRate == 0:
		return "sync"
	}
	return "local"
}
