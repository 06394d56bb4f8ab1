/*
 * A consumer-shaped benchmark (issue 5): what a transfer engine's
 * registrations cost with and without drc.
 *
 * Workload, modelled on an LLM serving engine handing its KV cache to a
 * transfer engine: one 1 GiB buffer (GPU memory where CUDA works, else host
 * memory) carved into 10,000 tensor-sized sub-buffers (sizes drawn from 4 KiB
 * to 200 KiB with a fixed seed, 512-byte aligned, back to back, as a caching
 * allocator packs them). Each is registered with ibv_reg_mr semantics: with
 * drc through drc_reg_mr (the two-line patch; libdrc_verbs.so does the same
 * calls), without drc through ibv_reg_mr itself. The access asked includes
 * REMOTE_READ/WRITE, so drc does not widen GPU registrations to their
 * allocation by default (an rkey grants only what was asked); the "drc, widen"
 * rows opt in with DRC_F_WIDEN_REMOTE (DRC_VERBS_WIDEN=always). Rounds:
 *   whole+subs   register the 1 GiB buffer, then every sub-buffer;
 *   subs only    every sub-buffer, no whole-buffer registration first;
 *   again        deregister everything and register the sub-buffers again
 *                (the next iteration of the engine).
 * For each: the MRs the NIC was asked to create, the bytes they cover, and
 * the wall time. `bench_engine host` uses host memory even where CUDA works.
 *
 * Where there is no RDMA device the program runs itself again over the
 * loopback provider, the one libibverbs DOUBLE (build/loopnic/libibverbs.so.1)
 * and, without a GPU, the libcuda DOUBLE: then the times are drc's own cost plus
 * the doubles' (no NIC pins anything), and "without drc" shows the count only —
 * a real NIC would refuse ibv_reg_mr on GPU memory without nvidia-peermem.
 */
#include <dlfcn.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "drc.h"
#include "drc_verbs.h"

#define GiB (1ull << 30)
#define NSUB 10000
#define ACCESS (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)

static size_t sub_off[NSUB], sub_len[NSUB];
static struct ibv_mr *whole_mr, *sub_mr[NSUB];
static size_t (*double_count)(int op);     /* the double's record, when it is loaded */
static size_t (*double_live)(void);
static unsigned long long (*double_bytes)(void);

static double now(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Run again over the doubles when there is no device (once: DRC_TEST_BENCH_DOUBLES marks the second run). */
static void reexec_over_doubles(char **argv)
{
    char exe[PATH_MAX], path[2 * PATH_MAX + 64], *slash;
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    int (*init)(unsigned) = NULL;

    if (n <= 0 || getenv("DRC_TEST_BENCH_DOUBLES"))
        return;
    exe[n] = 0;
    slash = strrchr(exe, '/');
    if (!slash)
        return;
    *slash = 0;
    if (cuda)
        *(void **)&init = dlsym(cuda, "cuInit");
    /* the CUDA double only where no working driver is */
    if (cuda && init && init(0) == 0)
        snprintf(path, sizeof(path), "%s/../engine", exe);
    else
        snprintf(path, sizeof(path), "%s/../loopnic:%s/../engine/fakecuda", exe, exe);
    setenv("LD_LIBRARY_PATH", path, 1);
    setenv("DRC_TEST_BENCH_DOUBLES", "1", 1);
    printf("no RDMA device: running over the loopback libibverbs double%s\n",
           strstr(path, "fakecuda") ? " and the libcuda double" : "");
    fflush(stdout);
    execv("/proc/self/exe", argv);
    perror("execv");
}

/* 1 GiB of GPU memory if CUDA works, else host memory; *gpu says which. */
static char *buffer(int *gpu, int host_only)
{
    int (*init)(unsigned), (*dev_get)(int *, int), (*retain)(void **, int), (*set)(void *);
    int (*alloc)(unsigned long long *, size_t);
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL), *ctx = NULL, *p;
    unsigned long long d = 0;
    int dev = 0;

    if (h && !host_only) {
        *(void **)&init = dlsym(h, "cuInit");
        *(void **)&dev_get = dlsym(h, "cuDeviceGet");
        *(void **)&retain = dlsym(h, "cuDevicePrimaryCtxRetain");
        *(void **)&set = dlsym(h, "cuCtxSetCurrent");
        *(void **)&alloc = dlsym(h, "cuMemAlloc_v2");
        if (init && dev_get && retain && set && alloc && init(0) == 0 && dev_get(&dev, 0) == 0 &&
            retain(&ctx, dev) == 0 && set(ctx) == 0 && alloc(&d, GiB) == 0) {
            *gpu = dlsym(h, "fakecu_exports") ? 2 : 1;
            return (char *)(uintptr_t)d;
        }
    }
    *gpu = 0;
    p = mmap(NULL, GiB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

static void layout(void)
{
    unsigned long long x = 42;
    size_t off = 0;
    int i;

    for (i = 0; i < NSUB; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        sub_len[i] = 4096 + (size_t)((x >> 33) % (196 * 1024));
        sub_off[i] = off;
        off = (off + sub_len[i] + 511) & ~(size_t)511;
    }
}

struct result {
    size_t mrs;         /* registrations the NIC was asked for */
    size_t live;        /* MRs registered at the end */
    double gib;         /* GiB the NIC was asked to register */
    double seconds;
};

static struct ibv_mr *reg(struct ibv_pd *pd, void *addr, size_t len, int with_drc)
{
    return with_drc ? drc_reg_mr(pd, addr, len, ACCESS) : ibv_reg_mr(pd, addr, len, ACCESS);
}

static int dereg(struct ibv_mr *mr, int with_drc)
{
    return with_drc ? drc_dereg_mr(mr) : ibv_dereg_mr(mr);
}

static size_t nic_regs(void)
{
    /* the double's count of ibv_reg_mr_iova2 (1) and ibv_reg_dmabuf_mr (2) calls */
    return double_count ? double_count(1) + double_count(2) : 0;
}

static int round_(struct ibv_pd *pd, char *buf, int with_drc, int with_whole, int again, struct result *r)
{
    size_t before;
    double t0;
    int i;

    unsigned long long bytes0 = double_bytes ? double_bytes() : 0;

    before = nic_regs();
    t0 = now();
    if (with_whole && !(whole_mr = reg(pd, buf, GiB, with_drc)))
        return -errno;
    for (i = 0; i < NSUB; i++)
        if (!(sub_mr[i] = reg(pd, buf + sub_off[i], sub_len[i], with_drc)))
            return -errno;
    if (again) {
        for (i = 0; i < NSUB; i++)
            dereg(sub_mr[i], with_drc);
        for (i = 0; i < NSUB; i++)
            if (!(sub_mr[i] = reg(pd, buf + sub_off[i], sub_len[i], with_drc)))
                return -errno;
    }
    r->seconds = now() - t0;
    r->mrs = nic_regs() - before;
    r->gib = double_bytes ? (double)(double_bytes() - bytes0) / (double)GiB : 0;
    r->live = double_live ? double_live() : 0;
    for (i = 0; i < NSUB; i++)
        dereg(sub_mr[i], with_drc);
    if (with_whole)
        dereg(whole_mr, with_drc);
    if (with_drc)
        drc_pd_release(pd);
    return 0;
}

int main(int argc, char **argv)
{
    static const char *const names[] = { "whole+subs", "subs only", "subs, then again" };
    static const char *const labels[] = { "ibv_reg_mr", "drc", "drc, widen" };
    struct ibv_device **list;
    struct ibv_context *ctx;
    struct ibv_pd *pd;
    struct result r = { 0, 0, 0, 0 };
    char *buf;
    int n = 0, gpu, k, with, err;

    list = ibv_get_device_list(&n);
    if (!list || n == 0) {
        reexec_over_doubles(argv);
        fprintf(stderr, "bench_engine: no RDMA device and no double\n");
        return 1;
    }
    ctx = ibv_open_device(list[0]);
    pd = ctx ? ibv_alloc_pd(ctx) : NULL;
    if (!pd) {
        fprintf(stderr, "bench_engine: cannot open %s\n", ibv_get_device_name(list[0]));
        return 1;
    }
    *(void **)&double_count = dlsym(RTLD_DEFAULT, "ibvd_count");
    *(void **)&double_live = dlsym(RTLD_DEFAULT, "ibvd_live");
    *(void **)&double_bytes = dlsym(RTLD_DEFAULT, "ibvd_reg_bytes");
    buf = buffer(&gpu, argc > 1 && !strcmp(argv[1], "host"));
    if (!buf) {
        fprintf(stderr, "bench_engine: no 1 GiB buffer\n");
        return 1;
    }
    layout();
    printf("device %s%s; 1 GiB %s buffer, %d sub-buffers of 4-200 KiB\n", ibv_get_device_name(list[0]),
           double_count ? " (loopnic double: no NIC work is timed)" : "",
           gpu == 1 ? "GPU" : gpu == 2 ? "GPU (libcuda double)" : "host", NSUB);
    printf("%-18s %-12s %9s %10s %11s %10s %16s\n", "round", "", "NIC MRs", "NIC GiB", "MRs at end", "ms",
           "us/registration");
    for (k = 0; k < 3; k++) {
        for (with = 0; with < 3; with++) {
            struct drc_config widen = { .flags = DRC_F_WIDEN_REMOTE };

            drc_reg_mr_configure(with == 2 ? &widen : NULL);
            err = round_(pd, buf, with, k == 0, k == 2, &r);
            if (err) {
                printf("%-18s %-12s failed: %s\n", names[k], labels[with], strerror(-err));
                continue;
            }
            printf("%-18s %-12s %9zu %10.2f %11zu %10.2f %16.3f\n", names[k], labels[with],
                   r.mrs, r.gib, r.live, r.seconds * 1e3,
                   r.seconds * 1e6 / (NSUB * (k == 2 ? 2 : 1) + (k == 0)));
        }
    }
    if (!double_count)
        printf("(NIC MR counts need the loopback provider's record; on a real NIC see DRC_LOG=info with libdrc_verbs.so)\n");
    ibv_dealloc_pd(pd);
    ibv_close_device(ctx);
    ibv_free_device_list(list);
    return 0;
}
