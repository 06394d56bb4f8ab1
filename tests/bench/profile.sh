#!/bin/sh
# Where drc's invalidation goes, by function and by part (tree, hint table, thread slots, LRU and
# pool, lock, stats, notify): bench_misses at 65,536 regions under callgrind with its cache model,
# collecting inside one operation only, and tests/bench/profile.py to split it. Operations:
# free (a free event over an idle region, drc_notify_free) in random and in address order, range
# (drc_invalidate of a held region's range, get and put included) and handle (drc_region_invalidate,
# get and put included), both in random order. D1=, LL= as counts.sh; OPS="free-random ..." picks.
# Usage: tests/bench/profile.sh [BUILD_DIR]   (make bench-profile). Counts, not times.
set -eu
B=${1:-build}
D1=${D1:-49152,12,64}
LL=${LL:-2621440,10,64}
OPS=${OPS:-free-random free-address range-random handle-random}
command -v valgrind >/dev/null || { echo "profile.sh: valgrind is not installed" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for op in $OPS; do
    fn=op_${op%-*}
    [ "$fn" = op_handle ] && fn=op_invalidate
    order=${op#*-}
    valgrind --tool=callgrind --cache-sim=yes --D1="$D1" --LL="$LL" --toggle-collect="$fn" \
        --compress-strings=no --compress-pos=no --callgrind-out-file="$tmp/$op.out" \
        "$B/bench/bench_misses" drc 65536 "$order" >"$tmp/$op.txt" 2>"$tmp/$op.err" || { cat "$tmp/$op.err" >&2; exit 1; }
    ops=$(sed -n 's/.*: \([0-9]*\) of each operation.*/\1/p' "$tmp/$op.txt")
    echo "== drc, $fn, 65,536 regions, $order order ($ops operations; D1 $D1, LL $LL)"
    python3 "$(dirname "$0")/profile.py" "$tmp/$op.out" "$ops" .
    echo
done
