/*
 * drc against UCX's ucs_rcache, side by side in one run (issue 2, "Benchmark").
 *
 * Both caches sit in front of a backend that does no real work, so what is
 * timed is the cache itself: lookup, reference counting, locking, insert and
 * removal. UCX memory events are off (ucm_events = 0): with UCX 1.13.1 that
 * is the only way to create an rcache that does not hook munmap, and it makes
 * the two caches comparable (drc hooks nothing either).
 *
 * Workload: regions of 64 KiB at a 128 KiB stride inside address space
 * reserved with PROT_NONE (neither cache touches the memory, but UCX may
 * read /proc/self/maps for merges, so the ranges are real mappings), 1,000,000
 * operations per measurement, the median of 5 runs. drc and UCX run one after
 * the other inside each run, on the same index sequences.
 *
 * Rows:
 *   hit        get + put of a cached region, indices in random order.
 *   2 threads  both threads hit at once (1,024 regions), each its own random
 *              sequence; ns per operation per thread, and the throughput of
 *              the pair against one thread's. "same regions": both threads
 *              draw from all 1,024 regions, so a region's reference count
 *              moves between the cores' caches; "own halves": each thread
 *              draws from its own 512, so only what the cache itself shares
 *              between readers (a lock, a counter) can slow the pair down.
 *   miss       get + put of a range not cached, into a cache that grows from
 *              empty to 65,536 regions (then is recreated, untimed).
 *   invalidate one region by address range, the cache holding 1,024 or
 *              65,536 regions: an eighth of them, in random order, is
 *              invalidated (timed), then registered again (untimed).
 *              drc: drc_invalidate(addr, len). UCX has no range invalidation
 *              without memory events, so its row is what a user of the public
 *              API does: ucs_rcache_get (find the region) +
 *              ucs_rcache_region_invalidate + ucs_rcache_region_put (which
 *              deregisters it).
 *   notify     drc_notify_free() of a 64 KiB range where no region is: with
 *              no cache at all, with one empty cache, and with 10,000 regions
 *              of another cache outside the range's neighbourhood (beyond the
 *              cache's hull) or around it (in a gap between two regions).
 *              UCX has no such call.
 *
 * Each measurement is checked for doing what it claims (hits register
 * nothing, misses register each time, invalidations find their region); a
 * failed check prints a line and the exit status is 1. Timings are reported
 * against the targets but never fail the program.
 */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <ucs/memory/rcache.h>

#include "drc.h"

enum {
    REGION   = 64 << 10,
    STRIDE   = 128 << 10,
    OPS      = 1000000,
    RUNS     = 5,
    SMALL    = 1024,
    LARGE    = 65536,
    ELSEWHERE = 10000,    /* regions of the "registered elsewhere" notify rows */
    MAX_SLOTS = LARGE,    /* the reserved arena holds this many strides */
};

static char *arena;       /* MAX_SLOTS * STRIDE bytes of reserved address space */
static int failed;

#define CHECK(cond, ...)                                   \
    do {                                                   \
        if (!(cond)) {                                     \
            fprintf(stderr, "bench_cache: check failed: "); \
            fprintf(stderr, __VA_ARGS__);                  \
            fputc('\n', stderr);                           \
            failed = 1;                                    \
        }                                                  \
    } while (0)

static void *slot_addr(uint32_t i)
{
    return arena + (size_t)i * STRIDE;
}

static uint64_t now_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rng(void)
{
    /* xorshift64*: enough for index sequences, the same on every machine */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545f4914f6cdd1dull;
}

static uint32_t *random_seq(size_t count, uint32_t n)
{
    uint32_t *s = malloc(count * sizeof(*s));
    size_t i;

    if (!s) {
        perror("malloc");
        exit(2);
    }
    for (i = 0; i < count; i++)
        s[i] = (uint32_t)(rng() % n);
    return s;
}

static void shuffle(uint32_t *a, uint32_t n)
{
    uint32_t i, j, t;

    for (i = n - 1; i > 0; i--) {
        j = (uint32_t)(rng() % (i + 1));
        t = a[i];
        a[i] = a[j];
        a[j] = t;
    }
}

/* ---- the two caches behind one small interface -------------------------- */

/* Backend calls, counted so each measurement can be checked. */
static uint64_t drc_regs, drc_deregs, ucx_regs, ucx_deregs;

static int noop_reg(void *ctx, const struct drc_reg_args *a, void **handle, uint32_t *lkey, uint32_t *rkey)
{
    (void)ctx;
    __atomic_fetch_add(&drc_regs, 1, __ATOMIC_RELAXED);
    *handle = (void *)a->start;
    *lkey = *rkey = 1;
    return 0;
}

static int noop_dereg(void *ctx, void *handle)
{
    (void)ctx;
    (void)handle;
    __atomic_fetch_add(&drc_deregs, 1, __ATOMIC_RELAXED);
    return 0;
}

static const struct drc_backend noop_backend = { .reg = noop_reg, .dereg = noop_dereg, .ctx = NULL };

static ucs_status_t ucx_mem_reg(void *ctx, ucs_rcache_t *rc, void *arg, ucs_rcache_region_t *r, uint16_t flags)
{
    (void)ctx; (void)rc; (void)arg; (void)r; (void)flags;
    __atomic_fetch_add(&ucx_regs, 1, __ATOMIC_RELAXED);
    return UCS_OK;
}

static void ucx_mem_dereg(void *ctx, ucs_rcache_t *rc, ucs_rcache_region_t *r)
{
    (void)ctx; (void)rc; (void)r;
    __atomic_fetch_add(&ucx_deregs, 1, __ATOMIC_RELAXED);
}

static void ucx_dump(void *ctx, ucs_rcache_t *rc, ucs_rcache_region_t *r, char *buf, size_t max)
{
    (void)ctx; (void)rc; (void)r;
    if (max)
        buf[0] = '\0';
}

static const ucs_rcache_ops_t ucx_ops = { .mem_reg = ucx_mem_reg, .mem_dereg = ucx_mem_dereg, .dump_region = ucx_dump };

static void ucx_inv_done(void *arg)
{
    (void)arg;
}

#define UCX_PROT (PROT_READ | PROT_WRITE)
#define DRC_ACCESS 0x7u    /* LOCAL_WRITE | REMOTE_WRITE | REMOTE_READ */

static drc_cache_t *drc_new(void)
{
    drc_cache_t *c;
    int err = drc_cache_create(&noop_backend, NULL, &c);

    if (err) {
        fprintf(stderr, "drc_cache_create: %s\n", drc_strerror(err));
        exit(2);
    }
    return c;
}

static void drc_free(drc_cache_t *c)
{
    int err = drc_cache_destroy(c);

    CHECK(!err, "drc_cache_destroy: %s", drc_strerror(err));
}

static ucs_rcache_t *ucx_new(void)
{
    ucs_rcache_params_t p;
    ucs_rcache_t *rc;
    ucs_status_t st;

    memset(&p, 0, sizeof(p));
    p.region_struct_size = sizeof(ucs_rcache_region_t);
    p.alignment = (size_t)sysconf(_SC_PAGESIZE);
    p.max_alignment = p.alignment;
    p.ucm_events = 0;       /* memory events off: nothing hooks munmap */
    p.ucm_event_priority = 1000;
    p.ops = &ucx_ops;
    p.context = NULL;
    p.flags = 0;
    p.max_regions = ULONG_MAX;
    p.max_size = SIZE_MAX;
    p.max_unreleased = SIZE_MAX;
    st = ucs_rcache_create(&p, "bench", NULL, &rc);
    if (st != UCS_OK) {
        fprintf(stderr, "ucs_rcache_create: %s\n", ucs_status_string(st));
        exit(2);
    }
    return rc;
}

/* One get + put; these are what every row below is made of. */
static inline void drc_getput(drc_cache_t *c, uint32_t i)
{
    drc_region_t *r;

    if (drc_get(c, slot_addr(i), REGION, DRC_ACCESS, &r) == 0)
        drc_put(c, r);
    else
        failed = 1;
}

static inline void ucx_getput(ucs_rcache_t *rc, uint32_t i)
{
    ucs_rcache_region_t *r;

    if (ucs_rcache_get(rc, slot_addr(i), REGION, UCX_PROT, NULL, &r) == UCS_OK)
        ucs_rcache_region_put(rc, r);
    else
        failed = 1;
}

static inline int drc_inval(drc_cache_t *c, uint32_t i)
{
    return drc_invalidate(c, slot_addr(i), REGION);
}

static inline int ucx_inval(ucs_rcache_t *rc, uint32_t i)
{
    ucs_rcache_region_t *r;

    if (ucs_rcache_get(rc, slot_addr(i), REGION, UCX_PROT, NULL, &r) != UCS_OK)
        return 0;
    ucs_rcache_region_invalidate(rc, r, ucx_inv_done, NULL);
    ucs_rcache_region_put(rc, r);
    return 1;
}

/* ---- measurements: each returns ns per operation ------------------------ */

#define FILL(getput, c, n)                  \
    do {                                    \
        uint32_t i_;                        \
        for (i_ = 0; i_ < (n); i_++)        \
            getput(c, i_);                  \
    } while (0)

/* Hits: OPS get+put on cached regions following @seq. */
#define HIT_LOOP(getput, c, seq, ns_out)                      \
    do {                                                      \
        uint64_t t0_;                                         \
        size_t k_;                                            \
        for (k_ = 0; k_ < OPS / 10; k_++) /* warm up */        \
            getput(c, (seq)[k_]);                             \
        t0_ = now_ns();                                       \
        for (k_ = 0; k_ < OPS; k_++)                          \
            getput(c, (seq)[k_]);                             \
        (ns_out) = (double)(now_ns() - t0_) / OPS;            \
    } while (0)

/*
 * Invalidations: rounds of n/8 distinct regions in random order, timed, each
 * then registered again untimed, until OPS regions have been invalidated.
 */
#define INVAL_LOOP(inval, getput, c, n, perm, ns_out, found_out) \
    do {                                                         \
        uint64_t total_ = 0, t0_;                                \
        uint32_t batch_ = (n) / 8, j_;                           \
        size_t done_ = 0;                                        \
        long found_ = 0;                                         \
        while (done_ < OPS) {                                    \
            shuffle(perm, n);                                    \
            t0_ = now_ns();                                      \
            for (j_ = 0; j_ < batch_; j_++)                      \
                found_ += inval(c, (perm)[j_]);                  \
            total_ += now_ns() - t0_;                            \
            for (j_ = 0; j_ < batch_; j_++)                      \
                getput(c, (perm)[j_]);                           \
            done_ += batch_;                                     \
        }                                                        \
        (ns_out) = (double)total_ / (double)done_;               \
        (found_out) = found_ == (long)done_;                     \
    } while (0)

static double drc_hit(drc_cache_t *c, const uint32_t *seq)
{
    uint64_t regs = drc_regs;
    double ns;

    HIT_LOOP(drc_getput, c, seq, ns);
    CHECK(drc_regs == regs, "drc: a hit registered (%llu times)", (unsigned long long)(drc_regs - regs));
    return ns;
}

static double ucx_hit(ucs_rcache_t *rc, const uint32_t *seq)
{
    uint64_t regs = ucx_regs;
    double ns;

    HIT_LOOP(ucx_getput, rc, seq, ns);
    CHECK(ucx_regs == regs, "ucx: a hit registered (%llu times)", (unsigned long long)(ucx_regs - regs));
    return ns;
}

static double drc_inval_bench(drc_cache_t *c, uint32_t n, uint32_t *perm)
{
    double ns;
    int ok;

    INVAL_LOOP(drc_inval, drc_getput, c, n, perm, ns, ok);
    CHECK(ok, "drc: an invalidation did not find its region");
    return ns;
}

static double ucx_inval_bench(ucs_rcache_t *rc, uint32_t n, uint32_t *perm)
{
    double ns;
    int ok;

    INVAL_LOOP(ucx_inval, ucx_getput, rc, n, perm, ns, ok);
    CHECK(ok, "ucx: an invalidation did not find its region");
    return ns;
}

/* Misses: rounds that fill a new cache from empty to LARGE regions. */
static double drc_miss(void)
{
    uint64_t total = 0, t0, regs = drc_regs;
    size_t done = 0;
    drc_cache_t *c;
    uint32_t i;

    while (done < OPS) {
        uint32_t n = OPS - done < LARGE ? (uint32_t)(OPS - done) : LARGE;

        c = drc_new();
        t0 = now_ns();
        for (i = 0; i < n; i++)
            drc_getput(c, i);
        total += now_ns() - t0;
        drc_free(c);
        done += n;
    }
    CHECK(drc_regs - regs == OPS, "drc: %llu registrations for %d misses",
          (unsigned long long)(drc_regs - regs), OPS);
    return (double)total / OPS;
}

static double ucx_miss(void)
{
    uint64_t total = 0, t0, regs = ucx_regs;
    size_t done = 0;
    ucs_rcache_t *rc;
    uint32_t i;

    while (done < OPS) {
        uint32_t n = OPS - done < LARGE ? (uint32_t)(OPS - done) : LARGE;

        rc = ucx_new();
        t0 = now_ns();
        for (i = 0; i < n; i++)
            ucx_getput(rc, i);
        total += now_ns() - t0;
        ucs_rcache_destroy(rc);
        done += n;
    }
    CHECK(ucx_regs - regs == OPS, "ucx: %llu registrations for %d misses",
          (unsigned long long)(ucx_regs - regs), OPS);
    return (double)total / OPS;
}

/* Two threads hitting one cache at once. */
struct pair {
    pthread_barrier_t go;
    drc_cache_t *dc;
    ucs_rcache_t *uc;
    const uint32_t *seq[2];
    double ns[2];
};

struct pair_arg {
    struct pair *p;
    int id;
};

static void *pair_thread(void *arg)
{
    struct pair_arg *a = arg;
    struct pair *p = a->p;

    pthread_barrier_wait(&p->go);
    if (p->dc)
        HIT_LOOP(drc_getput, p->dc, p->seq[a->id], p->ns[a->id]);
    else
        HIT_LOOP(ucx_getput, p->uc, p->seq[a->id], p->ns[a->id]);
    return NULL;
}

/* ns per operation per thread (the slower thread's), both threads running. */
static double two_threads(drc_cache_t *dc, ucs_rcache_t *uc, const uint32_t *s0, const uint32_t *s1)
{
    struct pair p = { .dc = dc, .uc = uc, .seq = { s0, s1 } };
    struct pair_arg a[2] = { { &p, 0 }, { &p, 1 } };
    pthread_t t[2];
    int i;

    pthread_barrier_init(&p.go, NULL, 2);
    for (i = 0; i < 2; i++)
        if (pthread_create(&t[i], NULL, pair_thread, &a[i])) {
            perror("pthread_create");
            exit(2);
        }
    for (i = 0; i < 2; i++)
        pthread_join(t[i], NULL);
    pthread_barrier_destroy(&p.go);
    return p.ns[0] > p.ns[1] ? p.ns[0] : p.ns[1];
}

/* drc_notify_free of a range with no region in it, OPS times. */
static double notify_bench(const void *addr)
{
    uint64_t t0;
    long found = 0;
    size_t k;

    for (k = 0; k < OPS / 10; k++)
        found += drc_notify_free(addr, REGION);
    t0 = now_ns();
    for (k = 0; k < OPS; k++)
        found += drc_notify_free(addr, REGION);
    t0 = now_ns() - t0;
    CHECK(found == 0, "drc_notify_free invalidated %ld regions where none was", found);
    return (double)t0 / OPS;
}

/* ---- the table ---------------------------------------------------------- */

enum row {
    HIT_SMALL, HIT_LARGE, HIT_PAIR, PAIR_SCALING, HIT_OWN, OWN_SCALING, MISS, INV_SMALL, INV_LARGE,
    NOTIFY_NONE, NOTIFY_EMPTY, NOTIFY_FAR, NOTIFY_GAP, ROWS
};

static const struct {
    const char *name;
    double target;      /* drc's target from the issues; 0: none */
    int at_least;       /* the target is a minimum (scaling), not a maximum */
} rows[ROWS] = {
    [HIT_SMALL]    = { "hit get+put, 1,024 regions",          25, 0 },
    [HIT_LARGE]    = { "hit get+put, 65,536 regions",         120, 0 },
    [HIT_PAIR]     = { "hit, 2 threads, same regions",        0, 0 },
    [PAIR_SCALING] = { "  2-thread throughput / 1 thread (x)", 1.6, 1 },
    [HIT_OWN]      = { "hit, 2 threads, own halves",          0, 0 },
    [OWN_SCALING]  = { "  2-thread throughput / 1 thread (x)", 1.6, 1 },
    [MISS]         = { "miss+insert get+put, 0..65,536",      400, 0 },
    [INV_SMALL]    = { "invalidate 1 region, 1,024 regions",  200, 0 },
    [INV_LARGE]    = { "invalidate 1 region, 65,536 regions", 200, 0 },
    [NOTIFY_NONE]  = { "drc_notify_free, no cache",           50, 0 },
    [NOTIFY_EMPTY] = { "drc_notify_free, 1 empty cache",      50, 0 },
    [NOTIFY_FAR]   = { "notify_free, 10,000 regions, far",    50, 0 },
    [NOTIFY_GAP]   = { "notify_free, 10,000 regions, in gap", 50, 0 },
};

static double drc_ns[ROWS][RUNS], ucx_ns[ROWS][RUNS];

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;

    return (x > y) - (x < y);
}

static double median(double *v)
{
    double s[RUNS];

    memcpy(s, v, sizeof(s));
    qsort(s, RUNS, sizeof(s[0]), cmp_double);
    return s[RUNS / 2];
}

static void one_run(int run, const uint32_t *seq_small, const uint32_t *seq_small2, const uint32_t *seq_half[2],
                    const uint32_t *seq_large, uint32_t *perm)
{
    drc_cache_t *dc, *other;
    ucs_rcache_t *uc;
    uint32_t i;

    /* 1,024 regions: hit, two threads, invalidate */
    dc = drc_new();
    FILL(drc_getput, dc, SMALL);
    drc_ns[HIT_SMALL][run] = drc_hit(dc, seq_small);
    drc_ns[HIT_PAIR][run] = two_threads(dc, NULL, seq_small, seq_small2);
    drc_ns[HIT_OWN][run] = two_threads(dc, NULL, seq_half[0], seq_half[1]);
    for (i = 0; i < SMALL; i++)
        perm[i] = i;
    drc_ns[INV_SMALL][run] = drc_inval_bench(dc, SMALL, perm);
    drc_free(dc);

    uc = ucx_new();
    FILL(ucx_getput, uc, SMALL);
    ucx_ns[HIT_SMALL][run] = ucx_hit(uc, seq_small);
    ucx_ns[HIT_PAIR][run] = two_threads(NULL, uc, seq_small, seq_small2);
    ucx_ns[HIT_OWN][run] = two_threads(NULL, uc, seq_half[0], seq_half[1]);
    for (i = 0; i < SMALL; i++)
        perm[i] = i;
    ucx_ns[INV_SMALL][run] = ucx_inval_bench(uc, SMALL, perm);
    ucs_rcache_destroy(uc);

    drc_ns[PAIR_SCALING][run] = 2 * drc_ns[HIT_SMALL][run] / drc_ns[HIT_PAIR][run];
    ucx_ns[PAIR_SCALING][run] = 2 * ucx_ns[HIT_SMALL][run] / ucx_ns[HIT_PAIR][run];
    drc_ns[OWN_SCALING][run] = 2 * drc_ns[HIT_SMALL][run] / drc_ns[HIT_OWN][run];
    ucx_ns[OWN_SCALING][run] = 2 * ucx_ns[HIT_SMALL][run] / ucx_ns[HIT_OWN][run];

    /* 65,536 regions: hit, invalidate */
    dc = drc_new();
    FILL(drc_getput, dc, LARGE);
    drc_ns[HIT_LARGE][run] = drc_hit(dc, seq_large);
    for (i = 0; i < LARGE; i++)
        perm[i] = i;
    drc_ns[INV_LARGE][run] = drc_inval_bench(dc, LARGE, perm);
    drc_free(dc);

    uc = ucx_new();
    FILL(ucx_getput, uc, LARGE);
    ucx_ns[HIT_LARGE][run] = ucx_hit(uc, seq_large);
    for (i = 0; i < LARGE; i++)
        perm[i] = i;
    ucx_ns[INV_LARGE][run] = ucx_inval_bench(uc, LARGE, perm);
    ucs_rcache_destroy(uc);

    /* misses */
    drc_ns[MISS][run] = drc_miss();
    ucx_ns[MISS][run] = ucx_miss();

    /* drc_notify_free: no drc cache is alive here */
    drc_ns[NOTIFY_NONE][run] = notify_bench(slot_addr(0));
    dc = drc_new();
    drc_ns[NOTIFY_EMPTY][run] = notify_bench(slot_addr(0));
    /* 10,000 regions in slots [0, ELSEWHERE) of another cache; the frees hit
     * the far end of the arena, or the gap after slot 5,000 */
    other = drc_new();
    FILL(drc_getput, other, ELSEWHERE);
    drc_ns[NOTIFY_FAR][run] = notify_bench(slot_addr(MAX_SLOTS - 1));
    drc_ns[NOTIFY_GAP][run] = notify_bench((char *)slot_addr(ELSEWHERE / 2) + REGION);
    drc_free(other);
    drc_free(dc);
    for (i = NOTIFY_NONE; i <= NOTIFY_GAP; i++)
        ucx_ns[i][run] = 0;   /* UCX has no such call */
}

static void print_table(void)
{
    int i;

    printf("\n%-40s %9s %9s %9s   %s\n", "operation (ns/op, median of 5)", "drc", "UCX", "UCX/drc", "drc target");
    for (i = 0; i < ROWS; i++) {
        double d = median(drc_ns[i]), u = median(ucx_ns[i]);
        char target[32] = "";

        if (rows[i].target) {
            int met = rows[i].at_least ? d >= rows[i].target : d <= rows[i].target;

            snprintf(target, sizeof(target), "%s %g%s", rows[i].at_least ? ">=" : "<=", rows[i].target,
                     met ? "  met" : "  MISSED");
        }
        if (i == PAIR_SCALING || i == OWN_SCALING)
            printf("%-40s %8.2fx %8.2fx %9s   %s\n", rows[i].name, d, u, "", target);
        else if (u > 0)
            printf("%-40s %9.1f %9.1f %8.2fx   %s\n", rows[i].name, d, u, u / d, target);
        else
            printf("%-40s %9.1f %9s %9s   %s\n", rows[i].name, d, "-", "", target);
    }
}

int main(void)
{
    uint32_t *seq_small, *seq_small2, *seq_large, *perm, *half[2];
    const uint32_t *seq_half[2];
    uint64_t t0 = now_ns();
    size_t k;
    int run;

    /* PROT_NONE, MAP_NORESERVE: address space only, no memory behind it */
    arena = mmap(NULL, (size_t)MAX_SLOTS * STRIDE, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (arena == MAP_FAILED) {
        perror("mmap");
        return 2;
    }
    seq_small = random_seq(OPS, SMALL);
    seq_small2 = random_seq(OPS, SMALL);
    seq_large = random_seq(OPS, LARGE);
    half[0] = random_seq(OPS, SMALL / 2);
    half[1] = random_seq(OPS, SMALL / 2);
    for (k = 0; k < OPS; k++)
        half[1][k] += SMALL / 2;
    seq_half[0] = half[0];
    seq_half[1] = half[1];
    perm = malloc(LARGE * sizeof(*perm));
    if (!perm) {
        perror("malloc");
        return 2;
    }
    printf("drc vs UCX ucs_rcache: %d KiB regions at a %d KiB stride, %d ops per measurement, %d runs\n",
           REGION >> 10, STRIDE >> 10, OPS, RUNS);
    fflush(stdout);
    for (run = 0; run < RUNS; run++) {
        one_run(run, seq_small, seq_small2, seq_half, seq_large, perm);
        fprintf(stderr, "run %d/%d done (%.1f s)\n", run + 1, RUNS, (double)(now_ns() - t0) / 1e9);
    }
    print_table();
    CHECK(drc_regs == drc_deregs, "drc: %llu registrations, %llu deregistrations",
          (unsigned long long)drc_regs, (unsigned long long)drc_deregs);
    CHECK(ucx_regs == ucx_deregs, "ucx: %llu registrations, %llu deregistrations",
          (unsigned long long)ucx_regs, (unsigned long long)ucx_deregs);
    free(perm);
    free(half[1]);
    free(half[0]);
    free(seq_large);
    free(seq_small2);
    free(seq_small);
    munmap(arena, (size_t)MAX_SLOTS * STRIDE);
    return failed;
}
