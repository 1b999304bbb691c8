#!/usr/bin/env bash
# Times the hot-key benchmarks of two commits in turns on this machine and
# prints, per benchmark, each build's median and the median of the per-round
# ratios (second build ÷ first) with a 95% confidence interval for it.
#
#   bash docs/benchmarks/hotpath-turns.sh [ANCHOR [ROUNDS]]
#
# ANCHOR defaults to a962b2a, the build that ran a hot two-limit Allow in
# 81.1 ns (and 80.8 ns in a second series) on an AMD EPYC VM whose
# map-plus-atomic baseline took 28.4 ns, the speed of the VM the 80 ns goal
# was set on. The second build is the work tree's HEAD. A machine's speed
# moves the nanoseconds of both builds alike, so the ratio carries the
# anchor's time over to this machine's HEAD: HEAD's time on the goal's VM is
# about 81.1 ns times the ratio (see docs/hotpath.md, "Measured on a slow
# VM").
#
# Each round runs both builds, pinned to one core, in an order that
# alternates from round to round (so neither always runs on a warmer or a
# quieter machine). The interval is distribution-free: the order statistics
# of the per-round ratios that bound the median with 95% confidence
# (binomial, normal approximation), so no round's outlier moves it.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)" # the root package holds the benchmarks
ANCHOR=${1:-a962b2a}
ROUNDS=${2:-30}
BENCH=${BENCH:-'BenchmarkIncrement/baseline/hot/serial$|BenchmarkAllow/(allow1-async|allow2-async)/hot/serial$'}
BENCHTIME=${BENCHTIME:-300ms}
CPU=${CPU:-1}
RAW=${RAW:-} # a file to keep each round's figures in (round, build, benchmark, ns/op)

dir=$(mktemp -d)
trap 'git worktree remove --force "$dir/anchor" >/dev/null 2>&1 || true; rm -rf "$dir"' EXIT
git worktree add -q --detach "$dir/anchor" "$ANCHOR"
(cd "$dir/anchor" && go test -c -o "$dir/anchor.test" .)
go test -c -o "$dir/head.test" .

for r in $(seq 1 "$ROUNDS"); do
	order="anchor head"
	if ((r % 2 == 0)); then order="head anchor"; fi
	for b in $order; do
		taskset -c "$CPU" "$dir/$b.test" -test.run '^$' -test.benchtime "$BENCHTIME" -test.bench "$BENCH" |
			awk -v r="$r" -v b="$b" '/ns\/op/ { for (i = 2; i <= NF; i++) if ($i == "ns/op") print r, b, $1, $(i-1) }'
	done
done >"$dir/rounds.txt"
if [ -n "$RAW" ]; then cp "$dir/rounds.txt" "$RAW"; fi

sort -k3,3 -k1,1n "$dir/rounds.txt" | awk '
function median(a, n,   i, j, t) {
	for (i = 2; i <= n; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] > t; j--) a[j+1] = a[j]; a[j+1] = t }
	return n % 2 ? a[(n+1)/2] : (a[n/2] + a[n/2+1]) / 2
}
function report(   n, i, k, ra, an, hd) {
	n = 0
	for (i in anchor) if (i in head) { n++; ra[n] = head[i] / anchor[i]; an[n] = anchor[i]; hd[n] = head[i] }
	if (n == 0) return
	printf "%s (%d rounds)\n  anchor %.1f ns, head %.1f ns\n", name, n, median(an, n), median(hd, n)
	m = median(ra, n) # sorts ra
	k = int(n / 2 - 0.98 * sqrt(n)); if (k < 1) k = 1
	below = 0; for (i = 1; i <= n; i++) if (ra[i] < 1) below++
	printf "  head / anchor: %.3f (95%% CI %.3f-%.3f; %d of %d rounds below 1)\n", m, ra[k], ra[n-k+1], below, n
}
$3 != name { report(); delete anchor; delete head; name = $3 }
$2 == "anchor" { anchor[$1] = $4 }
$2 == "head" { head[$1] = $4 }
END { report() }'
