// Package repotest holds the repository's own checks, which CI runs as gates
// (see .ci/lint.sh): every Go block in README.md builds, and no test skips
// for a missing server without going through strategytest.SkipOrFail, which
// fails instead under RATELIMIT_TEST_REQUIRE_SERVICES=1. It has no code of
// its own; nothing imports it.
package repotest
