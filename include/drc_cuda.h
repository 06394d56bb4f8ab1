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
 * Wrappers for the CUDA frees: each looks up the whole allocation, calls
 * drc_notify_free() on it, then calls the real function and returns its
 * result (a CUresult, or a cudaError_t for the runtime ones).
 */
DRC_API int drc_cuMemFree(unsigned long long dptr);
DRC_API int drc_cuMemFreeAsync(unsigned long long dptr, void *stream);
DRC_API int drc_cuMemUnmap(unsigned long long ptr, size_t size);
DRC_API int drc_cuMemRelease(unsigned long long handle);
DRC_API int drc_cudaFree(void *ptr);
DRC_API int drc_cudaFreeAsync(void *ptr, void *stream);

/* PyTorch CUDAPluggableAllocator entry points (stream is a cudaStream_t). */
DRC_API void *drc_torch_malloc(ssize_t size, int device, void *stream);
DRC_API void  drc_torch_free(void *ptr, ssize_t size, int device, void *stream);

#ifdef __cplusplus
}
#endif
#endif /* DRC_CUDA_H */
