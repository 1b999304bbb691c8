# The test command the README and CI run. Tests that need a server read
# RATELIMIT_TEST_REDIS_ADDR and RATELIMIT_TEST_POSTGRES_DSN (and the Redis
# Cluster/Sentinel variables); unset, they skip, unless
# RATELIMIT_TEST_REQUIRE_SERVICES=1 makes a missing server a failure.
GO ?= go

.PHONY: test demo bench fuzz

# The fault-injection suites (chaos/) run after the rest, one package at a
# time: their outages and floods would otherwise starve timing-sensitive
# tests running beside them on a small machine.
test:
	$(GO) vet ./...
	$(GO) test -race -count=1 -timeout 15m $$($(GO) list ./... | grep -v /chaos/)
	$(GO) test -race -count=1 -timeout 15m -p 1 ./chaos/...

demo:
	$(GO) run ./examples/cluster

bench:
	$(GO) test -run '^$$' -bench . -benchmem ./...

fuzz:
	$(GO) test -run '^$$' -fuzz FuzzSlidingRate -fuzztime 30s .
