/*
 * A DOUBLE of libcuda.so.1 for the interposer's tests (no GPU in CI): built as
 * build/engine/fakecuda/libcuda.so.1 and found through LD_LIBRARY_PATH.
 *
 * "Device memory" is address space the fake reserves (PROT_NONE, never
 * touched), handed out 2 MiB-aligned by cuMemAlloc_v2 with a fresh buffer id
 * each time; freed space is reused first, so a new allocation of the same
 * size gets the same address, as with the real driver. It answers what drc's
 * cuda.c asks: cuPointerGetAttributes (device memory of device 0 in one
 * context; zeros and success for other pointers, as the driver does),
 * cuMemGetAddressRange_v2, cuMemGetHandleForAddressRange (a memfd of the
 * range's size standing for the dmabuf; host-page alignment required and the
 * PCIe mapping flag refused, as on the H200 machine), contexts, device
 * attributes (DMA_BUF_SUPPORTED = 1). Thread-safe.
 */
#ifndef FAKE_LIBCUDA_H
#define FAKE_LIBCUDA_H

/* dmabuf exports made so far (a test-only symbol: absent from the real driver). */
unsigned fakecu_exports(void);

#endif
