/*
 * The CUDA driver as drc sees it (cuda.c). libcuda.so.1 is opened with
 * dlopen on first use; nothing links against it. Tests install a fake table
 * with drc__cuda_set_driver() — the same table the real driver fills in.
 *
 * (Skeleton written with the core; the CUDA issue fills in the table.)
 */
#ifndef DRC_CUDA_H
#define DRC_CUDA_H

#include <stddef.h>
#include <stdint.h>

/*
 * The allocation containing @addr (cuMemGetAddressRange): 0 with *base and
 * *len, or -ENOENT when @addr is not CUDA device memory or no driver is
 * loaded. Safe from any thread; allocates nothing after the first call.
 */
int drc__cuda_alloc_range(uintptr_t addr, uintptr_t *base, size_t *len);

#endif
