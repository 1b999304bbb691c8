package store

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit"
	"github.com/ratesync/ratelimit/strategy"
	"github.com/ratesync/ratelimit/strategy/redis"
)

// TestTornTransactionTail: a push part's writes reach the append-only file
// as one MULTI/EXEC block, and a SIGKILL in the middle of that write leaves
// the file cut inside the block. Redis (7.0 at least; Valkey before its fix
// for a short read in MULTI) then truncates the file after the last whole
// command, inside the block, instead of before its MULTI: the block stays
// in the file without its EXEC, and the next start queues it with the next
// block and runs both at that block's EXEC. The part, whose reply was lost
// with the kill, is re-sent and applied again (the Redis that loaded the
// cut file never ran it, nor remembers its id): the next restart counts its
// diffs twice, once from the torn block and once from the re-send. This is
// what the kill loop counted twice (12 hits on 11 keys, 4 hits on 4 keys),
// found in the file of a run that did.
//
// The push script's counter writes reach the file as totals (HSET), not as
// increments: a torn block replayed before the re-send's sets the same
// totals, and counts nothing twice.
func TestTornTransactionTail(t *testing.T) {
	noLeaks(t)
	tr := newTornRedis(t)
	rs, ctx := tr.store, context.Background()
	now := time.Now().UnixMilli()
	start := strategy.WindowStart(now, time.Hour)
	keys := []string{"a", "b", "c", "d"}
	b := &strategy.Batch{ID: "torn-1", Namespace: ratelimit.DefaultNamespace, Now: now}
	for i, k := range keys {
		b.Diffs = append(b.Diffs, strategy.Diff{CounterID: strategy.CounterID{Key: k, Size: time.Hour, Start: start}, Delta: int64(i + 1)})
	}
	_, err := rs.PushDiffs(ctx, b)
	require.NoError(t, err)

	// SIGKILL in the middle of writing the part's block: the file ends
	// inside its EXEC. (The kill lost the reply: the node re-sends.)
	tr.killInsideLastExec()
	tr.restart()                  // loads the cut file
	_, err = rs.PushDiffs(ctx, b) // the re-send, applied: Redis lost the part
	require.NoError(t, err)

	tr.restart() // loads the torn block and the re-send's
	got := map[string]int64{}
	for cnt, err := range rs.GetCounters(ctx, strategy.Query{Namespace: ratelimit.DefaultNamespace, Sizes: []time.Duration{time.Hour}, Now: now}) {
		require.NoError(t, err)
		if cnt.Start == start {
			got[cnt.Key] = cnt.Count
		}
	}
	for i, k := range keys {
		require.Equal(t, int64(i+1), got[k], "key %s counted twice (all: %v)", k, got)
	}
}

// TestTornTakeTail is TestTornTransactionTail for a synchronous-mode take
// on a sliding log: the take's writes are one MULTI/EXEC block, the kill
// cuts it, the node re-sends the take under its ID (the Redis that loaded
// the cut file never recorded it) and the next restart replays the torn
// block before the re-send's. A log written by appending (RPUSH) held the
// entry twice. The take script writes a log as a sorted set whose members
// name their take, so the torn block and the re-send add the same member.
func TestTornTakeTail(t *testing.T) {
	noLeaks(t)
	tr := newTornRedis(t)
	rs, ctx := tr.store, context.Background()
	now := time.Now().UnixMilli()
	logs := []strategy.TakeLog{{Window: time.Hour, Max: 10}, {Window: time.Minute, Max: 10}}
	take := func(id string, cost int64, peek bool) strategy.TakeResult {
		t.Helper()
		res, err := rs.Take(ctx, &strategy.Take{ID: id, Namespace: ratelimit.DefaultNamespace, Key: "k", Now: now, Cost: cost, Peek: peek, Logs: logs})
		require.NoError(t, err)
		return res
	}
	take("before", 1, false) // an entry the torn take finds in the log
	take("torn-1", 3, false)

	tr.killInsideLastExec()
	tr.restart() // loads the cut file: the take is lost
	for _, l := range take("", 0, true).Logs {
		require.Equal(t, int64(1), l.Count, "the cut file holds the first take only")
	}
	take("torn-1", 3, false) // the re-send, applied
	take("after", 2, false)  // and another take

	tr.restart() // loads the torn block with the re-send's
	for j, l := range take("", 0, true).Logs {
		require.Equal(t, int64(6), l.Count, "log %d: the torn take counted twice", j)
	}
}

// tornRedis is a Redis with an append-only file, and a store on it, for
// the torn-transaction tests.
type tornRedis struct {
	t     *testing.T
	dir   string
	srv   *redisServer
	c     *goredis.Client
	store *redis.Store
}

func newTornRedis(t *testing.T) *tornRedis {
	tr := &tornRedis{t: t, dir: t.TempDir()}
	tr.srv = startRedis(t, tr.dir)
	tr.c = goredis.NewClient(redisOptions(tr.srv.addr()))
	t.Cleanup(func() { _ = tr.c.Close() })
	var err error
	tr.store, err = redis.New(tr.c, redis.Options{KeyPrefix: "torn", Shards: 1})
	require.NoError(t, err)
	return tr
}

// killInsideLastExec kills Redis (SIGKILL) and cuts its append-only file
// inside the last transaction's EXEC, as a kill in the middle of writing
// that block leaves it.
func (tr *tornRedis) killInsideLastExec() {
	tr.srv.kill()
	file := aofTail(tr.t, tr.dir)
	data, err := os.ReadFile(file)
	require.NoError(tr.t, err)
	exec := []byte("*1\r\n$4\r\nEXEC\r\n")
	i := bytes.LastIndex(data, exec)
	require.Positive(tr.t, i, "the writes are one MULTI/EXEC block in %s", file)
	require.NoError(tr.t, os.Truncate(file, int64(i+len(exec)-4)))
}

// restart restarts Redis on its file and waits until it takes writes.
func (tr *tornRedis) restart() {
	tr.srv.restart()
	ready := func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		return tr.c.Set(ctx, "torn:ready", "1", time.Minute).Err() == nil
	}
	require.True(tr.t, pollUntil(10*time.Second, ready))
}

// aofTail returns the append-only file Redis appends to in dir: the last
// INCR file of Redis 7's multi-part AOF, or the single file before it.
func aofTail(t *testing.T, dir string) string {
	t.Helper()
	incr, err := filepath.Glob(filepath.Join(dir, "appendonlydir", "*.incr.aof"))
	require.NoError(t, err)
	if len(incr) > 0 {
		newest := incr[0]
		for _, f := range incr[1:] {
			if len(f) > len(newest) || (len(f) == len(newest) && f > newest) {
				newest = f
			}
		}
		return newest
	}
	return filepath.Join(dir, "appendonly.aof")
}
