package memory

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ratesync/ratelimit/internal/slidelog"
	"github.com/ratesync/ratelimit/strategy"
)

// logID names one key's sliding log of one window size.
type logID struct {
	key    string
	window time.Duration
}

// takeRecord is what the store remembers of a decided Take ID: its decision,
// and until when (Purge forgets it after).
type takeRecord struct {
	allowed bool
	end     int64
}

// ErrInvalidTake is returned (wrapped with strategy.ErrNotApplied) by Take for
// a request that cannot be decided: a negative cost, a bucket with no
// interval or burst, a log with no window or max.
var ErrInvalidTake = errors.New("memory: invalid take")

// Take decides t on its buckets and logs, atomically and once per t.ID (see
// strategy.Taker).
func (s *Store) Take(ctx context.Context, t *strategy.Take) (strategy.TakeResult, error) {
	s.pushes.Add(1)
	if err := ctx.Err(); err != nil {
		return strategy.TakeResult{}, fmt.Errorf("memory: take: %w: %w", err, strategy.ErrNotApplied)
	}
	if err := checkTake(t); err != nil {
		return strategy.TakeResult{}, fmt.Errorf("memory: take: %w: %w", err, strategy.ErrNotApplied)
	}
	f := s.fault(OpTake)
	if f == Refuse || f == LoseRequest {
		return strategy.TakeResult{}, faultError(f, "take")
	}
	s.mu.Lock()
	res := s.take(t)
	s.mu.Unlock()
	if f == LoseReply {
		return strategy.TakeResult{}, faultError(f, "take")
	}
	return res, nil
}

func checkTake(t *strategy.Take) error {
	if t.Cost < 0 {
		return fmt.Errorf("%w: cost %d", ErrInvalidTake, t.Cost)
	}
	for _, b := range t.Buckets {
		if b.Period <= 0 || !(b.Interval > 0) || b.Burst < 1 {
			return fmt.Errorf("%w: bucket %+v", ErrInvalidTake, b)
		}
	}
	for _, l := range t.Logs {
		if l.Window <= 0 || l.Max < 1 {
			return fmt.Errorf("%w: log %+v", ErrInvalidTake, l)
		}
	}
	return nil
}

// take is Take with s.mu held.
func (s *Store) take(t *strategy.Take) strategy.TakeResult {
	bs := s.bucketsOf(t.Namespace)
	ls := s.logsOf(t.Namespace)
	logs := make([]*slidelog.Log, len(t.Logs))
	for i, l := range t.Logs {
		id := logID{t.Key, l.Window}
		lg := ls[id]
		if lg == nil {
			lg = new(slidelog.Log)
			ls[id] = lg
		}
		lg.Prune(t.Now, l.Window.Milliseconds())
		logs[i] = lg
	}
	rec, seen := s.takes[t.ID]
	seen = seen && t.ID != ""
	allowed := true
	switch {
	case t.Peek:
		allowed = s.fits(t, bs, logs)
	case t.Refund:
		if !seen {
			s.refund(t, bs, logs)
		}
	case t.Answered != strategy.NotAnswered:
		allowed = t.Answered == strategy.AnsweredAdmitted
		switch {
		case !seen:
			s.spend(t, bs, logs, allowed)
		case rec.allowed && !allowed:
			s.takeBack(t, bs, logs) // the store admitted what the node rejected
		case !rec.allowed && allowed:
			s.spendUnpenalized(t, bs, logs) // the store rejected what the node admitted
		}
	case seen:
		allowed = rec.allowed
	default:
		allowed = s.fits(t, bs, logs)
		s.spend(t, bs, logs, allowed)
	}
	if !t.Peek && t.ID != "" {
		s.takes[t.ID] = takeRecord{allowed: allowed, end: s.takeEnd(t, bs)}
	}
	res := strategy.TakeResult{Allowed: allowed, Buckets: make([]strategy.BucketState, len(t.Buckets)),
		Logs: make([]strategy.LogState, len(t.Logs))}
	for i, b := range t.Buckets {
		res.Buckets[i] = bs[strategy.BucketID{Key: t.Key, Period: b.Period}]
	}
	for i, l := range t.Logs {
		res.Logs[i] = logs[i].State(t.Now, l.Window.Milliseconds(), l.Max, t.Cost)
		if len(logs[i].Entries) == 0 {
			delete(ls, logID{t.Key, l.Window})
		}
	}
	return res
}

// fits reports whether every limit of t admits it.
func (s *Store) fits(t *strategy.Take, bs map[strategy.BucketID]strategy.BucketState, logs []*slidelog.Log) bool {
	for _, b := range t.Buckets {
		if !strategy.BucketFits(bs[strategy.BucketID{Key: t.Key, Period: b.Period}], b.Interval, b.Burst, t.Cost, t.Now) {
			return false
		}
	}
	for i, l := range t.Logs {
		if !logs[i].Fits(t.Cost, l.Max) {
			return false
		}
	}
	return true
}

// spend spends t's cost on every limit (admitted) or on the limits with a
// penalty (rejected).
func (s *Store) spend(t *strategy.Take, bs map[strategy.BucketID]strategy.BucketState, logs []*slidelog.Log, admitted bool) {
	for _, b := range t.Buckets {
		if admitted || b.Penalty {
			s.spendBucket(t, bs, b)
		}
	}
	for i, l := range t.Logs {
		if admitted || l.Penalty {
			logs[i].Add(slidelog.Entry{At: t.Now, Cost: t.Cost, ID: t.ID}, l.Max)
		}
	}
}

// spendUnpenalized spends t's cost on the limits without a penalty: those a
// rejection did not spend on.
func (s *Store) spendUnpenalized(t *strategy.Take, bs map[strategy.BucketID]strategy.BucketState, logs []*slidelog.Log) {
	for _, b := range t.Buckets {
		if !b.Penalty {
			s.spendBucket(t, bs, b)
		}
	}
	for i, l := range t.Logs {
		if !l.Penalty {
			logs[i].Add(slidelog.Entry{At: t.Now, Cost: t.Cost, ID: t.ID}, l.Max)
		}
	}
}

// takeBack undoes an admission on the limits without a penalty.
func (s *Store) takeBack(t *strategy.Take, bs map[strategy.BucketID]strategy.BucketState, logs []*slidelog.Log) {
	for _, b := range t.Buckets {
		if !b.Penalty {
			id := strategy.BucketID{Key: t.Key, Period: b.Period}
			bs[id] = strategy.ApplyBucket(bs[id], strategy.RefundDiff(id, t.Cost, b.Interval, t.Now), t.Now)
		}
	}
	for i, l := range t.Logs {
		if !l.Penalty {
			logs[i].Remove(t.ID)
		}
	}
}

// refund gives t's cost back on every limit.
func (s *Store) refund(t *strategy.Take, bs map[strategy.BucketID]strategy.BucketState, logs []*slidelog.Log) {
	for _, b := range t.Buckets {
		id := strategy.BucketID{Key: t.Key, Period: b.Period}
		if st := bs[id]; st.Held() {
			bs[id] = strategy.ApplyBucket(st, strategy.RefundDiff(id, t.Cost, b.Interval, t.Now), t.Now)
		}
	}
	for _, lg := range logs {
		lg.TakeBack(t.Cost)
	}
}

func (s *Store) spendBucket(t *strategy.Take, bs map[strategy.BucketID]strategy.BucketState, b strategy.TakeBucket) {
	id := strategy.BucketID{Key: t.Key, Period: b.Period}
	bs[id] = strategy.ApplyBucket(bs[id], strategy.SpendDiff(id, t.Cost, b.Interval, t.Now), t.Now)
}

// takeEnd returns until when a Take ID must be remembered: as long as any of
// its limits may still hold its cost, and a minute at least.
func (s *Store) takeEnd(t *strategy.Take, bs map[strategy.BucketID]strategy.BucketState) int64 {
	end := t.Now + time.Minute.Milliseconds()
	for _, b := range t.Buckets {
		if st := bs[strategy.BucketID{Key: t.Key, Period: b.Period}]; st.Held() {
			end = max(end, strategy.BucketExpiry(st, b.Period))
		}
	}
	for _, l := range t.Logs {
		end = max(end, t.Now+l.Window.Milliseconds())
	}
	return end
}

// logsOf returns namespace's logs, creating the map. The caller holds s.mu.
func (s *Store) logsOf(namespace string) map[logID]*slidelog.Log {
	ls := s.logs[namespace]
	if ls == nil {
		ls = make(map[logID]*slidelog.Log)
		s.logs[namespace] = ls
	}
	return ls
}

// purgeLogs drops the log entries that left their window at now, and the
// Take IDs no limit can hold anymore. The caller holds s.mu.
func (s *Store) purgeLogs(now int64) {
	for ns, ls := range s.logs {
		for id, lg := range ls {
			lg.Prune(now, id.window.Milliseconds())
			if len(lg.Entries) == 0 {
				delete(ls, id)
			}
		}
		if len(ls) == 0 {
			delete(s.logs, ns)
		}
	}
	for id, rec := range s.takes {
		if rec.end <= now {
			delete(s.takes, id)
		}
	}
}
