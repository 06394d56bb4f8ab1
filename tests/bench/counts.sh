#!/bin/sh
# Instructions and L2 misses per operation, drc and UCX, under callgrind's cache model:
# bench_misses (65,536 regions, bench_cache's workload, 64 KiB-aligned) run per cache and per order
# of the free events under `valgrind --tool=callgrind --cache-sim=yes`, the inclusive cost of each
# operation divided by how many ran. "free event + deferred" is op_free plus op_drain's cost spread
# over the events before it (UCX deregisters what its events invalidated in that get).
# L1 and L2 default to 48 KiB 12-way and 2.5 MiB 10-way; D1=... LL=... in the environment change
# them (valgrind's --D1/--LL syntax); ORDERS="random address" by default.
# Usage: tests/bench/counts.sh [BUILD_DIR]   (make bench-counts). Counts, not times: they do not
# move with the machine's load.
set -eu
B=${1:-build}
D1=${D1:-49152,12,64}
LL=${LL:-2621440,10,64}
ORDERS=${ORDERS:-random address}
command -v valgrind >/dev/null || { echo "counts.sh: valgrind is not installed" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "callgrind cache model: D1 $D1, LL (L2) $LL; per operation, inclusive; 65,536 regions"
printf '%-6s %-8s %-22s %12s %10s\n' cache order operation instructions "L2 misses"
for order in $ORDERS; do
    for cache in drc ucx; do
        out="$tmp/$cache.$order"
        valgrind --tool=callgrind --cache-sim=yes --D1="$D1" --LL="$LL" \
            --callgrind-out-file="$out.out" "$B/bench/bench_misses" "$cache" 65536 "$order" >"$out.txt" 2>"$out.err" ||
            { cat "$out.err" >&2; exit 1; }
        ops=$(sed -n 's/.*: \([0-9]*\) of each operation.*/\1/p' "$out.txt")
        drains=$(sed -n 's/.*(op_drain \([0-9]*\),.*/\1/p' "$out.txt")
        refills=$(sed -n 's/.*op_refill \([0-9]*\)).*/\1/p' "$out.txt")
        callgrind_annotate --inclusive=yes --threshold=100 --show=Ir,DLmr,DLmw "$out.out" 2>/dev/null |
            awk -v cache="$cache" -v order="$order" -v ops="$ops" -v drains="$drains" -v refills="$refills" '
                !/=>/ && /bench_misses.c:op_[a-z]* / {
                    line = $0; gsub(/\([^)]*\)/, "", line); gsub(/,/, "", line); split(line, f, " ")
                    name = f[4]; sub(/.*:op_/, "", name); sub(/ .*/, "", name)
                    if (!(name in ir)) { ir[name] = f[1]; lm[name] = f[2] + f[3] }
                }
                function row(what, i, m) { printf "%-6s %-8s %-22s %12.0f %10.1f\n", cache, order, what, i, m }
                END {
                    if (order == "random") {
                        row("hit, interior slice", ir["hit"] / ops, lm["hit"] / ops)
                        row("invalidate, by handle", ir["invalidate"] / ops, lm["invalidate"] / ops)
                        row("miss (register again)", ir["miss"] / ops, lm["miss"] / ops)
                        row("invalidate, by range", ir["range"] / ops, lm["range"] / ops)
                    }
                    row("free event", ir["free"] / ops, lm["free"] / ops)
                    row("free event + deferred", (ir["free"] + ir["drain"]) / ops, (lm["free"] + lm["drain"]) / ops)
                }'
    done
done
