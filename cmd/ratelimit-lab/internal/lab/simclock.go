package lab

import (
	"errors"
	"sync"
	"sync/atomic"
	"time"
)

// simClock is the simulated runs' clock. The generator sets the time; every
// node reads it through Now.
//
// The core's sync loop arms a wall-clock timer from this clock, so left alone
// it would run sync cycles at moments the generator does not choose, and a
// run would not be reproducible. Instead of changing the nodes' SyncRate
// (which also sets how long they keep re-reading a finished window), the lab
// parks each loop: while parking is on, a call to Now blocks until release.
// A namespace's loop reads the clock first thing, before its first timer, and
// nothing else reads it while New runs, so the lab creates the nodes with
// parking on, waits until every loop is parked, turns parking off, drives the
// traffic (syncing the nodes itself at each SyncRate boundary), and releases
// the loops before closing the nodes.
type simClock struct {
	now     atomic.Int64 // Unix ns
	parking atomic.Bool
	parked  chan struct{} // one send per parked call
	gate    chan struct{} // closed by release
	once    sync.Once
}

func newSimClock(start int64) *simClock {
	c := &simClock{parked: make(chan struct{}, 1024), gate: make(chan struct{})}
	c.now.Store(start)
	c.parking.Store(true)
	return c
}

// Now returns the simulated time, after blocking until release when called
// while parking is on.
func (c *simClock) Now() time.Time {
	if c.parking.Load() {
		select {
		case c.parked <- struct{}{}:
		default:
		}
		<-c.gate
	}
	return time.Unix(0, c.now.Load())
}

// awaitParked waits until n calls are parked, then turns parking off. If the
// core stops reading the clock first thing in its loop, it fails instead of
// hanging; calls parked by then are released with the others.
func (c *simClock) awaitParked(n int) error {
	t := time.NewTimer(10 * time.Second)
	defer t.Stop()
	for range n {
		select {
		case <-c.parked:
		case <-t.C:
			c.parking.Store(false)
			return errors.New("simulated clock: the nodes' sync loops did not read the clock at start; the lab needs updating for this core")
		}
	}
	c.parking.Store(false)
	return nil
}

// release lets the parked calls return.
func (c *simClock) release() { c.once.Do(func() { close(c.gate) }) }
