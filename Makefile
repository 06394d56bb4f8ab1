# drc — plain Makefile. Targets: all (default), test, test-gpu, fuzz, bench, demo, install, clean.
CC      ?= cc
CLANG   ?= clang
PREFIX  ?= /usr/local
LIBDIR  ?= $(PREFIX)/lib
INCLUDEDIR ?= $(PREFIX)/include
BINDIR  ?= $(PREFIX)/bin
DATADIR ?= $(PREFIX)/share
CMAKEDIR ?= $(LIBDIR)/cmake/drc
B       := build
# The version lives in include/drc.h (DRC_VERSION_*); the pc and CMake files take it from there.
VERSION := $(shell sed -n 's/^\#define DRC_VERSION_\(MAJOR\|MINOR\|PATCH\) *//p' include/drc.h | paste -sd.)
FUZZ_SECONDS ?= 60

# -Werror only where the compiler is known: CI (.ci/run) and development (make test and the other
# development goals below) set it; a plain `make`/`make install` (a distribution's build, perhaps
# with a newer compiler that warns more) does not. WERROR= on the command line turns it off anywhere.
WARN     = -Wall -Wextra $(WERROR) -Wshadow -Wstrict-prototypes -Wpointer-arith -Wcast-align \
           -Wswitch-enum -Wundef
CFLAGS   ?= -O2 -g
CPPFLAGS += -Iinclude -Isrc -D_GNU_SOURCE
PICFLAGS := -fPIC -fvisibility=hidden
LDLIBS   := -ldl -lpthread

# One folder per dependency (CONTRIBUTING.md, "Layers"):
#   src/core     the cache, the tree, notify, errors: libc only
#   src/cuda     the CUDA driver (dlopen'ed), memory, frees, wrappers, PyTorch entry points
#   src/verbs    libibverbs: the verbs backend and drc_reg_mr
#   src/host     the jemalloc arena: its own library, libdrc_host
#   src/preload  the interposers and the CUPTI monitor (LD_PRELOAD libraries)
#   src/tools    the drc program (demo, doctor)
# libdrc = core + cuda + verbs.
CORE_SRCS  := $(wildcard src/core/*.c)
LIB_SRCS   := $(CORE_SRCS) $(wildcard src/cuda/*.c) $(wildcard src/verbs/*.c)
HOST_SRCS  := $(wildcard src/host/*.c)
HDRS       := $(wildcard include/*.h) $(wildcard src/*/*.h)

# Unit tests: tests/<layer>/test_*.c, one binary each; a new file is a new test, no edit here. Each
# folder links what its layer needs (the folder rules under "tests" below): core tests the core alone
# (no libibverbs, CUDA or jemalloc), host tests add libdrc_host, the others link libdrc; tests/cuda and
# tests/verbs link THE CUDA double, tests/verbs find the loopback provider, tests/preload get the
# programs and libraries they run. A test that #includes the source it tests (to reach its static
# functions) links the other objects, not that one's. A test's own extra link flags (e.g.
# -Wl,--wrap=...) go in <layer>/<name>_LDFLAGS. Thread tests are named test_*_mt.c and also run under TSan.
TEST_SRCS := $(filter-out tests/gpu/% tests/loopnic/% tests/nics/%,$(wildcard tests/*/test_*.c))
TESTS    := $(patsubst tests/%.c,%,$(TEST_SRCS))
TEST_DIRS := $(sort $(patsubst tests/%/,%,$(dir $(TEST_SRCS))))
MT_TESTS := $(filter %_mt,$(TESTS))
TEST_HDRS := $(wildcard tests/*.h tests/doubles/*.h)

ASAN := -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
TSAN := -fsanitize=thread

# Quiet by default: a line per target ("CC obj/core/cache.o"); V=1 prints every command in full.
# Errors and warnings show either way.
V ?= 0
ifeq ($(V),1)
  show =
  Q =
else
  show = @printf '  %-6s %s\n' '$1' '$(patsubst $B/%,%,$@)';
  Q = @
endif
export V

# Dependencies: `make deps` installs the Debian packages the tests need (.ci/deps --install: apt-get
# as root, through sudo otherwise), `make deps demo` only those the demo builds with; nothing else
# installs. The development goals (make test, demo, fuzz, bench ...) build with -Werror and first
# check their packages: a missing one is named, with `make deps`, and make stops. A plain `make` or
# `make install` names the missing Debian packages and the apt-get line, then stops.
DEV_GOALS := $(filter-out test-gpu test-hw,$(filter test test-% fuzz bench bench-%,$(MAKECMDGOALS)))
ifneq ($(filter deps,$(MAKECMDGOALS)),)
  # `make deps test`: the goals one after another, so that nothing builds before the packages are in
  ifneq ($(filter-out deps,$(MAKECMDGOALS)),)
    .NOTPARALLEL:
  endif
else ifneq ($(DEV_GOALS),)
  ifneq ($(shell sh .ci/deps >&2; echo $$?),0)
    $(error missing build dependencies: see above)
  endif
else ifneq ($(filter demo,$(MAKECMDGOALS)),)
  ifneq ($(shell sh .ci/deps --demo >&2; echo $$?),0)
    $(error missing build dependencies: see above)
  endif
else ifneq ($(if $(MAKECMDGOALS),$(filter all install,$(MAKECMDGOALS)),all),)
  ifneq ($(shell CC='$(CC)' sh .ci/deps --check >&2; echo $$?),0)
    $(error missing build dependencies: install the packages named above)
  endif
endif
ifneq ($(DEV_GOALS)$(filter demo,$(MAKECMDGOALS)),)
  WERROR ?= -Werror
endif
WERROR ?=

.PHONY: deps
deps:
	@sh .ci/deps --install $(if $(filter-out deps demo,$(MAKECMDGOALS)),,$(if $(filter demo,$(MAKECMDGOALS)),--demo))

.PHONY: all test test-unit test-asan test-tsan test-gpu build-gpu fuzz bench demo install uninstall clean
all: $B/libdrc.a $B/libdrc.so $B/libdrc.so.0 $B/libdrc_host.so $B/drc

# ---- objects, one tree per flavour ----------------------------------------
$B/obj/%.o: src/%.c $(HDRS)
	@mkdir -p $(@D)
	$(call show,CC)$(CC) $(CPPFLAGS) $(CFLAGS) $(WARN) $(PICFLAGS) -c $< -o $@
$B/asan/obj/%.o: src/%.c $(HDRS)
	@mkdir -p $(@D)
	$(call show,CC)$(CC) $(CPPFLAGS) -O1 -g $(WARN) $(PICFLAGS) $(ASAN) -DDRC_DEBUG -c $< -o $@
$B/tsan/obj/%.o: src/%.c $(HDRS)
	@mkdir -p $(@D)
	$(call show,CC)$(CC) $(CPPFLAGS) -O1 -g $(WARN) $(PICFLAGS) $(TSAN) -DDRC_DEBUG -c $< -o $@

objs = $(patsubst src/%.c,$1/obj/%.o,$2)
LIB_OBJS  := $(call objs,$B,$(LIB_SRCS))
HOST_OBJS := $(call objs,$B,$(HOST_SRCS))

# libdrc.a holds one relocatable object, so that linking it takes every layer (the CUDA layer
# installs itself into the core from a constructor, which nothing references by name).
$B/libdrc.a: $(LIB_OBJS)
	$(call show,AR)$(LD) -r -o $B/libdrc-all.o $^
	$(Q)rm -f $@ && ar rcs $@ $B/libdrc-all.o
# Each shared library is a real file named by its full version (libdrc.so.0.1.0), the soname a link
# to it (libdrc.so.0: what programs load) and the bare name a link to that (libdrc.so: what -ldrc
# finds), in the build tree as where it is installed. libdrc_host.so finds libdrc.so.0 beside itself
# (RUNPATH $ORIGIN), wherever the two were installed.
$B/libdrc.so.$(VERSION): $(LIB_OBJS) src/drc.map
	$(call show,LD)$(CC) -shared $(LDFLAGS) -Wl,--version-script=src/drc.map -Wl,-soname,libdrc.so.0 -Wl,-z,nodelete -o $@ $(LIB_OBJS) $(LDLIBS)
$B/libdrc_host.so.$(VERSION): $(HOST_OBJS) $B/libdrc.so src/host/drc_host.map
	$(call show,LD)$(CC) -shared $(LDFLAGS) -Wl,--version-script=src/host/drc_host.map -Wl,-soname,libdrc_host.so.0 \
	  -Wl,-rpath,'$$ORIGIN' -o $@ $(HOST_OBJS) -L$B -l:libdrc.so.0 -ljemalloc -lpthread
$B/libdrc.so.0: $B/libdrc.so.$(VERSION)
	$(Q)ln -sf $(notdir $<) $@
$B/libdrc.so: $B/libdrc.so.0
	$(Q)ln -sf $(notdir $<) $@
$B/libdrc_host.so.0: $B/libdrc_host.so.$(VERSION)
	$(Q)ln -sf $(notdir $<) $@
$B/libdrc_host.so: $B/libdrc_host.so.0
	$(Q)ln -sf $(notdir $<) $@
$B/drc: $B/obj/tools/drc.o $B/obj/tools/doctor.o $B/libdrc.a
	$(call show,LD)$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $(filter %.o,$^) $B/libdrc.a $(LDLIBS)
# pkg-config and CMake files (pkg/*.in), for PREFIX/LIBDIR/INCLUDEDIR as given to this make: regenerated
# on every run (they depend on the command line). The CMake files locate the tree relative to
# themselves, so a DESTDIR-staged or moved tree works.
PKG_FILES := $B/pkg/drc.pc $B/pkg/drc_host.pc $B/pkg/drcConfig.cmake $B/pkg/drcConfigVersion.cmake
pc_dir = $(patsubst $(PREFIX)/%,$${prefix}/%,$1)
$(PKG_FILES): $B/pkg/%: pkg/%.in FORCE
	@mkdir -p $(@D)
	@sed -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@PC_LIBDIR@|$(call pc_dir,$(LIBDIR))|g' \
	    -e 's|@PC_INCLUDEDIR@|$(call pc_dir,$(INCLUDEDIR))|g' -e 's|@VERSION@|$(VERSION)|g' \
	    -e 's|@VERSION_MAJOR@|$(firstword $(subst ., ,$(VERSION)))|g' \
	    -e "s|@REL_PREFIX@|$$(realpath -m --relative-to='$(CMAKEDIR)' '$(PREFIX)')|g" \
	    -e "s|@REL_LIBDIR@|$$(realpath -m --relative-to='$(PREFIX)' '$(LIBDIR)')|g" \
	    -e "s|@REL_INCLUDEDIR@|$$(realpath -m --relative-to='$(PREFIX)' '$(INCLUDEDIR)')|g" $< > $@.tmp && mv $@.tmp $@
.PHONY: FORCE
FORCE:
all: $(PKG_FILES)

# ---- tests -----------------------------------------------------------------
# The folder rules: what a folder's tests link (test_srcs_<folder>, test_link_<folder>, test_libs_<folder>;
# libdrc's objects and -lcmocka $(LDLIBS) where a folder names none) and what they need built first
# (test_deps_<folder>, set where those things are built, below).
test_srcs_core := $(CORE_SRCS)
test_libs_core := -lcmocka -ldl -lpthread
test_srcs_host := $(LIB_SRCS) $(HOST_SRCS)
test_libs_host := -lcmocka -ljemalloc $(LDLIBS)
test_srcs = $(or $(test_srcs_$1),$(LIB_SRCS))
test_libs = $(or $(test_libs_$1),-lcmocka $(LDLIBS))
# the sources a test #includes ("core/itree" for #include "core/itree.c"): linked through the test, not as objects
included_srcs = $(shell sed -n 's|^\#include "\([a-z]*/[a-z_0-9]*\)\.c".*|\1|p' $1)
# $(call test_rules,FLAVOUR_DIR,FLAGS,FOLDER): the link rule of one folder's tests in one flavour
# (plain, asan, tsan). Evaluated after the last test_deps_<folder> is set (end of this file).
define test_rules
$1/tests/$3/%: tests/$3/%.c $(call objs,$1,$(call test_srcs,$3)) $(test_deps_$3) $(TEST_HDRS) $(wildcard tests/$3/*.h)
	@mkdir -p $$(@D)
	$$(call show,CCLD)$$(CC) $$(CPPFLAGS) -Itests -O1 -g $$(WARN) $2 -o $$@ $$< \
	  $$(filter-out $$(patsubst %,$1/obj/%.o,$$(call included_srcs,$$<)),$(call objs,$1,$(call test_srcs,$3))) \
	  $$(test_link_$3) $$($3/$$*_LDFLAGS) $$(call test_libs,$3)
endef
# Named as targets, so that the pattern rules above may chain to them in every flavour.
$(foreach f,$B $B/asan $B/tsan,$(call objs,$f,$(LIB_SRCS) $(HOST_SRCS))):

# make test: each phase prints a header, then a line per test program (its whole output when it
# fails, or with V=1) and records its counts in $B/test-results/<phase>; the last step
# (tests/summary.sh) prints a table of the phases and the closing line
# "test: N passed, M failed, K skipped". A phase joins make test with TEST_PHASES += test-<phase>.
# `make test` starts from an empty results folder; a phase run alone replaces its own file.
phase = @mkdir -p $B/test-results && printf '\n== %s\n' "$1" &&
TEST_RESULTS_RESET := $(if $(filter test,$(MAKECMDGOALS)),test-results-reset)
.PHONY: test-results-reset
test-results-reset:
	@rm -rf $B/test-results
TEST_PHASES := test-unit test-asan test-tsan
test-unit: $(addprefix $B/tests/,$(TESTS)) all
	$(call phase,unit: tests/*/test_*.c) tests/run.sh $B/test-results/unit $(addprefix $B/tests/,$(TESTS))
test-asan: $(addprefix $B/asan/tests/,$(TESTS))
	$(call phase,asan: the same under ASan+UBSan) ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
	  UBSAN_OPTIONS=print_stacktrace=1 tests/run.sh $B/test-results/asan $(addprefix $B/asan/tests/,$(TESTS))
test-tsan: $(addprefix $B/tsan/tests/,$(MT_TESTS))
	$(call phase,tsan: the thread tests (*_mt) under TSan) TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
	  tests/run.sh $B/test-results/tsan $(addprefix $B/tsan/tests/,$(MT_TESTS))

# ---- fuzzing (clang + libFuzzer) -------------------------------------------
FUZZERS := $(patsubst fuzz/%.c,%,$(filter-out fuzz/standalone.c,$(wildcard fuzz/fuzz_*.c)))
FUZZ_FLAGS := -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -DDRC_DEBUG
$B/fuzz/%: fuzz/%.c $(CORE_SRCS) $(HDRS) $(wildcard fuzz/*.h)
	@mkdir -p $(@D)
	$(call show,CLANG)$(CLANG) $(CPPFLAGS) -Ifuzz $(FUZZ_FLAGS) $(WARN) -Wno-unused-command-line-argument -o $@ $< $(CORE_SRCS) -ldl -lpthread
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
$B/fuzz-replay/%: fuzz/%.c fuzz/standalone.c $(call objs,$B/asan,$(CORE_SRCS)) $(wildcard fuzz/*.h)
	@mkdir -p $(@D)
	$(call show,CCLD)$(CC) $(CPPFLAGS) -Ifuzz -O1 -g $(WARN) $(ASAN) -DDRC_DEBUG -o $@ $< fuzz/standalone.c $(call objs,$B/asan,$(CORE_SRCS)) -ldl -lpthread
.PHONY: test-fuzz-replay
test-fuzz-replay: $(addprefix $B/fuzz-replay/,$(FUZZERS))
	$(call phase,fuzz replay: each fuzz target on its seed corpus under ASan+UBSan) : > $B/test-results/fuzz-replay && \
	for f in $(FUZZERS); do \
	  if ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 $B/fuzz-replay/$$f fuzz/corpus/$$f; \
	  then echo "$$f 1 0" >> $B/test-results/fuzz-replay; \
	  else echo "!! $$f failed on its corpus"; echo "$$f 0 1" >> $B/test-results/fuzz-replay; fi; \
	done
TEST_PHASES += test-fuzz-replay
include src/loopnic/loopnic.mk tests/e2e/e2e.mk src/tools/demo.mk tests/nics/nics.mk

# ---- the ABI: exported names = version script = DRC_API declarations (tests/abi/check_exports.sh) ----
# Each library with its version script and the headers that declare its names. A failure says
# which name to add to (or remove from) which file.
ABI_CHECKS := "$B/libdrc.so src/drc.map include/drc.h include/drc_verbs.h include/drc_cuda.h" \
              "$B/libdrc_host.so src/host/drc_host.map include/drc_host.h"
.PHONY: test-abi
test-abi: $B/libdrc.so $B/libdrc_host.so
	$(call phase,abi: exported names = version scripts = DRC_API declarations) : > $B/test-results/abi && \
	for c in $(ABI_CHECKS); do \
	  set -- $$c; \
	  if tests/abi/check_exports.sh $$c; then echo "abi-exports:$$1 1 0" >> $B/test-results/abi; \
	  else echo "abi-exports:$$1 0 1" >> $B/test-results/abi; fi; \
	done; \
	for h in $(wildcard include/*.h); do case ' $(ABI_CHECKS) ' in *" $$h"[\ \"]*) ;; \
	  *) echo "check_exports: $$h is in no check: add it to ABI_CHECKS in the Makefile, after its library"; \
	     echo "abi-headers:$$h 0 1" >> $B/test-results/abi;; esac; done
TEST_PHASES += test-abi

# ---- the PyTorch helper without torch, and loading drc late (issue 8, issue 9 item 7) ----
# tests/python: the package imports and finds libdrc with torch hidden; views register their own
# bytes; dropped caches and regions are destroyed/put. tests/pkg/test_late_load.sh: ctypes.CDLL of
# libdrc.so works (no jemalloc in it), libdrc_host.so with the documented workaround.
.PHONY: test-python test-late-load
test-python: $B/libdrc.so
	$(call phase,python: the PyTorch helper without torch) : > $B/test-results/python && \
	  DRC_LIB=$(abspath $B/libdrc.so) python3 tests/python/test_drc_torch.py $B/test-results/python
test-late-load: $B/libdrc.so $B/libdrc_host.so $B/libdrc.so.0 $B/libdrc_preload.so
	$(call phase,late load: libdrc loaded by ctypes) tests/pkg/test_late_load.sh $(abspath $B) $B/test-results/late-load
TEST_PHASES += test-python test-late-load

# ---- install, and consumers built against the installed tree (tests/pkg/test_install.sh) ----
# make install into a staging folder; a tiny program built with pkg-config and with CMake against it,
# and run; the Python package pip-installed from it; make uninstall. Needs `all` built first.
.PHONY: test-pkg test-deps
test-pkg: all
	$(call phase,install: consumers built against an installed tree) tests/pkg/test_install.sh $B $B/test-results/install
# plain make without a build dependency: names the Debian package, stops before compiling
test-deps:
	$(call phase,deps: what make names and installs) tests/pkg/test_deps.sh $B/test-results/deps
TEST_PHASES += test-pkg test-deps
# the README's front door as written: its two commands, its C example compiled, linked and run on the
# NIC model and without a NIC, its links (tests/pkg/test_readme.sh); the drc program's command line
.PHONY: test-readme test-cli
test-readme: $B/libdrc.so $B/loopnic/libibverbs.so.1
	$(call phase,readme: the README's commands and example) tests/pkg/test_readme.sh $B $B/test-results/readme
test-cli: $B/drc
	$(call phase,cli: the drc program's command line) tests/tools/test_cli.sh $B $B/test-results/cli
TEST_PHASES += test-readme test-cli

# ---- benchmarks ------------------------------------------------------------
BENCHES := $(patsubst tests/bench/%.c,%,$(wildcard tests/bench/bench_*.c))
$B/bench/%: tests/bench/%.c $B/libdrc.a $(wildcard tests/bench/*.h)
	@mkdir -p $(@D)
	$(call show,CCLD)$(CC) $(CPPFLAGS) $($*_CPPFLAGS) -O2 -g $(WARN) -o $@ $< $B/libdrc.a $($*_LDFLAGS) $(LDLIBS) -lm
# ---- bench_cache (drc vs UCX ucs_rcache) ----
# Against the system's UCX (Debian's libucx-dev), and, given UCX_PREFIX (an installed UCX: include/,
# lib/) or UCX_SRC (a UCX source tree, built and installed into $B/ucx by the ucx-src goal; nothing
# is fetched), also against that one: $B/bench/bench_cache_ucx, a third column of bench_cache
# (tests/bench/README.md). UCX_NAME names that column (default: its version).
UCX_API = $(shell sh tests/bench/ucx_api.sh '$(CC)' $1)
UCX_VERSION = $(shell $(if $1,PKG_CONFIG_LIBDIR=$1) pkg-config --modversion ucx 2>/dev/null)
bench_cache_LDFLAGS := -lucs -lucm
bench_misses_LDFLAGS := -lucs -lucm
bench_cache_CPPFLAGS = $(call UCX_API,) -DBENCH_UCX_NAME='"UCX $(call UCX_VERSION,)"'
bench_misses_CPPFLAGS = $(call UCX_API,)
ifneq ($(UCX_SRC),)
  ifeq ($(wildcard $(UCX_SRC)/src/ucs/memory/rcache.c),)
    $(error UCX_SRC=$(UCX_SRC) is not a UCX source tree)
  endif
UCX_PREFIX := $(abspath $B/ucx)
endif
ifneq ($(UCX_PREFIX),)
UCX_LIBDIR ?= $(patsubst %/,%,$(dir $(firstword $(wildcard $(UCX_PREFIX)/lib/libucs.so $(UCX_PREFIX)/lib64/libucs.so \
                $(UCX_PREFIX)/lib/*/libucs.so) $(UCX_PREFIX)/lib/libucs.so)))
UCX_NAME ?= $(or $(addprefix UCX ,$(call UCX_VERSION,$(UCX_LIBDIR)/pkgconfig)),UCX of $(UCX_PREFIX))
BENCH_UCX := $B/bench/bench_cache_ucx
# and bench_misses_ucx, its callgrind counts (bench-counts). Its headers are system headers: a newer
# UCX's own warnings do not fail the build.
BENCH_MISSES_UCX := $B/bench/bench_misses_ucx
$(BENCH_UCX) $(BENCH_MISSES_UCX): $B/bench/%_ucx: tests/bench/%.c $B/libdrc.a $(wildcard tests/bench/*.h) \
    $(if $(UCX_SRC),$B/ucx/.installed)
	@mkdir -p $(@D)
	$(CC) -isystem $(UCX_PREFIX)/include $(CPPFLAGS) $(call UCX_API,$(UCX_PREFIX)/include) -DBENCH_UCX_NAME='"$(UCX_NAME)"' \
	    -O2 -g $(WARN) -o $@ $< $B/libdrc.a -L$(UCX_LIBDIR) -Wl,-rpath,$(UCX_LIBDIR) -lucs -lucm $(UCX_LIBS) $(LDLIBS) -lm
endif
# A UCX source tree (a release tarball, or a git checkout with autotools installed), built out of
# tree into $B/ucx-build and installed into $B/ucx: release flags, no CUDA, no verbs (the rcache
# does not need them). Only what is in UCX_SRC is used.
$B/ucx/.installed: $(UCX_SRC)/configure.ac
	test -x '$(UCX_SRC)/configure' || (cd '$(UCX_SRC)' && ./autogen.sh)
	mkdir -p $B/ucx-build
	cd $B/ucx-build && '$(abspath $(UCX_SRC))/configure' --prefix='$(UCX_PREFIX)' --enable-optimizations \
	    --disable-logging --disable-debug --disable-assertions --disable-params-check --without-cuda \
	    --without-rocm --without-verbs --without-rdmacm --without-knem --without-xpmem --without-ugni \
	    --without-java --without-go --disable-doxygen-doc
	$(MAKE) -C $B/ucx-build -j2 install
	touch $@
.PHONY: ucx-src
ucx-src: $(if $(UCX_SRC),$B/ucx/.installed)
bench: $(addprefix $B/bench/,$(BENCHES)) $(BENCH_UCX)
	@set -e; for b in $(addprefix $B/bench/,$(BENCHES)); do echo "== $$b"; \
	    if [ $$b = $B/bench/bench_cache ]; then $$b $(BENCH_UCX); else $$b; fi; done
# instructions and L2 misses per operation, drc and UCX (and the second UCX), under callgrind
# (tests/bench/RESULTS.md)
.PHONY: bench-counts bench-profile
bench-counts: $B/bench/bench_misses $(BENCH_MISSES_UCX)
	sh tests/bench/counts.sh $B $(if $(BENCH_MISSES_UCX),'$(BENCH_MISSES_UCX)' '$(UCX_NAME)')
# drc's invalidation by function and part under callgrind (tests/bench/RESULTS.md, "Where a free event goes")
bench-profile: $B/bench/bench_misses
	sh tests/bench/profile.sh $B

# ---- the preload library (src/preload/): libdrc_preload.so, linking libdrc.so.0 ----
# One library, its parts chosen by DRC_PRELOAD (cuda, host, verbs; preload.c). It never brings
# libdrc_host: that needs jemalloc, and Debian's libjemalloc exports malloc, so preloading it would
# replace the malloc of every process it is loaded into. libdrc_hook.so and libdrc_verbs.so are links to it: preloading both loads it
# once (an interposer must be the preloaded object itself, not a dependency of it). The same library is also built at -O0 without sibling calls
# (build/O0/), and the preload test runs against both: RTLD_NEXT must not depend on tail calls.
PRELOAD_SRCS := $(wildcard src/preload/*.c)
# the verbs front (src/preload/preload_verbs*.c), which a test build leaves out and test_verbs_preload links
PRELOAD_VERBS_SRCS := $(filter src/preload/preload_verbs%.c,$(PRELOAD_SRCS))
PRELOAD_LINK  = -shared $(LDFLAGS) -Wl,-soname,libdrc_preload.so -Wl,-rpath,'$$ORIGIN' -Wl,--no-as-needed
$B/libdrc_preload.so: $(call objs,$B,$(PRELOAD_SRCS)) $B/libdrc.so.0
	$(call show,CCLD)$(CC) $(PRELOAD_LINK) -o $@ $(filter %.o,$^) -L$B -l:libdrc.so.0 $(LDLIBS)
$B/libdrc_hook.so $B/libdrc_verbs.so: $B/libdrc_preload.so
	$(Q)ln -sf libdrc_preload.so $@
$B/O0/obj/%.o: src/%.c $(HDRS)
	@mkdir -p $(@D)
	$(call show,CC)$(CC) $(CPPFLAGS) -O0 -g -fno-optimize-sibling-calls $(WARN) $(PICFLAGS) -c $< -o $@
$B/O0/libdrc.so.0: $B/libdrc.so
	@mkdir -p $(@D)
	$(Q)ln -sf ../libdrc.so $@
$B/O0/libdrc_preload.so: $(call objs,$B/O0,$(PRELOAD_SRCS)) $B/O0/libdrc.so.0
	$(call show,CCLD)$(CC) $(PRELOAD_LINK) -o $@ $(filter %.o,$^) -L$B/O0 -l:libdrc.so.0 $(LDLIBS)
$B/O0/libdrc_hook.so: $B/O0/libdrc_preload.so
	$(Q)ln -sf libdrc_preload.so $@
all: $B/libdrc_preload.so $B/libdrc_hook.so $B/libdrc_verbs.so $B/O0/libdrc_hook.so
# THE CUDA double (tests/doubles/fake_libcuda.c, no GPU in CI): a fake libcuda.so.1, linked by the
# in-process tests of tests/cuda and tests/verbs (the folder rule: test_link_cuda, test_link_verbs), by
# the preload test's child, and found on LD_LIBRARY_PATH by the engine test (the same file again under
# build/engine/fakecuda).
# The programs the preload test runs under LD_PRELOAD are built without sanitizers (ASan does not
# mix with preloading another library).
$B/fakecuda/libcuda.so.1: tests/doubles/fake_libcuda.c tests/doubles/fake_libcuda.h
	@mkdir -p $(@D)
	$(call show,LD)$(CC) $(CPPFLAGS) -Itests/doubles -O1 -g $(WARN) -fPIC -shared -Wl,-soname,libcuda.so.1 -o $@ $< -lpthread
$B/engine/fakecuda/libcuda.so.1: $B/fakecuda/libcuda.so.1
	@mkdir -p $(@D)
	$(call show,CP)cp $< $@
FAKECUDA_LINK = -L$B/fakecuda -l:libcuda.so.1 -Wl,-rpath,'$$ORIGIN/../../fakecuda:$$ORIGIN/../../../fakecuda'
test_link_cuda = $(FAKECUDA_LINK)
test_deps_cuda := $B/fakecuda/libcuda.so.1
# tests/verbs: the CUDA double too, and THE verbs double, the loopback provider, which the tests dlopen
# and install as drc's verbs ops table (tests/verbs/verbs_double.h).
test_link_verbs = $(FAKECUDA_LINK)
test_deps_verbs := $B/fakecuda/libcuda.so.1 $B/loopnic/libibverbs.so.1
$B/fakecuda/libcupti.so: tests/hooks/fake_cupti.c
	@mkdir -p $(@D)
	$(call show,LD)$(CC) $(CPPFLAGS) -O1 -g $(WARN) -fPIC -shared -o $@ $< -ldl
$B/hooktest/hook_child: tests/hooks/hook_child.c tests/doubles/fake_libcuda.h $B/libdrc.a $B/fakecuda/libcuda.so.1
	@mkdir -p $(@D)
	$(call show,CCLD)$(CC) $(CPPFLAGS) -Itests/doubles -O1 -g $(WARN) -o $@ $< $B/libdrc.a -L$B/fakecuda -l:libcuda.so.1 \
	  -Wl,-rpath,'$$ORIGIN/../fakecuda' $(LDLIBS)
# hook_child's "rtld-default" mode: a library it loads RTLD_LOCAL, which looks up a symbol of its own
# dependency with dlsym(RTLD_DEFAULT) (tests/hooks/rtld_local.c)
$B/hooktest/librtld_dep.so: tests/hooks/rtld_local.c tests/hooks/rtld_dep.map
	@mkdir -p $(@D)
	$(call show,LD)$(CC) -DRTLD_LOCAL_DEP -O1 -g $(WARN) -fPIC -shared -Wl,--version-script=tests/hooks/rtld_dep.map -o $@ $<
$B/hooktest/librtld_user.so: tests/hooks/rtld_local.c $B/hooktest/librtld_dep.so
	$(call show,LD)$(CC) $(CPPFLAGS) -O1 -g $(WARN) -fPIC -shared -o $@ $< -L$(@D) -l:librtld_dep.so -Wl,-rpath,'$$ORIGIN' -ldl
$B/hooktest/hook_child: $B/hooktest/librtld_user.so
# The verbs front's seam (drc__preload_verbs_symbol), stood in for: the preload without
# preload_verbs.c, plus tests/hooks/verbs_standin.c, which serves ibv_dereg_mr.
$B/hooktest/standin/libdrc_preload.so: $(call objs,$B,$(filter-out $(PRELOAD_VERBS_SRCS),$(PRELOAD_SRCS))) \
                                       tests/hooks/verbs_standin.c $B/libdrc.so
	@mkdir -p $(@D)
	$(call show,CC)$(CC) $(CPPFLAGS) -O1 -g $(WARN) $(PICFLAGS) -c tests/hooks/verbs_standin.c -o $(@D)/verbs_standin.o
	$(Q)ln -sf ../../libdrc.so $(@D)/libdrc.so.0
	$(call show,CCLD)$(CC) $(PRELOAD_LINK) -o $@ $(filter %.o,$^) $(@D)/verbs_standin.o -L$(@D) -l:libdrc.so.0 $(LDLIBS)
# hook_child's "dlsym-race" mode: objects that call dlsym, 4 drc-like (exporting drc_notify_free) and 4
# ordinary ones, copies of tests/hooks/dlsym_caller.c; and the preload with from_drc's windows widened
# (DRC_PRELOAD_RACE_WINDOW, tests/hooks/race_window.c), so that a torn answer shows in a few thousand calls.
$B/hooktest/caller/drc.so: tests/hooks/dlsym_caller.c
	@mkdir -p $(@D)
	$(call show,LD)$(CC) -DDRC_LIKE -O1 -g -fno-optimize-sibling-calls $(WARN) -fPIC -shared -o $@ $< -ldl
$B/hooktest/caller/app.so: tests/hooks/dlsym_caller.c
	@mkdir -p $(@D)
	$(call show,LD)$(CC) -O1 -g -fno-optimize-sibling-calls $(WARN) -fPIC -shared -o $@ $< -ldl
RACE_CALLERS := $(foreach i,0 1 2 3,$B/hooktest/caller/drc$i.so $B/hooktest/caller/app$i.so)
$B/hooktest/caller/drc%.so: $B/hooktest/caller/drc.so
	$(call show,CP)cp $< $@
$B/hooktest/caller/app%.so: $B/hooktest/caller/app.so
	$(call show,CP)cp $< $@
$B/hooktest/race/libdrc_preload.so: $(call objs,$B,$(filter-out src/preload/preload.c,$(PRELOAD_SRCS))) \
                                    src/preload/preload.c tests/hooks/race_window.c $B/libdrc.so $(HDRS)
	@mkdir -p $(@D)
	$(call show,CCLD)$(CC) $(CPPFLAGS) $(CFLAGS) $(WARN) $(PICFLAGS) '-DDRC_PRELOAD_RACE_WINDOW()=drc__test_race_window()' \
	  -c src/preload/preload.c -o $(@D)/preload.o
	$(call show,CC)$(CC) $(CPPFLAGS) -O1 -g $(WARN) $(PICFLAGS) -c tests/hooks/race_window.c -o $(@D)/race_window.o
	$(Q)ln -sf ../../libdrc.so $(@D)/libdrc.so.0
	$(call show,CCLD)$(CC) $(PRELOAD_LINK) -o $@ $(filter %.o,$^) $(@D)/preload.o $(@D)/race_window.o -L$(@D) -l:libdrc.so.0 $(LDLIBS)
# what the preload tests run (tests/preload: test_hook_preload's programs, libraries and doubles)
test_deps_preload := $B/libdrc_preload.so $B/libdrc_hook.so $B/libdrc_verbs.so $B/O0/libdrc_hook.so $B/hooktest/hook_child \
  $B/hooktest/standin/libdrc_preload.so $B/fakecuda/libcupti.so $B/hooktest/race/libdrc_preload.so $(RACE_CALLERS)

# ---- transfer-engine interposer (issue 5): the verbs front of libdrc_preload.so, its doubles ----
# DOUBLES (no NIC, no GPU in CI): libibverbs.so.1 is the loopback provider with its record
# ($B/loopnic, src/loopnic/loopnic.mk), libcuda.so.1 the one CUDA double (tests/doubles), both found by
# the test through LD_LIBRARY_PATH; and the programs run under the preload.
$B/engine/engine_child: tests/engine/engine_child.c src/loopnic/loopnic_record.h tests/doubles/fake_libcuda.h \
                        $B/loopnic/libibverbs.so.1
	@mkdir -p $(@D)
	$(call show,CCLD)$(CC) $(CPPFLAGS) -Itests/engine -Isrc/loopnic -Itests/loopnic -O1 -g $(WARN) -o $@ $< -L$B/loopnic -l:libibverbs.so.1 -ljemalloc -ldl
# tent_child links no libibverbs: it dlopens it RTLD_LOCAL and dlsyms every call, as TENT and NCCL do.
$B/engine/tent_child: tests/engine/tent_child.c src/loopnic/loopnic_record.h
	@mkdir -p $(@D)
	$(call show,CCLD)$(CC) $(CPPFLAGS) -Itests/engine -Isrc/loopnic -Itests/loopnic -O1 -g $(WARN) -o $@ $< -ldl
# The preload tests run these too (test_verbs_preload, test_config_preload: the engine programs, and the
# provider's preloadable build as an object that defines ibv_reg_mr ahead of drc).
test_deps_preload += $B/libdrc_host.so.0 $B/engine/engine_child $B/engine/tent_child $B/engine/fakecuda/libcuda.so.1 \
  $B/loopnic/libibverbs.so.1 $B/loopnic/libloopnic.so
# test_verbs_preload links the verbs front's objects (src/preload/preload_verbs*.c) itself, to test
# drc__preload_verbs_symbol (the dlsym seam).
preload/test_verbs_preload_LDFLAGS = $(call objs,$(patsubst %/tests/preload,%,$(@D)),$(PRELOAD_VERBS_SRCS))
$(foreach f,$B $B/asan $B/tsan,$(eval $f/tests/preload/test_verbs_preload: $(call objs,$f,$(PRELOAD_VERBS_SRCS))))
# test_cache_alloc: an allocator that re-enters drc from inside the library's allocations (issue 9 item 5).
core/test_cache_alloc_LDFLAGS := -Wl,--wrap=aligned_alloc,--wrap=calloc,--wrap=free,--wrap=mmap,--wrap=munmap,--wrap=madvise
# test_arena: madvise seen (what was advised where), and refused on demand as where THP is compiled out.
core/test_arena_LDFLAGS := -Wl,--wrap=madvise
# test_driver_load: the searches for libcuda.so.1 counted (made when a cache is created, never in a miss)
cuda/test_driver_load_LDFLAGS := -Wl,--wrap=dlopen
bench_engine_LDFLAGS := -libverbs
# bench_notify frees through the wrapper over THE CUDA double (the GPU build links it too: tests/gpu/hooks.mk)
bench_notify_LDFLAGS = -L$B/fakecuda -l:libcuda.so.1 -Wl,-rpath,'$$ORIGIN/../fakecuda'
$B/bench/bench_notify: $B/fakecuda/libcuda.so.1
$B/bench/bench_engine: $B/loopnic/libibverbs.so.1 $B/engine/fakecuda/libcuda.so.1
bench_preload_hit_LDFLAGS := -libverbs -ldl
$B/bench/bench_preload_hit: $B/loopnic/libibverbs.so.1 $B/engine/fakecuda/libcuda.so.1 $B/libdrc_verbs.so

# ---- the demo and the doctor -----------------------------------------------
demo: $B/drc
	$B/drc demo
	$B/drc doctor

# ---- GPU tests (run on a machine with CUDA; see tests/gpu/README) -------------
test-gpu:
	$(MAKE) -C tests/gpu B=$(abspath $B)
# the GPU programs built, not run: CI and the development machine have the CUDA toolkit but no GPU,
# so that a build error never waits for the GPU machine
build-gpu:
	$(MAKE) -C tests/gpu B=$(abspath $B) all hooks e2e torch-e2e

# ---- install, uninstall ----------------------------------------------------
# Headers, libdrc (.so.0 and .a), libdrc_host, the pkg-config and CMake files, the drc program, the
# preload libraries that were built, and the Python package's files (pip installs them from there).
# Distributions: make WERROR= install DESTDIR=... PREFIX=/usr [LIBDIR=/usr/lib/x86_64-linux-gnu].
PRELOAD_LIBS := $B/libdrc_preload.so $B/libdrc_hook.so $B/libdrc_verbs.so
PY_DIR       := $(DATADIR)/drc/python
D            := $(DESTDIR)
install: all
	install -d $D$(INCLUDEDIR) $D$(LIBDIR)/pkgconfig $D$(CMAKEDIR) $D$(BINDIR) $D$(PY_DIR)/drc_torch
	install -m 644 $(wildcard include/*.h) $D$(INCLUDEDIR)/
	install -m 644 $B/libdrc.a $D$(LIBDIR)/
	install -m 755 $B/libdrc.so.$(VERSION) $B/libdrc_host.so.$(VERSION) $D$(LIBDIR)/
	ln -sf libdrc.so.$(VERSION) $D$(LIBDIR)/libdrc.so.0
	ln -sf libdrc.so.0 $D$(LIBDIR)/libdrc.so
	ln -sf libdrc_host.so.$(VERSION) $D$(LIBDIR)/libdrc_host.so.0
	ln -sf libdrc_host.so.0 $D$(LIBDIR)/libdrc_host.so
	install -m 755 $B/libdrc_preload.so $D$(LIBDIR)/
	ln -sf libdrc_preload.so $D$(LIBDIR)/libdrc_hook.so
	ln -sf libdrc_preload.so $D$(LIBDIR)/libdrc_verbs.so
	install -m 644 $B/pkg/drc.pc $B/pkg/drc_host.pc $D$(LIBDIR)/pkgconfig/
	install -m 644 $B/pkg/drcConfig.cmake $B/pkg/drcConfigVersion.cmake $D$(CMAKEDIR)/
	install -m 755 $B/drc $D$(BINDIR)/
	install -m 644 src/python/pyproject.toml src/python/drc_build.py $D$(PY_DIR)/
	install -m 644 src/python/drc_torch/*.py $D$(PY_DIR)/drc_torch/
	@echo "drc: installed in $D$(PREFIX). The PyTorch helper: python3 -m pip install $(PY_DIR)"

uninstall:
	rm -f $(addprefix $D$(INCLUDEDIR)/,$(notdir $(wildcard include/*.h)))
	rm -f $(addprefix $D$(LIBDIR)/,libdrc.a libdrc.so libdrc.so.0 libdrc.so.$(VERSION) libdrc_host.so libdrc_host.so.0 \
	  libdrc_host.so.$(VERSION) $(notdir $(PRELOAD_LIBS)))
	rm -f $D$(LIBDIR)/pkgconfig/drc.pc $D$(LIBDIR)/pkgconfig/drc_host.pc $D$(BINDIR)/drc
	rm -f $D$(CMAKEDIR)/drcConfig.cmake $D$(CMAKEDIR)/drcConfigVersion.cmake
	rm -rf $D$(PY_DIR)
	-rmdir $D$(CMAKEDIR) $D$(DATADIR)/drc 2>/dev/null


clean:
	rm -rf $B

.SECONDARY:

# ---- the folder rules of the unit tests, now that every test_deps_<folder> is set ----
$(foreach d,$(TEST_DIRS),$(eval $(call test_rules,$B,,$d)))
$(foreach d,$(TEST_DIRS),$(eval $(call test_rules,$B/asan,$(ASAN) -DDRC_DEBUG,$d)))
$(foreach d,$(TEST_DIRS),$(eval $(call test_rules,$B/tsan,$(TSAN) -DDRC_DEBUG,$d)))

# ---- make test: every phase, then the summary ----
test: $(TEST_PHASES)
	@tests/summary.sh $B/test-results
$(TEST_PHASES): | $(TEST_RESULTS_RESET)
