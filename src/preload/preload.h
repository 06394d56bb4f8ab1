/*
 * What the files of build/libdrc_preload.so share (hidden symbols):
 * preload.c (the parts, the attached drcs, dlsym/dlvsym and the next-symbol
 * lookup), preload_cuda.c (the CUDA free hooks), preload_cupti.c (the CUPTI
 * monitor), preload_host.c (the libc unmap hooks) and preload_verbs.c (the
 * ibv_* front).
 */
#ifndef DRC_PRELOAD_H
#define DRC_PRELOAD_H

#include <stddef.h>
#include <stdint.h>

/*
 * The parts of the library, chosen once at load (preload.c): DRC_PRELOAD is
 * a comma list of cuda, host, verbs (or all, none); a wrong part or an empty
 * value is reported and turns all three on (core/config.c, whose table has
 * these bits). Unset, the names in LD_PRELOAD choose: libdrc_hook.so the CUDA
 * part, libdrc_verbs.so and libdrc_preload.so all three; loaded some other
 * way, all three.
 */
enum { DRC__PRELOAD_CUDA = 1, DRC__PRELOAD_HOST = 2, DRC__PRELOAD_VERBS = 4 };
int drc__preload_part(int part);

/*
 * Begin a free in every drc that attached (core/preload_abi.h), through
 * its own begin-free routine: the allocation containing @ptr; the mapping
 * [ptr, ptr+size) (also a host range for preload_host.c); every allocation of
 * @device (-1: every device). Returns the tickets for drc__preload_end(), to
 * call once the real call returned (-1: no drc with a cache).
 */
int drc__preload_begin_free(unsigned long long ptr);
int drc__preload_begin_unmap(unsigned long long ptr, size_t size);
int drc__preload_begin_teardown(int device);
int drc__preload_ctx_device(void *ctx);     /* the device of a CUcontext, -1 if unknown */
void drc__preload_primary_released(int device);   /* after cuDevicePrimaryCtxRelease: the last one? */
void drc__preload_end(int tickets);

/*
 * libc's dlsym and dlvsym, found without naming a version string (preload.c
 * reads libc's symbol table), for code of this library that must not see its
 * own interposers. RTLD_NEXT passed to them means "after this library".
 */
void *drc__preload_real_dlsym(void *handle, const char *name);
void *drc__preload_real_dlvsym(void *handle, const char *name, const char *version);

/*
 * The CUDA part's answer to dlsym(name) whose real answer is @p
 * (preload_cuda.c): for a program, a wrapper of @p where the name is a free,
 * else @p; for drc's own lookups (@for_drc), the real function: the next
 * definition when @p is one of this library's own.
 */
void *drc__preload_cuda_symbol(const char *name, void *p, int for_drc);

/*
 * The verbs front's seam (preload_verbs.c; weak defaults in preload.c):
 * drc's definition of an ibv_* name it serves (@version may be NULL), or
 * NULL; and whether the front is on.
 */
void *drc__preload_verbs_symbol(const char *name, const char *version);
int drc__preload_verbs_enabled(void);

/*
 * Start the CUPTI monitor: dlopen libcupti, subscribe, enable the enter
 * callbacks of the frees. 0, or -1 after printing why to stderr.
 */
int drc__preload_cupti_start(void);

#endif
