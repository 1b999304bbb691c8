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
// so a namespace cannot break the hash tag.
//
// # Pushes: one round trip, exactly once
//
// PushDiffs groups a batch's diffs by hash tag and runs, per group, one Lua
// script (EVALSHA) that first records a batch-part id
//
//	<KeyPrefix>:{<namespace>.<shard>}:b:<batch id>:<part>:<parts>
//
// with SET NX PX, and only when that key was new applies the increments
// (HINCRBY, then PEXPIRE whenever the increment may have created the hash, so
// no hash is ever left without a TTL). The same
// script reads the batch's other counters of that hash tag (Batch.Reads, for
// example the previous windows) and returns every total. A re-sent batch finds
// its part ids already recorded and answers with the current totals without
// applying anything: a push is applied exactly once, even when go-redis's own
// retries (MaxRetries, 3 by default) re-send a script whose reply was lost.
// Reads of hash tags the batch does not write go out as HMGET in the same
// pipeline, so a sync costs one pipelined round trip; batches of more than
// Options.BatchSize counters are sent as several pipelines.
//
// Concurrent pushes of one command each (synchronous-mode increments: a diff
// and the previous window's read share their key's hash tag) are combined:
// those that arrive while two are in flight go out together in one pipeline,
// which saves Redis a read and a write system call per push.
//
// A batch-part id lives Options.BatchIDTTL (5 minutes by default), or less
// when every window the part wrote expires sooner: a re-send is recognised for
// that long. Scripts are sent with EVALSHA; after SCRIPT FLUSH or a restart the
// NOSCRIPT answers are re-sent once with EVAL, which is safe because NOSCRIPT
// means the script did not run.
//
// # Errors
//
// PushDiffs wraps strategy.ErrNotApplied only when it knows nothing was
// written: the context was done before anything was sent, Redis refused every
// part before it ran (NOSCRIPT twice, READONLY, LOADING, MASTERDOWN, BUSY,
// CLUSTERDOWN, TRYAGAIN, CROSSSLOT, OOM, MISCONF, NOREPLICAS, NOAUTH, NOPERM),
// or the connection could not be made at all with a client whose retries are
// disabled (MaxRetries -1). Every other error, a timeout or a connection lost
// after sending in particular, leaves the outcome unknown: the caller re-sends
// the same batch, which the batch-part ids make safe. With go-redis retries
// enabled a dial error is also "unknown", because an earlier attempt of the
// same pipeline may have reached Redis; that costs nothing but the chance to
// merge the batch with newer hits.
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
// # Expiry
//
// Every hash gets a TTL of twice its window size plus Options.ExpiryMargin,
// set by the write that creates it and refreshed by every write that adds a
// field, so a window outlives the time it can be read as "previous window"
// as long as node clocks are less than ExpiryMargin ahead. Purge does
// nothing: Redis expires the counters itself.
//
// # Clock
//
// Nodes name windows by their start on the Unix epoch, so a node whose clock
// is off counts into the wrong window near boundaries. Store.Clock returns a
// Clock that follows Redis TIME (one server for every node) instead of the
// local clock.
package redis
