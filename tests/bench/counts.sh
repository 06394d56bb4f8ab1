#!/bin/sh
# Instructions and L2 misses per operation, drc and UCX, under callgrind's cache model:
# bench_misses (65,536 regions, bench_cache's workload, 64 KiB-aligned) run per cache and per order
# of the free events under `valgrind --tool=callgrind --cache-sim=yes`, the inclusive cost of each
# operation divided by how many ran. "free event + deferred" is op_free plus op_drain's cost spread
# over the events before it (UCX deregisters what its events invalidated in that get).
# L1 and L2 default to 48 KiB 12-way and 2.5 MiB 10-way; D1=... LL=... in the environment change
# them (valgrind's --D1/--LL syntax); ORDERS="random address" by default.
# A second UCX (make bench-counts UCX_PREFIX=...): bench_misses_ucx, bench_misses built against it,
# counted as a third pair of columns named NAME.
# Usage: tests/bench/counts.sh [BUILD_DIR [BENCH_MISSES_UCX NAME]]   (make bench-counts). Counts, not
# times: they do not move with the machine's load. A markdown table.
set -eu
B=${1:-build}
UCX2=${2:-}
UCX2_NAME=${3:-second UCX}
D1=${D1:-49152,12,64}
LL=${LL:-2621440,10,64}
ORDERS=${ORDERS:-random address}
command -v valgrind >/dev/null || { echo "counts.sh: valgrind is not installed" >&2; exit 2; }
UCX_NAME="UCX $(pkg-config --modversion ucx 2>/dev/null || echo '(system)')"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
caches="drc ucx${UCX2:+ ucx2}"
for order in $ORDERS; do
    for cache in $caches; do
        out="$tmp/$cache.$order"
        bin="$B/bench/bench_misses" arg=$cache
        [ "$cache" != ucx2 ] || bin=$UCX2 arg=ucx
        valgrind --tool=callgrind --cache-sim=yes --D1="$D1" --LL="$LL" \
            --callgrind-out-file="$out.out" "$bin" "$arg" 65536 "$order" >"$out.txt" 2>"$out.err" ||
            { cat "$out.err" >&2; exit 1; }
        ops=$(sed -n 's/.*: \([0-9]*\) of each operation.*/\1/p' "$out.txt")
        drains=$(sed -n 's/.*(op_drain \([0-9]*\),.*/\1/p' "$out.txt")
        refills=$(sed -n 's/.*op_refill \([0-9]*\),.*/\1/p' "$out.txt")
        agains=$(sed -n 's/.*op_again \([0-9]*\)).*/\1/p' "$out.txt")
        # one line per operation: instructions and L2 misses per operation, tab-separated
        callgrind_annotate --inclusive=yes --threshold=100 --show=Ir,DLmr,DLmw "$out.out" 2>/dev/null |
            awk -v order="$order" -v ops="$ops" -v drains="$drains" -v refills="$refills" -v agains="$agains" '
                !/=>/ && /bench_misses.c:op_[a-z]* / {
                    line = $0; gsub(/\([^)]*\)/, "", line); gsub(/,/, "", line); split(line, f, " ")
                    name = f[4]; sub(/.*:op_/, "", name); sub(/ .*/, "", name)
                    if (!(name in ir)) { ir[name] = f[1]; lm[name] = f[2] + f[3] }
                }
                function row(what, i, m) { printf "%s\t%.0f\t%.1f\n", what, i, m }
                END {
                    if (order == "random") {
                        row("hit, interior slice", ir["hit"] / ops, lm["hit"] / ops)
                        row("invalidate, by handle", ir["invalidate"] / ops, lm["invalidate"] / ops)
                        row("miss (register again)", ir["miss"] / ops, lm["miss"] / ops)
                        row("miss, repopulating in address order", ir["again"] / agains, lm["again"] / agains)
                        row("invalidate, by range", ir["range"] / ops, lm["range"] / ops)
                    }
                    row("free event, " order " order", ir["free"] / ops, lm["free"] / ops)
                    row("free event + deferred, " order " order", (ir["free"] + ir["drain"]) / ops,
                        (lm["free"] + lm["drain"]) / ops)
                }' >>"$tmp/$cache.rows"
    done
done
echo "callgrind cache model: D1 $D1, LL (L2) $LL; per operation, inclusive; 65,536 regions"
echo
head="| per operation | drc instructions | drc L2 misses | $UCX_NAME instructions | $UCX_NAME L2 misses |"
rule="|---|---:|---:|---:|---:|"
[ -z "$UCX2" ] || head="$head $UCX2_NAME instructions | $UCX2_NAME L2 misses |" rule="$rule---:|---:|"
echo "$head"
echo "$rule"
# the caches' rows side by side (the same operations in the same order in each file)
set -- "$tmp/drc.rows" "$tmp/ucx.rows"
[ -z "$UCX2" ] || set -- "$@" "$tmp/ucx2.rows"
paste "$@" | awk -F '\t' '{
    printf "| %s |", $1
    for (i = 1; i <= NF; i += 3) printf " %s | %s |", $(i + 1), $(i + 2)
    printf "\n" }'
