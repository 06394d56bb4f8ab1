#!/bin/sh
# Build and run every GPU test program, then `drc doctor`; print a summary.
# Usage: tests/gpu/run.sh [BUILD_DIR]   (default: ../../build, absolute)
# Each program prints "<name>: N checks, M failed" as its last line; to add one,
# list it in GPU_PROGS in tests/gpu/Makefile: this script runs all of them.
cd "$(dirname "$0")" || exit 1
B=${1:-$(cd ../.. && pwd)/build}
echo "== drc GPU tests, $(date -u '+%Y-%m-%d %H:%M:%S UTC'), $(uname -n)"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | sed 's/^/== GPU: /'
# A newer compiler may warn where this one did not: then build without -Werror, and say so.
make -s B="$B" all || { echo "== build with -Werror FAILED: building with warnings off"; make -s B="$B" WARN=-w all; } ||
    { echo "== build FAILED"; exit 1; }
progs=$(make -s --no-print-directory B="$B" print-progs)   # (not `make -p`: that also runs the default goal, this script)
fail=0
for p in $progs; do
    echo "== $p"
    "$B/gpu/$p"
    rc=$?
    [ "$rc" -eq 0 ] || { fail=$((fail + 1)); echo "== $p FAILED (exit $rc)"; }
done
# issue 5: the ibv_reg_mr interposer on real GPU memory (built by the top Makefile; its own summary)
sh ./engine.sh "$B" || fail=$((fail + 1))
# issue 4: the hooks (wrappers, LD_PRELOAD with static and shared cudart, CUPTI, PyTorch pool)
sh ./hooks.sh "$B" || fail=$((fail + 1))
# issue 10: end to end on cudaMalloc, cudaMallocAsync and VMM memory, bytes moved by loopnic
sh ./e2e.sh "$B" || fail=$((fail + 1))
echo "== drc doctor"
"$B/gpu/drc" doctor
echo "== summary: $(echo $progs | wc -w) programs, $fail failed"
[ "$fail" -eq 0 ]
