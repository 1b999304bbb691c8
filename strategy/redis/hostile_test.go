package redis

import (
	"bytes"
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit/internal/faultproxy"
	"github.com/ratesync/ratelimit/strategy"
)

// The refusals go-redis retries by default: after a lost reply, a retry that
// gets one of them must not make the push look "not applied".
var retriedRefusals = []string{
	"LOADING Redis is loading the dataset in memory",
	"READONLY You can't write against a read only replica.",
	"MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.",
	"TRYAGAIN Multiple keys request during rehashing of slot",
	"CLUSTERDOWN The cluster is down",
	"OOM command not allowed when used memory > 'maxmemory'.",
}

// armLostReplyThenRefusal makes the next script call reach Redis and lose its
// reply, and from then on answers every request with the refusal: go-redis's
// retries of the script (and their handshakes) all get it.
func armLostReplyThenRefusal(px *faultproxy.Proxy, refusal string) {
	armLostReplyThenAnswer(px, refuseEach(refusal))
}

// armLostReplyThenAnswer makes the next EVALSHA reach Redis (which applies
// it) and lose its reply; from then on the proxy answers every request with
// answer, so go-redis's retries of the script get it.
func armLostReplyThenAnswer(px *faultproxy.Proxy, answer func([]byte) []byte) {
	px.SetAnswer(answer)
	px.Arm(faultproxy.Cut{
		Match: func(chunk []byte) bool { return bytes.Contains(chunk, []byte("\r\nevalsha\r\n")) },
		ReplyDone: func([]byte) bool {
			px.SetMode(faultproxy.Answer) // before the client can retry
			return true
		},
	})
}

// Case 1 of the hostile-store issue: with the default MaxRetries, a push whose
// first attempt was applied and lost its reply, and whose retries were
// refused, has an unknown outcome: it must keep its batch ID, and its re-send
// must not count the hits twice. With retries off, a refusal of a fresh push
// is still a certain "not applied".
func TestRefusalAfterLostReplyIsUnknown(t *testing.T) {
	noLeaks(t)
	addr := realAddr(t)
	for _, refusal := range retriedRefusals {
		code := refusal[:bytes.IndexByte([]byte(refusal), ' ')]
		t.Run(code, func(t *testing.T) {
			px, s := retryingStore(t, addr)
			ctx := context.Background()
			// Load the script first, so the push below is an EVALSHA.
			warm := &strategy.Batch{ID: "warm", Namespace: "ns", Diffs: []strategy.Diff{{CounterID: strategy.CounterID{Key: "w", Size: time.Minute, Start: 0}, Delta: 1}}}
			_, err := s.PushDiffs(ctx, warm)
			require.NoError(t, err)

			id := strategy.CounterID{Key: "k", Size: time.Minute, Start: 60_000}
			b := &strategy.Batch{ID: "b-" + code, Namespace: "ns", Diffs: []strategy.Diff{{CounterID: id, Delta: 5}}}
			armLostReplyThenRefusal(px, refusal)
			_, err = s.PushDiffs(ctx, b)
			require.Error(t, err)
			require.Equal(t, int64(1), px.Cuts(), "the first attempt's reply was lost")
			require.False(t, errors.Is(err, strategy.ErrNotApplied),
				"an attempt was applied before the refusal, yet the push claims none was: %v", err)

			// The core re-sends the batch unchanged once Redis answers again.
			px.SetMode(faultproxy.Forward)
			res, err := s.PushDiffs(ctx, b)
			require.NoError(t, err)
			require.Equal(t, []int64{5}, res.Totals, "counted once")
		})
	}
	t.Run("no retries", func(t *testing.T) {
		px := newProxy(t, addr)
		opts := clientOptions(px.Addr())
		opts.MaxRetries = -1
		c := goredis.NewClient(opts)
		t.Cleanup(func() { _ = c.Close() })
		s := newStore(t, c, Options{Shards: 4})
		px.SetAnswer(refuseEach("LOADING Redis is loading the dataset in memory"))
		px.SetMode(faultproxy.Answer)
		b := &strategy.Batch{ID: "fresh", Namespace: "ns", Diffs: []strategy.Diff{{CounterID: strategy.CounterID{Key: "k", Size: time.Minute}, Delta: 1}}}
		_, err := s.PushDiffs(context.Background(), b)
		require.ErrorIs(t, err, strategy.ErrNotApplied, "one attempt, refused: surely not applied")
	})
}

// retryingStore returns a proxy to the Redis at addr and a Store on a client
// through it that retries as go-redis does by default (MaxRetries 3).
func retryingStore(t *testing.T, addr string) (*faultproxy.Proxy, *Store) {
	t.Helper()
	px := newProxy(t, addr)
	opts := clientOptions(px.Addr())
	opts.MaxRetries = 3 // go-redis's default
	c := goredis.NewClient(opts)
	t.Cleanup(func() { _ = c.Close() })
	return px, newStore(t, c, Options{Shards: 4})
}

// refuseEach answers every RESP command of a chunk with the error refusal.
func refuseEach(refusal string) func([]byte) []byte {
	reply := []byte("-" + refusal + "\r\n")
	return func(chunk []byte) []byte {
		return bytes.Repeat(reply, max(1, respCommands(chunk)))
	}
}

// respCommands counts the commands (arrays of bulk strings) in a chunk a
// client wrote; a command cut off at the chunk's end counts.
func respCommands(b []byte) int {
	n := 0
	for len(b) > 0 && b[0] == '*' {
		n++
		end := bytes.Index(b, []byte("\r\n"))
		if end < 0 {
			break
		}
		args, err := strconv.Atoi(string(b[1:end]))
		if err != nil {
			break
		}
		b = b[end+2:]
		for range args {
			end = bytes.Index(b, []byte("\r\n"))
			if end < 0 || len(b) == 0 || b[0] != '$' {
				return n
			}
			size, err := strconv.Atoi(string(b[1:end]))
			if err != nil || len(b) < end+2+size+2 {
				return n
			}
			b = b[end+2+size+2:]
		}
	}
	return n
}

// Case 4: a client built with go-redis's default options lets a call to a
// Redis that never answers outlive its context; New refuses it, naming the
// option. Clients that set it return by the context's deadline, even with
// the default timeouts and retries.
func TestClientOptionsBoundEveryWait(t *testing.T) {
	noLeaks(t)
	px := newProxy(t, realAddr(t))
	px.SetMode(faultproxy.BlackHole) // accepts connections, never answers
	addr := px.Addr()
	for name, c := range map[string]goredis.UniversalClient{
		"client":  goredis.NewClient(&goredis.Options{Addr: addr}),
		"cluster": goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: []string{addr}}),
		"ring":    goredis.NewRing(&goredis.RingOptions{Addrs: map[string]string{"a": addr}}),
	} {
		_, err := New(c, Options{})
		require.ErrorIs(t, err, ErrClientOptions, name)
		require.ErrorContains(t, err, "ContextTimeoutEnabled", name)
		_ = c.Close()
	}

	c := goredis.NewClient(&goredis.Options{Addr: addr, ContextTimeoutEnabled: true}) // default timeouts and retries
	t.Cleanup(func() { _ = c.Close() })
	s, err := New(c, Options{})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = s.PushDiffs(ctx, &strategy.Batch{ID: "x", Namespace: "ns",
		Diffs: []strategy.Diff{{CounterID: strategy.CounterID{Key: "k", Size: time.Minute}, Delta: 1}}})
	require.Error(t, err)
	require.Less(t, time.Since(start), time.Second, "a push to a black hole outlived its 200 ms context")
}

// Case 6: no runtime error can stop the push script after its first write.
// Before, an increment that overflowed (or hit a field that is not an
// integer, or a key of another type) failed after the batch-part id was
// written: the part was half applied, and its re-send was taken as applied.
// oneShardStore returns a one-shard store on the real Redis, the hash of
// namespace "ns"'s minute window starting at 0, and the ID of a counter of
// that window.
func oneShardStore(t *testing.T) (*goredis.Client, *Store, string, func(string) strategy.CounterID) {
	c := realClient(t)
	s := newStore(t, c, Options{Shards: 1})
	hash := hashKey(s.shardPrefixes("ns")[0], time.Minute, 0)
	return c, s, hash, func(k string) strategy.CounterID { return strategy.CounterID{Key: k, Size: time.Minute, Start: 0} }
}

func TestScriptSettlesBadDataInPlace(t *testing.T) {
	noLeaks(t)
	c, s, hash, id := oneShardStore(t)
	ctx := context.Background()
	push := func(batch string, diffs ...strategy.Diff) []int64 {
		t.Helper()
		b := &strategy.Batch{ID: batch, Namespace: "ns", Diffs: diffs}
		res, err := s.PushDiffs(ctx, b)
		require.NoError(t, err)
		again, err := s.PushDiffs(ctx, b)
		require.NoError(t, err)
		require.Equal(t, res.Totals, again.Totals, "a re-send is not applied again")
		return res.Totals
	}
	require.Equal(t, []int64{1, 2}, push("b1", strategy.Diff{CounterID: id("a"), Delta: 1}, strategy.Diff{CounterID: id("b"), Delta: 2}))

	// A total near the int64 limit: the increment saturates, and the diff
	// after it in the same part still counts.
	require.NoError(t, c.HSet(ctx, hash, "a", int64(9_223_372_036_854_775_800)).Err())
	require.Equal(t, []int64{strategy.MaxTotal, 5},
		push("b2", strategy.Diff{CounterID: id("a"), Delta: 100}, strategy.Diff{CounterID: id("b"), Delta: 3}))
	// Past MaxTotal without overflowing int64: saturates too.
	require.NoError(t, c.HSet(ctx, hash, "a", int64(strategy.MaxTotal-1)).Err())
	require.Equal(t, []int64{strategy.MaxTotal}, push("b3", strategy.Diff{CounterID: id("a"), Delta: 10}))
	require.NoError(t, c.HSet(ctx, hash, "c", int64(-strategy.MaxTotal+1)).Err())
	require.Equal(t, []int64{-strategy.MaxTotal}, push("b4", strategy.Diff{CounterID: id("c"), Delta: -10}))

	// A field that is not an integer starts again from 0.
	require.NoError(t, c.HSet(ctx, hash, "b", "not a number").Err())
	require.Equal(t, []int64{4, 1}, push("b5", strategy.Diff{CounterID: id("b"), Delta: 4}, strategy.Diff{CounterID: id("d"), Delta: 1}))

	// A key of another type where a hash belongs is replaced, with a TTL.
	require.NoError(t, c.Del(ctx, hash).Err())
	require.NoError(t, c.Set(ctx, hash, "a string", 0).Err())
	require.Equal(t, []int64{7}, push("b6", strategy.Diff{CounterID: id("a"), Delta: 7}))
	ttl, err := c.PTTL(ctx, hash).Result()
	require.NoError(t, err)
	require.Positive(t, ttl)
	// Reads of a corrupt field count 0 rather than failing the push.
	require.NoError(t, c.HSet(ctx, hash, "e", "x").Err())
	res, err := s.PushDiffs(ctx, &strategy.Batch{ID: "b7", Namespace: "ns",
		Diffs: []strategy.Diff{{CounterID: id("a"), Delta: 1}}, Reads: []strategy.CounterID{id("e")}})
	require.NoError(t, err)
	require.Equal(t, []int64{0}, res.Reads)
}

// Case 6: a window whose TTL would overflow is refused before anything is
// sent (before, a window over ~146 years got a negative TTL and its hits
// vanished), and so is a margin that would overflow it.
func TestHugeWindowsRefused(t *testing.T) {
	_, c := miniClient(t)
	s := newStore(t, c, Options{})
	_, err := s.PushDiffs(context.Background(), &strategy.Batch{ID: "x", Namespace: "ns",
		Diffs: []strategy.Diff{{CounterID: strategy.CounterID{Key: "k", Size: 147 * 365 * 24 * time.Hour}, Delta: 1}}})
	require.ErrorIs(t, err, strategy.ErrNotApplied)
	require.ErrorContains(t, err, "MaxWindow")
	_, err = New(c, Options{ExpiryMargin: 100 * 365 * 24 * time.Hour})
	require.ErrorContains(t, err, "ExpiryMargin")
	// The longest window accepted gets a positive TTL.
	require.Positive(t, s.ttl(strategy.MaxWindow))
}

// The push script works a window's totals out itself (one HMGET, one HSET
// of the totals, so that replicas and the append-only file get totals, not
// increments); what it leaves must be what HINCRBY would: a counter met
// twice in one part counts both diffs, a total crossing 2^53 (where a Lua
// number stops being exact) stays exact, and a field holding something
// other than a decimal integer (" 12", "0x10", "1e3") starts again from 0
// as HINCRBY would refuse it. The values are read back from Redis.
func TestScriptTotalsMatchHINCRBY(t *testing.T) {
	noLeaks(t)
	c, s, hash, id := oneShardStore(t)
	ctx := context.Background()
	const exact = 1 << 53
	require.NoError(t, c.HSet(ctx, hash, "near", int64(exact-2), "ws", " 12", "hex", "0x10", "exp", "1e3", "neg", int64(-exact+1)).Err())
	res, err := s.PushDiffs(ctx, &strategy.Batch{ID: "t1", Namespace: "ns", Diffs: []strategy.Diff{
		{CounterID: id("dup"), Delta: 5},
		{CounterID: id("near"), Delta: 1},
		{CounterID: id("dup"), Delta: 7},
		{CounterID: id("near"), Delta: 3}, // crosses 2^53: exact all the same
		{CounterID: id("ws"), Delta: 2},
		{CounterID: id("hex"), Delta: 3},
		{CounterID: id("exp"), Delta: 4},
		{CounterID: id("neg"), Delta: -5},
		{CounterID: id("near"), Delta: 10},
	}})
	require.NoError(t, err)
	want := map[string]int64{"dup": 12, "near": exact + 12, "ws": 2, "hex": 3, "exp": 4, "neg": -exact - 4}
	require.Equal(t, []int64{5, exact - 1, 12, exact + 2, 2, 3, 4, -exact - 4, exact + 12}, res.Totals)
	got, err := c.HGetAll(ctx, hash).Result()
	require.NoError(t, err)
	for k, v := range want {
		require.Equal(t, strconv.FormatInt(v, 10), got[k], "field %s", k)
	}
}
