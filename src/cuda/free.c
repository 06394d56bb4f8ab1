/*
 * The one routine that turns a free, an unmap or a context teardown into
 * drc__notify_begin/end (cuda.h), and the static-runtime cudaFree.
 *
 * Every free path of drc comes here: the wrappers (wrappers.c), the PyTorch
 * allocator (torch.c), and through the preload ABI (core/preload_abi.h)
 * the preload interposer and the CUPTI monitor. The bounds
 * are looked up before the real call, while the pointer is still valid:
 * after it the driver no longer knows them, and a region may cover any part
 * of the allocation, not only the byte the pointer names.
 *
 * The thread that frees may have no current CUDA context (a worker that
 * never touched the runtime): cuMemFree works there but cuMemGetAddressRange
 * answers CUDA_ERROR_INVALID_CONTEXT. drc__cuda_alloc_range() retries with
 * the pointer's own context, so the whole allocation is invalidated from
 * any thread, not one byte of it.
 *
 * A teardown (cuDevicePrimaryCtxReset, cuCtxDestroy, cudaDeviceReset) frees
 * every allocation of the context without a free call. The driver cannot be
 * asked afterwards what was there, so memory.c records the bounds of every
 * CUDA allocation drc classified, per device, and the teardown brackets the
 * hull of those of the device (over-invalidation costs only misses).
 */
#include "cuda/cuda.h"

#include "core/notify.h"

/*
 * The shared dmabuf exports (export.c) of the range are closed before the
 * real free, also when no cache exists any more: an open dmabuf fd keeps the
 * freed memory taken. With a cache, drc__notify_begin's drc_notify_free does
 * it (mem.h, drc__mem_released) before it invalidates the regions; without
 * one, these routines do it themselves.
 */
int drc__cuda_begin_free(drc__cuptr ptr)
{
    int active = drc__notify_active();
    uintptr_t base;
    size_t len;

    if (!ptr || (!active && !drc__cuda_exports_busy()))
        return -1;
    if (drc__cuda_alloc_range((uintptr_t)ptr, &base, &len) == 0) {
        if (!active) {
            drc__cuda_exports_drop(-1, base, base + len);
            return -1;
        }
        drc__cuda_untrack(-1, base, base + len);
        return drc__notify_begin((const void *)base, len);
    }
    if (!active)
        return -1;
    return drc__notify_begin((const void *)(uintptr_t)ptr, 1);
}

int drc__cuda_begin_unmap(drc__cuptr ptr, size_t size)
{
    /* A VMM mapping is exactly the range given: no lookup. */
    if (!ptr || !size)
        return -1;
    if (!drc__notify_active()) {
        if (drc__cuda_exports_busy())
            drc__cuda_exports_drop(-1, (uintptr_t)ptr, (uintptr_t)ptr + size);
        return -1;
    }
    return drc__notify_begin((const void *)(uintptr_t)ptr, size);
}

int drc__cuda_begin_teardown(int device)
{
    uintptr_t lo, hi;

    if (drc__cuda_exports_busy())
        drc__cuda_exports_drop(device, 0, UINTPTR_MAX);     /* every export of the device's memory */
    if (!drc__notify_active() || drc__cuda_tracked_hull(device, &lo, &hi))
        return -1;
    drc__cuda_untrack(device, lo, hi);
    return drc__notify_begin((const void *)lo, hi - lo);
}

void drc__cuda_primary_released(int device)
{
    const struct drc__cuda_driver *d = drc__cuda_driver();
    unsigned flags = 0;
    int active = 1;

    if (!d || !d->cuDevicePrimaryCtxGetState || !drc__notify_active() ||
        d->cuDevicePrimaryCtxGetState(device, &flags, &active) || active)
        return;
    drc__notify_end(drc__cuda_begin_teardown(device));
}

int drc__cuda_ctx_device(void *ctx)
{
    const struct drc__cuda_driver *d = drc__cuda_driver();
    void *saved;
    int switched, dev = -1;

    if (!d || !ctx || !d->cuCtxGetDevice || drc__cuda_ctx_push(d, ctx, &saved, &switched))
        return -1;
    if (d->cuCtxGetDevice(&dev))
        dev = -1;
    drc__cuda_ctx_pop(d, saved, switched);
    return dev;
}

int drc__cuda_free_emulated(void *ptr)
{
    const struct drc__cuda_driver *d = drc__cuda_driver();
    const int attr = DRC__CU_POINTER_ATTRIBUTE_CONTEXT;
    void *ctx = NULL, *data = &ctx, *saved = NULL;
    int err = DRC__CUDA_SUCCESS, switched = 0;

    if (!ptr)
        return DRC__CUDART_SUCCESS;     /* the runtime's idiom for "initialise": nothing is freed */
    if (!d)
        return DRC__CUDART_INITIALIZATION_ERROR;
    /*
     * cudaFree waits for the device before it frees. The device is the
     * allocation's: its context is made current for the wait, as the calling
     * thread may have none (then cuCtxSynchronize would fail with
     * CUDA_ERROR_INVALID_CONTEXT and nothing would be freed).
     */
    if (d->cuPointerGetAttributes && d->cuPointerGetAttributes(1, &attr, &data, (uintptr_t)ptr) == 0 && ctx &&
        drc__cuda_ctx_push(d, ctx, &saved, &switched) == 0) {
        if (d->cuCtxSynchronize)
            err = d->cuCtxSynchronize();
        drc__cuda_ctx_pop(d, saved, switched);
    } else if (d->cuCtxSynchronize && d->cuCtxGetCurrent && d->cuCtxGetCurrent(&saved) == 0 && saved) {
        err = d->cuCtxSynchronize();
    }
    if (err)
        return drc__cuda_rt_error(err);
    return drc__cuda_rt_error(d->cuMemFree((drc__cuptr)(uintptr_t)ptr));
}

/* What the preload library (src/preload/) reaches the CUDA layer through: the preload ABI. */
__attribute__((constructor)) static void install_hook_ops(void)
{
    drc__notify_set_cuda_hooks(drc__cuda_begin_free, drc__cuda_begin_teardown, drc__cuda_ctx_device,
                               drc__cuda_primary_released);
}
