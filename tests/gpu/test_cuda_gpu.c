/*
 * GPU tests of the CUDA layer (src/cuda/) through the cache, on real CUDA.
 *
 * The GPU machine has no RDMA NIC, so the registrations go to the RECORDING
 * BACKEND of the GPU programs (recbackend.h, a double) that registers
 * nothing: inside reg() it records the arguments and reads the size of the
 * dmabuf fd it was handed from /proc/self/fdinfo, so that offsets and
 * lengths are checked against what CUDA really exported. Everything on the
 * CUDA side is real: allocations, classification, VMM walks, exports, buffer
 * ids, contexts.
 */
#include <cuda.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "cuda/cuda.h"
#include "drc.h"
#include "gpu.h"
#include "recbackend.h"
#include "core/mem.h"

enum { MiB = 1 << 20 };

static int get_put(drc_cache_t *c, CUdeviceptr p, size_t len)
{
    drc_region_t *r;
    int e = drc_get(c, (void *)(uintptr_t)p, len, 0x7, &r);

    if (!e)
        drc_put(c, r);
    return e;
}

static CUcontext ctx;
static size_t page;

/* ---- cuMemAlloc, sub-ranges, unaligned requests ------------------------- */
static void test_mem_alloc(void)
{
    CUdeviceptr p;
    struct rec r;
    drc_cache_t *c = rec_cache(&r, 0);
    struct drc__mem m;
    uint64_t off;
    int e, fd;

    printf("cuMemAlloc 64 MiB, whole / sub-range / unaligned\n");
    CU(cuMemAlloc(&p, 64 * MiB));
    e = get_put(c, p, 64 * MiB);
    CHECK(e == 0, "%s", drc_strerror(e));
    CHECK(r.calls == 1 && r.a[0].type == DRC_MEM_CUDA && r.a[0].device == 0, "calls %d", r.calls);
    CHECK(r.a[0].start == p && r.a[0].len == 64 * MiB && r.a[0].dmabuf_offset == 0, "start %#lx len %zu off %lu",
          (unsigned long)r.a[0].start, r.a[0].len, (unsigned long)r.a[0].dmabuf_offset);
    CHECK(r.fd_size[0] == 64 * MiB, "fdinfo size %ld", r.fd_size[0]);
    drc_notify_free((void *)(uintptr_t)p, 64 * MiB);

    /* an unaligned request inside: the region is its page hull, in the shared export of the whole allocation */
    e = get_put(c, p + 3 * page + 100, 10000);
    CHECK(e == 0, "%s", drc_strerror(e));
    CHECK(r.calls == 2 && r.a[1].start == p + 3 * page &&
              r.a[1].len == ((100 + 10000 + page - 1) / page) * page && r.a[1].dmabuf_offset == 3 * page,
          "start +%#lx len %zu off %lu", (unsigned long)(r.a[1].start - p), r.a[1].len,
          (unsigned long)r.a[1].dmabuf_offset);
    CHECK(r.fd_size[1] == 64 * MiB, "fdinfo size %ld", r.fd_size[1]);

    /* the export itself, at an unaligned start: the whole allocation, offset start - base */
    e = drc__mem_classify(p + 5 * page + 123, 2 * page, &m);
    CHECK(e == 0 && m.type == DRC_MEM_CUDA && m.lo == p && m.hi == p + 64 * MiB, "classify %d lo %#lx hi %#lx", e,
          (unsigned long)m.lo, (unsigned long)m.hi);
    e = drc__mem_export(&m, p + 5 * page + 123, 2 * page, NULL, &fd, &off);
    CHECK(e == 0 && off == 5 * page + 123 && rec_fdinfo_size(fd) == (long)(64 * MiB), "export %d off %lu size %ld", e,
          (unsigned long)off, e ? 0 : rec_fdinfo_size(fd));
    if (!e)
        close(fd);
    /* a request running out of the allocation is refused, nothing registered */
    e = get_put(c, p + 63 * MiB, 2 * MiB);
    CHECK(e == -EFAULT && r.calls == 2, "e %d calls %d", e, r.calls);
    drc_notify_free((void *)(uintptr_t)p, 64 * MiB);
    rec_done(c);
    CU(cuMemFree(p));
}

/* ---- cuMemAllocAsync, pinned host, a small allocation, PCIe flag --------- */
static void test_other_kinds(void)
{
    CUdeviceptr p;
    void *h;
    struct rec r;
    drc_cache_t *c = rec_cache(&r, DRC_F_DMABUF_PCIE);
    int e;

    printf("cuMemAllocAsync, cuMemAllocHost, 1000-byte cuMemAlloc, DRC_F_DMABUF_PCIE\n");
    CU(cuMemAllocAsync(&p, 8 * MiB, 0));
    CU(cuCtxSynchronize());
    e = get_put(c, p, 8 * MiB);
    CHECK(e == 0 && r.calls == 1 && r.a[0].type == DRC_MEM_CUDA && r.fd_size[0] == 8 * MiB,
          "async: %s, calls %d, size %ld", drc_strerror(e), r.calls, r.fd_size[0]);
    printf("  cuMemAllocAsync exported with DRC_F_DMABUF_PCIE set (PCIe type tried, fell back): %s\n",
           e ? "no" : "yes");
    drc_notify_free((void *)(uintptr_t)p, 8 * MiB);
    CU(cuMemFreeAsync(p, 0));
    CU(cuCtxSynchronize());

    CU(cuMemAllocHost(&h, 4 * MiB));
    e = get_put(c, (CUdeviceptr)(uintptr_t)h, 4 * MiB);
    CHECK(e == 0 && r.calls == 2 && r.a[1].type == DRC_MEM_HOST && r.a[1].dmabuf_fd == -1,
          "pinned host: %s type %d", drc_strerror(e), r.a[1].type);
    drc_notify_free(h, 4 * MiB);
    CU(cuMemFreeHost(h));

    CU(cuMemAlloc(&p, 1000));
    e = get_put(c, p, 1000);
    printf("  1000-byte cuMemAlloc: %s%s (region %zu bytes, fdinfo %ld)\n", e ? "refused: " : "registered",
           e ? drc_strerror(e) : "", r.a[r.calls - 1].len, r.fd_size[r.calls - 1]);
    CHECK(e == 0 || e == -EFAULT, "%s", drc_strerror(e));
    drc_notify_free((void *)(uintptr_t)p, 1000);
    CU(cuMemFree(p));
    rec_done(c);
}

/* ---- VMM ----------------------------------------------------------------- */
struct vmm {
    CUdeviceptr va;
    size_t gran, size;
    CUmemGenericAllocationHandle h[4];
    int mapped;
};

static void vmm_make(struct vmm *v, int chunks, int mapped, int gdr)
{
    CUmemAllocationProp prop;
    CUmemAccessDesc acc;
    int i;

    memset(&prop, 0, sizeof(prop));
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    prop.allocFlags.gpuDirectRDMACapable = (unsigned char)gdr;
    CU(cuMemGetAllocationGranularity(&v->gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    v->size = v->gran * chunks;
    v->mapped = mapped;
    CU(cuMemAddressReserve(&v->va, v->size, 0, 0, 0));
    memset(&acc, 0, sizeof(acc));
    acc.location = prop.location;
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    for (i = 0; i < mapped; i++) {
        CU(cuMemCreate(&v->h[i], v->gran, &prop, 0));
        CU(cuMemMap(v->va + i * v->gran, v->gran, 0, v->h[i], 0));
        CU(cuMemSetAccess(v->va + i * v->gran, v->gran, &acc, 1));
    }
}

static void vmm_free(struct vmm *v)
{
    int i;

    drc_notify_free((void *)(uintptr_t)v->va, v->size);
    for (i = 0; i < v->mapped; i++) {
        CU(cuMemUnmap(v->va + i * v->gran, v->gran));
        CU(cuMemRelease(v->h[i]));
    }
    CU(cuMemAddressFree(v->va, v->size));
}

static void test_vmm(void)
{
    struct vmm v;
    struct rec r;
    drc_cache_t *c = rec_cache(&r, 0);
    struct drc__mem m;
    int e;

    printf("VMM: 3 chunks mapped with gpuDirectRDMACapable, 1 of 2 mapped, without the flag\n");
    vmm_make(&v, 3, 3, 1);
    e = drc__mem_classify(v.va + v.gran / 2, v.gran, &m);
    CHECK(e == 0 && m.type == DRC_MEM_CUDA && m.lo == v.va && m.hi == v.va + v.size,
          "classify %d: lo +%#lx hi +%#lx (gran %zu)", e, (unsigned long)(m.lo - v.va), (unsigned long)(m.hi - v.va),
          v.gran);
    printf("  %u chunks recorded, buffer ids %llu %llu %llu\n", m.nchunks, (unsigned long long)m.chunk[0].id,
           (unsigned long long)m.chunk[1].id, (unsigned long long)m.chunk[2].id);
    CHECK(m.nchunks == 3, "chunks recorded: %u, want 3", m.nchunks);
    /* one registration across the first two chunks, in one dmabuf: the export of the whole run of chunks */
    e = get_put(c, v.va + v.gran / 2, v.gran);
    CHECK(e == 0 && r.calls == 1 && r.a[0].start == v.va + v.gran / 2 && r.a[0].len == v.gran &&
              r.fd_size[0] == (long)v.size && r.a[0].dmabuf_offset == v.gran / 2,
          "%s calls %d size %ld", drc_strerror(e), r.calls, r.fd_size[0]);
    /* coalescing inside the run of chunks: the union, the same export */
    e = get_put(c, v.va + v.gran, 2 * v.gran);
    CHECK(e == 0 && r.calls == 2 && r.a[1].start == v.va + v.gran / 2 && r.a[1].len == 2 * v.gran + v.gran / 2 &&
              r.fd_size[1] == (long)v.size,
          "%s calls %d start +%#lx len %zu size %ld", drc_strerror(e), r.calls,
          (unsigned long)(r.a[1].start - v.va), r.a[1].len, r.fd_size[1]);
    vmm_free(&v);

    vmm_make(&v, 2, 1, 1);
    e = get_put(c, v.va, v.size);
    CHECK(e == -EFAULT && r.calls == 2, "half-mapped: %s, calls %d", drc_strerror(e), r.calls);
    e = get_put(c, v.va, v.gran);
    CHECK(e == 0 && r.calls == 3 && r.fd_size[2] == (long)v.gran, "mapped half: %s", drc_strerror(e));
    vmm_free(&v);

    vmm_make(&v, 1, 1, 0);
    e = get_put(c, v.va, v.size);
    CHECK(e == -EACCES && r.calls == 3, "no gpuDirectRDMACapable: %s, calls %d", drc_strerror(e), r.calls);
    printf("  without gpuDirectRDMACapable: %s\n", drc_strerror(e));
    vmm_free(&v);
    rec_done(c);
}

/*
 * DRC_F_VALIDATE on a region across VMM chunks (PyTorch's expandable
 * segments, issue 9 item 9): hits in every chunk keep the one registration;
 * remapping one chunk fails the check for hits in that chunk only.
 */
static void test_vmm_validate(void)
{
    struct vmm v;
    struct rec r;
    drc_cache_t *c = rec_cache(&r, DRC_F_VALIDATE);
    int i, e;

    printf("VMM + DRC_F_VALIDATE: 100 gets in 3 chunks of one region\n");
    vmm_make(&v, 3, 3, 1);
    e = get_put(c, v.va, v.size);
    for (i = 0; i < 100 && !e; i++)
        e = get_put(c, v.va + (size_t)(i % 3) * v.gran + page, page);
    CHECK(e == 0 && r.calls == 1, "%s: %d registrations for 101 gets (want 1)", drc_strerror(e), r.calls);
    printf("  %d registration(s) for 101 gets\n", r.calls);
    vmm_free(&v);
    rec_done(c);
}

/* ---- coalescing inside one allocation, never across two ----------------- */
static void test_coalesce(void)
{
    CUdeviceptr a, b;
    struct rec r;
    drc_cache_t *c = rec_cache(&r, 0);
    struct drc_stats s = { .comp_mask = DRC_STATS_ALL };
    int e;

    printf("coalescing: inside one cuMemAlloc, never across two\n");
    CU(cuMemAlloc(&a, 4 * MiB));
    CU(cuMemAlloc(&b, 4 * MiB));
    printf("  two 4 MiB allocations %s adjacent (b - a = %lld)\n", b == a + 4 * MiB ? "are" : "are not",
           (long long)(b - a));
    e = get_put(c, a, MiB);
    CHECK(e == 0, "%s", drc_strerror(e));
    e = get_put(c, a + MiB / 2, 2 * MiB);
    CHECK(e == 0 && r.calls == 2 && r.a[1].start == a && r.a[1].len == 5 * MiB / 2 &&
              r.fd_size[1] == 4 * MiB,      /* the allocation's shared export */
          "union: start +%#lx len %zu", (unsigned long)(r.a[1].start - a), r.a[1].len);
    e = get_put(c, a + 3 * MiB, MiB);
    CHECK(e == 0, "%s", drc_strerror(e));
    e = get_put(c, b, MiB);
    CHECK(e == 0 && r.calls == 4 && r.a[3].start == b && r.a[3].len == MiB, "b: start %#lx len %zu",
          (unsigned long)r.a[3].start, r.a[3].len);
    drc_cache_stats(c, &s);
    CHECK(s.merges == 1 || (s.merges == 2 && r.a[2].start == a), "merges %llu", (unsigned long long)s.merges);
    if (b == a + 4 * MiB) {
        e = get_put(c, a + 3 * MiB, 2 * MiB);
        CHECK(e == -EFAULT && r.calls == 4, "across two allocations: %s", drc_strerror(e));
    }
    drc_notify_free((void *)(uintptr_t)a, 4 * MiB);
    drc_notify_free((void *)(uintptr_t)b, 4 * MiB);
    CU(cuMemFree(a));
    CU(cuMemFree(b));
    rec_done(c);
}

/* ---- DRC_F_VALIDATE catches a free no hook saw --------------------------- */
static void test_validate(void)
{
    struct rec r, r2;
    drc_cache_t *c = rec_cache(&r, DRC_F_VALIDATE);
    drc_cache_t *plain;
    struct drc_stats s = { .comp_mask = DRC_STATS_ALL };
    struct drc__mem m1, m2;
    CUdeviceptr p, q;
    int e;

    /* a second recorder for the cache without validation */
    plain = rec_cache(&r2, 0);
    printf("DRC_F_VALIDATE: cuMemFree + cuMemAlloc behind the cache's back\n");
    CU(cuMemAlloc(&p, 32 * MiB));
    drc__mem_classify(p, 32 * MiB, &m1);
    CHECK(get_put(c, p, 32 * MiB) == 0 && get_put(plain, p, 32 * MiB) == 0, "first gets");
    CU(cuMemFree(p));   /* no drc_notify_free: a free no hook saw */
    CU(cuMemAlloc(&q, 32 * MiB));
    drc__mem_classify(q, 32 * MiB, &m2);
    printf("  realloc: %s VA, buffer id %llu -> %llu\n", q == p ? "same" : "different",
           (unsigned long long)m1.buffer_id, (unsigned long long)m2.buffer_id);
    CHECK(m1.buffer_id != m2.buffer_id, "buffer ids");
    e = get_put(c, q, 32 * MiB);
    drc_cache_stats(c, &s);
    if (q == p) {
        CHECK(e == 0 && r.calls == 2 && s.invalidated == 1 && r.fd_size[1] == 32 * MiB,
              "validate: %s regs %d invalidated %llu", drc_strerror(e), r.calls, (unsigned long long)s.invalidated);
        e = get_put(plain, q, 32 * MiB);
        CHECK(e == 0 && r2.calls == 1, "without validation the stale region is a hit: regs %d", r2.calls);
        printf("  without DRC_F_VALIDATE the stale region was returned: %s\n", r2.calls == 1 ? "yes" : "no");
    }
    drc_notify_free((void *)(uintptr_t)q, 32 * MiB);
    CU(cuMemFree(q));
    rec_done(c);
    rec_done(plain);
}

/* ---- a thread with no current context ----------------------------------- */
static CUdeviceptr thread_p;
static struct vmm thread_vmm;
static int thread_err[2];
static CUcontext thread_before, thread_after;
static drc_cache_t *thread_cache;

static void *no_ctx_thread(void *arg)
{
    (void)arg;
    cuCtxGetCurrent(&thread_before);
    thread_err[0] = get_put(thread_cache, thread_p, 2 * MiB);
    thread_err[1] = get_put(thread_cache, thread_vmm.va, thread_vmm.size);
    cuCtxGetCurrent(&thread_after);
    return NULL;
}

static void test_contexts(void)
{
    struct rec r;
    pthread_t t;

    printf("contexts: registration from a thread with no current context\n");
    thread_cache = rec_cache(&r, 0);
    CU(cuMemAlloc(&thread_p, 2 * MiB));
    vmm_make(&thread_vmm, 1, 1, 1);
    pthread_create(&t, NULL, no_ctx_thread, NULL);
    pthread_join(t, NULL);
    CHECK(thread_before == NULL, "the new thread had a context");
    CHECK(thread_err[0] == 0 && thread_err[1] == 0 && r.calls == 2 && r.fd_size[0] == 2 * MiB &&
              r.fd_size[1] == (long)thread_vmm.size,
          "cuMemAlloc: %s, VMM: %s", drc_strerror(thread_err[0]), drc_strerror(thread_err[1]));
    CHECK(thread_after == NULL, "the caller's (absent) context was not restored: %p", (void *)thread_after);
    drc_notify_free((void *)(uintptr_t)thread_p, 2 * MiB);
    CU(cuMemFree(thread_p));
    vmm_free(&thread_vmm);
    rec_done(thread_cache);
}

/* ---- the cost of a hit ---------------------------------------------------- */
static void test_hit_cost(void)
{
    unsigned flags[2] = { 0, DRC_F_VALIDATE };
    CUdeviceptr p;
    int i, k, n, bad;

    printf("cost of a hit (drc_get + drc_put of a registered 4 KiB in a 64 MiB region)\n");
    CU(cuMemAlloc(&p, 64 * MiB));
    for (k = 0; k < 2; k++) {
        struct rec r;
        drc_cache_t *c = rec_cache(&r, flags[k]);
        double t0, t1;

        n = k ? 200000 : 2000000;
        get_put(c, p, 64 * MiB);
        bad = 0;
        t0 = gpu_now_ns();
        for (i = 0; i < n; i++)
            bad += get_put(c, p + (size_t)(i % 16384) * 4096, 4096) != 0;
        t1 = gpu_now_ns();
        CHECK(bad == 0 && r.calls == 1, "hits failed %d, regs %d", bad, r.calls);
        printf("  %-16s %.1f ns per hit (%d hits)\n", k ? "DRC_F_VALIDATE" : "no validation", (t1 - t0) / n, n);
        drc_notify_free((void *)(uintptr_t)p, 64 * MiB);
        rec_done(c);
    }
    CU(cuMemFree(p));
}

/* ---- facts the code relies on --------------------------------------------- */
static void facts(void)
{
    CUmemGenericAllocationHandle h;
    CUdeviceptr p;
    CUresult rc;

    CU(cuMemAlloc(&p, 2 * MiB));
    rc = cuMemRetainAllocationHandle(&h, (void *)(uintptr_t)p);
    printf("fact: cuMemRetainAllocationHandle on cuMemAlloc memory: %s\n", rc ? "fails (not VMM)" : "succeeds");
    if (!rc)
        cuMemRelease(h);
    CU(cuMemFree(p));
}

/* ---- the shared export table (src/cuda/export.c, issue 11) ---------------- */
static size_t free_mib(void)
{
    size_t f, t;

    CU(cuMemGetInfo(&f, &t));
    return f >> 20;
}

/*
 * Two registrations of one allocation (two NICs) get the same dmabuf, whole;
 * a free announced to drc closes it before the real free, so the memory is
 * returned; a free drc does not see leaves it taken until the table drops it
 * (the control: what an fd left open costs).
 */
static void test_shared_export(void)
{
    const size_t size = 256 * MiB;
    struct drc__mem m;
    struct stat a, b;
    CUdeviceptr p;
    size_t before, after, held;
    uint64_t o1, o2;
    int e1, e2, f1 = -1, f2 = -1;

    printf("shared export: two registrations of one 256 MiB allocation, then its free\n");
    before = free_mib();
    CU(cuMemAlloc(&p, size));
    e1 = drc__mem_classify(p + 5 * page, page, &m);
    e1 = e1 ? e1 : drc__mem_export(&m, p + 5 * page, page, NULL, &f1, &o1);
    e2 = drc__mem_classify(p + 100 * MiB, page, &m);
    e2 = e2 ? e2 : drc__mem_export(&m, p + 100 * MiB, page, NULL, &f2, &o2);
    CHECK(e1 == 0 && e2 == 0, "exports: %s / %s", drc_strerror(e1), drc_strerror(e2));
    if (!e1 && !e2) {
        CHECK(fstat(f1, &a) == 0 && fstat(f2, &b) == 0 && a.st_ino == b.st_ino && a.st_dev == b.st_dev,
              "two dmabufs (inodes %lu, %lu)", (unsigned long)a.st_ino, (unsigned long)b.st_ino);
        CHECK(o1 == 5 * page && o2 == 100 * MiB && rec_fdinfo_size(f1) == (long)size, "offsets %lu %lu size %ld",
              (unsigned long)o1, (unsigned long)o2, rec_fdinfo_size(f1));
        printf("  one dmabuf (inode %lu) for both, %ld bytes, offsets %lu and %lu; exports held: %d\n",
               (unsigned long)a.st_ino, rec_fdinfo_size(f1), (unsigned long)o1, (unsigned long)o2,
               drc__cuda_exports_live());
        close(f1);
        close(f2);
    }
    drc_notify_free((void *)(uintptr_t)p, size);    /* announced: the table closes its fd */
    CHECK(drc__cuda_exports_live() == 0, "exports held after the free: %d", drc__cuda_exports_live());
    CU(cuMemFree(p));
    after = free_mib();
    printf("  free memory: %zu MiB before, %zu MiB after an announced free\n", before, after);
    CHECK(after + 4 >= before, "announced free: %zu MiB still taken", before - after);

    /* the control: a free drc does not see keeps the export, and the memory, until the table drops it */
    CU(cuMemAlloc(&p, size));
    e1 = drc__mem_classify(p, page, &m);
    e1 = e1 ? e1 : drc__mem_export(&m, p, page, NULL, &f1, &o1);
    if (!e1)
        close(f1);
    CU(cuMemFree(p));
    held = free_mib();
    drc__cuda_exports_drop(-1, (uintptr_t)p, (uintptr_t)p + size);
    after = free_mib();
    printf("  unannounced free: %zu MiB free with the export held, %zu MiB once dropped\n", held, after);
    CHECK(e1 == 0 && after + 4 >= before, "unannounced free: %s, %zu MiB still taken after the drop",
          drc_strerror(e1), before - after);
}

/* ---- stream-ordered pool memory with the PCIe mapping type (issue 23) ------ */

/* The driver's own answer to a dmabuf export of [lo, hi) with @flags (the fd closed). */
static CUresult try_export(CUdeviceptr lo, CUdeviceptr hi, unsigned long long flags)
{
    int fd = -1;
    CUresult rc = cuMemGetHandleForAddressRange(&fd, lo, hi - lo, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, flags);

    if (!rc)
        close(fd);
    return rc;
}

static const char *cu_name(CUresult rc)
{
    const char *s = "?";

    cuGetErrorName(rc, &s);
    return s;
}

/*
 * Tensors packed into the device's default pool (cuMemAllocFromPoolAsync, what cudaMallocAsync and
 * PyTorch's cudaMallocAsync backend use), registered with the PCIe mapping type asked. The driver
 * refuses a tensor's own pages whatever the type; drc exports from the pool mapping's base and must
 * ask for PCIe there too. What a user checks: either the PCIe type was given (no downgrade counted),
 * or, where the driver has no PCIe type for the device (its answer from the mapping's base, asked
 * here directly), the downgrade is counted and DRC_LOG says so.
 */
static void test_pool_pcie(void)
{
    static const size_t sizes[] = { 1000, 4096, 5000, 3 * 4096 + 100 };
    enum { N = sizeof(sizes) / sizeof(sizes[0]) };
    CUdeviceptr p[N], mbase = 0, lo, hi;
    CUmemoryPool pool;
    CUdevice dev;
    struct rec r;
    drc_cache_t *c = rec_cache(&r, DRC_F_DMABUF_PCIE);
    struct drc_stats st = { .comp_mask = DRC_STATS_ALL };
    CUresult own_pcie = CUDA_SUCCESS, own_default = CUDA_SUCCESS, base_pcie, base_default;
    char log[2048];
    int i, e, saved, mem, interior = -1;
    ssize_t n;

    printf("pool memory (cuMemAllocFromPoolAsync), registered asking for the PCIe mapping type\n");
    CU(cuCtxGetDevice(&dev));
    CU(cuDeviceGetDefaultMemPool(&pool, dev));
    for (i = 0; i < N; i++)
        CU(cuMemAllocFromPoolAsync(&p[i], sizes[i], pool, 0));
    CU(cuStreamSynchronize(0));
    for (i = 0; i < N; i++) {
        lo = p[i] & ~(CUdeviceptr)(page - 1);
        printf("  tensor %d: %zu bytes at %#llx%s\n", i, sizes[i], (unsigned long long)p[i],
               p[i] != lo ? " (its first page starts before it)" : "");
        if (p[i] != lo && interior < 0)
            interior = i;
    }
    CU(cuPointerGetAttribute(&mbase, CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR, p[N - 1]));
    /* the driver's answers, asked directly: the tensor's own pages, and from the mapping's base */
    i = interior >= 0 ? interior : N - 1;
    lo = p[i] & ~(CUdeviceptr)(page - 1);
    hi = (p[i] + sizes[i] + page - 1) & ~(CUdeviceptr)(page - 1);
    if (interior >= 0) {
        own_pcie = try_export(lo, hi, CU_MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE);
        own_default = try_export(lo, hi, 0);
        printf("  fact: tensor %d's own pages export: PCIe %s, default %s\n", i, cu_name(own_pcie),
               cu_name(own_default));
    }
    base_pcie = try_export(mbase, hi, CU_MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE);
    base_default = try_export(mbase, hi, 0);
    printf("  fact: from the mapping's base %#llx: PCIe %s, default %s\n", (unsigned long long)mbase,
           cu_name(base_pcie), cu_name(base_default));
    CHECK(base_default == CUDA_SUCCESS, "the pool mapping's base does not export: %s", cu_name(base_default));

    /* register each tensor under DRC_LOG, stderr kept to read what drc said */
    fflush(stderr);
    saved = dup(2);
    mem = memfd_create("stderr", 0);
    dup2(mem, 2);
    setenv("DRC_LOG", "info", 1);
    for (i = 0; i < N; i++) {
        e = get_put(c, p[i], sizes[i]);
        CHECK(e == 0, "tensor %d: %s", i, drc_strerror(e));
    }
    unsetenv("DRC_LOG");
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    n = pread(mem, log, sizeof(log) - 1, 0);
    log[n > 0 ? n : 0] = 0;
    close(mem);
    if (log[0])
        printf("  drc said: %s", log);
    drc_cache_stats(c, &st);
    CHECK(st.comp_mask & DRC_STATS_DMABUF_DOWNGRADED, "no dmabuf_downgraded in the stats");
    printf("  %d registrations, %llu given the default type instead of PCIe\n", r.calls,
           (unsigned long long)st.dmabuf_downgraded);
    CHECK(r.calls >= 1 && r.exported == r.calls, "calls %d, with a dmabuf %d", r.calls, r.exported);
    if (base_pcie == CUDA_SUCCESS) {
        /* the driver has the PCIe type for the pool: drc must have used it */
        CHECK(st.dmabuf_downgraded == 0, "%llu registrations downgraded where the driver takes PCIe",
              (unsigned long long)st.dmabuf_downgraded);
        CHECK(!strstr(log, "no PCIe dmabuf mapping type"), "a downgrade was logged: %s", log);
    } else {
        /* no PCIe type (e.g. NOT_SUPPORTED, as on the H200): each registration counted, said once */
        CHECK(st.dmabuf_downgraded == (uint64_t)r.calls, "downgraded %llu of %d registrations",
              (unsigned long long)st.dmabuf_downgraded, r.calls);
        CHECK(strstr(log, "drc: GPU 0: no PCIe dmabuf mapping type") != NULL, "no DRC_LOG line: \"%s\"", log);
    }
    for (i = 0; i < N; i++) {
        drc_notify_free((void *)(uintptr_t)p[i], sizes[i]);
        CU(cuMemFreeAsync(p[i], 0));
    }
    CU(cuStreamSynchronize(0));
    rec_done(c);
}

int main(void)
{
    CUdevice dev;

    setvbuf(stdout, NULL, _IOLBF, 0);
    page = (size_t)sysconf(_SC_PAGESIZE);
    CU(cuInit(0));
    CU(cuDeviceGet(&dev, 0));
    CU(cuDevicePrimaryCtxRetain(&ctx, dev));
    CU(cuCtxSetCurrent(ctx));
    CHECK(drc__cuda_driver() != NULL, "drc found no driver");
    facts();
    test_pool_pcie();      /* first: before any export teaches drc the device's PCIe support */
    test_mem_alloc();
    test_other_kinds();
    test_vmm();
    test_vmm_validate();
    test_coalesce();
    test_validate();
    test_contexts();
    test_hit_cost();
    test_shared_export();
    return gpu_summary("test_cuda_gpu");
}
