/* The libcuda.so.1 double: see fake_cuda.h. */
#include "fake_cuda.h"

#include <string.h>
#include <sys/mman.h>

enum { MAX_ALLOCS = 64, CUDA_ERROR_INVALID_VALUE = 1, CUDA_ERROR_NOT_FOUND = 500, PER_THREAD_STREAM = 2 };

static struct {
    uintptr_t base;
    size_t len;
} allocs[MAX_ALLOCS];
static fake_cuda_free_cb *free_cb;
static void *free_arg;
static unsigned frees;

void fake_cuda_on_free(fake_cuda_free_cb *cb, void *arg)
{
    free_cb = cb;
    free_arg = arg;
}

unsigned fake_cuda_frees(void)
{
    return frees;
}

int cuMemAlloc_v2(unsigned long long *dptr, size_t size)
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
    *dptr = (uintptr_t)p;
    return 0;
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
    return release(dptr, "cuMemFree_v2");
}

int cuMemFreeAsync(unsigned long long dptr, void *stream)
{
    (void)stream;
    return release(dptr, "cuMemFreeAsync");
}

int cuMemFreeAsync_ptsz(unsigned long long dptr, void *stream)
{
    (void)stream;
    return release(dptr, "cuMemFreeAsync_ptsz");
}

int cuMemUnmap(unsigned long long ptr, size_t size)
{
    int i = find((uintptr_t)ptr);

    /* the fake maps whole allocations only */
    if (i < 0 || allocs[i].base != ptr || allocs[i].len != size)
        return CUDA_ERROR_INVALID_VALUE;
    return release(ptr, "cuMemUnmap");
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
