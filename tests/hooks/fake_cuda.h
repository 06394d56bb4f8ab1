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

int cuMemAlloc_v2(unsigned long long *dptr, size_t size);
int cuMemGetAddressRange_v2(unsigned long long *base, size_t *size, unsigned long long dptr);
int cuMemFree_v2(unsigned long long dptr);
int cuMemFreeAsync(unsigned long long dptr, void *stream);
int cuMemFreeAsync_ptsz(unsigned long long dptr, void *stream);
int cuMemUnmap(unsigned long long ptr, size_t size);
int cuGetProcAddress(const char *symbol, void **pfn, int version, unsigned long long flags);
int cuGetProcAddress_v2(const char *symbol, void **pfn, int version, unsigned long long flags, int *status);

#endif
