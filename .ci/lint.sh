#!/usr/bin/env bash
# Lint gates, run by .ci/run and by `make lint`. Fails on:
#   - gofmt -l output anywhere in the repository;
#   - go vet or staticcheck (default checks, staticcheck.conf) findings, in
#     every module (the library and the nested ones: each go.mod below the root);
#   - a go mod tidy diff in any module;
#   - a Go block in README.md that does not build, and a test skipping for a
#     missing server without strategytest.SkipOrFail (internal/repotest).
# staticcheck is installed at the pinned version when missing.
set -euo pipefail
cd "$(dirname "$0")/.."

STATICCHECK_VERSION=v0.8.2

log() { printf '== %s\n' "$*"; }
status=0
fail() {
	printf 'lint: %s\n' "$*" >&2
	status=1
}

staticcheck=$(go env GOPATH)/bin/staticcheck
if ! "$staticcheck" -version 2>/dev/null | grep -q "(${STATICCHECK_VERSION#v})"; then
	log "installing staticcheck $STATICCHECK_VERSION"
	GOFLAGS= go install "honnef.co/go/tools/cmd/staticcheck@$STATICCHECK_VERSION"
fi

mapfile -t modules < <(find . -name go.mod -not -path './.git/*' -not -path '*/testdata/*' -printf '%h\n' | sort)

log "gofmt"
unformatted=$(gofmt -l $(git ls-files --cached --others --exclude-standard '*.go'))
if [[ -n $unformatted ]]; then
	fail "not gofmt-ed (run gofmt -w):"$'\n'"$unformatted"
fi

for m in "${modules[@]}"; do
	log "module $m: go mod tidy, go vet, staticcheck"
	if ! (cd "$m" && go mod tidy -diff); then
		fail "$m: go.mod or go.sum is not tidy (run go mod tidy in $m)"
	fi
	(cd "$m" && go vet ./...) || fail "$m: go vet"
	(cd "$m" && "$staticcheck" ./...) || fail "$m: staticcheck"
done

log "README Go blocks build; skips for a missing server fail under RATELIMIT_TEST_REQUIRE_SERVICES"
go test -count=1 ./internal/repotest/ || fail "internal/repotest"

exit $status
