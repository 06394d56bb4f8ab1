/*
 * What a free pays for drc: drc_notify_free() and the free wrapper's
 * bracket (drc__notify_begin/end, what drc_cuMemFree and libdrc_hook.so
 * add to every free) when nothing is registered at the freed range.
 * Rows: no cache; one empty cache; 10,000 regions registered elsewhere
 * (outside the cache's hull, and inside it, in a gap between regions).
 * The backend registers nothing (a counting double), so only drc is timed.
 */
#include <stdio.h>
#include <time.h>
#include <unistd.h>

#include "drc.h"
#include "drc_cuda.h"
#include "cuda/cuda.h"
#include "core/notify.h"

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

static int fake_range(drc__cuptr *b, size_t *s, drc__cuptr d)
{
    *b = d;
    *s = 1 << 16;
    return 0;
}

static int fake_free(drc__cuptr d)
{
    (void)d;
    return 0;
}

int main(void)
{
    struct drc_backend be = { .reg = reg, .dereg = dereg, .ctx = NULL };
    struct drc__cuda_driver drv = { .cuMemGetAddressRange = fake_range, .cuMemFree = fake_free };
    const uintptr_t base = 0x10000000000ull, far = 0x30000000000ull;
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    drc_region_t *r;
    drc_cache_t *c;
    double t0;
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
    drc__cuda_set_driver(&drv);
    t0 = now();
    for (i = 0; i < ITERS; i++)
        drc_cuMemFree(far + (uintptr_t)(i & 7) * (1 << 16));
    printf("%-58s %6.1f ns per free (fake driver: lookup and free cost ~0)\n",
           "drc_cuMemFree, 10,000 regions elsewhere", (now() - t0) / ITERS);
    drc__cuda_set_driver(NULL);
    return drc_cache_destroy(c) != 0;
}
