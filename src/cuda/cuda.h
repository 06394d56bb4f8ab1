/*
 * The CUDA layer as the rest of drc sees it: the one table of driver entry
 * points (driver.c), memory (memory.c: classify, export, validate, the bounds
 * of an allocation), and the one routine that turns a free, an unmap or a
 * context teardown into drc__notify_begin/end (free.c).
 *
 * The table. libcuda.so.1 is opened with dlopen once, by driver.c, on the
 * first call of drc__cuda_driver(); nothing links against it and no other
 * file of drc opens it. Tests install a fake with drc__cuda_set_driver() —
 * the same table the real driver fills in.
 *
 * Contract of the table: each driver entry has the ABI of the driver function
 * it is named after (CUresult is an int, CUdeviceptr an unsigned long long,
 * CUdevice an int, CUcontext/CUstream a pointer), returns 0 (CUDA_SUCCESS) or
 * a CUresult, and may be called from any thread. cuMemAlloc, cuMemFree,
 * cuMemGetAddressRange, cuMemFreeHost, cuMemHostUnregister, cuCtxDestroy,
 * cuDevicePrimaryCtxRelease/Reset and cuDevicePrimaryCtxRetain are the
 * entry points of CUDA 12 (the _v2 ones where a _v2 exists). The frees
 * (frees.h, the one list of them) are never NULL: where the driver lacks one,
 * a stub stands in that answers CUDA_ERROR_NOT_INITIALIZED. Any other entry
 * may be NULL where the driver lacks it: every caller checks those it uses;
 * drc__cuda_can_export() says whether the ones classification and export
 * need are all there. The runtime entries (cudaFree ...) return a
 * cudaError_t; the real table finds them with dlsym(RTLD_DEFAULT) on use
 * (drc__cuda_runtime()), so they stay NULL under a static runtime.
 */
#ifndef DRC_CUDA_LAYER_H
#define DRC_CUDA_LAYER_H

#include <stddef.h>
#include <stdint.h>

#include "core/mem.h"
#include "cuda/frees.h"
#include "drc.h"   /* DRC_API: the few names libdrc_preload.so needs are exported under DRC_PRIVATE (drc.map) */

/* The CUDA constants drc uses, from cuda.h and cuda_runtime_api.h (CUDA 11.7 - 13): here and nowhere else. */
enum {
    DRC__CUDA_SUCCESS = 0,
    DRC__CUDA_ERROR_INVALID_VALUE = 1,
    DRC__CUDA_ERROR_OUT_OF_MEMORY = 2,
    DRC__CUDA_ERROR_NOT_INITIALIZED = 3,
    DRC__CUDA_ERROR_DEINITIALIZED = 4,
    DRC__CUDA_ERROR_STUB_LIBRARY = 34,
    DRC__CUDA_ERROR_NO_DEVICE = 100,
    DRC__CUDA_ERROR_INVALID_CONTEXT = 201,
    DRC__CUDA_ERROR_NOT_FOUND = 500,
    DRC__CUDA_ERROR_NOT_PERMITTED = 800,
    DRC__CUDA_ERROR_NOT_SUPPORTED = 801,

    /* cudaError_t */
    DRC__CUDART_SUCCESS = 0,
    DRC__CUDART_INVALID_VALUE = 1,
    DRC__CUDART_INITIALIZATION_ERROR = 3,
    DRC__CUDART_UNLOADING = 4,
    DRC__CUDART_UNKNOWN = 999,

    DRC__CU_POINTER_ATTRIBUTE_CONTEXT = 1,
    DRC__CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2,
    DRC__CU_POINTER_ATTRIBUTE_BUFFER_ID = 7,
    DRC__CU_POINTER_ATTRIBUTE_IS_MANAGED = 8,
    DRC__CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9,
    DRC__CU_POINTER_ATTRIBUTE_RANGE_START_ADDR = 11,
    DRC__CU_POINTER_ATTRIBUTE_RANGE_SIZE = 12,
    DRC__CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE = 15,
    DRC__CU_POINTER_ATTRIBUTE_MAPPING_SIZE = 18,
    DRC__CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR = 19,

    DRC__CU_MEMORYTYPE_HOST = 1,
    DRC__CU_MEMORYTYPE_DEVICE = 2,
    DRC__CU_MEMORYTYPE_UNIFIED = 4,

    DRC__CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED = 102,
    DRC__CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED = 110,
    DRC__CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED = 116,
    DRC__CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED = 124,

    DRC__CU_MEM_ALLOC_GRANULARITY_RECOMMENDED = 1,
    DRC__CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD = 1,
    DRC__CU_MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE = 1,

    DRC__CUDA_MAX_DEVICES = 64,     /* the per-device tables of drc (ordinals 0..63) */
};

typedef unsigned long long drc__cuptr;     /* CUdeviceptr */

/* CUmemLocation: id is the device ordinal for type CU_MEM_LOCATION_TYPE_DEVICE (1). */
struct drc__cuda_location {
    int type, id;
};

/*
 * CUmemAllocationProp (v1), laid out as in cuda.h (CUDA 10.2 to 13): the fields
 * drc compares across VMM chunks, and what torch.c creates segments with.
 */
struct drc__cuda_alloc_prop {
    int type;                       /* CUmemAllocationType: CU_MEM_ALLOCATION_TYPE_PINNED = 1 */
    int requested_handle_types;
    struct drc__cuda_location location;
    void *win32_metadata;
    unsigned char compression_type;
    unsigned char gpu_direct_rdma_capable;
    unsigned short usage;
    unsigned char reserved[4];
};

/* CUmemAccessDesc, laid out as in cuda.h. */
struct drc__cuda_access_desc {
    struct drc__cuda_location location;
    int flags;                      /* CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3 */
};

struct drc__cuda_driver {
    /* classification and export (drc__cuda_can_export: all five present) */
    int (*cuPointerGetAttributes)(unsigned n, const int *attrs, void **data, drc__cuptr ptr);
    int (*cuMemGetAddressRange)(drc__cuptr *base, size_t *size, drc__cuptr ptr);
    int (*cuMemGetHandleForAddressRange)(void *handle, drc__cuptr ptr, size_t size, int type,
                                         unsigned long long flags);
    int (*cuCtxGetCurrent)(void **ctx);
    int (*cuCtxSetCurrent)(void *ctx);
    /* one attribute: RANGE_START_ADDR/RANGE_SIZE answer in a thread with no context */
    int (*cuPointerGetAttribute)(void *data, int attr, drc__cuptr ptr);
    /* VMM: chunk walk and properties, and what torch.c builds segments with */
    int (*cuMemRetainAllocationHandle)(unsigned long long *handle, void *addr);
    int (*cuMemGetAllocationPropertiesFromHandle)(struct drc__cuda_alloc_prop *prop, unsigned long long handle);
    int (*cuMemRelease)(unsigned long long handle);
    int (*cuMemGetAllocationGranularity)(size_t *g, const struct drc__cuda_alloc_prop *p, int option);
    int (*cuMemCreate)(unsigned long long *handle, size_t size, const struct drc__cuda_alloc_prop *p,
                       unsigned long long flags);
    int (*cuMemAddressReserve)(drc__cuptr *ptr, size_t size, size_t align, drc__cuptr addr,
                               unsigned long long flags);
    int (*cuMemAddressFree)(drc__cuptr ptr, size_t size);
    int (*cuMemMap)(drc__cuptr ptr, size_t size, size_t offset, unsigned long long handle,
                    unsigned long long flags);
    int (*cuMemSetAccess)(drc__cuptr ptr, size_t size, const struct drc__cuda_access_desc *d, size_t count);
    /* devices and contexts */
    int (*cuInit)(unsigned flags);
    int (*cuDriverGetVersion)(int *version);
    int (*cuDeviceGetCount)(int *count);
    int (*cuDeviceGet)(int *dev, int ordinal);
    int (*cuDeviceGetName)(char *name, int len, int dev);
    int (*cuDeviceGetPCIBusId)(char *bus_id, int len, int dev);   /* "DDDD:BB:DD.F": the topology (verbs/topo.h) */
    int (*cuDeviceGetAttribute)(int *value, int attr, int dev);
    int (*cuDevicePrimaryCtxRetain)(void **ctx, int dev);
    int (*cuDevicePrimaryCtxGetState)(int dev, unsigned *flags, int *active);
    int (*cuCtxGetDevice)(int *dev);
    int (*cuCtxSynchronize)(void);
    int (*cuStreamSynchronize)(void *stream);
    int (*cuMemAlloc)(drc__cuptr *dptr, size_t size);
    /*
     * The frees (frees.h), the real functions, never a wrapper: the driver's
     * never NULL (a stub answering CUDA_ERROR_NOT_INITIALIZED where the
     * driver lacks one); the runtime's (cudaError_t) read through
     * drc__cuda_runtime(), NULL when no shared libcudart is seen.
     */
#define DRC__CUDA_FIELD(api, name, versions, since, kind, params, args, fallback) int (*name) params;
    DRC__CUDA_FREES(DRC__CUDA_FIELD)
#undef DRC__CUDA_FIELD
};

/*
 * The driver table: the fake installed by drc__cuda_set_driver(), else the
 * real driver (loaded on the first call, once, thread-safe), else NULL when
 * libcuda.so.1 cannot be loaded.
 */
const struct drc__cuda_driver *drc__cuda_driver(void);

/*
 * Fill @d from the loaded driver library @lib (a dlopen handle; NULL: as
 * drc__cuda_no_driver), as drc__cuda_driver() does for libcuda.so.1. Tests
 * fill a table from the CUDA double (tests/doubles/) with it: a table handed
 * to drc__cuda_set_driver() is one it filled.
 */
void drc__cuda_fill(void *lib, struct drc__cuda_driver *d);

/* The table of no driver: the driver's frees are stubs (CUDA_ERROR_NOT_INITIALIZED), every other entry NULL. */
extern const struct drc__cuda_driver drc__cuda_no_driver;

/* 1 if @d has every entry that classification and export need (CUDA 11.7 or later). */
int drc__cuda_can_export(const struct drc__cuda_driver *d);

/*
 * Tests: use @fake (NULL: behave as with no driver) from now on instead of
 * libcuda. Also forgets what the layer learnt (PCIe mapping support, primary
 * contexts, the allocations of each device). Not thread-safe: call it before
 * any cache is in use.
 */
void drc__cuda_set_driver(const struct drc__cuda_driver *fake);

/*
 * A runtime entry of @d: the field itself for a fake; for the real driver the
 * function the dynamic linker sees under @name (a shared libcudart), looked
 * up again on each use until found. E.g. drc__cuda_runtime(d, &d->cudaFree, "cudaFree").
 */
void *drc__cuda_runtime(const struct drc__cuda_driver *d, void *const *field, const char *name);
#define DRC__CUDA_RT(d, f) drc__cuda_runtime((d), (void *const *)&(d)->f, #f)

/* A CUresult as a negative errno (NOT_SUPPORTED: -EOPNOTSUPP, INVALID_VALUE: -EINVAL, ...). */
int drc__cuda_errno(int cuda_result);

/* A CUresult as the nearest cudaError_t, for the runtime calls done through the driver. */
int drc__cuda_rt_error(int cuda_result);

/*
 * Make @ctx current on this thread (nothing for NULL or when it already is);
 * *saved and *switched say what drc__cuda_ctx_pop restores. 0 or -errno.
 */
int drc__cuda_ctx_push(const struct drc__cuda_driver *d, void *ctx, void **saved, int *switched);
void drc__cuda_ctx_pop(const struct drc__cuda_driver *d, void *saved, int switched);

/* The device's primary context, retained once for the life of the process; NULL if none. */
void *drc__cuda_primary_ctx(const struct drc__cuda_driver *d, int device);

/* ---- memory (memory.c) ----------------------------------------------------- */

/*
 * The allocation containing @addr: 0 with *base and *len, or -ENOENT when
 * @addr is not memory CUDA allocated (device or pinned host) or no driver is
 * loaded. Works whatever context the calling thread has, or none:
 * cuMemGetAddressRange answers CUDA_ERROR_INVALID_CONTEXT in a thread with
 * no current context, so the pointer's own context is pushed and the call
 * retried, and where that fails cuPointerGetAttribute(RANGE_START_ADDR,
 * RANGE_SIZE) is asked, which needs no context. Allocates nothing.
 */
__attribute__((visibility("default")))    /* the preload's verbs front uses it (drc.map, DRC_PRIVATE_0) */
DRC_API int drc__cuda_alloc_range(uintptr_t addr, uintptr_t *base, size_t *len);

/* CU_DEVICE_ATTRIBUTE_* @attr of CUDA ordinal @device: 0 with *value, or -ENODEV / -EIO. */
int drc__cuda_device_attr(int device, int attr, int *value);

/* The PCI bus id of CUDA ordinal @device ("0000:1B:00.0") in @buf: 0, or -ENODEV / -EIO. */
int drc__cuda_pci_bus_id(int device, char *buf, int len);

/* ---- the dmabuf export table (export.c) ----------------------------------------- */

/*
 * One dmabuf export per (allocation, mapping type), shared by every cache and
 * PD that registers it. The export covers the whole allocation (its host-page
 * hull); *offset = start - export base. *fd is a descriptor of the caller's
 * own (a dup of the table's): it closes it, as it would a fresh export.
 * *@pcie: in, 1 to ask for the PCIe mapping type; out, on success, the type
 * given (0: the default). Where the driver refuses the PCIe type on a range
 * it exports with the default type (NOT_SUPPORTED: no such path), the
 * default type, the device not asked for PCIe again, and a line under
 * DRC_LOG; a range the driver refuses whatever the type (a pool
 * allocation's pages) keeps the type asked for the next range tried.
 * 0 or a negative errno.
 */
int drc__cuda_export(const struct drc__mem *m, uintptr_t start, size_t len, int *pcie, int *fd, uint64_t *offset);

/*
 * Drop (close) the table's exports of @device (-1: any) that overlap
 * [lo, hi): the allocation is about to be freed, unmapped or torn down, and
 * an open dmabuf fd would keep its memory taken. free.c calls it before the
 * real free. drc__cuda_exports_live(): how many exports the table holds.
 * drc__cuda_exports_busy(): 0 only when the table holds none and no export is
 * being made, so that a free may skip the drop (export.c: a free must count
 * as a drop while an export is in flight, even with the table empty).
 */
void drc__cuda_exports_drop(int device, uintptr_t lo, uintptr_t hi);
int drc__cuda_exports_live(void);
int drc__cuda_exports_busy(void);

/*
 * The CUDA allocations drc has classified, by device (memory.c records the
 * bounds of each successful CUDA classification; free.c forgets them when
 * the allocation is freed). A teardown invalidates them. [*lo, *hi): the
 * hull of those of @device (-1: of every device); 0, or -ENOENT when there
 * are none. When the record overflowed, the hull is the whole address space.
 */
void drc__cuda_track(int device, uintptr_t lo, uintptr_t hi);
void drc__cuda_untrack(int device, uintptr_t lo, uintptr_t hi);   /* those inside [lo, hi) */
int drc__cuda_tracked_hull(int device, uintptr_t *lo, uintptr_t *hi);

/* ---- the begin-free routine (free.c) ----------------------------------------- */

/*
 * THE routine every free path of drc goes through: the wrappers (wrappers.c),
 * the PyTorch allocator (torch.c), and through the preload ABI the preload
 * interposer and the CUPTI monitor (src/preload/). Each begins a free and
 * returns a ticket for drc__notify_end(), to call once the real call
 * returned (-1: nothing to end; no cache exists).
 *
 * begin_free: the whole allocation containing @ptr (device memory, pinned or
 *   registered host memory), looked up with drc__cuda_alloc_range() while it
 *   is still valid; when its bounds cannot be found, the first byte.
 * begin_unmap: exactly [ptr, ptr+size) (a VMM mapping).
 * begin_teardown: every CUDA allocation of @device (-1: of every device)
 *   that drc classified: a context reset or destroy frees them without any
 *   free call.
 */
int drc__cuda_begin_free(drc__cuptr ptr);
int drc__cuda_begin_unmap(drc__cuptr ptr, size_t size);
int drc__cuda_begin_teardown(int device);

/*
 * After cuDevicePrimaryCtxRelease(@device) returned: if that dropped the
 * last reference, the context was reset and its memory freed; then every
 * CUDA allocation of the device is invalidated. Only after the fact: a
 * release cannot tell beforehand whether it is the last (the window is the
 * one drc_notify_free leaves, docs/limits.md).
 */
void drc__cuda_primary_released(int device);

/* The device of @ctx (-1: unknown), asked with @ctx made current for a moment. */
int drc__cuda_ctx_device(void *ctx);

/*
 * What cudaFree does for cudaMalloc memory, for a program whose runtime is
 * static (no cudaFree visible to the dynamic linker): synchronise the
 * allocation's own context (the thread may have none current), then
 * cuMemFree. Returns a cudaError_t (NULL: cudaSuccess, as the runtime's
 * cudaFree(NULL), driver or not). Notifies nothing: the caller brackets.
 */
int drc__cuda_free_emulated(void *ptr);

#endif
