/*
 * The CUDA entry points that the free wrappers (hooks.c) and the PyTorch
 * allocator (torch.c) call, as one table.
 *
 * Contract: drc__hooks_driver() never returns NULL. On first use it opens
 * libcuda.so.1 with dlopen (nothing links against it) and fills in what it
 * finds; an entry is NULL when the driver or that symbol is missing, and
 * every caller checks. The runtime entries (rt_free, rt_free_async) are the
 * cudaFree/cudaFreeAsync the dynamic linker can see (a shared libcudart, or
 * an executable linked with -rdynamic); they stay NULL under a static runtime
 * and are looked up again on each use until found. Tests install a fake with
 * drc__hooks_set_driver() — the same table the real driver fills in.
 *
 * Every driver entry returns a CUresult (0 = CUDA_SUCCESS) and takes the
 * arguments of the driver function named beside it; the types are spelled
 * out here so that drc builds without the CUDA headers.
 *
 * (This table is the hooks' own until cuda.c's struct drc__cuda_driver has
 * the same entries; then it becomes a view of that one.)
 */
#ifndef DRC_HOOKS_H
#define DRC_HOOKS_H

#include <stddef.h>
#include <stdint.h>

#include "drc_cuda.h"
#include "cuda/cuda.h"

typedef unsigned long long drc__cuptr;     /* CUdeviceptr */

/* CUmemAccessDesc, laid out as in cuda.h (CUmemAllocationProp is struct drc__cuda_alloc_prop). */
struct drc__cu_access_desc {
    struct drc__cuda_location location;
    int flags;                              /* CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3 */
};

enum {
    DRC__CU_ATTR_VMM_SUPPORTED = 102,       /* CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED */
    DRC__CU_GRANULARITY_RECOMMENDED = 1,
};

struct drc__hook_driver {
    /* the frees and the lookup of an allocation's bounds */
    int (*mem_get_address_range)(drc__cuptr *base, size_t *size, drc__cuptr dptr);  /* cuMemGetAddressRange_v2 */
    int (*mem_free)(drc__cuptr dptr);                                               /* cuMemFree_v2 */
    int (*mem_free_async)(drc__cuptr dptr, void *stream);                           /* cuMemFreeAsync */
    int (*mem_unmap)(drc__cuptr ptr, size_t size);                                  /* cuMemUnmap */
    int (*mem_release)(unsigned long long handle);                                  /* cuMemRelease */
    int (*ctx_synchronize)(void);                                                   /* cuCtxSynchronize */
    /* the runtime's frees: cudaError_t, NULL unless visible to the dynamic linker */
    int (*rt_free)(void *ptr);
    int (*rt_free_async)(void *ptr, void *stream);
    /* what drc_torch_malloc needs */
    int (*ctx_get_current)(void **ctx);                                             /* cuCtxGetCurrent */
    int (*ctx_set_current)(void *ctx);                                              /* cuCtxSetCurrent */
    int (*device_get)(int *dev, int ordinal);                                       /* cuDeviceGet */
    int (*device_get_attribute)(int *value, int attr, int dev);                     /* cuDeviceGetAttribute */
    int (*primary_ctx_retain)(void **ctx, int dev);                                 /* cuDevicePrimaryCtxRetain */
    int (*mem_alloc)(drc__cuptr *dptr, size_t size);                                /* cuMemAlloc_v2 */
    int (*mem_get_granularity)(size_t *g, const struct drc__cuda_alloc_prop *p, int option);
    int (*mem_create)(unsigned long long *handle, size_t size, const struct drc__cuda_alloc_prop *p,
                      unsigned long long flags);                                    /* cuMemCreate */
    int (*mem_address_reserve)(drc__cuptr *ptr, size_t size, size_t align, drc__cuptr addr,
                               unsigned long long flags);                           /* cuMemAddressReserve */
    int (*mem_address_free)(drc__cuptr ptr, size_t size);                           /* cuMemAddressFree */
    int (*mem_map)(drc__cuptr ptr, size_t size, size_t offset, unsigned long long handle,
                   unsigned long long flags);                                       /* cuMemMap */
    int (*mem_set_access)(drc__cuptr ptr, size_t size, const struct drc__cu_access_desc *d,
                          size_t count);                                            /* cuMemSetAccess */
    int (*mem_retain_allocation_handle)(unsigned long long *handle, void *addr);    /* cuMemRetainAllocationHandle */
    int (*stream_synchronize)(void *stream);                                        /* cuStreamSynchronize */
};

/* The table (see the contract above). Thread-safe; loads the driver once. */
const struct drc__hook_driver *drc__hooks_driver(void);

/* Replace the table with @d (copied), or with the real driver again for NULL. Tests only. */
void drc__hooks_set_driver(const struct drc__hook_driver *d);

/*
 * Begin the free of the whole allocation containing @dptr (its bounds from
 * mem_get_address_range): drc__notify_begin() on it, or nothing when no
 * cache exists. When the bounds cannot be found, the first byte is used, so
 * at least every region containing @dptr goes. Returns the ticket to pass to
 * drc__notify_end() once the real free has returned. The frees of hooks.c
 * and torch.c are: ticket = begin; real free; end(ticket).
 */
int drc__hooks_begin_free(const struct drc__hook_driver *d, drc__cuptr dptr);

#endif
