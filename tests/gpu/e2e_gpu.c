/*
 * The end-to-end suite on real GPU memory (issue 10), for the GPU machine: drc's verbs cache
 * (the C API) registers cudaMalloc, cudaMallocAsync and VMM (cuMemCreate + cuMemMap) memory
 * through dmabuf on the loopback provider (build/loopnic/libibverbs.so.1 through LD_LIBRARY_PATH,
 * tests/gpu/e2e.sh), which moves bytes with cuMemcpy and tells a freed buffer by its CUDA buffer id.
 * One process, two QPs connected to each other. Also runs on a real NIC (no loopnic): then the
 * stale-use counts are not printed and the controls rely on the bytes alone.
 *
 * Per allocator:
 *   sub-buffers  an interior sub-buffer, then coalesced registrations; a WRITE into each lands
 *                there and nowhere else in the 16 pages around it (the dmabuf offset); READ back.
 *   hazard       register, transfer, free through drc's wrapper, allocate the same size (same VA
 *                measured), register, transfer: the bytes land, 0 stale uses.
 *   control      the same with the plain free (drc not told): drc hands back the old MR; the
 *                transfer must not reach the new memory, and loopnic counts > 0 stale uses.
 *                cudaMallocAsync: the pool may give back the same physical memory (same buffer
 *                id), which is no hazard: reported, not checked.
 * Then revocation (DRC_F_REVOKE), on 256 MiB of cudaMalloc whose MR the program keeps across
 * drc_cudaFree (loopnic's dmabuf MR holds the dmabuf, as a NIC's does):
 *   revoke       cudaMemGetInfo right after the free shows the 256 MiB back while the region is
 *                still held; the region reads invalid, drc_region_mr NULL; a WRITE through the
 *                old rkey completes with an error, and loopnic counts no stale use.
 *   control      the default cache: the 256 MiB stay taken until the last drc_put (measured
 *                before on this machine: 256 MiB held with an MR); the WRITE through the old rkey
 *                is a stale use on loopnic.
 * Last line: "e2e_gpu: N checks, M failed".
 */
#include <cuda.h>
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <infiniband/verbs.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/mem.h"
#include "drc.h"
#include "drc_cuda.h"
#include "drc_verbs.h"
#include "rcqp.h"
#include "gpu.h"
#include "loopnic.h"

#define ACC (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)
enum { PAGE = 4096, NP = 16, LEN = 4 << 20 };
enum kind { K_MALLOC, K_ASYNC, K_VMM, NKINDS };
static const char *const kind_name[NKINDS] = { "cudaMalloc", "cudaMallocAsync", "VMM (cuMemCreate+cuMemMap)" };

static loopnic_get_counters_fn *ln_counters;
static struct ibv_context *ctx;
static struct ibv_pd *pd;
static struct ibv_cq *cq;
static struct ibv_qp *qa, *qb;
static unsigned char *src, *host;
static struct ibv_mr *src_mr;
static drc_cache_t *cache, *cache_revoke;    /* the default, and one with DRC_F_REVOKE */
static CUdeviceptr vmm_va;                 /* the reserved range VMM allocations are mapped into */
static CUmemGenericAllocationHandle vmm_h;

static unsigned long long stale_uses(void)
{
    struct loopnic_counters c;

    if (!ln_counters || ln_counters(-1, &c) != 0)
        return 0;
    return c.stale_uses;
}

static void connect_qp(struct ibv_qp *qp, uint32_t dest)
{
    /* a real NIC (make test-hw): this port's own GID and LID, loopback through the NIC */
    struct rcqp_peer peer = { .qpn = dest };
    struct ibv_port_attr pa;
    int gid_index = getenv("E2E_GID_INDEX") ? atoi(getenv("E2E_GID_INDEX")) : 0;

    if (ibv_query_port(ctx, 1, &pa) == 0)
        peer.lid = pa.lid;
    ibv_query_gid(ctx, 1, gid_index, &peer.gid);
    peer.sgid_index = (uint8_t)gid_index;
    CHECK(rcqp_connect(qp, &peer, ACC, 0) == 0, "ibv_modify_qp: %s", strerror(errno));
}

/* One signalled WRITE (src -> gpu) or READ (gpu -> src) of n bytes; the completion's status. */
static int xfer(int write, uint64_t gpu, size_t n, uint32_t rkey)
{
    struct ibv_sge sg = { (uintptr_t)src, (uint32_t)n, src_mr->lkey };
    struct ibv_send_wr wr, *bad;
    struct ibv_wc wc;
    double t0 = gpu_now_ns();
    int got = 0;

    memset(&wr, 0, sizeof(wr));
    wr.opcode = write ? IBV_WR_RDMA_WRITE : IBV_WR_RDMA_READ;
    wr.sg_list = &sg;
    wr.num_sge = 1;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = gpu;
    wr.wr.rdma.rkey = rkey;
    if (ibv_post_send(qa, &wr, &bad))
        return -1;
    while ((got = ibv_poll_cq(cq, 1, &wc)) == 0 && gpu_now_ns() - t0 < 10e9) {}
    if (got == 1 && wc.status != IBV_WC_SUCCESS) {   /* the QPs went to error: connect them again */
        connect_qp(qa, qb->qp_num);
        connect_qp(qb, qa->qp_num);
    }
    return got == 1 ? (int)wc.status : -1;
}

static unsigned char pat(unsigned seed, size_t i)
{
    return (unsigned char)(seed * 131u + i * 7u + (i >> 12) * 13u + 1u);
}

/* The first NP pages of d: page k gets pattern 100 + k. */
static void background(CUdeviceptr d)
{
    for (size_t i = 0; i < (size_t)NP * PAGE; i++)
        host[i] = pat(100u + (unsigned)(i / PAGE), i % PAGE);
    CHECK(cudaMemcpy((void *)d, host, (size_t)NP * PAGE, cudaMemcpyHostToDevice) == cudaSuccess, "memcpy");
}

/* Pages of the first NP of d that are not as background() left them, except [off, off+n) of
 * page k, which must hold pattern seed. */
static int pages_wrong(CUdeviceptr d, int k, size_t off, size_t n, unsigned seed)
{
    int bad = 0;

    CHECK(cudaMemcpy(host, (void *)d, (size_t)NP * PAGE, cudaMemcpyDeviceToHost) == cudaSuccess, "memcpy");
    for (int p = 0; p < NP; p++) {
        int wrong = 0;
        for (size_t i = 0; i < PAGE; i++) {
            unsigned char want = pat(100u + (unsigned)p, i);
            if (p == k && i >= off && i < off + n)
                want = pat(seed, i - off);
            wrong |= host[(size_t)p * PAGE + i] != want;
        }
        bad += wrong;
    }
    return bad;
}

static CUdeviceptr alloc(enum kind k)
{
    void *p = NULL;

    switch (k) {
    case K_MALLOC:
        CHECK(cudaMalloc(&p, LEN) == cudaSuccess, "cudaMalloc");
        break;
    case K_ASYNC:
        CHECK(cudaMallocAsync(&p, LEN, 0) == cudaSuccess && cudaStreamSynchronize(0) == cudaSuccess, "cudaMallocAsync");
        break;
    case K_VMM: {
        CUmemAllocationProp prop;
        CUmemAccessDesc acc;
        memset(&prop, 0, sizeof(prop));
        prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = 0;
        prop.allocFlags.gpuDirectRDMACapable = 1;
        CU(cuMemCreate(&vmm_h, LEN, &prop, 0));
        CU(cuMemMap(vmm_va, LEN, 0, vmm_h, 0));
        memset(&acc, 0, sizeof(acc));
        acc.location = prop.location;
        acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        CU(cuMemSetAccess(vmm_va, LEN, &acc, 1));
        p = (void *)vmm_va;
        break;
    }
    case NKINDS:
        break;
    }
    return (CUdeviceptr)p;
}

/* Free d; tell drc first (its wrappers) unless told not to. */
static void release(enum kind k, CUdeviceptr d, int tell_drc)
{
    switch (k) {
    case K_MALLOC:
        CHECK((tell_drc ? drc_cudaFree((void *)d) : (int)cudaFree((void *)d)) == 0, "cudaFree");
        break;
    case K_ASYNC:
        CHECK((tell_drc ? drc_cudaFreeAsync((void *)d, 0) : (int)cudaFreeAsync((void *)d, 0)) == 0, "cudaFreeAsync");
        cudaStreamSynchronize(0);
        break;
    case K_VMM:
        /*
         * cuMemUnmap does not wait for work on the range (cudaFree does), and a
         * copy from pageable host memory (background(), the NIC model's WRITE)
         * may return before its DMA reaches the device: unmapped under it, the
         * copy faults and the context's error is sticky (every CUDA call after
         * it fails). A program synchronizes before it unmaps.
         */
        CHECK(cuCtxSynchronize() == CUDA_SUCCESS, "cuCtxSynchronize");
        CHECK((tell_drc ? drc_cuMemUnmap(d, LEN) : (int)cuMemUnmap(d, LEN)) == 0, "cuMemUnmap");
        CHECK(cuMemRelease(vmm_h) == CUDA_SUCCESS, "cuMemRelease");
        break;
    case NKINDS:
        break;
    }
}

static unsigned long long buffer_id(CUdeviceptr d)
{
    unsigned long long id = 0;

    cuPointerGetAttribute(&id, CU_POINTER_ATTRIBUTE_BUFFER_ID, d);
    return id;
}

static void fill_src(size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++)
        src[i] = pat(seed, i);
}

static void sub_buffers(enum kind k)
{
    CUdeviceptr d = alloc(k);
    drc_region_t *a, *b, *s;
    int rc;

    background(d);
    /* the first registration of the allocation: an interior sub-buffer */
    rc = drc_get(cache, (void *)(d + 5 * PAGE + 100), 1000, ACC, &s);
    CHECK(rc == 0, "%s: drc_get: %s", kind_name[k], drc_strerror(rc));
    if (rc) {   /* say which step refused: drc's classification, the export, or the NIC */
        struct drc__mem m;
        struct loopnic_counters n = { 0 };
        CUdeviceptr base = 0;
        size_t size = 0;
        int e = drc__mem_classify((uintptr_t)d + 5 * PAGE + 100, 1000, &m);
        int r = cuMemGetAddressRange(&base, &size, d);

        int fd_sub = -1, fd_all = -1, x_sub, x_all;

        /* the driver's own answer: export of the page around the request, and of the whole allocation */
        x_sub = cuMemGetHandleForAddressRange(&fd_sub, d + 5 * PAGE, PAGE, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
        x_all = cuMemGetHandleForAddressRange(&fd_all, d, LEN, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
        printf("  %s: export of one page inside: %d, of the whole allocation: %d\n", kind_name[k], x_sub, x_all);
        if (fd_sub >= 0)
            close(fd_sub);
        if (fd_all >= 0)
            close(fd_all);
        if (ln_counters)
            ln_counters(-1, &n);
        printf("  %s: classify %d (type %d, device %d, [%#lx, %#lx), %u chunks); cuMemGetAddressRange %d "
               "[%#llx +%zu]; NIC registrations refused so far %llu\n", kind_name[k], e, (int)m.type, m.device,
               (unsigned long)m.lo, (unsigned long)m.hi, m.nchunks, r, (unsigned long long)base, size,
               (unsigned long long)n.reg_failures);
        return;
    }
    fill_src(1000, 300);
    CHECK(xfer(1, d + 5 * PAGE + 100, 1000, drc_region_mr(s)->rkey) == IBV_WC_SUCCESS, "%s: WRITE", kind_name[k]);
    CHECK(pages_wrong(d, 5, 100, 1000, 300) == 0, "%s: the interior write landed elsewhere", kind_name[k]);
    memset(src, 0, 1000);
    CHECK(xfer(0, d + 5 * PAGE + 100, 1000, drc_region_mr(s)->rkey) == IBV_WC_SUCCESS, "%s: READ", kind_name[k]);
    {
        size_t bad = 0;
        for (size_t i = 0; i < 1000; i++)
            bad += src[i] != pat(300, i);
        CHECK(bad == 0, "%s: READ got %zu other bytes", kind_name[k], bad);
    }
    drc_put(cache, s);
    background(d);
    /* coalesced: pages 0-2 and 2-7, then a sub-buffer in each page */
    CHECK(drc_get(cache, (void *)d, 3 * PAGE, ACC, &a) == 0 && drc_get(cache, (void *)(d + 2 * PAGE), 6 * PAGE, ACC, &b) == 0,
          "%s: coalesced drc_get", kind_name[k]);
    for (int p = 0; p < 8; p++) {
        CUdeviceptr at = d + (CUdeviceptr)p * PAGE + 100;
        if (drc_get(cache, (void *)at, 1000, ACC, &s) != 0) {
            CHECK(0, "%s: drc_get of page %d", kind_name[k], p);
            continue;
        }
        CHECK(drc_region_mr(s)->rkey == drc_region_mr(b)->rkey, "%s: page %d not served by the coalesced MR", kind_name[k], p);
        fill_src(1000, 400u + (unsigned)p);
        CHECK(xfer(1, at, 1000, drc_region_mr(s)->rkey) == IBV_WC_SUCCESS, "%s: WRITE page %d", kind_name[k], p);
        CHECK(pages_wrong(d, p, 100, 1000, 400u + (unsigned)p) == 0, "%s: page %d: the write landed elsewhere", kind_name[k], p);
        background(d);
        drc_put(cache, s);
    }
    drc_put(cache, a);
    drc_put(cache, b);
    release(k, d, 1);
    printf("  %s: sub-buffers done\n", kind_name[k]);
}

/* register, transfer, free (told or not), allocate again, register, transfer. */
static void hazard(enum kind k, int tell_drc)
{
    CUdeviceptr d = alloc(k), d2;
    unsigned long long id1, id2, s0 = stale_uses(), stale;
    drc_region_t *r, *r2;
    uint32_t rkey1;
    int st, landed;

    background(d);
    if (drc_get(cache, (void *)d, (size_t)NP * PAGE, ACC, &r) != 0) {
        CHECK(0, "%s: drc_get", kind_name[k]);
        return;
    }
    rkey1 = drc_region_mr(r)->rkey;
    fill_src((size_t)NP * PAGE, 7);
    CHECK(xfer(1, d, (size_t)NP * PAGE, rkey1) == IBV_WC_SUCCESS, "%s: first WRITE", kind_name[k]);
    drc_put(cache, r);
    id1 = buffer_id(d);
    release(k, d, tell_drc);
    d2 = alloc(k);
    id2 = buffer_id(d2);
    if (d2 != d) {
        printf("  %s: the new allocation is at another VA (%#llx, was %#llx): hazard not exercised\n", kind_name[k],
               (unsigned long long)d2, (unsigned long long)d);
        release(k, d2, 1);
        return;
    }
    CHECK(cudaMemset((void *)d2, 0, (size_t)NP * PAGE) == cudaSuccess, "memset");
    CHECK(drc_get(cache, (void *)d2, (size_t)NP * PAGE, ACC, &r2) == 0, "%s: drc_get again", kind_name[k]);
    fill_src((size_t)NP * PAGE, 8);
    st = xfer(1, d2, (size_t)NP * PAGE, drc_region_mr(r2)->rkey);
    CHECK(cudaMemcpy(host, (void *)d2, (size_t)NP * PAGE, cudaMemcpyDeviceToHost) == cudaSuccess, "memcpy");
    landed = memcmp(host, src, (size_t)NP * PAGE) == 0;
    stale = stale_uses() - s0;
    printf("  %s, %s: same VA, buffer id %llu -> %llu, rkey %s, WRITE status %d, bytes %s, stale uses %llu%s\n",
           kind_name[k], tell_drc ? "drc told" : "control (drc not told)", id1, id2,
           drc_region_mr(r2)->rkey == rkey1 ? "the old one" : "new", st, landed ? "landed" : "did NOT land", stale,
           ln_counters ? "" : " (no loopnic: not counted)");
    if (tell_drc) {
        CHECK(drc_region_mr(r2)->rkey != rkey1, "%s: drc handed back the freed memory's MR", kind_name[k]);
        CHECK(st == IBV_WC_SUCCESS && landed, "%s: the transfer after the re-allocation did not land", kind_name[k]);
        CHECK(stale == 0, "%s: %llu stale uses with drc", kind_name[k], stale);
    } else if (id1 != id2) {   /* new memory behind the VA: the old MR maps what was freed */
        CHECK(!landed, "%s control: the bytes reached the new memory through the old MR", kind_name[k]);
        CHECK(!ln_counters || stale > 0, "%s control: loopnic counted no stale use", kind_name[k]);
    } else {
        printf("  %s control: same buffer id, the pool gave the same memory back: no hazard to see\n", kind_name[k]);
    }
    drc_put(cache, r2);
    drc_invalidate(cache, (void *)d2, LEN);
    release(k, d2, 1);
}

static long long free_mib(void)
{
    size_t fr = 0, total = 0;

    CHECK(cudaMemGetInfo(&fr, &total) == cudaSuccess, "cudaMemGetInfo");
    return (long long)(fr >> 20);
}

/* 256 MiB registered, freed through drc's wrapper while the region is held. */
static void revocation(int revoke)
{
    enum { BIG_MIB = 256 };
    const char *name = revoke ? "revoke (DRC_F_REVOKE)" : "control (no revocation)";
    drc_cache_t *c = revoke ? cache_revoke : cache;
    unsigned long long s0 = stale_uses(), stale;
    long long f1, f2, f3;
    drc_region_t *r;
    uint32_t rkey;
    void *p = NULL;
    int st;

    if (!c)
        return;
    CHECK(cudaMalloc(&p, (size_t)BIG_MIB << 20) == cudaSuccess, "%s: cudaMalloc", name);
    if (!p)
        return;
    if (drc_get(c, p, (size_t)BIG_MIB << 20, ACC, &r) != 0) {
        CHECK(0, "%s: drc_get", name);
        cudaFree(p);
        return;
    }
    rkey = drc_region_rkey(r);
    fill_src((size_t)NP * PAGE, 9);
    CHECK(xfer(1, (uintptr_t)p, (size_t)NP * PAGE, rkey) == IBV_WC_SUCCESS, "%s: WRITE before the free", name);
    f1 = free_mib();
    CHECK(drc_cudaFree(p) == 0, "%s: drc_cudaFree", name);
    f2 = free_mib();        /* right after cudaFree returned; the region is still held */
    st = xfer(1, (uintptr_t)p, (size_t)NP * PAGE, rkey);   /* the engine's stale transfer */
    stale = stale_uses() - s0;
    printf("  %s: %d MiB registered, freed with the region held: %+lld MiB free right after cudaFree (%s); "
           "region valid %d, drc_region_mr %s; WRITE through the old rkey: status %d (%s), stale uses %llu%s\n",
           name, BIG_MIB, f2 - f1, f2 - f1 >= BIG_MIB - 32 ? "back" : "still taken", drc_region_valid(r),
           drc_region_mr(r) ? "the MR" : "NULL", st, st >= 0 ? ibv_wc_status_str((enum ibv_wc_status)st) : "none",
           stale, ln_counters ? "" : " (no loopnic: not counted)");
    if (revoke) {
        CHECK(f2 - f1 >= BIG_MIB - 32, "revoke: only %lld of %d MiB back after cudaFree", f2 - f1, BIG_MIB);
        CHECK(!drc_region_valid(r) && !drc_region_mr(r), "revoke: the region is still valid or has its MR");
        CHECK(st != IBV_WC_SUCCESS, "revoke: the WRITE through the revoked rkey succeeded");
        CHECK(stale == 0, "revoke: %llu stale uses", stale);
    } else {
        CHECK(f2 - f1 < BIG_MIB / 2, "control: %lld MiB back with the MR held: this machine does not show the "
              "hazard (the revoke check proves nothing here)", f2 - f1);
        CHECK(!ln_counters || stale > 0, "control: loopnic counted no stale use");
    }
    CHECK(drc_put(c, r) == 0, "%s: drc_put", name);
    f3 = free_mib();
    printf("  %s: after the last drc_put: %+lld MiB free (from before the free)\n", name, f3 - f1);
}

int main(void)
{
    struct ibv_device **devs;
    struct ibv_qp_init_attr ia;
    int n = 0, dev_attr = 0;
    size_t gran = 0;
    CUmemAllocationProp prop;

    ln_counters = (loopnic_get_counters_fn *)dlsym(RTLD_DEFAULT, "loopnic_get_counters");
    printf("e2e_gpu: NIC %s\n", ln_counters ? "loopnic (loopback provider)" : "the system's libibverbs");
    CHECK(cudaSetDevice(0) == cudaSuccess && cudaFree(0) == cudaSuccess, "CUDA context");
    if (!(devs = ibv_get_device_list(&n)) || n < 1) {
        printf("e2e_gpu: no RDMA device (run with LD_LIBRARY_PATH=build/loopnic)\n");
        return gpu_summary("e2e_gpu") || 1;
    }
    ctx = ibv_open_device(devs[0]);
    pd = ctx ? ibv_alloc_pd(ctx) : NULL;
    cq = pd ? ibv_create_cq(ctx, 64, NULL, NULL, 0) : NULL;
    memset(&ia, 0, sizeof(ia));
    ia.send_cq = ia.recv_cq = cq;
    ia.qp_type = IBV_QPT_RC;
    ia.cap.max_send_wr = 16;
    ia.cap.max_send_sge = 1;
    qa = cq ? ibv_create_qp(pd, &ia) : NULL;
    qb = qa ? ibv_create_qp(pd, &ia) : NULL;
    CHECK(qb != NULL, "verbs setup");
    if (!qb)
        return gpu_summary("e2e_gpu");
    connect_qp(qa, qb->qp_num);
    connect_qp(qb, qa->qp_num);
    src = aligned_alloc(PAGE, (size_t)NP * PAGE);
    host = aligned_alloc(PAGE, (size_t)NP * PAGE);
    src_mr = ibv_reg_mr(pd, src, (size_t)NP * PAGE, IBV_ACCESS_LOCAL_WRITE);
    CHECK(src && host && src_mr, "host buffers");
    CHECK(drc_cache_create_verbs(pd, NULL, &cache) == 0, "drc_cache_create_verbs");
    {
        struct drc_config rv = { .flags = DRC_F_REVOKE };
        CHECK(drc_cache_create_verbs(pd, &rv, &cache_revoke) == 0, "drc_cache_create_verbs (DRC_F_REVOKE)");
    }
    if (!src_mr || !cache)
        return gpu_summary("e2e_gpu");
    /* VMM: a reserved range, so that a new allocation maps at the same VA */
    memset(&prop, 0, sizeof(prop));
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    CU(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    CU(cuMemAddressReserve(&vmm_va, LEN, 0, 0, 0));
    cuDeviceGetAttribute(&dev_attr, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED, 0);
    printf("e2e_gpu: VMM granularity %zu, GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED %d\n", gran, dev_attr);
    for (int k = 0; k < NKINDS; k++) {
        printf("== %s\n", kind_name[k]);
        sub_buffers((enum kind)k);
        hazard((enum kind)k, 1);
        hazard((enum kind)k, 0);
    }
    printf("== revocation: an MR held across cudaFree\n");
    revocation(1);
    revocation(0);
    CHECK(drc_cache_destroy(cache) == 0, "drc_cache_destroy");
    CHECK(!cache_revoke || drc_cache_destroy(cache_revoke) == 0, "drc_cache_destroy (DRC_F_REVOKE)");
    ibv_dereg_mr(src_mr);
    cuMemAddressFree(vmm_va, LEN);
    ibv_destroy_qp(qa);
    ibv_destroy_qp(qb);
    ibv_destroy_cq(cq);
    CHECK(ibv_dealloc_pd(pd) == 0, "ibv_dealloc_pd: MRs left");
    ibv_close_device(ctx);
    ibv_free_device_list(devs);
    return gpu_summary("e2e_gpu");
}
