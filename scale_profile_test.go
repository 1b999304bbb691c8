package ratelimit_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"

	goredis "github.com/redis/go-redis/v9"
)

// cycleProfile breaks a timed sync cycle's Redis time down, for
// BenchmarkSyncScale with RATELIMIT_BENCH_PROFILE set (on a Redis of the
// benchmark's own: it resets the server's statistics and slow log around
// each cycle). The slow log (every command logged, a script's calls
// included) gives the time of each command, the scripts told apart as
// pushes (a KEYS[1] batch-part id) and watches, ZADDs by key (the change
// log, :l, or the markers, :m) and size; INFO commandstats gives the same
// per command name.
type cycleProfile struct {
	cycles int
	saved  []any                // the slow log's settings before start, which stop restores
	top    map[string]*profStat // per command (slow log), scripts told apart
	nested map[string]*profStat // per command (commandstats, scripts' calls included)
	// per cycle: commandstats usec summed as BenchmarkSyncScale sums them
	// (a script's calls counted in the script and on their own), and the
	// top-level commands' usec (slow log, scripts' calls excluded)
	sums, tops []int64
	first      string // the first cycle's breakdown, once there are others
}

type profStat struct {
	calls int64
	usec  int64
}

func (p *cycleProfile) start(b *testing.B, c *goredis.Client) {
	ctx := context.Background()
	cfg, err := c.ConfigGet(ctx, "slowlog-*").Result()
	if err != nil {
		b.Fatal(err)
	}
	p.saved = []any{"config", "set"}
	for k, v := range cfg {
		p.saved = append(p.saved, k, v)
	}
	for _, args := range [][]any{
		{"config", "set", "slowlog-log-slower-than", "0"},
		{"config", "set", "slowlog-max-len", "1000000"},
		{"slowlog", "reset"},
		{"config", "resetstat"},
	} {
		if err := c.Do(ctx, args...).Err(); err != nil {
			b.Fatal(err)
		}
	}
}

func (p *cycleProfile) stop(b *testing.B, c *goredis.Client) {
	ctx := context.Background()
	if p.cycles == 1 {
		// The first cycle on its own (its pass-diff estimate is that of
		// the settled cycles before it), then the rest.
		p.first = p.String()
	}
	if p.top == nil || p.cycles == 1 {
		p.top, p.nested = map[string]*profStat{}, map[string]*profStat{}
	}
	p.cycles++
	add := func(m map[string]*profStat, k string, calls, usec int64) {
		s := m[k]
		if s == nil {
			s = &profStat{}
			m[k] = s
		}
		s.calls += calls
		s.usec += usec
	}
	info, err := c.Info(ctx, "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	var sum, top int64
	defer func() { p.sums, p.tops = append(p.sums, sum), append(p.tops, top) }()
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":calls=")
		if !ok {
			continue
		}
		calls, rest, _ := strings.Cut(rest, ",usec=")
		usec, _, _ := strings.Cut(rest, ",")
		nc, _ := strconv.ParseInt(calls, 10, 64)
		nu, _ := strconv.ParseInt(usec, 10, 64)
		name = strings.TrimPrefix(name, "cmdstat_")
		if name != "info" && name != "config|resetstat" {
			sum += nu
		}
		add(p.nested, name, nc, nu)
	}
	entries, err := c.Do(ctx, "slowlog", "get", "-1").Slice()
	if err != nil {
		b.Fatal(err)
	}
	// Logging every command costs Redis too: only the profiled cycle does.
	for _, args := range [][]any{p.saved, {"slowlog", "reset"}} {
		if err := c.Do(ctx, args...).Err(); err != nil {
			b.Fatal(err)
		}
	}
	for _, e := range entries {
		f, ok := e.([]any)
		if !ok || len(f) < 4 {
			continue
		}
		usec, _ := f[2].(int64)
		args, _ := f[3].([]any)
		if len(args) == 0 {
			continue
		}
		name := strings.ToLower(fmt.Sprint(args[0]))
		if name == "slowlog" || name == "config" || name == "info" {
			continue
		}
		if len(f) > 4 && !strings.HasPrefix(fmt.Sprint(f[4]), "?") { // "?:0": called by a script
			top += usec
		}
		if name == "evalsha" || name == "eval" {
			name = "script:watch"
			if len(args) > 3 && strings.Contains(fmt.Sprint(args[3]), "b:") {
				name = "script:push"
			}
		}
		if name == "zadd" && len(args) > 1 {
			// the change log (:l) or the markers (:m), and the members' count
			key := fmt.Sprint(args[1])
			n := len(args)
			if n == 32 {
				n = 1000 // truncated by the slow log
			}
			name = fmt.Sprintf("zadd %s members<=%d", key[strings.LastIndexByte(key, ':'):], 1<<bitsLen((n-2)/2))
		}
		add(p.top, name, 1, usec)
	}
}

func (p *cycleProfile) report(b *testing.B) {
	if p.cycles == 0 {
		return
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "\n  per cycle, Redis ms (commandstats sum / top-level):")
	for i := range p.sums {
		fmt.Fprintf(&sb, " %.0f/%.0f", float64(p.sums[i])/1000, float64(p.tops[i])/1000)
	}
	if p.first != "" {
		b.Logf("%s\n  first cycle:%s\n  the %d others:%s", sb.String(), p.first, p.cycles-1, p)
		return
	}
	b.Logf("%s%s", sb.String(), p)
}

// String returns the breakdown since the maps were (re)made.
func (p *cycleProfile) String() string {
	cycles := p.cycles
	if p.first != "" {
		cycles--
	}
	var sb strings.Builder
	dump := func(title string, m map[string]*profStat) {
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		slices.SortFunc(keys, func(x, y string) int { return int(m[y].usec - m[x].usec) })
		fmt.Fprintf(&sb, "\n  %s, per cycle:", title)
		for _, k := range keys {
			s := m[k]
			if s.usec < 50*int64(cycles) {
				continue
			}
			fmt.Fprintf(&sb, "\n    %-28s %8.1f calls %8.2f ms", k, float64(s.calls)/float64(cycles), float64(s.usec)/float64(cycles)/1000)
		}
	}
	dump("commands (slow log, scripts' calls included)", p.top)
	dump("commandstats (scripts' calls included)", p.nested)
	return sb.String()
}

// bitsLen returns the number of bits n needs.
func bitsLen(n int) int {
	b := 0
	for n > 0 {
		b, n = b+1, n>>1
	}
	return b
}
