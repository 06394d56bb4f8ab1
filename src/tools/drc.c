/*
 * The drc program: `drc demo` shows what drc is for: an engine-shaped workload
 * (drc-demo-engine, src/tools/demo_engine.c) on the loopback provider of the
 * build tree, straight on verbs, through drc, and through drc with its
 * invalidation off, side by side; then what the cache did on its own. `drc
 * doctor` says whether this machine can register GPU memory for RDMA, and how.
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tools/doctor.h"
#include "drc.h"

/* The demo's backend registers nothing: it counts, so the demo runs without a NIC. */
struct demo_backend {
    unsigned long live, next_key;
};

static int demo_reg(void *ctx, const struct drc_reg_args *a, void **handle, uint32_t *lkey, uint32_t *rkey)
{
    struct demo_backend *b = ctx;

    (void)a;
    b->live++;
    *handle = (void *)(uintptr_t)++b->next_key;
    *lkey = *rkey = (uint32_t)b->next_key;
    return 0;
}

static int demo_dereg(void *ctx, void *handle)
{
    struct demo_backend *b = ctx;

    (void)handle;
    b->live--;
    return 0;
}

static int check(int err, const char *what)
{
    if (err < 0) {
        fprintf(stderr, "drc demo: %s: %s\n", what, drc_strerror(err));
        exit(1);
    }
    return err;
}

static void print_stats(drc_cache_t *c, const char *when)
{
    struct drc_stats s = { .comp_mask = DRC_STATS_ALL };

    drc_cache_stats(c, &s);
    printf("%-34s hits %6llu  misses %4llu  merges %3llu  invalidated %3llu  regions %3llu  bytes %9llu\n", when,
           (unsigned long long)s.hits, (unsigned long long)s.misses, (unsigned long long)s.merges,
           (unsigned long long)s.invalidated, (unsigned long long)s.regions, (unsigned long long)s.bytes);
}

/* ---- the engine demo: drc-demo-engine run three ways on the loopback provider ---- */
enum { ASKED, NIC_REGS, DMABUF_REGS, WRS, BYTES_MOVED, VERIFIED, WRONG, STALE, NKEYS };
static const char *const keys[NKEYS] = {
    "registrations_asked", "nic_registrations", "nic_dmabuf_registrations", "work_requests", "bytes_moved",
    "bytes_verified", "bytes_wrong", "stale_uses",
};
static const char *const rows[NKEYS] = {
    "registrations the engine asked", "NIC registrations (ibv_reg_mr)", "  of which dmabuf (GPU memory)",
    "transfers (RDMA WRITE)", "bytes moved by the NIC", "bytes verified at the destination",
    "bytes of tensors that did not arrive", "stale uses (MR over freed memory)",
};

/* Run the engine with LD_LIBRARY_PATH=dir/loopnic, preload (or none) and DRC_PRELOAD=parts (or
 * unset); fill v with its "key value" lines. 0, or -1 if it did not run to the end. */
static int engine_run(const char *dir, const char *preload, const char *parts, unsigned long long *v)
{
    char path[PATH_MAX + 64], line[256], *old = getenv("LD_LIBRARY_PATH");
    int fd[2], st = 0;
    FILE *f;
    pid_t pid;

    for (int i = 0; i < NKEYS; i++)
        v[i] = 0;
    if (pipe(fd) != 0)
        return -1;
    fflush(stdout);
    pid = fork();
    if (pid == 0) {
        snprintf(path, sizeof(path), "%s/loopnic%s%s", dir, old ? ":" : "", old ? old : "");
        setenv("LD_LIBRARY_PATH", path, 1);
        if (preload) {
            snprintf(path, sizeof(path), "%s/%s", dir, preload);
            setenv("LD_PRELOAD", path, 1);
        } else {
            unsetenv("LD_PRELOAD");
        }
        if (parts)
            setenv("DRC_PRELOAD", parts, 1);
        else
            unsetenv("DRC_PRELOAD");
        unsetenv("LOOPNIC_REGISTRY");
        dup2(fd[1], 1);
        close(fd[0]);
        close(fd[1]);
        snprintf(path, sizeof(path), "%s/demo/drc-demo-engine", dir);
        execl(path, "drc-demo-engine", (char *)NULL);
        _exit(127);
    }
    close(fd[1]);
    if (pid < 0 || !(f = fdopen(fd[0], "r")))
        return -1;
    while (fgets(line, sizeof(line), f)) {
        char k[64];
        unsigned long long x;
        if (sscanf(line, "%63s %llu", k, &x) == 2)
            for (int i = 0; i < NKEYS; i++)
                if (!strcmp(k, keys[i]))
                    v[i] = x;
    }
    fclose(f);
    waitpid(pid, &st, 0);
    return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : -1;
}

/* The folder of this program, if it is the build tree's (the engine and loopnic beside it). */
static int build_tree(char *dir, size_t n)
{
    char p[PATH_MAX + 64];
    ssize_t len = readlink("/proc/self/exe", dir, n - 1);
    char *slash;

    if (len <= 0)
        return 0;
    dir[len] = 0;
    if (!(slash = strrchr(dir, '/')))
        return 0;
    *slash = 0;
    snprintf(p, sizeof(p), "%s/demo/drc-demo-engine", dir);
    if (access(p, X_OK) != 0)
        return 0;
    snprintf(p, sizeof(p), "%s/loopnic/libibverbs.so.1", dir);
    if (access(p, R_OK) != 0)
        return 0;
    snprintf(p, sizeof(p), "%s/libdrc_verbs.so", dir);
    return access(p, R_OK) == 0;
}

/* 0: drc moved every byte with no stale use, fewer registrations, and the control shows the hazard. */
static int engine_demo(const char *dir)
{
    unsigned long long v[3][NKEYS];
    int bad = 0;

    printf("An engine sends 64 tensors of 64 KiB carved from 4 buffers of 1 MiB, in 3 rounds. It\n"
           "registers each tensor before its RDMA WRITE and deregisters it after, and checks every\n"
           "byte at the destination. Before round 3 the application frees buffer 0 and gets a new\n"
           "buffer at the same address. The NIC is drc's loopback provider (build/loopnic), which\n"
           "moves the bytes and counts transfers through MRs whose memory was freed.\n\n");
    if (engine_run(dir, NULL, NULL, v[0]) || engine_run(dir, "libdrc_verbs.so", NULL, v[1]) ||
        engine_run(dir, "libdrc_verbs.so", "verbs", v[2])) {
        fprintf(stderr, "drc demo: the engine did not run to the end\n");
        return 1;
    }
    printf("%-36s %15s %15s %15s\n", "", "straight verbs", "through drc", "drc, hooks off");
    for (int i = 0; i < NKEYS; i++)
        printf("%-36s %15llu %15llu %15llu\n", rows[i], v[0][i], v[1][i], v[2][i]);
    printf("\nthrough drc      LD_PRELOAD=libdrc_verbs.so: the engine's registrations of a tensor it sent\n"
           "                 before are served from the cache; the munmap of buffer 0 reached drc first,\n"
           "                 which deregistered its MRs, so round 3 registered the new memory.\n"
           "drc, hooks off   the same with DRC_PRELOAD=verbs (no unmap hooks), the control: the cache\n"
           "                 hands back MRs of the freed buffer; a real NIC would write the freed pages\n"
           "                 and report success, the loopback provider fails the transfer and counts it.\n\n");
    bad |= v[1][STALE] != 0 || v[1][WRONG] != 0 || v[0][WRONG] != 0;
    bad |= v[1][NIC_REGS] >= v[0][NIC_REGS] || v[2][STALE] == 0;
    if (bad)
        printf("drc demo: UNEXPECTED: see the table above\n");
    return bad;
}

static int demo(void)
{
    enum { BUFS = 8, BUF_LEN = 1 << 20, MSG = 4096 };
    struct demo_backend b = { 0, 0 };
    struct drc_backend be = { .reg = demo_reg, .dereg = demo_dereg, .ctx = &b };
    drc_cache_t *c;
    drc_region_t *r;
    char *buf[BUFS];
    int i, k;

    check(drc_cache_create(&be, NULL, &c), "create");
    for (i = 0; i < BUFS; i++)
        if (!(buf[i] = aligned_alloc(4096, BUF_LEN)))
            return 1;
    /* A transfer engine sends messages out of a few large buffers: one miss per page range, then hits. */
    for (k = 0; k < 10000; k++) {
        char *p = buf[k % BUFS] + (size_t)(k * 7919 % (BUF_LEN / MSG)) * MSG;

        check(drc_get(c, p, MSG, 0x7, &r), "get");
        check(drc_put(c, r), "put");
    }
    print_stats(c, "10000 sends of 4 KiB in 8 buffers");
    /* Whole-buffer registrations overlap the per-message regions: they coalesce into one. */
    for (i = 0; i < BUFS; i++) {
        check(drc_get(c, buf[i], BUF_LEN, 0x7, &r), "get");
        check(drc_put(c, r), "put");
    }
    print_stats(c, "8 whole-buffer registrations");
    /* Freeing a buffer invalidates its region first, so a new buffer at that address is registered anew. */
    for (i = 0; i < BUFS / 2; i++) {
        check(drc_notify_free(buf[i], BUF_LEN), "notify");
        free(buf[i]);
        buf[i] = NULL;
    }
    print_stats(c, "4 buffers freed");
    printf("backend registrations alive: %lu (one per remaining buffer)\n", b.live);
    for (i = 0; i < BUFS; i++)
        free(buf[i]);
    check(drc_cache_destroy(c), "destroy");
    printf("after destroy: %lu registrations alive\n", b.live);
    return b.live != 0;
}

static const char usage_text[] =
    "usage: drc demo             an engine's RDMA transfers on drc's loopback NIC, straight on verbs and\n"
    "                            through drc, side by side (from drc's build tree: `make demo`)\n"
    "       drc doctor [--check] can this machine register GPU memory for RDMA, and how?\n"
    "                            --check: exit 1 when it cannot\n"
    "       drc --version        drc's version\n"
    "       drc --help           this text\n";

/* A mistyped command line: say what is wrong, show the usage, exit 2 (as getopt programs do). */
static int usage_error(const char *what, const char *arg)
{
    fprintf(stderr, "drc: %s '%s'\n%s", what, arg, usage_text);
    return 2;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fputs(usage_text, stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        fputs(usage_text, stdout);
        return 0;
    }
    if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "-V")) {
        printf("drc %s\n", drc_version(NULL, NULL, NULL));
        return 0;
    }
    if (!strcmp(argv[1], "demo")) {
        char dir[PATH_MAX];
        int bad = 0;

        if (argc > 2)
            return usage_error("drc demo takes no argument, not", argv[2]);
        if (build_tree(dir, sizeof(dir)))
            bad = engine_demo(dir);
        else
            printf("(The engine demo runs from drc's build tree: `make demo` there. Here, the cache alone.)\n\n");
        printf("The cache on its own (a backend that only counts):\n");
        return demo() | bad;
    }
    if (!strcmp(argv[1], "doctor")) {
        if (argc > 3 || (argc == 3 && strcmp(argv[2], "--check")))
            return usage_error("drc doctor takes only --check, not", argv[2]);
        return drc__doctor(argc - 1, argv + 1);
    }
    return usage_error("unknown command", argv[1]);
}
