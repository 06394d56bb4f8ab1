/* The libcuda.so.1 double: see fake_cuda.h. */
#include "fake_cuda.h"

#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

enum {
    MAX_ALLOCS = 64, CUDA_ERROR_INVALID_VALUE = 1, CUDA_ERROR_INVALID_CONTEXT = 201, CUDA_ERROR_NOT_FOUND = 500,
    PER_THREAD_STREAM = 2,
};

static struct {
    uintptr_t base;
    size_t len;
    int host;                   /* cuMemAllocHost */
    unsigned long long id;
} allocs[MAX_ALLOCS];
static fake_cuda_free_cb *free_cb;
static void *free_arg;
static unsigned frees;
static unsigned long long next_id = 1;
static int needs_ctx;
static __thread void *current;

void fake_cuda_needs_context(int on)
{
    needs_ctx = on;
}

/* The CUPTI double's report function (fake_cupti.c), once it has a subscriber. */
typedef void cupti_fire_fn(const char *fn, int site, const void *params, uint64_t *corr);
static cupti_fire_fn *cupti_fire;

void fake_cuda_set_cupti(cupti_fire_fn *fire);
void fake_cuda_set_cupti(cupti_fire_fn *fire)
{
    cupti_fire = fire;
}

/* Run @body between CUPTI's enter and exit reports of @fn with @params. */
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

void fake_cuda_on_free(fake_cuda_free_cb *cb, void *arg)
{
    free_cb = cb;
    free_arg = arg;
}

unsigned fake_cuda_frees(void)
{
    return frees;
}

static int alloc(unsigned long long *dptr, size_t size, int host)
{
    void *p;
    int i;

    for (i = 0; i < MAX_ALLOCS && allocs[i].base; i++)
        ;
    if (i == MAX_ALLOCS || !size)
        return CUDA_ERROR_INVALID_VALUE;
    p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return 2;   /* CUDA_ERROR_OUT_OF_MEMORY */
    allocs[i].base = (uintptr_t)p;
    allocs[i].len = size;
    allocs[i].host = host;
    allocs[i].id = next_id++;
    *dptr = (uintptr_t)p;
    return 0;
}

int cuMemAlloc_v2(unsigned long long *dptr, size_t size)
{
    return alloc(dptr, size, 0);
}

int cuMemAllocHost_v2(void **p, size_t size)
{
    unsigned long long d;
    int rc = alloc(&d, size, 1);

    *p = rc ? NULL : (void *)(uintptr_t)d;
    return rc;
}

static int find(uintptr_t p)
{
    int i;

    for (i = 0; i < MAX_ALLOCS; i++)
        if (allocs[i].base && p >= allocs[i].base && p - allocs[i].base < allocs[i].len)
            return i;
    return -1;
}

int cuMemGetAddressRange_v2(unsigned long long *base, size_t *size, unsigned long long dptr)
{
    int i = find((uintptr_t)dptr);

    if (needs_ctx && !current)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (i < 0)
        return CUDA_ERROR_NOT_FOUND;
    if (base)
        *base = allocs[i].base;
    if (size)
        *size = allocs[i].len;
    return 0;
}

static int release(unsigned long long dptr, const char *entry)
{
    int i = find((uintptr_t)dptr);

    if (i < 0 || allocs[i].base != dptr)
        return CUDA_ERROR_INVALID_VALUE;
    if (free_cb)
        free_cb(allocs[i].base, allocs[i].len, entry, free_arg);
    munmap((void *)allocs[i].base, allocs[i].len);
    allocs[i].base = 0;
    frees++;
    return 0;
}

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
    int i = find((uintptr_t)ptr);
    struct { unsigned long long p; size_t n; } params = { ptr, size };

    /* the fake maps whole allocations only */
    if (i < 0 || allocs[i].base != ptr || allocs[i].len != size)
        return CUDA_ERROR_INVALID_VALUE;
    REPORTED("cuMemUnmap", &params, release(ptr, "cuMemUnmap"));
}

int cuMemFreeHost(void *p)
{
    REPORTED("cuMemFreeHost", &p, release((uintptr_t)p, "cuMemFreeHost"));
}

int cuMemHostUnregister(void *p);
int cuMemHostUnregister(void *p)
{
    REPORTED("cuMemHostUnregister", &p, release((uintptr_t)p, "cuMemHostUnregister"));
}

/* A teardown: every allocation goes. */
static int free_all(const char *entry)
{
    int i;

    for (i = 0; i < MAX_ALLOCS; i++)
        if (allocs[i].base)
            release(allocs[i].base, entry);
    return 0;
}

int cuDevicePrimaryCtxReset_v2(int dev)
{
    REPORTED("cuDevicePrimaryCtxReset_v2", &dev,
             dev == 0 ? free_all("cuDevicePrimaryCtxReset_v2") : CUDA_ERROR_INVALID_VALUE);
}

int cuCtxDestroy_v2(void *ctx);
int cuCtxDestroy_v2(void *ctx)
{
    REPORTED("cuCtxDestroy_v2", &ctx, ctx == FAKE_CUDA_CTX ? free_all("cuCtxDestroy_v2") : CUDA_ERROR_INVALID_VALUE);
}

/* ---- what drc's CUDA layer asks about the memory ---- */

int cuCtxGetCurrent(void **ctx);
int cuCtxGetCurrent(void **ctx)
{
    *ctx = current;
    return 0;
}

int cuCtxSetCurrent(void *ctx);
int cuCtxSetCurrent(void *ctx)
{
    current = ctx;
    return 0;
}

int cuCtxGetDevice(int *dev);
int cuCtxGetDevice(int *dev)
{
    *dev = 0;
    return current ? 0 : CUDA_ERROR_INVALID_CONTEXT;
}

int cuDeviceGet(int *dev, int ordinal);
int cuDeviceGet(int *dev, int ordinal)
{
    *dev = ordinal;
    return ordinal == 0 ? 0 : CUDA_ERROR_INVALID_VALUE;
}

int cuDevicePrimaryCtxRetain(void **ctx, int dev);
int cuDevicePrimaryCtxRetain(void **ctx, int dev)
{
    *ctx = FAKE_CUDA_CTX;
    return dev == 0 ? 0 : CUDA_ERROR_INVALID_VALUE;
}

/* One attribute of the allocation containing @p (pointer attributes of cuda.h). */
static int attr(int a, void *data, unsigned long long p)
{
    int i = find((uintptr_t)p);

    switch (a) {
    case 1: /* CONTEXT */
        *(void **)data = i >= 0 ? FAKE_CUDA_CTX : NULL;
        return 0;
    case 2: /* MEMORY_TYPE: device, or host for cuMemAllocHost */
        *(unsigned *)data = i < 0 ? 0u : allocs[i].host ? 1u : 2u;
        return 0;
    case 7: /* BUFFER_ID */
        *(unsigned long long *)data = i >= 0 ? allocs[i].id : 0;
        return 0;
    case 8: /* IS_MANAGED */
        *(unsigned *)data = 0;
        return 0;
    case 9: /* DEVICE_ORDINAL */
        *(int *)data = i >= 0 ? 0 : -2;
        return 0;
    case 11: /* RANGE_START_ADDR */
        if (i < 0)
            return CUDA_ERROR_INVALID_VALUE;
        *(unsigned long long *)data = allocs[i].base;
        return 0;
    case 12: /* RANGE_SIZE */
        if (i < 0)
            return CUDA_ERROR_INVALID_VALUE;
        *(size_t *)data = allocs[i].len;
        return 0;
    case 15: /* IS_GPU_DIRECT_RDMA_CAPABLE */
        *(unsigned *)data = i >= 0;
        return 0;
    default:
        return CUDA_ERROR_INVALID_VALUE;
    }
}

int cuPointerGetAttribute(void *data, int a, unsigned long long p);
int cuPointerGetAttribute(void *data, int a, unsigned long long p)
{
    return attr(a, data, p);
}

int cuPointerGetAttributes(unsigned n, const int *attrs, void **data, unsigned long long p);
int cuPointerGetAttributes(unsigned n, const int *attrs, void **data, unsigned long long p)
{
    unsigned i;
    int rc;

    for (i = 0; i < n; i++)
        if ((rc = attr(attrs[i], data[i], p)) && attrs[i] != 11 && attrs[i] != 12)
            return rc;
    return 0;
}

/* The dmabuf: an fd of /dev/null (drc closes it after the registration). */
int cuMemGetHandleForAddressRange(void *handle, unsigned long long p, size_t size, int type, unsigned long long f);
int cuMemGetHandleForAddressRange(void *handle, unsigned long long p, size_t size, int type, unsigned long long f)
{
    (void)size;
    if (type != 1 || f || find((uintptr_t)p) < 0)
        return f ? 801 : CUDA_ERROR_INVALID_VALUE;
    *(int *)handle = open("/dev/null", O_RDONLY | O_CLOEXEC);
    return 0;
}

/* The 32-bit cuMemFree of CUDA < 3.2: a test that gets it was handed the wrong entry point. */
static int cuMemFree_v1(unsigned int dptr)
{
    (void)dptr;
    return CUDA_ERROR_INVALID_VALUE;
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
    return NULL;
}

int cuGetProcAddress(const char *symbol, void **pfn, int version, unsigned long long flags)
{
    *pfn = lookup(symbol, version, flags);
    return *pfn ? 0 : CUDA_ERROR_NOT_FOUND;
}

int cuGetProcAddress_v2(const char *symbol, void **pfn, int version, unsigned long long flags, int *status)
{
    *pfn = lookup(symbol, version, flags);
    if (status)
        *status = *pfn ? 0 : 1;     /* CU_GET_PROC_ADDRESS_SUCCESS / SYMBOL_NOT_FOUND */
    return *pfn ? 0 : CUDA_ERROR_NOT_FOUND;
}
