package redis

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit/strategy"
	"github.com/ratesync/ratelimit/strategy/strategytest"
)

const base int64 = 1_700_000_040_000 // aligned to every size these tests use

func diff(key string, size time.Duration, start, delta int64) strategy.Diff {
	return strategy.Diff{CounterID: strategy.CounterID{Key: key, Size: size, Start: start}, Delta: delta}
}

var idSeq struct{ n int }

func batchID(t testing.TB) string {
	idSeq.n++
	return fmt.Sprintf("%s-%d", uniquePrefix(t), idSeq.n)
}

// contract runs the strategy contract suite against stores on client c.
func contract(t *testing.T, c goredis.UniversalClient) {
	strategytest.Run(t, func(t *testing.T) strategy.Strategy {
		return newStore(t, c, Options{})
	})
	// The same with few shards and tiny batches: many parts per shard,
	// many pipelines per push.
	t.Run("SmallBatches", func(t *testing.T) {
		strategytest.Run(t, func(t *testing.T) strategy.Strategy {
			return newStore(t, c, Options{Shards: 3, BatchSize: 7})
		})
	})
}

func TestContractMiniredis(t *testing.T) {
	noLeaks(t)
	_, c := miniClient(t)
	contract(t, c)
}

func TestContractRedis(t *testing.T) {
	noLeaks(t)
	contract(t, realClient(t))
}

func TestContractCluster(t *testing.T) {
	noLeaks(t)
	contract(t, clusterClient(t))
}

func TestContractSentinel(t *testing.T) {
	noLeaks(t)
	contract(t, sentinelClient(t))
}

func TestNewValidatesOptions(t *testing.T) {
	_, c := miniClient(t)
	for _, tc := range []struct {
		opts  Options
		field string
	}{
		{Options{KeyPrefix: "a{b"}, "KeyPrefix"},
		{Options{KeyPrefix: "}"}, "KeyPrefix"},
		{Options{Shards: -1}, "Shards"},
		{Options{Shards: MaxShards + 1}, "Shards"},
		{Options{BatchSize: -5}, "BatchSize"},
		{Options{ExpiryMargin: -time.Second}, "ExpiryMargin"},
		{Options{BatchIDTTL: -time.Second}, "BatchIDTTL"},
	} {
		_, err := New(c, tc.opts)
		require.ErrorContains(t, err, "Options."+tc.field, "%+v", tc.opts)
	}
	_, err := New(nil, Options{})
	require.Error(t, err)

	s, err := New(c, Options{})
	require.NoError(t, err)
	require.Equal(t, Options{KeyPrefix: DefaultKeyPrefix, Shards: DefaultShards, BatchSize: DefaultBatchSize,
		ExpiryMargin: DefaultExpiryMargin, BatchIDTTL: DefaultBatchIDTTL, WaitTimeout: DefaultWaitTimeout}, s.Options())
}

func TestKeyLayout(t *testing.T) {
	_, c := miniClient(t)
	s := newStore(t, c, Options{KeyPrefix: "p", Shards: 4})
	p := s.shardPrefixes("api")
	require.Equal(t, []string{"p:{api.0}:", "p:{api.1}:", "p:{api.2}:", "p:{api.3}:"}, p)
	require.Equal(t, "p:{api.2}:60000:1700000040000", hashKey(p[2], time.Minute, base))
	// Braces in a namespace cannot end the hash tag early; escaping is injective.
	require.Equal(t, "p:{a%7Bb%7D%25c.0}:", s.shardPrefixes("a{b}%c")[0])
	require.NotEqual(t, s.shardPrefixes("a%7B")[0], s.shardPrefixes("a{")[0])

	// A namespace with braces still works end to end and spreads over shards.
	ctx := context.Background()
	var diffs []strategy.Diff
	for i := range 40 {
		diffs = append(diffs, diff(fmt.Sprintf("k%d", i), time.Minute, base, 1))
	}
	_, err := s.PushDiffs(ctx, &strategy.Batch{ID: batchID(t), Namespace: "a{b}", Diffs: diffs})
	require.NoError(t, err)
	slots := map[int]bool{}
	keys, err := c.Keys(ctx, "p:*").Result()
	require.NoError(t, err)
	for _, k := range keys {
		if !strings.Contains(k, ":b:") {
			slots[keySlot(k)] = true
		}
	}
	require.Len(t, slots, 4)
}

// The split of a batch into parts depends on its content, not its order, so
// a re-sent batch reaches the same batch-part ids.
func TestPlanIgnoresOrder(t *testing.T) {
	_, c := miniClient(t)
	s := newStore(t, c, Options{Shards: 2, BatchSize: 5})
	var diffs []strategy.Diff
	for i := range 50 {
		diffs = append(diffs, diff(fmt.Sprintf("key-%d", i), time.Second, base, int64(i)))
	}
	where := func(diffs []strategy.Diff) map[string][2]int {
		parts, err := s.plan(&strategy.Batch{Diffs: diffs})
		require.NoError(t, err)
		m := map[string][2]int{}
		for _, p := range parts {
			// Parts are cut by key hash, so their size is only about the bound.
			require.LessOrEqual(t, p.counters, 2*5)
			for _, w := range p.windows {
				for _, i := range w.diffs {
					m[diffs[i].Key] = [2]int{p.shard, p.chunk}
				}
			}
		}
		return m
	}
	rev := make([]strategy.Diff, len(diffs))
	for i, d := range diffs {
		rev[len(diffs)-1-i] = d
	}
	require.Equal(t, where(diffs), where(rev))
}

// crc16 is the CRC16-XMODEM Redis Cluster hashes keys with.
func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc ^= uint16(s[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}

// keySlot is Redis Cluster's HASH_SLOT: CRC16 of the hash tag if the key has
// a non-empty one, else of the whole key, mod 16384.
func keySlot(key string) int {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	return int(crc16(key) % 16384)
}

func tenThousandKeys() []strategy.Diff {
	diffs := make([]strategy.Diff, 10_000)
	for i := range diffs {
		diffs[i] = diff(fmt.Sprintf("user-%d", i), time.Minute, base, 1)
	}
	return diffs
}

// With 10,000 keys in one window, the counters sit in many slots.
func TestNoHotSlot(t *testing.T) {
	_, c := miniClient(t)
	s := newStore(t, c, Options{})
	ctx := context.Background()
	_, err := s.PushDiffs(ctx, &strategy.Batch{ID: batchID(t), Namespace: "hot", Diffs: tenThousandKeys()})
	require.NoError(t, err)
	keys, err := c.Keys(ctx, s.opts.KeyPrefix+":*").Result()
	require.NoError(t, err)
	slots := map[int]int{}
	for _, k := range keys {
		if !strings.Contains(k, ":b:") {
			slots[keySlot(k)]++
		}
	}
	require.GreaterOrEqual(t, len(slots), 16, "distinct slots")
	t.Logf("10,000 keys of one window in %d hashes, %d distinct slots", len(keys)/2, len(slots))
}

// On a real cluster: the counters spread over slots and over every master,
// CLUSTER KEYSLOT agrees with keySlot, and no command answered CROSSSLOT.
func TestClusterSpread(t *testing.T) {
	noLeaks(t)
	c := clusterClient(t)
	s := newStore(t, c, Options{})
	ctx := context.Background()
	diffs := tenThousandKeys()
	res, err := s.PushDiffs(ctx, &strategy.Batch{ID: batchID(t), Namespace: "hot", Diffs: diffs})
	require.NoError(t, err)
	for _, n := range res.Totals {
		require.Equal(t, int64(1), n)
	}
	slots := map[int64]bool{}
	var (
		mu      sync.Mutex // ForEachMaster calls fn concurrently
		masters int
		keys    []string
	)
	require.NoError(t, c.ForEachMaster(ctx, func(ctx context.Context, n *goredis.Client) error {
		ks, err := n.Keys(ctx, s.opts.KeyPrefix+":*").Result()
		if err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		if len(ks) > 0 {
			masters++
		}
		keys = append(keys, ks...)
		return nil
	}))
	for _, k := range keys {
		slot, err := c.ClusterKeySlot(ctx, k).Result()
		require.NoError(t, err)
		require.Equal(t, int64(keySlot(k)), slot, k)
		slots[slot] = true
	}
	require.GreaterOrEqual(t, len(slots), 16)
	require.Equal(t, 3, masters, "every master holds counters")
	got := 0
	for _, err := range s.GetCounters(ctx, strategy.Query{Namespace: "hot", Sizes: []time.Duration{time.Minute}, Now: base}) {
		require.NoError(t, err)
		got++
	}
	require.Equal(t, len(diffs), got)
}

// scanKeys returns every key with the store's prefix (on every master of a cluster).
func scanKeys(t *testing.T, c goredis.UniversalClient, prefix string) []string {
	t.Helper()
	ctx := context.Background()
	scan := func(n goredis.Cmdable) []string {
		var out []string
		it := n.Scan(ctx, 0, prefix+":*", 1000).Iterator()
		for it.Next(ctx) {
			out = append(out, it.Val())
		}
		require.NoError(t, it.Err())
		return out
	}
	if cc, ok := c.(*goredis.ClusterClient); ok {
		ch := make(chan []string, 16)
		require.NoError(t, cc.ForEachMaster(ctx, func(ctx context.Context, n *goredis.Client) error {
			ch <- scan(n)
			return nil
		}))
		close(ch)
		var out []string
		for ks := range ch {
			out = append(out, ks...)
		}
		return out
	}
	return scan(c)
}

// Every key the store writes has a TTL of at least twice its window.
func testTTL(t *testing.T, c goredis.UniversalClient) {
	// The margin is wide so that a loaded machine's delay between the write
	// and the PTTL read never eats into twice the window.
	const margin = 10 * time.Second
	s := newStore(t, c, Options{Shards: 4, ExpiryMargin: margin})
	ctx := context.Background()
	sizes := []time.Duration{250 * time.Millisecond, time.Second, time.Minute, time.Hour}
	var diffs []strategy.Diff
	for i := range 30 {
		for _, size := range sizes {
			diffs = append(diffs, diff(fmt.Sprintf("k%d", i), size, base, 1))
		}
	}
	b := &strategy.Batch{ID: batchID(t), Namespace: "ttl", Diffs: diffs,
		Reads: []strategy.CounterID{{Key: "never-written", Size: time.Hour, Start: base}}}
	_, err := s.PushDiffs(ctx, b)
	require.NoError(t, err)
	check := func(keys []string) {
		t.Helper()
		for _, k := range keys {
			pttl, err := c.PTTL(ctx, k).Result()
			require.NoError(t, err)
			require.Positive(t, pttl, k)
			if strings.Contains(k, ":b:") {
				// BatchIDTTL (5m), as the part's longest window lives longer.
				require.Greater(t, pttl, 4*time.Minute, k)
				require.LessOrEqual(t, pttl, 5*time.Minute, k)
				continue
			}
			// A window's version key, change log and markers live as long as
			// its hash.
			h := k
			for _, suffix := range []string{versionSuffix, logSuffix, markSuffix} {
				h = strings.TrimSuffix(h, suffix)
			}
			var size, start int64
			_, err = fmt.Sscanf(h[strings.LastIndexByte(h[:strings.LastIndexByte(h, ':')], ':')+1:], "%d:%d", &size, &start)
			require.NoError(t, err, k)
			min := 2 * time.Duration(size) * time.Millisecond
			require.GreaterOrEqual(t, pttl, min, k)
			require.LessOrEqual(t, pttl, min+margin, k)
		}
	}
	keys := scanKeys(t, c, s.opts.KeyPrefix)
	require.Len(t, keys, 4*len(sizes)+4, "4 shards x %d windows + 4 batch-part ids (nothing watched: no version keys): %v", len(sizes), keys)
	check(keys)

	// Watched windows: the first watch starts their versions and markers,
	// the next push logs its changes.
	var watches []strategy.Watch
	for _, size := range sizes {
		watches = append(watches, strategy.Watch{Size: size, Start: base, Limit: 1000})
	}
	res, err := s.PushDiffs(ctx, &strategy.Batch{ID: batchID(t), Namespace: "ttl", Watches: watches})
	require.NoError(t, err)
	for i := range watches {
		watches[i].Cursor = res.Changes[i].Cursor
	}
	_, err = s.PushDiffs(ctx, &strategy.Batch{ID: batchID(t), Namespace: "ttl", Diffs: diffs, Watches: watches})
	require.NoError(t, err)
	keys = scanKeys(t, c, s.opts.KeyPrefix)
	require.Len(t, keys, 4*4*len(sizes)+2*4, "4 shards x %d windows x (hash, version, log, markers) + 2 x 4 batch-part ids: %v", len(sizes), keys)
	check(keys)

	// A part whose windows all expire sooner than BatchIDTTL keeps its id
	// only as long as they live.
	short := &strategy.Batch{ID: batchID(t), Namespace: "ttl-short",
		Diffs: []strategy.Diff{diff("k", 250*time.Millisecond, base, 1), diff("k", time.Second, base, 1)}}
	_, err = s.PushDiffs(ctx, short)
	require.NoError(t, err)
	ids := 0
	for _, k := range scanKeys(t, c, s.opts.KeyPrefix) {
		if strings.Contains(k, ":{ttl-short.") && strings.Contains(k, ":b:") {
			ids++
			pttl, err := c.PTTL(ctx, k).Result()
			require.NoError(t, err)
			require.Positive(t, pttl, k)
			require.LessOrEqual(t, pttl, 2*time.Second+margin, k)
		}
	}
	require.Equal(t, 1, ids)
}

func TestTTLMiniredis(t *testing.T) {
	_, c := miniClient(t)
	testTTL(t, c)
}

func TestTTLRedis(t *testing.T) {
	noLeaks(t)
	testTTL(t, realClient(t))
}

func TestTTLCluster(t *testing.T) {
	noLeaks(t)
	testTTL(t, clusterClient(t))
}

// Pushes survive SCRIPT FLUSH (as after a restart): NOSCRIPT answers are
// re-sent with EVAL, within the same PushDiffs call, and a re-sent batch is
// still recognised.
func testScriptFlush(t *testing.T, c goredis.UniversalClient, flush func()) {
	s := newStore(t, c, Options{Shards: 8})
	ctx := context.Background()
	var diffs []strategy.Diff
	for i := range 20 {
		diffs = append(diffs, diff(fmt.Sprintf("k%d", i), time.Minute, base, 2))
	}
	b := &strategy.Batch{ID: batchID(t), Namespace: "flush", Diffs: diffs}
	for round := range 3 {
		flush()
		res, err := s.PushDiffs(ctx, b)
		require.NoError(t, err, "round %d", round)
		for _, n := range res.Totals {
			require.Equal(t, int64(2), n, "round %d", round)
		}
	}
	flush()
	res, err := s.PushDiffs(ctx, &strategy.Batch{ID: batchID(t), Namespace: "flush", Diffs: diffs[:1]})
	require.NoError(t, err)
	require.Equal(t, []int64{4}, res.Totals)
}

func TestScriptFlushMiniredis(t *testing.T) {
	_, c := miniClient(t)
	testScriptFlush(t, c, func() { require.NoError(t, c.ScriptFlush(context.Background()).Err()) })
}

func TestScriptFlushRedis(t *testing.T) {
	noLeaks(t)
	c := realClient(t)
	testScriptFlush(t, c, func() { require.NoError(t, c.ScriptFlush(context.Background()).Err()) })
}

func TestScriptFlushCluster(t *testing.T) {
	noLeaks(t)
	c := clusterClient(t)
	testScriptFlush(t, c, func() {
		// ScriptFlush on a ClusterClient flushes every master.
		require.NoError(t, c.ScriptFlush(context.Background()).Err())
	})
}

func onePush(s *Store, ctx context.Context) error {
	_, err := s.PushDiffs(ctx, &strategy.Batch{ID: "b-" + newBatchID(), Namespace: "err",
		Diffs: []strategy.Diff{diff("a", time.Minute, base, 1), diff("b", time.Minute, base, 1)}})
	return err
}

func TestErrorClassification(t *testing.T) {
	ctx := context.Background()

	t.Run("CancelledBeforeSending", func(t *testing.T) {
		_, c := miniClient(t)
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		require.ErrorIs(t, onePush(newStore(t, c, Options{}), cctx), strategy.ErrNotApplied)
	})

	t.Run("RefusedByRedis", func(t *testing.T) {
		mr, retrying := miniClient(t)
		opts := clientOptions(mr.Addr())
		opts.MaxRetries = -1
		c := goredis.NewClient(opts)
		t.Cleanup(func() { _ = c.Close() })
		s := newStore(t, c, Options{})
		mr.SetError("LOADING Redis is loading the dataset in memory")
		err := onePush(s, ctx)
		require.ErrorIs(t, err, strategy.ErrNotApplied, "one attempt, refused")
		err = onePush(newStore(t, retrying, Options{}), ctx)
		require.Error(t, err)
		require.NotErrorIs(t, err, strategy.ErrNotApplied,
			"with retries, an earlier attempt may have been applied before the refusal")
		mr.SetError("ERR something odd")
		err = onePush(s, ctx)
		require.Error(t, err)
		require.NotErrorIs(t, err, strategy.ErrNotApplied, "an unexplained error leaves the outcome unknown")
		mr.SetError("")
		require.NoError(t, onePush(s, ctx))
	})

	t.Run("DialFailure", func(t *testing.T) {
		noLeaks(t)
		mr, _ := miniClient(t)
		addr := mr.Addr()
		mr.Close() // nothing listens there now

		opts := clientOptions(addr)
		opts.MaxRetries = -1
		single := goredis.NewClient(opts)
		defer single.Close()
		err := onePush(newStore(t, single, Options{}), ctx)
		require.ErrorIs(t, err, strategy.ErrNotApplied, "one attempt that never connected: nothing sent")

		opts = clientOptions(addr)
		retrying := goredis.NewClient(opts)
		defer retrying.Close()
		err = onePush(newStore(t, retrying, Options{}), ctx)
		require.Error(t, err)
		require.NotErrorIs(t, err, strategy.ErrNotApplied, "with retries an earlier attempt may have been sent")
	})

	t.Run("ReadOnlyReplica", func(t *testing.T) {
		noLeaks(t)
		_, master := sentinelConfig(t)
		sc := sentinelFor(t)
		// After a failover Sentinel may list the old primary before it has
		// been turned into a replica: wait until one reports the role.
		var r *goredis.Client
		var replicas []map[string]string
		for deadline := time.Now().Add(15 * time.Second); r == nil; {
			var err error
			replicas, err = sc.Replicas(ctx, master).Result()
			require.NoError(t, err)
			for _, rep := range replicas {
				c := newClient(t, rep["ip"]+":"+rep["port"])
				if info, err := c.Info(ctx, "replication").Result(); err == nil && strings.Contains(info, "role:slave") {
					r = c
					break
				}
			}
			if r == nil {
				require.True(t, time.Now().Before(deadline), "no replica of %s became a replica: %v", master, replicas)
				time.Sleep(100 * time.Millisecond) // polling a server's role
			}
		}
		opts := clientOptions(r.Options().Addr)
		opts.MaxRetries = -1
		single := goredis.NewClient(opts)
		t.Cleanup(func() { _ = single.Close() })
		err := onePush(newStore(t, single, Options{}), ctx)
		require.ErrorIs(t, err, strategy.ErrNotApplied, "a replica refuses the first write")
		require.ErrorContains(t, err, "READONLY")
	})

	t.Run("PartlyApplied", func(t *testing.T) {
		// One part applied and one refused: the batch is neither applied nor
		// "not applied", so the caller must re-send it.
		_, c := miniClient(t)
		s := newStore(t, c, Options{})
		s.noRetries = true // a refusal is certain only for a single attempt
		ok := goredis.NewCmd(ctx)
		ok.SetVal([]any{int64(1), int64(1)}) // applied; the total
		refused := goredis.NewCmd(ctx)
		refused.SetErr(goredis.ErrNoScript)
		w := partWindow{window: window{time.Minute, base}, diffs: []int32{0}}
		w2 := partWindow{window: window{time.Minute, base}, diffs: []int32{1}}
		parts := []part{
			{chunks: 1, windows: []partWindow{w}, counters: 1, script: ok},
			{chunks: 1, windows: []partWindow{w2}, counters: 1, script: refused},
		}
		b := &strategy.Batch{Diffs: []strategy.Diff{diff("a", time.Minute, base, 1), diff("b", time.Minute, base, 1)}}
		res, acc := s.newResult(b)
		err := s.collect(b, parts, &res, acc)
		require.Error(t, err)
		require.NotErrorIs(t, err, strategy.ErrNotApplied)
		parts[0].script = refused
		err = s.collect(b, parts, &res, acc)
		require.ErrorIs(t, err, strategy.ErrNotApplied)
	})
}

// A batch with only reads writes nothing and needs no script.
func TestReadOnlyBatch(t *testing.T) {
	_, c := miniClient(t)
	s := newStore(t, c, Options{Shards: 4, BatchSize: 3})
	ctx := context.Background()
	var diffs []strategy.Diff
	var reads []strategy.CounterID
	for i := range 12 {
		diffs = append(diffs, diff(fmt.Sprintf("k%d", i), time.Minute, base, int64(i)))
		reads = append(reads, diffs[i].CounterID)
	}
	_, err := s.PushDiffs(ctx, &strategy.Batch{ID: batchID(t), Namespace: "ro", Diffs: diffs})
	require.NoError(t, err)
	idKeys, err := c.Keys(ctx, s.opts.KeyPrefix+":*:b:*").Result()
	require.NoError(t, err)
	res, err := s.PushDiffs(ctx, &strategy.Batch{ID: batchID(t), Namespace: "ro", Reads: reads})
	require.NoError(t, err)
	for i, n := range res.Reads {
		assert.Equal(t, int64(i), n)
	}
	keys, err := c.Keys(ctx, s.opts.KeyPrefix+":*:b:*").Result()
	require.NoError(t, err)
	require.ElementsMatch(t, idKeys, keys, "the read-only push records no batch id")
	_, err = s.PushDiffs(ctx, &strategy.Batch{ID: batchID(t), Namespace: "ro",
		Diffs: []strategy.Diff{diff("x", 0, base, 1)}})
	require.ErrorIs(t, err, strategy.ErrNotApplied, "a bad window size is refused before sending")
}
