#!/usr/bin/env bash
# Reproduces the lab figures of docs/benchmarks.md. Run from the repository
# root with Redis on 127.0.0.1:6379 and PostgreSQL on
# postgres://postgres@127.0.0.1:5432/test (the lab's defaults). The simulated
# runs (-clock sim) give the same figures on any machine; the wall-clock ones
# (throughput) depend on the machine and on whatever else runs on it.
set -euo pipefail
D=docs/benchmarks
LAB="go run ./cmd/ratelimit-lab"

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
