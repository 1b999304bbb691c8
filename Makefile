# The test command the README and CI run. Tests that need a server read
# RATELIMIT_TEST_REDIS_ADDR and RATELIMIT_TEST_POSTGRES_DSN (and the Redis
# Cluster/Sentinel variables); unset, they skip, unless
# RATELIMIT_TEST_REQUIRE_SERVICES=1 makes a missing server a failure. After
# the tests, one line per package names the variable its skipped tests need.
#
# Expected times on a 2-core machine, with Redis and PostgreSQL set:
#   make test   about 6 min once built (2.8 min with no server set; about
#               12 min more on a fresh clone: it compiles everything with the
#               race detector first);
#   make quick  about 25 s (3 s when the results of unchanged packages are cached);
#   make lint   about 1.5 min the first time (staticcheck builds its analysis
#               data), 5 to 15 s after.
GO ?= go

# Nested modules (tools with heavy dependencies, such as the lab's plotting,
# and compare/, which pits the stores against other libraries): each has its
# own go.mod with a replace of the library to this checkout.
NESTED_MODULES := cmd/ratelimit-lab grpclimit examples/grpc examples/otel ratelimitotel compare

# Where strategytest.SkipOrFail records the tests it skipped.
SKIP_LOG := $(CURDIR)/.skipped-tests.log
SKIPPED = bash .ci/skipped.sh $(SKIP_LOG) $(CURDIR)

.PHONY: test test-nested quick lint demo bench fuzz

# The fault-injection suites (chaos/) run after the rest, one package at a
# time: their outages and floods would otherwise starve timing-sensitive
# tests running beside them on a small machine.
test:
	@rm -f $(SKIP_LOG)
	$(GO) vet ./...
	RATELIMIT_TEST_SKIP_LOG=$(SKIP_LOG) $(GO) test -race -count=1 -timeout 15m $$($(GO) list ./... | grep -v /chaos/)
	RATELIMIT_TEST_SKIP_LOG=$(SKIP_LOG) $(GO) test -race -count=1 -timeout 15m -p 1 ./chaos/...
	$(MAKE) --no-print-directory test-nested
	@$(SKIPPED)

test-nested:
	set -e; for m in $(NESTED_MODULES); do \
		(cd $$m && $(GO) vet ./... && $(GO) test -race -count=1 -timeout 15m ./...); \
	done

# The edit-test loop: every package of the library except the fault-injection
# suites, without the race detector, with -short (the README build check
# is left out), and cached results reused.
quick:
	@rm -f $(SKIP_LOG)
	RATELIMIT_TEST_SKIP_LOG=$(SKIP_LOG) $(GO) test -short -timeout 5m $$($(GO) list ./... | grep -v /chaos/)
	@$(SKIPPED)

# gofmt, go vet, staticcheck, go mod tidy in every module, the README's Go
# blocks, and the skip-for-a-missing-server gate: .ci/lint.sh.
lint:
	bash .ci/lint.sh

demo:
	$(GO) run ./examples/cluster

bench:
	$(GO) test -run '^$$' -bench . -benchmem ./...

fuzz:
	$(GO) test -run '^$$' -fuzz FuzzSlidingRate -fuzztime 30s .
