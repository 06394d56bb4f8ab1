/* The CUDA double, a fake libcuda.so.1: see fake_libcuda.h. */
#include "fake_libcuda.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>

enum {
    OK = 0, INVALID_VALUE = 1, OUT_OF_MEMORY = 2, INVALID_DEVICE = 101, INVALID_CONTEXT = 201, NOT_FOUND = 500,
    NOT_SUPPORTED = 801, PER_THREAD_STREAM = 2,
    MEMORYTYPE_HOST = 1, MEMORYTYPE_DEVICE = 2,
    DMA_BUF_FD = 1, PCIE_FLAG = 1, DMA_BUF_SUPPORTED = 124, VMM_SUPPORTED = 102, RDMA_WITH_VMM_SUPPORTED = 110,
    ALLOCATION_PINNED = 1, LOCATION_DEVICE = 1,
};
#define ALIGN   (2ull << 20)
#define RESERVE (64ull << 30)

struct fake_cuda fc = { .pcie_unsupported = 1, .dmabuf_attr = { 1, 1 } };   /* as on the H200 machine */
__thread void *fc_current;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int primary_refs[FC_DEVICES];    /* references to each primary context */
static uintptr_t arena;
static uint64_t next_id = 1000;
static unsigned exports;
static fake_cuda_free_cb *free_cb;
static void *free_arg;

/*
 * fork(): the double's lock is held for its own bookkeeping only (never across a call out of it),
 * so the fork waits for it and the child gets it free, the record whole: a test's child then hangs
 * only where drc would (tests/verbs/test_regmr_fork_mt.c). Not what the real driver offers: CUDA is
 * not usable in a child.
 */
static void fork_prepare(void)
{
    pthread_mutex_lock(&lock);
}

static void fork_parent(void)
{
    pthread_mutex_unlock(&lock);
}

static void fork_child(void)
{
    pthread_mutex_init(&lock, NULL);
}

__attribute__((constructor)) static void fork_init(void)
{
    pthread_atfork(fork_prepare, fork_parent, fork_child);
}

/* VMM (cuMemCreate, cuMemAddressReserve, cuMemMap): physical handles and reserved ranges */
#define CREATED 0x100000ull     /* a cuMemCreate handle is CREATED + slot; a retained one, a chunk's index + 1 */
static struct { size_t size; int type, device, gdr, live; } handles[FC_MAX_ALLOCS];
static struct { uintptr_t base; size_t size; } reserved[FC_MAX_ALLOCS];
static int nreserved;

void fake_cuda_reset(void)
{
    int i;

    pthread_mutex_lock(&lock);
    memset(&fc, 0, sizeof(fc));
    memset(primary_refs, 0, sizeof(primary_refs));
    memset(handles, 0, sizeof(handles));
    nreserved = 0;
    for (i = 0; i < FC_DEVICES; i++)
        fc.dmabuf_attr[i] = 1;
    fc_current = NULL;
    pthread_mutex_unlock(&lock);
}

void fake_cuda_on_free(fake_cuda_free_cb *cb, void *arg)
{
    free_cb = cb;
    free_arg = arg;
}

unsigned fake_cuda_frees(void)
{
    return (unsigned)__atomic_load_n(&fc.frees, __ATOMIC_RELAXED);
}

void fake_cuda_needs_context(int on)
{
    fc.range_needs_ctx = on;
}

unsigned fakecu_exports(void)
{
    return __atomic_load_n(&exports, __ATOMIC_RELAXED);
}

/* ---- the allocation table ---------------------------------------------------- */

static struct fc_alloc *add(uintptr_t base, size_t size, unsigned type, int device, uint64_t id, void *ctx)
{
    struct fc_alloc *a;

    if (fc.n == FC_MAX_ALLOCS)
        return NULL;
    a = &fc.a[fc.n++];
    *a = (struct fc_alloc){ .base = base, .size = size, .type = type, .device = device, .gdr = 1, .buffer_id = id, .ctx = ctx };
    return a;
}

struct fc_alloc *fc_add(uintptr_t base, size_t size, int device, uint64_t id)
{
    return add(base, size, MEMORYTYPE_DEVICE, device, id, FC_CTX(device));
}

struct fc_alloc *fc_add_vmm(uintptr_t base, size_t size, int device, uint64_t id, int gdr)
{
    struct fc_alloc *a = fc_add(base, size, device, id);

    a->vmm = 1;
    a->gdr = gdr;
    a->ctx = NULL;
    return a;
}

struct fc_alloc *fc_add_host(uintptr_t base, size_t size, uint64_t id)
{
    return add(base, size, MEMORYTYPE_HOST, -1, id, NULL);
}

/* The allocation containing @p, or NULL. */
static struct fc_alloc *find(unsigned long long p)
{
    int i;

    for (i = 0; i < fc.n; i++)
        if (p >= fc.a[i].base && p - fc.a[i].base < fc.a[i].size)
            return &fc.a[i];
    return NULL;
}

/* The device of a context of this double (-1: none). */
static int ctx_device(const void *ctx)
{
    if ((uintptr_t)ctx >= 0xc0 && (uintptr_t)ctx < 0xc0 + FC_DEVICES)
        return (int)((uintptr_t)ctx - 0xc0);
    if ((uintptr_t)ctx >= 0xd00 && (uintptr_t)ctx < 0xd00 + FC_DEVICES)
        return (int)((uintptr_t)ctx - 0xd00);
    return -1;
}

/* The arena every allocation and reservation of the double lies in (lock held): 0 or OUT_OF_MEMORY. */
static int arena_ready(void)
{
    void *p;

    if (arena)
        return OK;
    p = mmap(NULL, RESERVE + ALIGN, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
        return OUT_OF_MEMORY;
    arena = ((uintptr_t)p + ALIGN - 1) & ~(ALIGN - 1);
    return OK;
}

/* First fit in the arena, clear of allocations and reservations (lock held): the address, or 0. */
static uintptr_t place(size_t len)
{
    uintptr_t base = arena;
    int i, moved;

    do {
        moved = 0;
        for (i = 0; i < fc.n; i++) {
            if (fc.a[i].base < base + len && base < fc.a[i].base + fc.a[i].size) {
                base = (fc.a[i].base + fc.a[i].size + ALIGN - 1) & ~(ALIGN - 1);
                moved = 1;
            }
        }
        for (i = 0; i < nreserved; i++) {
            if (reserved[i].base < base + len && base < reserved[i].base + reserved[i].size) {
                base = (reserved[i].base + reserved[i].size + ALIGN - 1) & ~(ALIGN - 1);
                moved = 1;
            }
        }
    } while (moved);
    return base + len > arena + RESERVE ? 0 : base;
}

/* First fit in the reserved range: a freed gap of the same size gives the same address again. */
static int alloc(unsigned long long *out, size_t size, unsigned type)
{
    size_t len = (size + ALIGN - 1) & ~(ALIGN - 1);
    void *ctx = fc_current ? fc_current : FAKE_CUDA_CTX;
    uintptr_t base;

    if (!size)
        return INVALID_VALUE;
    if (fc.strict_ctx && !fc_current)
        return INVALID_CONTEXT;
    pthread_mutex_lock(&lock);
    if (arena_ready() != OK || !(base = place(len)) ||
        !add(base, len, type, type == MEMORYTYPE_HOST ? -1 : ctx_device(ctx), next_id++,
             type == MEMORYTYPE_HOST ? NULL : ctx)) {
        pthread_mutex_unlock(&lock);
        return OUT_OF_MEMORY;
    }
    mprotect((void *)base, len, PROT_READ | PROT_WRITE);    /* host memory behind it, zero */
    *out = base;
    pthread_mutex_unlock(&lock);
    return OK;
}

int cuMemAlloc_v2(unsigned long long *dptr, size_t size)
{
    __atomic_fetch_add(&fc.allocs, 1, __ATOMIC_RELAXED);
    return alloc(dptr, size, MEMORYTYPE_DEVICE);
}

int cuMemAllocHost_v2(void **p, size_t size)
{
    unsigned long long d = 0;
    int rc = alloc(&d, size, MEMORYTYPE_HOST);

    *p = rc ? NULL : (void *)(uintptr_t)d;
    return rc;
}

/* Free the allocation that starts at @p (the test's callback first, while it still exists). */
static int release(unsigned long long p, const char *entry)
{
    struct fc_alloc *a, copy;

    pthread_mutex_lock(&lock);
    a = find(p);
    if (!a || a->base != p) {
        pthread_mutex_unlock(&lock);
        return INVALID_VALUE;
    }
    copy = *a;
    pthread_mutex_unlock(&lock);
    if (free_cb)
        free_cb(copy.base, copy.size, entry, free_arg);
    pthread_mutex_lock(&lock);
    a = find(p);
    if (a)
        *a = fc.a[--fc.n];
    if (arena && copy.base >= arena && copy.base < arena + RESERVE) {    /* gone, and zero when reallocated */
        madvise((void *)copy.base, copy.size, MADV_DONTNEED);
        mprotect((void *)copy.base, copy.size, PROT_NONE);
    }
    __atomic_fetch_add(&fc.frees, 1, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&lock);
    return fc.free_rc ? fc.free_rc : OK;
}

/* A teardown: every allocation of @device (-1: all) goes, each through the callback. */
static int release_all(int device, const char *entry)
{
    int i;

    for (i = fc.n - 1; i >= 0; i--)
        if (i < fc.n && (device < 0 || fc.a[i].device == device || fc.a[i].type == MEMORYTYPE_HOST))
            release(fc.a[i].base, entry);
    return OK;
}

/* ---- the CUPTI double's report (fake_cupti.c), once it has a subscriber ---------- */

typedef void cupti_fire_fn(const char *fn, int site, const void *params, uint64_t *corr);
static cupti_fire_fn *cupti_fire;

void fake_cuda_set_cupti(cupti_fire_fn *fire);
void fake_cuda_set_cupti(cupti_fire_fn *fire)
{
    cupti_fire = fire;
}

/* Return @body, run between CUPTI's enter and exit reports of @fn with @params. */
#define REPORTED(fn, params, body)                                                      \
    do {                                                                                \
        uint64_t corr_ = 0;                                                             \
        int rc_;                                                                        \
        if (cupti_fire)                                                                 \
            cupti_fire(fn, 0, params, &corr_);                                          \
        rc_ = (body);                                                                   \
        if (cupti_fire)                                                                 \
            cupti_fire(fn, 1, params, &corr_);                                          \
        return rc_;                                                                     \
    } while (0)

/* ---- frees ------------------------------------------------------------------------ */

int cuMemFree_v2(unsigned long long dptr)
{
    REPORTED("cuMemFree_v2", &dptr, release(dptr, "cuMemFree_v2"));
}

int cuMemFreeAsync(unsigned long long dptr, void *stream)
{
    struct { unsigned long long p; void *s; } params = { dptr, stream };

    REPORTED("cuMemFreeAsync", &params, release(dptr, "cuMemFreeAsync"));
}

int cuMemFreeAsync_ptsz(unsigned long long dptr, void *stream)
{
    struct { unsigned long long p; void *s; } params = { dptr, stream };

    REPORTED("cuMemFreeAsync_ptsz", &params, release(dptr, "cuMemFreeAsync_ptsz"));
}

int cuMemUnmap(unsigned long long ptr, size_t size)
{
    struct { unsigned long long p; size_t n; } params = { ptr, size };
    struct fc_alloc *a = find(ptr);

    /* the double maps whole allocations only (cuMemAlloc_v2 rounds them up to 2 MiB) */
    fc.unmap_size = size;
    if (!a || a->base != ptr || !size || size > a->size)
        return INVALID_VALUE;
    REPORTED("cuMemUnmap", &params, release(ptr, "cuMemUnmap"));
}

int cuMemFreeHost(void *p)
{
    REPORTED("cuMemFreeHost", &p, release((uintptr_t)p, "cuMemFreeHost"));
}

int cuMemHostUnregister(void *p)
{
    REPORTED("cuMemHostUnregister", &p, release((uintptr_t)p, "cuMemHostUnregister"));
}

/* Imported memory (cuIpcOpenMemHandle): the double models one reference, so the close unmaps it. */
int cuIpcCloseMemHandle(unsigned long long dptr)
{
    REPORTED("cuIpcCloseMemHandle", &dptr, release(dptr, "cuIpcCloseMemHandle"));
}

/*
 * The frees of a shared libcudart, for the in-process table (fc_shared_runtime): the runtime
 * waits for the device in a context of its own and frees, through no entry point of this table.
 * They return a cudaError_t (cudaErrorInvalidValue, 1, for a pointer that is no allocation).
 */
int fc_cudaFree(void *p)
{
    return p ? release((uintptr_t)p, "cudaFree") : OK;     /* NULL: the runtime's "initialise" idiom */
}

int fc_cudaFreeAsync(void *p, void *stream)
{
    (void)stream;
    return release((uintptr_t)p, "cudaFreeAsync");
}

int cuDevicePrimaryCtxReset_v2(int dev)
{
    fc.resets++;
    fc.reset_dev = dev;
    REPORTED("cuDevicePrimaryCtxReset_v2", &dev,
             dev >= 0 && dev < FC_DEVICES ? release_all(dev, "cuDevicePrimaryCtxReset_v2") : INVALID_DEVICE);
}

int cuCtxDestroy_v2(void *ctx)
{
    fc.destroys++;
    REPORTED("cuCtxDestroy_v2", &ctx, ctx_device(ctx) >= 0 ? release_all(ctx_device(ctx), "cuCtxDestroy_v2") : INVALID_CONTEXT);
}

/* ---- contexts and devices ------------------------------------------------------- */

int cuInit(unsigned flags);
int cuInit(unsigned flags)
{
    (void)flags;
    return OK;
}

int cuDriverGetVersion(int *v);
int cuDriverGetVersion(int *v)
{
    *v = 13000;
    return OK;
}

int cuDeviceGetCount(int *n);
int cuDeviceGetCount(int *n)
{
    *n = FC_DEVICES;
    return OK;
}

int cuDeviceGet(int *dev, int ordinal);
int cuDeviceGet(int *dev, int ordinal)
{
    *dev = ordinal;
    return ordinal >= 0 && ordinal < FC_DEVICES ? OK : INVALID_DEVICE;
}

int cuDeviceGetName(char *name, int len, int dev);
int cuDeviceGetName(char *name, int len, int dev)
{
    (void)dev;
    if (len > 0) {
        strncpy(name, "fake GPU (libcuda double)", (size_t)len);
        name[len - 1] = 0;
    }
    return OK;
}

/* PCI bus ids as the driver writes them (upper case): device 0 at 1b:00.0, device 1 at 9b:00.0. */
int cuDeviceGetPCIBusId(char *bus, int len, int dev);
int cuDeviceGetPCIBusId(char *bus, int len, int dev)
{
    if (dev < 0 || dev >= FC_DEVICES || len < 13)
        return INVALID_VALUE;
    snprintf(bus, (size_t)len, "0000:%s:00.0", dev ? "9B" : "1B");
    return OK;
}

int cuDeviceGetAttribute(int *v, int attr, int dev);
int cuDeviceGetAttribute(int *v, int attr, int dev)
{
    if (dev < 0 || dev >= FC_DEVICES)
        return INVALID_DEVICE;
    if (fc.no_vmm[dev] && (attr == VMM_SUPPORTED || attr == RDMA_WITH_VMM_SUPPORTED))
        *v = 0;
    else
        *v = attr == DMA_BUF_SUPPORTED ? fc.dmabuf_attr[dev] : 1;
    return OK;
}

int cuDevicePrimaryCtxRetain(void **ctx, int dev);
int cuDevicePrimaryCtxRetain(void **ctx, int dev)
{
    if (dev < 0 || dev >= FC_DEVICES)
        return INVALID_DEVICE;
    fc.primary_retains++;
    __atomic_fetch_add(&primary_refs[dev], 1, __ATOMIC_RELAXED);
    *ctx = FC_PRIMARY(dev);
    return OK;
}

/* The last reference resets the context: its memory goes. */
int cuDevicePrimaryCtxRelease_v2(int dev);
int cuDevicePrimaryCtxRelease_v2(int dev)
{
    if (dev < 0 || dev >= FC_DEVICES || primary_refs[dev] <= 0)
        return INVALID_DEVICE;
    REPORTED("cuDevicePrimaryCtxRelease_v2", &dev,
             __atomic_sub_fetch(&primary_refs[dev], 1, __ATOMIC_RELAXED) == 0
                 ? release_all(dev, "cuDevicePrimaryCtxRelease_v2") : OK);
}

int cuDevicePrimaryCtxGetState(int dev, unsigned *flags, int *active);
int cuDevicePrimaryCtxGetState(int dev, unsigned *flags, int *active)
{
    if (dev < 0 || dev >= FC_DEVICES)
        return INVALID_DEVICE;
    *flags = 0;
    *active = primary_refs[dev] > 0;
    return OK;
}

int cuCtxGetCurrent(void **ctx);
int cuCtxGetCurrent(void **ctx)
{
    *ctx = fc_current;
    return OK;
}

int cuCtxSetCurrent(void *ctx);
int cuCtxSetCurrent(void *ctx)
{
    __atomic_fetch_add(&fc.set_calls, 1, __ATOMIC_RELAXED);
    fc_current = ctx;
    return OK;
}

int cuCtxGetDevice(int *dev);
int cuCtxGetDevice(int *dev)
{
    if (!fc_current)
        return INVALID_CONTEXT;
    *dev = ctx_device(fc_current);
    return OK;
}

int cuCtxSynchronize(void)
{
    __atomic_fetch_add(&fc.syncs, 1, __ATOMIC_RELAXED);
    __atomic_store_n(&fc.sync_ctx, fc_current, __ATOMIC_RELAXED);
    return fc_current ? OK : INVALID_CONTEXT;
}

/* ---- what drc's CUDA layer asks about memory --------------------------------------- */

/* One pointer attribute of @a (NULL: not CUDA memory). */
static int attr(const struct fc_alloc *a, int which, void *data)
{
    switch (which) {
    case 1: /* CONTEXT */
        *(void **)data = a ? a->ctx : NULL;
        return OK;
    case 2: /* MEMORY_TYPE */
        *(unsigned *)data = a ? a->type : 0;
        return OK;
    case 7: /* BUFFER_ID */
        *(unsigned long long *)data = a ? a->buffer_id : 0;
        return OK;
    case 8: /* IS_MANAGED */
        *(unsigned *)data = a ? (unsigned)a->managed : 0;
        return OK;
    case 9: /* DEVICE_ORDINAL */
        *(int *)data = a ? a->device : -1;
        return OK;
    case 11: /* RANGE_START_ADDR: needs no context */
        if (!a)
            return INVALID_VALUE;
        *(unsigned long long *)data = a->base;
        return OK;
    case 12: /* RANGE_SIZE */
        if (!a)
            return INVALID_VALUE;
        *(size_t *)data = a->size;
        return OK;
    case 18: /* MAPPING_SIZE */
        if (!a)
            return INVALID_VALUE;
        *(size_t *)data = a->map_size ? a->map_size : a->size;
        return OK;
    case 19: /* MAPPING_BASE_ADDR */
        if (!a)
            return INVALID_VALUE;
        *(unsigned long long *)data = a->map_size ? a->map_base : a->base;
        return OK;
    case 15: /* IS_GPU_DIRECT_RDMA_CAPABLE */
        *(unsigned *)data = a ? (unsigned)a->gdr : 0;
        return OK;
    default:
        return INVALID_VALUE;
    }
}

static int get_attributes(unsigned n, const int *attrs, void **data, unsigned long long ptr)
{
    struct fc_alloc *a, copy;
    unsigned i;
    int rc;

    if (fc.attr_rc)
        return fc.attr_rc;
    pthread_mutex_lock(&lock);
    a = find(ptr);
    if (a)
        copy = *a;
    pthread_mutex_unlock(&lock);
    for (i = 0; i < n; i++)
        if ((rc = attr(a ? &copy : NULL, attrs[i], data[i])) != OK)
            return rc;
    return OK;
}

int cuPointerGetAttributes(unsigned n, const int *attrs, void **data, unsigned long long ptr);
int cuPointerGetAttributes(unsigned n, const int *attrs, void **data, unsigned long long ptr)
{
    __atomic_fetch_add(&fc.mem_queries, 1, __ATOMIC_RELAXED);
    return get_attributes(n, attrs, data, ptr);
}

int cuPointerGetAttribute(void *data, int which, unsigned long long ptr);
int cuPointerGetAttribute(void *data, int which, unsigned long long ptr)
{
    __atomic_fetch_add(&fc.mem_queries, 1, __ATOMIC_RELAXED);
    return get_attributes(1, &which, &data, ptr);
}

int cuMemGetAddressRange_v2(unsigned long long *base, size_t *size, unsigned long long ptr)
{
    struct fc_alloc *a;
    int rc = NOT_FOUND;

    __atomic_fetch_add(&fc.mem_queries, 1, __ATOMIC_RELAXED);
    __atomic_store_n(&fc.range_ctx, fc_current, __ATOMIC_RELAXED);
    if ((fc.range_needs_ctx || fc.strict_ctx) && !fc_current)
        return INVALID_CONTEXT;
    if (fc.range_rc)
        return fc.range_rc;
    pthread_mutex_lock(&lock);
    a = find(ptr);
    if (a && !a->managed) {     /* device memory and pinned host memory have bounds */
        if (base)
            *base = a->base;
        if (size)
            *size = a->size;
        rc = OK;
    }
    pthread_mutex_unlock(&lock);
    return rc;
}

/*
 * Where each exported dmabuf starts, by its inode: fakecu_dmabuf_base() lets the loopback NIC
 * (src/loopnic) find the memory behind a dmabuf MR, so that a wrong dmabuf offset moves the
 * wrong bytes there, as it would on a real NIC (UCX issue 11417). Test-only.
 */
enum { MAX_EXPORTED = 1024 };
static struct { unsigned long long dev, ino, base, id; } exported[MAX_EXPORTED];
static unsigned nexported;

static void remember_export(int fd, unsigned long long base, unsigned long long id)
{
    struct stat st;

    if (fstat(fd, &st) != 0)
        return;
    pthread_mutex_lock(&lock);
    exported[nexported++ % MAX_EXPORTED] = (typeof(exported[0])){ st.st_dev, st.st_ino, base, id };
    pthread_mutex_unlock(&lock);
}

/* The export behind @fd (a dup of it too): its base and the buffer id of the memory it exported. */
static int exported_as(int fd, unsigned long long *base, unsigned long long *id)
{
    struct stat st;
    unsigned i;
    int rc = -1;

    if (fstat(fd, &st) != 0)
        return -1;
    pthread_mutex_lock(&lock);
    for (i = 0; i < nexported && i < MAX_EXPORTED; i++)
        if (exported[i].dev == st.st_dev && exported[i].ino == st.st_ino) {
            *base = exported[i].base;
            *id = exported[i].id;
            rc = 0;
        }
    pthread_mutex_unlock(&lock);
    return rc;
}

int fakecu_dmabuf_base(int fd, unsigned long long *base);
int fakecu_dmabuf_base(int fd, unsigned long long *base)
{
    unsigned long long id;

    return exported_as(fd, base, &id);
}

int fakecu_dmabuf_id(int fd, unsigned long long *id)
{
    unsigned long long base;

    return exported_as(fd, &base, id);
}

/* The dmabuf: a memfd of the range's size. */
int cuMemGetHandleForAddressRange(void *handle, unsigned long long ptr, size_t size, int type,
                                  unsigned long long flags);
int cuMemGetHandleForAddressRange(void *handle, unsigned long long ptr, size_t size, int type,
                                  unsigned long long flags)
{
    struct fc_export *e;
    struct fc_alloc *a;
    unsigned long long id;
    int fd, device;

    pthread_mutex_lock(&lock);
    e = &fc.exports[fc.nexports < FC_MAX_CALLS ? fc.nexports++ : FC_MAX_CALLS - 1];
    *e = (struct fc_export){ ptr, size, flags, fc_current, -1 };
    a = find(ptr);
    device = a ? a->device : -1;
    id = a ? a->buffer_id : 0;
    pthread_mutex_unlock(&lock);
    if (fc.strict_ctx && (!fc_current || (device >= 0 && ctx_device(fc_current) != device)))
        return INVALID_CONTEXT; /* no context, or one of another device */
    if (type != DMA_BUF_FD || !size || ptr % FC_PAGE || size % FC_PAGE || !a)
        return INVALID_VALUE;   /* as the real driver: host-page alignment */
    /* An allocation packed into a pool's mapping (cudaMallocAsync): as the H200 does (CUDA 13), a range
     * from the mapping's base may span its allocations; one from elsewhere must end in the pages of
     * the allocation it starts in. */
    if (a->map_size && ptr != a->map_base && ptr + size > ((a->base + a->size + FC_PAGE - 1) & ~(FC_PAGE - 1)))
        return INVALID_VALUE;
    if (a->map_size && ptr == a->map_base && ptr + size > a->map_base + a->map_size)
        return INVALID_VALUE;
    if ((flags & PCIE_FLAG) && fc.pcie_rc)
        return fc.pcie_rc;      /* e.g. INVALID_VALUE: a driver older than the flag */
    if ((flags & PCIE_FLAG) && fc.pcie_unsupported)
        return NOT_SUPPORTED;
    if (fc.export_rc)
        return fc.export_rc;
    fd = memfd_create("fake-dmabuf", MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, (off_t)size) != 0) {
        if (fd >= 0)
            close(fd);
        return OUT_OF_MEMORY;
    }
    e->fd = fd;
    remember_export(fd, ptr, id);
    *(int *)handle = fd;
    __atomic_fetch_add(&exports, 1, __ATOMIC_RELAXED);
    return OK;
}

/* ---- VMM: the allocation handle behind a mapped chunk ------------------------------- */

struct prop {                   /* CUmemAllocationProp, as drc's cuda.h lays it out */
    int type, requested_handle_types;
    struct { int type, id; } location;
    void *win32_metadata;
    unsigned char compression_type, gpu_direct_rdma_capable;
    unsigned short usage;
    unsigned char reserved[4];
};

int cuMemRetainAllocationHandle(unsigned long long *h, void *addr);
int cuMemRetainAllocationHandle(unsigned long long *h, void *addr)
{
    struct fc_alloc *a;
    int rc = INVALID_VALUE;

    __atomic_fetch_add(&fc.mem_queries, 1, __ATOMIC_RELAXED);
    pthread_mutex_lock(&lock);
    a = find((uintptr_t)addr);
    if (a && a->vmm) {
        fc.retains++;
        *h = (unsigned long long)(a - fc.a) + 1;
        rc = OK;
    }
    pthread_mutex_unlock(&lock);
    return rc;
}

int cuMemGetAllocationPropertiesFromHandle(struct prop *p, unsigned long long h);
int cuMemGetAllocationPropertiesFromHandle(struct prop *p, unsigned long long h)
{
    memset(p, 0, sizeof(*p));
    p->location.type = LOCATION_DEVICE;
    if (h >= CREATED) {         /* a cuMemCreate handle */
        if (h - CREATED >= FC_MAX_ALLOCS || !handles[h - CREATED].live)
            return INVALID_VALUE;
        p->type = handles[h - CREATED].type;
        p->location.id = handles[h - CREATED].device;
        p->gpu_direct_rdma_capable = (unsigned char)handles[h - CREATED].gdr;
        return OK;
    }
    p->type = fc.a[h - 1].prop_type;
    p->location.id = fc.a[h - 1].device;
    p->gpu_direct_rdma_capable = (unsigned char)fc.a[h - 1].gdr;
    return OK;
}

/* Access to a mapped VMM range, per device: recorded in the chunks it covers (whole chunks only). */
int cuMemSetAccess(unsigned long long ptr, size_t size, const void *desc, size_t count)
{
    const struct { struct { int type, id; } location; int flags; } *d = desc;   /* CUmemAccessDesc */
    unsigned long long p;
    struct fc_alloc *a;
    size_t i;
    int rc = OK;

    pthread_mutex_lock(&lock);
    for (p = ptr; rc == OK && p < ptr + size; p = a->base + a->size) {
        a = find(p);
        if (!a || !a->vmm || a->base != p || p + a->size > ptr + size) {
            rc = INVALID_VALUE;
            break;
        }
        for (i = 0; i < count; i++) {
            if (d[i].location.type != 1 || d[i].location.id < 0 || d[i].location.id >= FC_DEVICES) {
                rc = INVALID_DEVICE;
                break;
            }
            if (d[i].flags == 3)        /* PROT_READWRITE */
                a->access |= 1u << d[i].location.id;
            else
                a->access &= ~(1u << d[i].location.id);
        }
    }
    pthread_mutex_unlock(&lock);
    return rc;
}

/* A retained handle's reference, or a cuMemCreate handle: its mapping, if any, keeps the memory. */
int cuMemRelease(unsigned long long h)
{
    int rc = OK;

    pthread_mutex_lock(&lock);
    fc.releases++;
    if (h >= CREATED) {
        if (h - CREATED < FC_MAX_ALLOCS && handles[h - CREATED].live)
            handles[h - CREATED].live = 0;
        else
            rc = INVALID_VALUE;
    }
    pthread_mutex_unlock(&lock);
    return rc ? rc : fc.free_rc ? fc.free_rc : OK;
}

/* ---- VMM: what torch.c builds a segment with ------------------------------------------ */

int cuMemGetAllocationGranularity(size_t *g, const struct prop *p, int option)
{
    (void)option;
    if (!p || p->location.id < 0 || p->location.id >= FC_DEVICES)
        return INVALID_DEVICE;
    *g = FC_GRANULARITY;
    return OK;
}

/* Physical memory of @size on the prop's device: pinned device memory only, in whole granules. */
int cuMemCreate(unsigned long long *h, size_t size, const struct prop *p, unsigned long long flags)
{
    int i;

    (void)flags;
    if (!size || size % FC_GRANULARITY || p->type != ALLOCATION_PINNED || p->location.type != LOCATION_DEVICE)
        return INVALID_VALUE;
    if (p->location.id < 0 || p->location.id >= FC_DEVICES)
        return INVALID_DEVICE;
    pthread_mutex_lock(&lock);
    for (i = 0; i < FC_MAX_ALLOCS && handles[i].live; i++)
        ;
    if (i == FC_MAX_ALLOCS) {
        pthread_mutex_unlock(&lock);
        return OUT_OF_MEMORY;
    }
    handles[i].size = size;
    handles[i].type = p->type;
    handles[i].device = p->location.id;
    handles[i].gdr = p->gpu_direct_rdma_capable;
    handles[i].live = 1;
    fc.creates++;
    *h = CREATED + (unsigned)i;
    pthread_mutex_unlock(&lock);
    return OK;
}

/* A range of addresses in the arena, nothing mapped (the hint @addr is ignored; 2 MiB aligned). */
int cuMemAddressReserve(unsigned long long *ptr, size_t size, size_t align, unsigned long long addr,
                        unsigned long long flags)
{
    uintptr_t base;

    (void)addr;
    (void)flags;
    if (!size || size % FC_GRANULARITY || (align && (ALIGN % align)))
        return INVALID_VALUE;
    pthread_mutex_lock(&lock);
    if (nreserved == FC_MAX_ALLOCS || arena_ready() != OK || !(base = place(size))) {
        pthread_mutex_unlock(&lock);
        return OUT_OF_MEMORY;
    }
    reserved[nreserved].base = base;
    reserved[nreserved++].size = size;
    fc.reserves++;
    *ptr = base;
    pthread_mutex_unlock(&lock);
    return OK;
}

/* The whole of a reservation, as it was made. */
int cuMemAddressFree(unsigned long long ptr, size_t size)
{
    int i, rc = INVALID_VALUE;

    pthread_mutex_lock(&lock);
    for (i = 0; i < nreserved; i++) {
        if (reserved[i].base == ptr && reserved[i].size == size) {
            reserved[i] = reserved[--nreserved];
            fc.address_frees++;
            rc = OK;
            break;
        }
    }
    pthread_mutex_unlock(&lock);
    return rc;
}

/*
 * Map the whole of cuMemCreate handle @h at @ptr, inside a reservation: a VMM chunk of the
 * double (fc.a), with a new buffer id, host memory behind it, until cuMemUnmap.
 */
int cuMemMap(unsigned long long ptr, size_t size, size_t offset, unsigned long long h, unsigned long long flags)
{
    struct fc_alloc *a;
    unsigned long long k = h - CREATED;
    int i, rc = INVALID_VALUE;

    (void)flags;
    pthread_mutex_lock(&lock);
    if (h < CREATED || k >= FC_MAX_ALLOCS || !handles[k].live || offset || size != handles[k].size)
        goto out;
    for (i = 0; i < nreserved; i++)
        if (reserved[i].base <= ptr && ptr + size <= reserved[i].base + reserved[i].size)
            break;
    if (i == nreserved)
        goto out;
    for (i = 0; i < fc.n; i++)
        if (fc.a[i].base < ptr + size && ptr < fc.a[i].base + fc.a[i].size)
            goto out;   /* something is mapped there already */
    a = add((uintptr_t)ptr, size, MEMORYTYPE_DEVICE, handles[k].device, next_id++, NULL);
    if (!a) {
        rc = OUT_OF_MEMORY;
        goto out;
    }
    a->vmm = 1;
    a->gdr = handles[k].gdr;
    a->prop_type = handles[k].type;
    if (arena && ptr >= arena && ptr < arena + RESERVE)
        mprotect((void *)(uintptr_t)ptr, size, PROT_READ | PROT_WRITE);
    rc = OK;
out:
    pthread_mutex_unlock(&lock);
    return rc;
}

/* ---- cuGetProcAddress, as the runtime uses it ---------------------------------------- */

/* The 32-bit cuMemFree of CUDA < 3.2: a test that gets it was handed the wrong entry point. */
static int cuMemFree_v1(unsigned int dptr)
{
    (void)dptr;
    return INVALID_VALUE;
}

static void *lookup(const char *sym, int version, unsigned long long flags)
{
    if (!strcmp(sym, "cuGetProcAddress"))
        return version >= 12000 ? (void *)cuGetProcAddress_v2 : (void *)cuGetProcAddress;
    if (!strcmp(sym, "cuMemFree"))
        return version >= 3020 ? (void *)cuMemFree_v2 : (void *)cuMemFree_v1;
    if (!strcmp(sym, "cuMemFreeAsync") && version >= 11020)
        return (flags & PER_THREAD_STREAM) ? (void *)cuMemFreeAsync_ptsz : (void *)cuMemFreeAsync;
    if (!strcmp(sym, "cuMemUnmap") && version >= 10020)
        return (void *)cuMemUnmap;
    if (!strcmp(sym, "cuMemAlloc") && version >= 3020)
        return (void *)cuMemAlloc_v2;
    if (!strcmp(sym, "cuMemGetAddressRange") && version >= 3020)
        return (void *)cuMemGetAddressRange_v2;
    if (!strcmp(sym, "cuMemFreeHost"))
        return (void *)cuMemFreeHost;
    if (!strcmp(sym, "cuMemHostUnregister"))
        return (void *)cuMemHostUnregister;
    if (!strcmp(sym, "cuDevicePrimaryCtxReset") && version >= 11000)
        return (void *)cuDevicePrimaryCtxReset_v2;
    if (!strcmp(sym, "cuCtxDestroy") && version >= 4000)
        return (void *)cuCtxDestroy_v2;
    if (!strcmp(sym, "cuDevicePrimaryCtxRelease") && version >= 11000)
        return (void *)cuDevicePrimaryCtxRelease_v2;
    if (!strcmp(sym, "cuIpcCloseMemHandle") && version >= 4010)
        return (void *)cuIpcCloseMemHandle;
    return NULL;    /* the caller falls back to dlsym of the exported name */
}

int cuGetProcAddress(const char *symbol, void **pfn, int version, unsigned long long flags)
{
    *pfn = lookup(symbol, version, flags);
    return *pfn ? OK : NOT_FOUND;
}

int cuGetProcAddress_v2(const char *symbol, void **pfn, int version, unsigned long long flags, int *status)
{
    *pfn = lookup(symbol, version, flags);
    if (status)
        *status = *pfn ? 0 : 1;     /* CU_GET_PROC_ADDRESS_SUCCESS / SYMBOL_NOT_FOUND */
    return *pfn ? OK : NOT_FOUND;
}
