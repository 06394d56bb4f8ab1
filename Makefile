# drc — plain Makefile. Targets: all (default), test, test-gpu, fuzz, bench, demo, install, clean.
CC      ?= cc
CLANG   ?= clang
PREFIX  ?= /usr/local
LIBDIR  ?= $(PREFIX)/lib
B       := build
FUZZ_SECONDS ?= 60

WARN     := -Wall -Wextra -Werror -Wshadow -Wstrict-prototypes -Wpointer-arith -Wcast-align \
            -Wswitch-enum -Wundef
CFLAGS   ?= -O2 -g
CPPFLAGS += -Iinclude -Isrc -D_GNU_SOURCE
PICFLAGS := -fPIC -fvisibility=hidden
LDLIBS   := -libverbs -ljemalloc -ldl -lpthread

# Sources of libdrc: every src/*.c except the programs and preload libraries listed here.
NOT_LIB  := src/drc.c src/doctor.c src/hook_preload.c src/hook_cupti.c src/verbs_preload.c src/hook_host.c
LIB_SRCS := $(filter-out $(NOT_LIB),$(wildcard src/*.c))
HDRS     := include/drc.h $(wildcard src/*.h)

# Unit tests: tests/test_*.c, one binary each, linked with the library objects.
# A test's extra link flags (e.g. -Wl,--wrap=...) go in <name>_LDFLAGS.
# Thread tests are named tests/test_*_mt.c and also run under TSan.
TESTS    := $(patsubst tests/%.c,%,$(wildcard tests/test_*.c))
MT_TESTS := $(filter %_mt,$(TESTS))
TEST_LIBS := -lcmocka $(LDLIBS)

ASAN := -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
TSAN := -fsanitize=thread

# The first command on a fresh machine may be `make test` or `make demo`: install what they need first.
ifneq ($(filter test test-unit test-asan test-tsan demo fuzz bench,$(MAKECMDGOALS)),)
  ifneq ($(shell sh .ci/deps >&2; echo $$?),0)
    $(error missing build dependencies: see above)
  endif
endif

.PHONY: $B/drc.pc all test test-unit test-asan test-tsan test-gpu fuzz bench demo install clean
all: $B/libdrc.a $B/libdrc.so $B/drc $B/drc.pc

# ---- objects, one tree per flavour ----------------------------------------
$B/obj/%.o: src/%.c $(HDRS)
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) $(CFLAGS) $(WARN) $(PICFLAGS) -c $< -o $@
$B/asan/obj/%.o: src/%.c $(HDRS)
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) -O1 -g $(WARN) $(PICFLAGS) $(ASAN) -DDRC_DEBUG -c $< -o $@
$B/tsan/obj/%.o: src/%.c $(HDRS)
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) -O1 -g $(WARN) $(PICFLAGS) $(TSAN) -DDRC_DEBUG -c $< -o $@

LIB_OBJS      := $(patsubst src/%.c,$B/obj/%.o,$(LIB_SRCS))
ASAN_LIB_OBJS := $(patsubst src/%.c,$B/asan/obj/%.o,$(LIB_SRCS))
TSAN_LIB_OBJS := $(patsubst src/%.c,$B/tsan/obj/%.o,$(LIB_SRCS))

$B/libdrc.a: $(LIB_OBJS)
	rm -f $@ && ar rcs $@ $^
$B/libdrc.so: $(LIB_OBJS) src/drc.map
	$(CC) -shared $(LDFLAGS) -Wl,--version-script=src/drc.map -Wl,-soname,libdrc.so.0 -Wl,-z,nodelete -o $@ $(LIB_OBJS) $(LDLIBS)
$B/drc: $B/obj/drc.o $B/obj/doctor.o $B/libdrc.a
	$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $(filter %.o,$^) $B/libdrc.a $(LDLIBS)
$B/drc.pc: Makefile
	@mkdir -p $(@D)
	printf 'prefix=%s\nlibdir=%s\nincludedir=$${prefix}/include\n\nName: drc\nDescription: RDMA registration cache with DMA-BUF for GPU memory\nVersion: 0.1.0\nLibs: -L$${libdir} -ldrc\nLibs.private: %s\nCflags: -I$${includedir}\n' \
	  '$(PREFIX)' '$(LIBDIR)' '$(LDLIBS)' > $@

# ---- tests -----------------------------------------------------------------
$B/tests/%: tests/%.c $(LIB_OBJS) $(wildcard tests/*.h)
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) -Itests -O1 -g $(WARN) -o $@ $< $(LIB_OBJS) $($*_LDFLAGS) $(TEST_LIBS)
$B/asan/tests/%: tests/%.c $(ASAN_LIB_OBJS) $(wildcard tests/*.h)
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) -Itests -O1 -g $(WARN) $(ASAN) -DDRC_DEBUG -o $@ $< $(ASAN_LIB_OBJS) $($*_LDFLAGS) $(TEST_LIBS)
$B/tsan/tests/%: tests/%.c $(TSAN_LIB_OBJS) $(wildcard tests/*.h)
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) -Itests -O1 -g $(WARN) $(TSAN) -DDRC_DEBUG -o $@ $< $(TSAN_LIB_OBJS) $($*_LDFLAGS) $(TEST_LIBS)

# Each runner prints cmocka's summary per test; the script prints the closing count.
test: test-unit test-asan test-tsan
	@tests/summary.sh $B/test-results
test-unit: $(addprefix $B/tests/,$(TESTS)) all
	@mkdir -p $B/test-results && tests/run.sh $B/test-results/plain $(addprefix $B/tests/,$(TESTS))
test-asan: $(addprefix $B/asan/tests/,$(TESTS))
	@mkdir -p $B/test-results && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
	  tests/run.sh $B/test-results/asan $(addprefix $B/asan/tests/,$(TESTS))
test-tsan: $(addprefix $B/tsan/tests/,$(MT_TESTS))
	@mkdir -p $B/test-results && TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
	  tests/run.sh $B/test-results/tsan $(addprefix $B/tsan/tests/,$(MT_TESTS))

# ---- fuzzing (clang + libFuzzer) -------------------------------------------
FUZZERS := $(patsubst fuzz/%.c,%,$(filter-out fuzz/standalone.c,$(wildcard fuzz/fuzz_*.c)))
FUZZ_FLAGS := -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -DDRC_DEBUG
$B/fuzz/%: fuzz/%.c $(LIB_SRCS) $(HDRS) $(wildcard fuzz/*.h)
	@mkdir -p $(@D)
	$(CLANG) $(CPPFLAGS) -Ifuzz $(FUZZ_FLAGS) $(WARN) -Wno-unused-command-line-argument -o $@ $< $(LIB_SRCS) $(LDLIBS)
fuzz: $(addprefix $B/fuzz/,$(FUZZERS))
	@set -e; for f in $(FUZZERS); do \
	  mkdir -p $B/fuzz/corpus/$$f; \
	  echo "== $$f for $(FUZZ_SECONDS)s"; \
	  $B/fuzz/$$f -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 $B/fuzz/corpus/$$f fuzz/corpus/$$f; \
	done

# ---- fuzz targets replayed by make test (core tests and fuzzers, issue 2) ----
# Each fuzz target is also built with $(CC) and fuzz/standalone.c (no libFuzzer), under
# ASan+UBSan, and replays its committed seed corpus fuzz/corpus/<target>/, so the fuzz code
# compiles and runs wherever make test does. Its result joins tests/summary.sh's count.
$B/fuzz-replay/%: fuzz/%.c fuzz/standalone.c $(ASAN_LIB_OBJS) $(wildcard fuzz/*.h)
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) -Ifuzz -O1 -g $(WARN) $(ASAN) -DDRC_DEBUG -o $@ $< fuzz/standalone.c $(ASAN_LIB_OBJS) $(LDLIBS)
.PHONY: test-fuzz-replay
test-fuzz-replay: $(addprefix $B/fuzz-replay/,$(FUZZERS))
	@mkdir -p $B/test-results && : > $B/test-results/fuzz-replay && for f in $(FUZZERS); do \
	  if ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 $B/fuzz-replay/$$f fuzz/corpus/$$f; \
	  then echo "$$f 1 0" >> $B/test-results/fuzz-replay; \
	  else echo "!! $$f failed on its corpus"; echo "$$f 0 1" >> $B/test-results/fuzz-replay; fi; \
	done
test: test-fuzz-replay

# ---- benchmarks ------------------------------------------------------------
BENCHES := $(patsubst tests/bench/%.c,%,$(wildcard tests/bench/bench_*.c))
$B/bench/%: tests/bench/%.c $B/libdrc.a
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) -O2 -g $(WARN) -o $@ $< $B/libdrc.a $($*_LDFLAGS) $(LDLIBS) -lm
# ---- bench_cache (drc vs UCX ucs_rcache) ----
bench_cache_LDFLAGS := -lucs -lucm
bench: $(addprefix $B/bench/,$(BENCHES))
	@set -e; for b in $^; do echo "== $$b"; $$b; done

# ---- invalidation hooks (issue 4): libdrc_hook.so and the doubles its test runs against ----
# The hook library is built at -O2 with sibling calls whatever CFLAGS say: its dlsym must
# tail-call libc's, which resolves RTLD_NEXT from the caller's return address.
HOOK_OBJS := $B/hook/hook_preload.o $B/hook/hook_cupti.o
$B/hook/%.o: src/%.c $(HDRS)
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) -O2 -g -foptimize-sibling-calls $(WARN) $(PICFLAGS) -c $< -o $@
$B/libdrc_hook.so: $(HOOK_OBJS)
	$(CC) -shared $(LDFLAGS) -o $@ $(HOOK_OBJS) -ldl
all: $B/libdrc_hook.so
# A double of libcuda.so.1 (there is no GPU in CI) and the programs the preload test runs under
# LD_PRELOAD, all without sanitizers (ASan does not mix with preloading another library).
$B/fakecuda/libcuda.so.1: tests/hooks/fake_cuda.c tests/hooks/fake_cuda.h
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) -Itests/hooks -O1 -g $(WARN) -fPIC -shared -Wl,-soname,libcuda.so.1 -o $@ $<
$B/hooktest/hook_child: tests/hooks/hook_child.c tests/hooks/fake_cuda.h $B/libdrc.a $B/fakecuda/libcuda.so.1
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) -Itests/hooks -O1 -g $(WARN) -o $@ $< $B/libdrc.a -L$B/fakecuda -l:libcuda.so.1 \
	  -Wl,-rpath,'$$ORIGIN/../fakecuda' $(LDLIBS)
$B/tests/test_hook_preload $B/asan/tests/test_hook_preload: $B/libdrc_hook.so $B/hooktest/hook_child

# ---- transfer-engine interposer (issue 5): libdrc_verbs.so, its doubles and test programs ----
# libdrc_verbs.so is the whole library plus the ibv_reg_mr interposer, the host-memory hooks
# (hook_host.c) and the CUDA free hooks of libdrc_hook.so: one LD_PRELOAD does everything.
VERBS_PRELOAD_OBJS := $B/obj/verbs_preload.o $B/obj/hook_host.o
$B/libdrc_verbs.so: $(VERBS_PRELOAD_OBJS) $(HOOK_OBJS) $(LIB_OBJS)
	$(CC) -shared $(LDFLAGS) -Wl,-soname,libdrc_verbs.so -o $@ $^ $(LDLIBS)
all: $B/libdrc_verbs.so
# DOUBLES (no NIC, no GPU in CI): a recording libibverbs.so.1 and a libcuda.so.1 that exports
# dmabufs, both found by the test through LD_LIBRARY_PATH; and the program run under the preload.
$B/engine/libibverbs.so.1: tests/engine/ibverbs_double.c tests/engine/ibverbs_double.h tests/engine/ibverbs_double.map
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) -Itests/engine -O1 -g $(WARN) -fPIC -shared -Wl,-soname,libibverbs.so.1 \
	  -Wl,--version-script=tests/engine/ibverbs_double.map -o $@ $< -lpthread
$B/engine/fakecuda/libcuda.so.1: tests/engine/fake_libcuda.c tests/engine/fake_libcuda.h
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) -Itests/engine -O1 -g $(WARN) -fPIC -shared -Wl,-soname,libcuda.so.1 -o $@ $< -lpthread
$B/engine/engine_child: tests/engine/engine_child.c tests/engine/ibverbs_double.h tests/engine/fake_libcuda.h \
                        $B/engine/libibverbs.so.1
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) -Itests/engine -O1 -g $(WARN) -o $@ $< -L$B/engine -l:libibverbs.so.1 -ljemalloc -ldl
$B/tests/test_verbs_preload $B/asan/tests/test_verbs_preload: $B/libdrc_verbs.so $B/engine/engine_child \
  $B/engine/fakecuda/libcuda.so.1
test_regmr_LDFLAGS := -Wl,--wrap=ibv_reg_mr_iova2,--wrap=ibv_reg_dmabuf_mr,--wrap=ibv_dereg_mr,--wrap=ibv_query_device
# test_cache_alloc: an allocator that re-enters drc from inside the library's allocations (issue 9 item 5).
test_cache_alloc_LDFLAGS := -Wl,--wrap=aligned_alloc,--wrap=calloc,--wrap=free
bench_engine_LDFLAGS :=
$B/bench/bench_engine: $B/engine/libibverbs.so.1 $B/engine/fakecuda/libcuda.so.1

# ---- the demo and the doctor -----------------------------------------------
demo: $B/drc
	$B/drc demo
	$B/drc doctor

# ---- GPU tests (run on a machine with CUDA; see tests/gpu/README) -------------
test-gpu:
	$(MAKE) -C tests/gpu B=$(abspath $B)

install: all
	install -d $(DESTDIR)$(PREFIX)/include $(DESTDIR)$(LIBDIR)/pkgconfig $(DESTDIR)$(PREFIX)/bin
	install -m 644 include/drc.h $(DESTDIR)$(PREFIX)/include/
	install -m 644 $B/libdrc.a $(DESTDIR)$(LIBDIR)/
	install -m 755 $B/libdrc.so $(DESTDIR)$(LIBDIR)/libdrc.so.0
	ln -sf libdrc.so.0 $(DESTDIR)$(LIBDIR)/libdrc.so
	install -m 644 $B/drc.pc $(DESTDIR)$(LIBDIR)/pkgconfig/
	install -m 755 $B/drc $(DESTDIR)$(PREFIX)/bin/
	install -m 755 $B/libdrc_hook.so $B/libdrc_verbs.so $(DESTDIR)$(LIBDIR)/
	install -d $(DESTDIR)$(PREFIX)/share/drc/python
	install -m 644 src/python/drc_torch.py $(DESTDIR)$(PREFIX)/share/drc/python/

# ---- CUDA layer and verbs backend (issue 3) ----
# test_verbs replaces libibverbs with doubles and counts close() of the dmabuf fds.
test_verbs_LDFLAGS := -Wl,--wrap=ibv_reg_dmabuf_mr,--wrap=ibv_reg_mr_iova2,--wrap=ibv_reg_mr,--wrap=ibv_dereg_mr,--wrap=ibv_query_device,--wrap=close

clean:
	rm -rf $B

.SECONDARY:
