/* A small DOUBLE of libcuda.so.1 for loopnic's own test (no GPU in CI): built as
 * build/loopnic/fakecuda/libcuda.so.1 and dlopen()ed by test_loopnic by path.
 *
 * "Device memory" is ordinary host memory in a reserved arena, so the test can look at what the
 * provider copied into it; cuPointerGetAttribute says it is device memory. Each allocation takes
 * one 2 MiB slot, the first free one, so freeing and allocating again gives the same address
 * with a new buffer id, as the real driver does. Just what loopnic calls (cuPointerGetAttribute
 * MEMORY_TYPE / BUFFER_ID / CONTEXT, cuMemcpy, contexts) and cuMemAlloc_v2 / cuMemFree_v2, and what
 * drc's CUDA layer needs to export a dmabuf (the end-to-end suite, tests/e2e): one device,
 * cuPointerGetAttributes, cuMemGetAddressRange_v2 (the 2 MiB slot), cuMemGetHandleForAddressRange
 * (a memfd of the range's size), and fakecu_dmabuf_base(), a test-only function with which loopnic
 * finds the memory behind such an fd, so that a wrong dmabuf offset moves the wrong bytes. */
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define API __attribute__((visibility("default")))
enum { SLOTS = 16, SLOT = 2 << 20 };
enum { OK = 0, INVALID_VALUE = 1, OUT_OF_MEMORY = 2 };

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static char *arena;
static unsigned long long ids[SLOTS]; /* 0: free */
static unsigned long long next_id = 100;
static char fake_ctx;

static int slot_of(unsigned long long p)
{
    uintptr_t a = (uintptr_t)p;

    if (!arena || a < (uintptr_t)arena || a >= (uintptr_t)arena + (size_t)SLOTS * SLOT)
        return -1;
    return (int)((a - (uintptr_t)arena) / SLOT);
}

API int cuInit(unsigned flags)
{
    (void)flags;
    return OK;
}

API int cuMemAlloc_v2(unsigned long long *dptr, size_t size)
{
    int rc = OUT_OF_MEMORY;

    if (size == 0 || size > SLOT)
        return INVALID_VALUE;
    pthread_mutex_lock(&lock);
    if (!arena) {
        void *p = mmap(NULL, (size_t)SLOTS * SLOT, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        arena = p == MAP_FAILED ? NULL : p;
    }
    for (int i = 0; arena && i < SLOTS; i++)
        if (!ids[i]) {
            ids[i] = next_id++;
            memset(arena + (size_t)i * SLOT, 0, SLOT);
            *dptr = (uintptr_t)(arena + (size_t)i * SLOT);
            rc = OK;
            break;
        }
    pthread_mutex_unlock(&lock);
    return rc;
}

API int cuMemFree_v2(unsigned long long dptr)
{
    int s, rc = INVALID_VALUE;

    pthread_mutex_lock(&lock);
    s = slot_of(dptr);
    if (s >= 0 && ids[s] && dptr == (uintptr_t)(arena + (size_t)s * SLOT)) {
        ids[s] = 0;
        rc = OK;
    }
    pthread_mutex_unlock(&lock);
    return rc;
}

/* CU_POINTER_ATTRIBUTE_CONTEXT = 1, MEMORY_TYPE = 2, BUFFER_ID = 7; CU_MEMORYTYPE_DEVICE = 2 */
API int cuPointerGetAttribute(void *data, int attr, unsigned long long ptr)
{
    int s, rc = INVALID_VALUE;

    pthread_mutex_lock(&lock);
    s = slot_of(ptr);
    if (s >= 0 && ids[s]) {
        rc = OK;
        if (attr == 1)
            *(void **)data = &fake_ctx;
        else if (attr == 2)
            *(unsigned int *)data = 2;
        else if (attr == 7)
            *(unsigned long long *)data = ids[s];
        else
            rc = INVALID_VALUE;
    }
    pthread_mutex_unlock(&lock);
    return rc;
}

/* ---- what drc's CUDA layer needs to export a dmabuf ---- */
enum { MAX_EXPORTS = 256 };
static struct { unsigned long long dev, ino, base; } exported[MAX_EXPORTS];
static unsigned nexported;

API int cuDriverGetVersion(int *v) { *v = 13000; return OK; }
API int cuDeviceGetCount(int *n) { *n = 1; return OK; }
API int cuDeviceGet(int *dev, int ordinal) { *dev = 0; return ordinal == 0 ? OK : 101; }
API int cuDevicePrimaryCtxRetain(void **ctx, int dev) { *ctx = &fake_ctx; return dev == 0 ? OK : 101; }
API int cuDevicePrimaryCtxRelease_v2(int dev) { return dev == 0 ? OK : 101; }
API int cuCtxSetCurrent(void *ctx) { (void)ctx; return OK; }

API int cuDeviceGetName(char *name, int len, int dev)
{
    (void)dev;
    if (len > 0) {
        strncpy(name, "fake GPU (loopnic's CUDA double)", (size_t)len);
        name[len - 1] = 0;
    }
    return OK;
}

/* DMA_BUF_SUPPORTED (124) and GPU_DIRECT_RDMA_SUPPORTED (116) */
API int cuDeviceGetAttribute(int *value, int attr, int dev)
{
    *value = attr == 124 || attr == 116;
    return dev == 0 ? OK : 101;
}

API int cuMemGetAddressRange_v2(unsigned long long *base, size_t *size, unsigned long long ptr)
{
    int s, rc = 500; /* NOT_FOUND */

    pthread_mutex_lock(&lock);
    s = slot_of(ptr);
    if (s >= 0 && ids[s]) {
        if (base)
            *base = (uintptr_t)(arena + (size_t)s * SLOT);
        if (size)
            *size = SLOT;
        rc = OK;
    }
    pthread_mutex_unlock(&lock);
    return rc;
}

/* CONTEXT 1, MEMORY_TYPE 2, BUFFER_ID 7, IS_MANAGED 8, DEVICE_ORDINAL 9, GPU_DIRECT_RDMA 15: zeros
 * and success for memory that is not ours, as the driver does */
API int cuPointerGetAttributes(unsigned n, const int *attrs, void **data, unsigned long long ptr)
{
    int s, dev;
    unsigned long long id;

    pthread_mutex_lock(&lock);
    s = slot_of(ptr);
    dev = s >= 0 && ids[s];
    id = dev ? ids[s] : 0;
    pthread_mutex_unlock(&lock);
    for (unsigned i = 0; i < n; i++)
        switch (attrs[i]) {
        case 1: *(void **)data[i] = dev ? &fake_ctx : NULL; break;
        case 2: *(unsigned *)data[i] = dev ? 2u : 0u; break;
        case 7: *(unsigned long long *)data[i] = id; break;
        case 8: *(unsigned *)data[i] = 0; break;
        case 9: *(int *)data[i] = dev ? 0 : -2; break;
        case 15: *(unsigned *)data[i] = (unsigned)dev; break;
        default: return INVALID_VALUE;
        }
    return OK;
}

/* CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD = 1; host-page alignment required, flags refused */
API int cuMemGetHandleForAddressRange(void *handle, unsigned long long ptr, size_t size, int type,
                                      unsigned long long flags)
{
    unsigned long long page = (unsigned long long)sysconf(_SC_PAGESIZE), base;
    size_t len;
    struct stat st;
    int fd;

    if (type != 1 || !size || (ptr & (page - 1)) || (size & (page - 1)))
        return INVALID_VALUE;
    if (flags)
        return 801; /* NOT_SUPPORTED */
    if (cuMemGetAddressRange_v2(&base, &len, ptr) != OK || ptr + size > base + len)
        return INVALID_VALUE;
    fd = memfd_create("fake-dmabuf", MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, (off_t)size) != 0 || fstat(fd, &st) != 0) {
        if (fd >= 0)
            close(fd);
        return OUT_OF_MEMORY;
    }
    pthread_mutex_lock(&lock);
    exported[nexported % MAX_EXPORTS].dev = st.st_dev;
    exported[nexported % MAX_EXPORTS].ino = st.st_ino;
    exported[nexported % MAX_EXPORTS].base = ptr;
    nexported++;
    pthread_mutex_unlock(&lock);
    *(int *)handle = fd;
    return OK;
}

/* Test-only: the address of byte 0 of dmabuf fd (an export of this double). 0 or -1. */
API int fakecu_dmabuf_base(int fd, unsigned long long *base)
{
    struct stat st;
    int rc = -1;

    if (fstat(fd, &st) != 0)
        return -1;
    pthread_mutex_lock(&lock);
    for (unsigned i = 0; i < nexported && i < MAX_EXPORTS; i++)
        if (exported[i].dev == st.st_dev && exported[i].ino == st.st_ino) {
            *base = exported[i].base;
            rc = 0;
        }
    pthread_mutex_unlock(&lock);
    return rc;
}

API int cuMemcpy(unsigned long long dst, unsigned long long src, size_t n)
{
    memmove((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n);
    return OK;
}

API int cuCtxGetCurrent(void **ctx)
{
    *ctx = &fake_ctx;
    return OK;
}

API int cuCtxPushCurrent_v2(void *ctx)
{
    (void)ctx;
    return OK;
}

API int cuCtxPopCurrent_v2(void **ctx)
{
    *ctx = &fake_ctx;
    return OK;
}
