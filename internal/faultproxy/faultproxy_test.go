package faultproxy

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// lineServer answers each line it receives with "ok <line>\n" and counts the
// lines it applied, as a store would count writes.
type lineServer struct {
	ln      net.Listener
	applied atomic.Int64
	got     bytes.Buffer // every byte received
	mu      sync.Mutex
	wg      sync.WaitGroup
	conns   []net.Conn
}

func newLineServer(t *testing.T) *lineServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	s := &lineServer{ln: ln}
	s.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.mu.Lock()
			s.conns = append(s.conns, c)
			s.mu.Unlock()
			s.wg.Go(func() { s.serve(c) })
		}
	})
	t.Cleanup(func() {
		_ = ln.Close()
		s.mu.Lock()
		for _, c := range s.conns {
			_ = c.Close()
		}
		s.mu.Unlock()
		s.wg.Wait()
	})
	return s
}

func (s *lineServer) serve(c net.Conn) {
	defer c.Close()
	r := bufio.NewReader(c)
	for {
		line, err := r.ReadString('\n')
		s.mu.Lock()
		s.got.WriteString(line)
		s.mu.Unlock()
		if err != nil {
			return
		}
		s.applied.Add(1)
		if _, err := io.WriteString(c, "ok "+line); err != nil {
			return
		}
	}
}

func (s *lineServer) received() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.got.String()
}

func newProxy(t *testing.T, target string) *Proxy {
	t.Helper()
	p, err := New(target)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, p.Close()) })
	return p
}

func dial(t *testing.T, p *Proxy) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", p.Addr(), time.Second)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// roundTrip sends line and reads the answer, waiting at most wait.
func roundTrip(c net.Conn, line string, wait time.Duration) (string, error) {
	if err := c.SetDeadline(time.Now().Add(wait)); err != nil {
		return "", err
	}
	if _, err := io.WriteString(c, line+"\n"); err != nil {
		return "", err
	}
	ans, err := bufio.NewReader(c).ReadString('\n')
	return strings.TrimSuffix(ans, "\n"), err
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func TestForward(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	s := newLineServer(t)
	p := newProxy(t, s.ln.Addr().String())
	c := dial(t, p)
	for _, l := range []string{"a", "b", strings.Repeat("x", 100_000)} {
		ans, err := roundTrip(c, l, 5*time.Second)
		require.NoError(t, err)
		require.Equal(t, "ok "+l, ans)
	}
	require.EqualValues(t, 3, s.applied.Load())
	require.EqualValues(t, 1, p.Accepted())
	require.Equal(t, 1, p.Open())
	require.Equal(t, s.ln.Addr().String(), p.Target())
	require.Positive(t, p.Port())
}

func TestBlackHole(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	s := newLineServer(t)
	p := newProxy(t, s.ln.Addr().String())
	open := dial(t, p)
	_, err := roundTrip(open, "before", time.Second)
	require.NoError(t, err)

	p.SetMode(BlackHole)
	require.Equal(t, BlackHole, p.Mode())
	_, err = roundTrip(open, "lost", 200*time.Millisecond)
	require.True(t, isTimeout(err), "open connection: %v", err)
	fresh := dial(t, p) // accepted, then silent
	_, err = roundTrip(fresh, "lost too", 200*time.Millisecond)
	require.True(t, isTimeout(err), "new connection: %v", err)
	require.EqualValues(t, 1, s.applied.Load(), "nothing reached the server")

	p.SetMode(Forward)
	// The connections that lost bytes are closed: their streams are broken.
	for _, c := range []net.Conn{open, fresh} {
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		_, err := c.Read(make([]byte, 1))
		require.Error(t, err)
		require.False(t, isTimeout(err), "closed, not silent: %v", err)
	}
	ans, err := roundTrip(dial(t, p), "after", 5*time.Second)
	require.NoError(t, err)
	require.Equal(t, "ok after", ans)
}

func TestRefuse(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	s := newLineServer(t)
	p := newProxy(t, s.ln.Addr().String())
	open := dial(t, p)
	_, err := roundTrip(open, "a", time.Second)
	require.NoError(t, err)

	p.SetMode(Refuse)
	// The reset may reach the client during the handshake or at its first read.
	c, err := net.DialTimeout("tcp", p.Addr(), time.Second)
	if err == nil {
		_, err = roundTrip(c, "refused", 5*time.Second)
		_ = c.Close()
	}
	require.Error(t, err)
	require.False(t, isTimeout(err), "reset at once: %v", err)
	require.Eventually(t, func() bool { return p.Refused() == 1 }, 5*time.Second, time.Millisecond)

	ans, err := roundTrip(open, "still open", 5*time.Second)
	require.NoError(t, err, "Refuse leaves open connections alone")
	require.Equal(t, "ok still open", ans)

	p.DropAll()
	_ = open.SetDeadline(time.Now().Add(5 * time.Second))
	_, err = open.Read(make([]byte, 1))
	require.Error(t, err)

	p.SetMode(Forward)
	ans, err = roundTrip(dial(t, p), "b", 5*time.Second)
	require.NoError(t, err)
	require.Equal(t, "ok b", ans)
}

func TestLatency(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	s := newLineServer(t)
	p := newProxy(t, s.ln.Addr().String())
	c := dial(t, p)
	const d = 150 * time.Millisecond
	p.SetLatency(d)
	for range 3 {
		start := time.Now()
		_, err := roundTrip(c, "slow", 5*time.Second)
		require.NoError(t, err)
		require.GreaterOrEqual(t, time.Since(start), d)
	}
	p.SetLatency(0)
	// Without latency a round trip is fast (a loose bound: the machine may be loaded).
	start := time.Now()
	_, err := roundTrip(c, "fast", 5*time.Second)
	require.NoError(t, err)
	require.Less(t, time.Since(start), d)

	// Close does not wait for delayed chunks.
	p.SetLatency(time.Hour)
	_, err = io.WriteString(c, "never\n")
	require.NoError(t, err)
	start = time.Now()
	require.NoError(t, p.Close())
	require.Less(t, time.Since(start), 5*time.Second)
}

// A cut lets the request reach the server, which applies it; the client sees
// the connection closed without a reply.
func TestCutAfterReply(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	s := newLineServer(t)
	p := newProxy(t, s.ln.Addr().String())
	p.Arm(Cut{
		Match:     func(b []byte) bool { return bytes.Contains(b, []byte("write")) },
		ReplyDone: func(r []byte) bool { return bytes.HasSuffix(r, []byte("\n")) },
		Times:     2,
	})
	c := dial(t, p)
	ans, err := roundTrip(c, "read", 5*time.Second)
	require.NoError(t, err, "not matched: forwarded")
	require.Equal(t, "ok read", ans)
	for i := range 3 {
		c := dial(t, p)
		ans, err := roundTrip(c, "write", 5*time.Second)
		if i < 2 {
			require.Error(t, err)
			require.False(t, isTimeout(err), "closed, not timed out: %v", err)
		} else {
			require.NoError(t, err, "disarmed after Times cuts")
			require.Equal(t, "ok write", ans)
		}
	}
	require.EqualValues(t, 2, p.Cuts())
	require.EqualValues(t, 4, s.applied.Load(), "the cut requests were applied")
}

// A byte-limited cut delivers part of the request only.
func TestCutBytes(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	s := newLineServer(t)
	p := newProxy(t, s.ln.Addr().String())
	p.Arm(Cut{Bytes: 4})
	c := dial(t, p)
	_, err := roundTrip(c, "abcdefgh", 5*time.Second)
	require.Error(t, err)
	require.EqualValues(t, 1, p.Cuts())
	require.Eventually(t, func() bool { return s.received() == "abcd" }, 5*time.Second, time.Millisecond)
	require.Zero(t, s.applied.Load(), "a partial request is not applied")
}

// Every open connection and goroutine goes away on Close, in every mode.
func TestCloseWithOpenConnections(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	s := newLineServer(t)
	p, err := New(s.ln.Addr().String())
	require.NoError(t, err)
	var cs []net.Conn
	for _, m := range []Mode{Forward, Forward, BlackHole} {
		p.SetMode(m)
		c, err := net.Dial("tcp", p.Addr())
		require.NoError(t, err)
		cs = append(cs, c)
		_, _ = io.WriteString(c, "x\n")
	}
	require.Eventually(t, func() bool { return p.Open() == 3 }, 5*time.Second, time.Millisecond)
	require.NoError(t, p.Close())
	require.NoError(t, p.Close(), "idempotent")
	for _, c := range cs {
		_ = c.Close()
	}
	_, err = net.DialTimeout("tcp", p.Addr(), time.Second)
	assert.Error(t, err)
}

func TestListenError(t *testing.T) {
	_, err := Listen("256.0.0.1:0", "127.0.0.1:1")
	require.Error(t, err)
	require.Equal(t, "refuse", Refuse.String())
	require.Equal(t, "black-hole", BlackHole.String())
	require.Equal(t, "forward", Forward.String())
	require.Equal(t, "Mode(9)", Mode(9).String())
}
