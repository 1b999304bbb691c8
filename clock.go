package ratelimit

import (
	"sync"
	"sync/atomic"
	"time"
)

// CoarseClock is a clock that reads the system clock once per resolution, in
// one background goroutine, and answers Now from memory: the analogue of
// nginx's cached ngx.now() that Kong's library reads. Pass its Now as
// Config.Clock (it can serve many namespaces) when reading the system clock on
// every check costs too much; the price is that instants are up to one
// resolution late. Stop it when done.
type CoarseClock struct {
	ms   atomic.Int64
	stop chan struct{}
	done chan struct{}
	once sync.Once
}

// NewCoarseClock starts a clock that ticks every resolution (at least 1 ms).
func NewCoarseClock(resolution time.Duration) *CoarseClock {
	resolution = max(resolution, time.Millisecond)
	c := &CoarseClock{stop: make(chan struct{}), done: make(chan struct{})}
	c.ms.Store(time.Now().UnixMilli())
	go func() {
		defer close(c.done)
		t := time.NewTicker(resolution)
		defer t.Stop()
		for {
			select {
			case <-c.stop:
				return
			case now := <-t.C:
				c.ms.Store(now.UnixMilli())
			}
		}
	}()
	return c
}

// Now returns the time as of the last tick, to the millisecond.
func (c *CoarseClock) Now() time.Time { return time.UnixMilli(c.ms.Load()) }

// Stop stops the clock's goroutine; Now keeps returning the last tick. It is
// idempotent.
func (c *CoarseClock) Stop() {
	c.once.Do(func() { close(c.stop) })
	<-c.done
}
