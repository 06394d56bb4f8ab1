#!/bin/sh
# Which rcache API the UCX headers under INCLUDE_DIR have (tests/bench/pair.h): prints the
# -DBENCH_UCX_*=1 flags for the Makefile, each found by compiling a line that only that API
# accepts (nothing is linked or run). No flag: UCX 1.13's API.
# Usage: tests/bench/ucx_api.sh CC [INCLUDE_DIR]
CC=${1:-cc}
INC=${2:+-isystem $2}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
probe() {   # probe NAME BODY
    printf '#include <stddef.h>\n#include <ucs/memory/rcache.h>\nvoid f(ucs_rcache_t *rc, ucs_rcache_region_t *r);\nvoid f(ucs_rcache_t *rc, ucs_rcache_region_t *r) { %s }\n' "$2" >"$tmp/p.c"
    $CC $INC -Werror -fsyntax-only "$tmp/p.c" 2>/dev/null && printf ' -D%s=1' "$1"
}
probe BENCH_UCX_GET_ALIGN 'ucs_rcache_get(rc, NULL, 0, 4096, 0, NULL, &r);'
probe BENCH_UCX_INV_COMP 'ucs_rcache_comp_entry_t e; ucs_rcache_region_invalidate(rc, r, &e);'
probe BENCH_UCX_MERGE_OP 'ucs_rcache_ops_t o = { .merge = NULL }; (void)o; (void)rc; (void)r;'
echo
