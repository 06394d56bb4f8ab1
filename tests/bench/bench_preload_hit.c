/*
 * The interposer's hit against drc_get's (issue 26): what ibv_reg_mr +
 * ibv_dereg_mr cost through the preload on memory already registered, next
 * to drc_get + drc_put on the same memory, in the same process.
 *
 * Workload: one PD of the loopback provider (the libibverbs DOUBLE,
 * build/loopnic/libibverbs.so.1; no NIC is needed: a hit never reaches it);
 * a 1 MiB buffer of host memory (mmap) and one of GPU memory (cuMemAlloc of
 * the libcuda DOUBLE, build/engine/fakecuda: no GPU is needed either, and the
 * double's answers cost what a library call and a mutex cost, not what a
 * real driver's cost). Each buffer is registered once whole (a miss: widened
 * to the allocation for local-only GPU memory), then every timed operation is
 * a hit on a 4 KiB sub-range, cycling through 16 of them:
 *   preload    ibv_reg_mr + ibv_dereg_mr through build/libdrc_verbs.so
 *              (drc_reg_mr's per-PD cache and its caller-MR table);
 *   drc_get    drc_get + drc_put on a verbs cache of the same PD
 *              (drc_cache_create_verbs), reached through the preloaded
 *              libdrc.so with dlsym, so that one copy of drc runs.
 * Access: LOCAL_WRITE (what drc_reg_mr widens; before the bounds moved into
 * the miss, each such hit asked the CUDA driver for the allocation first),
 * and LOCAL_WRITE|REMOTE_WRITE|REMOTE_READ (never widened by default).
 * ROUNDS runs of ITERS operations each, interleaved; the median, min and max
 * of the nanoseconds per operation are printed, and the ratio of medians.
 *
 * `bench_preload_hit counts host|gpu local|rw` runs each operation of that
 * row COUNT_ITERS times in functions of their own (op_preload_hit,
 * op_drc_get_hit), untimed, for callgrind:
 *   valgrind --tool=callgrind --trace-children=yes --callgrind-out-file=cg.%p \
 *       build/bench/bench_preload_hit counts gpu local
 *   callgrind_annotate --inclusive=yes cg.<pid of the child> | grep op_
 * (divide by COUNT_ITERS; tests/bench/RESULTS.md has the figures).
 *
 * The program runs itself again with the preload and the doubles
 * (DRC_TEST_BENCH_PRELOADED marks the second run). DRC_TEST_BENCH_PRELOAD=path uses
 * another build's libdrc_verbs.so (to compare two trees on the same doubles).
 * DRC_TEST_BENCH_REAL_CUDA=1 keeps the real libcuda (on a GPU machine: the
 * GPU rows are then real GPU memory and the miss a real dmabuf export; the
 * loopback provider stays, there being no NIC there; tests/gpu/engine.sh
 * runs it so, with LOOPNIC_PEERMEM=1).
 */
#include <dlfcn.h>
#include <infiniband/verbs.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "drc.h"

#define MiB (1ul << 20)
#define SUBS 16
#define ITERS 200000
#define ROUNDS 9
#define COUNT_ITERS 20000
#define RW (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)

static int (*create_verbs)(struct ibv_pd *, const struct drc_config *, drc_cache_t **);
static int (*get)(drc_cache_t *, const void *, size_t, unsigned, drc_region_t **);
static int (*put)(drc_cache_t *, drc_region_t *);
static int (*destroy)(drc_cache_t *);

static void die(const char *what)
{
    fprintf(stderr, "bench_preload_hit: %s\n", what);
    exit(1);
}

static double now(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static int real_cuda(void)
{
    const char *v = getenv("DRC_TEST_BENCH_REAL_CUDA");

    return v && strcmp(v, "0");
}

/* Once: the same program again, with the preload and the doubles. */
static void reexec_preloaded(char **argv)
{
    char exe[PATH_MAX], lib[2 * PATH_MAX + 64], pre[PATH_MAX + 64], *slash;
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);

    if (n <= 0)
        die("readlink");
    exe[n] = 0;
    slash = strrchr(exe, '/');
    if (!slash)
        die("no folder");
    *slash = 0;
    if (real_cuda())    /* the loopback provider first, the rest of the path as given (the driver's folder) */
        snprintf(lib, sizeof(lib), "%s/../loopnic%s%s", exe, getenv("LD_LIBRARY_PATH") ? ":" : "",
                 getenv("LD_LIBRARY_PATH") ? getenv("LD_LIBRARY_PATH") : "");
    else
        snprintf(lib, sizeof(lib), "%s/../loopnic:%s/../engine/fakecuda", exe, exe);
    snprintf(pre, sizeof(pre), "%s/../libdrc_verbs.so", exe);
    setenv("LD_LIBRARY_PATH", lib, 1);
    setenv("LD_PRELOAD", getenv("DRC_TEST_BENCH_PRELOAD") ? getenv("DRC_TEST_BENCH_PRELOAD") : pre, 1);
    setenv("DRC_TEST_BENCH_PRELOADED", "1", 1);
    execv("/proc/self/exe", argv);
    die("execv");
}

static char *gpu_buffer(size_t len)
{
    int (*init)(unsigned), (*dev_get)(int *, int), (*retain)(void **, int), (*set)(void *);
    int (*alloc)(unsigned long long *, size_t);
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL), *ctx = NULL;
    unsigned long long d = 0;
    int dev = 0;

    if (!h)
        die(real_cuda() ? "no libcuda.so.1" : "no libcuda.so.1 (the double: build/engine/fakecuda)");
    *(void **)&init = dlsym(h, "cuInit");
    *(void **)&dev_get = dlsym(h, "cuDeviceGet");
    *(void **)&retain = dlsym(h, "cuDevicePrimaryCtxRetain");
    *(void **)&set = dlsym(h, "cuCtxSetCurrent");
    *(void **)&alloc = dlsym(h, "cuMemAlloc_v2");
    if (!init || !dev_get || !retain || !set || !alloc || init(0) || dev_get(&dev, 0) || retain(&ctx, dev) ||
        set(ctx) || alloc(&d, len))
        die("cuMemAlloc");
    return (char *)(uintptr_t)d;
}

static struct ibv_pd *open_pd(void)
{
    struct ibv_device **list = ibv_get_device_list(NULL);
    struct ibv_context *ctx = list && list[0] ? ibv_open_device(list[0]) : NULL;
    struct ibv_pd *pd = ctx ? ibv_alloc_pd(ctx) : NULL;

    if (!pd)
        die("no PD of the loopback provider");
    ibv_free_device_list(list);
    return pd;
}

static __attribute__((noinline)) void op_preload_hit(struct ibv_pd *pd, char *buf, int access, int n)
{
    int i;

    for (i = 0; i < n; i++) {
        struct ibv_mr *mr = ibv_reg_mr(pd, buf + (size_t)(i % SUBS) * 8192 + 100, 4096, access);

        if (!mr || ibv_dereg_mr(mr))
            die("ibv_reg_mr hit");
    }
}

static __attribute__((noinline)) void op_drc_get_hit(drc_cache_t *c, char *buf, int access, int n)
{
    drc_region_t *r;
    int i;

    for (i = 0; i < n; i++) {
        if (get(c, buf + (size_t)(i % SUBS) * 8192 + 100, 4096, (unsigned)access, &r) || put(c, r))
            die("drc_get hit");
    }
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;

    return x < y ? -1 : x > y;
}

static void run(const char *mem, struct ibv_pd *pd, char *buf, int access, int counts)
{
    struct ibv_mr *whole = ibv_reg_mr(pd, buf, 1 * MiB, access);
    drc_cache_t *c;
    drc_region_t *r;
    double t[2][ROUNDS], t0;
    int k;

    if (!whole || create_verbs(pd, NULL, &c) || get(c, buf, 1 * MiB, (unsigned)access, &r))
        die("first registrations");
    if (counts) {
        op_preload_hit(pd, buf, access, COUNT_ITERS);
        op_drc_get_hit(c, buf, access, COUNT_ITERS);
    } else {
        op_preload_hit(pd, buf, access, ITERS / 10);   /* warm */
        op_drc_get_hit(c, buf, access, ITERS / 10);
        for (k = 0; k < ROUNDS; k++) {
            t0 = now();
            op_preload_hit(pd, buf, access, ITERS);
            t[0][k] = (now() - t0) / ITERS;
            t0 = now();
            op_drc_get_hit(c, buf, access, ITERS);
            t[1][k] = (now() - t0) / ITERS;
        }
        qsort(t[0], ROUNDS, sizeof(double), cmp);
        qsort(t[1], ROUNDS, sizeof(double), cmp);
        printf("%-5s %-12s %8.1f (%6.1f-%6.1f) %8.1f (%6.1f-%6.1f) %7.2f\n", mem,
               access == IBV_ACCESS_LOCAL_WRITE ? "LOCAL_WRITE" : "RW", t[0][ROUNDS / 2], t[0][0],
               t[0][ROUNDS - 1], t[1][ROUNDS / 2], t[1][0], t[1][ROUNDS - 1], t[0][ROUNDS / 2] / t[1][ROUNDS / 2]);
    }
    if (put(c, r) || destroy(c) || ibv_dereg_mr(whole))
        die("teardown");
}

/* Is the row @mem, @access the one `counts MEM local|rw` asked for (every row when timing)? */
static int wanted(int argc, char **argv, const char *mem, int access)
{
    if (argc < 2 || strcmp(argv[1], "counts"))
        return 1;
    return argc == 4 && !strcmp(argv[2], mem) && !strcmp(argv[3], access == RW ? "rw" : "local");
}

int main(int argc, char **argv)
{
    int counts = argc > 1 && !strcmp(argv[1], "counts");
    struct ibv_pd *pd;
    char *host, *gpu;

    if (!getenv("DRC_TEST_BENCH_PRELOADED"))
        reexec_preloaded(argv);
    *(void **)&create_verbs = dlsym(RTLD_DEFAULT, "drc_cache_create_verbs");
    *(void **)&get = dlsym(RTLD_DEFAULT, "drc_get");
    *(void **)&put = dlsym(RTLD_DEFAULT, "drc_put");
    *(void **)&destroy = dlsym(RTLD_DEFAULT, "drc_cache_destroy");
    if (!create_verbs || !get || !put || !destroy)
        die("the preload's libdrc.so is not loaded");
    pd = open_pd();
    host = mmap(NULL, 1 * MiB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (host == MAP_FAILED)
        die("mmap");
    memset(host, 1, 1 * MiB);
    gpu = wanted(argc, argv, "gpu", IBV_ACCESS_LOCAL_WRITE) || wanted(argc, argv, "gpu", RW) ? gpu_buffer(64 * MiB)
                                                                                           : NULL;
    if (!counts)
        printf("ns per hit (median of %d runs of %d, min-max); 4 KiB sub-ranges of a registered 1 MiB; gpu: %s\n"
               "%-5s %-12s %26s %26s %7s\n", ROUNDS, ITERS,
               real_cuda() ? "cuMemAlloc of the libcuda.so.1 found (DRC_TEST_BENCH_REAL_CUDA)"
                           : "cuMemAlloc of the CUDA double",
               "mem", "access",
               "ibv_reg_mr+dereg (preload)", "drc_get+drc_put", "ratio");
    for (int k = 0; k < 4; k++) {
        const char *mem = k < 2 ? "host" : "gpu";
        int access = k % 2 ? RW : IBV_ACCESS_LOCAL_WRITE;

        if (wanted(argc, argv, mem, access))
            run(mem, pd, k < 2 ? host : gpu, access, counts);
    }
    if (ibv_dealloc_pd(pd))
        die("ibv_dealloc_pd");
    return 0;
}
