/*
 * The CUDA driver as drc sees it (cuda.c). libcuda.so.1 is opened with
 * dlopen on first use; nothing links against it. Tests install a fake table
 * with drc__cuda_set_driver() — the same table the real driver fills in.
 *
 * Contract of the table: each entry has the driver ABI of the function it is
 * named after (CUresult is an int, CUdeviceptr an unsigned long long, CUdevice
 * an int, CUcontext/CUstream a pointer), returns 0 (CUDA_SUCCESS) or a
 * CUresult, and may be called from any thread. cuMemAlloc, cuMemFree,
 * cuMemGetAddressRange and cuDevicePrimaryCtxRelease are the _v2 entry points.
 * An entry may be NULL where the driver lacks it; drc then does without (the
 * columns marked "required" must be set for the driver to be used at all).
 */
#ifndef DRC_CUDA_LAYER_H
#define DRC_CUDA_LAYER_H

#include <stddef.h>
#include <stdint.h>

/* The CUDA constants drc uses, from cuda.h (CUDA 11.7 - 13), so that drc builds without CUDA. */
enum {
    DRC__CUDA_SUCCESS = 0,
    DRC__CUDA_ERROR_INVALID_VALUE = 1,
    DRC__CUDA_ERROR_OUT_OF_MEMORY = 2,
    DRC__CUDA_ERROR_NOT_INITIALIZED = 3,
    DRC__CUDA_ERROR_DEINITIALIZED = 4,
    DRC__CUDA_ERROR_STUB_LIBRARY = 34,
    DRC__CUDA_ERROR_NO_DEVICE = 100,
    DRC__CUDA_ERROR_INVALID_CONTEXT = 201,
    DRC__CUDA_ERROR_NOT_PERMITTED = 800,
    DRC__CUDA_ERROR_NOT_SUPPORTED = 801,

    DRC__CU_POINTER_ATTRIBUTE_CONTEXT = 1,
    DRC__CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2,
    DRC__CU_POINTER_ATTRIBUTE_BUFFER_ID = 7,
    DRC__CU_POINTER_ATTRIBUTE_IS_MANAGED = 8,
    DRC__CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9,
    DRC__CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE = 15,

    DRC__CU_MEMORYTYPE_HOST = 1,
    DRC__CU_MEMORYTYPE_DEVICE = 2,
    DRC__CU_MEMORYTYPE_UNIFIED = 4,

    DRC__CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED = 110,
    DRC__CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED = 116,
    DRC__CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED = 124,

    DRC__CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD = 1,
    DRC__CU_MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE = 1,
};

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

struct drc__cuda_driver {
    /* required */
    int (*cuPointerGetAttributes)(unsigned n, const int *attrs, void **data, unsigned long long ptr);
    int (*cuMemGetAddressRange)(unsigned long long *base, size_t *size, unsigned long long ptr);
    int (*cuMemGetHandleForAddressRange)(void *handle, unsigned long long ptr, size_t size, int type,
                                         unsigned long long flags);
    int (*cuCtxGetCurrent)(void **ctx);
    int (*cuCtxSetCurrent)(void *ctx);
    /* VMM: chunk walk and properties */
    int (*cuMemRetainAllocationHandle)(unsigned long long *handle, void *addr);
    int (*cuMemGetAllocationPropertiesFromHandle)(struct drc__cuda_alloc_prop *prop, unsigned long long handle);
    int (*cuMemRelease)(unsigned long long handle);
    /* devices: the doctor, the verbs fallback decision, VMM memory's context */
    int (*cuInit)(unsigned flags);
    int (*cuDriverGetVersion)(int *version);
    int (*cuDeviceGetCount)(int *count);
    int (*cuDeviceGet)(int *dev, int ordinal);
    int (*cuDeviceGetName)(char *name, int len, int dev);
    int (*cuDeviceGetAttribute)(int *value, int attr, int dev);
    int (*cuDevicePrimaryCtxRetain)(void **ctx, int dev);
    int (*cuDevicePrimaryCtxRelease)(int dev);
    /* allocation and the frees the hooks wrap (the real functions, never a wrapper) */
    int (*cuMemAlloc)(unsigned long long *dptr, size_t size);
    int (*cuMemFree)(unsigned long long dptr);
    int (*cuMemFreeAsync)(unsigned long long dptr, void *stream);
    int (*cuMemUnmap)(unsigned long long ptr, size_t size);
};

/*
 * The driver table: the fake installed by drc__cuda_set_driver(), else the
 * real driver (loaded on the first call, once, thread-safe), else NULL when
 * libcuda.so.1 cannot be loaded or lacks a required entry.
 */
const struct drc__cuda_driver *drc__cuda_driver(void);

/*
 * Tests: use @fake (NULL: behave as with no driver) from now on instead of
 * libcuda. Also forgets what cuda.c learnt per device (PCIe mapping support,
 * primary contexts). Not thread-safe: call it before any cache is in use.
 */
void drc__cuda_set_driver(const struct drc__cuda_driver *fake);

/*
 * The allocation containing @addr (cuMemGetAddressRange): 0 with *base and
 * *len, or -ENOENT when @addr is not CUDA device memory or no driver is
 * loaded. Safe from any thread; allocates nothing after the first call.
 */
int drc__cuda_alloc_range(uintptr_t addr, uintptr_t *base, size_t *len);

/* CU_DEVICE_ATTRIBUTE_* @attr of CUDA ordinal @device: 0 with *value, or -ENODEV / -EIO. */
int drc__cuda_device_attr(int device, int attr, int *value);

/* A CUresult as a negative errno (NOT_SUPPORTED: -EOPNOTSUPP, INVALID_VALUE: -EINVAL, ...). */
int drc__cuda_errno(int cuda_result);

#endif
