package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ratesync/ratelimit/strategy"
)

// takeRecordMin is the least time a Take's decision is remembered (as the
// memory store's takeEnd): longer when one of its limits may still hold its
// cost.
const takeRecordMin = time.Minute

// takeIDPrefix starts the batch table's key of a Take ID. No encoded batch
// ID starts with it (an escaped one continues with base64url), so a Take and
// a batch never share a record.
const takeIDPrefix = escape + ":"

// ErrInvalidTake is returned (wrapped with strategy.ErrNotApplied) by Take
// for a request that cannot be decided: a negative cost, a bucket or a log
// whose period or window is not a positive whole number of milliseconds, a
// bucket without a positive interval or burst, a log without a positive
// max, or an Answered value the contract does not define.
var ErrInvalidTake = errors.New("postgres: invalid take")

// Take decides t on its buckets and sliding logs, atomically and exactly
// once per t.ID, in one statement that calls the store's Take function (see
// strategy.Taker and take.sql). Its errors mean what PushDiffs's mean.
func (s *Store) Take(ctx context.Context, t *strategy.Take) (strategy.TakeResult, error) {
	if err := ctx.Err(); err != nil {
		return strategy.TakeResult{}, fmt.Errorf("postgres: take %q: %w: %w", t.ID, err, strategy.ErrNotApplied)
	}
	if err := checkTake(t); err != nil {
		return strategy.TakeResult{}, fmt.Errorf("postgres: take %q: %w: %w", t.ID, err, strategy.ErrNotApplied)
	}
	id := ""
	if t.ID != "" {
		id = takeIDPrefix + encodeText(t.ID)
	}
	nb, nl := len(t.Buckets), len(t.Logs)
	periods, intervals, bursts, bpen := make([]int64, nb), make([]float64, nb), make([]int64, nb), make([]bool, nb)
	for i, b := range t.Buckets {
		periods[i], intervals[i], bursts[i], bpen[i] = b.Period.Milliseconds(), b.Interval, b.Burst, b.Penalty
	}
	windows, maxes, lpen := make([]int64, nl), make([]int64, nl), make([]bool, nl)
	for i, l := range t.Logs {
		windows[i], maxes[i], lpen[i] = l.Window.Milliseconds(), l.Max, l.Penalty
	}
	args := []any{encodeText(t.Namespace), encodeText(t.Key), id, t.Now, t.Cost, t.Peek, t.Refund, int32(t.Answered),
		periods, intervals, bursts, bpen, windows, maxes, lpen, s.opts.BatchIDRetention.Milliseconds()}
	var res strategy.TakeResult
	// Sending it again is safe when a record guards it, or for a peek
	// (which only drops log entries that left their window).
	maybeApplied, err := s.retry(ctx, t.Peek || t.ID != "", true, func(conn *pgxpool.Conn) error {
		var tats, ivs, counts, fits, empties []int64
		if err := conn.QueryRow(ctx, s.takeCallSQL, args...).Scan(&res.Allowed, &tats, &ivs, &counts, &fits, &empties); err != nil {
			return err
		}
		if len(tats) != nb || len(ivs) != nb || len(counts) != nl || len(fits) != nl || len(empties) != nl {
			return &appliedError{fmt.Errorf("the take function answered %d and %d states for %d buckets and %d logs", len(tats), len(counts), nb, nl)}
		}
		res.Buckets = make([]strategy.BucketState, nb)
		for i := range nb {
			res.Buckets[i] = bucketState(tats[i], ivs[i])
		}
		res.Logs = make([]strategy.LogState, nl)
		for i := range nl {
			res.Logs[i] = strategy.LogState{Count: counts[i], Fits: fits[i], Empty: empties[i]}
		}
		return nil
	})
	switch {
	case err == nil:
		return res, nil
	case !maybeApplied:
		return strategy.TakeResult{}, fmt.Errorf("postgres: take %q: %w: %w", t.ID, err, strategy.ErrNotApplied)
	default:
		return strategy.TakeResult{}, fmt.Errorf("postgres: take %q: %w", t.ID, err)
	}
}

func checkTake(t *strategy.Take) error {
	if t.Cost < 0 {
		return fmt.Errorf("%w: cost %d", ErrInvalidTake, t.Cost)
	}
	switch t.Answered {
	case strategy.NotAnswered, strategy.AnsweredAdmitted, strategy.AnsweredRejected:
	default:
		return fmt.Errorf("%w: answered %d", ErrInvalidTake, t.Answered)
	}
	for _, b := range t.Buckets {
		if !wholeMillis(b.Period) || !(b.Interval > 0) || b.Burst < 1 {
			return fmt.Errorf("%w: bucket %+v", ErrInvalidTake, b)
		}
	}
	for _, l := range t.Logs {
		if !wholeMillis(l.Window) || l.Max < 1 {
			return fmt.Errorf("%w: log %+v", ErrInvalidTake, l)
		}
	}
	return nil
}
