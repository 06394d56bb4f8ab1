# ---- the end-to-end suite on real GPU memory (issue 10): included by tests/gpu/Makefile ----
# e2e_gpu links the system's libibverbs and runs on the loopback provider (LD_LIBRARY_PATH, e2e.sh);
# -cudart shared, so that drc's cudaFree wrappers find the runtime's.
$(O)/e2e_gpu: e2e_gpu.c gpu.h $(TOP)/src/loopnic/loopnic.h $(TOP)/tests/loopnic/rcqp.h $(HOOK_DRC_OBJS)
	$(NVCC) -cudart shared -I$(CUDA)/include -I$(TOP)/include -I$(TOP)/src -I$(TOP)/src/loopnic -I$(TOP)/tests/loopnic -I. -Xcompiler -Wall,-Wextra \
	  -o $@ $< $(HOOK_DRC_OBJS) -lcuda $(LIBS)
.PHONY: e2e
e2e: $(O)/e2e_gpu
hooks: $(O)/e2e_gpu
# the NIC side of the PyTorch end to end (test_torch_e2e_gpu.py, loaded with ctypes): QPs and a staging buffer
$(O)/libe2e_nic.so: e2e_nic.c $(TOP)/src/loopnic/loopnic.h $(TOP)/tests/loopnic/rcqp.h
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) -I$(TOP)/src/loopnic -I$(TOP)/tests/loopnic $(CFLAGS) -fPIC -shared -o $@ $< $(LIBS)
.PHONY: torch-e2e
torch-e2e: $(O)/libe2e_nic.so $(O)/libdrc_torch.so
e2e: $(O)/libe2e_nic.so
