/*
 * The explicit wrappers of drc_cuda.h: drc_cuMemFree and company.
 *
 * Each one tells drc before the memory goes, then does the real call: it
 * begins the free (free.c: the whole allocation, or the device's
 * allocations for a teardown, invalidated in every cache and marked as
 * being freed), calls the real function, and ends the free once it
 * returned, returning its result unchanged. The mark keeps registrations of
 * the range from exporting the memory while it goes (notify.c, "Frees in
 * flight").
 *
 * With no cache in the process the wrappers skip the lookup and cost one
 * load more than the real call.
 */
#include "drc.h"
#include "drc_cuda.h"
#include "cuda/cuda.h"
#include "core/notify.h"

static const struct drc__cuda_driver none;

/* The table, or an empty one: every entry is checked before use. */
static const struct drc__cuda_driver *driver(void)
{
    const struct drc__cuda_driver *d = drc__cuda_driver();

    return d ? d : &none;
}

int drc_cuMemFree(unsigned long long dptr)
{
    const struct drc__cuda_driver *d = driver();
    int t, err;

    if (!d->cuMemFree)
        return DRC__CUDA_ERROR_NOT_INITIALIZED;
    t = drc__cuda_begin_free(dptr);
    err = d->cuMemFree(dptr);
    drc__notify_end(t);
    return err;
}

int drc_cuMemFreeAsync(unsigned long long dptr, void *stream)
{
    const struct drc__cuda_driver *d = driver();
    int t, err;

    if (!d->cuMemFreeAsync)
        return DRC__CUDA_ERROR_NOT_INITIALIZED;
    /* Early, not wrong: the caller promises not to touch the memory once the free is enqueued. */
    t = drc__cuda_begin_free(dptr);
    err = d->cuMemFreeAsync(dptr, stream);
    drc__notify_end(t);
    return err;
}

int drc_cuMemUnmap(unsigned long long ptr, size_t size)
{
    const struct drc__cuda_driver *d = driver();
    int t, err;

    if (!d->cuMemUnmap)
        return DRC__CUDA_ERROR_NOT_INITIALIZED;
    t = drc__cuda_begin_unmap(ptr, size);
    err = d->cuMemUnmap(ptr, size);
    drc__notify_end(t);
    return err;
}

int drc_cuMemRelease(unsigned long long handle)
{
    const struct drc__cuda_driver *d = driver();

    if (!d->cuMemRelease)
        return DRC__CUDA_ERROR_NOT_INITIALIZED;
    /*
     * Nothing to notify, on purpose. The driver frees a cuMemCreate handle's
     * memory only once every mapping of it is unmapped and every reference
     * released; a handle released while still mapped keeps its memory until
     * cuMemUnmap, and that is where drc_cuMemUnmap invalidates. A handle
     * carries no address, so there would be no range to give anyway.
     */
    return d->cuMemRelease(handle);
}

int drc_cuMemFreeHost(void *p)
{
    const struct drc__cuda_driver *d = driver();
    int t, err;

    if (!d->cuMemFreeHost)
        return DRC__CUDA_ERROR_NOT_INITIALIZED;
    t = drc__cuda_begin_free((uintptr_t)p);
    err = d->cuMemFreeHost(p);
    drc__notify_end(t);
    return err;
}

int drc_cuMemHostUnregister(void *p)
{
    const struct drc__cuda_driver *d = driver();
    int t, err;

    if (!d->cuMemHostUnregister)
        return DRC__CUDA_ERROR_NOT_INITIALIZED;
    /* The pages stay mapped, but unpinned: a registration of them must not outlive the pinning. */
    t = drc__cuda_begin_free((uintptr_t)p);
    err = d->cuMemHostUnregister(p);
    drc__notify_end(t);
    return err;
}

/*
 * The mapping of memory imported with cuIpcOpenMemHandle goes when its last
 * reference is closed. Whether this close is the last cannot be told, so
 * every close invalidates the mapping (a registration of an imported buffer
 * still open elsewhere in the process is registered again on its next get).
 */
int drc_cuIpcCloseMemHandle(unsigned long long dptr)
{
    const struct drc__cuda_driver *d = driver();
    int t, err;

    if (!d->cuIpcCloseMemHandle)
        return DRC__CUDA_ERROR_NOT_INITIALIZED;
    t = drc__cuda_begin_free(dptr);
    err = d->cuIpcCloseMemHandle(dptr);
    drc__notify_end(t);
    return err;
}

int drc_cudaIpcCloseMemHandle(void *ptr)
{
    const struct drc__cuda_driver *d = driver();
    int (*rt)(void *);
    int t, err;

    *(void **)&rt = DRC__CUDA_RT(d, cudaIpcCloseMemHandle);
    t = drc__cuda_begin_free((uintptr_t)ptr);
    if (rt)
        err = rt(ptr);
    else
        err = d->cuIpcCloseMemHandle ? drc__cuda_rt_error(d->cuIpcCloseMemHandle((uintptr_t)ptr))
                                     : DRC__CUDART_INITIALIZATION_ERROR;
    drc__notify_end(t);
    return err;
}

int drc_cuDevicePrimaryCtxReset(int dev)
{
    const struct drc__cuda_driver *d = driver();
    int t, err;

    if (!d->cuDevicePrimaryCtxReset)
        return DRC__CUDA_ERROR_NOT_INITIALIZED;
    t = drc__cuda_begin_teardown(dev);
    err = d->cuDevicePrimaryCtxReset(dev);
    drc__notify_end(t);
    return err;
}

int drc_cuDevicePrimaryCtxRelease(int dev)
{
    const struct drc__cuda_driver *d = driver();
    int err;

    if (!d->cuDevicePrimaryCtxRelease)
        return DRC__CUDA_ERROR_NOT_INITIALIZED;
    err = d->cuDevicePrimaryCtxRelease(dev);
    if (!err)
        drc__cuda_primary_released(dev);   /* the last reference: the context was reset */
    return err;
}

int drc_cuCtxDestroy(void *ctx)
{
    const struct drc__cuda_driver *d = driver();
    int t, err;

    if (!d->cuCtxDestroy)
        return DRC__CUDA_ERROR_NOT_INITIALIZED;
    t = drc__cuda_begin_teardown(drc__cuda_ctx_device(ctx));  /* device unknown: every device */
    err = d->cuCtxDestroy(ctx);
    drc__notify_end(t);
    return err;
}

/* The device whose context is current (-1: none, or unknown). */
static int current_device(const struct drc__cuda_driver *d)
{
    int dev = -1;

    if (!d->cuCtxGetDevice || d->cuCtxGetDevice(&dev))
        return -1;
    return dev;
}

int drc_cudaDeviceReset(void)
{
    const struct drc__cuda_driver *d = driver();
    int (*rt)(void);
    int t, err, dev = current_device(d);

    *(void **)&rt = DRC__CUDA_RT(d, cudaDeviceReset);
    if (!rt && (dev < 0 || !d->cuDevicePrimaryCtxReset))
        return DRC__CUDART_INITIALIZATION_ERROR;
    t = drc__cuda_begin_teardown(dev);
    /* a static runtime: what cudaDeviceReset does, reset the current device's primary context */
    err = rt ? rt() : drc__cuda_rt_error(d->cuDevicePrimaryCtxReset(dev));
    drc__notify_end(t);
    return err;
}

int drc_cudaFree(void *ptr)
{
    const struct drc__cuda_driver *d = driver();
    int (*rt)(void *);
    int t, err;

    *(void **)&rt = DRC__CUDA_RT(d, cudaFree);
    if (!ptr)   /* the runtime's idiom for "initialise": nothing is freed */
        return rt ? rt(ptr) : DRC__CUDART_SUCCESS;
    t = drc__cuda_begin_free((uintptr_t)ptr);
    err = rt ? rt(ptr) : drc__cuda_free_emulated(ptr);
    drc__notify_end(t);
    return err;
}

int drc_cudaFreeAsync(void *ptr, void *stream)
{
    const struct drc__cuda_driver *d = driver();
    int (*rt)(void *, void *);
    int t, err;

    *(void **)&rt = DRC__CUDA_RT(d, cudaFreeAsync);
    t = drc__cuda_begin_free((uintptr_t)ptr);
    if (rt)
        err = rt(ptr, stream);
    else
        err = d->cuMemFreeAsync ? drc__cuda_rt_error(d->cuMemFreeAsync((uintptr_t)ptr, stream))
                                : DRC__CUDART_INITIALIZATION_ERROR;
    drc__notify_end(t);
    return err;
}

int drc_cudaFreeHost(void *ptr)
{
    const struct drc__cuda_driver *d = driver();
    int (*rt)(void *);
    int t, err;

    *(void **)&rt = DRC__CUDA_RT(d, cudaFreeHost);
    t = drc__cuda_begin_free((uintptr_t)ptr);
    if (rt)
        err = rt(ptr);
    else
        err = d->cuMemFreeHost ? drc__cuda_rt_error(d->cuMemFreeHost(ptr)) : DRC__CUDART_INITIALIZATION_ERROR;
    drc__notify_end(t);
    return err;
}

int drc_cudaHostUnregister(void *ptr)
{
    const struct drc__cuda_driver *d = driver();
    int (*rt)(void *);
    int t, err;

    *(void **)&rt = DRC__CUDA_RT(d, cudaHostUnregister);
    t = drc__cuda_begin_free((uintptr_t)ptr);
    if (rt)
        err = rt(ptr);
    else
        err = d->cuMemHostUnregister ? drc__cuda_rt_error(d->cuMemHostUnregister(ptr))
                                     : DRC__CUDART_INITIALIZATION_ERROR;
    drc__notify_end(t);
    return err;
}
