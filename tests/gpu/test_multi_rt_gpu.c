/*
 * Several GPUs through the runtime API (issue 13), in test_hooks_gpu.c's
 * style: built by nvcc (static cudart), run by hooks.sh. Needs two GPUs;
 * with fewer it says SKIP and exits 0.
 *
 *  - cudaSetDevice(1); cudaMalloc; cudaSetDevice(0); cudaFree: the region of
 *    device 1's memory (at +32 MiB) is invalidated, the current device stays
 *    0, and the same size again on device 1 is registered anew;
 *  - cudaSetDevice(1); cudaDeviceReset: device 1's region goes, device 0's
 *    (its memory alive) stays valid.
 *
 * Usage: test_multi_rt_gpu MODE
 *   wrappers  drc_cudaFree / drc_cudaDeviceReset
 *   hooked    plain cudaFree / cudaDeviceReset under LD_PRELOAD=libdrc_hook.so
 *   control   plain calls, no hook: the freed memory's region stays valid
 *             (the checks above can fail)
 * No RDMA NIC there: the backend is recbackend.h's, holding each dmabuf.
 */
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <stdint.h>
#include <string.h>

#include "drc.h"
#include "drc_cuda.h"
#include "gpu.h"
#include "recbackend.h"

enum { MiB = 1 << 20 };

static struct rec rec;
static int wrap, caught;    /* caught: 1 when a hook or wrapper is expected to invalidate */

static int rt_free(void *p)
{
    return wrap ? drc_cudaFree(p) : cudaFree(p);
}

static int rt_reset(void)
{
    return wrap ? drc_cudaDeviceReset() : cudaDeviceReset();
}

/* Register [p, p+len) and keep the region. */
static drc_region_t *hold(drc_cache_t *c, void *p, size_t len)
{
    drc_region_t *r = NULL;
    int e = drc_get(c, p, len, 1, &r);

    CHECK(e == 0, "register: %s", drc_strerror(e));
    return e ? NULL : r;
}

static void free_after_set_device(drc_cache_t *c)
{
    void *p = NULL, *q = NULL;
    drc_region_t *r, *r2;
    int dev = -1, id;

    printf("cudaSetDevice(1); cudaMalloc; cudaSetDevice(0); cudaFree (%s)\n", caught ? "caught" : "control");
    CHECK(cudaSetDevice(1) == cudaSuccess && cudaMalloc(&p, 64 * MiB) == cudaSuccess, "device 1 allocation");
    if (!(r = hold(c, (char *)p + 32 * MiB, MiB)))
        return;
    id = rec_id(r);
    CHECK(rec.a[id - 1].device == 1, "registered as device %d's", rec.a[id - 1].device);
    drc_put(c, r);
    CHECK(cudaSetDevice(0) == cudaSuccess, "cudaSetDevice(0)");
    CHECK(rt_free(p) == cudaSuccess, "free");
    CHECK(cudaGetDevice(&dev) == cudaSuccess && dev == 0, "the current device is %d after the free", dev);
    CHECK(cudaSetDevice(1) == cudaSuccess && cudaMalloc(&q, 64 * MiB) == cudaSuccess, "device 1 again");
    if (!(r2 = hold(c, (char *)q + 32 * MiB, MiB)))
        return;
    printf("  same VA %s, %s\n", p == q ? "yes" : "no", rec_id(r2) != id ? "registered anew" : "the old region");
    if (caught)
        CHECK(rec_id(r2) != id, "the region of the freed memory was returned");
    else
        CHECK(p != q || rec_id(r2) == id, "control: the same VA must hit the old region (the hazard)");
    drc_put(c, r2);
    CHECK(cudaSetDevice(0) == cudaSuccess && rt_free(q) == cudaSuccess, "free again from device 0");
}

static void reset_current_device(drc_cache_t *c)
{
    void *p0 = NULL, *p1 = NULL;
    drc_region_t *r0, *r1;

    printf("cudaSetDevice(1); cudaDeviceReset (%s)\n", caught ? "caught" : "control");
    CHECK(cudaSetDevice(0) == cudaSuccess && cudaMalloc(&p0, 8 * MiB) == cudaSuccess, "device 0 allocation");
    CHECK(cudaSetDevice(1) == cudaSuccess && cudaMalloc(&p1, 8 * MiB) == cudaSuccess, "device 1 allocation");
    r0 = hold(c, p0, MiB);
    r1 = hold(c, p1, MiB);
    if (!r0 || !r1)
        return;
    CHECK(rt_reset() == cudaSuccess, "cudaDeviceReset of device 1");
    if (caught)
        CHECK(!drc_region_valid(r1), "device 1's region survived its reset");
    else
        CHECK(drc_region_valid(r1), "control: without a hook device 1's region stays valid");
    CHECK(drc_region_valid(r0), "device 0's region was invalidated by device 1's reset");
    drc_put(c, r0);
    drc_put(c, r1);
    CHECK(cudaSetDevice(0) == cudaSuccess && rt_free(p0) == cudaSuccess, "free device 0's memory");
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "wrappers";
    drc_cache_t *c;
    int n = 0;

    setvbuf(stdout, NULL, _IOLBF, 0);
    if (cudaGetDeviceCount(&n) != cudaSuccess || n < 2) {
        printf("SKIP: %d GPU(s); this test needs two\n", n);
        return gpu_summary(mode);
    }
    wrap = !strcmp(mode, "wrappers");
    caught = strcmp(mode, "control") != 0;
    printf("mode %s, LD_PRELOAD=%s\n", mode, getenv("LD_PRELOAD") ? getenv("LD_PRELOAD") : "");
    cudaSetDevice(1);
    cudaFree(0);    /* creates device 1's primary context */
    cudaSetDevice(0);
    cudaFree(0);
    c = rec_cache_hold(&rec, 0);
    free_after_set_device(c);
    reset_current_device(c);
    CHECK(rec.exported > 0, "nothing was exported: no dmabuf on this machine?");
    rec_done(c);
    CHECK(rec.calls == rec.deregs, "regs %d, deregs %d", rec.calls, rec.deregs);
    return gpu_summary(mode);
}
