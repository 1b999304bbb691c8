#!/usr/bin/env bash
# Usage: skipped.sh LOG ROOT
# Prints one line per package whose tests skipped for a missing server, from
# the log strategytest.SkipOrFail appends to when RATELIMIT_TEST_SKIP_LOG is
# set (one "<package dir>\t<variable>" line per skipped test). Prints nothing
# when no test skipped.
set -euo pipefail
log=$1
root=${2%/}/
[[ -s $log ]] || exit 0
echo "Tests skipped for a missing server (set the variable to run them; README.md, Testing):"
awk -F'\t' -v root="$root" '
{
	pkg = $1 "/"
	if (index(pkg, root) == 1) pkg = substr(pkg, length(root) + 1)
	pkg = "./" pkg
	sub(/\/$/, "", pkg)
	n[pkg]++
	if (!((pkg, $2) in seen)) {
		seen[pkg, $2] = 1
		vars[pkg] = vars[pkg] (vars[pkg] == "" ? "" : ", ") $2
	}
}
END { for (p in n) printf "  %-22s %4d skipped: set %s\n", p, n[p], vars[p] }' "$log" | sort
