# ---- invalidation hooks (issue 4): included by tests/gpu/Makefile ----
# test_hooks_gpu twice (nvcc's default static cudart, and -cudart shared), and libdrc_torch.so:
# libdrc without jemalloc, position-independent, for PyTorch's CUDAPluggableAllocator.
NVCC ?= $(CUDA)/bin/nvcc
HOOK_DRC_SRCS := $(DRC_SRCS) cuda/wrappers.c cuda/torch.c
HOOK_DRC_OBJS := $(addprefix $(O)/obj/,$(HOOK_DRC_SRCS:.c=.o))
HOOK_PIC_OBJS := $(addprefix $(O)/pic/,$(HOOK_DRC_SRCS:.c=.o))

$(O)/test_hooks_gpu_static: test_hooks_gpu.c gpu.h recbackend.h $(HOOK_DRC_OBJS)
	$(NVCC) -D_GNU_SOURCE -I$(CUDA)/include -I$(TOP)/include -I$(TOP)/src -I. -Xcompiler -Wall -o $@ $< $(HOOK_DRC_OBJS) -lcuda $(LIBS)
$(O)/test_hooks_gpu_shared: test_hooks_gpu.c gpu.h recbackend.h $(HOOK_DRC_OBJS)
	$(NVCC) -cudart shared -D_GNU_SOURCE -I$(CUDA)/include -I$(TOP)/include -I$(TOP)/src -I. -Xcompiler -Wall -o $@ $< $(HOOK_DRC_OBJS) -lcuda $(LIBS)
# issue 13: the runtime API on two GPUs (cudaFree after cudaSetDevice, cudaDeviceReset of the current device)
$(O)/test_multi_rt_gpu: test_multi_rt_gpu.c gpu.h recbackend.h $(HOOK_DRC_OBJS)
	$(NVCC) -D_GNU_SOURCE -I$(CUDA)/include -I$(TOP)/include -I$(TOP)/src -I. -Xcompiler -Wall -o $@ $< $(HOOK_DRC_OBJS) -lcuda $(LIBS)
$(O)/pic/%.o: $(TOP)/src/%.c $(wildcard $(TOP)/src/*/*.h) $(wildcard $(TOP)/include/*.h)
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) $(CFLAGS) -fPIC -fvisibility=hidden -c $< -o $@
$(O)/libdrc_torch.so: $(HOOK_PIC_OBJS) $(TOP)/src/drc.map
	$(CC) -shared -Wl,--version-script=$(TOP)/src/drc.map -o $@ $(HOOK_PIC_OBJS) $(LIBS)

# bench_notify times drc over THE CUDA double (tests/doubles), not over a driver, here as on the
# CPU: the double is built as $(O)/fakecuda/libcuda.so.1 and linked in place of -lcuda, found through
# DT_RPATH (searched before LD_LIBRARY_PATH, which on a GPU machine names the real driver's folder).
$(O)/fakecuda/libcuda.so.1: $(TOP)/tests/doubles/fake_libcuda.c $(TOP)/tests/doubles/fake_libcuda.h
	@mkdir -p $(@D)
	$(CC) -D_GNU_SOURCE -I$(TOP)/tests/doubles $(CFLAGS) -fPIC -shared -Wl,-soname,libcuda.so.1 -o $@ $< -lpthread
$(O)/bench_notify: ../bench/bench_notify.c $(HOOK_DRC_OBJS) $(O)/fakecuda/libcuda.so.1
	$(CC) $(CPPFLAGS) $(CFLAGS) -o $@ $< $(HOOK_DRC_OBJS) -L$(O)/fakecuda -l:libcuda.so.1 -Wl,--disable-new-dtags,-rpath,'$$ORIGIN/fakecuda' $(LIBS)

.PHONY: hooks
hooks: $(O)/test_hooks_gpu_static $(O)/test_hooks_gpu_shared $(O)/libdrc_torch.so $(O)/bench_notify $(O)/test_multi_rt_gpu
