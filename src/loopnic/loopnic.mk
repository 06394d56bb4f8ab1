# ---- loopnic: a loopback verbs provider that behaves like a NIC (src/loopnic/README.md) ----
# Two sources (the model; surface.c, the rest of rdma-core's symbols), two libraries:
# $B/loopnic/libibverbs.so.1 (in place of rdma-core's, LD_LIBRARY_PATH) and $B/loopnic/libloopnic.so
# (LD_PRELOAD over the real one). No sanitizers: it is preloaded.
LOOPNIC_DEPS  := src/loopnic/loopnic.c src/loopnic/surface.c src/loopnic/loopnic.h src/loopnic/loopnic_record.h src/loopnic/loopnic.map
LOOPNIC_BUILD  = $(CC) $(CPPFLAGS) -Isrc/loopnic -O2 -g $(WARN) -fPIC -fvisibility=hidden -shared \
                 -Wl,--version-script=src/loopnic/loopnic.map -Wl,-soname,$(notdir $@) -o $@ $(filter %.c,$^) -ldl -lpthread
$B/loopnic/libibverbs.so.1: $(LOOPNIC_DEPS)
	@mkdir -p $(@D)
	$(call show,LD)$(LOOPNIC_BUILD)
$B/loopnic/libloopnic.so: $(LOOPNIC_DEPS)
	@mkdir -p $(@D)
	$(call show,LD)$(LOOPNIC_BUILD)
# The provider's own test, linked against the system libibverbs and run twice: with the provider in
# place (LD_LIBRARY_PATH) and preloaded over the real library. The two wrappers are what
# tests/run.sh runs; they re-exec the test with the environment of their mode.
$B/loopnic/test_loopnic: tests/loopnic/test_loopnic.c src/loopnic/loopnic.h
	@mkdir -p $(@D)
	$(call show,CCLD)$(CC) $(CPPFLAGS) -Isrc/loopnic -Itests/loopnic -O1 -g $(WARN) -o $@ $< -libverbs -lcmocka -ldl -lpthread
$B/loopnic/test_loopnic_inplace $B/loopnic/test_loopnic_preload: $B/loopnic/test_loopnic
	$(call show,GEN)printf '#!/bin/sh\nd=$$(cd "$$(dirname "$$0")" && pwd)\n%s exec "$$d/test_loopnic" "$$@"\n' \
	  $(if $(findstring inplace,$@),'LOOPNIC_TEST_MODE=inplace LD_LIBRARY_PATH="$$d$${LD_LIBRARY_PATH:+:$$LD_LIBRARY_PATH}"',\
	    'LOOPNIC_TEST_MODE=preload LD_PRELOAD="$$d/libloopnic.so$${LD_PRELOAD:+ $$LD_PRELOAD}"') > $@
	$(Q)chmod +x $@
# THE CUDA double (tests/doubles/): its device memory is host memory, so the GPU paths run without a GPU.
$B/loopnic/fakecuda/libcuda.so.1: tests/doubles/fake_libcuda.c tests/doubles/fake_libcuda.h
	@mkdir -p $(@D)
	$(call show,LD)$(CC) $(CPPFLAGS) -Itests/doubles -O1 -g $(WARN) -fPIC -shared -Wl,-soname,libcuda.so.1 -o $@ $< -lpthread
# End to end: drc's verbs cache (libdrc.a) on the provider, its libibverbs.so.1 through the rpath.
$B/loopnic/test_e2e_drc: tests/loopnic/test_e2e_drc.c src/loopnic/loopnic.h include/drc.h include/drc_verbs.h $B/libdrc.a \
                         $B/loopnic/libibverbs.so.1
	@mkdir -p $(@D)
	$(call show,CCLD)$(CC) $(CPPFLAGS) -Isrc/loopnic -Itests/loopnic -O1 -g $(WARN) -o $@ $< $B/libdrc.a -L$B/loopnic -l:libibverbs.so.1 \
	  -Wl,-rpath,'$$ORIGIN' -lcmocka $(filter-out -libverbs,$(LDLIBS))
# End to end: an engine on plain verbs with libdrc_verbs.so preloaded, on the in-place provider.
$B/loopnic/test_e2e_drc_verbs: tests/loopnic/test_e2e_drc_verbs.c src/loopnic/loopnic.h
	@mkdir -p $(@D)
	$(call show,CCLD)$(CC) $(CPPFLAGS) -Isrc/loopnic -Itests/loopnic -O1 -g $(WARN) -o $@ $< -libverbs -lcmocka -ldl
$B/loopnic/test_e2e_drc_verbs_run: $B/loopnic/test_e2e_drc_verbs $B/libdrc_verbs.so $B/loopnic/libibverbs.so.1
	$(call show,GEN)printf '#!/bin/sh\nd=$$(cd "$$(dirname "$$0")" && pwd)\n%s exec "$$d/test_e2e_drc_verbs" "$$@"\n' \
	  'LD_PRELOAD="$$d/../libdrc_verbs.so" LD_LIBRARY_PATH="$$d$${LD_LIBRARY_PATH:+:$$LD_LIBRARY_PATH}"' > $@
	$(Q)chmod +x $@
LOOPNIC_TESTS := $B/loopnic/test_loopnic_inplace $B/loopnic/test_loopnic_preload $B/loopnic/test_e2e_drc \
                 $B/loopnic/test_e2e_drc_verbs_run
.PHONY: test-loopnic
test-loopnic: $B/loopnic/libibverbs.so.1 $B/loopnic/libloopnic.so $B/loopnic/fakecuda/libcuda.so.1 $(LOOPNIC_TESTS)
	$(call phase,loopnic: the NIC model's own tests) tests/run.sh $B/test-results/loopnic $(LOOPNIC_TESTS)
TEST_PHASES += test-loopnic
# Stock programs on the model NIC (issue 25): Debian's ibverbs-utils and perftest, two processes,
# in place and with drc preloaded (tests/loopnic/stock.sh); and the provider's symbol surface
# against the system's libibverbs (tests/loopnic/check_surface.sh).
$B/loopnic/stale_hazard: tests/loopnic/stale_hazard.c tests/loopnic/rcqp.h
	@mkdir -p $(@D)
	$(call show,CCLD)$(CC) $(CPPFLAGS) -Itests/loopnic -O1 -g $(WARN) -o $@ $< -libverbs
.PHONY: test-loopnic-stock test-loopnic-surface
test-loopnic-stock: $B/loopnic/libibverbs.so.1 $B/loopnic/libloopnic.so $B/loopnic/stale_hazard $B/libdrc_verbs.so
	$(call phase,stock: ibverbs-utils and perftest on the NIC model) tests/loopnic/stock.sh $B $B/test-results/loopnic-stock
test-loopnic-surface: $B/loopnic/libibverbs.so.1
	$(call phase,surface: the NIC model's symbols against libibverbs's) tests/loopnic/check_surface.sh $B/loopnic/libibverbs.so.1 $B/test-results/loopnic-surface
TEST_PHASES += test-loopnic-stock test-loopnic-surface
