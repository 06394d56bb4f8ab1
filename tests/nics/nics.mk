# ---- many NICs per GPU (issue 11): drc on the loopback provider with 4 devices and the CUDA double ----
# The test links drc's objects, loopnic in place of libibverbs (its rpath) and the CUDA double; drc's
# dlopen("libibverbs.so.1") then finds the loaded loopnic. No sanitizers: loopnic interposes munmap.
$B/nics/test_nics: tests/nics/test_nics.c src/loopnic/loopnic.h tests/loopnic/rcqp.h $(call objs,$B,$(LIB_SRCS)) \
                   $B/loopnic/libibverbs.so.1 $B/fakecuda/libcuda.so.1
	@mkdir -p $(@D)
	$(call show,CCLD)$(CC) $(CPPFLAGS) -Itests -Isrc/loopnic -Itests/loopnic -Itests/doubles -O1 -g $(WARN) -o $@ $< $(call objs,$B,$(LIB_SRCS)) \
	  -L$B/loopnic -l:libibverbs.so.1 -L$B/fakecuda -l:libcuda.so.1 \
	  -Wl,-rpath,'$$ORIGIN/../loopnic:$$ORIGIN/../fakecuda' -lcmocka $(LDLIBS)
.PHONY: test-nics
test-nics: $B/nics/test_nics
	$(call phase,nics: many NICs per GPU on the NIC model) tests/run.sh $B/test-results/nics $B/nics/test_nics
TEST_PHASES += test-nics
# bench_nics (make bench): loopnic in place of libibverbs; the CUDA double is dlopen'ed from $B/fakecuda
# only where no libcuda.so.1 loads, so the same binary uses the real driver on the GPU machine.
bench_nics_LDFLAGS := -L$B/loopnic -l:libibverbs.so.1 -Wl,-rpath,'$$ORIGIN/../loopnic'
$B/bench/bench_nics: $B/loopnic/libibverbs.so.1 $B/fakecuda/libcuda.so.1
