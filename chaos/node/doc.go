// Package node holds the single-node fault scenarios, as tests:
// clock skew, a crashing node, a key flood, bad input (fuzz targets) and
// goroutine leaks around Close. The store-side scenarios (outages, slow
// stores, lost replies, data loss) live in chaos/store.
//
// Heavy runs (the full-length scenarios) need RATELIMIT_TEST_HEAVY=1; without
// it every scenario runs scaled down. Tests against Redis read
// RATELIMIT_TEST_REDIS_ADDR and skip (or fail, with
// RATELIMIT_TEST_REQUIRE_SERVICES=1) when it is unset. RESULTS.md records the
// figures the scenarios measured and the commands that produced them.
package node
