/*
 * The verbs front of the preload (today build/libdrc_verbs.so): put drc in
 * front of a transfer engine that calls ibv_reg_mr on GPU memory, with no
 * change to the engine:
 *
 *     LD_PRELOAD=libdrc_verbs.so  engine ...
 *
 * What is interposed, and why these symbols: rdma-core's verbs.h makes
 * ibv_reg_mr a macro that calls the exported ibv_reg_mr for constant access
 * flags and ibv_reg_mr_iova2 for run-time or relaxed-ordering ones; inside
 * libibverbs, ibv_reg_mr and ibv_reg_mr_iova jump to ibv_reg_mr_iova2 through
 * the PLT. So ibv_reg_mr_iova2 defined here sees every registration, even
 * from a libibverbs the engine opened privately with dlopen; ibv_reg_mr and
 * ibv_reg_mr_iova are defined too for engines that call them directly.
 *
 * A registration is served from the PD's drc cache (drc_reg_mr) when drc can
 * serve it: iova equal to the address, access bits within DRC_ACCESS_MASK,
 * and, under DRC_VERBS_HOST=passthrough, GPU memory only. Anything else goes
 * to the next ibv_reg_mr_iova2 as asked. A registration shares a cached MR
 * only with registrations that asked the same access bits (the cache's
 * default rule, drc.h): an engine publishes every MR's rkey to its peers,
 * so an MR must never allow more than its own request asked, whatever
 * another component of the process registered the same memory with. The
 * preload never opts into DRC_F_ACCESS_SUPERSET. ibv_dereg_mr releases a caller MR
 * of drc (drc_dereg_mr) and hands every other MR to the next ibv_dereg_mr:
 * an MR of drc never reaches the provider, which would take it for one of
 * its own. ibv_rereg_mr of an MR of drc is refused (EINVAL,
 * IBV_REREG_MR_ERR_INPUT, the MR unchanged) for the same reason; other MRs
 * go to the next ibv_rereg_mr. ibv_dealloc_pd drops the PD's cache first
 * (its idle cached MRs would keep the real call failing with EBUSY).
 * ibv_reg_dmabuf_mr is not touched: an engine that exports its own dmabuf
 * registers exactly what it asked.
 *
 * Libraries that open libibverbs themselves (dlopen RTLD_LOCAL + dlsym, as
 * Mooncake's TENT engine and NCCL do) would get libibverbs's ibv_dereg_mr,
 * ibv_dealloc_pd and ibv_rereg_mr, not these. The preload's dlsym/dlvsym
 * interposer (preload_cuda.c) asks drc__preload_verbs_symbol() for each
 * ibv_* name and hands out the definition here instead.
 *
 * drc's own verbs calls go through the verbs ops table (verbs/ops.h). The
 * constructor installs a table whose entries forward to the *next*
 * definitions (the real libibverbs, or whatever stands in for it), so drc's
 * registrations never come back here: no re-entry, no per-thread state.
 *
 * Environment, read once at load (core/config.c has the table, README.md
 * shows it): DRC_VERBS, DRC_POLICY, DRC_MAX_REGIONS, DRC_VERBS_HOST,
 * DRC_VERBS_WIDEN (regmr.c says why local is the default), DRC_VERBS_REVOKE,
 * DRC_LOG.
 */
#include "preload/preload_verbs.h"

#include <dlfcn.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/config.h"
#include "cuda/cuda.h"
#include "drc.h"
#include "drc_verbs.h"
#include "verbs/ops.h"
#include "verbs/regmr.h"
#include "preload/preload.h"

/* preload.c's choice of parts; weak: the unit test links this file without preload.c */
#pragma weak drc__preload_part

#define EXPORT __attribute__((visibility("default")))

static int enabled = 1;
static int log_level;               /* enum drc__log */
static int host_passthrough;
static uint64_t n_passthrough;      /* atomic: registrations handed on untouched */
static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static int init_done;               /* atomic: init() ran; the fields above are set */
static int fast;                    /* atomic, set last by init(): a registration may go straight to drc_reg_mr */

/* ---- the next definitions, resolved on first use ------------------------- */

static int is_ours(const void *p);

/*
 * The definition after this library: RTLD_NEXT when libibverbs is in the
 * global scope, else the library's own (a program that dlopen'ed it
 * RTLD_LOCAL: RTLD_NEXT cannot see it). Never one of the definitions here,
 * whatever a dlsym interposer answers.
 */
static void *next_lookup(void *arg, const char *name, const char *version)
{
    void *p, *h;

    (void)arg;
    p = dlvsym(RTLD_NEXT, name, version);
    if (!p)
        p = dlsym(RTLD_NEXT, name);
    if (!p || is_ours(p)) {
        h = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
        p = h ? dlvsym(h, name, version) : NULL;
        if (h && !p)
            p = dlsym(h, name);
        if (h)
            dlclose(h);     /* NOLOAD took a reference; the library stays loaded by whoever loaded it */
    }
    return p && !is_ours(p) ? p : NULL;
}

static struct drc__verbs_ops next_ops;  /* atomic per entry */
static pthread_mutex_t resolve_lock = PTHREAD_MUTEX_INITIALIZER;

/*
 * fork() (libdrc's lock order: core/fork.h): a thread resolving at the fork holds resolve_lock, across
 * dlopen, for ever in the child. The fork does not wait for it (the loader has its own fork handling);
 * the child makes it anew, and the entries, each atomic, are whole. Only this thread exists.
 */
static void resolve_forked(void)
{
    pthread_mutex_init(&resolve_lock, NULL);
}

__attribute__((constructor)) static void resolve_fork_init(void)
{
    pthread_atfork(NULL, NULL, resolve_forked);
}

/*
 * Resolve every next definition still missing, all at once: the first registration resolves the
 * deregistration too, so a dereg that a free hook makes (inside munmap, maybe inside the dynamic
 * loader) never has to call dlopen or dlsym. libibverbs may be loaded after us: until it is, the
 * entries stay NULL and the next call tries again.
 */
static void resolve_next(void)
{
    struct drc__verbs_ops found = { 0 };

    pthread_mutex_lock(&resolve_lock);
    drc__verbs_ops_fill(&found, next_lookup, NULL);
#define KEEP(field, name, version)                                                                     \
    if (!__atomic_load_n(&next_ops.field, __ATOMIC_RELAXED) && found.field)                        \
        __atomic_store_n(&next_ops.field, found.field, __ATOMIC_RELEASE);
    DRC__VERBS_OPS(KEEP)
#undef KEEP
    pthread_mutex_unlock(&resolve_lock);
}

/* next_ops.<field>, resolving what is missing first. */
#define NEXT(field)                                                                                \
    ({                                                                                                 \
        __typeof__(next_ops.field) f_ = __atomic_load_n(&next_ops.field, __ATOMIC_ACQUIRE);            \
        if (!f_) {                                                                                     \
            resolve_next();                                                                            \
            f_ = __atomic_load_n(&next_ops.field, __ATOMIC_ACQUIRE);                                   \
        }                                                                                              \
        f_;                                                                                            \
    })

static int fwd_query_device(struct ibv_context *ctx, struct ibv_device_attr *attr)
{
    __typeof__(next_ops.query_device) f = NEXT(query_device);

    return f ? f(ctx, attr) : ENOSYS;
}

static struct ibv_mr *fwd_reg_mr_iova2(struct ibv_pd *pd, void *addr, size_t length, uint64_t iova, unsigned access)
{
    __typeof__(next_ops.reg_mr_iova2) f = NEXT(reg_mr_iova2);

    if (!f)
        errno = ENOSYS;
    return f ? f(pd, addr, length, iova, access) : NULL;
}

static struct ibv_mr *fwd_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset, size_t length, uint64_t iova, int fd,
                                        int access)
{
    __typeof__(next_ops.reg_dmabuf_mr) f = NEXT(reg_dmabuf_mr);

    if (!f)
        errno = EOPNOTSUPP;
    return f ? f(pd, offset, length, iova, fd, access) : NULL;
}

static int fwd_dereg_mr(struct ibv_mr *mr)
{
    __typeof__(next_ops.dereg_mr) f = NEXT(dereg_mr);

    return f ? f(mr) : ENOSYS;
}

static int fwd_dealloc_pd(struct ibv_pd *pd)
{
    __typeof__(next_ops.dealloc_pd) f = NEXT(dealloc_pd);

    return f ? f(pd) : ENOSYS;
}

static int fwd_rereg_mr(struct ibv_mr *mr, int flags, struct ibv_pd *pd, void *addr, size_t length, int access)
{
    __typeof__(next_ops.rereg_mr) f = NEXT(rereg_mr);

    if (!f) {
        errno = ENOSYS;
        return IBV_REREG_MR_ERR_INPUT;
    }
    return f(mr, flags, pd, addr, length, access);
}

static struct ibv_device **fwd_get_device_list(int *num)
{
    __typeof__(next_ops.get_device_list) f = NEXT(get_device_list);

    if (!f)
        errno = ENOSYS;
    return f ? f(num) : NULL;
}

static void fwd_free_device_list(struct ibv_device **list)
{
    __typeof__(next_ops.free_device_list) f = NEXT(free_device_list);

    if (f)
        f(list);
}

static const char *fwd_get_device_name(struct ibv_device *dev)
{
    __typeof__(next_ops.get_device_name) f = NEXT(get_device_name);

    return f ? f(dev) : NULL;
}

static struct ibv_context *fwd_open_device(struct ibv_device *dev)
{
    __typeof__(next_ops.open_device) f = NEXT(open_device);

    if (!f)
        errno = ENOSYS;
    return f ? f(dev) : NULL;
}

static int fwd_close_device(struct ibv_context *ctx)
{
    __typeof__(next_ops.close_device) f = NEXT(close_device);

    return f ? f(ctx) : ENOSYS;
}

static struct ibv_pd *fwd_alloc_pd(struct ibv_context *ctx)
{
    __typeof__(next_ops.alloc_pd) f = NEXT(alloc_pd);

    if (!f)
        errno = ENOSYS;
    return f ? f(ctx) : NULL;
}

/*
 * drc's table inside the preload: a forwarder for every entry. Each decision
 * drc makes per NIC reads this table as drc_reg_mr does outside the preload
 * (get_device_name: the dmabuf mapping type from the NIC's place on the PCI
 * bus), so an entry left NULL here is a decision made differently here;
 * test_verbs_preload checks that none is.
 */
static const struct drc__verbs_ops forward_ops = {
    .query_device = fwd_query_device,
    .reg_mr_iova2 = fwd_reg_mr_iova2,
    .reg_dmabuf_mr = fwd_reg_dmabuf_mr,
    .dereg_mr = fwd_dereg_mr,
    .dealloc_pd = fwd_dealloc_pd,
    .rereg_mr = fwd_rereg_mr,
    .get_device_list = fwd_get_device_list,
    .free_device_list = fwd_free_device_list,
    .get_device_name = fwd_get_device_name,
    .open_device = fwd_open_device,
    .close_device = fwd_close_device,
    .alloc_pd = fwd_alloc_pd,
};

/* ---- configuration -------------------------------------------------------- */

/* The DRC_* variables of this front, from the one parser (core/config.c, which reports mistakes). */
static void init(void)
{
    struct drc_config cfg = { 0 };

    enabled = drc__env(DRC__ENV_VERBS) &&
              (!drc__preload_part || drc__preload_part(DRC__PRELOAD_VERBS));   /* DRC_PRELOAD / the name preloaded */
    log_level = (int)drc__env(DRC__ENV_LOG);
    cfg.policy = (enum drc_policy)drc__env(DRC__ENV_POLICY);
    cfg.max_regions = (size_t)drc__env(DRC__ENV_MAX_REGIONS);
    if (drc__env(DRC__ENV_VERBS_WIDEN) == DRC__WIDEN_ALWAYS)
        cfg.flags |= DRC_F_WIDEN_REMOTE;
    else if (drc__env(DRC__ENV_VERBS_WIDEN) == DRC__WIDEN_NEVER)
        cfg.flags |= DRC_F_NO_WIDEN;
    if (drc__env(DRC__ENV_VERBS_REVOKE))
        cfg.flags |= DRC_F_REVOKE;
    host_passthrough = drc__env(DRC__ENV_VERBS_HOST) == 1;
    drc__regmr_configure(&cfg);
    drc__verbs_install(&forward_ops);
    resolve_next();     /* now, where libibverbs is already loaded; else on the first call */
    __atomic_store_n(&init_done, 1, __ATOMIC_RELEASE);
    __atomic_store_n(&fast, enabled && !host_passthrough && log_level < DRC__LOG_DEBUG, __ATOMIC_RELEASE);
}

/*
 * Every entry point makes sure of this first: another library's constructor may register before ours
 * ran. After init, one load (pthread_once's own check costs a call on every registration).
 */
static void ensure_init(void)
{
    if (!__atomic_load_n(&init_done, __ATOMIC_ACQUIRE))
        pthread_once(&init_once, init);
}

__attribute__((constructor)) static void verbs_preload_init(void)
{
    ensure_init();
}

__attribute__((destructor)) static void verbs_preload_fini(void)
{
    struct drc__regmr_totals t;
    unsigned long long passed = __atomic_load_n(&n_passthrough, __ATOMIC_RELAXED);

    if (log_level < DRC__LOG_INFO || !enabled)
        return;
    drc__regmr_totals(&t);
    if (!t.pds && !t.mrs_gpu && !t.mrs_host && !t.mrs_direct && !passed)
        return;     /* registered nothing: a shell, a compiler, each process of a pipeline says nothing */
    /* Over the process's life: PDs and caches may all be gone by now, the counts are not. */
    fprintf(stderr,
            "drc: over the process: %llu PDs, %llu MRs handed out (%llu GPU, %llu host, %llu passed through), "
            "at most %llu held at once, %llu still held; %llu NIC registrations and %llu deregistrations for "
            "them, %llu hits, %llu coalesced, %llu invalidated, %llu cached now; GPU via %s\n",
            (unsigned long long)t.pds, (unsigned long long)(t.mrs_gpu + t.mrs_host),
            (unsigned long long)t.mrs_gpu, (unsigned long long)t.mrs_host,
            (unsigned long long)t.mrs_direct + passed,
            (unsigned long long)t.peak, (unsigned long long)t.live, (unsigned long long)t.cache.regs,
            (unsigned long long)t.cache.deregs, (unsigned long long)t.cache.hits,
            (unsigned long long)t.cache.merges, (unsigned long long)t.cache.invalidated,
            (unsigned long long)t.cache.regions,
            !t.dmabuf && !t.peermem ? "-" : t.peermem ? (t.dmabuf ? "dmabuf and peermem" : "peermem") : "dmabuf");
}

/* ---- the interposers ------------------------------------------------------ */

/* Is @addr GPU memory? (cuMemGetAddressRange knows it; no driver: no.) */
static int is_gpu(const void *addr)
{
    uintptr_t base;
    size_t len;

    return drc__cuda_alloc_range((uintptr_t)addr, &base, &len) == 0;
}

static __attribute__((noinline)) struct ibv_mr *reg_slow(struct ibv_pd *pd, void *addr, size_t length,
                                                         uint64_t iova, unsigned access)
{
    struct ibv_mr *mr;

    ensure_init();
    if (!enabled || !pd || iova != (uintptr_t)addr || (access & ~DRC_ACCESS_MASK) ||
        (host_passthrough && !is_gpu(addr))) {
        __atomic_fetch_add(&n_passthrough, 1, __ATOMIC_RELAXED);
        mr = fwd_reg_mr_iova2(pd, addr, length, iova, access);
        if (log_level >= DRC__LOG_DEBUG && enabled)
            fprintf(stderr, "drc: reg_mr %p+%zu iova 0x%llx access 0x%x: passed through -> %p\n", addr, length,
                    (unsigned long long)iova, access, (void *)mr);
        return mr;
    }
    mr = drc_reg_mr(pd, addr, length, (int)access);
    if (log_level >= DRC__LOG_DEBUG) {
        int e = errno;

        fprintf(stderr, "drc: reg_mr %p+%zu access 0x%x: %s lkey 0x%x rkey 0x%x%s%s\n", addr, length, access,
                mr ? "cached" : "failed", mr ? mr->lkey : 0, mr ? mr->rkey : 0, mr ? "" : ": ",
                mr ? "" : drc_strerror(-e));
        errno = e;
    }
    return mr;
}

/*
 * The common case in a few instructions, handed straight to drc_reg_mr; every other to reg_slow.
 * (Access bits drc cannot cache: drc_reg_mr registers them as asked, through forward_ops, as
 * reg_slow would; counted as passed through either way.)
 */
static inline struct ibv_mr *reg(struct ibv_pd *pd, void *addr, size_t length, uint64_t iova, unsigned access)
{
    if (__atomic_load_n(&fast, __ATOMIC_ACQUIRE) && pd && iova == (uintptr_t)addr)
        return drc_reg_mr(pd, addr, length, (int)access);
    return reg_slow(pd, addr, length, iova, access);
}

EXPORT struct ibv_mr *ibv_reg_mr_iova2(struct ibv_pd *pd, void *addr, size_t length, uint64_t iova,
                                       unsigned int access)
{
    return reg(pd, addr, length, iova, access);
}

#undef ibv_reg_mr_iova
EXPORT struct ibv_mr *ibv_reg_mr_iova(struct ibv_pd *pd, void *addr, size_t length, uint64_t iova, int access)
{
    return reg(pd, addr, length, iova, (unsigned)access);
}

/* The exported ibv_reg_mr (verbs.h's macro calls it for constant flags). */
#undef ibv_reg_mr
EXPORT struct ibv_mr *ibv_reg_mr(struct ibv_pd *pd, void *addr, size_t length, int access)
{
    return reg(pd, addr, length, (uintptr_t)addr, (unsigned)access);
}

static __attribute__((noinline)) int dereg_slow(struct ibv_mr *mr)
{
    int err;

    ensure_init();
    err = enabled ? drc__regmr_dereg(mr) : -ENOENT;
    if (err != -ENOENT) {
        if (log_level >= DRC__LOG_DEBUG)
            fprintf(stderr, "drc: dereg_mr %p: %s\n", (void *)mr, err ? drc_strerror(err) : "released");
        return err < 0 ? -err : err;    /* verbs returns a positive errno */
    }
    return fwd_dereg_mr(mr);
}

EXPORT int ibv_dereg_mr(struct ibv_mr *mr)
{
    if (__atomic_load_n(&fast, __ATOMIC_ACQUIRE))
        return drc__regmr_dereg_verbs(mr);   /* forwards another's MR through forward_ops: fwd_dereg_mr */
    return dereg_slow(mr);
}

EXPORT int ibv_dealloc_pd(struct ibv_pd *pd)
{
    int err;

    ensure_init();
    if (enabled) {
        err = drc_pd_release(pd);
        if (err && log_level >= DRC__LOG_ERROR)
            fprintf(stderr, "drc: dealloc_pd %p: %s\n", (void *)pd, drc_strerror(err));
    }
    return fwd_dealloc_pd(pd);
}

EXPORT int ibv_rereg_mr(struct ibv_mr *mr, int flags, struct ibv_pd *pd, void *addr, size_t length, int access)
{
    ensure_init();
    if (enabled && drc__regmr_owns(mr)) {
        /* A shared cached MR cannot change under its other holders; the provider would take ours for its own. */
        if (log_level >= DRC__LOG_DEBUG)
            fprintf(stderr, "drc: rereg_mr %p: refused (an MR of drc: deregister it and register again)\n",
                    (void *)mr);
        errno = EINVAL;
        return IBV_REREG_MR_ERR_INPUT;
    }
    return fwd_rereg_mr(mr, flags, pd, addr, length, access);
}

/* ---- the seam with the preload's dlsym interposer ------------------------- */

static const struct {
    const char *name, *version;     /* the version this definition implements (rdma-core's default) */
    void *fn;
} served[] = {
    { "ibv_reg_mr", "IBVERBS_1.1", (void *)ibv_reg_mr },
    { "ibv_reg_mr_iova", "IBVERBS_1.7", (void *)ibv_reg_mr_iova },
    { "ibv_reg_mr_iova2", "IBVERBS_1.8", (void *)ibv_reg_mr_iova2 },
    { "ibv_dereg_mr", "IBVERBS_1.1", (void *)ibv_dereg_mr },
    { "ibv_dealloc_pd", "IBVERBS_1.1", (void *)ibv_dealloc_pd },
    { "ibv_rereg_mr", "IBVERBS_1.1", (void *)ibv_rereg_mr },
};

static int is_ours(const void *p)
{
    size_t i;

    for (i = 0; i < sizeof(served) / sizeof(served[0]); i++)
        if (served[i].fn == p)
            return 1;
    return 0;
}

void *drc__preload_verbs_symbol(const char *name, const char *version)
{
    size_t i;

    if (!name || strncmp(name, "ibv_", 4) || !drc__preload_verbs_enabled())
        return NULL;
    for (i = 0; i < sizeof(served) / sizeof(served[0]); i++)
        if (!strcmp(name, served[i].name))
            /* another version (IBVERBS_1.0's ibv_reg_mr/ibv_dereg_mr) has another ABI: not ours to serve */
            return !version || !strcmp(version, served[i].version) ? served[i].fn : NULL;
    return NULL;
}

int drc__preload_verbs_enabled(void)
{
    ensure_init();
    return enabled;
}
