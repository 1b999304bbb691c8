#!/usr/bin/env bash
# Reproduces the lab figures of docs/benchmarks.md. Run from the repository
# root with Redis on 127.0.0.1:6379 and PostgreSQL on
# postgres://postgres@127.0.0.1:5432/test (the lab's defaults). The simulated
# runs (-clock sim) give the same figures on any machine; the wall-clock ones
# (throughput) depend on the machine and on whatever else runs on it.
set -euo pipefail
D=docs/benchmarks
# The lab is its own module (cmd/ratelimit-lab/go.mod): build it once.
LAB="$(mktemp -d)/ratelimit-lab"
go -C cmd/ratelimit-lab build -o "$LAB" .

# Over-admission vs SyncRate: Redis (2, 4, 8 nodes) and memory (1 to 16 nodes).
$LAB -strategy redis -clock sim -limit 1000/1m -load 2 -keys 10 -duration 5m \
	-sweep-nodes 2,4,8 -sweep-sync 10ms,30ms,100ms,300ms,1s,3s,10s -out $D/sweep-redis
$LAB -clock sim -limit 1000/1m -load 2 -keys 10 -duration 5m \
	-sweep-nodes 1,2,4,8,16 -sweep-sync 10ms,30ms,100ms,300ms,1s,3s,10s -out $D/sweep-memory

# False rejections at 90% of the limit, perfectly even; then Poisson arrivals
# on 4 nodes and on 1 node (the approximation's own error, without syncing).
$LAB -strategy redis -clock sim -nodes 4 -sync-rate 100ms -limit 100/1s -load 0.9 -keys 200 -duration 5m -out $D/even90-redis
$LAB -clock sim -nodes 4 -sync-rate 100ms -limit 100/1s -load 0.9 -keys 200 -duration 5m -arrival poisson -out $D/poisson90-4nodes
$LAB -clock sim -nodes 1 -sync-rate 100ms -limit 100/1s -load 0.9 -keys 200 -duration 5m -arrival poisson -out $D/poisson90-1node

# Admitted per window over time, at twice the limit, SyncRate 1 s.
$LAB -strategy redis -clock sim -nodes 4 -sync-rate 1s -limit 100/1s -load 2 -keys 10 -duration 60s -out $D/overload-redis

# The same on the wall clock (real sync loops, real Redis timing).
$LAB -strategy redis -nodes 4 -sync-rate 100ms -limit 100/1s -load 2 -keys 100 -duration 20s -warmup 2s -out $D/wall-redis

# Throughput and latency, unpaced, one node, 100,000 keys.
$LAB -throughput-suite -nodes 1 -keys 100000 -duration 10s -sync-timeout 5s -max-records 2000000 -out $D/throughput

# Heap per tracked key, 1M keys, windows 1 s and 1 min.
$LAB -memkeys 1000000 -limit 100/1s -limit 1000/1m -out $D/memory

# Every algorithm: the SyncRate sweep for the sliding window and the token bucket.
$LAB -clock sim -limit 100/1s -load 2 -keys 10 -duration 20s \
	-sweep-nodes 4 -sweep-sync 10ms,100ms,1s -sweep-algorithms sliding_window,token_bucket -out $D/sweep-algorithms
rm -f $D/sweep-algorithms/sweep.json

# The fleet (§8): 1M keys on a Redis of its own (not the shared 6379), 2 to 16 nodes.
# redis-server --daemonize yes --bind 127.0.0.1 --port 6392 --save "" --appendonly no
$LAB -fleet -strategy redis -redis-addr 127.0.0.1:6392 -fleet-nodes 2,4,8,16 \
	-fleet-rate 5000 -duration 60s -warmup 5s -out $D/fleet
