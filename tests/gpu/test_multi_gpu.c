/*
 * Several GPUs in one process (issue 13), on real CUDA: what drc decides per
 * device, with allocations on device 1 touched from device 0's context and
 * from threads with none. Needs two GPUs; with fewer it says SKIP and exits 0.
 *
 * The machine it runs on has no RDMA NIC: registrations go to a RECORDING
 * BACKEND (recbackend.h, a double) that checks what a NIC would be handed.
 * Everything on the CUDA side is real.
 *
 * Scenarios (each with what a user would check):
 *  - register device-1 memory from a thread whose current context is device
 *    0's, and from a thread with none: the region is device 1's, the export
 *    has the allocation's size, and the caller's context is what it was;
 *  - free device-1 memory from device 0's context through drc_cuMemFree: a
 *    sub-range 32 MiB into the allocation is invalidated too;
 *  - reset device 1's primary context, or destroy a context of device 1:
 *    device 1's regions go, device 0's stay;
 *  - peer-mapped VMM memory of device 1 (cuMemSetAccess for both devices),
 *    and device-1 memory under cuCtxEnablePeerAccess, registered from device
 *    0's context: classified as device 1's;
 *  - a stress run over both devices: getters (device 0's, device 1's or no
 *    context) check every region they get against the buffer id of the
 *    memory now, while another thread frees and reallocates; regs == deregs,
 *    fds and each device's free memory back to what they were; the control
 *    (same run without drc's free hook) must show stale regions, or the check
 *    proves nothing.
 * It also prints what the driver itself answers to an export of device-1
 * memory from device 0's context and from none: the CUDA double
 * (tests/doubles, fc.strict_ctx) answers CUDA_ERROR_INVALID_CONTEXT to both;
 * a difference is to be reported in RESULTS.md and the double corrected.
 */
#include <cuda.h>
#include <dirent.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "drc.h"
#include "drc_cuda.h"
#include "gpu.h"
#include "recbackend.h"

enum { MiB = 1 << 20 };

static CUcontext ctx[2];

static int get_put(drc_cache_t *c, CUdeviceptr p, size_t len)
{
    drc_region_t *r;
    int e = drc_get(c, (void *)(uintptr_t)p, len, 0x7, &r);

    if (!e)
        drc_put(c, r);
    return e;
}

static int open_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    int n = 0;

    while (d && readdir(d))
        n++;
    if (d)
        closedir(d);
    return n;
}

static size_t free_mem(int dev)
{
    size_t f = 0, t = 0;

    CU(cuCtxSetCurrent(ctx[dev]));
    CU(cuMemGetInfo(&f, &t));
    return f;
}

/* ---- what the driver answers to an export from the wrong context (informational) ---- */
static void probe_wrong_context(void)
{
    CUdeviceptr p;
    CUcontext none = NULL;
    int fd = -1, dev;
    const char *name[3] = { "?", "?", "?" };
    CUresult rc[3];

    CU(cuCtxSetCurrent(ctx[1]));
    CU(cuMemAlloc(&p, 2 * MiB));
    for (dev = 0; dev < 3; dev++) {     /* device 0's context, none, device 1's */
        CU(cuCtxSetCurrent(dev == 0 ? ctx[0] : dev == 1 ? none : ctx[1]));
        fd = -1;
        rc[dev] = cuMemGetHandleForAddressRange(&fd, p, 2 * MiB, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
        cuGetErrorName(rc[dev], &name[dev]);
        if (rc[dev] == CUDA_SUCCESS)
            close(fd);
    }
    printf("driver: export of device-1 memory from device 0's context: %s, from none: %s, from its own: %s\n",
           name[0], name[1], name[2]);
    CHECK(rc[2] == CUDA_SUCCESS, "the export from the memory's own context failed: %s", name[2]);
    CU(cuCtxSetCurrent(ctx[1]));
    CU(cuMemFree(p));
}

/* ---- registration across contexts --------------------------------------- */
static CUdeviceptr cross_p;
static drc_cache_t *cross_cache;
static int cross_err;
static CUcontext cross_before, cross_after;

static void *cross_thread(void *arg)
{
    if (arg)
        cuCtxSetCurrent(ctx[0]);
    cuCtxGetCurrent(&cross_before);
    cross_err = get_put(cross_cache, cross_p + 4 * MiB, MiB);
    cuCtxGetCurrent(&cross_after);
    return NULL;
}

static void test_cross_context(void)
{
    struct rec r;
    pthread_t t;
    int with_ctx;

    printf("device-1 memory registered from device 0's context and from no context\n");
    CU(cuCtxSetCurrent(ctx[1]));
    CU(cuMemAlloc(&cross_p, 64 * MiB));
    for (with_ctx = 1; with_ctx >= 0; with_ctx--) {
        cross_cache = rec_cache(&r, 0);
        pthread_create(&t, NULL, cross_thread, with_ctx ? &t : NULL);
        pthread_join(t, NULL);
        CHECK(cross_err == 0, "%s context: %s", with_ctx ? "device 0" : "no", drc_strerror(cross_err));
        CHECK(r.calls == 1 && r.a[0].type == DRC_MEM_CUDA && r.a[0].device == 1, "calls %d device %d", r.calls,
              r.calls ? r.a[0].device : -9);
        CHECK(r.calls == 1 && r.fd_size[0] > 0, "no dmabuf exported (fd size %ld)", r.calls ? r.fd_size[0] : -9);
        CHECK(cross_after == cross_before, "the caller's context changed: %p -> %p", (void *)cross_before,
              (void *)cross_after);
        rec_done(cross_cache);
    }
    CU(cuCtxSetCurrent(ctx[0]));
    CHECK(drc_cuMemFree(cross_p) == CUDA_SUCCESS, "free from device 0's context");
}

/* ---- a free of device-1 memory from device 0's context ------------------ */
static void test_free_from_other_context(void)
{
    CUdeviceptr p;
    drc_region_t *reg;
    struct rec r;
    drc_cache_t *c = rec_cache(&r, 0);
    int e;

    printf("drc_cuMemFree of device-1 memory from device 0's context\n");
    CU(cuCtxSetCurrent(ctx[1]));
    CU(cuMemAlloc(&p, 64 * MiB));
    e = drc_get(c, (void *)(uintptr_t)(p + 32 * MiB), MiB, 0x7, &reg);
    CHECK(e == 0, "%s", drc_strerror(e));
    CU(cuCtxSetCurrent(ctx[0]));
    CHECK(drc_cuMemFree(p) == CUDA_SUCCESS, "free");
    CHECK(e || !drc_region_valid(reg), "the sub-range at +32 MiB is still valid after the free");
    if (!e)
        drc_put(c, reg);
    rec_done(c);
}

/* ---- resetting one device leaves the other alone ----------------------- */
static void test_reset_one_device(void)
{
    CUdeviceptr p0, p1;
    drc_region_t *r0, *r1;
    struct rec r;
    drc_cache_t *c = rec_cache(&r, 0);
    int e0, e1;

    printf("primary context reset of device 1\n");
    CU(cuCtxSetCurrent(ctx[0]));
    CU(cuMemAlloc(&p0, 8 * MiB));
    CU(cuCtxSetCurrent(ctx[1]));
    CU(cuMemAlloc(&p1, 8 * MiB));
    e0 = drc_get(c, (void *)(uintptr_t)p0, MiB, 0x7, &r0);
    e1 = drc_get(c, (void *)(uintptr_t)p1, MiB, 0x7, &r1);
    CHECK(e0 == 0 && e1 == 0, "%s / %s", drc_strerror(e0), drc_strerror(e1));
    CHECK(drc_cuDevicePrimaryCtxReset(1) == CUDA_SUCCESS, "reset");
    CHECK(!e1 && !drc_region_valid(r1), "device 1's region survived its context reset");
    CHECK(!e0 && drc_region_valid(r0), "device 0's region was invalidated by device 1's reset");
    if (!e0)
        drc_put(c, r0);
    if (!e1)
        drc_put(c, r1);
    {
        CUcontext before = ctx[1];

        CU(cuDevicePrimaryCtxRetain(&ctx[1], 1));
        printf("  device 1's primary context after the reset: %s handle\n", before == ctx[1] ? "the same" : "a new");
    }
    CU(cuCtxSetCurrent(ctx[0]));
    drc_cuMemFree(p0);
    rec_done(c);
}

/* ---- destroying a context of device 1 leaves device 0 alone --------------- */
static void test_destroy_one_device(void)
{
    CUcontext own;
    CUdeviceptr p0, p1;
    drc_region_t *r0, *r1;
    struct rec r;
    drc_cache_t *c = rec_cache(&r, 0);
    int e0, e1;

    printf("cuCtxDestroy of a context of device 1\n");
    CU(cuCtxSetCurrent(ctx[0]));
    CU(cuMemAlloc(&p0, 8 * MiB));
    CU(cuCtxCreate(&own, NULL, 0, 1));
    CU(cuMemAlloc(&p1, 8 * MiB));
    CU(cuCtxSetCurrent(ctx[0]));
    e0 = drc_get(c, (void *)(uintptr_t)p0, MiB, 0x7, &r0);
    e1 = drc_get(c, (void *)(uintptr_t)p1, MiB, 0x7, &r1);
    CHECK(e0 == 0 && e1 == 0, "%s / %s", drc_strerror(e0), drc_strerror(e1));
    CHECK(e1 || r.a[1].device == 1, "the created context's memory is device %d's", r.a[1].device);
    CHECK(drc_cuCtxDestroy(own) == CUDA_SUCCESS, "destroy");
    CHECK(!e1 && !drc_region_valid(r1), "device 1's region survived the destroy of its context");
    CHECK(!e0 && drc_region_valid(r0), "device 0's region was invalidated by a destroy on device 1");
    if (!e0)
        drc_put(c, r0);
    if (!e1)
        drc_put(c, r1);
    CU(cuCtxSetCurrent(ctx[0]));
    drc_cuMemFree(p0);
    rec_done(c);
}

/* ---- legacy peer access: device-1 memory used from device 0's context ------ */
static void test_peer_access(void)
{
    CUdeviceptr p;
    struct rec r;
    drc_cache_t *c;
    CUcontext cur = NULL;
    CUresult rc;
    int can = 0, e;

    CU(cuDeviceCanAccessPeer(&can, 0, 1));
    if (!can) {
        printf("SKIP peer access: device 0 cannot access device 1\n");
        return;
    }
    printf("device-1 memory under cuCtxEnablePeerAccess, registered from device 0's context\n");
    c = rec_cache(&r, 0);
    CU(cuCtxSetCurrent(ctx[0]));
    rc = cuCtxEnablePeerAccess(ctx[1], 0);
    CHECK(rc == CUDA_SUCCESS || rc == CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED, "enable peer access: %d", rc);
    CU(cuCtxSetCurrent(ctx[1]));
    CU(cuMemAlloc(&p, 16 * MiB));
    CU(cuCtxSetCurrent(ctx[0]));
    e = get_put(c, p + 4 * MiB, MiB);
    cuCtxGetCurrent(&cur);
    CHECK(e == 0, "%s", drc_strerror(e));
    CHECK(r.calls == 1 && r.a[0].device == 1 && r.fd_size[0] > 0, "calls %d device %d size %ld", r.calls,
          r.calls ? r.a[0].device : -9, r.calls ? r.fd_size[0] : -9);
    CHECK(cur == ctx[0], "the caller's context changed");
    CHECK(drc_cuMemFree(p) == CUDA_SUCCESS, "free from device 0's context");
    CHECK(r.deregs == r.calls, "regs %d deregs %d after the free", r.calls, r.deregs);
    cuCtxDisablePeerAccess(ctx[1]);
    rec_done(c);
}

/* ---- peer-mapped VMM memory --------------------------------------------- */
static void test_peer_vmm(void)
{
    CUmemAllocationProp prop;
    CUmemAccessDesc acc[2];
    CUmemGenericAllocationHandle h;
    CUdeviceptr va;
    size_t gran, size;
    struct rec r;
    drc_cache_t *c;
    int e, can = 0;

    CU(cuDeviceCanAccessPeer(&can, 0, 1));
    if (!can) {
        printf("SKIP peer-mapped VMM: device 0 cannot access device 1\n");
        return;
    }
    c = rec_cache(&r, 0);
    printf("device-1 VMM memory mapped for both devices, registered from device 0's context\n");
    memset(&prop, 0, sizeof(prop));
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 1;
    prop.allocFlags.gpuDirectRDMACapable = 1;
    CU(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
    size = 4 * gran;
    CU(cuMemCreate(&h, size, &prop, 0));
    CU(cuMemAddressReserve(&va, size, 0, 0, 0));
    CU(cuMemMap(va, size, 0, h, 0));
    memset(acc, 0, sizeof(acc));
    for (int d = 0; d < 2; d++) {
        acc[d].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        acc[d].location.id = d;
        acc[d].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    }
    CU(cuMemSetAccess(va, size, acc, 2));
    CU(cuCtxSetCurrent(ctx[0]));
    e = get_put(c, va, size);
    CHECK(e == 0, "%s", drc_strerror(e));
    CHECK(r.calls == 1 && r.a[0].device == 1 && r.fd_size[0] == (long)size, "calls %d device %d size %ld", r.calls,
          r.calls ? r.a[0].device : -9, r.calls ? r.fd_size[0] : -9);
    drc_notify_free((void *)(uintptr_t)va, size);
    CU(cuMemUnmap(va, size));
    CU(cuMemRelease(h));
    CU(cuMemAddressFree(va, size));
    rec_done(c);
}

/* ---- stress over both devices ------------------------------------------- */
enum { SLOTS = 4, GETTERS = 4, ROUNDS = 400 };
static CUdeviceptr slot[SLOTS];          /* slot i lives on device i % 2 */
static unsigned gen[SLOTS];              /* odd while slot i is being freed and reallocated */
static int stop, use_drc;
static drc_cache_t *stress_cache;
static long stale, checked;

static void *getter(void *arg)
{
    unsigned seed = (unsigned)(uintptr_t)arg;
    long my_stale = 0, my_checked = 0;

    if (seed % 3)
        cuCtxSetCurrent(ctx[seed % 3 - 1]);     /* device 0's, device 1's, or (seed 3) none */
    while (!__atomic_load_n(&stop, __ATOMIC_ACQUIRE)) {
        int i = rand_r(&seed) % SLOTS;
        unsigned g1 = __atomic_load_n(&gen[i], __ATOMIC_ACQUIRE), g2;
        CUdeviceptr p = __atomic_load_n(&slot[i], __ATOMIC_ACQUIRE);
        unsigned long long now = 0;
        drc_region_t *reg;

        if (g1 & 1)
            continue;
        if (drc_get(stress_cache, (void *)(uintptr_t)(p + MiB), MiB, 0x7, &reg))
            continue;
        cuPointerGetAttribute(&now, CU_POINTER_ATTRIBUTE_BUFFER_ID, p + MiB);
        g2 = __atomic_load_n(&gen[i], __ATOMIC_ACQUIRE);
        if (g1 == g2) {     /* no free overlapped this get: the region must be the memory there now */
            my_checked++;
            if (rec_buffer_id(reg) != now)
                my_stale++;
        }
        drc_put(stress_cache, reg);
    }
    __atomic_fetch_add(&stale, my_stale, __ATOMIC_RELAXED);
    __atomic_fetch_add(&checked, my_checked, __ATOMIC_RELAXED);
    return NULL;
}

static void stress(int with_drc)
{
    pthread_t t[GETTERS];
    struct rec r;
    int i, k, fds = open_fds();
    size_t mem0 = free_mem(0), mem1 = free_mem(1);

    use_drc = with_drc;
    stress_cache = rec_cache(&r, 0);
    stale = checked = stop = 0;
    for (i = 0; i < SLOTS; i++) {
        CU(cuCtxSetCurrent(ctx[i & 1]));
        CU(cuMemAlloc(&slot[i], 16 * MiB));
    }
    for (k = 0; k < GETTERS; k++)
        pthread_create(&t[k], NULL, getter, (void *)(uintptr_t)(k + 1));
    for (k = 0; k < ROUNDS; k++) {
        CUdeviceptr p;

        i = k % SLOTS;
        CU(cuCtxSetCurrent(ctx[(k / SLOTS) & 1]));      /* free from either device's context */
        __atomic_fetch_add(&gen[i], 1, __ATOMIC_ACQ_REL);
        if (use_drc)
            drc_cuMemFree(slot[i]);
        else
            cuMemFree(slot[i]);
        CU(cuCtxSetCurrent(ctx[i & 1]));
        CU(cuMemAlloc(&p, 16 * MiB));
        __atomic_store_n(&slot[i], p, __ATOMIC_RELEASE);
        __atomic_fetch_add(&gen[i], 1, __ATOMIC_ACQ_REL);
        usleep(200);
    }
    __atomic_store_n(&stop, 1, __ATOMIC_RELEASE);
    for (k = 0; k < GETTERS; k++)
        pthread_join(t[k], NULL);
    for (i = 0; i < SLOTS; i++)
        drc_cuMemFree(slot[i]);
    printf("  %s: %ld checked gets, %ld stale, %d registrations, %d deregistrations\n",
           with_drc ? "with drc_cuMemFree" : "control, plain cuMemFree", checked, stale, r.calls, r.deregs);
    rec_done(stress_cache);
    if (with_drc) {
        size_t now0 = free_mem(0), now1 = free_mem(1);

        printf("  fds %d -> %d; free memory: device 0 %zu -> %zu MiB, device 1 %zu -> %zu MiB\n", fds, open_fds(),
               mem0 / MiB, now0 / MiB, mem1 / MiB, now1 / MiB);
        CHECK(checked > 1000 && stale == 0, "%ld stale of %ld", stale, checked);
        CHECK(r.calls == r.deregs, "regs %d != deregs %d", r.calls, r.deregs);
        CHECK(open_fds() == fds, "fds %d -> %d", fds, open_fds());
        CHECK(now0 + 8 * MiB >= mem0 && now1 + 8 * MiB >= mem1, "device memory not back: %zu/%zu MiB less",
              (mem0 - now0) / MiB, (mem1 - now1) / MiB);
    } else {
        CHECK(stale > 0, "the control showed no stale region: the check cannot fail");
    }
}

int main(void)
{
    int n = 0;
    size_t free0, total, free1;

    setvbuf(stdout, NULL, _IOLBF, 0);
    CU(cuInit(0));
    CU(cuDeviceGetCount(&n));
    if (n < 2) {
        printf("SKIP: %d GPU(s); this suite needs two\n", n);
        return gpu_summary("test_multi_gpu");
    }
    CU(cuDevicePrimaryCtxRetain(&ctx[0], 0));
    CU(cuDevicePrimaryCtxRetain(&ctx[1], 1));
    CU(cuCtxSetCurrent(ctx[0]));
    CU(cuMemGetInfo(&free0, &total));
    probe_wrong_context();
    test_cross_context();
    test_free_from_other_context();
    test_reset_one_device();
    test_destroy_one_device();
    test_peer_access();
    test_peer_vmm();
    printf("stress: %d getters over %d allocations on two devices, %d free+realloc rounds\n", GETTERS, SLOTS, ROUNDS);
    stress(1);
    stress(0);
    CU(cuCtxSetCurrent(ctx[0]));
    CU(cuMemGetInfo(&free1, &total));
    printf("device 0 free memory: %zu MiB before, %zu MiB after\n", free0 / MiB, free1 / MiB);
    return gpu_summary("test_multi_gpu");
}
