/*
 * The two caches of the cache benchmarks behind one interface, and their clock (bench_cache.c,
 * bench_misses.c): drc and UCX's ucs_rcache, each in front of a backend that
 * does no work but count its calls, UCX with its memory event declared
 * external (bench_cache.c's top comment says why).
 *
 * UCX's rcache API changed after 1.13 (ucs_rcache_get took an alignment, the
 * params lost theirs, ucs_rcache_region_invalidate takes a completion entry,
 * the ops gained merge). The Makefile probes the headers it compiles against
 * (tests/bench/ucx_api.sh) and says which API they have with BENCH_UCX_*;
 * none set is 1.13's.
 */
#ifndef DRC_BENCH_PAIR_H
#define DRC_BENCH_PAIR_H

#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <ucm/api/ucm.h>
#include <ucs/memory/rcache.h>
#if __has_include(<ucp/api/ucp_version.h>)
#include <ucp/api/ucp_version.h>    /* the UCX release of the headers, for the column's name */
#endif

#include "drc.h"

#ifndef BENCH_UCX_GET_ALIGN
#define BENCH_UCX_GET_ALIGN 0   /* ucs_rcache_get(rc, addr, len, alignment, prot, arg, &r) */
#endif
#ifndef BENCH_UCX_INV_COMP
#define BENCH_UCX_INV_COMP 0    /* ucs_rcache_region_invalidate(rc, r, ucs_rcache_comp_entry_t *) */
#endif
#ifndef BENCH_UCX_MERGE_OP
#define BENCH_UCX_MERGE_OP 0    /* ucs_rcache_ops_t has merge */
#endif

/* the benchmarks' clock */
static uint64_t now_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static uint64_t regs, deregs;       /* backend calls of whichever cache this process runs */

/*
 * What a registration costs the thread that makes it, in ns: 0, a backend
 * that does no work, unless a row sets it (bench_cache's "hit while a
 * thread registers"). Spent spinning, as a thread in ibv_reg_mr spends it
 * in the kernel, not asleep.
 */
static uint64_t reg_ns;

static void reg_work(void)
{
    uint64_t ns = __atomic_load_n(&reg_ns, __ATOMIC_RELAXED), t0;

    if (ns)
        for (t0 = now_ns(); now_ns() - t0 < ns;)
            ;
}

static int drc_reg(void *ctx, const struct drc_reg_args *a, void **handle, uint32_t *lkey, uint32_t *rkey)
{
    (void)ctx;
    reg_work();
    __atomic_fetch_add(&regs, 1, __ATOMIC_RELAXED);
    *handle = (void *)a->start;
    *lkey = *rkey = 1;
    return 0;
}

static int drc_dereg(void *ctx, void *handle)
{
    (void)ctx;
    (void)handle;
    __atomic_fetch_add(&deregs, 1, __ATOMIC_RELAXED);
    return 0;
}

static ucs_status_t ucx_reg(void *ctx, ucs_rcache_t *rc, void *arg, ucs_rcache_region_t *r, uint16_t flags)
{
    (void)ctx; (void)rc; (void)arg; (void)r; (void)flags;
    reg_work();
    __atomic_fetch_add(&regs, 1, __ATOMIC_RELAXED);
    return UCS_OK;
}

static void ucx_dereg(void *ctx, ucs_rcache_t *rc, ucs_rcache_region_t *r)
{
    (void)ctx; (void)rc; (void)r;
    __atomic_fetch_add(&deregs, 1, __ATOMIC_RELAXED);
}

static void ucx_dump(void *ctx, ucs_rcache_t *rc, ucs_rcache_region_t *r, char *buf, size_t max)
{
    (void)ctx; (void)rc; (void)r;
    if (max)
        buf[0] = '\0';
}

#if BENCH_UCX_MERGE_OP
static void ucx_merge(void *ctx, ucs_rcache_t *rc, void *arg, ucs_rcache_region_t *r)
{
    (void)ctx; (void)rc; (void)arg; (void)r;
}
#endif

static const ucs_rcache_ops_t ucx_ops = {
    .mem_reg = ucx_reg, .mem_dereg = ucx_dereg, .dump_region = ucx_dump,
#if BENCH_UCX_MERGE_OP
    .merge = ucx_merge,
#endif
};

static void ucx_inv_done(void *arg)
{
    (void)arg;
}

/* Invalidate a region the caller holds, by handle (it is deregistered on the last put). */
static inline void ucx_region_invalidate(ucs_rcache_t *rc, ucs_rcache_region_t *r)
{
#if BENCH_UCX_INV_COMP
    /*
     * The caller's entry (its type is public in that API): one thread invalidates at a time in the
     * benchmarks, and the region's completion runs at its last put, before the next invalidation.
     * Only compiled so far, against no such UCX: check it the first time a column uses it.
     */
    static ucs_rcache_comp_entry_t comp = { .func = ucx_inv_done };

    ucs_rcache_region_invalidate(rc, r, &comp);
#else
    ucs_rcache_region_invalidate(rc, r, ucx_inv_done, NULL);
#endif
}

/* The UCX release of the headers this was built with ("UCX 1.13"), or BENCH_UCX_NAME. */
static inline const char *ucx_name(void)
{
#if defined(BENCH_UCX_NAME)
    return BENCH_UCX_NAME;
#elif defined(UCP_API_MAJOR) && defined(UCP_API_MINOR)
#define BENCH_STR_(x) #x
#define BENCH_STR(x) BENCH_STR_(x)
    return "UCX " BENCH_STR(UCP_API_MAJOR) "." BENCH_STR(UCP_API_MINOR);
#else
    return "UCX";
#endif
}

/*
 * Address space for @size bytes of regions, reserved (PROT_NONE, MAP_NORESERVE: the caches never
 * touch it) and 2 MiB-aligned, so that every 64 KiB region at a 128 KiB stride is 64 KiB-aligned
 * wherever the kernel, or valgrind, places the mapping. UCX's page table stores an unaligned
 * region as several power-of-two entries (a 64 KiB region at a 4 KiB boundary: up to 16 of
 * them), and valgrind's mappings are only page-aligned where the kernel's large ones often are
 * not: an unaligned run measures a UCX that aligned runs do not.
 */
static inline char *reserve(size_t size)
{
    size_t a = 2 << 20;
    char *p = mmap(NULL, size + a, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    char *q;

    if (p == MAP_FAILED)
        return NULL;
    q = (char *)(((uintptr_t)p + a - 1) & ~(uintptr_t)(a - 1));
    if (q > p)
        munmap(p, (size_t)(q - p));
    munmap(q + size, (size_t)(p + a - q));
    return q;
}

#define UCX_PROT   (PROT_READ | PROT_WRITE)
#define DRC_ACCESS 0x7u     /* LOCAL_WRITE | REMOTE_WRITE | REMOTE_READ */

struct cache {
    int ucx;
    drc_cache_t *d;
    ucs_rcache_t *u;
};

static struct cache cache_new(int ucx)
{
    static const struct drc_backend be = { .reg = drc_reg, .dereg = drc_dereg, .ctx = NULL };
    struct cache c = { .ucx = ucx };
    ucs_rcache_params_t p;
    ucs_status_t st;
    int err;

    if (!ucx) {
        err = drc_cache_create(&be, NULL, &c.d);
        if (err) {
            fprintf(stderr, "drc_cache_create: %s\n", drc_strerror(err));
            exit(2);
        }
        return c;
    }
    memset(&p, 0, sizeof(p));
    p.region_struct_size = sizeof(ucs_rcache_region_t);
#if !BENCH_UCX_GET_ALIGN
    p.alignment = (size_t)sysconf(_SC_PAGESIZE);
    p.max_alignment = p.alignment;
#endif
    p.ucm_events = UCM_EVENT_VM_UNMAPPED;   /* its memory event, external: see the top comment */
    p.ucm_event_priority = 1000;
    p.ops = &ucx_ops;
    p.max_regions = ULONG_MAX;
    p.max_size = SIZE_MAX;
    p.max_unreleased = SIZE_MAX;
    st = ucs_rcache_create(&p, "bench", NULL, &c.u);
    if (st != UCS_OK) {
        fprintf(stderr, "ucs_rcache_create: %s\n", ucs_status_string(st));
        exit(2);
    }
    return c;
}


static inline void *cache_get(struct cache *c, void *a, size_t len)
{
    drc_region_t *r;
    ucs_rcache_region_t *u;

    if (c->ucx)
#if BENCH_UCX_GET_ALIGN
        return ucs_rcache_get(c->u, a, len, 4096, UCX_PROT, NULL, &u) == UCS_OK ? (void *)u : NULL;
#else
        return ucs_rcache_get(c->u, a, len, UCX_PROT, NULL, &u) == UCS_OK ? (void *)u : NULL;
#endif
    return drc_get(c->d, a, len, DRC_ACCESS, &r) == 0 ? (void *)r : NULL;
}

static inline void cache_put(struct cache *c, void *r)
{
    if (c->ucx)
        ucs_rcache_region_put(c->u, r);
    else
        drc_put(c->d, r);
}


#endif
