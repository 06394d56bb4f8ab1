#!/bin/sh
# The end-to-end suite on the GPU machine (issue 10): drc's verbs cache on cudaMalloc, cudaMallocAsync
# and VMM memory (e2e_gpu), then on PyTorch tensors (test_torch_e2e_gpu.py: the drc pool, the default
# allocator under the hook in its three segment kinds, and the control), moved by the loopback provider
# with cuMemcpy (no RDMA NIC there).
# Usage: tests/gpu/e2e.sh [BUILD_DIR]. Builds build/loopnic/libibverbs.so.1 at the top and e2e_gpu here.
cd "$(dirname "$0")" || exit 1
B=${1:-$(cd ../.. && pwd)/build}
D=$(cd ../.. && pwd)/.deps
if [ -d "$D" ]; then   # jemalloc and uthash where the machine lacks them (RESULTS.md)
    export C_INCLUDE_PATH="$D/include" LIBRARY_PATH="$D/lib" LD_LIBRARY_PATH="$D/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
echo "== drc e2e GPU tests, $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
make -s -C ../.. "$B/loopnic/libibverbs.so.1" B="$B" >/dev/null || { echo "== loopnic build FAILED"; exit 1; }
make -s B="$B" e2e || { echo "== build FAILED"; exit 1; }
LN="$B/loopnic${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fail=0
run() {
    echo "== $*"
    env LD_LIBRARY_PATH="$LN" PYTHONUNBUFFERED=1 E2E_EXPECT_LOOPNIC=1 "$@"
    rc=$?
    [ "$rc" -eq 0 ] || { fail=$((fail + 1)); echo "== FAILED (exit $rc): $*"; }
}
run "$B/gpu/e2e_gpu"
if python3 -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
    if make -s -C ../.. "$B/libdrc_hook.so" B="$B" >/dev/null && make -s B="$B" torch-e2e; then
        run env DRC_LIB="$B/gpu/libdrc_torch.so" python3 test_torch_e2e_gpu.py pool
        run env LD_PRELOAD="$B/libdrc_hook.so" DRC_LIB="$B/libdrc.so" python3 test_torch_e2e_gpu.py hooked
        run env LD_PRELOAD="$B/libdrc_hook.so" DRC_LIB="$B/libdrc.so" PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True \
            python3 test_torch_e2e_gpu.py hooked
        run env LD_PRELOAD="$B/libdrc_hook.so" DRC_LIB="$B/libdrc.so" PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync \
            python3 test_torch_e2e_gpu.py hooked
        run env DRC_LIB="$B/gpu/libdrc_torch.so" python3 test_torch_e2e_gpu.py control
    else
        echo "== PyTorch e2e build FAILED"
        fail=$((fail + 1))
    fi
else
    echo "== no PyTorch with CUDA here: the tensor end to end is not run"
fi
echo "== e2e summary: $fail failed"
[ "$fail" -eq 0 ]
