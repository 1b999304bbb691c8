package ratelimit

import (
	"github.com/ratesync/ratelimit/shm"
	"github.com/ratesync/ratelimit/strategy"
)

// A namespace keeps one state table per window size and kind: window counters
// (ns.tables, created with the namespace, two sizes per table), token buckets
// and sliding logs (created on first use, one per window size, so a namespace
// that never uses them pays nothing).

// caps returns the store's capabilities (none in local mode, where every
// algorithm is kept in memory).
func (ns *Namespace) caps() strategy.Capabilities { return ns.capabilities }

// bucketTable returns the token-bucket table of window size index i,
// creating it on first use.
func (ns *Namespace) bucketTable(i int) *shm.Buckets {
	if t := ns.buckets[i].Load(); t != nil {
		return t
	}
	ns.kindMu.Lock()
	defer ns.kindMu.Unlock()
	if t := ns.buckets[i].Load(); t != nil {
		return t
	}
	t, err := shm.NewBuckets(shm.BucketOptions{Period: ns.cfg.WindowSizes[i], MaxKeys: ns.cfg.MaxKeys, Track: ns.mode != modeLocal})
	if err != nil {
		panic(err) // the sizes and MaxKeys were validated by normalize
	}
	if ns.sealed {
		t.Seal()
	}
	ns.buckets[i].Store(t)
	return t
}

// seal seals every table the lean decision paths count in (see
// shm.Table.Seal), and those created from now on: once it returns, what
// they counted is in the tables for Close's flush, and they count nothing
// more.
func (ns *Namespace) seal() {
	ns.kindMu.Lock()
	defer ns.kindMu.Unlock()
	ns.sealed = true
	for _, t := range ns.tables {
		t.Seal()
	}
	for _, b := range ns.bucketTables() {
		b.t.Seal()
	}
}

// logTable returns the sliding-log table of window size index i, creating it
// on first use.
func (ns *Namespace) logTable(i int) *shm.Logs {
	if t := ns.logs[i].Load(); t != nil {
		return t
	}
	ns.kindMu.Lock()
	defer ns.kindMu.Unlock()
	if t := ns.logs[i].Load(); t != nil {
		return t
	}
	t, err := shm.NewLogs(ns.cfg.WindowSizes[i], ns.cfg.MaxKeys)
	if err != nil {
		panic(err) // the sizes and MaxKeys were validated by normalize
	}
	ns.logs[i].Store(t)
	return t
}

// bucketTables returns the token-bucket tables created so far, with their
// window size index.
func (ns *Namespace) bucketTables() []indexedBuckets {
	var out []indexedBuckets
	for i := range ns.buckets {
		if t := ns.buckets[i].Load(); t != nil {
			out = append(out, indexedBuckets{i, t})
		}
	}
	return out
}

type indexedBuckets struct {
	i int
	t *shm.Buckets
}
