/*
 * The CUDA entry points that take memory away: the one list of them.
 *
 * Every file that must know them is generated from DRC__CUDA_FREES:
 *
 *   cuda.h            their fields in the driver table (struct drc__cuda_driver)
 *   driver.c          their lookup in the driver, and a stub for each driver
 *                     entry the driver lacks
 *   wrappers.c        drc_<name> of include/drc_cuda.h
 *   src/preload/      the exported interposers, what cuGetProcAddress's
 *                     answers are rewritten to, and the CUPTI monitor's names
 *
 * Adding one is a line here and its prototype in include/drc_cuda.h (written
 * out there for readers), with its name in src/drc.map. The two cannot
 * disagree unnoticed: a prototype whose types differ from the line's does
 * not compile against the definition wrappers.c generates, and a prototype
 * without a line is an export that is missing (tests/abi/check_exports.sh).
 *
 * X(api, name, versions, since, kind, params, args, fallback)
 *
 *   api       DRIVER (returns a CUresult; the table resolves it in libcuda)
 *             or RUNTIME (returns a cudaError_t; found in a shared libcudart
 *             on use, drc__cuda_runtime)
 *   name      the entry point: the wrapper is drc_<name>, the table's field <name>
 *   versions  the symbols it goes by:
 *               plain       <name>
 *               v2          <name>_v2; the plain <name> is an older ABI, which
 *                           cuGetProcAddress answers with the _v2 one from
 *                           version @since on
 *               plain_v2    <name> and <name>_v2, of one ABI (the table holds _v2)
 *               plain_ptsz  <name> and <name>_ptsz (per-thread default stream)
 *   since     see v2; 0 for the others
 *   kind      what goes, before the real call unless said (src/cuda/free.c):
 *               FREE          the whole allocation containing the first argument
 *               UNMAP         exactly [ptr, ptr + size)
 *               TEARDOWN      every allocation of the device given
 *               DESTROY       every allocation of the context's device
 *               RELEASE       after the call: every allocation of the device,
 *                             if the call dropped its primary context's last
 *                             reference (only then can that be told)
 *               DEVICE_RESET  every allocation of the current device
 *   params    the parameters, as C
 *   args      the parameters' names, passed on
 *   fallback  RUNTIME: what a static runtime does instead, through the driver
 *             table d (dev: the current device), as a cudaError_t
 *
 * cuMemRelease is not here: a handle's memory goes at its last unmap
 * (cuMemUnmap), so its wrapper has nothing to tell (wrappers.c).
 */
#ifndef DRC_CUDA_FREES_H
#define DRC_CUDA_FREES_H

#include <string.h>

#define DRC__CUDA_FREES(X)                                                                                     \
    X(DRIVER, cuMemFree, v2, 3020, FREE, (drc__cuptr dptr), (dptr), )                                        \
    /* early, not wrong: the caller promises not to touch the memory once the free is enqueued */            \
    X(DRIVER, cuMemFreeAsync, plain_ptsz, 0, FREE, (drc__cuptr dptr, void *stream), (dptr, stream), )        \
    X(DRIVER, cuMemUnmap, plain, 0, UNMAP, (drc__cuptr ptr, size_t size), (ptr, size), )                     \
    X(DRIVER, cuMemFreeHost, plain, 0, FREE, (void *p), (p), )                                               \
    /* the pages stay mapped, but unpinned: a registration of them must not outlive the pinning */           \
    X(DRIVER, cuMemHostUnregister, plain, 0, FREE, (void *p), (p), )                                         \
    /* imported memory goes at its last close, which cannot be told: every close is taken as it */          \
    X(DRIVER, cuIpcCloseMemHandle, plain, 0, FREE, (drc__cuptr dptr), (dptr), )                              \
    X(DRIVER, cuDevicePrimaryCtxReset, plain_v2, 0, TEARDOWN, (int dev), (dev), )                            \
    X(DRIVER, cuCtxDestroy, plain_v2, 0, DESTROY, (void *ctx), (ctx), )                                      \
    X(DRIVER, cuDevicePrimaryCtxRelease, plain_v2, 0, RELEASE, (int dev), (dev), )                           \
    X(RUNTIME, cudaFree, plain, 0, FREE, (void *ptr), (ptr), drc__cuda_free_emulated(ptr))                   \
    X(RUNTIME, cudaFreeAsync, plain_ptsz, 0, FREE, (void *ptr, void *stream), (ptr, stream),                 \
      drc__cuda_rt_error(d->cuMemFreeAsync((uintptr_t)ptr, stream)))                                         \
    X(RUNTIME, cudaFreeHost, plain, 0, FREE, (void *ptr), (ptr), drc__cuda_rt_error(d->cuMemFreeHost(ptr)))  \
    X(RUNTIME, cudaHostUnregister, plain, 0, FREE, (void *ptr), (ptr),                                       \
      drc__cuda_rt_error(d->cuMemHostUnregister(ptr)))                                                       \
    X(RUNTIME, cudaIpcCloseMemHandle, plain, 0, FREE, (void *ptr), (ptr),                                    \
      drc__cuda_rt_error(d->cuIpcCloseMemHandle((uintptr_t)ptr)))                                            \
    X(RUNTIME, cudaDeviceReset, plain, 0, DEVICE_RESET, (void), (),                                          \
      drc__cuda_rt_error(d->cuDevicePrimaryCtxReset(dev)))

/* For each symbol of an entry, by its versions column: S(name, symbol, ...) with the rest passed on. */
#define DRC__CUDA_SYMS(versions, S, name, ...) DRC__CUDA_SYMS_##versions(S, name, __VA_ARGS__)
#define DRC__CUDA_SYMS_plain(S, n, ...) S(n, n, __VA_ARGS__)
#define DRC__CUDA_SYMS_v2(S, n, ...) S(n, n##_v2, __VA_ARGS__)
#define DRC__CUDA_SYMS_plain_v2(S, n, ...) S(n, n, __VA_ARGS__) S(n, n##_v2, __VA_ARGS__)
#define DRC__CUDA_SYMS_plain_ptsz(S, n, ...) S(n, n, __VA_ARGS__) S(n, n##_ptsz, __VA_ARGS__)

/* The suffix of the symbols other than the plain name ("" for none), and the one the driver table holds (NULL: the plain). */
#define DRC__CUDA_SUFFIX(versions) DRC__CUDA_SUFFIX_##versions
#define DRC__CUDA_SUFFIX_plain ""
#define DRC__CUDA_SUFFIX_v2 "_v2"
#define DRC__CUDA_SUFFIX_plain_v2 "_v2"
#define DRC__CUDA_SUFFIX_plain_ptsz "_ptsz"
#define DRC__CUDA_TABLE_SYM(versions, name) DRC__CUDA_TABLE_SYM_##versions(name)
#define DRC__CUDA_TABLE_SYM_plain(n) NULL
#define DRC__CUDA_TABLE_SYM_v2(n) #n "_v2"
#define DRC__CUDA_TABLE_SYM_plain_v2(n) #n "_v2"
#define DRC__CUDA_TABLE_SYM_plain_ptsz(n) NULL

/* Helpers for the generators: a list without its parentheses, and its first element. */
#define DRC__UNPAREN(...) __VA_ARGS__
#define DRC__FIRST(...) DRC__FIRST_(__VA_ARGS__, ~)
#define DRC__FIRST_(a, ...) a

/*
 * Whether @sym names the entry @name (its since and DRC__CUDA_SUFFIX): its
 * plain name, when asked of cuGetProcAddress at @version >= @since (a symbol
 * looked up by name, or a CUPTI callback's name: @version 0), or the plain
 * name with the suffix.
 */
static inline int drc__cuda_names(const char *sym, int version, const char *name, int since, const char *suffix)
{
    size_t n = strlen(name);

    if (strncmp(sym, name, n))
        return 0;
    return sym[n] ? suffix[0] && !strcmp(sym + n, suffix) : version >= since;
}

#endif
