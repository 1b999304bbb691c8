#!/usr/bin/env bash
# Fuzzes the public API and the HTTP middleware (issue 6, scenario 8): each
# fuzz target of chaos/node runs for an equal share of RATELIMIT_FUZZ_SECONDS
# (the total, default 300: five minutes). Exits non-zero when a target fails;
# the failing input is then saved under chaos/node/testdata/fuzz/<target>/,
# where the next `go test ./chaos/node/` replays it.
set -euo pipefail
cd "$(dirname "$0")/.."

pkg=./chaos/node/
targets=(FuzzAPI FuzzMiddleware)
total=${RATELIMIT_FUZZ_SECONDS:-300}
if ! [[ $total =~ ^[0-9]+$ ]] || ((total < ${#targets[@]})); then
	echo "RATELIMIT_FUZZ_SECONDS=$total: want a whole number of seconds, at least ${#targets[@]}" >&2
	exit 2
fi
each=$((total / ${#targets[@]}))

# Every target in the package must be listed above, or it would never be fuzzed.
listed=$(printf '%s\n' "${targets[@]}" | sort)
found=$(go test -list '^Fuzz' "$pkg" | grep '^Fuzz' | sort)
if [[ $listed != "$found" ]]; then
	printf 'fuzz.sh lists:\n%s\nbut %s has:\n%s\n' "$listed" "$pkg" "$found" >&2
	exit 2
fi

status=0
for target in "${targets[@]}"; do
	printf '== fuzzing %s for %ss\n' "$target" "$each"
	if ! go test -run '^$' -fuzz "^${target}\$" -fuzztime "${each}s" "$pkg"; then
		echo "== $target failed" >&2
		status=1
	fi
done
exit $status
