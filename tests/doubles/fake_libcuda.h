/*
 * THE CUDA double: a fake libcuda.so.1 (fake_libcuda.c), the one every test
 * that needs CUDA uses. There is no GPU in CI.
 *
 * Built as build/fakecuda/libcuda.so.1 (and the same file again as
 * build/engine/fakecuda/libcuda.so.1 for the transfer-engine test). Programs
 * run under a preload link it or find it on LD_LIBRARY_PATH, so drc's own
 * dlopen("libcuda.so.1") finds it; in-process tests link it too and install
 * it in drc's one driver table with fc_reset() (below), which fills the
 * table from the loaded library exactly as drc fills it from the driver.
 *
 * What it models: two devices (ordinals 0 and 1), each with a primary
 * context FC_PRIMARY(dev) and a created context FC_CTX(dev) (FC_CTX0 is
 * device 0's), and a current context per thread (fc_current); allocations
 * of device memory (plain or VMM chunks), pinned host and managed memory,
 * either added by a test at made-up addresses (fc_add*: never touched) or
 * made by cuMemAlloc_v2/cuMemAllocHost_v2 in a reserved range, first fit, so
 * that a free and an allocation of the same size give the same address with
 * a new buffer id, as the real driver does. Allocated memory is host memory,
 * readable and writable and zero when allocated (the loopback NIC's tests
 * move bytes into it); it is inaccessible again once freed.
 * With fc.strict_ctx, driver calls made in the wrong context fail as the
 * real driver's do (see struct fake_cuda). It answers what
 * drc's CUDA layer asks (pointer attributes, ranges, contexts, VMM handles
 * and properties, device attributes), exports a dmabuf as a memfd of the
 * range's size ("fake-dmabuf"), frees, pinned host frees and teardowns, and
 * cuGetProcAddress(_v2) the way the runtime uses it; VMM segments as torch.c
 * builds them (cuMemCreate, cuMemAddressReserve, cuMemMap: a mapping is a VMM
 * chunk of fc.a); and, for in-process tests, the frees of a shared libcudart
 * (fc_shared_runtime). It records what was
 * asked, fails on request, calls a test's callback inside each free while the
 * memory still exists, and reports each free to the CUPTI double
 * (fake_cupti.c) when one subscribed. Thread-safe for allocation and free;
 * the records are for single-threaded tests.
 */
#ifndef FAKE_LIBCUDA_H
#define FAKE_LIBCUDA_H

#include <fcntl.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

enum { FC_MAX_ALLOCS = 256, FC_MAX_CALLS = 64, FC_DEVICES = 2 };

#define FC_GRANULARITY (2ul << 20)     /* cuMemGetAllocationGranularity, as on the H200 machine */

#define FC_PAGE 4096u
#define FC_CTX(dev) ((void *)(uintptr_t)(0xc0 + (dev)))
#define FC_CTX0 FC_CTX(0)
#define FC_PRIMARY(dev) ((void *)(uintptr_t)(0xd00 + (dev)))
#define FAKE_CUDA_CTX FC_PRIMARY(0)     /* the context cuMemAlloc_v2 memory belongs to with none current */

struct fc_alloc {
    uintptr_t base;
    size_t size;
    unsigned type;              /* CU_MEMORYTYPE_*: 1 host, 2 device */
    int managed, device, vmm, gdr;
    uint64_t buffer_id;
    void *ctx;                  /* CONTEXT attribute (NULL for VMM) */
    int prop_type;              /* VMM: allocation type, compared by the chunk walk */
    unsigned access;            /* VMM: bit d set when cuMemSetAccess gave device d read-write access */
    uintptr_t map_base;         /* a stream-ordered pool's mapping the allocation is packed into, or 0: */
    size_t map_size;            /* its own mapping (MAPPING_BASE_ADDR/SIZE; the export rule, see there) */
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
    int range_rc;               /* cuMemGetAddressRange_v2 returns this when set (with attr_rc: no bounds known) */
    int export_rc;              /* next exports return this (0 = succeed) */
    int pcie_unsupported;       /* the PCIe mapping flag gives CUDA_ERROR_NOT_SUPPORTED (1 until fc_reset) */
    int range_needs_ctx;        /* cuMemGetAddressRange gives INVALID_CONTEXT with no current context */
    /*
     * Contexts as the real driver checks them: cuMemAlloc_v2 and the export
     * (cuMemGetHandleForAddressRange) need a current context, else
     * INVALID_CONTEXT (201), and the export of device memory must run in a
     * context of the memory's own device, else INVALID_CONTEXT too (the
     * real answer from another device's context is measured by
     * tests/gpu/test_multi_gpu.c); cuMemGetAddressRange as range_needs_ctx.
     */
    int strict_ctx;
    int dmabuf_attr[FC_DEVICES];/* DMA_BUF_SUPPORTED per device */
    struct fc_export exports[FC_MAX_CALLS];
    int nexports;
    void *range_ctx;            /* current context at the last cuMemGetAddressRange */
    int set_calls, retains, releases, primary_retains;
    int frees, resets, destroys;/* frees of any kind; cuDevicePrimaryCtxReset; cuCtxDestroy */
    int reset_dev;              /* the device last reset */
    int pcie_rc;                /* the PCIe mapping flag gives this CUresult (0: as pcie_unsupported says) */
    /*
     * Frees that freed (cuMemFree_v2 and the other free entry points, the runtime's frees of
     * fc_shared_runtime) and cuMemRelease return this once done (0: success): a result no
     * driver function returns on success, which the wrappers must hand back unchanged.
     */
    int free_rc;
    int no_vmm[FC_DEVICES];     /* the device answers 0 for VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED and
                                   GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED (no VMM segments for torch.c) */
    int syncs;                  /* cuCtxSynchronize calls */
    void *sync_ctx;             /* the current context at the last cuCtxSynchronize */
    int allocs;                 /* cuMemAlloc_v2 calls */
    int creates, reserves, address_frees;   /* cuMemCreate, cuMemAddressReserve, cuMemAddressFree done */
    size_t unmap_size;          /* the size the last cuMemUnmap was given */
    /*
     * Driver calls that ask about memory: cuPointerGetAttribute, cuPointerGetAttributes,
     * cuMemGetAddressRange_v2 and cuMemRetainAllocationHandle, each counted once (a test that a
     * path asks the driver nothing, e.g. a registration cache hit).
     */
    int mem_queries;
};

extern struct fake_cuda fc;
extern __thread void *fc_current;  /* this thread's current context */

/* Forget every allocation and record; both devices export dmabuf, the PCIe flag works. */
void fake_cuda_reset(void);

/* Plain device memory (cuMemAlloc) of @size at @base on @device, in context FC_CTX(@device). */
struct fc_alloc *fc_add(uintptr_t base, size_t size, int device, uint64_t id);

/* A mapped VMM chunk (no context; gpuDirectRDMACapable = @gdr). */
struct fc_alloc *fc_add_vmm(uintptr_t base, size_t size, int device, uint64_t id, int gdr);

/* Pinned host memory (cuMemAllocHost / cuMemHostRegister). */
struct fc_alloc *fc_add_host(uintptr_t base, size_t size, uint64_t id);

/* Call @cb inside every free, before the memory is released. */
typedef void fake_cuda_free_cb(uintptr_t ptr, size_t len, const char *entry, void *arg);
void fake_cuda_on_free(fake_cuda_free_cb *cb, void *arg);

/* Frees that reached the double, by any entry point. */
unsigned fake_cuda_frees(void);

/* cuMemGetAddressRange fails with 201 in a thread with no current context (fc.range_needs_ctx). */
void fake_cuda_needs_context(int on);

/* dmabuf exports made so far (the engine test tells the double from a real driver by it). */
unsigned fakecu_exports(void);

/*
 * The buffer id of the memory a dmabuf of this double (or a dup of it) was
 * exported from, as the driver saw it at the export: 0, or -1 if @fd is not
 * one. What a NIC would map, whatever the VA holds now.
 */
int fakecu_dmabuf_id(int fd, unsigned long long *id);

/* The driver entry points programs call directly. */
int cuMemAlloc_v2(unsigned long long *dptr, size_t size);
int cuMemAllocHost_v2(void **p, size_t size);
int cuMemGetAddressRange_v2(unsigned long long *base, size_t *size, unsigned long long dptr);
int cuMemFree_v2(unsigned long long dptr);
int cuMemFreeAsync(unsigned long long dptr, void *stream);
int cuMemFreeAsync_ptsz(unsigned long long dptr, void *stream);
int cuMemUnmap(unsigned long long ptr, size_t size);
int cuMemSetAccess(unsigned long long ptr, size_t size, const void *desc, size_t count);
int cuMemGetHandleForAddressRange(void *handle, unsigned long long ptr, size_t size, int type,
                                  unsigned long long flags);
int cuPointerGetAttribute(void *data, int which, unsigned long long ptr);
int cuCtxSetCurrent(void *ctx);
int cuMemFreeHost(void *p);
int cuMemHostUnregister(void *p);
int cuIpcCloseMemHandle(unsigned long long dptr);
int cuDevicePrimaryCtxReset_v2(int dev);
int cuDevicePrimaryCtxRetain(void **ctx, int dev);
int cuDevicePrimaryCtxRelease_v2(int dev);
int cuCtxDestroy_v2(void *ctx);
int cuMemRelease(unsigned long long h);
int cuCtxSynchronize(void);

/* The frees of a shared libcudart, under names of the double's own (fc_shared_runtime). */
int fc_cudaFree(void *p);
int fc_cudaFreeAsync(void *p, void *stream);
int cuGetProcAddress(const char *symbol, void **pfn, int version, unsigned long long flags);
int cuGetProcAddress_v2(const char *symbol, void **pfn, int version, unsigned long long flags, int *status);

static inline int fd_is_open(int fd)
{
    return fd >= 0 && fcntl(fd, F_GETFD) != -1;
}

#ifdef DRC_CUDA_LAYER_H
#include <dlfcn.h>

/*
 * In-process tests: reset the double and install it in drc's one driver
 * table, filled from the loaded library as drc fills it from the driver.
 */
static inline struct drc__cuda_driver *fc_table_(void)
{
    static struct drc__cuda_driver table;
    static int filled;

    if (!filled) {
        void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);

        drc__cuda_fill(h, &table);
        filled = 1;
    }
    return &table;
}

/* ... with no shared runtime visible (as a static libcudart): drc emulates cudaFree. */
static inline void fc_reset(void)
{
    struct drc__cuda_driver *t = fc_table_();

    fake_cuda_reset();
    t->cudaFree = NULL;
    t->cudaFreeAsync = NULL;
    drc__cuda_set_driver(t);
}

/*
 * After fc_reset(): a shared libcudart is visible, as drc__cuda_runtime() finds one for the
 * real driver; its cudaFree and cudaFreeAsync are the double's (fc_cudaFree ...).
 */
static inline void fc_shared_runtime(void)
{
    struct drc__cuda_driver *t = fc_table_();

    t->cudaFree = fc_cudaFree;
    t->cudaFreeAsync = fc_cudaFreeAsync;
}
#endif

#endif
