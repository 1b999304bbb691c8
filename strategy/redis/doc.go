// Package redis is a strategy.Strategy on Redis, through go-redis v9: one
// Store works unchanged with a standalone *goredis.Client, a Sentinel
// FailoverClient and a *goredis.ClusterClient.
//
// # Key layout
//
// A counter (namespace, key, window size, window start) lives in a Redis hash,
// under the field key, in the hash
//
//	<KeyPrefix>:{<namespace>.<shard>}:<size ms>:<start ms>
//
// where shard = hash(key) mod Options.Shards. The counters of one
// namespace-window are thus spread over Shards hashes whose hash tags differ,
// so in Redis Cluster they land in about Shards distinct slots instead of one
// hot slot. All the windows of one key share its hash tag, so the current and
// previous windows of a key can be written and read by one script call.
// The characters '{', '}' and '%' in a namespace are escaped (%7B, %7D, %25)
// so a namespace cannot break the hash tag. Beside the hash of a watched
// window, in its hash tag and with its TTL, live its version key
// (<hash>:v), its change log (<hash>:l) and its markers (<hash>:m, see
// Watches). Everything of one key lives in its shard's hash tag:
//
//	<KeyPrefix>:{<namespace>.<shard>}:tb:<period ms>:<key>   a token bucket
//	<KeyPrefix>:{<namespace>.<shard>}:sl:<window ms>:<key>   a sliding log
//	<KeyPrefix>:{<namespace>.<shard>}:t:<take id>            a Take's decision
//
// # Pushes: one round trip, exactly once
//
// PushDiffs groups a batch's diffs and bucket diffs by hash tag and runs, per
// group, one Lua script (EVALSHA, lua/push.lua) that first records a
// batch-part id
//
//	<KeyPrefix>:{<namespace>.<shard>}:b:<batch id>:<part>:<parts>
//
// with SET NX PX, and only when that key was new applies the increments
// (HINCRBY, logging the fields of a watched window in its change log, then
// PEXPIRE of the window's keys whenever the increment may have created the
// hash, so no key is ever left without a TTL) and the bucket diffs. The
// same script answers the batch's watches of that hash tag and reads its other counters
// there when they are few (up to 8; Batch.Reads, for example the previous
// windows); more go out as HMGETs after it in the same pipeline, which
// costs Redis a quarter of what an HMGET from a script does. A re-sent batch
// finds its part ids already recorded and answers with the current totals
// and states without applying anything: a push is applied exactly once,
// even when go-redis's own retries (MaxRetries, 3 by default) re-send a
// script whose reply was lost. Hash tags the batch does not write are read
// by HMGETs, MGETs (buckets) and a watch script (lua/watch.lua) in the same
// pipeline, so a sync costs one pipelined round trip; batches of more than
// Options.BatchSize counters are sent as several pipelines.
//
// Concurrent single commands (synchronous-mode increments: a diff and the
// previous window's read share their key's hash tag; Takes) are combined:
// those that arrive while two are in flight go out together in one
// pipeline, which saves Redis a read and a write system call per command.
//
// A batch-part id lives Options.BatchIDTTL (5 minutes by default), or less
// when every window the part wrote expires sooner: a re-send is recognised for
// that long. Scripts are sent with EVALSHA; after SCRIPT FLUSH or a restart the
// NOSCRIPT answers are re-sent once with EVAL (their part's reads with
// them), which is safe because NOSCRIPT means the script did not run.
//
// # Watches
//
// A Watch of a window is answered shard by shard. A window of a shard that
// has been watched has a version key holding incarnation * 2^24 + count:
// count goes up by one for every script call that changes the window, and
// the incarnation is drawn at random (28 bits, by the client) whenever the
// version key is created, so versions of a lost window are never taken for
// its successor's. Its change log is a sorted set holding each counter
// changed since the first watch once, scored with the version of its last
// change: its memory follows the window's distinct counters, not its churn,
// and it expires with the hash. A window nobody watches has no version key
// and logs nothing (a write costs one GET more than before watches); the
// first watch creates the version key with a marker at its first version,
// since the log cannot tell what changed before.
//
// Markers stand for changes the log does not list. A batch that changes at
// least half of a window's counters in a shard (and at least 64) does not
// log them one by one, which would cost Redis about what the increments
// cost: each of its script calls adds its version to the window's markers
// (<hash>:m, the latest 32 kept, and the member 't' scored with the latest
// one trimmed).
//
// A cursor lists a version per shard (base 36, comma-separated; an empty
// entry for a shard that held nothing of the window; "" when no shard did).
// A shard answers the changes scored after the cursor's version, reading
// only those counters (ZCOUNT, then ZRANGEBYSCORE and HMGET), except the
// changes of the batch's own versions, whose counters come from the
// batch's totals: a counter this batch changed is listed with the total the
// batch returned, once. When the shard's range holds another batch's
// marker (or the window was not watched before and the cursor is from the
// start), the shard lists every counter it holds instead. A shard answers
// with at most twice its share of the limit the batch's own diffs leave,
// plus 64, else it overflows: the answers of every shard make the window's,
// Overflow when any shard's is, or when the counters listed (the batch's
// own included) are more than Watch.Limit. A shard the batch writes in
// several script calls (more than 1,000 diffs there) answers its watches
// once they all ran, in a follow-up watch script in a second round trip
// that skips the versions of those calls.
//
// What the version keys detect, as an Overflow (never a silent miss): a
// window lost since the cursor, written again or not (expired, FLUSHALL, a
// Redis restarted without persistence: its version key is gone or of
// another incarnation); a cursor of another Shards count or a corrupt one;
// and a cursor ahead of its window, which proves Redis lost versions it had
// answered (a failover to a replica that lagged): the window then starts a
// new incarnation, so every other node's cursor overflows too.
//
// What they cannot detect: after a failover to a replica that lagged by k
// versions of a window, once the new primary's writes have taken the
// window's count k versions further before any node presents a cursor of
// the lost ones, the versions of the lost writes are reused by new ones,
// and a node whose cursor was at a lost version misses the new writes
// scored up to it until those counters change again; and the lost writes
// themselves (a node keeps the totals it learned from them until the
// counters change). Options.WaitReplicas narrows this to the shards a
// watch read without writing. Nor do they see writes of a library version
// that did not log them: every node must run a version with watches before
// any relies on them.
//
// # Token buckets
//
// A bucket is a string key in its key's hash tag, "<tat> <interval>", both
// written with 17 significant digits (string.format('%.17g')), so that they
// read back bit for bit. A push applies strategy.ApplyBucket in Lua, in
// Go's order of operations, at the batch's Now, under the batch-part id of
// its hash tag, and gives the key a TTL that ends at strategy.BucketExpiry
// (computed from the new state) plus Options.ExpiryMargin; Purge has nothing
// to do. A string key per bucket rather than a field of a shared hash:
// Redis 7.0 has no TTL per hash field, and a bucket's expiry is its own.
//
// # Take
//
// Take runs one script call (lua/take.lua), through the combiner, which
// decides on the key's buckets and sliding logs as the memory store does,
// step by step (BucketFits's expression in Go's order; the sliding log's
// entries, pruning, merging past 2*max entries and newest-first take back),
// and records the decision under the Take ID for as long as any limit may
// hold its cost (a minute at least) plus Options.ExpiryMargin. A take of
// one bucket and no log, decided under a new ID, takes a path of its own:
// a GET of the bucket, a SET NX GET that records the decision and tells
// whether one was recorded before, and a SET of the bucket. A sliding log is
// a sorted set of entries named "<cost> <take ID>" and scored by their
// instant (plus a fraction that keeps one instant's entries in order),
// read whole by each take (at most 2*max entries) and written back by ZREM
// and ZADD of the entries that changed: writes that a replayed append-only
// file block repeats harmlessly (see lua/take.lua).
//
// # Errors
//
// PushDiffs and Take wrap strategy.ErrNotApplied only when they know nothing
// was written: the context was done before anything was sent, the request
// was invalid, Redis refused every part before it ran (NOSCRIPT twice,
// READONLY, LOADING, MASTERDOWN, BUSY, CLUSTERDOWN, TRYAGAIN, CROSSSLOT, OOM,
// MISCONF, NOREPLICAS, NOAUTH, NOPERM), or the connection could not be made
// at all with a client whose retries are disabled (MaxRetries -1). Every
// other error, a timeout or a connection lost after sending in particular,
// leaves the outcome unknown: the caller re-sends the same batch or Take,
// which the batch-part ids and Take records make safe. With go-redis retries
// enabled a dial error or a refusal is also "unknown", because an earlier
// attempt of the same command may have reached Redis; that costs nothing
// but the chance to merge the batch with newer hits. A push whose writes
// succeeded and whose follow-up watch failed is of unknown outcome too: its
// re-send applies nothing and answers the watches again.
//
// Set the go-redis retry and timeout options explicitly (MaxRetries,
// ReadTimeout, WriteTimeout, DialTimeout, PoolTimeout): the Store stays exact
// with any of them, including the default MaxRetries of 3, but they decide how
// long a sync may take when Redis is slow or gone.
//
// # Durability
//
// Redis replicates asynchronously: after a Sentinel failover the new primary
// lacks the writes the old one acknowledged and had not passed on, and those
// hits are lost. Options.WaitReplicas makes each writing pipeline end with
// WAIT and treats a push fewer replicas acknowledged as of unknown outcome, so
// the caller keeps re-sending it (exactly once, by its batch-part ids) until a
// replica has it: a failover then loses nothing, at the price of a replica
// round trip per push and of stalled syncs while no replica follows.
//
// # Memory
//
// Run the Store on a Redis with maxmemory-policy noeviction, or on a Redis of
// its own. Under noeviction a full Redis refuses each push (OOM): nothing of
// it is written, the caller keeps its hits and pushes them once memory is
// freed or maxmemory raised, and nothing is lost. Under an eviction policy
// (allkeys-*, and volatile-* too, since every key the Store writes has a TTL)
// Redis deletes counters, losing their hits, and deletes the batch-part ids,
// which are written once and never read again and so are the first keys an
// LRU policy picks: a push re-sent after a lost reply is then applied a second
// time. Measured with filler keys written without pause into 4 MB of headroom,
// every re-sent part had lost its id within 700 ms, and most counted hits were
// evicted (chaos/store TestMaxmemoryEviction).
//
// # Expiry
//
// Every hash gets a TTL of twice its window size plus Options.ExpiryMargin,
// set by the write that creates it and refreshed by every write that adds a
// field (with its version key and change log, so the three expire
// together), so a window outlives the time it can be read as "previous
// window" as long as node clocks are less than ExpiryMargin ahead. A bucket
// expires at strategy.BucketExpiry plus ExpiryMargin, a sliding log when its
// newest entry leaves the window (plus ExpiryMargin), a Take's record when
// none of its limits can hold its cost any more (a minute at least, plus
// ExpiryMargin). Purge does nothing: Redis expires everything itself.
//
// # Clock
//
// Nodes name windows by their start on the Unix epoch, so a node whose clock
// is off counts into the wrong window near boundaries. Store.Clock returns a
// Clock that follows Redis TIME (one server for every node) instead of the
// local clock.
package redis
