/*
 * build/libdrc_hook.so: invalidation for programs that free GPU memory
 * without knowing about drc. LD_PRELOAD it; it needs nothing else.
 *
 * How a free reaches the driver, and where this library sits on the way:
 *
 *  1. A program linked with -lcuda calls cuMemFree_v2 & co. directly: the
 *     exported cuMemFree_v2, cuMemFreeAsync(_ptsz) and cuMemUnmap below come
 *     first in symbol lookup and call the next definition (RTLD_NEXT).
 *  2. The CUDA runtime, static (nvcc's default) or shared, calls none of
 *     those symbols. It does dlsym(libcuda, "cuGetProcAddress_v2"), asks that
 *     for "cuGetProcAddress", and asks the answer for each entry point
 *     ("cuMemFree" at version 3020, "cuMemFreeAsync" at 11020, ...). So
 *     dlsym is interposed: for cuGetProcAddress(_v2) it hands back a wrapper,
 *     which returns wrappers for itself and for the frees and keeps every
 *     other answer. dlsym of the free symbols themselves is wrapped too.
 *  3. A shared libcudart's cudaFree/cudaFreeAsync are interposed as well
 *     (the runtime then frees through a wrapped driver entry: drc is told
 *     twice, which costs one more lookup and is otherwise harmless).
 *
 * With DRC_MONITOR=cupti the wrappers pass everything through untouched and
 * a CUPTI callback subscriber (hook_cupti.c) reports the frees instead;
 * DRC_MONITOR=none turns the library off.
 *
 * A wrapper has to know which real function it calls, and cuGetProcAddress
 * may answer with any pointer, so each kind of wrapper has a few slots: the
 * first pointers seen of that kind are bound to a slot's wrapper each. In
 * practice one pointer per kind appears (two for cuMemFreeAsync: legacy and
 * per-thread stream). Should the slots run out, the real pointer is handed
 * back and that path is not caught (DRC_HOOK_DEBUG=1 says so on stderr).
 *
 * Each wrapper brackets the real call: drc's begin (invalidate the whole
 * allocation and mark it as being freed) before, end after (notify.c,
 * "Frees in flight"). Nothing here enters drc until drc itself says where it
 * is: the first cache created calls drc_hook_attach() (notify.c). Until then, and whenever no
 * cache exists, a free costs one load more than without this library.
 * Lookups that drc's own code makes (libdrc.so's driver tables) get the real
 * functions: their callers are recognised by exporting drc_notify_free.
 *
 * dlsym's meaning depends on its caller for RTLD_NEXT, so that handle is
 * passed straight on, and the plain path is a tail call (the library is
 * built with -O2 -foptimize-sibling-calls for it): libc then sees the
 * original caller's return address.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "preload/hook_preload.h"

#define EXPORT __attribute__((visibility("default")))

typedef unsigned long long cuptr;
typedef void *dlsym_fn(void *, const char *);

/* What drc hands over in drc_hook_attach(): notify.h's struct drc__hook_ops, version 2. */
struct hook_ops {
    int version;
    int (*begin)(const void *addr, size_t len);
    void (*end)(int ticket);
    const unsigned *caches;
    int (*begin_free)(unsigned long long ptr);
    int (*begin_teardown)(int device);
    int (*ctx_device)(void *ctx);
};

enum mode { MODE_UNSET = 0, MODE_HOOK = 1, MODE_CUPTI = 2, MODE_OFF = 3 };

static int mode;                        /* atomic: enum mode, decided once */
static const struct hook_ops *ops;      /* atomic: the drc that attached */
static dlsym_fn *libc_dlsym;            /* atomic */
static int debug;

/* ---- the real dlsym, and where drc and the driver are ---------------------- */

void *drc__hook_real_dlsym(void *handle, const char *name)
{
    dlsym_fn *f = __atomic_load_n(&libc_dlsym, __ATOMIC_ACQUIRE);

    if (!f) {
        *(void **)&f = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
        if (!f)
            *(void **)&f = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
        __atomic_store_n(&libc_dlsym, f, __ATOMIC_RELEASE);
    }
    return f ? f(handle, name) : NULL;
}

/* A symbol of the driver the program has loaded (never loads one itself). */
static void *driver_sym(const char *name)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    void *p = h ? drc__hook_real_dlsym(h, name) : NULL;

    if (h)
        dlclose(h);     /* drops the reference NOLOAD took; the driver stays */
    return p;
}

static int get_mode(void)
{
    int m = __atomic_load_n(&mode, __ATOMIC_ACQUIRE);
    const char *env;

    if (m != MODE_UNSET)
        return m;
    env = getenv("DRC_MONITOR");
    debug = getenv("DRC_HOOK_DEBUG") != NULL;
    if (env && !strcmp(env, "cupti")) {
        /* pass through while CUPTI starts: libcupti's own dlsym calls come back here */
        if (!__atomic_compare_exchange_n(&mode, &m, MODE_OFF, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
            return m;
        m = drc__hook_cupti_start() == 0 ? MODE_CUPTI : MODE_HOOK;
    } else if (env && (!strcmp(env, "none") || !strcmp(env, "off")))
        m = MODE_OFF;
    else
        m = MODE_HOOK;
    __atomic_store_n(&mode, m, __ATOMIC_RELEASE);
    return m;
}

__attribute__((constructor)) static void hook_init(void)
{
    get_mode();
}

/*
 * Called by drc (notify.c) when its first cache is created. One drc per
 * process: a second one attaching replaces the first.
 */
EXPORT void drc_hook_attach(const struct hook_ops *o)
{
    if (!o || o->version < 2)
        return;
    __atomic_store_n(&ops, o, __ATOMIC_RELEASE);
    if (debug)
        fprintf(stderr, "drc hook: attached to drc (monitor: %s)\n",
                get_mode() == MODE_CUPTI ? "cupti" : get_mode() == MODE_HOOK ? "hook" : "off");
}

static const struct hook_ops *active_ops(void)
{
    const struct hook_ops *o = __atomic_load_n(&ops, __ATOMIC_ACQUIRE);

    return o && __atomic_load_n(o->caches, __ATOMIC_ACQUIRE) ? o : NULL;
}

int drc__hook_begin_free(cuptr dptr)
{
    static int (*range)(cuptr *, size_t *, cuptr);
    const struct hook_ops *o = active_ops();
    cuptr base = 0;
    size_t size = 0;

    if (!o || !dptr)
        return -1;
    if (o->begin_free)
        return o->begin_free(dptr);     /* drc's one begin-free routine (src/cuda/free.c) */
    if (!__atomic_load_n(&range, __ATOMIC_ACQUIRE))
        __atomic_store_n((void **)&range, driver_sym("cuMemGetAddressRange_v2"), __ATOMIC_RELEASE);
    /* the bounds while the pointer is still valid: a region may cover any part of the allocation */
    if (range && range(&base, &size, dptr) == 0 && size)
        return o->begin((const void *)(uintptr_t)base, size);
    return o->begin((const void *)(uintptr_t)dptr, 1);
}

int drc__hook_begin_unmap(cuptr ptr, size_t size)
{
    const struct hook_ops *o = active_ops();

    return o && ptr && size ? o->begin((const void *)(uintptr_t)ptr, size) : -1;
}

void drc__hook_end(int ticket)
{
    const struct hook_ops *o = __atomic_load_n(&ops, __ATOMIC_ACQUIRE);

    if (o && ticket >= 0)
        o->end(ticket);
}

static int hooking(void)
{
    return get_mode() == MODE_HOOK;
}

/* ---- the wrappers, one per kind of entry point ------------------------------- */

enum kind { K_FREE, K_FREE_ASYNC, K_UNMAP, K_GPA1, K_GPA2, KINDS };
enum { SLOTS = 3 };

static void *slot_real[KINDS][SLOTS];   /* atomic: the real function slot i of a kind calls */
static const char *const kind_name[KINDS] = { "cuMemFree_v2", "cuMemFreeAsync", "cuMemUnmap",
                                              "cuGetProcAddress", "cuGetProcAddress_v2" };

typedef int free_fn(cuptr);
typedef int free_async_fn(cuptr, void *);
typedef int unmap_fn(cuptr, size_t);
typedef int gpa1_fn(const char *, void **, int, unsigned long long);
typedef int gpa2_fn(const char *, void **, int, unsigned long long, int *);

static void *bind(enum kind k, void *real);

static int call_free(void *real, cuptr d)
{
    if (!real)
        return 3;       /* CUDA_ERROR_NOT_INITIALIZED: there is no driver behind us */
    int t = hooking() ? drc__hook_begin_free(d) : -1, r = ((free_fn *)real)(d);

    drc__hook_end(t);
    return r;
}

static int call_free_async(void *real, cuptr d, void *stream)
{
    if (!real)
        return 3;
    int t = hooking() ? drc__hook_begin_free(d) : -1, r = ((free_async_fn *)real)(d, stream);

    drc__hook_end(t);
    return r;
}

static int call_unmap(void *real, cuptr p, size_t size)
{
    if (!real)
        return 3;
    int t = hooking() ? drc__hook_begin_unmap(p, size) : -1, r = ((unmap_fn *)real)(p, size);

    drc__hook_end(t);
    return r;
}

/* Which wrapper an answer of cuGetProcAddress gets, by the symbol asked for. */
static void *rewrite(const char *sym, int version, unsigned long long flags, void *p)
{
    static void *gpa1, *gpa2;

    (void)flags;
    if (!sym || !p || !hooking())
        return p;
    if (!strcmp(sym, "cuGetProcAddress") || !strcmp(sym, "cuGetProcAddress_v2")) {
        if (!__atomic_load_n(&gpa2, __ATOMIC_ACQUIRE)) {
            __atomic_store_n(&gpa1, driver_sym("cuGetProcAddress"), __ATOMIC_RELEASE);
            __atomic_store_n(&gpa2, driver_sym("cuGetProcAddress_v2"), __ATOMIC_RELEASE);
        }
        /* the ABI of the answer: the exported entry it equals, else the version asked (v2 since 12.0) */
        if (p == __atomic_load_n(&gpa1, __ATOMIC_ACQUIRE))
            return bind(K_GPA1, p);
        if (p == __atomic_load_n(&gpa2, __ATOMIC_ACQUIRE) || version >= 12000)
            return bind(K_GPA2, p);
        return bind(K_GPA1, p);
    }
    if ((!strcmp(sym, "cuMemFree") && version >= 3020) || !strcmp(sym, "cuMemFree_v2"))
        return bind(K_FREE, p);     /* below 3020 it is the 32-bit cuMemFree, which no 64-bit program uses */
    if (!strcmp(sym, "cuMemFreeAsync") || !strcmp(sym, "cuMemFreeAsync_ptsz"))
        return bind(K_FREE_ASYNC, p);
    if (!strcmp(sym, "cuMemUnmap"))
        return bind(K_UNMAP, p);
    return p;
}

static int call_gpa1(void *real, const char *sym, void **pfn, int version, unsigned long long flags)
{
    int r;

    if (!real)
        return 3;
    r = ((gpa1_fn *)real)(sym, pfn, version, flags);
    if (r == 0 && pfn)
        *pfn = rewrite(sym, version, flags, *pfn);
    return r;
}

static int call_gpa2(void *real, const char *sym, void **pfn, int version, unsigned long long flags, int *status)
{
    int r;

    if (!real)
        return 3;
    r = ((gpa2_fn *)real)(sym, pfn, version, flags, status);
    if (r == 0 && pfn)
        *pfn = rewrite(sym, version, flags, *pfn);
    return r;
}

#define REAL(k, i) __atomic_load_n(&slot_real[k][i], __ATOMIC_ACQUIRE)

static int free_0(cuptr d) { return call_free(REAL(K_FREE, 0), d); }
static int free_1(cuptr d) { return call_free(REAL(K_FREE, 1), d); }
static int free_2(cuptr d) { return call_free(REAL(K_FREE, 2), d); }
static int free_async_0(cuptr d, void *s) { return call_free_async(REAL(K_FREE_ASYNC, 0), d, s); }
static int free_async_1(cuptr d, void *s) { return call_free_async(REAL(K_FREE_ASYNC, 1), d, s); }
static int free_async_2(cuptr d, void *s) { return call_free_async(REAL(K_FREE_ASYNC, 2), d, s); }
static int unmap_0(cuptr p, size_t n) { return call_unmap(REAL(K_UNMAP, 0), p, n); }
static int unmap_1(cuptr p, size_t n) { return call_unmap(REAL(K_UNMAP, 1), p, n); }
static int unmap_2(cuptr p, size_t n) { return call_unmap(REAL(K_UNMAP, 2), p, n); }
static int gpa1_0(const char *s, void **p, int v, unsigned long long f) { return call_gpa1(REAL(K_GPA1, 0), s, p, v, f); }
static int gpa1_1(const char *s, void **p, int v, unsigned long long f) { return call_gpa1(REAL(K_GPA1, 1), s, p, v, f); }
static int gpa1_2(const char *s, void **p, int v, unsigned long long f) { return call_gpa1(REAL(K_GPA1, 2), s, p, v, f); }
static int gpa2_0(const char *s, void **p, int v, unsigned long long f, int *st) { return call_gpa2(REAL(K_GPA2, 0), s, p, v, f, st); }
static int gpa2_1(const char *s, void **p, int v, unsigned long long f, int *st) { return call_gpa2(REAL(K_GPA2, 1), s, p, v, f, st); }
static int gpa2_2(const char *s, void **p, int v, unsigned long long f, int *st) { return call_gpa2(REAL(K_GPA2, 2), s, p, v, f, st); }

#undef REAL

static void *const slot_fn[KINDS][SLOTS] = {
    { (void *)free_0, (void *)free_1, (void *)free_2 },
    { (void *)free_async_0, (void *)free_async_1, (void *)free_async_2 },
    { (void *)unmap_0, (void *)unmap_1, (void *)unmap_2 },
    { (void *)gpa1_0, (void *)gpa1_1, (void *)gpa1_2 },
    { (void *)gpa2_0, (void *)gpa2_1, (void *)gpa2_2 },
};

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

EXPORT int cuMemFree_v2(cuptr d)
{
    static void *next;

    return call_free(next_sym(&next, "cuMemFree_v2"), d);
}

EXPORT int cuMemFreeAsync(cuptr d, void *stream)
{
    static void *next;

    return call_free_async(next_sym(&next, "cuMemFreeAsync"), d, stream);
}

EXPORT int cuMemFreeAsync_ptsz(cuptr d, void *stream)
{
    static void *next;

    return call_free_async(next_sym(&next, "cuMemFreeAsync_ptsz"), d, stream);
}

EXPORT int cuMemUnmap(cuptr p, size_t size)
{
    static void *next;

    return call_unmap(next_sym(&next, "cuMemUnmap"), p, size);
}

EXPORT int cuGetProcAddress(const char *sym, void **pfn, int version, unsigned long long flags)
{
    static void *next;

    return call_gpa1(next_sym(&next, "cuGetProcAddress"), sym, pfn, version, flags);
}

EXPORT int cuGetProcAddress_v2(const char *sym, void **pfn, int version, unsigned long long flags, int *status)
{
    static void *next;

    return call_gpa2(next_sym(&next, "cuGetProcAddress_v2"), sym, pfn, version, flags, status);
}

/* Our own exported functions: never wrapped again when dlsym finds them first. */
static int is_ours(const void *p)
{
    return p == (void *)cuMemFree_v2 || p == (void *)cuMemFreeAsync || p == (void *)cuMemFreeAsync_ptsz ||
           p == (void *)cuMemUnmap || p == (void *)cuGetProcAddress || p == (void *)cuGetProcAddress_v2;
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

/* cudaError_t of a CUresult, for the frees done through the driver. */
static int rt_error(int cu)
{
    return cu == 0 ? 0 : cu == 1 ? 1 : cu == 3 ? 3 : 999;
}

EXPORT int cudaFree(void *ptr)
{
    static void *next, *drv_free, *drv_sync;
    int (*sync)(void);
    int err;

    if (next_sym(&next, "cudaFree")) {
        int t = hooking() ? drc__hook_begin_free((cuptr)(uintptr_t)ptr) : -1, r = ((int (*)(void *))next)(ptr);

        drc__hook_end(t);
        return r;
    }
    /*
     * No shared runtime behind us: someone found this symbol with dlsym
     * (drc_cudaFree does, to reach a shared libcudart). Do what cudaFree
     * does for cudaMalloc memory: wait for the device, then free.
     */
    if (!ptr)
        return 0;
    *(void **)&sync = next_sym(&drv_sync, "cuCtxSynchronize");
    if (sync && (err = sync()) != 0)
        return rt_error(err);
    return rt_error(call_free(next_sym(&drv_free, "cuMemFree_v2"), (cuptr)(uintptr_t)ptr));
}

EXPORT int cudaFreeAsync(void *ptr, void *stream)
{
    static void *next, *drv_free_async;

    if (next_sym(&next, "cudaFreeAsync")) {
        int t = hooking() ? drc__hook_begin_free((cuptr)(uintptr_t)ptr) : -1;
        int r = ((int (*)(void *, void *))next)(ptr, stream);

        drc__hook_end(t);
        return r;
    }
    return rt_error(call_free_async(next_sym(&drv_free_async, "cuMemFreeAsync"), (cuptr)(uintptr_t)ptr, stream));
}

/* ---- dlsym ----------------------------------------------------------------- */

/* 1 if the code at @ra belongs to a libdrc (an object that exports drc_notify_free). */
static int from_drc(const void *ra)
{
    static const void *known_base[4];
    static int known_drc[4], next_slot;
    Dl_info self, found;
    void *h, *p;
    int i, yes = 0;

    if (!dladdr(ra, &self) || !self.dli_fbase)
        return 0;
    for (i = 0; i < 4; i++)
        if (__atomic_load_n(&known_base[i], __ATOMIC_ACQUIRE) == self.dli_fbase)
            return __atomic_load_n(&known_drc[i], __ATOMIC_ACQUIRE);
    h = self.dli_fname && self.dli_fname[0] ? dlopen(self.dli_fname, RTLD_LAZY | RTLD_NOLOAD) : NULL;
    if (h) {
        p = drc__hook_real_dlsym(h, "drc_notify_free");
        yes = p && dladdr(p, &found) && found.dli_fbase == self.dli_fbase;
        dlclose(h);
    }
    i = __atomic_fetch_add(&next_slot, 1, __ATOMIC_RELAXED) % 4;
    __atomic_store_n(&known_drc[i], yes, __ATOMIC_RELEASE);
    __atomic_store_n(&known_base[i], self.dli_fbase, __ATOMIC_RELEASE);
    return yes;
}

static void *dlsym_hooked(void *handle, const char *name, const void *ra)
{
    void *p = drc__hook_real_dlsym(handle, name);
    static const char *const names[] = { "cuGetProcAddress", "cuGetProcAddress_v2", "cuMemFree_v2",
                                         "cuMemFreeAsync", "cuMemFreeAsync_ptsz", "cuMemUnmap" };
    unsigned i;

    if (!p)
        return p;
    for (i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (!strcmp(name, names[i]))
            break;
    if (i == sizeof(names) / sizeof(names[0]) || from_drc(ra))
        return p;   /* drc's own driver tables must hold the real functions */
    return rewrite(name, 13000, 0, p);
}

EXPORT void *dlsym(void *handle, const char *name)
{
    if (handle != RTLD_NEXT && name[0] == 'c' && name[1] == 'u' && hooking())
        return dlsym_hooked(handle, name, __builtin_return_address(0));
    return drc__hook_real_dlsym(handle, name);     /* a tail call: RTLD_NEXT is relative to the caller */
}
