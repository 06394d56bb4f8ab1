/*
 * drc and the CUDA allocators: wrappers for the CUDA frees that invalidate
 * before the memory goes, and the PyTorch CUDAPluggableAllocator entry points.
 * The CUDA driver is loaded with dlopen: nothing here links against libcuda.
 */
#ifndef DRC_CUDA_H
#define DRC_CUDA_H

#include <drc.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Wrappers for the CUDA calls that take memory away: each tells drc before
 * the memory goes, then calls the real function and returns its result
 * unchanged (a CUresult, or a cudaError_t for the runtime ones).
 *
 * The frees (cuMemFree, cuMemFreeAsync, cudaFree, cudaFreeAsync) and the
 * pinned host frees (cuMemFreeHost, cudaFreeHost, cuMemHostUnregister,
 * cudaHostUnregister) and the closes of imported IPC memory
 * (cuIpcCloseMemHandle, cudaIpcCloseMemHandle: every close, as the last one
 * cannot be told) invalidate the whole allocation containing the pointer,
 * whatever CUDA context the calling thread has (or none).
 * cuMemUnmap invalidates exactly the range given; cuMemRelease nothing (the
 * memory goes at the last unmap). The teardowns (cuDevicePrimaryCtxReset,
 * cuCtxDestroy, cudaDeviceReset) free every allocation of the context
 * without a free call: they invalidate every CUDA allocation of that device
 * that drc has registered (all devices when the device is unknown).
 * The invalidated range is marked as being freed until the real call
 * returns, so no registration can be made of it meanwhile.
 *
 * drc_cudaFree and company use the shared libcudart the dynamic linker
 * sees; in a program with a static runtime they do what the runtime does
 * through the driver (drc_cudaFree: synchronise the allocation's context,
 * then cuMemFree). Thread-safe; no driver: CUDA_ERROR_NOT_INITIALIZED (3) or
 * cudaErrorInitializationError (3).
 */
DRC_API int drc_cuMemFree(unsigned long long dptr);
DRC_API int drc_cuMemFreeAsync(unsigned long long dptr, void *stream);
DRC_API int drc_cuMemUnmap(unsigned long long ptr, size_t size);
DRC_API int drc_cuMemRelease(unsigned long long handle);
DRC_API int drc_cuMemFreeHost(void *p);
DRC_API int drc_cuMemHostUnregister(void *p);
DRC_API int drc_cuIpcCloseMemHandle(unsigned long long dptr);
DRC_API int drc_cuDevicePrimaryCtxReset(int dev);  /* dev: a CUdevice */
DRC_API int drc_cuCtxDestroy(void *ctx);           /* ctx: a CUcontext */
/*
 * cuDevicePrimaryCtxRelease resets the primary context when it drops the
 * last reference: then (told by cuDevicePrimaryCtxGetState) every CUDA
 * allocation of the device drc registered is invalidated, after the call.
 */
DRC_API int drc_cuDevicePrimaryCtxRelease(int dev);
DRC_API int drc_cudaFree(void *ptr);
DRC_API int drc_cudaFreeAsync(void *ptr, void *stream);
DRC_API int drc_cudaFreeHost(void *ptr);
DRC_API int drc_cudaHostUnregister(void *ptr);
DRC_API int drc_cudaDeviceReset(void);
DRC_API int drc_cudaIpcCloseMemHandle(void *ptr);

/* PyTorch CUDAPluggableAllocator entry points (stream is a cudaStream_t). */
DRC_API void *drc_torch_malloc(ssize_t size, int device, void *stream);
DRC_API void  drc_torch_free(void *ptr, ssize_t size, int device, void *stream);

#ifdef __cplusplus
}
#endif
#endif /* DRC_CUDA_H */
