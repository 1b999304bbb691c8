package postgres

// Watches: how a node learns which counters of a window changed since its
// last push, without reading every key it holds.
//
// Every push statement appends, in its own transaction, one row per window
// it changed to the change log: the keys, under the transaction's ID (xid8,
// as bigint). A watch lists the keys of the log rows from transaction
// "from" on, and their current totals; its next cursor is the xmin of the
// statement's snapshot: every transaction below it had finished when the
// statement looked, so every change the statement did not see belongs to a
// transaction at or above it, including transactions still in flight whose
// IDs are below IDs the statement saw (IDs are assigned at a transaction's
// first write, not in commit order). A key may so be listed twice, which the
// contract allows; none is skipped.
//
// The node's own statement is left out of its next watch (the cursor names
// it): the totals it returned are the ones the watch would list.
//
// A cursor is valid on one incarnation of the tables (see buildSQL) and only
// while the log holds every entry from its xmin on (Purge replaces entries
// older than Options.ChangeRetention by a marker); otherwise the answer is
// an Overflow.

import (
	"cmp"
	"context"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ratesync/ratelimit/strategy"
)

// cursorVersion starts every cursor this store hands out.
const cursorVersion = "1"

// maxCursorXIDs bounds the own transactions a cursor names (a batch in many
// parts has one per part); the others are listed again, harmlessly.
const maxCursorXIDs = 16

// cursor is a parsed Watch.Cursor.
type cursor struct {
	inc  string  // the incarnation it is valid on ("" for none: never valid)
	from int64   // list the log from this transaction ID on; -1: the window from the start
	own  []int64 // transactions whose entries are left out
}

func parseCursor(s string) cursor {
	if s == "" {
		return cursor{from: -1}
	}
	parts := strings.Split(s, "/")
	if len(parts) != 4 || parts[0] != cursorVersion || parts[1] == "" {
		return cursor{} // not one of this store's: never valid
	}
	from, err := strconv.ParseInt(parts[2], 10, 64)
	if err != nil || from < 0 {
		return cursor{}
	}
	c := cursor{inc: parts[1], from: from}
	if parts[3] != "" {
		for x := range strings.SplitSeq(parts[3], ",") {
			xid, err := strconv.ParseInt(x, 10, 64)
			if err != nil {
				return cursor{}
			}
			c.own = append(c.own, xid)
		}
	}
	return c
}

func formatCursor(inc string, xmin int64, own []int64) string {
	var b strings.Builder
	b.WriteString(cursorVersion + "/" + inc + "/" + strconv.FormatInt(xmin, 10) + "/")
	for i, x := range own {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.FormatInt(x, 10))
	}
	return b.String()
}

// watchPlan is one watch of a batch.
type watchPlan struct {
	w    strategy.Watch
	size int64 // milliseconds; 0 when w.Size names no window the store holds
	cur  cursor
	// The batch's diffs rows [lo, hi) are in the watched window (the rows
	// are sorted by window).
	lo, hi int
}

func (p *plan) planWatches(b *strategy.Batch) {
	p.src = b
	for _, w := range b.Watches {
		wp := watchPlan{w: w, cur: parseCursor(w.Cursor)}
		if wholeMillis(w.Size) {
			wp.size = w.Size.Milliseconds()
		}
		// Sorted by window, the batch's rows of this window are a range.
		win := func(u int) int {
			if c := cmp.Compare(p.diffs.sizes[u], wp.size); c != 0 {
				return c
			}
			return cmp.Compare(p.diffs.starts[u], w.Start)
		}
		wp.lo = sort.Search(p.diffs.len(), func(u int) bool { return win(u) >= 0 })
		wp.hi = sort.Search(p.diffs.len(), func(u int) bool { return win(u) > 0 })
		p.watches = append(p.watches, wp)
	}
}

// maxWatchLimit bounds Watch.Limit in statements (limit + 1 stays a bigint).
const maxWatchLimit = 1 << 53

// watchArgsOf are the statement's watch parameters.
type watchArgsOf struct {
	sizes, starts, from, lim []int64
	inc                      []string
	ownW, ownX               []int64
}

// watchArgs returns the parameters of watches; extraOwn are transactions of
// the batch itself (its parts) to leave out of every listing.
func watchArgs(watches []watchPlan, extraOwn []int64) watchArgsOf {
	var a watchArgsOf
	for i, w := range watches {
		a.sizes = append(a.sizes, w.size)
		a.starts = append(a.starts, w.w.Start)
		a.from = append(a.from, w.cur.from)
		a.inc = append(a.inc, w.cur.inc)
		// The batch's own counters of the window are listed anyway: when
		// they alone pass the limit, the answer is an Overflow and the
		// statement lists nothing.
		own, limit := w.hi-w.lo, min(max(w.w.Limit, 0), maxWatchLimit)
		lim := int64(0)
		if own <= limit {
			lim = int64(limit) + 1
		}
		a.lim = append(a.lim, lim)
		for _, x := range slices.Concat(w.cur.own, extraOwn) {
			a.ownW = append(a.ownW, int64(i+1))
			a.ownX = append(a.ownX, x)
		}
	}
	return a
}

// watchAnswer is what a statement answered for one watch.
type watchAnswer struct {
	answered bool
	keys     []string // the keys listed, and their totals
	counts   []int64
	inc      string // the incarnation
	listed   int64  // how many keys the statement found (-1: the cursor is not valid)
	xmin     int64  // the statement's snapshot's xmin: the next cursor
	// ownFirst says the listing was read before the batch's own writes (in
	// the statement that made them): the batch's totals are newer than the
	// listing's. Otherwise the listing is at least as new.
	ownFirst bool
}

// changes assembles the answers to p's watches: the statements' listings
// and the batch's own counters of each window (with totals), the cursors
// (naming xids, the batch's own transactions), the overflows.
func (p *plan) changes(watched []watchAnswer, totals []int64, xids []int64) []strategy.Changes {
	out := make([]strategy.Changes, len(p.watches))
	for i, w := range p.watches {
		a := &watched[i]
		var own []int64
		for _, x := range xids {
			if x >= a.xmin && len(own) < maxCursorXIDs {
				own = append(own, x)
			}
		}
		c := strategy.Changes{Cursor: formatCursor(a.inc, a.xmin, own)}
		limit := max(w.w.Limit, 0)
		if !a.answered || a.listed < 0 || a.listed > int64(limit) || w.hi-w.lo > limit {
			c.Overflow = true
			out[i] = c
			continue
		}
		id := strategy.CounterID{Size: w.w.Size, Start: w.w.Start}
		at := make(map[string]int, len(a.keys)+w.hi-w.lo)
		for k, key := range a.keys {
			id.Key = key
			at[key] = len(c.Counters)
			c.Counters = append(c.Counters, strategy.Counter{CounterID: id, Count: a.counts[k]})
		}
		for u := w.lo; u < w.hi; u++ {
			i := p.perm[p.first[u]]
			key, total := p.src.Diffs[i].Key, totals[i]
			if k, ok := at[key]; ok {
				if a.ownFirst {
					c.Counters[k].Count = total
				}
				continue
			}
			id.Key = key
			at[key] = len(c.Counters)
			c.Counters = append(c.Counters, strategy.Counter{CounterID: id, Count: total})
		}
		if len(c.Counters) > limit {
			c = strategy.Changes{Cursor: c.Cursor, Overflow: true}
		}
		out[i] = c
	}
	return out
}

// watchAfter answers p's watches in a statement of its own, once every part
// of the batch is committed, leaving out the parts' transactions xids.
func (s *Store) watchAfter(ctx context.Context, p *plan, xids []int64) (*answer, error) {
	pt := part{ns: p.ns, watches: p.watches}
	var ans *answer
	_, err := s.retry(ctx, true, false, func(conn *pgxpool.Conn) error {
		ans = newAnswer(&pt)
		return s.readInto(ctx, conn, &pt, rows{}, bucketRows{}, xids, ans)
	})
	return ans, err
}
