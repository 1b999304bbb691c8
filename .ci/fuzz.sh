#!/usr/bin/env bash
# Fuzzes the public API and the HTTP middleware: each
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

log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0

# fuzz PKG TARGET SECONDS CORPUS: one target; sets status=1 when it fails.
fuzz() {
	local pkg=$1 target=$2 secs=$3 corpus=$4 before
	printf '== fuzzing %s %s for %ss\n' "$pkg" "$target" "$secs"
	before=$(find "$corpus/$target" -type f 2>/dev/null | sort || true)
	# Minimizing each new input may take up to 60 s by default, during which
	# nothing new is explored (the log shows 0 execs/sec); 5 s is plenty for
	# inputs this small and leaves the time to fuzzing.
	if go test -run '^$' -fuzz "^${target}\$" -fuzztime "${secs}s" -fuzzminimizetime 5s "$pkg" 2>&1 | tee "$log"; then
		return
	fi
	if [[ $(find "$corpus/$target" -type f 2>/dev/null | sort || true) == "$before" ]] && grep -q '^    context deadline exceeded$' "$log" &&
		! grep -qE '^(panic:|    [a-z_]+_test\.go|    Failing input written)' "$log"; then
		echo "== $target: the coordinator's deadline race (go.dev/issue/75804), no failing input; replaying the corpus"
		if go test -count=1 -run "^${target}\$" "$pkg"; then
			return
		fi
	fi
	echo "== $target failed" >&2
	status=1
}

for target in "${targets[@]}"; do
	fuzz "$pkg" "$target" "$each" "$corpus"
done
# The parsers that take input from outside: the policy document and the
# Forwarded header behind trusted proxies, 30 s each.
fuzz ./policy FuzzParse 30 policy/testdata/fuzz
fuzz ./httplimit FuzzForwardedProxyDecides 30 httplimit/testdata/fuzz
exit $status
