package redis

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/ratesync/ratelimit/strategy"
)

// combiner sends single-command pushes (a synchronous-mode increment is one)
// that arrive while others are in flight together, in one pipeline: flat
// combining. With many concurrent callers this saves Redis a read and a write
// system call per push, which is most of what a small script costs it. A
// caller with nothing in flight before it goes straight to Redis, so a lone
// caller waits for nothing.
type combiner struct {
	mu      sync.Mutex
	leaders int // rounds in flight, at most maxRounds
	waiting []*combined

	pipelines atomic.Int64 // rounds that carried several commands, for tests
}

// maxRounds bounds the rounds (single commands or pipelines) in flight at once.
const maxRounds = 2

type combined struct {
	ctx   context.Context
	cmd   goredis.Cmder
	done  chan []*combined // nil: executed; a batch: lead that round
	taken bool             // guarded by combiner.mu: in a round, no longer waiting
}

// do executes cmd, alone or in a pipeline with other callers' commands.
func (c *combiner) do(ctx context.Context, send func(context.Context, []goredis.Cmder), cmd goredis.Cmder) {
	if err := ctx.Err(); err != nil {
		cmd.SetErr(fmt.Errorf("not sent: %w: %w", err, strategy.ErrNotApplied))
		return
	}
	c.mu.Lock()
	if c.leaders < maxRounds {
		c.leaders++
		c.mu.Unlock()
		c.lead(send, []*combined{{ctx: ctx, cmd: cmd}})
		return
	}
	w := &combined{ctx: ctx, cmd: cmd, done: make(chan []*combined, 1)}
	c.waiting = append(c.waiting, w)
	c.mu.Unlock()
	select {
	case batch := <-w.done:
		if batch != nil {
			c.lead(send, batch)
		}
	case <-ctx.Done():
		c.mu.Lock()
		if !w.taken {
			// Never sent: leave the queue.
			for i, x := range c.waiting {
				if x == w {
					c.waiting = append(c.waiting[:i], c.waiting[i+1:]...)
					break
				}
			}
			c.mu.Unlock()
			cmd.SetErr(fmt.Errorf("not sent: %w: %w", ctx.Err(), strategy.ErrNotApplied))
			return
		}
		c.mu.Unlock()
		// Already in a round: its outcome is on its way.
		if batch := <-w.done; batch != nil {
			c.lead(send, batch)
		}
	}
}

// lead runs one round for batch (batch[0] is the caller), wakes the others,
// and hands the queue that formed meanwhile to a new leader.
func (c *combiner) lead(send func(context.Context, []goredis.Cmder), batch []*combined) {
	if len(batch) == 1 {
		send(batch[0].ctx, []goredis.Cmder{batch[0].cmd})
	} else {
		c.pipelines.Add(1)
		ctx, cancel := roundContext(batch)
		cmds := make([]goredis.Cmder, len(batch))
		for i, w := range batch {
			cmds[i] = w.cmd
		}
		send(ctx, cmds)
		cancel()
	}
	for _, w := range batch[1:] {
		w.done <- nil
	}
	c.mu.Lock()
	queue := c.waiting
	c.waiting = nil
	var next, expired []*combined
	for _, w := range queue {
		w.taken = true
		if w.ctx.Err() != nil {
			expired = append(expired, w)
		} else {
			next = append(next, w)
		}
	}
	if len(next) == 0 {
		c.leaders--
	}
	c.mu.Unlock()
	// A caller whose context ended while it waited is not sent: it returns
	// now, rather than lead a round it has no time left for.
	for _, w := range expired {
		w.cmd.SetErr(fmt.Errorf("not sent: %w: %w", w.ctx.Err(), strategy.ErrNotApplied))
		w.done <- nil
	}
	if len(next) > 0 {
		next[0].done <- next
	}
}

// roundContext is the context of a round shared by several callers: no
// caller's cancellation cuts the others' commands short, and it ends at the
// earliest of their deadlines (none if none has one), so that no caller waits
// for the round past its own deadline. (Callers of one namespace share its
// SyncTimeout: their deadlines differ by their arrival times.)
func roundContext(batch []*combined) (context.Context, context.CancelFunc) {
	ctx := context.WithoutCancel(batch[0].ctx)
	var earliest time.Time
	for _, w := range batch {
		if d, ok := w.ctx.Deadline(); ok && (earliest.IsZero() || d.Before(earliest)) {
			earliest = d
		}
	}
	if earliest.IsZero() {
		return ctx, func() {}
	}
	return context.WithDeadline(ctx, earliest)
}
