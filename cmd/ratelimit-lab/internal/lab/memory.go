package lab

import (
	"context"
	"errors"
	"runtime"
	"time"

	"github.com/ratesync/ratelimit"
	"github.com/ratesync/ratelimit/strategy/memory"
)

// MemoryResult is the heap one tracked key costs.
type MemoryResult struct {
	Keys        int             `json:"keys"`
	Windows     []time.Duration `json:"windows"`
	Mode        string          `json:"mode"`
	HeapBytes   uint64          `json:"heap_bytes"`
	BytesPerKey float64         `json:"bytes_per_key"`
	TrackedKeys int             `json:"tracked_keys"`
}

// MeasureMemory counts one hit for each of n distinct keys (strings of 12
// bytes, "user:1000000" on, built for the call so the table's copies are
// counted) in every window of a fresh namespace, and returns the heap growth
// per tracked key after a GC. async uses an async namespace on a memory store
// (the store's own memory is not counted); otherwise the namespace is local.
func MeasureMemory(n int, windows []time.Duration, async bool) (*MemoryResult, error) {
	ctx := context.Background()
	cfg := ratelimit.Config{WindowSizes: windows, SyncRate: -1, MaxKeys: 2 * n}
	res := &MemoryResult{Keys: n, Windows: windows, Mode: "local"}
	if async {
		cfg.SyncRate, cfg.Strategy, res.Mode = time.Hour, memory.New(), "async"
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	reg := ratelimit.NewRegistry()
	ns, err := reg.New(cfg)
	if err != nil {
		return nil, err
	}
	for i := range n {
		k := keyName(i)
		for _, w := range windows {
			if _, err := ns.Increment(ctx, k, w, 1); err != nil {
				return nil, errors.Join(err, reg.Close(ctx))
			}
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	res.TrackedKeys = ns.Stats().TrackedKeys
	res.HeapBytes = after.HeapAlloc - before.HeapAlloc
	res.BytesPerKey = float64(res.HeapBytes) / float64(res.TrackedKeys)
	runtime.KeepAlive(ns)
	return res, reg.Close(ctx)
}

// Sweep runs base once per node count and SyncRate, in that order, and
// returns every result. progress, when not nil, is told before each run.
func Sweep(ctx context.Context, base Config, nodes []int, rates []time.Duration, progress func(Config)) ([]*Result, error) {
	var out []*Result
	for _, n := range nodes {
		for _, s := range rates {
			c := base
			c.Nodes, c.SyncRate = n, s
			c.Limits = append([]Limit(nil), base.Limits...)
			if progress != nil {
				progress(c)
			}
			r, err := Run(ctx, c)
			if err != nil {
				return out, err
			}
			out = append(out, r)
		}
	}
	return out, nil
}
