package postgres

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// pgProxy is a TCP proxy between pgx and PostgreSQL that understands just
// enough of the wire protocol (message framing) to cut a connection at a
// chosen point: right after a statement carrying a marker (a batch ID, sent
// as a parameter) was delivered to the server, before the reply reaches the
// client. It can also refuse connections or black-hole traffic.
type pgProxy struct {
	ln     net.Listener
	dsn    string
	target string
	wg     sync.WaitGroup

	mu     sync.Mutex
	conns  map[*proxyConn]struct{}
	refuse bool
	closed bool
	marker []byte // cut the statement that carries it
	cuts   int    // how many more statements to cut
	await  bool   // cut after the server's reply (the commit surely happened)

	blackhole atomic.Bool // drop client traffic instead of forwarding it
	cutCount  atomic.Int64
}

type proxyConn struct {
	client, server net.Conn
	dropReply      atomic.Bool // drop the server's reply, then close at ReadyForQuery
	once           sync.Once
}

func (c *proxyConn) close() {
	c.once.Do(func() {
		c.client.Close()
		c.server.Close()
	})
}

// newProxy starts a proxy to the server of dsn and returns it with a pool
// that connects through it.
func newProxy(t testing.TB, dsn string, configure ...func(*pgxpool.Config)) (*pgProxy, *pgxpool.Pool) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dsn)
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &pgProxy{ln: ln, dsn: dsn, target: net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port))), conns: map[*proxyConn]struct{}{}}
	p.wg.Go(p.accept)
	t.Cleanup(p.close)
	return p, p.newPool(t, configure...)
}

// newPool returns a pool that connects through the proxy (without TLS, so
// the framing is plain), closed before the proxy when the test ends.
func (p *pgProxy) newPool(t testing.TB, configure ...func(*pgxpool.Config)) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(p.dsn)
	require.NoError(t, err)
	cfg.ConnConfig.Host = "127.0.0.1"
	cfg.ConnConfig.Port = uint16(p.ln.Addr().(*net.TCPAddr).Port)
	cfg.ConnConfig.TLSConfig = nil
	cfg.ConnConfig.Fallbacks = nil
	for _, f := range configure {
		f(cfg)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	// Before the pools close, let connections hanging in a black hole fail.
	t.Cleanup(func() { p.blackhole.Store(false); p.closeAll() })
	return pool
}

func (p *pgProxy) close() {
	p.ln.Close()
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.closeAll()
	p.wg.Wait()
}

func (p *pgProxy) closeAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		c.close()
	}
}

// setDown makes the proxy refuse new connections (accept and close at once)
// and drops the open ones; setDown(false) serves again.
func (p *pgProxy) setDown(down bool) {
	p.mu.Lock()
	p.refuse = down
	p.mu.Unlock()
	if down {
		p.closeAll()
	}
}

// cutAfter arms the proxy to cut the next n statements that carry marker.
// With await, the cut happens once the server's reply (ending with
// ReadyForQuery, sent after the commit) reached the proxy; otherwise right
// after the statement's Sync was forwarded.
func (p *pgProxy) cutAfter(marker string, n int, await bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.marker, p.cuts, p.await = []byte(marker), n, await
}

func (p *pgProxy) accept() {
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		refuse := p.refuse
		p.mu.Unlock()
		if refuse {
			client.Close()
			continue
		}
		server, err := net.Dial("tcp", p.target)
		if err != nil {
			client.Close()
			continue
		}
		c := &proxyConn{client: client, server: server}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			c.close()
			return
		}
		p.conns[c] = struct{}{}
		p.mu.Unlock()
		p.wg.Go(func() { p.clientToServer(c) })
		p.wg.Go(func() {
			p.serverToClient(c)
			p.mu.Lock()
			delete(p.conns, c)
			p.mu.Unlock()
		})
	}
}

// readMsg reads one protocol message: the startup message has no type byte.
func readMsg(r *bufio.Reader, startup bool) ([]byte, error) {
	hdr := 5
	if startup {
		hdr = 4
	}
	msg := make([]byte, hdr)
	if _, err := io.ReadFull(r, msg); err != nil {
		return nil, err
	}
	n := int(binary.BigEndian.Uint32(msg[hdr-4:]))
	if n < 4 || n > 1<<30 {
		return nil, fmt.Errorf("bad message length %d", n)
	}
	msg = append(msg, make([]byte, n-4)...)
	_, err := io.ReadFull(r, msg[hdr:])
	return msg, err
}

func (p *pgProxy) clientToServer(c *proxyConn) {
	defer c.close()
	r := bufio.NewReader(c.client)
	cutting, await := false, false
	for startup := true; ; startup = false {
		msg, err := readMsg(r, startup)
		if err != nil {
			return
		}
		if p.blackhole.Load() {
			continue
		}
		if !startup && !cutting {
			p.mu.Lock()
			if p.cuts > 0 && bytes.Contains(msg, p.marker) {
				p.cuts--
				cutting, await = true, p.await
				// From here on the client must not see the reply.
				c.dropReply.Store(true)
			}
			p.mu.Unlock()
		}
		if _, err := c.server.Write(msg); err != nil {
			return
		}
		if cutting && (msg[0] == 'S' || msg[0] == 'Q') { // Sync or simple Query: the statement is complete
			p.cutCount.Add(1)
			if !await {
				return // close both ends now
			}
			cutting = false // serverToClient closes at ReadyForQuery
		}
	}
}

func (p *pgProxy) serverToClient(c *proxyConn) {
	defer c.close()
	r := bufio.NewReader(c.server)
	for {
		msg, err := readMsg(r, false)
		if err != nil {
			return
		}
		if c.dropReply.Load() {
			if msg[0] == 'Z' { // ReadyForQuery: the server has committed
				return
			}
			continue
		}
		if _, err := c.client.Write(msg); err != nil {
			return
		}
	}
}
