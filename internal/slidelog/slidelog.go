// Package slidelog is the sliding log's model: the entries of one key's log,
// each an admitted request's instant and cost, oldest first. The memory store
// and the rate limiter's local mode keep logs with it; the Redis and
// PostgreSQL stores implement the same rules in Lua and SQL.
package slidelog

import "github.com/ratesync/ratelimit/strategy"

// Entry is one request in a log.
type Entry struct {
	At   int64  // Unix ms
	Cost int64  // at least 0
	ID   string // the request's Take ID ("" in a node's local log)
}

// Log is one key's log for one window size, oldest entry first. The zero value
// is an empty log.
type Log struct {
	Entries []Entry
}

// Prune drops the entries that left the window (now - window, now].
func (l *Log) Prune(now, window int64) {
	i := 0
	for i < len(l.Entries) && l.Entries[i].At <= now-window {
		i++
	}
	if i > 0 {
		l.Entries = append(l.Entries[:0], l.Entries[i:]...)
	}
}

// Count returns the cost the log holds (after Prune: within its window).
func (l *Log) Count() int64 {
	var n int64
	for _, e := range l.Entries {
		n += e.Cost
	}
	return n
}

// Add appends e (its instant at least the newest entry's: an instant behind
// it counts at the newest entry's, so the log stays ordered and a clock that
// went back never shortens a wait). A log holds at most 2*max entries: past
// that (only limits with a penalty record rejected requests beyond max), e's
// cost joins the newest entry, which moves to e's instant: the cost is kept,
// and forgotten no earlier than it would have been.
func (l *Log) Add(e Entry, max int64) {
	if n := len(l.Entries); n > 0 {
		last := &l.Entries[n-1]
		e.At = maxInt(e.At, last.At)
		if int64(n) >= 2*maxInt(max, 1) {
			last.Cost += e.Cost
			last.At = e.At
			return
		}
	}
	l.Entries = append(l.Entries, e)
}

// Remove drops the entry of request id, and reports whether there was one.
func (l *Log) Remove(id string) bool {
	for i := range l.Entries {
		if l.Entries[i].ID == id {
			l.Entries = append(l.Entries[:i], l.Entries[i+1:]...)
			return true
		}
	}
	return false
}

// TakeBack takes cost back from the newest entries: a refund of a request
// that was not served.
func (l *Log) TakeBack(cost int64) {
	for cost > 0 && len(l.Entries) > 0 {
		last := &l.Entries[len(l.Entries)-1]
		if last.Cost > cost {
			last.Cost -= cost
			return
		}
		cost -= last.Cost
		l.Entries = l.Entries[:len(l.Entries)-1]
	}
}

// Fits reports whether cost more fits under max (after Prune).
func (l *Log) Fits(cost, max int64) bool { return l.Count()+cost <= max }

// State returns the log's state at now (after Prune) for a request of cost
// need under max.
func (l *Log) State(now, window, max, need int64) strategy.LogState {
	st := strategy.LogState{Count: l.Count(), Fits: now, Empty: now}
	if len(l.Entries) > 0 {
		st.Empty = maxInt(now, l.Entries[len(l.Entries)-1].At+window)
	}
	total := st.Count
	for i := 0; total+need > max && i < len(l.Entries); i++ {
		// The entry at At is in the window (now - window, now] until now
		// reaches At + window.
		total -= l.Entries[i].Cost
		st.Fits = maxInt(now, l.Entries[i].At+window)
	}
	return st
}

func maxInt(a, b int64) int64 {
	if a > b {
		return a
	}
	return b
}
