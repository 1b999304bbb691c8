package lab

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/ratesync/ratelimit"
	"github.com/ratesync/ratelimit/cmd/ratelimit-lab/internal/analysis"
)

// SyncCycles summarises the nodes' sync cycles during the traffic, as
// Config.Observer sees them (OpSync): by the core's loop on the wall clock,
// by the lab's Sync calls in simulated runs. Durations are wall time.
type SyncCycles struct {
	Cycles int64   `json:"cycles"`
	Errors int64   `json:"errors"`
	Mean   float64 `json:"mean_ns"`
	P50    int64   `json:"p50_ns"`
	P99    int64   `json:"p99_ns"`
	Max    int64   `json:"max_ns"`
}

// cycleObserver records OpSync durations while on. It is the nodes'
// Config.Observer when Config.SyncCycles is set; every other event is
// ignored (the namespace still calls Decision once per check, a cost that
// only runs with SyncCycles pay).
type cycleObserver struct {
	mu     sync.Mutex
	on     bool
	hist   analysis.Histogram
	errors int64
}

func (o *cycleObserver) Start(ctx context.Context, _ ratelimit.Op) context.Context { return ctx }

func (o *cycleObserver) End(_ context.Context, e ratelimit.Event) {
	if e.Op != ratelimit.OpSync {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.on {
		return
	}
	o.hist.Record(int64(e.Duration))
	if e.Err != nil {
		o.errors++
	}
}

func (o *cycleObserver) Decision(context.Context, ratelimit.DecisionEvent) {}

func (o *cycleObserver) set(on bool) {
	o.mu.Lock()
	o.on = on
	o.mu.Unlock()
}

func (o *cycleObserver) summary() SyncCycles {
	o.mu.Lock()
	defer o.mu.Unlock()
	h := &o.hist
	return SyncCycles{Cycles: int64(h.Count()), Errors: o.errors, Mean: h.Mean(), P50: h.Quantile(0.5), P99: h.Quantile(0.99), Max: h.Max()}
}

// redisCPU returns the Redis server's CPU time so far (INFO cpu:
// used_cpu_sys + used_cpu_user, main process), in seconds.
func redisCPU(ctx context.Context, addr string) (float64, error) {
	c := goredis.NewClient(&goredis.Options{Addr: addr, DialTimeout: 2 * time.Second, ReadTimeout: 2 * time.Second, WriteTimeout: 2 * time.Second, MaxRetries: 1})
	defer c.Close()
	info, err := c.Info(ctx, "cpu").Result()
	if err != nil {
		return 0, err
	}
	return parseCPU(info)
}

// parseCPU reads used_cpu_sys + used_cpu_user from an INFO cpu reply.
func parseCPU(info string) (float64, error) {
	var sum float64
	var found int
	for line := range strings.SplitSeq(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || (k != "used_cpu_sys" && k != "used_cpu_user") {
			continue
		}
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return 0, fmt.Errorf("INFO cpu: %s: %w", line, err)
		}
		sum += f
		found++
	}
	if found != 2 {
		return 0, fmt.Errorf("INFO cpu: no used_cpu_sys and used_cpu_user (got %q)", info)
	}
	return sum, nil
}

// FleetDefaults turns c into the fleet scenario of seed 002, scaled to a
// small machine, for whatever the caller left unset: Zipf keys (s = 1.1, so
// most keys are idle and a few are hot), Poisson arrivals, round-robin over
// the nodes, a periodic sync, 100 per minute per key, a 2 s warm-up, and the
// sync cycles recorded. keys is the key count (seed: 1,000,000 clients);
// total is the offered hits/s over all keys (the seed's 1.7M/s does not fit
// on two cores with the store on them: the scale is the caller's).
func FleetDefaults(c *Config, keys int, total float64) {
	c.Keys = keys
	c.Dist = "zipf"
	if c.ZipfS == 0 {
		c.ZipfS = 1.1
	}
	c.Poisson = true
	if c.LB == "" {
		c.LB = "round-robin"
	}
	if len(c.Limits) == 0 {
		c.Limits = []Limit{{Window: time.Minute, Max: 100}}
	}
	c.Rate = total / float64(keys)
	c.SyncCycles = true
}

// Fleet runs base once per node count and returns every result.
func Fleet(ctx context.Context, base Config, nodes []int, progress func(Config)) ([]*Result, error) {
	if base.SyncRate <= 0 {
		return nil, fmt.Errorf("fleet: a periodic sync (sync-rate > 0) is the scenario, not %v", base.SyncRate)
	}
	return Sweep(ctx, base, nodes, []time.Duration{base.SyncRate}, progress)
}
