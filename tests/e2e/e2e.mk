# ---- the end-to-end suite (tests/e2e/README.md): two processes over a socketpair, drc in front ----
# One source, two programs linked against the system's libibverbs: e2e_api (drc's C API, libdrc.a)
# and e2e_engine (plain verbs; drc comes in by LD_PRELOAD). make test runs them on the loopback
# provider, in place of libibverbs or preloaded over it (the matrix below); make test-hw runs the
# same programs on the real libibverbs. The wrappers are what tests/run.sh runs.
E2E_DEPS := tests/e2e/e2e.c src/loopnic/loopnic.h tests/loopnic/rcqp.h
$B/e2e/e2e_api: $(E2E_DEPS) include/drc.h include/drc_verbs.h $B/libdrc.a
	@mkdir -p $(@D)
	$(call show,CCLD)$(CC) $(CPPFLAGS) -Isrc/loopnic -Itests/loopnic -DE2E_API -O1 -g $(WARN) -o $@ $< $B/libdrc.a -libverbs -lcmocka $(LDLIBS)
$B/e2e/e2e_engine: $(E2E_DEPS)
	@mkdir -p $(@D)
	$(call show,CCLD)$(CC) $(CPPFLAGS) -Isrc/loopnic -Itests/loopnic -O1 -g $(WARN) -o $@ $< -libverbs -lcmocka -ldl
# $(call e2e_wrapper,PROGRAM,ENVIRONMENT): a script that runs $B/e2e/PROGRAM with ENVIRONMENT,
# where $$d is the script's folder ($B/e2e).
e2e_wrapper = printf '\#!/bin/sh\nd=$$(cd "$$(dirname "$$0")" && pwd)\n%s exec "$$d/$1" "$$@"\n' '$2' > $@ && chmod +x $@
# The matrix (tests/e2e/README.md): every test, the same assertions, in three modes, one wrapper
# each, named after its mode (E2E_MODE names it in the test output too). All bring loopnic's CUDA
# double as libcuda.so.1 (GPU memory without a GPU) and require it (E2E_REQUIRE_GPU).
#   run_api                     e2e_api, loopnic in place of libibverbs.so.1
#   run_preload_inplace         e2e_engine, drc preloaded, loopnic in place of libibverbs.so.1
#   run_preload_over_rdma_core  e2e_engine, drc then loopnic preloaded over the system's libibverbs
E2E_CUDA := E2E_REQUIRE_GPU=1 LD_LIBRARY_PATH="$$d/../loopnic/fakecuda$${LD_LIBRARY_PATH:+:$$LD_LIBRARY_PATH}"
E2E_LOOP := E2E_REQUIRE_GPU=1 LD_LIBRARY_PATH="$$d/../loopnic:$$d/../loopnic/fakecuda$${LD_LIBRARY_PATH:+:$$LD_LIBRARY_PATH}"
$B/e2e/run_api: $B/e2e/e2e_api $B/loopnic/libibverbs.so.1 $B/loopnic/fakecuda/libcuda.so.1
	$(call show,GEN)$(call e2e_wrapper,e2e_api,E2E_MODE=api $(E2E_LOOP))
$B/e2e/run_preload_inplace: $B/e2e/e2e_engine $B/loopnic/libibverbs.so.1 $B/loopnic/fakecuda/libcuda.so.1 $B/libdrc_verbs.so
	$(call show,GEN)$(call e2e_wrapper,e2e_engine,E2E_MODE=preload_inplace $(E2E_LOOP) LD_PRELOAD="$$d/../libdrc_verbs.so")
# drc first: its ibv_reg_mr is the one the program resolves, and its next definitions are loopnic's
$B/e2e/run_preload_over_rdma_core: $B/e2e/e2e_engine $B/loopnic/libloopnic.so $B/loopnic/fakecuda/libcuda.so.1 \
                                   $B/libdrc_verbs.so
	$(call show,GEN)$(call e2e_wrapper,e2e_engine,E2E_MODE=preload_over_rdma_core $(E2E_CUDA) \
	  LD_PRELOAD="$$d/../libdrc_verbs.so $$d/../loopnic/libloopnic.so")
E2E_TESTS := $B/e2e/run_api $B/e2e/run_preload_inplace $B/e2e/run_preload_over_rdma_core
.PHONY: test-e2e
test-e2e: $(E2E_TESTS)
	$(call phase,e2e: two processes over the NIC model in three modes) tests/run.sh $B/test-results/e2e $(E2E_TESTS)
TEST_PHASES += test-e2e

# make test-hw: the same two programs on the real libibverbs and libcuda, then drc doctor
# (tests/e2e/README.md). On a machine with no RDMA device it says so and succeeds (the script's 77).
.PHONY: test-hw
test-hw: $B/e2e/e2e_api $B/e2e/e2e_engine $B/libdrc_verbs.so $B/drc
	@tests/e2e/test_hw.sh $B; rc=$$?; [ $$rc -eq 77 ] || exit $$rc
