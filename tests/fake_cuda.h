/*
 * A fake CUDA driver: a test double for struct drc__cuda_driver (src/cuda.h).
 *
 * There is no GPU in CI. This table models a few allocations (plain device
 * memory, VMM chunks, pinned host, managed) at made-up addresses, answers the
 * driver calls drc makes about them, records each call (its arguments and the
 * context current on the calling thread at that moment), hands out real fds
 * (memfds of the export's size) as dmabufs so that a test can see them closed, and fails on
 * request. Not thread-safe: the tests that use it are single-threaded.
 */
#ifndef DRC_TEST_FAKE_CUDA_H
#define DRC_TEST_FAKE_CUDA_H

#include <fcntl.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "cuda/cuda.h"

enum { FC_MAX_ALLOCS = 16, FC_MAX_CALLS = 64 };

struct fc_alloc {
    uintptr_t base;
    size_t size;
    unsigned type;              /* DRC__CU_MEMORYTYPE_* */
    int managed, device, vmm, gdr;
    uint64_t buffer_id;
    void *ctx;                  /* CONTEXT attribute (NULL for VMM) */
    int prop_type;              /* VMM: allocation type, compared by the chunk walk */
};

struct fc_export {
    uintptr_t ptr;
    size_t size;
    unsigned long long flags;
    void *ctx;                  /* current at the call */
    int fd;
};

struct fake_cuda {
    struct fc_alloc a[FC_MAX_ALLOCS];
    int n;
    int attr_rc;                /* cuPointerGetAttributes returns this when set */
    int export_rc;              /* next exports return this (0 = succeed) */
    int pcie_unsupported;       /* the PCIe mapping flag gives CUDA_ERROR_NOT_SUPPORTED */
    int range_needs_ctx;        /* cuMemGetAddressRange gives INVALID_CONTEXT with no current context */
    int dmabuf_attr[4];         /* DMA_BUF_SUPPORTED per device */
    struct fc_export exports[FC_MAX_CALLS];
    int nexports;
    void *range_ctx;            /* current context at the last cuMemGetAddressRange */
    int set_calls, retains, releases, primary_retains;
    int frees, resets, destroys;        /* cuMemFree/FreeHost/HostUnregister; PrimaryCtxReset; CtxDestroy */
    int reset_dev;                      /* the device last reset */
};

static struct fake_cuda fc;
static __thread void *fc_current;   /* this thread's current context */

#define FC_PAGE 4096u
#define FC_CTX0 ((void *)0xc0)
#define FC_PRIMARY(dev) ((void *)(uintptr_t)(0xd00 + (dev)))

static struct fc_alloc *fc_find(unsigned long long p)
{
    int i;

    for (i = 0; i < fc.n; i++)
        if (p >= fc.a[i].base && p - fc.a[i].base < fc.a[i].size)
            return &fc.a[i];
    return NULL;
}

static int fc_attrs(unsigned n, const int *attrs, void **data, unsigned long long ptr)
{
    struct fc_alloc *a = fc_find(ptr);
    unsigned i;

    if (fc.attr_rc)
        return fc.attr_rc;
    for (i = 0; i < n; i++) {
        switch (attrs[i]) {
        case DRC__CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
            *(unsigned *)data[i] = a ? a->type : 0;
            break;
        case DRC__CU_POINTER_ATTRIBUTE_IS_MANAGED:
            *(unsigned *)data[i] = a ? (unsigned)a->managed : 0;
            break;
        case DRC__CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
            *(int *)data[i] = a ? a->device : -1;
            break;
        case DRC__CU_POINTER_ATTRIBUTE_BUFFER_ID:
            *(unsigned long long *)data[i] = a ? a->buffer_id : 0;
            break;
        case DRC__CU_POINTER_ATTRIBUTE_CONTEXT:
            *(void **)data[i] = a ? a->ctx : NULL;
            break;
        case DRC__CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE:
            *(unsigned *)data[i] = a ? (unsigned)a->gdr : 0;
            break;
        default:
            return DRC__CUDA_ERROR_INVALID_VALUE;
        }
    }
    return 0;
}

static int fc_range(unsigned long long *base, size_t *size, unsigned long long ptr)
{
    struct fc_alloc *a = fc_find(ptr);

    fc.range_ctx = fc_current;
    if (fc.range_needs_ctx && !fc_current)
        return DRC__CUDA_ERROR_INVALID_CONTEXT;
    if (!a || a->managed)
        return DRC__CUDA_ERROR_INVALID_VALUE;   /* device memory and pinned host memory have bounds */
    *base = a->base;
    *size = a->size;
    return 0;
}

static int fc_export_fn(void *handle, unsigned long long ptr, size_t size, int type, unsigned long long flags)
{
    struct fc_export *e = &fc.exports[fc.nexports < FC_MAX_CALLS ? fc.nexports++ : FC_MAX_CALLS - 1];

    *e = (struct fc_export){ ptr, size, flags, fc_current, -1 };
    if (type != DRC__CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD || ptr % FC_PAGE || size % FC_PAGE)
        return DRC__CUDA_ERROR_INVALID_VALUE;   /* as the real driver: host-page alignment */
    if ((flags & DRC__CU_MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE) && fc.pcie_unsupported)
        return DRC__CUDA_ERROR_NOT_SUPPORTED;
    if (fc.export_rc)
        return fc.export_rc;
    /* a memfd of the export's size, as large as the dmabuf would be (a NIC checks offset + length) */
    e->fd = memfd_create("fake-dmabuf", MFD_CLOEXEC);
    if (e->fd < 0 || ftruncate(e->fd, (off_t)size) != 0)
        return DRC__CUDA_ERROR_OUT_OF_MEMORY;
    *(int *)handle = e->fd;
    return 0;
}

static int fc_get_current(void **ctx)
{
    *ctx = fc_current;
    return 0;
}

static int fc_set_current(void *ctx)
{
    fc.set_calls++;
    fc_current = ctx;
    return 0;
}

static int fc_retain(unsigned long long *h, void *addr)
{
    struct fc_alloc *a = fc_find((uintptr_t)addr);

    if (!a || !a->vmm)
        return DRC__CUDA_ERROR_INVALID_VALUE;
    fc.retains++;
    *h = (unsigned long long)(a - fc.a) + 1;
    return 0;
}

static int fc_props(struct drc__cuda_alloc_prop *p, unsigned long long h)
{
    const struct fc_alloc *a = &fc.a[h - 1];

    memset(p, 0, sizeof(*p));
    p->type = a->prop_type;
    p->location.type = 1;
    p->location.id = a->device;
    p->gpu_direct_rdma_capable = (unsigned char)a->gdr;
    return 0;
}

static int fc_release(unsigned long long h)
{
    (void)h;
    fc.releases++;
    return 0;
}

static int fc_device_get(int *dev, int ordinal)
{
    *dev = ordinal;
    return ordinal >= 0 && ordinal < 4 ? 0 : DRC__CUDA_ERROR_INVALID_VALUE;
}

static int fc_device_attr(int *v, int attr, int dev)
{
    *v = attr == DRC__CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED ? fc.dmabuf_attr[dev] : 1;
    return 0;
}

static int fc_primary_retain(void **ctx, int dev)
{
    fc.primary_retains++;
    *ctx = FC_PRIMARY(dev);
    return 0;
}

/* Forget the allocation that starts at @p (a free of any kind). */
static int fc_drop(unsigned long long p)
{
    struct fc_alloc *a = fc_find(p);

    if (!a || a->base != p)
        return DRC__CUDA_ERROR_INVALID_VALUE;
    *a = fc.a[--fc.n];
    fc.frees++;
    return 0;
}

static int fc_free(unsigned long long p)
{
    return fc_drop(p);
}

static int fc_free_host(void *p)
{
    return fc_drop((uintptr_t)p);
}

static int fc_primary_reset(int dev)
{
    fc.resets++;
    fc.reset_dev = dev;
    return 0;
}

static int fc_ctx_destroy(void *ctx)
{
    (void)ctx;
    fc.destroys++;
    return 0;
}

/* FC_CTX0 is device 0's; FC_PRIMARY(dev) is dev's. */
static int fc_ctx_device(int *dev)
{
    if (!fc_current)
        return DRC__CUDA_ERROR_INVALID_CONTEXT;
    *dev = fc_current == FC_CTX0 ? 0 : (int)((uintptr_t)fc_current - 0xd00);
    return 0;
}

static const struct drc__cuda_driver fc_driver = {
    .cuPointerGetAttributes = fc_attrs,
    .cuMemGetAddressRange = fc_range,
    .cuMemGetHandleForAddressRange = fc_export_fn,
    .cuCtxGetCurrent = fc_get_current,
    .cuCtxSetCurrent = fc_set_current,
    .cuMemRetainAllocationHandle = fc_retain,
    .cuMemGetAllocationPropertiesFromHandle = fc_props,
    .cuMemRelease = fc_release,
    .cuDeviceGet = fc_device_get,
    .cuDeviceGetAttribute = fc_device_attr,
    .cuDevicePrimaryCtxRetain = fc_primary_retain,
    .cuDevicePrimaryCtxReset = fc_primary_reset,
    .cuCtxDestroy = fc_ctx_destroy,
    .cuCtxGetDevice = fc_ctx_device,
    .cuMemFree = fc_free,
    .cuMemFreeHost = fc_free_host,
    .cuMemHostUnregister = fc_free_host,
};

/* Forget every allocation and record, install the fake, all devices export dmabuf. */
static inline void fc_reset(void)
{
    memset(&fc, 0, sizeof(fc));
    fc.dmabuf_attr[0] = fc.dmabuf_attr[1] = fc.dmabuf_attr[2] = fc.dmabuf_attr[3] = 1;
    fc_current = NULL;
    drc__cuda_set_driver(&fc_driver);
}

/* Plain device memory (cuMemAlloc) on @device, in context FC_CTX0. */
static inline struct fc_alloc *fc_add(uintptr_t base, size_t size, int device, uint64_t id)
{
    struct fc_alloc *a = &fc.a[fc.n++];

    *a = (struct fc_alloc){ base, size, DRC__CU_MEMORYTYPE_DEVICE, 0, device, 0, 1, id, FC_CTX0, 0 };
    return a;
}

/* A mapped VMM chunk (no context; gpuDirectRDMACapable = @gdr). */
static inline struct fc_alloc *fc_add_vmm(uintptr_t base, size_t size, int device, uint64_t id, int gdr)
{
    struct fc_alloc *a = fc_add(base, size, device, id);

    a->vmm = 1;
    a->gdr = gdr;
    a->ctx = NULL;
    return a;
}

/* Pinned host memory (cuMemAllocHost / cuMemHostRegister): host type, no device. */
static inline struct fc_alloc *fc_add_host(uintptr_t base, size_t size, uint64_t id)
{
    struct fc_alloc *a = fc_add(base, size, -1, id);

    a->type = DRC__CU_MEMORYTYPE_HOST;
    return a;
}

static inline int fd_is_open(int fd)
{
    return fd >= 0 && fcntl(fd, F_GETFD) != -1;
}

#endif
