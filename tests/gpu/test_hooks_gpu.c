/*
 * The exact hazard of issue 4, on a real GPU: register GPU memory, free it,
 * allocate the same size again (the driver hands back the same VA, measured),
 * and look it up: drc must register the new memory, not return the region of
 * the old one. And the old memory must really be released: the backend here
 * holds a dup of the dmabuf fd per region, as an MR holds the buffer, so a
 * missed invalidation keeps the freed memory allocated (cuMemGetInfo shows it).
 *
 * No RDMA NIC there: the backend is the GPU programs' recording double
 * (recbackend.h), made to keep each dmabuf (rec_cache_hold).
 *
 * Usage: test_hooks_gpu MODE
 *   wrappers  frees through drc_cuMemFree / drc_cudaFree (no hook library)
 *   hooked    plain cuMemFree / cudaFree / cudaFreeAsync: run it under
 *             LD_PRELOAD=libdrc_hook.so (optionally DRC_MONITOR=cupti)
 *   control   plain frees with no hook at all: the stale region and the held
 *             memory must show (proves the checks above can fail)
 *   cost      time what a free pays with a cache present and nothing
 *             registered near it (run with and without the hook library)
 * wrappers, hooked and control also run the cases of issue 9 (each prints
 * "caught" or, for the control, "stale"):
 *   - a free from a thread with no current context, a region at +32 MiB
 *     (item 1); and drc_cudaFree from such a thread returns 0 and frees
 *     under a static runtime (item 8)
 *   - pinned host memory: cudaFreeHost + cudaMallocHost of the same size (item 3)
 *   - context teardown: cuDevicePrimaryCtxReset, then cudaDeviceReset (item 2)
 * Built twice by the Makefile: with nvcc's default static cudart and with
 * -cudart shared.
 */
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "drc.h"
#include "drc_cuda.h"
#include "gpu.h"
#include "recbackend.h"

static struct rec rec;     /* the recording backend, holding each dmabuf fd (rec_cache_hold) */

enum how { DRV, RT, RT_ASYNC, DRV_WRAP, RT_WRAP };
static const char *const how_name[] = { "cuMemAlloc/cuMemFree", "cudaMalloc/cudaFree",
                                        "cudaMallocAsync/cudaFreeAsync", "cuMemAlloc/drc_cuMemFree",
                                        "cudaMalloc/drc_cudaFree" };

static void *alloc(enum how h, size_t size)
{
    CUdeviceptr d = 0;
    void *p = NULL;

    if (h == DRV || h == DRV_WRAP) {
        CU(cuMemAlloc(&d, size));
        return (void *)(uintptr_t)d;
    }
    if (h == RT_ASYNC) {
        if (cudaMallocAsync(&p, size, 0) != cudaSuccess || cudaStreamSynchronize(0) != cudaSuccess)
            return NULL;
        return p;
    }
    return cudaMalloc(&p, size) == cudaSuccess ? p : NULL;
}

static int dofree(enum how h, void *p)
{
    switch (h) {
    case DRV:
        return cuMemFree((CUdeviceptr)(uintptr_t)p);
    case RT:
        return cudaFree(p);
    case RT_ASYNC: {
        int e = cudaFreeAsync(p, 0);

        /* release the pool's memory to the driver so that cuMemGetInfo can see it */
        cudaStreamSynchronize(0);
        return e;
    }
    case DRV_WRAP:
        return drc_cuMemFree((unsigned long long)(uintptr_t)p);
    case RT_WRAP:
        return drc_cudaFree(p);
    }
    return -1;
}

static size_t free_mem(void)
{
    size_t f = 0, t = 0;

    CU(cuMemGetInfo(&f, &t));
    return f;
}

/* One round of the hazard. @expect_caught: 1 with a hook/wrapper, 0 for the control. */
static void hazard(drc_cache_t *c, enum how h, int expect_caught)
{
    const size_t size = 256u << 20, mib = 1u << 20;
    struct drc_stats s0 = { .comp_mask = DRC_STATS_ALL }, s1 = { .comp_mask = DRC_STATS_ALL };
    drc_region_t *r1, *r2;
    size_t before, after;
    uintptr_t id1, id2;
    void *p, *q;

    printf("%s (%s)\n", how_name[h], expect_caught ? "caught" : "control, no hook");
    before = free_mem();
    p = alloc(h, size);
    CHECK(p != NULL, "allocation failed");
    if (!p)
        return;
    CHECK(drc_get(c, p, size, 1, &r1) == 0, "register");
    id1 = (uintptr_t)rec_id(r1);
    CHECK(rec_fd(r1) >= 0, "the region was exported as a dmabuf");
    drc_put(c, r1);     /* idle in the cache, its dmabuf held like an MR would */
    drc_cache_stats(c, &s0);
    CHECK(dofree(h, p) == 0, "free");
    /* async pools keep freed memory: trim so that the driver really gets it back */
    if (h == RT_ASYNC) {
        cudaMemPool_t pool;

        if (cudaDeviceGetDefaultMemPool(&pool, 0) == cudaSuccess)
            cudaMemPoolTrimTo(pool, 0);
    }
    after = free_mem();
    printf("  cuMemGetInfo free: before alloc %zu MiB, after free %zu MiB (%s)\n", before / mib, after / mib,
           after + size / 2 < before ? "the freed 256 MiB is still held" : "released");
    q = alloc(h, size);
    CHECK(q != NULL, "second allocation failed");
    if (!q)
        return;
    printf("  same size again: %s VA\n", q == p ? "same" : "different");
    CHECK(drc_get(c, q, size, 1, &r2) == 0, "lookup after realloc");
    id2 = (uintptr_t)rec_id(r2);
    drc_cache_stats(c, &s1);
    if (expect_caught) {
        CHECK(id2 != id1, "the region of the freed memory was returned (handle %lu)", (unsigned long)id1);
        CHECK(s1.misses == s0.misses + 1, "the lookup after realloc registered anew");
        CHECK(after + size / 2 >= before, "freed memory still allocated: %zu MiB of %zu", (before - after) / mib,
              size / mib);
    } else {
        printf("  control: stale region returned: %s; freed memory held: %s\n", id2 == id1 ? "yes" : "no",
               after + size / 2 < before ? "yes" : "no");
        CHECK(q != p || id2 == id1, "without a hook the same VA must hit the old region (the hazard)");
        CHECK(after + size / 2 < before, "without a hook the dmabuf must keep the freed memory");
    }
    drc_put(c, r2);
    drc_invalidate(c, p, size);     /* the control's stale region and its held memory go here */
    drc_invalidate(c, q, size);
    CHECK(dofree(h, q) == 0, "free of the second allocation");
    if (!expect_caught)
        CHECK(free_mem() + size / 2 >= before, "after drc_invalidate the held memory is back");
}

/* What a free costs with drc present and nothing registered near it: run with and without the hook. */
static void cost(drc_cache_t *c)
{
    enum { PAIRS = 2000, LOOKUPS = 200000 };
    const size_t size = 2u << 20;
    CUdeviceptr d, base;
    drc_region_t *r;
    size_t len;
    double t0, t1;
    void *far;
    int i;

    /* one region far from the allocations, so that a cache exists and is not empty */
    far = alloc(DRV, size);
    CHECK(drc_get(c, far, 4096, 1, &r) == 0, "register");
    drc_put(c, r);
    CU(cuMemAlloc(&d, size));
    t0 = gpu_now_ns();
    for (i = 0; i < LOOKUPS; i++)
        cuMemGetAddressRange(&base, &len, d + 4096);
    t1 = gpu_now_ns();
    printf("  cuMemGetAddressRange (the bounds lookup a hooked free adds): %.1f ns\n", (t1 - t0) / LOOKUPS);
    CU(cuMemFree(d));
    t0 = gpu_now_ns();
    for (i = 0; i < PAIRS; i++) {
        CU(cuMemAlloc(&d, size));
        CU(cuMemFree(d));
    }
    t1 = gpu_now_ns();
    printf("  cuMemAlloc + cuMemFree of 2 MiB, nothing registered there: %.0f ns per pair (%s)\n",
           (t1 - t0) / PAIRS, getenv("LD_PRELOAD") ? "hook preloaded" : "no hook");
    drc_invalidate(c, far, size);
    cuMemFree((CUdeviceptr)(uintptr_t)far);
}

/* ---- issue 9 ------------------------------------------------------------------ */

static struct {
    int wrap;                   /* 1: free through drc's wrappers, 0: the plain call */
    void *p;
    int rc;
    CUcontext ctx_in_thread;
} th;

static void *free_in_bare_thread(void *arg)
{
    (void)arg;
    cuCtxGetCurrent(&th.ctx_in_thread);     /* none: this thread never used CUDA */
    th.rc = th.wrap ? drc_cuMemFree((unsigned long long)(uintptr_t)th.p) : cuMemFree((CUdeviceptr)(uintptr_t)th.p);
    return NULL;
}

static void *rt_free_in_bare_thread(void *arg)
{
    (void)arg;
    th.rc = drc_cudaFree(th.p);
    return NULL;
}

/* Register [p, p+len); the backend id of the region (left idle). */
static uintptr_t reg_id(drc_cache_t *c, void *p, size_t len)
{
    drc_region_t *r;
    uintptr_t id;

    if (drc_get(c, p, len, 1, &r))
        return 0;
    id = (uintptr_t)rec_id(r);
    drc_put(c, r);
    return id;
}

/* After the memory at @p went and @q came (same size): is the region at @off a new one? */
static void verdict(drc_cache_t *c, const char *what, void *p, void *q, size_t off, uintptr_t old_id, int expect)
{
    uintptr_t id = reg_id(c, (char *)q + off, 4u << 20);

    printf("  %s: same VA %s, %s\n", what, p == q ? "yes" : "no", id != old_id ? "caught" : "stale");
    if (expect)
        CHECK(id && id != old_id, "%s: the region of the freed memory was returned", what);
    drc_invalidate(c, p, 1);    /* the control's stale region goes here */
}

/* Item 1 (and 8): frees from a thread that has no current context. */
static void bare_thread_free(drc_cache_t *c, int wrap, int expect)
{
    const size_t size = 256u << 20, off = 32u << 20;
    pthread_t t;
    uintptr_t id;
    void *p = alloc(DRV, size), *q;

    printf("free from a thread with no context (%s), region at +32 MiB\n", wrap ? "drc_cuMemFree" : "cuMemFree");
    id = reg_id(c, (char *)p + off, 4u << 20);
    CHECK(id != 0, "register");
    th.wrap = wrap;
    th.p = p;
    pthread_create(&t, NULL, free_in_bare_thread, NULL);
    pthread_join(t, NULL);
    CHECK(th.rc == 0 && th.ctx_in_thread == NULL, "free in the bare thread: %d (context %p)", th.rc,
          (void *)th.ctx_in_thread);
    q = alloc(DRV, size);
    verdict(c, "free without a context", p, q, off, id, expect);
    CU(cuMemFree((CUdeviceptr)(uintptr_t)q));
    if (!wrap)
        return;
    /* item 8: drc_cudaFree there (a static runtime: done through the driver) returns 0 and frees */
    CHECK(cudaMalloc(&p, size) == cudaSuccess, "cudaMalloc");
    th.p = p;
    pthread_create(&t, NULL, rt_free_in_bare_thread, NULL);
    pthread_join(t, NULL);
    printf("  drc_cudaFree from a thread that never used the runtime: %d\n", th.rc);
    CHECK(th.rc == 0, "drc_cudaFree in a bare thread returned %d", th.rc);
    CHECK(cudaMalloc(&q, size) == cudaSuccess && q == p, "the memory was not freed (next VA %p, was %p)", q, p);
    cudaFree(q);
}

/* Item 3: pinned host memory freed and allocated again at the same VA. */
static void pinned_host(drc_cache_t *c, int wrap, int expect)
{
    const size_t size = 64u << 20;
    uintptr_t id;
    void *p = NULL, *q = NULL;

    printf("pinned host memory (%s)\n", wrap ? "drc_cudaFreeHost" : "cudaFreeHost");
    CHECK(cudaMallocHost(&p, size) == cudaSuccess, "cudaMallocHost");
    id = reg_id(c, (char *)p + (8u << 20), 4u << 20);
    CHECK(id != 0, "register");
    CHECK((wrap ? drc_cudaFreeHost(p) : cudaFreeHost(p)) == cudaSuccess, "cudaFreeHost");
    CHECK(cudaMallocHost(&q, size) == cudaSuccess, "cudaMallocHost again");
    verdict(c, "cudaFreeHost", p, q, 8u << 20, id, expect);
    cudaFreeHost(q);
}

/* Item 2: a context teardown frees without a free call. @how: 0 cuDevicePrimaryCtxReset, 1 cudaDeviceReset. */
static void teardown(drc_cache_t *c, int how, int wrap, int expect)
{
    const size_t size = 256u << 20;
    const char *what = how ? "cudaDeviceReset" : "cuDevicePrimaryCtxReset";
    uintptr_t id;
    void *p = NULL, *q = NULL;
    int rc;

    printf("context teardown: %s%s\n", wrap ? "drc_" : "", what);
    CHECK(cudaMalloc(&p, size) == cudaSuccess, "cudaMalloc");
    id = reg_id(c, p, 4u << 20);
    CHECK(id != 0, "register");
    if (how)
        rc = wrap ? drc_cudaDeviceReset() : cudaDeviceReset();
    else
        rc = wrap ? drc_cuDevicePrimaryCtxReset(0) : cuDevicePrimaryCtxReset(0);
    CHECK(rc == 0, "%s: %d", what, rc);
    cudaSetDevice(0);
    cudaFree(0);        /* a new primary context */
    CHECK(cudaMalloc(&q, size) == cudaSuccess, "cudaMalloc after the reset");
    verdict(c, what, p, q, 0, id, expect);
    cudaFree(q);
}

static void issue9(drc_cache_t *c, int wrap, int expect)
{
    bare_thread_free(c, wrap, expect);
    pinned_host(c, wrap, expect);
    teardown(c, 0, wrap, expect);
    teardown(c, 1, wrap, expect);
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "wrappers";
    drc_cache_t *c;
    int rt_ver = 0;

    CHECK(cudaSetDevice(0) == cudaSuccess, "cudaSetDevice");
    cudaFree(0);    /* creates the primary context */
    cudaRuntimeGetVersion(&rt_ver);
    printf("mode %s, runtime %d, LD_PRELOAD=%s, DRC_MONITOR=%s\n", mode, rt_ver,
           getenv("LD_PRELOAD") ? getenv("LD_PRELOAD") : "", getenv("DRC_MONITOR") ? getenv("DRC_MONITOR") : "");
    c = rec_cache_hold(&rec, 0);
    if (!strcmp(mode, "wrappers")) {
        hazard(c, DRV_WRAP, 1);
        hazard(c, RT_WRAP, 1);
        issue9(c, 1, 1);
    } else if (!strcmp(mode, "hooked")) {
        hazard(c, DRV, 1);
        hazard(c, RT, 1);
        hazard(c, RT_ASYNC, 1);
        issue9(c, 0, 1);
    } else if (!strcmp(mode, "cost")) {
        cost(c);
    } else {
        hazard(c, DRV, 0);
        hazard(c, RT, 0);
        issue9(c, 0, 0);
    }
    CHECK(rec.exported > 0, "nothing was exported: no dmabuf on this machine?");
    rec_done(c);
    CHECK(rec.calls == rec.deregs, "regs %d, deregs %d", rec.calls, rec.deregs);
    return gpu_summary(mode);
}
