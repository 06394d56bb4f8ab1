/*
 * PyTorch's caching allocator, fed by drc: the two entry points of a
 * torch.cuda.memory.CUDAPluggableAllocator.
 *
 * Used with torch.cuda.MemPool and torch.cuda.use_mem_pool, PyTorch keeps
 * caching blocks and calls drc only per segment, so these calls are rare and
 * may be slow. Segments are made so that they export as a dmabuf: on a device
 * that supports GPUDirect RDMA with VMM, a cuMemCreate allocation with
 * gpuDirectRDMACapable mapped into a reserved range of its own; elsewhere a
 * plain cuMemAlloc. The physical handle is released as soon as it is mapped,
 * so the mapping alone keeps the memory and the unmap frees it.
 *
 * drc_torch_free invalidates the segment in every cache and marks it as being
 * freed (drc__notify_begin/end) around the unmap or free, so no registration outlives a segment.
 * Set DRC_TORCH_VMM=0 to force cuMemAlloc.
 */
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#include "drc.h"
#include "drc_cuda.h"
#include "cuda/cuda.h"
#include "core/config.h"
#include "core/notify.h"

enum seg_kind { UNKNOWN = 0, VMM = 1, PLAIN = 2 };

struct dev_info {
    int kind;                   /* atomic: enum seg_kind, decided on the first malloc */
    size_t granularity;         /* VMM: the recommended granularity, set before kind */
};

static struct dev_info devs[DRC__CUDA_MAX_DEVICES];

static struct drc__cuda_alloc_prop vmm_prop(int device)
{
    struct drc__cuda_alloc_prop p;

    memset(&p, 0, sizeof(p));
    p.type = 1;                                 /* CU_MEM_ALLOCATION_TYPE_PINNED */
    p.location.type = 1;                        /* CU_MEM_LOCATION_TYPE_DEVICE */
    p.location.id = device;
    p.gpu_direct_rdma_capable = 1;        /* without it the segment cannot be registered */
    return p;
}

/* Make sure a context is current: PyTorch has one, a bare caller may not. */
static int ensure_context(const struct drc__cuda_driver *d, int device)
{
    void *ctx = NULL;
    int dev;

    if (!d->cuCtxGetCurrent)
        return -1;
    if (d->cuCtxGetCurrent(&ctx) == 0 && ctx)
        return 0;
    if (!d->cuCtxSetCurrent || !d->cuDeviceGet || !d->cuDevicePrimaryCtxRetain || d->cuDeviceGet(&dev, device) || d->cuDevicePrimaryCtxRetain(&ctx, dev) || d->cuCtxSetCurrent(ctx))
        return -1;
    return 0;       /* the primary context is retained for the life of the process */
}

/*
 * The context a call for @device must run in: NULL (keep the current one) when
 * it is a context of @device, else the device's primary context. The caller's
 * current device may be another one (several GPUs in one process).
 */
static void *device_ctx(const struct drc__cuda_driver *d, int device)
{
    int cur = -1;

    if (d->cuCtxGetDevice && d->cuCtxGetDevice(&cur) == 0 && cur == device)
        return NULL;
    return drc__cuda_primary_ctx(d, device);
}

static int decide_kind(const struct drc__cuda_driver *d, int device, struct dev_info *di)
{
    struct drc__cuda_alloc_prop p = vmm_prop(device);
    int dev, vmm = 0, rdma = 0;
    size_t g = 0;

    if (!drc__env(DRC__ENV_TORCH_VMM) || !d->cuMemCreate || !d->cuMemAddressReserve || !d->cuMemMap ||
        !d->cuMemSetAccess || !d->cuMemAddressFree || !d->cuMemRelease ||
        !d->cuMemGetAllocationGranularity || !d->cuDeviceGetAttribute || !d->cuDeviceGet || d->cuDeviceGet(&dev, device) ||
        d->cuDeviceGetAttribute(&vmm, DRC__CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev) ||
        d->cuDeviceGetAttribute(&rdma, DRC__CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED, dev) || !vmm || !rdma ||
        d->cuMemGetAllocationGranularity(&g, &p, DRC__CU_MEM_ALLOC_GRANULARITY_RECOMMENDED) || !g)
        return PLAIN;
    di->granularity = g;
    return VMM;
}

static void *vmm_alloc(const struct drc__cuda_driver *d, int device, size_t size, size_t g)
{
    struct drc__cuda_alloc_prop p = vmm_prop(device);
    struct drc__cuda_access_desc acc = { .location = { .type = 1, .id = device }, .flags = 3 };
    unsigned long long h;
    drc__cuptr ptr = 0;
    size_t len = (size + g - 1) / g * g;

    if (d->cuMemCreate(&h, len, &p, 0))
        return NULL;
    if (d->cuMemAddressReserve(&ptr, len, g, 0, 0))
        goto err_release;
    if (d->cuMemMap(ptr, len, 0, h, 0))
        goto err_reserve;
    if (d->cuMemSetAccess(ptr, len, &acc, 1))
        goto err_map;
    d->cuMemRelease(h);          /* the mapping keeps the memory; the unmap frees it */
    return (void *)(uintptr_t)ptr;

err_map:
    d->cuMemUnmap(ptr, len);
err_reserve:
    d->cuMemAddressFree(ptr, len);
err_release:
    d->cuMemRelease(h);
    return NULL;
}

void *drc_torch_malloc(ssize_t size, int device, void *stream)
{
    const struct drc__cuda_driver *d = drc__cuda_driver();
    struct dev_info *di;
    drc__cuptr ptr = 0;
    int kind, rc, switched;
    void *p, *saved;

    (void)stream;       /* segments belong to no stream: PyTorch tracks stream use itself */
    if (!d || size <= 0 || device < 0 || device >= DRC__CUDA_MAX_DEVICES || ensure_context(d, device))
        return NULL;
    di = &devs[device];
    kind = __atomic_load_n(&di->kind, __ATOMIC_ACQUIRE);
    if (kind == UNKNOWN) {
        kind = decide_kind(d, device, di);
        __atomic_store_n(&di->kind, kind, __ATOMIC_RELEASE);
    }
    if (kind == VMM && (p = vmm_alloc(d, device, (size_t)size, di->granularity)))
        return p;
    /* no VMM, or the VMM path failed (e.g. out of memory at this granularity): plain memory exports too */
    if (!d->cuMemAlloc || drc__cuda_ctx_push(d, device_ctx(d, device), &saved, &switched))
        return NULL;
    rc = d->cuMemAlloc(&ptr, (size_t)size);     /* in @device's context: cuMemAlloc takes the current one's */
    drc__cuda_ctx_pop(d, saved, switched);
    return rc ? NULL : (void *)(uintptr_t)ptr;
}

void drc_torch_free(void *ptr, ssize_t size, int device, void *stream)
{
    const struct drc__cuda_driver *d = drc__cuda_driver();
    unsigned long long h;
    drc__cuptr p = (drc__cuptr)(uintptr_t)ptr;
    size_t len, g;
    int t, switched;
    void *saved;

    (void)stream;
    if (!d || !ptr || size <= 0 || device < 0 || device >= DRC__CUDA_MAX_DEVICES)
        return;
    g = devs[device].granularity;
    /* A VMM segment has an allocation handle behind its address; cuMemAlloc memory has none. */
    if (g && d->cuMemRetainAllocationHandle && d->cuMemRetainAllocationHandle(&h, ptr) == 0) {
        d->cuMemRelease(h);      /* drop the reference the lookup took */
        len = ((size_t)size + g - 1) / g * g;
        t = drc__cuda_begin_unmap(p, len);
        /* the segment's last kernels must be done before its pages go: its device's, whichever is current */
        if (d->cuCtxSynchronize && drc__cuda_ctx_push(d, device_ctx(d, device), &saved, &switched) == 0) {
            d->cuCtxSynchronize();
            drc__cuda_ctx_pop(d, saved, switched);
        }
        d->cuMemUnmap(p, len);
        drc__notify_end(t);
        d->cuMemAddressFree(p, len);
        return;
    }
    t = drc__cuda_begin_free(p);
    if (d->cuMemFree)
        d->cuMemFree(p);     /* cuMemFree waits for the device itself */
    drc__notify_end(t);
}
