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

// monoBase is the origin of systemClock's monotonic readings.
var monoBase = time.Now()

// systemClock is the default clock (Config.Clock nil): time.Now to the
// millisecond, read with one clock read instead of time.Now's two (the wall
// clock and the monotonic clock; each costs 20–40 ns on some VMs). It adds the
// monotonic time elapsed since an anchor taken with time.Now, and takes a new
// anchor every second and whenever the monotonic reading goes back, so a step
// of the wall clock (NTP, an operator) shows within a second, and a slewed
// wall clock is followed as the kernel slews both clocks alike.
type systemClock struct {
	anchor atomic.Int64 // monotonic reading (ns since monoBase) of the anchor
	offset atomic.Int64 // wall clock minus monotonic reading at the anchor, ns
}

func newSystemClock() *systemClock {
	c := &systemClock{}
	c.reanchor()
	return c
}

// unixMilli returns the wall clock in Unix milliseconds.
func (c *systemClock) unixMilli() int64 {
	m := int64(time.Since(monoBase))
	if a := c.anchor.Load(); m < a || m-a >= int64(time.Second) {
		return c.reanchor()
	}
	return floorDiv(m+c.offset.Load(), int64(time.Millisecond))
}

// reanchor takes a new anchor from time.Now and returns its Unix millisecond.
// Racing calls each store a consistent anchor; any of them will do.
func (c *systemClock) reanchor() int64 {
	var now time.Time
	var m int64
	// time.Now reads the wall clock, then the monotonic clock: a thread
	// descheduled between the two would make the offset short by the gap
	// (the clock late by it until the next anchor). A monotonic reading
	// taken before bounds the gap; retry when it is over 100 µs.
	for range 3 {
		before := int64(time.Since(monoBase))
		now = time.Now()
		if m = int64(now.Sub(monoBase)); m-before <= int64(100*time.Microsecond) {
			break
		}
	}
	c.offset.Store(now.UnixNano() - m)
	c.anchor.Store(m)
	return now.UnixMilli()
}

// floorDiv is a / b rounded down (b > 0).
func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b < 0 {
		q--
	}
	return q
}
