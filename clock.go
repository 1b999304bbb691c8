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

// tickClock is the default clock (Config.Clock nil): time.Now to the
// millisecond, cached as Kong's ngx.now() is. A goroutine stores the time
// every millisecond, and a read is one atomic load: a hot key's check no
// longer pays for a clock read (20–40 ns on some VMs). The goroutine runs
// only while the clock is read: after idleTicks ticks without a read it ends,
// and the next read takes the time itself and starts it again. So an idle
// namespace costs nothing, and inside a testing/synctest bubble a long sleep
// does not make the clock tick through it. Readings lag the system clock by
// at most a tick (more only when the goroutine is starved of a core); a step
// of the wall clock shows within a tick.
type tickClock struct {
	ms   atomic.Int64
	on   atomic.Bool // the goroutine runs
	used atomic.Bool // read since the last tick

	mu     sync.Mutex // serialises starting and stopping the goroutine
	closed bool       // guarded by mu
	stop   chan struct{}
	done   chan struct{}
}

// idleTicks is how many ticks without a read end the tick goroutine.
const idleTicks = 100

func newTickClock() *tickClock {
	c := &tickClock{}
	c.ms.Store(time.Now().UnixMilli())
	return c
}

// unixMilli returns the time in Unix milliseconds.
func (c *tickClock) unixMilli() int64 {
	if !c.on.Load() {
		return c.wake()
	}
	if !c.used.Load() {
		c.used.Store(true)
	}
	return c.ms.Load()
}

// wake reads the time itself and starts the tick goroutine, unless the clock
// is closed (then every read reads the time).
func (c *tickClock) wake() int64 {
	now := c.refresh()
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.closed && !c.on.Load() {
		c.stop, c.done = make(chan struct{}), make(chan struct{})
		c.used.Store(true)
		c.on.Store(true)
		go c.tick(c.stop, c.done)
	}
	return now
}

// refresh stores the time now and returns it.
func (c *tickClock) refresh() int64 { return c.store(time.Now().UnixMilli()) }

// store stores the reading now unless a newer one was stored meanwhile (by a
// racing tick or read), and returns the clock's time. A wall clock stepped
// back by a second or more is followed.
func (c *tickClock) store(now int64) int64 {
	for {
		old := c.ms.Load()
		if old >= now && old-now < 1000 {
			return old
		}
		if c.ms.CompareAndSwap(old, now) {
			return now
		}
	}
}

func (c *tickClock) tick(stop, done chan struct{}) {
	defer close(done)
	t := time.NewTicker(time.Millisecond)
	defer t.Stop()
	idle := 0
	for {
		select {
		case <-stop:
			return
		case now := <-t.C:
			c.store(now.UnixMilli())
			if c.used.Swap(false) {
				idle = 0
				continue
			}
			if idle++; idle < idleTicks {
				continue
			}
			c.mu.Lock()
			// A read that found the clock on may have come in since the
			// swap: it read a value one tick old at most, and the next read
			// finds the clock off and reads the time itself.
			c.on.Store(false)
			c.mu.Unlock()
			return
		}
	}
}

// close stops the tick goroutine and waits for it; later reads read the
// time themselves.
func (c *tickClock) close() {
	c.mu.Lock()
	c.closed = true
	stop, done, on := c.stop, c.done, c.on.Load()
	c.on.Store(false)
	c.mu.Unlock()
	if on {
		close(stop)
		<-done
	}
}
