package redis

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/ratesync/ratelimit/strategy"
)

var (
	_ strategy.Capable = (*Store)(nil)
	_ strategy.Taker   = (*Store)(nil)
)

// Capabilities reports that the Store implements every part of the
// contract: watches, token buckets and Take.
func (s *Store) Capabilities() strategy.Capabilities {
	return strategy.Capabilities{Watch: true, Buckets: true, Take: true}
}

// ErrInvalidTake is returned (wrapped with strategy.ErrNotApplied) by Take
// for a request that cannot be decided: a negative cost, a bucket with no
// positive period, interval or burst, a log with no positive window or max,
// or a cost, burst or max of 2^53 or more (the script's numbers are doubles,
// exact below that).
var ErrInvalidTake = errors.New("redis: invalid take")

// maxExact bounds the whole numbers of a Take: Lua numbers are doubles.
const maxExact = 1 << 53

// takeRecordMin is the least time a Take's decision is remembered (see
// strategy.Taker), as the memory store does.
const takeRecordMin = time.Minute

// Take modes (lua/take.lua).
const (
	modeDecide = iota
	modePeek
	modeRefund
	modeAdmitted
	modeRejected
)

// Take decides t on its buckets and logs in one script call (one round
// trip, combined with other callers' commands when several are in flight),
// atomically, and once per t.ID: the script records the decision under the
// ID, in the key's hash tag, for as long as any of the limits may hold its
// cost (a minute at least) plus Options.ExpiryMargin. An error wraps
// strategy.ErrNotApplied only when nothing was applied (see PushDiffs).
func (s *Store) Take(ctx context.Context, t *strategy.Take) (strategy.TakeResult, error) {
	fail := func(err error) (strategy.TakeResult, error) {
		return strategy.TakeResult{}, fmt.Errorf("redis: take %q %q: %w", t.Namespace, t.Key, err)
	}
	if err := ctx.Err(); err != nil {
		return fail(fmt.Errorf("%w: %w", err, strategy.ErrNotApplied))
	}
	if err := checkTake(t); err != nil {
		return fail(fmt.Errorf("%w: %w", err, strategy.ErrNotApplied))
	}
	args := s.takeArgs(t)
	cmd := goredis.NewCmd(ctx, args...)
	s.combiner.do(ctx, s.send, cmd)
	mayHaveRun := false
	if isNoScript(cmd.Err()) {
		// The attempt NOSCRIPT answers did not run: send it again with its
		// source. An earlier attempt may have (see Store.run).
		mayHaveRun = s.mayHaveRetried()
		cmd = goredis.NewCmd(ctx, evalArgs(args)...)
		s.combiner.do(ctx, s.send, cmd)
	}
	vals, err := cmd.Slice()
	if err != nil {
		if s.surelyNotApplied(err) && !mayHaveRun {
			return fail(fmt.Errorf("%w: %w", err, strategy.ErrNotApplied))
		}
		if errors.Is(err, strategy.ErrNotApplied) {
			// The re-send after NOSCRIPT was not sent, but an earlier
			// attempt may have run: the error must not match.
			return fail(fmt.Errorf("outcome unknown: %s", err))
		}
		return fail(fmt.Errorf("outcome unknown: %w", err))
	}
	res, err := parseTake(t, vals)
	if err != nil {
		return fail(fmt.Errorf("outcome unknown: %w", err))
	}
	return res, nil
}

func checkTake(t *strategy.Take) error {
	if t.Cost < 0 || t.Cost >= maxExact {
		return fmt.Errorf("%w: cost %d", ErrInvalidTake, t.Cost)
	}
	for _, b := range t.Buckets {
		if checkSize(b.Period) != nil || !(b.Interval > 0) || math.IsInf(b.Interval, 0) || b.Burst < 1 || b.Burst >= maxExact {
			return fmt.Errorf("%w: bucket %+v", ErrInvalidTake, b)
		}
	}
	for _, l := range t.Logs {
		if checkSize(l.Window) != nil || l.Max < 1 || l.Max >= maxExact {
			return fmt.Errorf("%w: log %+v", ErrInvalidTake, l)
		}
	}
	return nil
}

// takeArgs returns the EVALSHA arguments of t (see lua/take.lua).
func (s *Store) takeArgs(t *strategy.Take) []any {
	prefix := s.shardPrefixes(t.Namespace)[s.shardOf(keyHash(t.Key))]
	nk := 1 + len(t.Buckets) + len(t.Logs)
	args := make([]any, 0, 3+nk+9+4*len(t.Buckets)+3*len(t.Logs))
	args = append(args, "evalsha", takeScript.Hash(), nk, prefix+"t:"+t.ID)
	for _, b := range t.Buckets {
		args = append(args, bucketKey(prefix, strategy.BucketID{Key: t.Key, Period: b.Period}))
	}
	for _, l := range t.Logs {
		args = append(args, logKey(prefix, t.Key, l.Window))
	}
	mode := modeDecide
	switch {
	case t.Peek:
		mode = modePeek
	case t.Refund:
		mode = modeRefund
	case t.Answered == strategy.AnsweredAdmitted:
		mode = modeAdmitted
	case t.Answered == strategy.AnsweredRejected:
		mode = modeRejected
	}
	args = append(args, t.Now, t.Cost, mode, t.ID, strategy.BucketRetention.Milliseconds(), takeRecordMin.Milliseconds(),
		s.opts.ExpiryMargin.Milliseconds(), len(t.Buckets), len(t.Logs))
	for _, b := range t.Buckets {
		args = append(args, b.Period.Milliseconds(), b.Interval, b.Burst, flag(b.Penalty))
	}
	for _, l := range t.Logs {
		args = append(args, l.Window.Milliseconds(), l.Max, flag(l.Penalty))
	}
	return args
}

// logKey returns the key of a sliding log: a sorted set of entries "<cost>
// <id>" scored by their instant (see lua/take.lua).
func logKey(prefix, key string, window time.Duration) string {
	return prefix + "sl:" + strconv.FormatInt(window.Milliseconds(), 10) + ":" + key
}

func flag(b bool) string {
	if b {
		return "1"
	}
	return "0"
}

// parseTake reads the take script's reply: allowed, the buckets' states,
// the logs' (count, fits, empty).
func parseTake(t *strategy.Take, vals []any) (strategy.TakeResult, error) {
	if len(vals) != 1+len(t.Buckets)+3*len(t.Logs) {
		return strategy.TakeResult{}, fmt.Errorf("redis: take script returned %d values, want %d", len(vals), 1+len(t.Buckets)+3*len(t.Logs))
	}
	r := &reply{vals: vals}
	allowed, err := r.int()
	if err != nil {
		return strategy.TakeResult{}, err
	}
	res := strategy.TakeResult{Allowed: allowed == 1, Buckets: make([]strategy.BucketState, len(t.Buckets)),
		Logs: make([]strategy.LogState, len(t.Logs))}
	for i := range t.Buckets {
		v, _ := r.next()
		res.Buckets[i] = parseBucket(v)
	}
	for i := range t.Logs {
		st := &res.Logs[i]
		for _, f := range []*int64{&st.Count, &st.Fits, &st.Empty} {
			if *f, err = r.int(); err != nil {
				return strategy.TakeResult{}, err
			}
		}
	}
	return res, nil
}
