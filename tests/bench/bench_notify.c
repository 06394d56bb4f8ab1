/*
 * What a free pays for drc: drc_notify_free() and the free wrapper's
 * bracket (drc__notify_begin/end, what drc_cuMemFree and libdrc_hook.so
 * add to every free) when nothing is registered at the freed range.
 * Rows: no cache; one empty cache; 10,000 regions registered elsewhere
 * (outside the cache's hull, and inside it, in a gap between regions).
 * The backend registers nothing (a counting double), so only drc is timed.
 * The last row frees through the wrapper drc_cuMemFree, over THE CUDA double
 * (tests/doubles/fake_libcuda.c, linked as libcuda.so.1 here and in the GPU
 * build, tests/gpu/hooks.mk: the row times drc, not a driver): the double's
 * own lookup and free are timed alone too, and drc's share is the difference.
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "drc.h"
#include "drc_cuda.h"
#include "core/notify.h"
#include "../fake_cuda.h"

enum { REGIONS = 10000, ITERS = 2000000 };

static int reg(void *ctx, const struct drc_reg_args *a, void **h, uint32_t *lk, uint32_t *rk)
{
    static uintptr_t n;

    (void)ctx;
    (void)a;
    *h = (void *)++n;
    *lk = *rk = 1;
    return 0;
}

static int dereg(void *ctx, void *h)
{
    (void)ctx;
    (void)h;
    return 0;
}

static double now(void)
{
    struct timespec t;

    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

static volatile int sink;

static void row(const char *what, uintptr_t at)
{
    size_t len = 1 << 16;
    double t0, t1, t2;
    int i, k;

    t0 = now();
    for (i = 0; i < ITERS; i++)
        sink += drc_notify_free((const void *)(at + (uintptr_t)(i & 7) * len), len);
    t1 = now();
    for (i = 0; i < ITERS; i++) {
        k = drc__notify_begin((const void *)(at + (uintptr_t)(i & 7) * len), len);
        drc__notify_end(k);
    }
    t2 = now();
    printf("%-58s notify %6.1f ns   begin+end %6.1f ns\n", what, (t1 - t0) / ITERS, (t2 - t1) / ITERS);
}

/*
 * The double's allocation of 64 KiB at the made-up address @p (never touched), added before
 * each free takes it away: eight of them, in turn, as the rows above free eight ranges.
 */
static void add(uintptr_t p)
{
    static uint64_t id;

    if (!fc_add(p, 1 << 16, 0, ++id))
        abort();
}

int main(void)
{
    struct drc_backend be = { .reg = reg, .dereg = dereg, .ctx = NULL };
    const uintptr_t base = 0x10000000000ull, far = 0x30000000000ull;
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    drc_region_t *r;
    drc_cache_t *c;
    double t0, alone;
    int i;

    printf("bench_notify: the cost a free pays with drc loaded, nothing registered at the freed range\n");
    row("no cache in the process", far);
    if (drc_cache_create(&be, NULL, &c))
        return 1;
    row("one cache, nothing registered", far);
    /* 10,000 one-page regions, one page apart: a 20,000-page hull with gaps */
    for (i = 0; i < REGIONS; i++) {
        if (drc_get(c, (const void *)(base + (uintptr_t)i * 2 * pg), pg, 1, &r) || drc_put(c, r))
            return 1;
    }
    row("10,000 regions registered elsewhere (outside the hull)", far);
    /* inside the hull: a free of a gap page between two regions (the lock and a tree walk) */
    {
        double a, b;

        a = now();
        for (i = 0; i < ITERS / 10; i++)
            sink += drc_notify_free((const void *)(base + (uintptr_t)(2 * (i % REGIONS) + 1) * pg), pg);
        b = now();
        printf("%-58s notify %6.1f ns\n", "10,000 regions, freed page in a gap inside the hull", (b - a) / (ITERS / 10));
    }
    fc_reset();
    /* the double alone: what drc_cuMemFree asks it (the bounds, then the free), and the re-add */
    t0 = now();
    for (i = 0; i < ITERS; i++) {
        uintptr_t p = far + (uintptr_t)(i & 7) * (1 << 16);
        unsigned long long b;
        size_t s;

        add(p);
        if (cuMemGetAddressRange_v2(&b, &s, p) || cuMemFree_v2(p))
            return 1;
    }
    alone = (now() - t0) / ITERS;
    t0 = now();
    for (i = 0; i < ITERS; i++) {
        uintptr_t p = far + (uintptr_t)(i & 7) * (1 << 16);

        add(p);
        if (drc_cuMemFree(p))
            return 1;
    }
    t0 = (now() - t0) / ITERS;
    printf("%-58s %6.1f ns per free (the CUDA double alone %.1f ns: drc %.1f ns)\n",
           "drc_cuMemFree, 10,000 regions elsewhere", t0, alone, t0 - alone);
    drc__cuda_set_driver(NULL);
    return drc_cache_destroy(c) != 0;
}
