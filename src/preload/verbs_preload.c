/*
 * build/libdrc_verbs.so: put drc in front of a transfer engine that calls
 * ibv_reg_mr on GPU memory, with no change to the engine:
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
 * Nothing here ever forwards to the next ibv_reg_mr (it would come back
 * here): everything forwards to the next ibv_reg_mr_iova2.
 *
 * A registration is served from the PD's drc cache (drc_reg_mr) when drc can
 * serve it: iova equal to the address, access bits within DRC_ACCESS_MASK,
 * and, under DRC_VERBS_HOST=passthrough, GPU memory only. Anything else goes
 * to the next ibv_reg_mr_iova2 as asked. ibv_dereg_mr releases a caller MR
 * of drc (drc_dereg_mr) and hands every other MR to the next ibv_dereg_mr.
 * ibv_dealloc_pd drops the PD's cache first (its idle cached MRs would keep
 * the real call failing with EBUSY). ibv_reg_dmabuf_mr is not touched.
 *
 * drc's own registrations (the verbs backend calls ibv_reg_mr_iova2 and
 * ibv_dereg_mr, which resolve to the definitions here) are told apart by a
 * per-thread depth count set around every call into drc: they go straight
 * to the next definitions. A backend call always runs in the thread that
 * entered drc, except deregistrations that an invalidation makes from a free
 * hook in another thread; those find no caller MR and pass through too.
 *
 * The same library holds the host-memory hooks (hook_host.c: munmap, mremap,
 * madvise, brk, sbrk, shmdt) and the CUDA free hooks of libdrc_hook.so
 * (hook_preload.c), so this one preload is the whole setup; do not preload
 * libdrc_hook.so beside it.
 *
 * Environment, read once at load:
 *   DRC_POLICY       dmabuf_then_peermem (default) | dmabuf | peermem
 *   DRC_MAX_REGIONS  idle cached MRs kept per PD (default: no limit)
 *   DRC_VERBS_HOST   cache (default) | passthrough: host memory straight to ibv_reg_mr
 *   DRC_LOG          info: one summary line on stderr at exit; debug: also one line per call.
 *                    Unset: drc never writes anything.
 */
#include <dlfcn.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda.h"
#include "drc.h"
#include "drc_verbs.h"
#include "verbs/regmr.h"

#define EXPORT __attribute__((visibility("default")))

typedef struct ibv_mr *reg_iova2_fn(struct ibv_pd *, void *, size_t, uint64_t, unsigned);
typedef int dereg_fn(struct ibv_mr *);
typedef int dealloc_pd_fn(struct ibv_pd *);

enum { LOG_NONE = 0, LOG_INFO = 1, LOG_DEBUG = 2 };

static reg_iova2_fn *next_reg;      /* atomic, resolved in the constructor or on first use */
static dereg_fn *next_dereg;
static dealloc_pd_fn *next_dealloc_pd;
static int log_level;
static int host_passthrough;
static uint64_t n_passthrough;      /* atomic: registrations handed on untouched */

static __thread int depth __attribute__((tls_model("initial-exec")));

static void *next_sym(void *cache, const char *name, const char *version)
{
    void *p = __atomic_load_n((void **)cache, __ATOMIC_ACQUIRE);

    if (!p) {
        p = dlvsym(RTLD_NEXT, name, version);
        if (!p)
            p = dlsym(RTLD_NEXT, name);
        __atomic_store_n((void **)cache, p, __ATOMIC_RELEASE);
    }
    return p;
}

static reg_iova2_fn *get_next_reg(void)
{
    return (reg_iova2_fn *)next_sym(&next_reg, "ibv_reg_mr_iova2", "IBVERBS_1.8");
}

static dereg_fn *get_next_dereg(void)
{
    return (dereg_fn *)next_sym(&next_dereg, "ibv_dereg_mr", "IBVERBS_1.1");
}

static dealloc_pd_fn *get_next_dealloc_pd(void)
{
    return (dealloc_pd_fn *)next_sym(&next_dealloc_pd, "ibv_dealloc_pd", "IBVERBS_1.1");
}

static int parse_policy(const char *s, enum drc_policy *p)
{
    if (!strcmp(s, "dmabuf_then_peermem"))
        *p = DRC_DMABUF_THEN_PEERMEM;
    else if (!strcmp(s, "dmabuf") || !strcmp(s, "dmabuf_only"))
        *p = DRC_DMABUF_ONLY;
    else if (!strcmp(s, "peermem") || !strcmp(s, "peermem_only"))
        *p = DRC_PEERMEM_ONLY;
    else
        return -EINVAL;
    return 0;
}

__attribute__((constructor)) static void verbs_preload_init(void)
{
    struct drc_config cfg = { 0 };
    const char *s;
    char *end;

    s = getenv("DRC_LOG");
    if (s && *s)
        log_level = !strcmp(s, "debug") ? LOG_DEBUG : LOG_INFO;
    s = getenv("DRC_POLICY");
    if (s && *s && parse_policy(s, &cfg.policy) && log_level)
        fprintf(stderr, "drc: DRC_POLICY=%s unknown (dmabuf_then_peermem, dmabuf, peermem): using the default\n", s);
    s = getenv("DRC_MAX_REGIONS");
    if (s && *s) {
        unsigned long long v = strtoull(s, &end, 10);

        if (*end == 0)
            cfg.max_regions = (size_t)v;
        else if (log_level)
            fprintf(stderr, "drc: DRC_MAX_REGIONS=%s is not a number: no limit\n", s);
    }
    s = getenv("DRC_VERBS_HOST");
    host_passthrough = s && !strcmp(s, "passthrough");
    drc__regmr_configure(&cfg);
    get_next_reg();
    get_next_dereg();
    get_next_dealloc_pd();
}

__attribute__((destructor)) static void verbs_preload_fini(void)
{
    struct drc__regmr_totals t;

    if (!log_level)
        return;
    drc__regmr_totals(&t);
    fprintf(stderr,
            "drc: %llu PDs, %llu MRs handed out (%llu GPU, %llu host, %llu passed through), %llu still held; "
            "%llu registrations for them, %llu hits, %llu coalesced, %llu invalidated, %llu cached now; "
            "GPU via %s\n",
            (unsigned long long)t.pds, (unsigned long long)(t.mrs_gpu + t.mrs_host),
            (unsigned long long)t.mrs_gpu, (unsigned long long)t.mrs_host,
            (unsigned long long)(t.mrs_direct + __atomic_load_n(&n_passthrough, __ATOMIC_RELAXED)),
            (unsigned long long)t.live, (unsigned long long)t.cache.regs, (unsigned long long)t.cache.hits,
            (unsigned long long)t.cache.merges, (unsigned long long)t.cache.invalidated,
            (unsigned long long)t.cache.regions,
            !t.dmabuf && !t.peermem ? "-" : t.peermem ? (t.dmabuf ? "dmabuf and peermem" : "peermem") : "dmabuf");
}

/* Is @addr GPU memory? (cuMemGetAddressRange knows it; no driver: no.) */
static int is_gpu(const void *addr)
{
    uintptr_t base;
    size_t len;

    return drc__cuda_alloc_range((uintptr_t)addr, &base, &len) == 0;
}

static struct ibv_mr *reg(struct ibv_pd *pd, void *addr, size_t length, uint64_t iova, unsigned access)
{
    reg_iova2_fn *next = get_next_reg();
    struct ibv_mr *mr;
    int gpu = -1;

    if (depth || !pd || iova != (uintptr_t)addr || (access & ~DRC_ACCESS_MASK) ||
        (host_passthrough && !(gpu = is_gpu(addr)))) {
        if (!depth)
            __atomic_fetch_add(&n_passthrough, 1, __ATOMIC_RELAXED);
        if (!next) {
            errno = ENOSYS;
            return NULL;
        }
        mr = next(pd, addr, length, iova, access);
        if (log_level >= LOG_DEBUG && !depth)
            fprintf(stderr, "drc: reg_mr %p+%zu iova 0x%llx access 0x%x: passed through -> %p\n", addr, length,
                    (unsigned long long)iova, access, (void *)mr);
        return mr;
    }
    depth++;
    mr = drc_reg_mr(pd, addr, length, (int)access);
    depth--;
    if (log_level >= LOG_DEBUG) {
        int e = errno;

        fprintf(stderr, "drc: reg_mr %p+%zu access 0x%x: %s lkey 0x%x rkey 0x%x%s%s\n", addr, length, access,
                mr ? "cached" : "failed", mr ? mr->lkey : 0, mr ? mr->rkey : 0, mr ? "" : ": ",
                mr ? "" : drc_strerror(-e));
        errno = e;
    }
    return mr;
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

EXPORT int ibv_dereg_mr(struct ibv_mr *mr)
{
    dereg_fn *next = get_next_dereg();
    int err;

    if (!depth) {
        depth++;
        err = drc__regmr_dereg(mr);
        depth--;
        if (err != -ENOENT) {
            if (log_level >= LOG_DEBUG)
                fprintf(stderr, "drc: dereg_mr %p: %s\n", (void *)mr, err ? drc_strerror(err) : "released");
            return err < 0 ? -err : err;    /* verbs returns a positive errno */
        }
    }
    return next ? next(mr) : ENOSYS;
}

EXPORT int ibv_dealloc_pd(struct ibv_pd *pd)
{
    dealloc_pd_fn *next = get_next_dealloc_pd();
    int err;

    if (!depth) {
        depth++;
        err = drc_pd_release(pd);
        depth--;
        if (err && log_level)
            fprintf(stderr, "drc: dealloc_pd %p: %s\n", (void *)pd, drc_strerror(err));
    }
    return next ? next(pd) : ENOSYS;
}
