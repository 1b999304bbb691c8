// Package pginstance runs a throwaway PostgreSQL server for tests that must
// stop, crash, restart or reconfigure it without touching the shared test
// server: its own data directory under the system's temporary directory, its
// own port, trust authentication, fsync off (a crash of the server process,
// which is what the tests cause, loses nothing that fsync would have saved).
//
// The binaries are looked up as /usr/lib/postgresql/<version>/bin/pg_ctl
// (Debian's layout, newest version first) and then on PATH. When they are
// missing the test is skipped, or failed under
// RATELIMIT_TEST_REQUIRE_SERVICES=1. PostgreSQL refuses to run as root: when
// the test runs as root, every server command runs as the user "postgres"
// (runuser), which must exist.
package pginstance

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Ports of the servers this process runs, so tests running at the same time
// never pick the same one; a port is free again once its server is gone.
// RATELIMIT_TEST_PG_PORTS ("first-last") overrides the range, 5441-5445.
var (
	portMu    sync.Mutex
	portsUsed = map[int]bool{}
)

// claimPort returns a port of the range that no server of this process uses
// and that nothing listens on, or 0.
func claimPort(tried map[int]bool) int {
	lo, hi := portRange()
	portMu.Lock()
	defer portMu.Unlock()
	for port := lo; port <= hi; port++ {
		if portsUsed[port] || tried[port] {
			continue
		}
		tried[port] = true
		ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
		if err != nil {
			continue // another process's
		}
		_ = ln.Close()
		portsUsed[port] = true
		return port
	}
	return 0
}

func releasePort(port int) {
	portMu.Lock()
	delete(portsUsed, port)
	portMu.Unlock()
}

func portRange() (int, int) {
	if v := os.Getenv("RATELIMIT_TEST_PG_PORTS"); v != "" {
		a, b, ok := strings.Cut(v, "-")
		lo, err1 := strconv.Atoi(a)
		hi, err2 := strconv.Atoi(b)
		if ok && err1 == nil && err2 == nil && lo <= hi {
			return lo, hi
		}
	}
	return 5441, 5445
}

// Server is a PostgreSQL server owned by one test.
type Server struct {
	t    testing.TB
	bin  string // directory of pg_ctl, initdb
	dir  string // data directory
	as   string // user to run as, "" for the current one
	Port int
}

// Bin returns the directory of the PostgreSQL binaries, or "" when they are
// not installed.
func Bin() string {
	found, _ := filepath.Glob("/usr/lib/postgresql/*/bin/pg_ctl")
	slices.SortFunc(found, func(a, b string) int { return version(b) - version(a) })
	if len(found) > 0 {
		return filepath.Dir(found[0])
	}
	if p, err := exec.LookPath("pg_ctl"); err == nil {
		return filepath.Dir(p)
	}
	return ""
}

func version(path string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(path))))
	return v
}

// Start initialises a data directory and starts a server on a free port of
// the range; both are removed when the test ends.
func Start(t testing.TB, settings ...string) *Server {
	t.Helper()
	bin := Bin()
	if bin == "" {
		msg := "PostgreSQL server binaries (pg_ctl, initdb) are not installed"
		if os.Getenv("RATELIMIT_TEST_REQUIRE_SERVICES") == "1" {
			t.Fatalf("%s (RATELIMIT_TEST_REQUIRE_SERVICES=1)", msg)
		}
		t.Skip(msg)
	}
	s := &Server{t: t, bin: bin}
	dir, err := os.MkdirTemp("", "ratelimit-pg-")
	if err != nil {
		t.Fatal(err)
	}
	s.dir = dir
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if os.Geteuid() == 0 {
		s.as = "postgres"
		u, err := user.Lookup(s.as)
		if err != nil {
			t.Fatalf("running as root, PostgreSQL needs the user %q: %v", s.as, err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			t.Fatal(err)
		}
	}
	if out, err := s.command("initdb", "-D", s.data(), "-U", "postgres", "-A", "trust", "-E", "UTF8",
		"--locale=C", "--no-sync", "--no-instructions").CombinedOutput(); err != nil {
		t.Fatalf("initdb: %v\n%s", err, out)
	}
	conf := []string{"listen_addresses = '127.0.0.1'", "unix_socket_directories = '" + s.dir + "'",
		"fsync = off", "full_page_writes = off", "shared_buffers = 16MB", "max_connections = 40",
		"logging_collector = off", "log_min_messages = warning"}
	conf = append(conf, settings...)
	f, err := os.OpenFile(filepath.Join(s.data(), "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.WriteString("\n" + strings.Join(conf, "\n") + "\n")
	if err2 := f.Close(); err == nil {
		err = err2
	}
	if err != nil {
		t.Fatal(err)
	}
	tried := map[int]bool{}
	for {
		port := claimPort(tried)
		if port == 0 {
			lo, hi := portRange()
			t.Fatalf("no free port for PostgreSQL in %d-%d (RATELIMIT_TEST_PG_PORTS)", lo, hi)
		}
		s.Port = port
		err := s.start()
		if err == nil {
			t.Cleanup(func() {
				_ = s.stop("immediate")
				releasePort(port)
			})
			return s
		}
		_ = s.stop("immediate") // in case it started after pg_ctl gave up waiting
		releasePort(port)
		t.Logf("PostgreSQL did not start on port %d, trying the next: %v", port, err)
	}
}

func (s *Server) data() string { return filepath.Join(s.dir, "data") }

func (s *Server) command(name string, args ...string) *exec.Cmd {
	path := filepath.Join(s.bin, name)
	if s.as != "" {
		return exec.Command("runuser", append([]string{"-u", s.as, "--", path}, args...)...)
	}
	return exec.Command(path, args...)
}

func (s *Server) start() error {
	out, err := s.command("pg_ctl", "-D", s.data(), "-l", filepath.Join(s.dir, "log"), "-w", "-t", "30",
		"-o", "-p "+strconv.Itoa(s.Port), "start").CombinedOutput()
	if err != nil {
		return fmt.Errorf("pg_ctl start: %v\n%s", err, out)
	}
	return nil
}

func (s *Server) stop(mode string) error {
	out, err := s.command("pg_ctl", "-D", s.data(), "-w", "-t", "30", "-m", mode, "stop").CombinedOutput()
	if err != nil {
		return fmt.Errorf("pg_ctl stop -m %s: %v\n%s", mode, err, out)
	}
	return nil
}

// DSN is the server's connection string, for database db ("postgres" if
// empty), without TLS.
func (s *Server) DSN(db string) string {
	if db == "" {
		db = "postgres"
	}
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", s.Port, db)
}

// Stop stops the server: mode "immediate" kills it without a checkpoint, as
// a crash would (the next start recovers from the write-ahead log), "fast"
// disconnects the clients and shuts down cleanly.
func (s *Server) Stop(mode string) {
	s.t.Helper()
	if err := s.stop(mode); err != nil {
		s.t.Fatal(err)
	}
}

// Restart starts the stopped server again on the same port and waits until
// it accepts connections.
func (s *Server) Restart() {
	s.t.Helper()
	if err := s.start(); err != nil {
		s.t.Fatal(err)
	}
}

// Exec runs SQL statements on database db over a connection of its own.
// The connection starts with no statement timeout, whatever a test set for
// the database: a test that set 1 ms could otherwise see its own statements,
// the one lifting the setting included, cancelled on a loaded machine.
func (s *Server) Exec(db string, sql ...string) {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg, err := pgx.ParseConfig(s.DSN(db))
	if err != nil {
		s.t.Fatal(err)
	}
	cfg.RuntimeParams["statement_timeout"] = "0"
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		s.t.Fatal(err)
	}
	defer conn.Close(ctx)
	for _, q := range sql {
		if _, err := conn.Exec(ctx, q); err != nil {
			s.t.Fatalf("%s: %v", q, err)
		}
	}
}

// Log returns the server's log file.
func (s *Server) Log() string {
	b, _ := os.ReadFile(filepath.Join(s.dir, "log"))
	return string(b)
}
