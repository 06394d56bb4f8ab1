/* A small DOUBLE of libcuda.so.1 for loopnic's own test (no GPU in CI): built as
 * build/loopnic/fakecuda/libcuda.so.1 and dlopen()ed by test_loopnic by path.
 *
 * "Device memory" is ordinary host memory in a reserved arena, so the test can look at what the
 * provider copied into it; cuPointerGetAttribute says it is device memory. Each allocation takes
 * one 2 MiB slot, the first free one, so freeing and allocating again gives the same address
 * with a new buffer id, as the real driver does. Just what loopnic calls (cuPointerGetAttribute
 * MEMORY_TYPE / BUFFER_ID / CONTEXT, cuMemcpy, contexts) and cuMemAlloc_v2 / cuMemFree_v2. */
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>

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
