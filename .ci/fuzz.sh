#!/usr/bin/env bash
# Fuzzes the public API and the HTTP middleware (issue 6, scenario 8): each
# fuzz target of chaos/node runs for an equal share of RATELIMIT_FUZZ_SECONDS
# (the total, default 300: five minutes). Exits non-zero when a target fails;
# the failing input is then saved under chaos/node/testdata/fuzz/<target>/,
# where the next `go test ./chaos/node/` replays it.
#
# Go 1.26's fuzz coordinator can fail a target with a bare "context deadline
# exceeded" at the -fuzztime boundary when a worker is slow to stop on a
# loaded machine (go.dev/issue/75804, fixed in Go 1.27). Such a run wrote no
# failing input; it counts as passed once a replay of the whole corpus passes.
set -euo pipefail
cd "$(dirname "$0")/.."

pkg=./chaos/node/
corpus=chaos/node/testdata/fuzz
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

inputs() { if [[ -d $corpus/$1 ]]; then find "$corpus/$1" -type f | sort; fi; }

log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
for target in "${targets[@]}"; do
	printf '== fuzzing %s for %ss\n' "$target" "$each"
	before=$(inputs "$target")
	# Minimizing each new input may take up to 60 s by default, during which
	# nothing new is explored (the log shows 0 execs/sec); 5 s is plenty for
	# inputs this small and leaves the time to fuzzing.
	if go test -run '^$' -fuzz "^${target}\$" -fuzztime "${each}s" -fuzzminimizetime 5s "$pkg" 2>&1 | tee "$log"; then
		continue
	fi
	if [[ $(inputs "$target") == "$before" ]] && grep -q '^    context deadline exceeded$' "$log" &&
		! grep -qE '^(panic:|    fuzz_test\.go|    Failing input written)' "$log"; then
		echo "== $target: the coordinator's deadline race (go.dev/issue/75804), no failing input; replaying the corpus"
		if go test -count=1 -run "^${target}\$" "$pkg"; then
			continue
		fi
	fi
	echo "== $target failed" >&2
	status=1
done
exit $status
