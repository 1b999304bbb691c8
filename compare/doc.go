// Package compare holds the comparisons of the rate limiter's stores with
// other libraries, kept in a module of their own so that the library's
// go.mod lists none of those libraries.
//
// Its tests and benchmarks put strategy/redis's Take (a synchronous
// token-bucket decision, exactly once per request) side by side with
// github.com/go-redis/redis_rate/v10's Allow (GCRA in one script call) on
// the same Redis: a benchmark with 1 and 16 callers, and a differential test
// that drives both with the same requests and compares their decisions.
// They need a Redis at RATELIMIT_TEST_REDIS_ADDR (skipped when unset, failed
// when RATELIMIT_TEST_REQUIRE_SERVICES=1):
//
//	RATELIMIT_TEST_REDIS_ADDR=127.0.0.1:6379 go test -count=1 ./...
//	RATELIMIT_TEST_REDIS_ADDR=127.0.0.1:6379 go test -run '^$' -bench TakeVsRedisRate -count 6 ./...
package compare
