/*
 * bench_nics: the registration workloads of real engines on N NICs, with and
 * without drc in front (issue 11), through the loopback provider (src/loopnic,
 * linked in place of libibverbs) with 1, 4 and 8 devices.
 *
 * GPU memory: the real libcuda.so.1 where one loads (cuMemAlloc; loopnic then
 * moves bytes with cuMemcpy), else the CUDA double next to this program
 * (build/fakecuda: host memory standing in, fc_add). The same binary gives the
 * real-export numbers on the GPU machine.
 *
 * Without drc, the program does what an engine without a cache does: for each
 * buffer and NIC, cuMemGetHandleForAddressRange of the buffer's pages,
 * ibv_reg_dmabuf_mr, close(fd); ibv_dereg_mr when done. With drc: a verbs
 * cache per PD (drc_cache_create_verbs), drc_get/drc_put per buffer and NIC.
 *
 * Workloads (sizes scaled to this machine):
 *  kv     vLLM/SGLang KV cache: 2 x 64 layer tensors (2 MiB each) carved from 4
 *         caching-allocator blocks of 64 MiB, each registered on every NIC.
 *  churn  NIXL issue 1392 (10,000 views of 200 KB registered and deregistered in
 *         rounds), scaled: 2,000 views, 5 rounds, on every NIC (loopnic holds
 *         32,768 MRs, and drc keeps each view registered on each NIC: 16,000).
 *  kv, drc_reg_mr_multi: the kv workload again as an engine calling
 *         drc_reg_mr_multi per tensor with DRC_F_WIDEN_REMOTE.
 *  xfer   TransferQueue issue 169: per request, register, WRITE 4 KiB, deregister;
 *         2,000 requests over a working set of 64 buffers of 1 MiB, NIC = request % N.
 */
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "drc.h"
#include "drc_verbs.h"
#include "../../src/loopnic/loopnic.h"
#include "../loopnic/rcqp.h"

#define ACCESS (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)
#define MiB (1ul << 20)
enum { MAXN = 8, BLOCKS = 4, TENSORS = 128, VIEWS = 2000, ROUNDS = 5, VIEW = 200 * 1024, WSET = 64, REQS = 2000 };

/* Published per-registration costs (tests/bench/RESULTS.md, "Many NICs": where each comes from). */
static const double MR_MS = 6.0;        /* TransferQueue PR 79: ~6 ms per GPU MR (peermem) */
static const double EXPORT_US = 27.5;   /* CONSUMERS.md, H200: export + close 20-35 us */

static int (*cuInit_)(unsigned);
static int (*cuMemAlloc_)(unsigned long long *, size_t);
static int (*cuDeviceGet_)(int *, int);
static int (*cuCtxRetain_)(void **, int);
static int (*cuCtxSetCurrent_)(void *);
static int (*cuExport_)(void *, unsigned long long, size_t, int, unsigned long long);
static void *(*fc_add_)(uintptr_t, size_t, int, uint64_t);
static unsigned (*fake_exports)(void);
static int real_gpu;

static struct nic {
    struct ibv_context *ctx;
    struct ibv_pd *pd;
    struct ibv_cq *cq;
    struct ibv_qp *qa, *qb;
    char *src;
    struct ibv_mr *src_mr;
} nic[MAXN];
static int N;

static int fds_open(void)
{
    DIR *d = opendir("/proc/self/fd");
    int n = 0;

    while (d && readdir(d))
        n++;
    if (d)
        closedir(d);
    return n;
}

static double cpu_s(void)
{
    struct rusage u;

    getrusage(RUSAGE_SELF, &u);
    return u.ru_utime.tv_sec + u.ru_stime.tv_sec + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

static double now_ns(void)
{
    struct timespec t;

    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

static void die(const char *what)
{
    fprintf(stderr, "bench_nics: %s\n", what);
    exit(1);
}

static void cuda_open(void)
{
    char self[4096], path[4200];
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    void *ctx;
    int dev;

    if (!h) {   /* no driver here: the CUDA double built next to this program */
        ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);

        self[n > 0 ? n : 0] = 0;
        *strrchr(self, '/') = 0;
        snprintf(path, sizeof(path), "%s/../fakecuda/libcuda.so.1", self);
        h = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
    }
    if (!h)
        die("no libcuda.so.1 and no CUDA double");
    *(void **)&fc_add_ = dlsym(h, "fc_add");
    *(void **)&fake_exports = dlsym(h, "fakecu_exports");
    *(void **)&cuInit_ = dlsym(h, "cuInit");
    *(void **)&cuMemAlloc_ = dlsym(h, "cuMemAlloc_v2");
    *(void **)&cuDeviceGet_ = dlsym(h, "cuDeviceGet");
    *(void **)&cuCtxRetain_ = dlsym(h, "cuDevicePrimaryCtxRetain");
    *(void **)&cuCtxSetCurrent_ = dlsym(h, "cuCtxSetCurrent");
    *(void **)&cuExport_ = dlsym(h, "cuMemGetHandleForAddressRange");
    real_gpu = !fc_add_;
    if (real_gpu && (cuInit_(0) || cuDeviceGet_(&dev, 0) || cuCtxRetain_(&ctx, dev) || cuCtxSetCurrent_(ctx)))
        die("CUDA init failed");
}

/* GPU memory of @size: cuMemAlloc, or host memory the double calls device memory. */
static char *gpu_alloc(size_t size)
{
    static uint64_t id = 1000;
    unsigned long long p = 0;

    if (real_gpu) {
        if (cuMemAlloc_(&p, size))
            die("cuMemAlloc");
        return (char *)(uintptr_t)p;
    }
    void *m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED)
        die("mmap");
    fc_add_((uintptr_t)m, size, 0, id++);
    return m;
}

static void qp_up(struct ibv_qp *qp, uint32_t dest)
{
    struct rcqp_peer peer = { .qpn = dest };

    if (rcqp_connect(qp, &peer, ACCESS, 0))
        die("ibv_modify_qp");
}

static void nics_open(void)
{
    struct ibv_device **devs = ibv_get_device_list(&N);

    if (!devs || N > MAXN)
        die("devices");
    for (int i = 0; i < N; i++) {
        struct nic *x = &nic[i];
        struct ibv_qp_init_attr ia = { .qp_type = IBV_QPT_RC, .cap = { .max_send_wr = 16, .max_send_sge = 1 } };

        x->ctx = ibv_open_device(devs[i]);
        x->pd = x->ctx ? ibv_alloc_pd(x->ctx) : NULL;
        x->cq = x->ctx ? ibv_create_cq(x->ctx, 64, NULL, NULL, 0) : NULL;
        if (!x->pd || !x->cq)
            die("open");
        ia.send_cq = ia.recv_cq = x->cq;
        x->qa = ibv_create_qp(x->pd, &ia);
        x->qb = ibv_create_qp(x->pd, &ia);
        if (!x->qa || !x->qb)
            die("qp");
        qp_up(x->qa, x->qb->qp_num);
        qp_up(x->qb, x->qa->qp_num);
        x->src = aligned_alloc(4096, 4096);
        memset(x->src, 7, 4096);
        x->src_mr = ibv_reg_mr(x->pd, x->src, 4096, IBV_ACCESS_LOCAL_WRITE);
        if (!x->src_mr)
            die("src mr");
    }
}

static void write4k(struct nic *x, uintptr_t to, uint32_t rkey)
{
    struct ibv_sge sge = { (uintptr_t)x->src, 4096, x->src_mr->lkey };
    struct ibv_send_wr wr = { .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
                              .send_flags = IBV_SEND_SIGNALED }, *bad;
    struct ibv_wc wc;
    int got = 0;

    wr.wr.rdma.remote_addr = to;
    wr.wr.rdma.rkey = rkey;
    if (ibv_post_send(x->qa, &wr, &bad))
        die("post");
    while (!got)
        got = ibv_poll_cq(x->cq, 1, &wc);
    if (wc.status != IBV_WC_SUCCESS)
        die("WRITE failed");
}

/* ---- one registration, either way ---- */
struct reg {
    struct ibv_mr *mr;          /* without drc */
    drc_region_t *r;            /* with drc */
};
static drc_cache_t *cache[MAXN];
static int use_drc;
static unsigned long exports, live_bytes, peak_bytes, lookups;
static int peak_fds, base_fds;

static void reg(int n, char *p, size_t len, struct reg *out)
{
    if (use_drc) {
        if (drc_get(cache[n], p, len, ACCESS, &out->r))
            die("drc_get");
        lookups++;
        return;
    }
    int fd = -1;
    if (cuExport_(&fd, (unsigned long long)(uintptr_t)p, len, 1, 0ull))
        die("export");
    exports++;
    out->mr = ibv_reg_dmabuf_mr(nic[n].pd, 0, len, (uintptr_t)p, fd, ACCESS);
    close(fd);
    if (!out->mr)
        die("ibv_reg_dmabuf_mr");
    live_bytes += len;
    if (live_bytes > peak_bytes)
        peak_bytes = live_bytes;
}

static uint32_t rkey_of(const struct reg *g)
{
    return use_drc ? drc_region_rkey(g->r) : g->mr->rkey;
}

static void dereg(int n, struct reg *g)
{
    if (use_drc) {
        drc_put(cache[n], g->r);
        return;
    }
    live_bytes -= g->mr->length;
    ibv_dereg_mr(g->mr);
}

static void sample(void)
{
    struct loopnic_counters k;
    int f = fds_open() - base_fds;

    /* the engine's and drc's fds: not the ones the loopback NIC holds for its dmabuf MRs (the
     * kernel's MR holds its dmabuf without an fd in the process) */
    if (loopnic_get_counters(-1, &k) == 0)
        f -= (int)k.dmabuf_held;

    if (f > peak_fds)
        peak_fds = f;
    if (use_drc == 1) {
        unsigned long b = 0;

        for (int i = 0; i < N; i++) {
            struct drc_stats s = { .comp_mask = DRC_STATS_ALL };

            drc_cache_stats(cache[i], &s);
            b += s.bytes;
        }
        if (b > peak_bytes)
            peak_bytes = b;
    }
}

/* ---- the workloads ---- */
static char *blocks[BLOCKS], *views, *wset;
static struct reg kvr[TENSORS][MAXN], *churn;

static void kv(void)
{
    const size_t t = (BLOCKS * 64 * MiB) / TENSORS;

    for (int i = 0; i < TENSORS; i++)
        for (int n = 0; n < N; n++)
            reg(n, blocks[i / (TENSORS / BLOCKS)] + (i % (TENSORS / BLOCKS)) * t, t, &kvr[i][n]);
    sample();
    for (int i = 0; i < TENSORS; i++)
        for (int n = 0; n < N; n++)
            dereg(n, &kvr[i][n]);
}

static void churn_rounds(void)
{
    for (int round = 0; round < ROUNDS; round++) {
        for (int v = 0; v < VIEWS; v++)
            for (int n = 0; n < N; n++)
                reg(n, views + (size_t)v * VIEW, VIEW, &churn[v * N + n]);
        sample();
        for (int v = 0; v < VIEWS; v++)
            for (int n = 0; n < N; n++)
                dereg(n, &churn[v * N + n]);
    }
}

static void xfer(void)
{
    for (int q = 0; q < REQS; q++) {
        int n = q % N;
        char *b = wset + (size_t)(q % WSET) * MiB;
        struct reg g;

        reg(n, b, MiB, &g);
        write4k(&nic[n], (uintptr_t)b + 4096, rkey_of(&g));
        if (q == WSET)
            sample();
        dereg(n, &g);
    }
}

/*
 * kv as an engine patched to call drc_reg_mr_multi: each tensor on all NICs in
 * one call, widened to its block (DRC_F_WIDEN_REMOTE: the rkey then reaches
 * the whole block; see drc_verbs.h).
 */
static struct ibv_mr *kvm[TENSORS][MAXN];

static void kv_multi(void)
{
    const size_t t = (BLOCKS * 64 * MiB) / TENSORS;
    struct ibv_pd *pds[MAXN];

    for (int n = 0; n < N; n++)
        pds[n] = nic[n].pd;
    for (int i = 0; i < TENSORS; i++) {
        if (drc_reg_mr_multi(pds, N, blocks[i / (TENSORS / BLOCKS)] + (i % (TENSORS / BLOCKS)) * t, t, ACCESS, kvm[i]))
            die("drc_reg_mr_multi");
        lookups += N;
    }
    sample();
    for (int i = 0; i < TENSORS; i++)
        for (int n = 0; n < N; n++)
            drc_dereg_mr(kvm[i][n]);
}

/* A drc hit (get+put) on a KV tensor the kv workload left registered on NIC 0. */
static double hit_ns(void)
{
    drc_region_t *r;
    double t;
    int i;

    t = now_ns();
    for (i = 0; i < 100000; i++) {
        if (drc_get(cache[0], blocks[0] + 4096, 4096, ACCESS, &r))
            die("hit");
        drc_put(cache[0], r);
    }
    return (now_ns() - t) / i;
}

static void run(const char *name, void (*fn)(void), double hit)
{
    struct loopnic_counters k0, k1;
    unsigned long e0 = fake_exports ? fake_exports() : 0;
    double c0, cpu;

    exports = peak_bytes = live_bytes = lookups = 0;
    peak_fds = 0;
    loopnic_reset_counters();   /* forget the dmabuf inodes seen: the provider keeps 4,096 (a no-drc row fills it) */
    loopnic_get_counters(-1, &k0);
    c0 = cpu_s();
    fn();
    cpu = cpu_s() - c0;
    loopnic_get_counters(-1, &k1);
    if (use_drc)
        exports = fake_exports ? fake_exports() - e0 : k1.dmabuf_inodes - k0.dmabuf_inodes;
    unsigned long regs = k1.total_regs - k0.total_regs;
    double real_ms = regs * MR_MS + exports * EXPORT_US / 1000 + (use_drc ? lookups * hit / 1e6 : 0);
    char mib[16];

    snprintf(mib, sizeof(mib), use_drc == 2 ? "-" : "%.1f", peak_bytes / (double)MiB);
    printf("| %-5s | %d | %-7s | %7lu | %7lu | %9s | %4d | %7.3f | %10.0f |\n", name, N,
           use_drc == 2 ? "drc_reg_mr_multi, widened" : use_drc ? "drc" : "no drc", regs, exports, mib, peak_fds, cpu,
           real_ms);
    fflush(stdout);
}

static void all_workloads(void)
{
    double hit = 0;

    for (use_drc = 0; use_drc <= 1; use_drc++) {
        if (use_drc)
            for (int i = 0; i < N; i++)
                if (drc_cache_create_verbs(nic[i].pd, NULL, &cache[i]))
                    die("cache");
        run("kv", kv, hit);
        run("churn", churn_rounds, hit);
        if (use_drc)
            hit = hit_ns();
        run("xfer", xfer, hit);
        if (use_drc) {
            for (int b = 0; b < BLOCKS; b++)
                drc_notify_free(blocks[b], 64 * MiB);
            drc_notify_free(views, (size_t)VIEWS * VIEW);
            drc_notify_free(wset, WSET * MiB);
            for (int i = 0; i < N; i++)
                drc_cache_destroy(cache[i]);
            if (N == 1)
                printf("|       |   | drc hit (get+put), measured: %.1f ns |\n", hit);
        }
    }
    /* the KV cache again, as an engine calling drc_reg_mr_multi would register it */
    const struct drc_config widen = { .flags = DRC_F_WIDEN_REMOTE };

    use_drc = 2;
    if (drc_reg_mr_configure(&widen))
        die("configure");
    run("kv", kv_multi, hit);
    for (int b = 0; b < BLOCKS; b++)
        drc_notify_free(blocks[b], 64 * MiB);
    for (int n = 0; n < N; n++)
        drc_pd_release(nic[n].pd);
}

int main(int argc, char **argv)
{
    static const char *counts[] = { "1", "4", "8" };

    if (argc < 2) {
        printf("bench_nics: NIC registrations, dmabuf exports, MiB pinned and fds open at the peak, CPU s, and\n"
               "the cost on a real NIC: regs x %.0f ms + exports x %.1f us (+ drc lookups x measured hit)\n\n",
               MR_MS, EXPORT_US);
        printf("| workload | NICs | mode | NIC regs | exports | MiB pinned | fds | CPU s | real-NIC ms |\n"
               "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |\n");
        fflush(stdout);
        for (unsigned i = 0; i < 3; i++) {
            pid_t pid = fork();

            if (pid == 0) {
                setenv("LOOPNIC_DEVICES", counts[i], 1);
                execl("/proc/self/exe", argv[0], counts[i], (char *)NULL);
                _exit(127);
            }
            int st;
            if (pid < 0 || waitpid(pid, &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st))
                return 1;
        }
        return 0;
    }
    cuda_open();
    nics_open();
    base_fds = fds_open();
    churn = calloc((size_t)VIEWS * N, sizeof(*churn));
    for (int b = 0; b < BLOCKS; b++)
        blocks[b] = gpu_alloc(64 * MiB);
    views = gpu_alloc((size_t)VIEWS * VIEW);
    wset = gpu_alloc(WSET * MiB);
    all_workloads();
    return 0;
}
