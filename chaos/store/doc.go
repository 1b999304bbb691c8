// Package store holds the store-fault scenarios of the rate limiter: a store
// outage, a slow store, lost replies and a store restart that loses its data,
// each run against the memory, Redis and PostgreSQL strategies with three
// nodes (registries) in one process; and Redis topologies the tests start
// and kill themselves on ports 7501-7599 (Cluster failover and resharding,
// Sentinel failover, maxmemory with and without eviction), with Close racing
// traffic. Those need redis-server and redis-cli installed.
//
// The package has no API: it is its tests. Faults on real servers go through
// internal/faultproxy (an in-process TCP proxy), faults on the memory store
// through a wrapping strategy. Redis and PostgreSQL come from
// RATELIMIT_TEST_REDIS_ADDR and RATELIMIT_TEST_POSTGRES_DSN (skipped when
// unset, failed when RATELIMIT_TEST_REQUIRE_SERVICES=1). The scenarios at
// full length (30 s outages, 10 s windows) run with RATELIMIT_TEST_HEAVY=1;
// without it they run shortened. RESULTS.md records the figures they measured.
//
//	RATELIMIT_TEST_HEAVY=1 RATELIMIT_TEST_REDIS_ADDR=127.0.0.1:6379 \
//	RATELIMIT_TEST_POSTGRES_DSN=postgres://postgres@127.0.0.1:5432/test \
//	go test -race -count=1 -v ./chaos/store/
package store
