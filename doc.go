// Package ratelimit is an eventually-consistent, distributed sliding-window
// rate limiter: a Go port of Kong's rate-limiting library, for services that
// run many nodes and must enforce the same limits on all of them, fast.
//
// Each node counts hits in memory, in a sharded lock-free table (package
// shm), and a background loop pushes the node's diffs to a central store
// (package strategy: in-process memory, Redis or PostgreSQL) and learns the
// cluster-wide totals back, in one round trip per cycle. Checks never wait
// for the network.
//
// A counter is identified by (namespace, key, window size, window start),
// with windows aligned on the Unix epoch so every node agrees on them. The
// sliding rate at t blends the current window with the previous one:
//
//	rate = current + previous * (size - t mod size) / size
//
// Config.SyncRate selects the mode: > 0 syncs every SyncRate in the
// background; 0 writes every Increment through to the store (and answers from
// local state, flagged with ErrStoreUnavailable, when the store fails); < 0
// keeps counters local to the node.
//
// Unlike Kong, a failed push loses no hit (the diffs are kept and pushed
// later), a push whose reply was lost is re-sent under the same batch ID so it
// is never applied twice, a node fetches only the keys it has seen, memory is
// capped (MaxKeys, with eviction that keeps unsynced hits), and Close flushes.
package ratelimit
