package redis

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"
)

// clockSamples is how many TIME round trips one Refresh measures; the one
// with the shortest round trip gives the offset.
const clockSamples = 3

// Clock tells the time of the Redis server: the local clock corrected by the
// offset measured with Redis TIME. Nodes that read window time from one Redis
// through a Clock agree on window boundaries even when their own clocks
// disagree; give Clock.Now to the registry as its clock. The offset drifts as
// the clocks do: call Refresh now and then, or run Run in a goroutine.
// A Clock is safe for concurrent use.
type Clock struct {
	store  *Store
	offset atomic.Int64 // server minus local, nanoseconds
}

// Clock measures the offset between the local clock and Redis TIME and
// returns a Clock that applies it.
func (s *Store) Clock(ctx context.Context) (*Clock, error) {
	c := &Clock{store: s}
	if err := c.Refresh(ctx); err != nil {
		return nil, err
	}
	return c, nil
}

// Now returns the server's time as estimated from the local clock.
func (c *Clock) Now() time.Time {
	return c.store.now().Add(time.Duration(c.offset.Load()))
}

// Offset returns the last measured difference between the server's clock and
// the local one (positive when the server is ahead).
func (c *Clock) Offset() time.Duration { return time.Duration(c.offset.Load()) }

// Refresh measures the offset again. It takes the sample with the shortest
// round trip and assumes the server read its clock halfway through it, so the
// error is at most half that round trip (plus TIME's microsecond resolution).
// On error the previous offset stays.
func (c *Clock) Refresh(ctx context.Context) error {
	var (
		best   time.Duration = -1
		offset time.Duration
	)
	for range clockSamples {
		t0 := c.store.now()
		server, err := c.store.client.Time(ctx).Result()
		if err != nil {
			return fmt.Errorf("redis: clock: %w", err)
		}
		rtt := c.store.now().Sub(t0)
		if best < 0 || rtt < best {
			best, offset = rtt, server.Sub(t0.Add(rtt/2))
		}
	}
	c.offset.Store(int64(offset))
	return nil
}

// Run calls Refresh every interval until ctx is done, and returns ctx's
// error. A failed refresh keeps the previous offset; the next one tries again.
func (c *Clock) Run(ctx context.Context, interval time.Duration) error {
	if interval <= 0 {
		return fmt.Errorf("redis: clock: interval %v is not positive", interval)
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
			_ = c.Refresh(ctx)
		}
	}
}
