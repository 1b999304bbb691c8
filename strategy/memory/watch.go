package memory

import (
	"slices"
	"strconv"
	"strings"

	"github.com/ratesync/ratelimit/strategy"
)

// change records that a counter changed at a version of its window.
type change struct {
	ver  uint64
	hash uint64
	key  string
}

// bump starts a new version of c for the push of batch id: its changes are
// tagged with it. A batch's diffs of one window share one version.
func (c *counters) bump(id string) {
	if id == "" || id != c.lastBatch {
		c.ver++
		c.lastBatch = id
	}
}

// changed records that sl changed at c's current version. The log is
// compacted (each counter once, at its last change) when it grows past twice
// the counters, so its memory stays proportional to the window's.
func (c *counters) changed(sl *counter) {
	sl.ver = c.ver
	c.log = append(c.log, change{ver: c.ver, hash: sl.hash, key: sl.key})
	if len(c.log) > 2*c.n+64 {
		c.compact()
	}
}

func (c *counters) compact() {
	c.log = c.log[:0]
	for i := range c.slots {
		if sl := &c.slots[i]; sl.hash != 0 {
			c.log = append(c.log, change{ver: sl.ver, hash: sl.hash, key: sl.key})
		}
	}
	slices.SortFunc(c.log, func(a, b change) int {
		switch {
		case a.ver < b.ver:
			return -1
		case a.ver > b.ver:
			return 1
		}
		return 0
	})
}

func (c *counters) cursor() string {
	return strconv.FormatUint(c.inc, 10) + "." + strconv.FormatUint(c.ver, 10)
}

// since answers w, a Watch of c (nil when the store holds no such window).
func (c *counters) since(w strategy.Watch) strategy.Changes {
	cursor, limit := w.Cursor, w.Limit
	if c == nil {
		// Nothing yet: the next answer lists every counter from the start.
		return strategy.Changes{Cursor: ""}
	}
	out := strategy.Changes{Cursor: c.cursor()}
	var from uint64
	if cursor != "" {
		inc, ver, ok := strings.Cut(cursor, ".")
		n, err1 := strconv.ParseUint(inc, 10, 64)
		v, err2 := strconv.ParseUint(ver, 10, 64)
		if !ok || err1 != nil || err2 != nil || n != c.inc || v > c.ver {
			out.Overflow = true // another incarnation's cursor: the window was lost since
			return out
		}
		from = v
	}
	i, _ := slices.BinarySearchFunc(c.log, from+1, func(ch change, v uint64) int {
		switch {
		case ch.ver < v:
			return -1
		case ch.ver > v:
			return 1
		}
		return 0
	})
	if len(c.log)-i > limit {
		// More changes than the limit, counting repeats: the contract lets
		// a store answer an overflow without finding out which.
		return strategy.Changes{Cursor: out.Cursor, Overflow: true}
	}
	for _, ch := range c.log[i:] {
		n, ok := c.lookupVer(ch.hash, ch.key, ch.ver)
		if !ok {
			continue // changed again later: listed at its last change
		}
		if len(out.Counters) == limit {
			return strategy.Changes{Cursor: out.Cursor, Overflow: true}
		}
		out.Counters = append(out.Counters, strategy.Counter{CounterID: strategy.CounterID{Key: ch.key, Size: w.Size, Start: w.Start}, Count: n})
	}
	return out
}

// lookupVer returns key's total when its last change was at version ver.
func (c *counters) lookupVer(h uint64, key string, ver uint64) (int64, bool) {
	m := uint64(len(c.slots) - 1)
	for i := h & m; ; i = (i + 1) & m {
		sl := &c.slots[i]
		if sl.hash == h && sl.key == key {
			return sl.n, sl.ver == ver
		}
		if sl.hash == 0 {
			return 0, false
		}
	}
}
