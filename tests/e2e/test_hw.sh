#!/bin/sh
# make test-hw: the end-to-end suite (tests/e2e/e2e.c) on this machine's real RDMA NIC and GPU,
# through the system's libibverbs and libcuda (no loopback provider), then `drc doctor`.
# Usage: tests/e2e/test_hw.sh BUILD_DIR. Exit 0: all passed; 77: no RDMA device here (skipped);
# otherwise the number of failed programs. E2E_DEVICE / E2E_GID_INDEX pick the NIC port's GID
# (RoCE v2 usually needs E2E_GID_INDEX=3; see `show_gids`).
B=$1
unset LD_PRELOAD LOOPNIC_REGISTRY
export E2E_REQUIRE_HW=1      # the programs refuse to run on loopnic (an LD_LIBRARY_PATH left over)
echo "== drc test-hw, $(date -u '+%Y-%m-%d %H:%M:%S UTC'), $(uname -n)"
"$B/e2e/e2e_api" --probe
case $? in
    0) ;;
    77) echo "== test-hw: skipped: libibverbs sees no RDMA device on this machine"; exit 77;;
    *) echo "== test-hw: cannot start"; exit 1;;
esac
fail=0
run() {
    echo "== $*"
    "$@" || { fail=$((fail + 1)); echo "== FAILED: $*"; }
}
run "$B/e2e/e2e_api"                                        # drc's C API in both processes
run env LD_PRELOAD="$B/libdrc_verbs.so" "$B/e2e/e2e_engine"   # an engine on plain verbs, drc preloaded
echo "== drc doctor"
"$B/drc" doctor
echo "== test-hw: $fail of 2 programs failed"
exit $fail
