/*
 * A double of libcuda.so.1 for the hook library's test: there is no GPU in
 * CI. Built as build/fakecuda/libcuda.so.1. "Device memory" is anonymous
 * host memory (mmap) with a table of allocations, so cuMemGetAddressRange
 * answers as the driver would; every free calls the test's callback first,
 * while the memory is still allocated, so the test can check what drc did
 * before the memory went. cuGetProcAddress(_v2) answers the way the driver
 * does for the entry points the CUDA runtime asks for. Not thread-safe.
 */
#ifndef FAKE_CUDA_H
#define FAKE_CUDA_H

#include <stddef.h>
#include <stdint.h>

typedef void fake_cuda_free_cb(uintptr_t ptr, size_t len, const char *entry, void *arg);

/* Call @cb inside every free, before the memory is released. */
void fake_cuda_on_free(fake_cuda_free_cb *cb, void *arg);

/* Frees that reached the fake driver, by any entry point. */
unsigned fake_cuda_frees(void);

/*
 * From now on cuMemGetAddressRange fails with CUDA_ERROR_INVALID_CONTEXT (201)
 * in a thread with no current context, as the driver does; every allocation
 * belongs to one context, FAKE_CUDA_CTX, which no thread has current at first.
 */
void fake_cuda_needs_context(int on);
#define FAKE_CUDA_CTX ((void *)0xc7c7)

/*
 * Besides the frees, the fake answers what drc's CUDA layer asks, so that
 * drc classifies its memory as CUDA memory of device 0 and exports it (the
 * dmabuf is an fd of /dev/null): cuPointerGetAttributes/cuPointerGetAttribute,
 * contexts, cuMemGetHandleForAddressRange. cuMemAllocHost memory is pinned
 * host memory. cuDevicePrimaryCtxReset_v2 and cuCtxDestroy_v2 free every
 * allocation (each through the callback).
 */
int cuMemAllocHost_v2(void **p, size_t size);
int cuMemFreeHost(void *p);
int cuDevicePrimaryCtxReset_v2(int dev);

int cuMemAlloc_v2(unsigned long long *dptr, size_t size);
int cuMemGetAddressRange_v2(unsigned long long *base, size_t *size, unsigned long long dptr);
int cuMemFree_v2(unsigned long long dptr);
int cuMemFreeAsync(unsigned long long dptr, void *stream);
int cuMemFreeAsync_ptsz(unsigned long long dptr, void *stream);
int cuMemUnmap(unsigned long long ptr, size_t size);
int cuGetProcAddress(const char *symbol, void **pfn, int version, unsigned long long flags);
int cuGetProcAddress_v2(const char *symbol, void **pfn, int version, unsigned long long flags, int *status);

#endif
