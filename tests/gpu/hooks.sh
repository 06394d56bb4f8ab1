#!/bin/sh
# The GPU tests of issue 4 (invalidation from the allocator). Usage: tests/gpu/hooks.sh [BUILD_DIR]
# Builds build/libdrc_hook.so at the top and the programs of hooks.mk, then runs the hazard
# with every way of getting invalidation, the no-hook control, and the PyTorch pool.
# libdrc_hook.so is a name of libdrc_preload.so, which brings libdrc_host and so jemalloc:
# where the machine lacks it, .deps/ (see RESULTS.md) provides it at build and run time.
cd "$(dirname "$0")" || exit 1
B=${1:-$(cd ../.. && pwd)/build}
O=$B/gpu
D=$(cd ../.. && pwd)/.deps
if [ -d "$D" ]; then
    export C_INCLUDE_PATH="$D/include" LIBRARY_PATH="$D/lib" LD_LIBRARY_PATH="$D/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
echo "== drc hook GPU tests, $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
make -s -C ../.. "$B/libdrc_hook.so" "$B/libdrc_verbs.so" "$B/O0/libdrc_hook.so" B="$B" >/dev/null ||
    { echo "== libdrc_hook.so build FAILED"; exit 1; }
make -s B="$B" hooks || { echo "== build FAILED"; exit 1; }
H=$B/libdrc_hook.so
fail=0
run() {
    echo "== $*"
    "$@"
    rc=$?
    [ "$rc" -eq 0 ] || { fail=$((fail + 1)); echo "== FAILED (exit $rc): $*"; }
}
run "$O/test_hooks_gpu_static" wrappers
run "$O/test_hooks_gpu_static" control
run env LD_PRELOAD="$H" "$O/test_hooks_gpu_static" hooked
run env LD_PRELOAD="$H" "$O/test_hooks_gpu_shared" hooked
# the preload built at -O0 without sibling calls, and both old names preloaded at once
run env LD_PRELOAD="$B/O0/libdrc_hook.so" "$O/test_hooks_gpu_static" hooked
run env LD_PRELOAD="$H:$B/libdrc_verbs.so" "$O/test_hooks_gpu_shared" hooked
run env LD_PRELOAD="$H" DRC_MONITOR=cupti DRC_HOOK_DEBUG=1 "$O/test_hooks_gpu_static" hooked
run env LD_PRELOAD="$H" DRC_MONITOR=cupti DRC_HOOK_DEBUG=1 "$O/test_hooks_gpu_shared" hooked
run "$O/test_hooks_gpu_static" cost
run env LD_PRELOAD="$H" "$O/test_hooks_gpu_static" cost
run "$O/bench_notify"
run env DRC_LIB="$O/libdrc_torch.so" PYTHONUNBUFFERED=1 python3 test_torch_gpu.py
# issue 13: two GPUs (each says SKIP with fewer): the runtime API, and PyTorch through the drc pool and
# through the default allocator with the hook (DRC_LIB: the libdrc.so the preload links, one drc in the process)
run "$O/test_multi_rt_gpu" wrappers
run "$O/test_multi_rt_gpu" control
run env LD_PRELOAD="$H" "$O/test_multi_rt_gpu" hooked
run env DRC_LIB="$O/libdrc_torch.so" PYTHONUNBUFFERED=1 python3 test_torch_multi_gpu.py pool
run env DRC_LIB="$O/libdrc_torch.so" PYTHONUNBUFFERED=1 python3 test_torch_multi_gpu.py control
run env LD_PRELOAD="$H" DRC_LIB="$B/libdrc.so" PYTHONUNBUFFERED=1 python3 test_torch_multi_gpu.py hooked
run env LD_PRELOAD="$H" DRC_LIB="$B/libdrc.so" PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True PYTHONUNBUFFERED=1 \
    python3 test_torch_multi_gpu.py hooked
echo "== hooks summary: $fail failed"
[ "$fail" -eq 0 ]
