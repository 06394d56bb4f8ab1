#!/bin/sh
# The GPU tests of issue 5: the ibv_reg_mr interposer (build/libdrc_verbs.so) on real GPU memory,
# over the loopback provider, the one libibverbs DOUBLE (there is no RDMA NIC on the GPU machine), and the
# consumer-shaped benchmark. Usage: tests/gpu/engine.sh [BUILD_DIR]
# Builds with the top Makefile; jemalloc and uthash come from .deps/ when the machine lacks them.
cd "$(dirname "$0")/../.." || exit 1
B=${1:-$(pwd)/build}
D=$(pwd)/.deps
[ -d "$D" ] && export C_INCLUDE_PATH="$D/include" LIBRARY_PATH="$D/lib"
echo "== drc engine GPU tests, $(date -u '+%Y-%m-%d %H:%M:%S UTC'), $(uname -n)"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | sed 's/^/== GPU: /'
T="$B/libdrc_verbs.so $B/libdrc_host.so.0 $B/engine/engine_child $B/engine/tent_child $B/loopnic/libibverbs.so.1 $B/bench/bench_engine $B/bench/bench_preload_hit"
make -s B="$B" $T >/dev/null 2>&1 || { echo "== build with -Werror FAILED: building with warnings off";
    make -s B="$B" WARN=-w $T; } || { echo "== build FAILED"; exit 1; }
# the double and jemalloc on the library path; libcuda is the real driver
L=${DRC_ENGINE_LIBPATH:-"$B/loopnic${D:+:$D/lib}"}
# ibv_reg_mr on GPU memory: accepted, as the recording double did (the scenarios test drc, not peermem)
export LOOPNIC_PEERMEM=1
P="$B/libdrc_verbs.so"
C="$B/engine/engine_child"
fail=0
run() {
    echo "== $*"
    "$@"
    rc=$?
    [ "$rc" -eq 0 ] || { fail=$((fail + 1)); echo "== FAILED (exit $rc): $*"; }
}
for s in gpu_dedup overlap refcount passthrough host_munmap host_madvise host_jemalloc gpu_free private_dlopen tent; do
    run env LD_LIBRARY_PATH="$L" LD_PRELOAD="$P" "$C" "$s"
done
run env LD_LIBRARY_PATH="$L" LD_PRELOAD="$P" DRC_VERBS_HOST=passthrough "$C" host_passthrough
run env LD_LIBRARY_PATH="$L" LD_PRELOAD="$P" DRC_VERBS=off "$C" verbs_off
run env LD_LIBRARY_PATH="$L" LD_PRELOAD="$P" "$C" widen
run env LD_LIBRARY_PATH="$L" LD_PRELOAD="$P" DRC_VERBS_WIDEN=always "$C" widen
run env LD_LIBRARY_PATH="$L" LD_PRELOAD="$P" "$B/engine/tent_child"
run env LD_LIBRARY_PATH="$L" LD_PRELOAD="$P" DRC_LOG=info "$C" log
echo "== control: gpu_dedup without the preload must fail"
env LD_LIBRARY_PATH="$L" "$C" gpu_dedup
[ $? -eq 1 ] && echo "== control failed as it should" || { fail=$((fail + 1)); echo "== control did NOT fail"; }
run env LD_LIBRARY_PATH="$L" DRC_TEST_BENCH_DOUBLES=1 "$B/bench/bench_engine"
run env LD_LIBRARY_PATH="$L" DRC_TEST_BENCH_DOUBLES=1 "$B/bench/bench_engine" host
# issue 26: the interposer's hit (ibv_reg_mr + ibv_dereg_mr through the preload) on real GPU memory, next to
# drc_get's; bench_gpu_costs (run.sh) has the cache's hit, miss and export costs on the same GPU
run env LD_LIBRARY_PATH="$L" DRC_TEST_BENCH_REAL_CUDA=1 "$B/bench/bench_preload_hit"
echo "== engine summary: $fail failed"
[ "$fail" -eq 0 ]
