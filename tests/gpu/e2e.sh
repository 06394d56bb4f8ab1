#!/bin/sh
# The end-to-end suite on the GPU machine (issue 10): drc's verbs cache on cudaMalloc, cudaMallocAsync
# and VMM memory, moved by the loopback provider with cuMemcpy (no RDMA NIC there).
# Usage: tests/gpu/e2e.sh [BUILD_DIR]. Builds build/loopnic/libibverbs.so.1 at the top and e2e_gpu here.
cd "$(dirname "$0")" || exit 1
B=${1:-$(cd ../.. && pwd)/build}
echo "== drc e2e GPU tests, $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
make -s -C ../.. "$B/loopnic/libibverbs.so.1" B="$B" >/dev/null || { echo "== loopnic build FAILED"; exit 1; }
make -s B="$B" e2e || { echo "== build FAILED"; exit 1; }
LD_LIBRARY_PATH="$B/loopnic${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$B/gpu/e2e_gpu"
rc=$?
echo "== e2e summary: exit $rc"
[ "$rc" -eq 0 ]
