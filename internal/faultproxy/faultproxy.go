// Package faultproxy is an in-process TCP proxy for tests that inject network
// faults between a client library and a real server (Redis, PostgreSQL, ...).
//
// A Proxy listens on a loopback port and forwards every connection to its
// target. While it runs, a test can switch it to
//
//   - Forward: pass bytes through (the default);
//   - BlackHole: accept connections and swallow every byte in both
//     directions, so clients wait until their own deadlines;
//   - Refuse: accept new connections and reset them at once (as a stopped
//     server would, without giving the port away);
//   - Answer: answer every chunk a client writes with what a function of the
//     chunk returns (SetAnswer) instead of forwarding it, as a server that
//     refuses every command would (a Redis that is loading, read-only, out
//     of memory);
//
// add latency to every request (SetLatency), close every open connection
// (DropAll), and cut connections right after a request reached the server and
// before its reply gets back to the client (Cut): the server applied the
// request, the client never learns it.
//
// The proxy is protocol-agnostic: it sees the byte stream in the chunks the
// client wrote. Matchers (Cut.Match, Cut.ReplyDone) are given those chunks;
// they can look for a command name or a marker a test put in the request.
//
// Close stops every goroutine the proxy started, so tests that use goleak
// stay clean.
package faultproxy

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Mode is what the proxy does with traffic.
type Mode int

const (
	// Forward passes traffic through.
	Forward Mode = iota
	// BlackHole accepts connections but forwards nothing, in either
	// direction, on new and open connections. Leaving BlackHole closes the
	// connections that lost bytes to it (their byte streams are broken).
	BlackHole
	// Refuse resets new connections as soon as they are accepted. Open
	// connections are left alone (call DropAll to close them too).
	Refuse
	// Answer writes what the function set by SetAnswer returns for every
	// chunk a client writes back to the client, on new and open connections,
	// and forwards nothing.
	Answer
)

func (m Mode) String() string {
	switch m {
	case Forward:
		return "forward"
	case BlackHole:
		return "black-hole"
	case Refuse:
		return "refuse"
	case Answer:
		return "answer"
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

// Cut describes requests whose connection is to be cut after the request
// reached the server and before the reply reaches the client.
type Cut struct {
	// Match is called with each chunk a client wrote while no cut is in
	// progress on its connection; a chunk for which it returns true starts a
	// cut. nil matches every chunk. Calls are serialised, so Match may keep
	// state (count, draw random numbers).
	Match func(chunk []byte) bool
	// Bytes, when positive, forwards only the first Bytes bytes from the
	// matched chunk on, then closes both connections at once: the server got
	// (part of) the request, the client gets no reply.
	//
	// When zero, the request is forwarded whole, the server's reply is
	// swallowed until ReplyDone says it is complete, and then both
	// connections are closed: the server surely processed the request.
	Bytes int64
	// ReplyDone is called with everything the server has answered since the
	// matched chunk (only when Bytes is zero); the cut happens when it returns
	// true. nil means the first byte of reply.
	ReplyDone func(reply []byte) bool
	// Times is how many cuts to make before disarming; 0 means 1, negative
	// means until Disarm.
	Times int
}

// Proxy is a fault-injecting TCP proxy. Create one with New; its methods are
// safe for concurrent use.
type Proxy struct {
	ln     net.Listener
	target string

	mode    atomic.Int32
	latency atomic.Int64 // added to every client->server chunk, ns
	answer  atomic.Pointer[func(chunk []byte) []byte]

	cutMu   sync.Mutex
	cut     *Cut
	cutLeft int

	accepted, refused, cuts atomic.Int64

	mu     sync.Mutex
	conns  map[*conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// New starts a proxy to target (host:port) listening on 127.0.0.1 at a free
// port.
func New(target string) (*Proxy, error) {
	return Listen("127.0.0.1:0", target)
}

// Listen starts a proxy to target listening on addr.
func Listen(addr, target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("faultproxy: %w", err)
	}
	p := &Proxy{ln: ln, target: target, conns: map[*conn]struct{}{}}
	p.wg.Go(p.accept)
	return p, nil
}

// Addr returns the address clients should connect to.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Port returns the port of Addr.
func (p *Proxy) Port() int { return p.ln.Addr().(*net.TCPAddr).Port }

// Target returns the address the proxy forwards to.
func (p *Proxy) Target() string { return p.target }

// Mode returns the current mode.
func (p *Proxy) Mode() Mode { return Mode(p.mode.Load()) }

// SetMode switches the proxy to m. Leaving BlackHole closes the connections
// whose bytes it swallowed.
func (p *Proxy) SetMode(m Mode) {
	old := Mode(p.mode.Swap(int32(m)))
	if old == BlackHole && m != BlackHole {
		p.closeIf(func(c *conn) bool { return c.holed.Load() })
	}
}

// SetAnswer sets the function that gives Answer mode's reply to a chunk. It is
// called from the connections' goroutines, possibly at the same time.
func (p *Proxy) SetAnswer(reply func(chunk []byte) []byte) { p.answer.Store(&reply) }

// SetLatency delays every chunk sent from a client to the server by d (0
// removes the delay), so every request/reply round trip takes d longer.
// Chunks keep their order; the delay applies to chunks read after the call.
func (p *Proxy) SetLatency(d time.Duration) { p.latency.Store(int64(d)) }

// Arm installs c: the next matching requests are cut (see Cut). It replaces
// any cut armed before.
func (p *Proxy) Arm(c Cut) {
	p.cutMu.Lock()
	defer p.cutMu.Unlock()
	cc := c
	p.cut, p.cutLeft = &cc, c.Times
	if p.cutLeft == 0 {
		p.cutLeft = 1
	}
}

// Disarm removes the armed cut; cuts in progress complete.
func (p *Proxy) Disarm() {
	p.cutMu.Lock()
	defer p.cutMu.Unlock()
	p.cut, p.cutLeft = nil, 0
}

// Cuts returns how many connections were cut by an armed Cut.
func (p *Proxy) Cuts() int64 { return p.cuts.Load() }

// Accepted returns how many connections were accepted and forwarded (or
// black-holed); Refused how many were reset by Refuse.
func (p *Proxy) Accepted() int64 { return p.accepted.Load() }

// Refused returns how many connections Refuse reset.
func (p *Proxy) Refused() int64 { return p.refused.Load() }

// Open returns how many client connections are open.
func (p *Proxy) Open() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.conns)
}

// DropAll closes every open connection (both ends).
func (p *Proxy) DropAll() { p.closeIf(func(*conn) bool { return true }) }

// Close stops the proxy: it closes the listener and every connection and
// waits for its goroutines to end. It is idempotent.
func (p *Proxy) Close() error {
	err := p.ln.Close()
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.DropAll()
	p.wg.Wait()
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return err
}

func (p *Proxy) closeIf(f func(*conn) bool) {
	p.mu.Lock()
	var cs []*conn
	for c := range p.conns {
		if f(c) {
			cs = append(cs, c)
		}
	}
	p.mu.Unlock()
	for _, c := range cs {
		c.close()
	}
}

// conn is one proxied connection.
type conn struct {
	client, server net.Conn
	once           sync.Once
	done           chan struct{} // closed by close
	holed          atomic.Bool   // bytes were swallowed by BlackHole

	// cutting is set while a cut is in progress: the server's replies are
	// swallowed and handed to replyDone.
	cutting   atomic.Bool
	cutMu     sync.Mutex
	replyDone func([]byte) bool
	reply     []byte
}

func (c *conn) close() {
	c.once.Do(func() {
		close(c.done)
		if tc, ok := c.client.(*net.TCPConn); ok {
			_ = tc.SetLinger(0)
		}
		_ = c.client.Close()
		if c.server != nil {
			_ = c.server.Close()
		}
	})
}

func (p *Proxy) track(c *conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(c *conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
}

func (p *Proxy) accept() {
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		switch p.Mode() {
		case Refuse:
			p.refused.Add(1)
			if tc, ok := client.(*net.TCPConn); ok {
				_ = tc.SetLinger(0) // reset, as a closed port would
			}
			_ = client.Close()
			continue
		case BlackHole:
			c := &conn{client: client, done: make(chan struct{})}
			c.holed.Store(true)
			if !p.track(c) {
				c.close()
				return
			}
			p.accepted.Add(1)
			p.wg.Go(func() { p.swallow(c) })
			continue
		}
		server, err := net.DialTimeout("tcp", p.target, 5*time.Second)
		if err != nil {
			p.refused.Add(1)
			_ = client.Close()
			continue
		}
		c := &conn{client: client, server: server, done: make(chan struct{})}
		if !p.track(c) {
			c.close()
			return
		}
		p.accepted.Add(1)
		p.run(c)
	}
}

// swallow reads and drops what a client sends on a connection accepted in
// BlackHole mode, until it is closed.
func (p *Proxy) swallow(c *conn) {
	defer p.untrack(c)
	defer c.close()
	buf := make([]byte, 32<<10)
	for {
		if _, err := c.client.Read(buf); err != nil {
			return
		}
	}
}

type chunk struct {
	data []byte
	due  time.Time
}

// run starts the goroutines of a forwarded connection: client->queue,
// queue->server (which applies latency and cuts), server->client.
func (p *Proxy) run(c *conn) {
	queue := make(chan chunk, 256)
	var live sync.WaitGroup
	live.Add(3)
	p.wg.Go(func() { // client -> queue
		defer live.Done()
		defer close(queue)
		buf := make([]byte, 32<<10)
		for {
			n, err := c.client.Read(buf)
			if n > 0 {
				var due time.Time
				if d := time.Duration(p.latency.Load()); d > 0 {
					due = time.Now().Add(d)
				}
				select {
				case queue <- chunk{bytes.Clone(buf[:n]), due}:
				case <-c.done:
					return
				}
			}
			if err != nil {
				return
			}
		}
	})
	p.wg.Go(func() { // queue -> server
		defer live.Done()
		defer c.close()
		var left int64 = -1 // bytes still to forward before a byte-limited cut; -1: none
		for ch := range queue {
			if !ch.due.IsZero() {
				if d := time.Until(ch.due); d > 0 {
					t := time.NewTimer(d)
					select {
					case <-t.C:
					case <-c.done:
						t.Stop()
						return
					}
				}
			}
			switch p.Mode() {
			case BlackHole:
				c.holed.Store(true)
				continue
			case Answer:
				if a := p.answer.Load(); a != nil {
					if _, err := c.client.Write((*a)(ch.data)); err != nil {
						return
					}
				}
				continue
			}
			data := ch.data
			if left < 0 && !c.cutting.Load() {
				if cut, ok := p.matchCut(data); ok {
					done := cut.ReplyDone
					if cut.Bytes > 0 {
						left = cut.Bytes
						done = func([]byte) bool { return false } // this side cuts
					}
					c.cutMu.Lock()
					c.reply, c.replyDone = c.reply[:0], done
					c.cutMu.Unlock()
					c.cutting.Store(true) // before forwarding: the reply cannot overtake it
				}
			}
			if left >= 0 && int64(len(data)) >= left {
				_, _ = c.server.Write(data[:left])
				p.cuts.Add(1)
				return // closes both ends
			}
			if left > 0 {
				left -= int64(len(data))
			}
			if _, err := c.server.Write(data); err != nil {
				return
			}
		}
	})
	p.wg.Go(func() { // server -> client
		defer live.Done()
		defer c.close()
		buf := make([]byte, 32<<10)
		for {
			n, err := c.server.Read(buf)
			if n > 0 {
				switch {
				case c.cutting.Load():
					if c.replyComplete(buf[:n]) {
						p.cuts.Add(1)
						return
					}
				case p.Mode() == BlackHole:
					c.holed.Store(true)
				default:
					if _, err := c.client.Write(buf[:n]); err != nil {
						return
					}
				}
			}
			if err != nil {
				return
			}
		}
	})
	p.wg.Go(func() {
		live.Wait()
		p.untrack(c)
	})
}

// matchCut reports whether data starts a cut, consuming one of the armed
// cut's Times.
func (p *Proxy) matchCut(data []byte) (Cut, bool) {
	p.cutMu.Lock()
	defer p.cutMu.Unlock()
	if p.cut == nil || (p.cut.Match != nil && !p.cut.Match(data)) {
		return Cut{}, false
	}
	cut := *p.cut
	if p.cutLeft > 0 {
		p.cutLeft--
		if p.cutLeft == 0 {
			p.cut = nil
		}
	}
	return cut, true
}

// replyComplete adds b to the swallowed reply and reports whether the reply
// is complete.
func (c *conn) replyComplete(b []byte) bool {
	c.cutMu.Lock()
	defer c.cutMu.Unlock()
	if c.replyDone == nil {
		return true
	}
	c.reply = append(c.reply, b...)
	return c.replyDone(c.reply)
}
