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
 * What is caught: every entry of the one list of the CUDA frees
 * (src/cuda/frees.h), under each of its symbols: the frees, unmaps, pinned
 * host frees, IPC closes and context teardowns of the driver (and
 * cuDevicePrimaryCtxRelease when it dropped the last reference: told only
 * afterwards, so the invalidation follows the call), and the frees and
 * cudaDeviceReset of a shared runtime.
 * Each wrapper begins the free in every attached drc, through drc's own
 * begin-free routine (src/cuda/free.c: the whole allocation, whatever the
 * calling thread's context), calls the real function, and ends the free.
 *
 * With DRC_MONITOR=cupti the wrappers pass everything through untouched and
 * a CUPTI callback subscriber (preload_cupti.c) reports the frees instead;
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
#include "cuda/cuda.h"      /* the list of the frees and the constants: the driver is reached through its own symbols */
#include "preload/preload.h"

#define EXPORT __attribute__((visibility("default")))

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
        m = drc__preload_cupti_start() == 0 ? MODE_CUPTI : MODE_HOOK;
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
    p = drc__preload_real_dlsym(h, name);
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
    s = drc__preload_real_dlsym(h, name);
    dlclose(h);
    return s;
}

/* ---- the wrappers, one per driver entry point (frees.h) ----------------------- */

/* The kinds of slot: each driver free of the list, and cuGetProcAddress in its two ABIs. */
#define KIND_DRIVER(name) K_##name,
#define KIND_RUNTIME(name)
#define KIND(api, name, versions, since, kind, params, args, fallback) KIND_##api(name)
enum kind { DRC__CUDA_FREES(KIND) K_GPA1, K_GPA2, KINDS };
#undef KIND
enum { SLOTS = 3 };

static void *slot_real[KINDS][SLOTS];   /* atomic: the real function slot i of a kind calls */
#define KIND_NAME_DRIVER(name) #name,
#define KIND_NAME_RUNTIME(name)
#define KIND_NAME(api, name, versions, since, kind, params, args, fallback) KIND_NAME_##api(name)
static const char *const kind_name[KINDS] = { DRC__CUDA_FREES(KIND_NAME) "cuGetProcAddress", "cuGetProcAddress_v2" };
#undef KIND_NAME

typedef int gpa1_fn(const char *, void **, int, unsigned long long);
typedef int gpa2_fn(const char *, void **, int, unsigned long long, int *);

static void *bind(enum kind k, void *real);

enum { NOT_INITIALIZED = DRC__CUDA_ERROR_NOT_INITIALIZED };    /* there is no driver behind us */

/* What each kind begins in every attached drc (preload.h), from the call's arguments. */
#define BEGIN_FREE(...) drc__preload_begin_free((uintptr_t)DRC__FIRST(__VA_ARGS__))
#define BEGIN_UNMAP(ptr, size) drc__preload_begin_unmap(ptr, size)
#define BEGIN_TEARDOWN(dev) drc__preload_begin_teardown(dev)
#define BEGIN_DESTROY(ctx) drc__preload_begin_teardown(drc__preload_ctx_device(ctx))
#define BEGIN_RELEASE(dev) -1
/* ... and what it does once the real call returned: a release is told only afterwards */
#define AFTER_FREE(...) (void)0
#define AFTER_UNMAP(...) (void)0
#define AFTER_TEARDOWN(...) (void)0
#define AFTER_DESTROY(...) (void)0
#define AFTER_RELEASE(r, dev)                                                           \
    if ((r) == 0 && hooking())                                                          \
        drc__preload_primary_released(dev)

/* call_<name>(real, args): begin, the real function, end; what every wrapper of the entry calls. */
#define CALL_DRIVER(name, kind, params, args)                                           \
    static int call_##name(void *real, DRC__UNPAREN params)                             \
    {                                                                                   \
        int t, r;                                                                       \
                                                                                        \
        if (!real)                                                                      \
            return NOT_INITIALIZED;                                                     \
        t = hooking() ? BEGIN_##kind args : -1;                                         \
        r = ((int (*) params)real) args;                                                \
        drc__preload_end(t);                                                               \
        AFTER_##kind(r, DRC__UNPAREN args);                                             \
        return r;                                                                       \
    }
#define CALL_RUNTIME(name, kind, params, args)
#define CALL(api, name, versions, since, kind, params, args, fallback) CALL_##api(name, kind, params, args)
DRC__CUDA_FREES(CALL)
#undef CALL

/* Which wrapper an answer of cuGetProcAddress gets, by the symbol asked for. */
static const struct {
    const char *name, *suffix;
    int since;
    enum kind k;
} names[] = {
#define NAME_DRIVER(name, versions, since) { #name, DRC__CUDA_SUFFIX(versions), since, K_##name },
#define NAME_RUNTIME(name, versions, since)
#define NAME(api, name, versions, since, kind, params, args, fallback) NAME_##api(name, versions, since)
    DRC__CUDA_FREES(NAME)
#undef NAME
};

static void *rewrite(const char *sym, int version, void *p)
{
    size_t i;

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
    /* below its since, a plain name is an older ABI (the 32-bit cuMemFree), which no 64-bit program uses */
    for (i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (drc__cuda_names(sym, version, names[i].name, names[i].since, names[i].suffix))
            return bind(names[i].k, p);
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

#define SLOTS_DRIVER(name, params, args) SLOT3(K_##name, slot_##name, name, params, DRC__UNPAREN args)
#define SLOTS_RUNTIME(name, params, args)
#define SLOTS(api, name, versions, since, kind, params, args, fallback) SLOTS_##api(name, params, args)
DRC__CUDA_FREES(SLOTS)
#undef SLOTS
SLOT3(K_GPA1, slot_gpa1, gpa1, (const char *s, void **p, int v, unsigned long long f), s, p, v, f)
SLOT3(K_GPA2, slot_gpa2, gpa2, (const char *s, void **p, int v, unsigned long long f, int *st), s, p, v, f, st)

#undef SLOT3
#undef REAL

#define FNS3(NAME) { (void *)NAME##_0, (void *)NAME##_1, (void *)NAME##_2 },
#define FNS_DRIVER(name) FNS3(slot_##name)
#define FNS_RUNTIME(name)
#define FNS(api, name, versions, since, kind, params, args, fallback) FNS_##api(name)
static void *const slot_fn[KINDS][SLOTS] = { DRC__CUDA_FREES(FNS) FNS3(slot_gpa1) FNS3(slot_gpa2) };
#undef FNS
#undef FNS3

/* ---- the exported entry points --------------------------------------------- */

/* The next definition of one of our own exported names (the driver's, the runtime's). */
static void *next_sym(void **cache, const char *name)
{
    void *p = __atomic_load_n(cache, __ATOMIC_ACQUIRE);

    if (!p) {
        p = drc__preload_real_dlsym(RTLD_NEXT, name);
        if (!p && !strncmp(name, "cu", 2) && strncmp(name, "cuda", 4))
            p = driver_sym(name);   /* a driver dlopen'ed RTLD_LOCAL is not "next" */
        __atomic_store_n(cache, p, __ATOMIC_RELEASE);
    }
    return p;
}

/*
 * Our exports: every symbol of each driver free; the runtime's frees under
 * their plain names (a shared libcudart's _ptsz ones free through the
 * driver's, which are caught); cuGetProcAddress in its two ABIs.
 */
#define O_SYM(name, sym, ...) O_##sym,
#define O_DRIVER(name, versions) DRC__CUDA_SYMS(versions, O_SYM, name, ~)
#define O_RUNTIME(name, versions) O_##name,
#define O(api, name, versions, since, kind, params, args, fallback) O_##api(name, versions)
enum { DRC__CUDA_FREES(O) O_cuGetProcAddress, O_cuGetProcAddress_v2, OURS };
#undef O

#define PROTO_SYM(name, sym, params) EXPORT int sym params;
#define PROTO_DRIVER(name, versions, params) DRC__CUDA_SYMS(versions, PROTO_SYM, name, params)
#define PROTO_RUNTIME(name, versions, params) EXPORT int name params;
#define PROTO(api, name, versions, since, kind, params, args, fallback) PROTO_##api(name, versions, params)
DRC__CUDA_FREES(PROTO)
#undef PROTO
EXPORT int cuGetProcAddress(const char *sym, void **pfn, int version, unsigned long long flags);
EXPORT int cuGetProcAddress_v2(const char *sym, void **pfn, int version, unsigned long long flags, int *status);

/* Each exported name with its cache of the next definition: what drc's own lookups get. */
static struct ours {
    const char *name;
    void *self;
    void *next;         /* atomic */
} ours[OURS] = {
#define OURS_SYM(name, sym, ...) [O_##sym] = { #sym, (void *)sym, NULL },
#define OURS_DRIVER(name, versions) DRC__CUDA_SYMS(versions, OURS_SYM, name, ~)
#define OURS_RUNTIME(name, versions) OURS_SYM(name, name)
#define OURS(api, name, versions, since, kind, params, args, fallback) OURS_##api(name, versions)
    DRC__CUDA_FREES(OURS)
#undef OURS
    OURS_SYM(cuGetProcAddress, cuGetProcAddress)
    OURS_SYM(cuGetProcAddress_v2, cuGetProcAddress_v2)
};

#define NEXT(sym) next_sym(&ours[O_##sym].next, ours[O_##sym].name)

/* The driver's: each symbol calls the entry's call_<name> with its own next definition. */
#define EXPORT_SYM(name, sym, params, args)                                              \
    EXPORT int sym params { return call_##name(NEXT(sym), DRC__UNPAREN args); }
#define EXPORT_DRIVER(name, versions, kind, params, args) DRC__CUDA_SYMS(versions, EXPORT_SYM, name, params, args)

/*
 * The runtime's: a shared libcudart behind us, or else (someone found these
 * with dlsym under a static runtime: a static libdrc's drc_cudaFree does) the
 * same call through libdrc's wrapper, which does it with the driver. With no
 * libcudart behind, libdrc's drc_cudaDeviceReset tells of the current
 * device itself; with one, every device is taken, to be sure.
 */
#define RT_BEGIN_FREE(next, ...) BEGIN_FREE(__VA_ARGS__)
#define RT_BEGIN_DEVICE_RESET(next, ...) ((next) ? drc__preload_begin_teardown(-1) : -1)
#define EXPORT_RUNTIME(name, versions, kind, params, args)                               \
    EXPORT int name params                                                               \
    {                                                                                    \
        void *next = NEXT(name);                                                         \
        int t = hooking() ? RT_BEGIN_##kind(next, DRC__UNPAREN args) : -1;               \
        int r = next ? ((int (*) params)next) args : drc_##name args;                    \
                                                                                         \
        drc__preload_end(t);                                                                \
        return r;                                                                        \
    }

#define EXPORTS(api, name, versions, since, kind, params, args, fallback) EXPORT_##api(name, versions, kind, params, args)
DRC__CUDA_FREES(EXPORTS)
#undef EXPORTS

EXPORT int cuGetProcAddress(const char *sym, void **pfn, int version, unsigned long long flags)
{
    return call_gpa1(NEXT(cuGetProcAddress), sym, pfn, version, flags);
}
EXPORT int cuGetProcAddress_v2(const char *sym, void **pfn, int version, unsigned long long flags, int *status)
{
    return call_gpa2(NEXT(cuGetProcAddress_v2), sym, pfn, version, flags, status);
}

#undef NEXT

/* Our own exported functions: never wrapped again when dlsym finds them first. */
static int is_ours(const void *p)
{
    unsigned i;

    for (i = 0; i < OURS; i++)
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

void *drc__preload_cuda_symbol(const char *name, void *p, int for_drc)
{
    unsigned i;

    if (for_drc) {
        /* drc's own tables must hold the real functions, never ours (drc_cudaFree would come back here) */
        for (i = 0; i < OURS; i++)
            if (p == ours[i].self)
                return next_sym(&ours[i].next, ours[i].name);
        return p;
    }
    if (!strncmp(name, "cuda", 4))
        return p;   /* the runtime's names: our exports above already are the wrappers */
    /* only the exact names a program can dlsym (the plain "cuMemFree" is the 32-bit one) */
    return rewrite(name, 0, p);
}
