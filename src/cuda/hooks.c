/*
 * The explicit free wrappers: drc_cuMemFree and company.
 *
 * Each one tells drc before the memory goes, then frees it: it looks up the
 * bounds of the whole allocation (cuMemGetAddressRange) while the pointer is
 * still valid, invalidates them in every cache and marks them as being freed
 * (drc__notify_begin), calls the real function, and withdraws the mark once
 * it returned (drc__notify_end), returning its result unchanged. The mark
 * keeps registrations of the range from exporting the memory while it goes
 * (notify.c, "Frees in flight"). Looking the bounds up first
 * matters: after the free the driver no longer knows them, and a region may
 * cover any part of the allocation, not only the byte the pointer names.
 *
 * With no cache in the process the wrappers skip the lookup and cost one
 * load more than the real call.
 */
#include "cuda/hooks.h"

#include <dlfcn.h>
#include <pthread.h>
#include <string.h>

#include "drc.h"
#include "drc_cuda.h"
#include "core/notify.h"

enum {
    CU_SUCCESS = 0,
    CU_ERROR_INVALID_VALUE = 1,
    CU_ERROR_NOT_INITIALIZED = 3,
    CU_ERROR_DEINITIALIZED = 4,
    CUDA_RT_SUCCESS = 0,
    CUDA_RT_INVALID_VALUE = 1,
    CUDA_RT_INITIALIZATION_ERROR = 3,
    CUDA_RT_UNLOADING = 4,
    CUDA_RT_UNKNOWN = 999,
};

static struct drc__hook_driver real_driver, fake_driver;
static const struct drc__hook_driver *active;   /* atomic: NULL until loaded */
static pthread_once_t load_once = PTHREAD_ONCE_INIT;

#define SYM(field, name) (*(void **)&real_driver.field = dlsym(h, name))

static void load_driver(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);

    if (h) {
        SYM(mem_get_address_range, "cuMemGetAddressRange_v2");
        SYM(mem_free, "cuMemFree_v2");
        SYM(mem_free_async, "cuMemFreeAsync");
        SYM(mem_unmap, "cuMemUnmap");
        SYM(mem_release, "cuMemRelease");
        SYM(ctx_synchronize, "cuCtxSynchronize");
        SYM(ctx_get_current, "cuCtxGetCurrent");
        SYM(ctx_set_current, "cuCtxSetCurrent");
        SYM(device_get, "cuDeviceGet");
        SYM(device_get_attribute, "cuDeviceGetAttribute");
        SYM(primary_ctx_retain, "cuDevicePrimaryCtxRetain_v2");
        if (!real_driver.primary_ctx_retain)
            SYM(primary_ctx_retain, "cuDevicePrimaryCtxRetain");
        SYM(mem_alloc, "cuMemAlloc_v2");
        SYM(mem_get_granularity, "cuMemGetAllocationGranularity");
        SYM(mem_create, "cuMemCreate");
        SYM(mem_address_reserve, "cuMemAddressReserve");
        SYM(mem_address_free, "cuMemAddressFree");
        SYM(mem_map, "cuMemMap");
        SYM(mem_set_access, "cuMemSetAccess");
        SYM(mem_retain_allocation_handle, "cuMemRetainAllocationHandle");
        SYM(stream_synchronize, "cuStreamSynchronize");
    }
    /* the handle is kept: the driver stays loaded for the life of the process */
    __atomic_store_n(&active, &real_driver, __ATOMIC_RELEASE);
}

#undef SYM

const struct drc__hook_driver *drc__hooks_driver(void)
{
    const struct drc__hook_driver *d = __atomic_load_n(&active, __ATOMIC_ACQUIRE);

    if (d)
        return d;
    pthread_once(&load_once, load_driver);
    return __atomic_load_n(&active, __ATOMIC_ACQUIRE);
}

void drc__hooks_set_driver(const struct drc__hook_driver *d)
{
    pthread_once(&load_once, load_driver);
    if (d) {
        fake_driver = *d;
        __atomic_store_n(&active, &fake_driver, __ATOMIC_RELEASE);
    } else {
        __atomic_store_n(&active, &real_driver, __ATOMIC_RELEASE);
    }
}

int drc__hooks_begin_free(const struct drc__hook_driver *d, drc__cuptr dptr)
{
    drc__cuptr base = 0;
    size_t size = 0;

    if (!dptr || !drc__notify_active())
        return -1;
    if (d->mem_get_address_range && d->mem_get_address_range(&base, &size, dptr) == CU_SUCCESS && size)
        return drc__notify_begin((const void *)(uintptr_t)base, size);
    return drc__notify_begin((const void *)(uintptr_t)dptr, 1);
}

int drc_cuMemFree(unsigned long long dptr)
{
    const struct drc__hook_driver *d = drc__hooks_driver();
    int t, err;

    if (!d->mem_free)
        return CU_ERROR_NOT_INITIALIZED;
    t = drc__hooks_begin_free(d, dptr);
    err = d->mem_free(dptr);
    drc__notify_end(t);
    return err;
}

int drc_cuMemFreeAsync(unsigned long long dptr, void *stream)
{
    const struct drc__hook_driver *d = drc__hooks_driver();
    int t, err;

    if (!d->mem_free_async)
        return CU_ERROR_NOT_INITIALIZED;
    /* Early, not wrong: the caller promises not to touch the memory once the free is enqueued. */
    t = drc__hooks_begin_free(d, dptr);
    err = d->mem_free_async(dptr, stream);
    drc__notify_end(t);
    return err;
}

int drc_cuMemUnmap(unsigned long long ptr, size_t size)
{
    const struct drc__hook_driver *d = drc__hooks_driver();
    int t, err;

    if (!d->mem_unmap)
        return CU_ERROR_NOT_INITIALIZED;
    /* A VMM mapping is exactly the range given: no lookup. */
    t = ptr && size ? drc__notify_begin((const void *)(uintptr_t)ptr, size) : -1;
    err = d->mem_unmap(ptr, size);
    drc__notify_end(t);
    return err;
}

int drc_cuMemRelease(unsigned long long handle)
{
    const struct drc__hook_driver *d = drc__hooks_driver();

    if (!d->mem_release)
        return CU_ERROR_NOT_INITIALIZED;
    /*
     * Nothing to notify, on purpose. The driver frees a cuMemCreate handle's
     * memory only once every mapping of it is unmapped and every reference
     * released; a handle released while still mapped keeps its memory until
     * cuMemUnmap, and that is where drc_cuMemUnmap invalidates. A handle
     * carries no address, so there would be no range to give anyway.
     */
    return d->mem_release(handle);
}

/* A CUresult as the nearest cudaError_t, for the runtime frees done through the driver. */
static int rt_error(int cu)
{
    switch (cu) {
    case CU_SUCCESS:
        return CUDA_RT_SUCCESS;
    case CU_ERROR_INVALID_VALUE:
        return CUDA_RT_INVALID_VALUE;
    case CU_ERROR_NOT_INITIALIZED:
        return CUDA_RT_INITIALIZATION_ERROR;
    case CU_ERROR_DEINITIALIZED:
        return CUDA_RT_UNLOADING;
    default:
        return CUDA_RT_UNKNOWN;
    }
}

/* The runtime's own function if the dynamic linker sees one (shared libcudart), else NULL. */
static void *runtime_fn(void *const *cached, const char *name)
{
    void *f = __atomic_load_n(cached, __ATOMIC_ACQUIRE);

    if (!f && (f = dlsym(RTLD_DEFAULT, name)))
        __atomic_store_n((void **)cached, f, __ATOMIC_RELEASE);
    return f;
}

/* The runtime free, or what a static runtime's cudaFree does for cudaMalloc memory. */
static int cuda_free(const struct drc__hook_driver *d, int (*rt)(void *), void *ptr)
{
    int err;

    if (rt)
        return rt(ptr);
    /* A statically linked runtime hides its cudaFree: wait for the device, then free. */
    if (!d->mem_free)
        return CUDA_RT_INITIALIZATION_ERROR;
    if (d->ctx_synchronize && (err = d->ctx_synchronize()) != CU_SUCCESS)
        return rt_error(err);
    return rt_error(d->mem_free((drc__cuptr)(uintptr_t)ptr));
}

int drc_cudaFree(void *ptr)
{
    const struct drc__hook_driver *d = drc__hooks_driver();
    int (*rt)(void *) = d->rt_free;
    int t, err;

    if (d == &real_driver)
        *(void **)&rt = runtime_fn((void *const *)&real_driver.rt_free, "cudaFree");
    if (!ptr)   /* the runtime's idiom for "initialise": nothing is freed */
        return rt ? rt(ptr) : CUDA_RT_SUCCESS;
    t = drc__hooks_begin_free(d, (drc__cuptr)(uintptr_t)ptr);
    err = cuda_free(d, rt, ptr);
    drc__notify_end(t);
    return err;
}

int drc_cudaFreeAsync(void *ptr, void *stream)
{
    const struct drc__hook_driver *d = drc__hooks_driver();
    int (*rt)(void *, void *) = d->rt_free_async;
    int t, err;

    if (d == &real_driver)
        *(void **)&rt = runtime_fn((void *const *)&real_driver.rt_free_async, "cudaFreeAsync");
    t = drc__hooks_begin_free(d, (drc__cuptr)(uintptr_t)ptr);
    if (rt)
        err = rt(ptr, stream);
    else
        err = d->mem_free_async ? rt_error(d->mem_free_async((drc__cuptr)(uintptr_t)ptr, stream))
                                : CUDA_RT_INITIALIZATION_ERROR;
    drc__notify_end(t);
    return err;
}
