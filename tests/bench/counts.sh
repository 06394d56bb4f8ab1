#!/bin/sh
# Instructions and L2 misses per operation, drc and UCX, under callgrind's cache model (issue 12):
# bench_misses (65,536 regions, bench_cache's workload) run once per cache under
# `valgrind --tool=callgrind --cache-sim=yes`, the inclusive cost of each operation divided by
# how many ran. L1 and L2 default to the development machine of 2026-12-04 (48 KiB 12-way,
# 2.5 MiB 10-way); D1=... LL=... in the environment change them (valgrind's --D1/--LL syntax).
# Usage: tests/bench/counts.sh [BUILD_DIR]   (make bench-counts). Counts, not times: they do not
# move with the machine's load.
set -eu
B=${1:-build}
D1=${D1:-49152,12,64}
LL=${LL:-2621440,10,64}
command -v valgrind >/dev/null || { echo "counts.sh: valgrind is not installed" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "callgrind cache model: D1 $D1, LL (L2) $LL; per operation, inclusive"
printf '%-6s %-14s %12s %10s\n' cache operation instructions "L2 misses"
for cache in drc ucx; do
    valgrind --tool=callgrind --cache-sim=yes --D1="$D1" --LL="$LL" \
        --callgrind-out-file="$tmp/$cache.out" "$B/bench/bench_misses" "$cache" >"$tmp/$cache.txt" 2>"$tmp/$cache.err" ||
        { cat "$tmp/$cache.err" >&2; exit 1; }
    ops=$(sed -n 's/.*: \([0-9]*\) of each operation.*/\1/p' "$tmp/$cache.txt")
    callgrind_annotate --inclusive=yes --threshold=100 --show=Ir,DLmr,DLmw "$tmp/$cache.out" 2>/dev/null |
        awk -v cache="$cache" -v ops="$ops" '
            !/=>/ && /bench_misses.c:op_(hit|invalidate|miss) / {
                line = $0; gsub(/\([^)]*\)/, "", line); gsub(/,/, "", line); split(line, f, " ")
                name = f[4]; sub(/.*:op_/, "", name); sub(/ .*/, "", name)
                if (!(name in seen)) {
                    seen[name] = 1
                    printf "%-6s %-14s %12.0f %10.1f\n", cache, name, f[1] / ops, (f[2] + f[3]) / ops
                }
            }'
done
