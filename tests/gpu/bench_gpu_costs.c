/*
 * What drc's operations cost on real GPU memory (issue 26), next to the
 * driver calls they are made of, for each kind of memory a consumer hands
 * drc: cuMemAlloc, a stream-ordered pool allocation (cuMemAllocAsync) and a
 * VMM allocation (cuMemCreate + cuMemMap with gpuDirectRDMACapable), 64 MiB
 * each. The rows:
 *
 *   drc hit            drc_get + drc_put of a 4 KiB sub-range (16 of them in
 *                      turn) of a registered region, the cache without flags;
 *   ... DRC_F_VALIDATE the same in a cache made with DRC_F_VALIDATE (each CUDA
 *                      hit asks the driver for the buffer id again);
 *   drc miss, shared   a fresh 4 KiB sub-range of an allocation whose dmabuf
 *                      the export table holds (classification and a dup);
 *   drc miss, export   drc_get of the whole allocation after a drc_notify_free
 *                      of it (untimed) closed its export: classification and
 *                      cuMemGetHandleForAddressRange;
 *   the driver's calls cuMemGetHandleForAddressRange(DMA_BUF_FD) + close on
 *                      the range drc exports, with the default mapping type
 *                      and with CU_MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE
 *                      (its refusal is timed and named), cuPointerGetAttribute
 *                      (BUFFER_ID, what DRC_F_VALIDATE asks), cuMemGetAddressRange,
 *                      and drc's classification of 4 KiB (the start of each miss).
 *
 * There is no RDMA NIC on the GPU machine: the caches register through a
 * backend that registers nothing (it counts calls and dmabuf fds), so a miss
 * here is drc and the driver, without what a NIC's ibv_reg_dmabuf_mr adds.
 * The interposer's hit on GPU memory (ibv_reg_mr + ibv_dereg_mr through
 * libdrc_verbs.so over the loopback NIC model) is tests/bench/bench_preload_hit
 * with DRC_TEST_BENCH_REAL_CUDA=1, run by engine.sh.
 *
 * Each row: ROUNDS rounds of n operations after a warm-up, the median and
 * the min-max of the nanoseconds per operation. The checks are sanity only
 * (never a time): a hit returns the region of the first registration and
 * registers nothing, each miss is handed a dmabuf fd, the export table is
 * empty after the frees, no fd is left open.
 *
 * libcuda.so.1 is opened with dlopen (nothing links it), so that on a machine
 * without a driver or a GPU the program says SKIP and exits 0. Over THE CUDA
 * double (LD_LIBRARY_PATH=build/gpu/fakecuda, which lacks cuMemAllocAsync:
 * no pool rows) it runs as a check of its own logic; the figures are then
 * the double's, not a driver's.
 */
#include <cuda.h>
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cuda/cuda.h"
#include "core/mem.h"
#include "drc.h"

/*
 * The driver entry points used here, found with dlsym under the names
 * <cuda.h> maps them to (cuMemAlloc is cuMemAlloc_v2), and called through
 * pointers that the macros below put in place of the functions. Those of
 * CU_OPTIONAL may be missing (the pool rows are then skipped; an error is
 * named by its number).
 */
#define CU_FUNCS(X)                                                                                   \
    X(cuInit) X(cuDriverGetVersion) X(cuDeviceGetCount) X(cuDeviceGet) X(cuDeviceGetName)             \
    X(cuDeviceGetAttribute) X(cuDevicePrimaryCtxRetain) X(cuCtxSetCurrent) X(cuMemAlloc) X(cuMemFree) \
    X(cuMemGetAllocationGranularity) X(cuMemAddressReserve) X(cuMemCreate) X(cuMemMap)                \
    X(cuMemSetAccess) X(cuMemUnmap) X(cuMemRelease) X(cuMemAddressFree)                               \
    X(cuMemGetHandleForAddressRange) X(cuPointerGetAttribute) X(cuMemGetAddressRange)
#define CU_OPTIONAL(X) X(cuGetErrorName) X(cuMemAllocAsync) X(cuMemFreeAsync) X(cuStreamSynchronize)
#define CU_STR_(x) #x
#define CU_STR(x) CU_STR_(x)
#define CU_DECL(f) static __typeof__(f) *p_##f;
#define CU_LOAD(f)                                                                                    \
    if (!(*(void **)&p_##f = dlsym(h, CU_STR(f))) && !*missing)                                       \
        *missing = CU_STR(f);
CU_FUNCS(CU_DECL)
CU_OPTIONAL(CU_DECL)

/* 1: loaded; 0: no libcuda.so.1; -1: one lacking @missing, an entry point of CU_FUNCS */
static int cu_load(const char **missing)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);

    *missing = NULL;
    if (!h)
        return 0;
    CU_FUNCS(CU_LOAD)
    if (*missing)
        return -1;
    CU_OPTIONAL(CU_LOAD)
    return 1;
}

static CUresult cu_error_name(CUresult rc, const char **s)
{
    return p_cuGetErrorName ? p_cuGetErrorName(rc, s) : CUDA_ERROR_NOT_FOUND;
}

#undef cuMemAlloc
#undef cuMemFree
#undef cuMemAllocAsync
#undef cuMemFreeAsync
#undef cuStreamSynchronize
#undef cuMemGetAddressRange
#define cuInit (*p_cuInit)
#define cuGetErrorName cu_error_name
#define cuDriverGetVersion (*p_cuDriverGetVersion)
#define cuDeviceGetCount (*p_cuDeviceGetCount)
#define cuDeviceGet (*p_cuDeviceGet)
#define cuDeviceGetName (*p_cuDeviceGetName)
#define cuDeviceGetAttribute (*p_cuDeviceGetAttribute)
#define cuDevicePrimaryCtxRetain (*p_cuDevicePrimaryCtxRetain)
#define cuCtxSetCurrent (*p_cuCtxSetCurrent)
#define cuMemAlloc (*p_cuMemAlloc)
#define cuMemFree (*p_cuMemFree)
#define cuMemAllocAsync (*p_cuMemAllocAsync)
#define cuMemFreeAsync (*p_cuMemFreeAsync)
#define cuStreamSynchronize (*p_cuStreamSynchronize)
#define cuMemGetAllocationGranularity (*p_cuMemGetAllocationGranularity)
#define cuMemAddressReserve (*p_cuMemAddressReserve)
#define cuMemCreate (*p_cuMemCreate)
#define cuMemMap (*p_cuMemMap)
#define cuMemSetAccess (*p_cuMemSetAccess)
#define cuMemUnmap (*p_cuMemUnmap)
#define cuMemRelease (*p_cuMemRelease)
#define cuMemAddressFree (*p_cuMemAddressFree)
#define cuMemGetHandleForAddressRange (*p_cuMemGetHandleForAddressRange)
#define cuPointerGetAttribute (*p_cuPointerGetAttribute)
#define cuMemGetAddressRange (*p_cuMemGetAddressRange)

#include "gpu.h"   /* after the macros: its CU() calls cuGetErrorName */

enum { MiB = 1 << 20, ROUNDS = 9, SUBS = 16, ACCESS = 0x7 /* LOCAL_WRITE | REMOTE_WRITE | REMOTE_READ */ };
#define SIZE ((size_t)64 * MiB)
#define ROUND_NS 30e6   /* at most about this long a round */

/* ---- the backend: registers nothing, counts ------------------------------ */
struct be {
    int regs, deregs, with_fd;
    int token;              /* the handles point here */
};

static int be_reg(void *ctx, const struct drc_reg_args *a, void **handle, uint32_t *lkey, uint32_t *rkey)
{
    struct be *b = ctx;

    b->regs++;
    b->with_fd += a->type == DRC_MEM_CUDA && a->dmabuf_fd >= 0;
    *handle = &b->token;
    *lkey = *rkey = (uint32_t)b->regs;
    return 0;
}

static int be_dereg(void *ctx, void *handle)
{
    (void)handle;
    ((struct be *)ctx)->deregs++;
    return 0;
}

static drc_cache_t *cache_new(struct be *b, unsigned flags)
{
    struct drc_backend be = { .reg = be_reg, .dereg = be_dereg, .ctx = b };
    struct drc_config cfg = { .flags = flags };
    drc_cache_t *c = NULL;
    int e;

    memset(b, 0, sizeof(*b));
    e = drc_cache_create(&be, &cfg, &c);
    if (e) {
        printf("  FATAL drc_cache_create: %s\n", drc_strerror(e));
        exit(2);
    }
    return c;
}

static void cache_done(drc_cache_t *c)
{
    int e = drc_cache_destroy(c);

    CHECK(e == 0, "destroy: %s", drc_strerror(e));
}

/* ---- the memory ---------------------------------------------------------- */
struct mem {
    const char *name;
    CUdeviceptr p;
    CUdeviceptr xlo, xhi;           /* what the raw export rows export: the range drc exports */
    CUmemGenericAllocationHandle h; /* VMM */
    drc_cache_t *c;                 /* the cache of the row being timed */
    struct be b, sb;                /* its backend; the shared-export misses' */
    void *handle;                   /* the handle of the row's first registration */
    int cold_bad, shared_bad;       /* failed gets in the miss rows */
    CUresult raw_rc[2];             /* the raw export's first answer, default and PCIe type */
};

static const char *cu_name(CUresult rc)
{
    static char num[32];
    const char *s = NULL;

    if (cuGetErrorName(rc, &s) != CUDA_SUCCESS || !s) {
        snprintf(num, sizeof(num), "CUresult %d", (int)rc);
        s = num;
    }
    return s;
}

static CUresult raw_export(const struct mem *m, unsigned long long flags)
{
    int fd = -1;
    CUresult rc = cuMemGetHandleForAddressRange(&fd, m->xlo, m->xhi - m->xlo, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD,
                                                flags);

    if (rc == CUDA_SUCCESS)
        close(fd);
    return rc;
}

/* The range the driver exports for [p, p + SIZE): its own pages, else from the pool mapping's base (as drc). */
static void export_range(struct mem *m)
{
    CUdeviceptr base = 0;

    m->xlo = m->p;
    m->xhi = m->p + SIZE;
    if (raw_export(m, 0) == CUDA_SUCCESS)
        return;
    CU(cuPointerGetAttribute(&base, CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR, m->p));
    printf("  %s: its own pages do not export; the rows export from the mapping's base (%#llx, %llu bytes before)\n",
           m->name, (unsigned long long)base, (unsigned long long)(m->p - base));
    m->xlo = base;
}

static int vmm_make(struct mem *m, CUdevice dev)
{
    CUmemAllocationProp prop;
    CUmemAccessDesc acc;
    size_t gran;
    int vmm = 0, gdr = 0;

    cuDeviceGetAttribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev);
    cuDeviceGetAttribute(&gdr, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED, dev);
    if (!vmm || !gdr) {
        printf("SKIP VMM rows: VMM %d, GPUDirect RDMA with VMM %d\n", vmm, gdr);
        return 0;
    }
    memset(&prop, 0, sizeof(prop));
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = dev;
    prop.allocFlags.gpuDirectRDMACapable = 1;
    CU(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    CHECK(SIZE % gran == 0, "granularity %zu", gran);
    CU(cuMemAddressReserve(&m->p, SIZE, 0, 0, 0));
    CU(cuMemCreate(&m->h, SIZE, &prop, 0));
    CU(cuMemMap(m->p, SIZE, 0, m->h, 0));
    memset(&acc, 0, sizeof(acc));
    acc.location = prop.location;
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    CU(cuMemSetAccess(m->p, SIZE, &acc, 1));
    return 1;
}

static void mem_free(struct mem *m)
{
    if (!strcmp(m->name, "VMM")) {
        CU(cuMemUnmap(m->p, SIZE));
        CU(cuMemRelease(m->h));
        CU(cuMemAddressFree(m->p, SIZE));
    } else if (!strcmp(m->name, "pool")) {
        CU(cuMemFreeAsync(m->p, 0));
        CU(cuStreamSynchronize(0));
    } else {
        CU(cuMemFree(m->p));
    }
}

/* ---- the operations: each does n of its kind and returns the nanoseconds timed ---- */
static void *sub(const struct mem *m, int i)
{
    return (void *)(uintptr_t)(m->p + (size_t)(i % SUBS) * MiB + 100);
}

static double op_hit(struct mem *m, int n)
{
    drc_region_t *r;
    int i, bad = 0;
    double t0 = gpu_now_ns(), t;

    for (i = 0; i < n; i++) {
        if (drc_get(m->c, sub(m, i), 4096, ACCESS, &r) == 0)
            drc_put(m->c, r);
        else
            bad++;
    }
    t = gpu_now_ns() - t0;
    CHECK(bad == 0, "%s: %d hits failed", m->name, bad);
    return t;
}

/* n fresh 4 KiB sub-ranges (64 KiB apart, so that none coalesces) in a new cache: the table holds the export */
static double op_miss_shared(struct mem *m, int n)
{
    drc_cache_t *c = cache_new(&m->sb, 0);
    drc_region_t *r;
    double t = 0, t0;
    int i, e;

    for (i = 0; i < n; i++) {
        t0 = gpu_now_ns();
        e = drc_get(c, (void *)(uintptr_t)(m->p + (size_t)(i % 1024) * 65536), 4096, ACCESS, &r);
        t += gpu_now_ns() - t0;
        if (e == 0)
            drc_put(c, r);
        else
            m->shared_bad++;
    }
    m->shared_bad += m->sb.regs != n || m->sb.with_fd != n;
    cache_done(c);
    return t;
}

/* drc_get of the whole allocation after drc_notify_free of it: classification, the export, reg() */
static double op_miss_export(struct mem *m, int n)
{
    drc_region_t *r;
    double t = 0, t0;
    int i, e, regs0 = m->b.regs;

    for (i = 0; i < n; i++) {
        drc_notify_free((void *)(uintptr_t)m->p, SIZE);   /* drops the region and closes the export */
        t0 = gpu_now_ns();
        e = drc_get(m->c, (void *)(uintptr_t)m->p, SIZE, ACCESS, &r);
        t += gpu_now_ns() - t0;
        if (e == 0)
            drc_put(m->c, r);
        else
            m->cold_bad++;
    }
    m->cold_bad += m->b.regs - regs0 != n;
    return t;
}

static double op_raw(struct mem *m, int n, int k)
{
    unsigned long long flags = k ? CU_MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE : 0;
    double t0 = gpu_now_ns();
    int i;

    for (i = 0; i < n; i++)
        if (raw_export(m, flags) != m->raw_rc[k])
            m->raw_rc[k] = (CUresult)-1;        /* the answer changed: reported as a failed check */
    return gpu_now_ns() - t0;
}

static double op_raw_default(struct mem *m, int n)
{
    return op_raw(m, n, 0);
}

static double op_raw_pcie(struct mem *m, int n)
{
    return op_raw(m, n, 1);
}

static double op_buffer_id(struct mem *m, int n)
{
    unsigned long long id;
    double t0 = gpu_now_ns();
    int i, bad = 0;

    for (i = 0; i < n; i++)
        bad += cuPointerGetAttribute(&id, CU_POINTER_ATTRIBUTE_BUFFER_ID, (CUdeviceptr)(uintptr_t)sub(m, i)) != 0;
    CHECK(bad == 0, "%s: cuPointerGetAttribute failed %d times", m->name, bad);
    return gpu_now_ns() - t0;
}

static double op_address_range(struct mem *m, int n)
{
    CUdeviceptr base;
    size_t size;
    double t0 = gpu_now_ns();
    int i, bad = 0;

    for (i = 0; i < n; i++)
        bad += cuMemGetAddressRange(&base, &size, (CUdeviceptr)(uintptr_t)sub(m, i)) != 0;
    CHECK(bad == 0, "%s: cuMemGetAddressRange failed %d times", m->name, bad);
    return gpu_now_ns() - t0;
}

static double op_classify(struct mem *m, int n)
{
    struct drc__mem dm;
    double t0 = gpu_now_ns();
    int i, bad = 0;

    for (i = 0; i < n; i++)
        bad += drc__mem_classify((uintptr_t)sub(m, i), 4096, &dm) != 0 || dm.type != DRC_MEM_CUDA;
    CHECK(bad == 0, "%s: classification failed %d times", m->name, bad);
    return gpu_now_ns() - t0;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;

    return x < y ? -1 : x > y;
}

/*
 * One row: a warm-up of n / 10, then ROUNDS rounds of n, n made smaller where
 * the warm-up says a round would take more than ROUND_NS (a slower driver
 * call than expected must not make the run long).
 */
static void row(struct mem *m, const char *what, double (*op)(struct mem *, int), int n)
{
    int k, warm = n / 10 ? n / 10 : 1;
    double t[ROUNDS], per = op(m, warm) / warm;

    if (per * n > ROUND_NS)
        n = per * 3 > ROUND_NS ? 3 : (int)(ROUND_NS / per);
    for (k = 0; k < ROUNDS; k++)
        t[k] = op(m, n) / n;
    qsort(t, ROUNDS, sizeof(double), cmp);
    printf("%-11s %-62s %10.1f (%9.1f - %9.1f) %7d\n", m->name, what, t[ROUNDS / 2], t[0], t[ROUNDS - 1], n);
}

/* ---- the rows of one kind of memory ---------------------------------------- */
static void rows(struct mem *m)
{
    static const unsigned flags[2] = { 0, DRC_F_VALIDATE };
    static const char *const hit_name[2] = { "drc hit: drc_get+drc_put, 4 KiB of a registered 64 MiB",
                                             "drc hit, cache with DRC_F_VALIDATE" };
    drc_region_t *r;
    int k, e;

    for (k = 0; k < 2; k++) {
        m->c = cache_new(&m->b, flags[k]);
        e = drc_get(m->c, (void *)(uintptr_t)m->p, SIZE, ACCESS, &r);
        CHECK(e == 0 && m->b.regs == 1 && m->b.with_fd == 1, "%s: first registration: %s, %d regs, %d with a dmabuf",
              m->name, drc_strerror(e), m->b.regs, m->b.with_fd);
        if (e)
            continue;
        m->handle = drc_region_handle(r);
        drc_put(m->c, r);
        row(m, hit_name[k], op_hit, k ? 20000 : 200000);
        e = drc_get(m->c, sub(m, 5), 4096, ACCESS, &r);
        CHECK(e == 0 && drc_region_handle(r) == m->handle && m->b.regs == 1,
              "%s: after the hits: %s, the first registration's handle: %s, %d regs", m->name, drc_strerror(e),
              !e && drc_region_handle(r) == m->handle ? "yes" : "no", m->b.regs);
        if (!e)
            drc_put(m->c, r);
        if (k == 1)     /* the export this cache's region holds is shared */
            row(m, "drc miss, export shared: a fresh 4 KiB (classify, dup)", op_miss_shared, 200);
        cache_done(m->c);
    }
    CHECK(m->shared_bad == 0, "%s: shared-export misses: %d failed or had no dmabuf", m->name, m->shared_bad);

    m->c = cache_new(&m->b, 0);
    row(m, "drc miss with export: drc_get of the whole after a free", op_miss_export, 40);
    CHECK(m->cold_bad == 0 && m->b.with_fd == m->b.regs, "%s: export misses: %d failed, %d of %d with a dmabuf",
          m->name, m->cold_bad, m->b.with_fd, m->b.regs);
    drc_notify_free((void *)(uintptr_t)m->p, SIZE);
    cache_done(m->c);
    CHECK(drc__cuda_exports_live() == 0, "%s: %d exports held after the free", m->name, drc__cuda_exports_live());

    m->raw_rc[0] = raw_export(m, 0);
    m->raw_rc[1] = raw_export(m, CU_MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE);
    CHECK(m->raw_rc[0] == CUDA_SUCCESS, "%s: the raw export: %s", m->name, cu_name(m->raw_rc[0]));
    row(m, "cuMemGetHandleForAddressRange + close, default type", op_raw_default, 40);
    if (m->raw_rc[1] == CUDA_SUCCESS) {
        row(m, "cuMemGetHandleForAddressRange + close, PCIe type", op_raw_pcie, 40);
    } else {
        char what[96];

        snprintf(what, sizeof(what), "cuMemGetHandleForAddressRange PCIe: %s", cu_name(m->raw_rc[1]));
        row(m, what, op_raw_pcie, 40);
    }
    CHECK(m->raw_rc[0] == CUDA_SUCCESS && m->raw_rc[1] != (CUresult)-1, "%s: the raw exports' answers changed",
          m->name);
    row(m, "cuPointerGetAttribute(BUFFER_ID)", op_buffer_id, 20000);
    row(m, "cuMemGetAddressRange", op_address_range, 20000);
    row(m, "drc classification of 4 KiB (drc__mem_classify)", op_classify, 5000);
}

/* ---- open fds ---------------------------------------------------------------- */
enum { FDS = 4096 };

static int fds(unsigned char *open_fds)
{
    DIR *d = opendir("/proc/self/fd");
    struct dirent *e;
    int n = 0, fd;

    memset(open_fds, 0, FDS);
    if (!d)
        return -1;
    while ((e = readdir(d))) {
        fd = atoi(e->d_name);
        if (e->d_name[0] == '.' || fd == dirfd(d))
            continue;
        if (fd < FDS)
            open_fds[fd] = 1;
        n++;
    }
    closedir(d);
    return n;
}

static void new_fds(const unsigned char *before, const unsigned char *after)
{
    char path[64], target[256];
    ssize_t len;
    int fd;

    for (fd = 0; fd < FDS; fd++) {
        if (!after[fd] || before[fd])
            continue;
        snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
        len = readlink(path, target, sizeof(target) - 1);
        target[len > 0 ? len : 0] = 0;
        printf("  fd %d opened and not closed: %s\n", fd, target);
    }
}

int main(void)
{
    static unsigned char before[FDS], after[FDS];
    struct mem m[3] = { { .name = "cuMemAlloc" }, { .name = "pool" }, { .name = "VMM" } };
    int i, n = 0, nmem = 0, version = 0, fd0, fd1;
    char name[128] = "?";
    const char *missing;
    CUcontext ctx;
    CUdevice dev;
    CUresult rc;

    setvbuf(stdout, NULL, _IOLBF, 0);
    i = cu_load(&missing);
    if (i <= 0) {
        printf("SKIP: no GPU (%s%s)\n", i ? "libcuda.so.1 lacks " : "no libcuda.so.1: ", i ? missing : dlerror());
        return gpu_summary("bench_gpu_costs");
    }
    rc = cuInit(0);
    if (rc == CUDA_SUCCESS)
        rc = cuDeviceGetCount(&n);
    if (rc != CUDA_SUCCESS || n == 0) {
        printf("SKIP: no GPU (cuInit: %s, %d devices)\n", cu_name(rc), n);
        return gpu_summary("bench_gpu_costs");
    }
    CU(cuDeviceGet(&dev, 0));
    CU(cuDevicePrimaryCtxRetain(&ctx, dev));
    CU(cuCtxSetCurrent(ctx));
    cuDeviceGetName(name, sizeof(name), dev);
    cuDriverGetVersion(&version);
    CHECK(drc__cuda_driver() != NULL, "drc found no driver");

    CU(cuMemAlloc(&m[nmem++].p, SIZE));
    if (p_cuMemAllocAsync && p_cuMemFreeAsync && p_cuStreamSynchronize) {
        CU(cuMemAllocAsync(&m[nmem].p, SIZE, 0));
        CU(cuStreamSynchronize(0));
        nmem++;
    } else {
        printf("SKIP pool rows: the driver has no cuMemAllocAsync\n");
        m[1] = m[2];
    }
    nmem += vmm_make(&m[nmem], dev);
    for (i = 0; i < nmem; i++) {
        export_range(&m[i]);
        raw_export(&m[i], CU_MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE);   /* whatever the driver opens on first use */
    }
    fd0 = fds(before);

    printf("bench_gpu_costs: GPU 0 (%s), CUDA driver %d.%d; 64 MiB of each memory kind\n", name, version / 1000,
           version % 1000 / 10);
    printf("ns per operation: median (min - max) of %d rounds of n, after a warm-up; the caches' backend registers "
           "nothing (no NIC)\n", ROUNDS);
    printf("%-11s %-62s %10s %23s %7s\n", "memory", "operation", "median", "(min - max)", "n");
    for (i = 0; i < nmem; i++)
        rows(&m[i]);

    fd1 = fds(after);
    CHECK(fd1 == fd0, "%d fds open before the rows, %d after", fd0, fd1);
    if (fd1 != fd0)
        new_fds(before, after);
    printf("fds open: %d before the rows, %d after; exports held: %d\n", fd0, fd1, drc__cuda_exports_live());
    for (i = 0; i < nmem; i++)
        mem_free(&m[i]);
    return gpu_summary("bench_gpu_costs");
}
