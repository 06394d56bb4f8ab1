/*
 * The CUDA part of build/libdrc_preload.so (preload.c): invalidation for
 * programs that free GPU memory without knowing about drc.
 *
 * How a free reaches the driver, and where this library sits on the way:
 *
 *  1. A program linked with -lcuda calls cuMemFree_v2 & co. directly: the
 *     exported definitions below come first in symbol lookup and call the
 *     next definition.
 *  2. The CUDA runtime, static (nvcc's default) or shared, calls none of
 *     those symbols. It does dlsym(libcuda, "cuGetProcAddress_v2"), asks that
 *     for "cuGetProcAddress", and asks the answer for each entry point
 *     ("cuMemFree" at version 3020, "cuMemFreeAsync" at 11020, ...). So
 *     dlsym is interposed (preload.c): for cuGetProcAddress(_v2) it hands
 *     back a wrapper, which returns wrappers for itself and for the frees and
 *     keeps every other answer. dlsym of the free symbols themselves is
 *     wrapped too.
 *  3. A shared libcudart's cudaFree & co. are interposed as well (the
 *     runtime then frees through a wrapped driver entry: drc is told twice,
 *     which costs one more lookup and is otherwise harmless).
 *
 * What is caught: cuMemFree, cuMemFreeAsync(_ptsz), cuMemUnmap, the pinned
 * host frees cuMemFreeHost and cuMemHostUnregister, cuIpcCloseMemHandle,
 * and the teardowns cuDevicePrimaryCtxReset and cuCtxDestroy (and
 * cuDevicePrimaryCtxRelease when it dropped the last reference: told only
 * afterwards, so the invalidation follows the call); cudaFree,
 * cudaFreeAsync, cudaFreeHost, cudaHostUnregister, cudaIpcCloseMemHandle
 * and cudaDeviceReset of a shared runtime.
 * Each wrapper begins the free in every attached drc, through drc's own
 * begin-free routine (src/cuda/free.c: the whole allocation, whatever the
 * calling thread's context), calls the real function, and ends the free.
 *
 * With DRC_MONITOR=cupti the wrappers pass everything through untouched and
 * a CUPTI callback subscriber (hook_cupti.c) reports the frees instead;
 * DRC_MONITOR=none (or DRC_PRELOAD without cuda) turns this part off.
 *
 * A wrapper has to know which real function it calls, and cuGetProcAddress
 * may answer with any pointer, so each kind of wrapper has a few slots: the
 * first pointers seen of that kind are bound to a slot's wrapper each. In
 * practice one pointer per kind appears (two for cuMemFreeAsync: legacy and
 * per-thread stream). Should the slots run out, the real pointer is handed
 * back and that path is not caught (DRC_HOOK_DEBUG=1 says so on stderr).
 */
#include <dlfcn.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "drc_cuda.h"
#include "core/config.h"
#include "cuda/cuda.h"      /* the CUDA constants (only those: the driver is reached through its own symbols) */
#include "preload/hook_preload.h"

#define EXPORT __attribute__((visibility("default")))

typedef unsigned long long cuptr;

enum mode { MODE_UNSET = 0, MODE_HOOK = 1, MODE_CUPTI = 2, MODE_OFF = 3 };

static int mode;                        /* atomic: enum mode, decided once */
static int debug;

static int get_mode(void)
{
    int m = __atomic_load_n(&mode, __ATOMIC_ACQUIRE);
    long long monitor;

    if (m != MODE_UNSET)
        return m;
    monitor = drc__env(DRC__ENV_MONITOR);
    debug = drc__env(DRC__ENV_HOOK_DEBUG) || drc__env(DRC__ENV_LOG) >= DRC__LOG_WARN;
    if (!drc__preload_part(DRC__PRELOAD_CUDA)) {
        m = MODE_OFF;
    } else if (monitor == DRC__MONITOR_CUPTI) {
        /* pass through while CUPTI starts: libcupti's own dlsym calls come back here */
        if (!__atomic_compare_exchange_n(&mode, &m, MODE_OFF, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
            return m;
        m = drc__hook_cupti_start() == 0 ? MODE_CUPTI : MODE_HOOK;
    } else if (monitor == DRC__MONITOR_NONE) {
        m = MODE_OFF;
    } else {
        m = MODE_HOOK;
    }
    __atomic_store_n(&mode, m, __ATOMIC_RELEASE);
    return m;
}

__attribute__((constructor)) static void hook_init(void)
{
    get_mode();
}

static int hooking(void)
{
    return get_mode() == MODE_HOOK;
}

/* A symbol of the loaded CUDA driver, found by its file name (never loads one). */
struct find_lib {
    const char *prefix;
    char path[4096];
};

static int find_lib(struct dl_phdr_info *info, size_t size, void *arg)
{
    struct find_lib *f = arg;
    const char *base = strrchr(info->dlpi_name, '/');

    (void)size;
    base = base ? base + 1 : info->dlpi_name;
    if (strncmp(base, f->prefix, strlen(f->prefix)) || strlen(info->dlpi_name) >= sizeof(f->path))
        return 0;
    strcpy(f->path, info->dlpi_name);
    return 1;
}

static void *driver_sym(const char *name)
{
    struct find_lib f = { "libcuda.so", "" };
    void *h, *p = NULL;

    if (!dl_iterate_phdr(find_lib, &f) || !(h = dlopen(f.path, RTLD_LAZY | RTLD_NOLOAD)))
        return NULL;
    p = drc__hook_real_dlsym(h, name);
    dlclose(h);     /* drops the reference NOLOAD took; the driver stays */
    return p;
}

/* The exported symbol of @p's own object named @name (which cuGetProcAddress ABI @p has). */
static void *sibling(const void *p, const char *name)
{
    Dl_info info;
    void *h, *s = NULL;

    if (!dladdr(p, &info) || !info.dli_fname || !(h = dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD)))
        return NULL;
    s = drc__hook_real_dlsym(h, name);
    dlclose(h);
    return s;
}

/* ---- the wrappers, one per kind of entry point ------------------------------- */

enum kind { K_FREE, K_FREE_ASYNC, K_UNMAP, K_FREE_HOST, K_HOST_UNREG, K_RESET, K_DESTROY, K_IPC_CLOSE, K_RELEASE,
            K_GPA1, K_GPA2, KINDS };
enum { SLOTS = 3 };

static void *slot_real[KINDS][SLOTS];   /* atomic: the real function slot i of a kind calls */
static const char *const kind_name[KINDS] = { "cuMemFree_v2", "cuMemFreeAsync", "cuMemUnmap", "cuMemFreeHost",
                                              "cuMemHostUnregister", "cuDevicePrimaryCtxReset", "cuCtxDestroy",
                                              "cuIpcCloseMemHandle", "cuDevicePrimaryCtxRelease", "cuGetProcAddress",
                                              "cuGetProcAddress_v2" };

typedef int free_fn(cuptr);
typedef int free_async_fn(cuptr, void *);
typedef int unmap_fn(cuptr, size_t);
typedef int ptr_fn(void *);
typedef int reset_fn(int);
typedef int gpa1_fn(const char *, void **, int, unsigned long long);
typedef int gpa2_fn(const char *, void **, int, unsigned long long, int *);

static void *bind(enum kind k, void *real);

enum { NOT_INITIALIZED = DRC__CUDA_ERROR_NOT_INITIALIZED };    /* there is no driver behind us */

static int call_free(void *real, cuptr d)
{
    int t, r;

    if (!real)
        return NOT_INITIALIZED;
    t = hooking() ? drc__hook_begin_free(d) : -1;
    r = ((free_fn *)real)(d);
    drc__hook_end(t);
    return r;
}

static int call_free_async(void *real, cuptr d, void *stream)
{
    int t, r;

    if (!real)
        return NOT_INITIALIZED;
    t = hooking() ? drc__hook_begin_free(d) : -1;
    r = ((free_async_fn *)real)(d, stream);
    drc__hook_end(t);
    return r;
}

static int call_unmap(void *real, cuptr p, size_t size)
{
    int t, r;

    if (!real)
        return NOT_INITIALIZED;
    t = hooking() ? drc__hook_begin_unmap(p, size) : -1;
    r = ((unmap_fn *)real)(p, size);
    drc__hook_end(t);
    return r;
}

/* cuMemFreeHost and cuMemHostUnregister: the pinned range goes (or stops being pinned). */
static int call_host(void *real, void *p)
{
    int t, r;

    if (!real)
        return NOT_INITIALIZED;
    t = hooking() ? drc__hook_begin_free((uintptr_t)p) : -1;
    r = ((ptr_fn *)real)(p);
    drc__hook_end(t);
    return r;
}

static int call_reset(void *real, int dev)
{
    int t, r;

    if (!real)
        return NOT_INITIALIZED;
    t = hooking() ? drc__hook_begin_teardown(dev) : -1;
    r = ((reset_fn *)real)(dev);
    drc__hook_end(t);
    return r;
}

/* cuDevicePrimaryCtxRelease: only afterwards can it be told whether it was the last reference. */
static int call_release(void *real, int dev)
{
    int r;

    if (!real)
        return NOT_INITIALIZED;
    r = ((reset_fn *)real)(dev);
    if (r == 0 && hooking())
        drc__hook_primary_released(dev);
    return r;
}

static int call_destroy(void *real, void *ctx)
{
    int t, r;

    if (!real)
        return NOT_INITIALIZED;
    t = hooking() ? drc__hook_begin_teardown(drc__hook_ctx_device(ctx)) : -1;
    r = ((ptr_fn *)real)(ctx);
    drc__hook_end(t);
    return r;
}

/* Which wrapper an answer of cuGetProcAddress gets, by the symbol asked for. */
static void *rewrite(const char *sym, int version, void *p)
{
    if (!sym || !p || !hooking())
        return p;
    if (!strcmp(sym, "cuGetProcAddress") || !strcmp(sym, "cuGetProcAddress_v2")) {
        /* the ABI of the answer: the exported entry it equals, else the version asked (v2 since 12.0) */
        if (p == sibling(p, "cuGetProcAddress"))
            return bind(K_GPA1, p);
        if (p == sibling(p, "cuGetProcAddress_v2") || version >= 12000)
            return bind(K_GPA2, p);
        return bind(K_GPA1, p);
    }
    if ((!strcmp(sym, "cuMemFree") && version >= 3020) || !strcmp(sym, "cuMemFree_v2"))
        return bind(K_FREE, p);     /* below 3020 it is the 32-bit cuMemFree, which no 64-bit program uses */
    if (!strcmp(sym, "cuMemFreeAsync") || !strcmp(sym, "cuMemFreeAsync_ptsz"))
        return bind(K_FREE_ASYNC, p);
    if (!strcmp(sym, "cuMemUnmap"))
        return bind(K_UNMAP, p);
    if (!strcmp(sym, "cuMemFreeHost"))
        return bind(K_FREE_HOST, p);
    if (!strcmp(sym, "cuMemHostUnregister"))
        return bind(K_HOST_UNREG, p);
    if (!strcmp(sym, "cuDevicePrimaryCtxReset") || !strcmp(sym, "cuDevicePrimaryCtxReset_v2"))
        return bind(K_RESET, p);
    if (!strcmp(sym, "cuCtxDestroy") || !strcmp(sym, "cuCtxDestroy_v2"))
        return bind(K_DESTROY, p);
    if (!strcmp(sym, "cuDevicePrimaryCtxRelease") || !strcmp(sym, "cuDevicePrimaryCtxRelease_v2"))
        return bind(K_RELEASE, p);
    if (!strcmp(sym, "cuIpcCloseMemHandle"))
        return bind(K_IPC_CLOSE, p);    /* the imported mapping goes (at its last close: each is taken as it) */
    return p;
}

static int call_gpa1(void *real, const char *sym, void **pfn, int version, unsigned long long flags)
{
    int r;

    if (!real)
        return NOT_INITIALIZED;
    r = ((gpa1_fn *)real)(sym, pfn, version, flags);
    if (r == 0 && pfn)
        *pfn = rewrite(sym, version, *pfn);
    return r;
}

static int call_gpa2(void *real, const char *sym, void **pfn, int version, unsigned long long flags, int *status)
{
    int r;

    if (!real)
        return NOT_INITIALIZED;
    r = ((gpa2_fn *)real)(sym, pfn, version, flags, status);
    if (r == 0 && pfn)
        *pfn = rewrite(sym, version, *pfn);
    return r;
}

#define REAL(k, i) __atomic_load_n(&slot_real[k][i], __ATOMIC_ACQUIRE)
/* Three slot functions of kind K: NAME_0..2 with parameters P, calling call_CALL(real, ARGS). */
#define SLOT3(K, NAME, CALL, P, ...)                                                    \
    static int NAME##_0 P { return call_##CALL(REAL(K, 0), __VA_ARGS__); }              \
    static int NAME##_1 P { return call_##CALL(REAL(K, 1), __VA_ARGS__); }              \
    static int NAME##_2 P { return call_##CALL(REAL(K, 2), __VA_ARGS__); }

SLOT3(K_FREE, free, free, (cuptr d), d)
SLOT3(K_FREE_ASYNC, free_async, free_async, (cuptr d, void *s), d, s)
SLOT3(K_UNMAP, unmap, unmap, (cuptr p, size_t n), p, n)
SLOT3(K_FREE_HOST, free_host, host, (void *p), p)
SLOT3(K_HOST_UNREG, host_unreg, host, (void *p), p)
SLOT3(K_RESET, reset, reset, (int dev), dev)
SLOT3(K_DESTROY, destroy, destroy, (void *ctx), ctx)
SLOT3(K_IPC_CLOSE, ipc_close, free, (cuptr d), d)
SLOT3(K_RELEASE, release, release, (int dev), dev)
SLOT3(K_GPA1, gpa1, gpa1, (const char *s, void **p, int v, unsigned long long f), s, p, v, f)
SLOT3(K_GPA2, gpa2, gpa2, (const char *s, void **p, int v, unsigned long long f, int *st), s, p, v, f, st)

#undef SLOT3
#undef REAL

#define FNS3(NAME) { (void *)NAME##_0, (void *)NAME##_1, (void *)NAME##_2 }
static void *const slot_fn[KINDS][SLOTS] = {
    FNS3(free), FNS3(free_async), FNS3(unmap), FNS3(free_host), FNS3(host_unreg),
    FNS3(reset), FNS3(destroy), FNS3(ipc_close), FNS3(release), FNS3(gpa1), FNS3(gpa2),
};
#undef FNS3

/* ---- the exported entry points --------------------------------------------- */

/* The next definition of one of our own exported names (the driver's, the runtime's). */
static void *next_sym(void **cache, const char *name)
{
    void *p = __atomic_load_n(cache, __ATOMIC_ACQUIRE);

    if (!p) {
        p = drc__hook_real_dlsym(RTLD_NEXT, name);
        if (!p && !strncmp(name, "cu", 2) && strncmp(name, "cuda", 4))
            p = driver_sym(name);   /* a driver dlopen'ed RTLD_LOCAL is not "next" */
        __atomic_store_n(cache, p, __ATOMIC_RELEASE);
    }
    return p;
}

/* Each exported name with its cache of the next definition: what drc's own lookups get. */
struct ours {
    const char *name;
    void *self;
    void *next;         /* atomic */
};

EXPORT int cuMemFree_v2(cuptr d);
EXPORT int cuMemFreeAsync(cuptr d, void *s);
EXPORT int cuMemFreeAsync_ptsz(cuptr d, void *s);
EXPORT int cuMemUnmap(cuptr p, size_t n);
EXPORT int cuMemFreeHost(void *p);
EXPORT int cuMemHostUnregister(void *p);
EXPORT int cuDevicePrimaryCtxReset(int dev);
EXPORT int cuDevicePrimaryCtxReset_v2(int dev);
EXPORT int cuCtxDestroy(void *ctx);
EXPORT int cuCtxDestroy_v2(void *ctx);
EXPORT int cuGetProcAddress(const char *sym, void **pfn, int version, unsigned long long flags);
EXPORT int cuGetProcAddress_v2(const char *sym, void **pfn, int version, unsigned long long flags, int *status);
EXPORT int cudaFree(void *ptr);
EXPORT int cudaFreeHost(void *ptr);
EXPORT int cudaHostUnregister(void *ptr);
EXPORT int cudaFreeAsync(void *ptr, void *stream);
EXPORT int cudaDeviceReset(void);
EXPORT int cuIpcCloseMemHandle(cuptr d);
EXPORT int cudaIpcCloseMemHandle(void *ptr);
EXPORT int cuDevicePrimaryCtxRelease(int dev);
EXPORT int cuDevicePrimaryCtxRelease_v2(int dev);

static struct ours ours[] = {
    { "cuMemFree_v2", (void *)cuMemFree_v2, NULL },
    { "cuMemFreeAsync", (void *)cuMemFreeAsync, NULL },
    { "cuMemFreeAsync_ptsz", (void *)cuMemFreeAsync_ptsz, NULL },
    { "cuMemUnmap", (void *)cuMemUnmap, NULL },
    { "cuMemFreeHost", (void *)cuMemFreeHost, NULL },
    { "cuMemHostUnregister", (void *)cuMemHostUnregister, NULL },
    { "cuDevicePrimaryCtxReset", (void *)cuDevicePrimaryCtxReset, NULL },
    { "cuDevicePrimaryCtxReset_v2", (void *)cuDevicePrimaryCtxReset_v2, NULL },
    { "cuCtxDestroy", (void *)cuCtxDestroy, NULL },
    { "cuCtxDestroy_v2", (void *)cuCtxDestroy_v2, NULL },
    { "cuGetProcAddress", (void *)cuGetProcAddress, NULL },
    { "cuGetProcAddress_v2", (void *)cuGetProcAddress_v2, NULL },
    { "cudaFree", (void *)cudaFree, NULL },
    { "cudaFreeHost", (void *)cudaFreeHost, NULL },
    { "cudaHostUnregister", (void *)cudaHostUnregister, NULL },
    { "cudaFreeAsync", (void *)cudaFreeAsync, NULL },
    { "cudaDeviceReset", (void *)cudaDeviceReset, NULL },
    { "cuIpcCloseMemHandle", (void *)cuIpcCloseMemHandle, NULL },
    { "cudaIpcCloseMemHandle", (void *)cudaIpcCloseMemHandle, NULL },
    { "cuDevicePrimaryCtxRelease", (void *)cuDevicePrimaryCtxRelease, NULL },
    { "cuDevicePrimaryCtxRelease_v2", (void *)cuDevicePrimaryCtxRelease_v2, NULL },
};

#define NEXT(i) next_sym(&ours[i].next, ours[i].name)

EXPORT int cuMemFree_v2(cuptr d) { return call_free(NEXT(0), d); }
EXPORT int cuMemFreeAsync(cuptr d, void *s) { return call_free_async(NEXT(1), d, s); }
EXPORT int cuMemFreeAsync_ptsz(cuptr d, void *s) { return call_free_async(NEXT(2), d, s); }
EXPORT int cuMemUnmap(cuptr p, size_t n) { return call_unmap(NEXT(3), p, n); }
EXPORT int cuMemFreeHost(void *p) { return call_host(NEXT(4), p); }
EXPORT int cuMemHostUnregister(void *p) { return call_host(NEXT(5), p); }
EXPORT int cuDevicePrimaryCtxReset(int dev) { return call_reset(NEXT(6), dev); }
EXPORT int cuDevicePrimaryCtxReset_v2(int dev) { return call_reset(NEXT(7), dev); }
EXPORT int cuCtxDestroy(void *ctx) { return call_destroy(NEXT(8), ctx); }
EXPORT int cuCtxDestroy_v2(void *ctx) { return call_destroy(NEXT(9), ctx); }
EXPORT int cuGetProcAddress(const char *sym, void **pfn, int version, unsigned long long flags)
{
    return call_gpa1(NEXT(10), sym, pfn, version, flags);
}
EXPORT int cuGetProcAddress_v2(const char *sym, void **pfn, int version, unsigned long long flags, int *status)
{
    return call_gpa2(NEXT(11), sym, pfn, version, flags, status);
}

/*
 * The runtime's: a shared libcudart behind us, or else (someone found these
 * with dlsym under a static runtime: a static libdrc's drc_cudaFree does) the
 * same call through libdrc's wrapper, which does it with the driver.
 */
static int rt_call(void *next, int (*drc_fn)(void *), void *ptr)
{
    int t = hooking() ? drc__hook_begin_free((uintptr_t)ptr) : -1;
    int r = next ? ((ptr_fn *)next)(ptr) : drc_fn(ptr);

    drc__hook_end(t);
    return r;
}

EXPORT int cudaFree(void *ptr)
{
    if (!ptr && NEXT(12))
        return ((ptr_fn *)NEXT(12))(ptr);     /* "initialise": nothing is freed */
    return ptr ? rt_call(NEXT(12), drc_cudaFree, ptr) : 0;
}

EXPORT int cudaFreeHost(void *ptr) { return rt_call(NEXT(13), drc_cudaFreeHost, ptr); }
EXPORT int cuIpcCloseMemHandle(cuptr d) { return call_free(NEXT(17), d); }
EXPORT int cudaIpcCloseMemHandle(void *ptr) { return rt_call(NEXT(18), drc_cudaIpcCloseMemHandle, ptr); }
EXPORT int cuDevicePrimaryCtxRelease(int dev) { return call_release(NEXT(19), dev); }
EXPORT int cuDevicePrimaryCtxRelease_v2(int dev) { return call_release(NEXT(20), dev); }
EXPORT int cudaHostUnregister(void *ptr) { return rt_call(NEXT(14), drc_cudaHostUnregister, ptr); }

EXPORT int cudaFreeAsync(void *ptr, void *stream)
{
    void *next = NEXT(15);
    int t = hooking() ? drc__hook_begin_free((uintptr_t)ptr) : -1;
    int r = next ? ((int (*)(void *, void *))next)(ptr, stream) : drc_cudaFreeAsync(ptr, stream);

    drc__hook_end(t);
    return r;
}

EXPORT int cudaDeviceReset(void)
{
    void *next = NEXT(16);
    int t, r;

    if (!next)
        return drc_cudaDeviceReset();
    t = hooking() ? drc__hook_begin_teardown(-1) : -1;     /* the current device's: every device, to be sure */
    r = ((int (*)(void))next)();
    drc__hook_end(t);
    return r;
}

#undef NEXT


/* Our own exported functions: never wrapped again when dlsym finds them first. */
static int is_ours(const void *p)
{
    unsigned i;

    for (i = 0; i < sizeof(ours) / sizeof(ours[0]); i++)
        if (p == ours[i].self)
            return 1;
    return 0;
}

static void *bind(enum kind k, void *real)
{
    static int warned;
    void *cur;
    int i;

    if (is_ours(real))
        return real;
    for (i = 0; i < SLOTS; i++) {
        cur = __atomic_load_n(&slot_real[k][i], __ATOMIC_ACQUIRE);
        if (!cur && __atomic_compare_exchange_n(&slot_real[k][i], &cur, real, 0, __ATOMIC_ACQ_REL,
                                                __ATOMIC_ACQUIRE))
            return slot_fn[k][i];
        if (cur == real)
            return slot_fn[k][i];
    }
    if (debug && !__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED))
        fprintf(stderr, "drc hook: more than %d distinct %s entry points; later ones are not caught\n", SLOTS,
                kind_name[k]);
    return real;
}

void *drc__hook_cuda_symbol(const char *name, void *p, int for_drc)
{
    unsigned i;

    if (for_drc) {
        /* drc's own tables must hold the real functions, never ours (drc_cudaFree would come back here) */
        for (i = 0; i < sizeof(ours) / sizeof(ours[0]); i++)
            if (p == ours[i].self)
                return next_sym(&ours[i].next, ours[i].name);
        return p;
    }
    if (!strncmp(name, "cuda", 4))
        return p;   /* the runtime's names: our exports above already are the wrappers */
    /* only the exact names a program can dlsym (the plain "cuMemFree" is the 32-bit one) */
    return rewrite(name, 0, p);
}
