/* The libcuda.so.1 DOUBLE: see fake_libcuda.h. */
#include "fake_libcuda.h"

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

enum {
    OK = 0, INVALID_VALUE = 1, OUT_OF_MEMORY = 2, NOT_FOUND = 500, NOT_SUPPORTED = 801, INVALID_DEVICE = 101,
    MAX_ALLOCS = 4096,
};
#define ALIGN   (2ull << 20)
#define RESERVE (64ull << 30)

struct alloc {
    uintptr_t base;
    size_t len;         /* 0: free slot */
    unsigned long long id;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static uintptr_t arena, arena_top;
static struct alloc allocs[MAX_ALLOCS];
static unsigned long long next_id = 1;
static unsigned exports;
static char primary_ctx;                 /* the one context: its address */
static __thread void *current;

unsigned fakecu_exports(void)
{
    return __atomic_load_n(&exports, __ATOMIC_RELAXED);
}

int cuInit(unsigned flags)
{
    (void)flags;
    return OK;
}

int cuDriverGetVersion(int *v)
{
    *v = 13000;
    return OK;
}

int cuDeviceGetCount(int *n)
{
    *n = 1;
    return OK;
}

int cuDeviceGet(int *dev, int ordinal)
{
    if (ordinal != 0)
        return INVALID_DEVICE;
    *dev = 0;
    return OK;
}

int cuDeviceGetName(char *name, int len, int dev)
{
    (void)dev;
    strncpy(name, "fake GPU (libcuda double)", (size_t)len);
    if (len > 0)
        name[len - 1] = 0;
    return OK;
}

int cuDeviceGetAttribute(int *value, int attr, int dev)
{
    if (dev != 0)
        return INVALID_DEVICE;
    *value = attr == 124 /* DMA_BUF_SUPPORTED */ || attr == 116 /* GPU_DIRECT_RDMA_SUPPORTED */;
    return OK;
}

int cuDevicePrimaryCtxRetain(void **ctx, int dev)
{
    if (dev != 0)
        return INVALID_DEVICE;
    *ctx = &primary_ctx;
    return OK;
}

int cuDevicePrimaryCtxRelease_v2(int dev)
{
    return dev == 0 ? OK : INVALID_DEVICE;
}

int cuCtxGetCurrent(void **ctx)
{
    *ctx = current;
    return OK;
}

int cuCtxSetCurrent(void *ctx)
{
    current = ctx;
    return OK;
}

/* The allocation containing @p (lock held), or NULL. */
static struct alloc *find(uintptr_t p)
{
    int i;

    for (i = 0; i < MAX_ALLOCS; i++)
        if (allocs[i].len && p >= allocs[i].base && p - allocs[i].base < allocs[i].len)
            return &allocs[i];
    return NULL;
}

int cuMemAlloc_v2(unsigned long long *dptr, size_t size)
{
    size_t len = (size + ALIGN - 1) & ~(ALIGN - 1);
    uintptr_t base = 0;
    struct alloc *slot = NULL;
    int i, j;

    if (!size)
        return INVALID_VALUE;
    pthread_mutex_lock(&lock);
    if (!arena) {
        void *p = mmap(NULL, RESERVE + ALIGN, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);

        if (p == MAP_FAILED) {
            pthread_mutex_unlock(&lock);
            return OUT_OF_MEMORY;
        }
        arena = ((uintptr_t)p + ALIGN - 1) & ~(ALIGN - 1);
        arena_top = arena;
    }
    /* first fit among the gaps left by frees, else the top: the same size comes back at the same VA */
    for (base = arena; base < arena_top && !slot;) {
        struct alloc *a = NULL;

        for (i = 0; i < MAX_ALLOCS; i++)
            if (allocs[i].len && allocs[i].base < base + len && base < allocs[i].base + allocs[i].len &&
                (!a || allocs[i].base < a->base))
                a = &allocs[i];
        if (!a && base + len <= arena_top)
            break;
        base = a ? a->base + a->len : arena_top;
    }
    if (base + len > arena + RESERVE) {
        pthread_mutex_unlock(&lock);
        return OUT_OF_MEMORY;
    }
    for (j = 0; j < MAX_ALLOCS && allocs[j].len; j++)
        ;
    if (j == MAX_ALLOCS) {
        pthread_mutex_unlock(&lock);
        return OUT_OF_MEMORY;
    }
    slot = &allocs[j];
    slot->base = base;
    slot->len = len;
    slot->id = next_id++;
    if (base + len > arena_top)
        arena_top = base + len;
    *dptr = base;
    pthread_mutex_unlock(&lock);
    return OK;
}

int cuMemFree_v2(unsigned long long dptr)
{
    struct alloc *a;
    int rc = INVALID_VALUE;

    pthread_mutex_lock(&lock);
    a = find((uintptr_t)dptr);
    if (a && a->base == dptr) {
        a->len = 0;
        rc = OK;
    }
    pthread_mutex_unlock(&lock);
    return rc;
}

int cuMemGetAddressRange_v2(unsigned long long *base, size_t *size, unsigned long long dptr)
{
    struct alloc *a;
    int rc = NOT_FOUND;

    pthread_mutex_lock(&lock);
    a = find((uintptr_t)dptr);
    if (a) {
        if (base)
            *base = a->base;
        if (size)
            *size = a->len;
        rc = OK;
    }
    pthread_mutex_unlock(&lock);
    return rc;
}

int cuPointerGetAttributes(unsigned n, const int *attrs, void **data, unsigned long long ptr)
{
    struct alloc *a, copy = { 0 };
    unsigned i;

    pthread_mutex_lock(&lock);
    a = find((uintptr_t)ptr);
    if (a)
        copy = *a;
    pthread_mutex_unlock(&lock);
    for (i = 0; i < n; i++) {
        switch (attrs[i]) {
        case 1: /* CONTEXT */
            *(void **)data[i] = a ? &primary_ctx : NULL;
            break;
        case 2: /* MEMORY_TYPE */
            *(unsigned *)data[i] = a ? 2u : 0u;
            break;
        case 7: /* BUFFER_ID */
            *(unsigned long long *)data[i] = copy.id;
            break;
        case 8: /* IS_MANAGED */
            *(unsigned *)data[i] = 0;
            break;
        case 9: /* DEVICE_ORDINAL */
            *(int *)data[i] = a ? 0 : -2;
            break;
        case 15: /* IS_GPU_DIRECT_RDMA_CAPABLE */
            *(unsigned *)data[i] = a != NULL;
            break;
        default:
            return INVALID_VALUE;
        }
    }
    return OK;
}

int cuMemGetHandleForAddressRange(void *handle, unsigned long long ptr, size_t size, int type,
                                  unsigned long long flags)
{
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    struct alloc *a;
    int fd;

    if (type != 1 /* DMA_BUF_FD */ || !size || (ptr & (page - 1)) || (size & (page - 1)))
        return INVALID_VALUE;
    if (flags)
        return NOT_SUPPORTED;   /* the PCIe mapping type, as on the H200 machine */
    pthread_mutex_lock(&lock);
    a = find((uintptr_t)ptr);
    if (!a || ptr + size > a->base + a->len) {
        pthread_mutex_unlock(&lock);
        return INVALID_VALUE;
    }
    pthread_mutex_unlock(&lock);
    fd = memfd_create("fake-dmabuf", MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, (off_t)size) != 0) {
        if (fd >= 0)
            close(fd);
        return OUT_OF_MEMORY;
    }
    *(int *)handle = fd;
    __atomic_fetch_add(&exports, 1, __ATOMIC_RELAXED);
    return OK;
}
