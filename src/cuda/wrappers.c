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
 *
 * They are generated from the one list of the frees (frees.h); the
 * prototypes of drc_cuda.h must agree with it, or these definitions do not
 * compile.
 */
#include "drc.h"
#include "drc_cuda.h"
#include "cuda/cuda.h"
#include "core/notify.h"

/* What each kind begins before the real call (free.c), from the call's arguments. */
#define BEGIN_FREE(...) drc__cuda_begin_free((uintptr_t)DRC__FIRST(__VA_ARGS__))
#define BEGIN_UNMAP(ptr, size) drc__cuda_begin_unmap(ptr, size)
#define BEGIN_TEARDOWN(dev) drc__cuda_begin_teardown(dev)
#define BEGIN_DESTROY(ctx) drc__cuda_begin_teardown(drc__cuda_ctx_device(ctx))  /* device unknown: every device */
#define BEGIN_RELEASE(dev) -1
/* ... and what it does once the real call returned */
#define AFTER_FREE(...) (void)0
#define AFTER_UNMAP(...) (void)0
#define AFTER_TEARDOWN(...) (void)0
#define AFTER_DESTROY(...) (void)0
#define AFTER_RELEASE(err, dev)                                                        \
    if (!(err))                                                                        \
        drc__cuda_primary_released(dev)    /* the last reference: the context was reset */

/* A driver entry: no driver, no call; else begin, the real call (or its stub), end. */
#define WRAP_DRIVER(name, kind, params, args, fallback)                                 \
    int drc_##name params                                                              \
    {                                                                                  \
        const struct drc__cuda_driver *d = drc__cuda_driver();                         \
        int t, err;                                                                    \
                                                                                       \
        if (!d)                                                                        \
            return DRC__CUDA_ERROR_NOT_INITIALIZED;                                    \
        t = BEGIN_##kind args;                                                         \
        err = d->name args;                                                            \
        drc__notify_end(t);                                                            \
        AFTER_##kind(err, DRC__UNPAREN args);                                          \
        return err;                                                                    \
    }

/*
 * A runtime entry: the shared libcudart's function, or with a static runtime
 * (none the dynamic linker sees) the fallback through the driver table, or
 * the stubs of drc__cuda_no_driver when there is no driver.
 */
#define WRAP_RUNTIME(name, kind, params, args, fallback) WRAP_RUNTIME_##kind(name, params, args, fallback)
#define WRAP_RUNTIME_FREE(name, params, args, fallback)                                \
    int drc_##name params                                                              \
    {                                                                                  \
        const struct drc__cuda_driver *d = driver();                                   \
        int (*rt) params;                                                              \
        int t, err;                                                                    \
                                                                                       \
        *(void **)&rt = DRC__CUDA_RT(d, name);                                         \
        t = BEGIN_FREE args;                                                           \
        err = rt ? rt args : fallback;                                                 \
        drc__notify_end(t);                                                            \
        return err;                                                                    \
    }
/* cudaDeviceReset: a static runtime resets the current device's primary context */
#define WRAP_RUNTIME_DEVICE_RESET(name, params, args, fallback)                        \
    int drc_##name params                                                              \
    {                                                                                  \
        const struct drc__cuda_driver *d = driver();                                   \
        int (*rt) params;                                                              \
        int t, err, dev = current_device(d);                                           \
                                                                                       \
        *(void **)&rt = DRC__CUDA_RT(d, name);                                         \
        if (!rt && dev < 0)                                                            \
            return DRC__CUDART_INITIALIZATION_ERROR;                                   \
        t = drc__cuda_begin_teardown(dev);                                             \
        err = rt ? rt args : fallback;                                                 \
        drc__notify_end(t);                                                            \
        return err;                                                                    \
    }

/* The table, or that of no driver. */
static const struct drc__cuda_driver *driver(void)
{
    const struct drc__cuda_driver *d = drc__cuda_driver();

    return d ? d : &drc__cuda_no_driver;
}

/* The device whose context is current (-1: none, or unknown). */
static int current_device(const struct drc__cuda_driver *d)
{
    int dev = -1;

    if (!d->cuCtxGetDevice || d->cuCtxGetDevice(&dev))
        return -1;
    return dev;
}

#define WRAP(api, name, versions, since, kind, params, args, fallback) WRAP_##api(name, kind, params, args, fallback)
DRC__CUDA_FREES(WRAP)
#undef WRAP

int drc_cuMemRelease(unsigned long long handle)
{
    const struct drc__cuda_driver *d = drc__cuda_driver();

    if (!d || !d->cuMemRelease)
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
