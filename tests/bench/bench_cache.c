/*
 * drc against UCX's ucs_rcache on UCX's own workload (issue 12).
 *
 * The job, as UCX's rcache benchmark runs it: regions of 64 KiB at a
 * 128 KiB stride in reserved address space (PROT_NONE, MAP_NORESERVE: the
 * caches never touch the memory); a hit looks up a 32 KiB slice at a random
 * 64-byte-aligned offset in the first half of a random region; N = 1,024,
 * 16,384, 65,536 and 262,144 regions. Both caches sit in front of a backend
 * that does no work. UCX is Debian's libucx-dev (1.13.1) with its memory
 * event enabled: the rcache subscribes to UCM_EVENT_VM_UNMAPPED, declared
 * external (as Open MPI does) so that no hook is patched in, and a free
 * event is what UCX's munmap hook does around the system call:
 * ucm_event_enter, ucm_event_dispatch(VM_UNMAPPED), ucm_event_leave. drc's
 * free event is drc_notify_free(), what its hooks call.
 *
 * UCX's rows can come from two builds of UCX side by side: this program is
 * linked with one (Debian's libucx-dev by default), and
 * `bench_cache OTHER` (make bench UCX_PREFIX=..., tests/bench/README.md)
 * runs a second copy of this program, built against another UCX, as a
 * third column: the processes of that column are OTHER run as
 * `OTHER --child FD`.
 *
 * Method: `bench_cache` is a driver. It runs REPS rounds (BENCH_REPS, 3 by
 * default); each round starts one process per column (drc, UCX, the other
 * UCX), the first column of each round rotating. A process measures every
 * row RUNS times and reports its median; the table gives the median of
 * those per-process medians and their range, and drc/UCX as the ratio of
 * the medians with the range of the ratios of processes of the same round.
 * Rows of one thread are pinned to CPU 0 (sched_setaffinity, as `taskset
 * -c 0`): the vCPUs of a VM are not always equal. Two-thread rows run on
 * both. The regions are 64 KiB-aligned (pair.h's reserve() says why).
 *
 * Rows (ns per operation; drc/UCX < 1 means drc is faster):
 *   hit, interior       get+put of the random slice, random region
 *   hit, sequential     the same, regions in address order
 *   hit, region start   get+put of a whole region from its start, random
 *   miss+insert, fresh  get+put of every region of an empty cache, 0 -> N
 *   miss+insert, a      the same for the first cache of a process (one
 *   process's first     that has made none before): its memory is new to
 *   cache               the process (page faults; drc keeps a destroyed
 *                       cache's mappings, malloc keeps freed memory); timed
 *                       in the resident memory row's processes, one fill each
 *   miss+insert, again  the same into a cache emptied by invalidation
 *   miss+insert, random a random eighth of the regions invalidated by
 *                       handle (untimed), then each registered again, in
 *                       that random order (bench_misses' op_miss)
 *   invalidate held     get + invalidate by handle + put (which
 *                       deregisters): drc_region_invalidate,
 *                       ucs_rcache_region_invalidate; then registered again
 *                       (untimed)
 *   ... by range        the same with a range invalidation of the region's
 *                       64 KiB in place of the handle: drc_invalidate; for
 *                       UCX its free event (UCX has no other range call),
 *                       which invalidates at once when it gets the page
 *                       table's lock, and the put deregisters
 *   free event on a     a free event over one idle registered region
 *   registered region   (drc_notify_free; UCX's munmap event), in address
 *                       order or in random order, an eighth of the regions
 *                       per round, then one get that misses: UCX removes
 *                       the region from its page table in the event but
 *                       deregisters it on the next get that takes its slow
 *                       path (its gc list), so that get is timed for both
 *                       (a region at the end of the space, invalidated by
 *                       handle untimed after it); the eighth is registered
 *                       again, untimed
 *   one free event,     one free event over all N regions, then the same
 *   all regions         get; ns per region
 *   resident memory     bytes per cached region: the process's resident
 *                       set (/proc/self/statm) after an empty cache is
 *                       created and filled with N regions, less before, over
 *                       N; in a process of its own that has made no cache
 *                       before (drc keeps a destroyed cache's arena)
 *   free event in gap   a free event for 64 KiB between two regions, and
 *                       the one get after all of them (UCX only queues the
 *                       range; that get searches for every queued one)
 *   2 threads hit       both threads hit the same regions (the random
 *                       row's lookups, in its order, thread 1 starting
 *                       halfway); ns per op per thread, and the pair's
 *                       throughput over one thread's: over the one-thread
 *                       random row's (measured a minute earlier, on
 *                       another cache), and paired: one thread on the same
 *                       cache and lookups just before each two-thread run,
 *                       the ratio taken run by run, so that the machine's
 *                       drift between rows does not enter it; beside each
 *                       pair, the same ratio of a loop without a cache
 *                       (ceiling(): what this machine gives two threads)
 *   2 threads free      each thread, on its own half: a free event over a
 *                       region (invalidated, deregistered), then a get
 *                       that registers it again (ns per pair per thread)
 *   2 threads missing   a fresh cache filled by two threads, each its half;
 *                       and the same with 10 us a registration (spun, as
 *                       below): whether two threads' registrations overlap
 *   hit vs invalidate   one thread hits its half while the other
 *                       invalidates held regions of its half and registers
 *                       them again (the hitter's ns)
 *   hit vs register     the same, each registration taking 10 us of the
 *                       registering thread (spun, as a thread spends
 *                       ibv_reg_mr in the kernel): the hitter's ns, which
 *                       tells whether hits wait for a registration (UCX
 *                       registers under its page table's write lock, which
 *                       every lookup takes to read; drc registers with no
 *                       lock held, and its hits take none)
 *
 * Each row checks that it measured what it claims: hits register nothing,
 * misses register every time, each invalidation deregisters its region,
 * free events in gaps invalidate nothing, every registration is
 * deregistered by the end. A failed check prints a line and the exit
 * status is 1. Timings never fail the program.
 */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "pair.h"      /* the two caches behind one interface; UCX's and drc's headers */

/* UCX's munmap hook, minus the system call (exported by libucm, not declared in its public header) */
void ucm_event_enter(void);
void ucm_event_leave(void);
void ucm_event_dispatch(ucm_event_type_t event_type, ucm_event_t *event);

enum {
    REGION = 64 << 10,
    STRIDE = 128 << 10,
    SLICE  = 32 << 10,
    HITS   = 400000,    /* lookups per hit measurement */
    REG_WORK_NS = 10000, /* a registration's own time in "hit while a thread registers" */
    FREES  = 400000,
    RUNS   = 3,         /* measurements per process: its median is reported */
    REPS   = 3,         /* processes per column, unless BENCH_REPS says */
    MAXREPS = 15,
    MAXN   = 262144,
    SENTINEL = MAXN,    /* a region past every row's regions: the get after free events */
    COLS   = 3,         /* drc, UCX, the other UCX */
};

static char *arena;
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

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rng(void)
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545f4914f6cdd1dull;
}

static void pin(int one_cpu)
{
    cpu_set_t set;
    long i, n = sysconf(_SC_NPROCESSORS_ONLN);

    CPU_ZERO(&set);
    for (i = 0; i < (one_cpu ? 1 : n); i++)
        CPU_SET(i, &set);
    sched_setaffinity(0, sizeof(set), &set);
}

static void cache_free(struct cache *c)
{
    if (c->ucx) {
        ucs_rcache_destroy(c->u);
    } else {
        int err = drc_cache_destroy(c->d);

        CHECK(!err, "drc_cache_destroy: %s", drc_strerror(err));
    }
}

static void *addr_of(uint32_t i, uint32_t off)
{
    return arena + (size_t)i * STRIDE + off;
}

static inline void getput(struct cache *c, void *a, size_t len)
{
    void *r = cache_get(c, a, len);

    if (!r)
        failed = 1;
    else
        cache_put(c, r);
}

/* get + invalidate by handle + put (which deregisters it) */
static inline void inval_held(struct cache *c, uint32_t i)
{
    void *r = cache_get(c, addr_of(i, 0), REGION);

    if (!r) {
        failed = 1;
        return;
    }
    if (c->ucx)
        ucx_region_invalidate(c->u, r);
    else
        drc_region_invalidate(c->d, r);
    cache_put(c, r);
}

/* A free event; drc says how many regions it invalidated, UCX only queues it (0). */
static inline int free_event(struct cache *c, void *a, size_t len)
{
    ucm_event_t ev;

    if (!c->ucx)
        return drc_notify_free(a, len);
    ev.vm_unmapped.address = a;
    ev.vm_unmapped.size = len;
    ucm_event_enter();
    ucm_event_dispatch(UCM_EVENT_VM_UNMAPPED, &ev);
    ucm_event_leave();
    return 0;
}

/* get + invalidate by range (drc_invalidate; UCX's free event) + put (which deregisters it) */
static inline void inval_range(struct cache *c, uint32_t i)
{
    void *r = cache_get(c, addr_of(i, 0), REGION);

    if (!r) {
        failed = 1;
        return;
    }
    if (c->ucx)
        free_event(c, addr_of(i, 0), REGION);
    else if (drc_invalidate(c->d, addr_of(i, 0), REGION) != 1)
        failed = 1;
    cache_put(c, r);
}

/*
 * The get after free events: one that misses (the sentinel region, at the
 * end of the space), as UCX deregisters what an event invalidated only in a
 * get that takes its slow path. sentinel_drop() invalidates it again, untimed.
 */
static void sentinel_get(struct cache *c)
{
    getput(c, addr_of(SENTINEL, 0), REGION);
}

static void sentinel_drop(struct cache *c)
{
    inval_held(c, SENTINEL);
}

static void fill(struct cache *c, uint32_t n)
{
    uint32_t i;

    for (i = 0; i < n; i++)
        getput(c, addr_of(i, 0), REGION);
}

/* ---- rows ---------------------------------------------------------------- */

enum kind {
    HIT_RAND, HIT_SEQ, HIT_START, MISS_FRESH, MISS_FIRST, MISS_AGAIN, MISS_RAND, INV_HELD, INV_RANGE, FREE_REG,
    FREE_REG_RAND, FREE_ALL,
    MEM, FREE_GAP, PAIR_HIT, PAIR_FREE, PAIR_MISS, PAIR_MISS_REG, HIT_VS_INV, HIT_VS_REG, KINDS
};

static const char *const kind_name[KINDS] = {
    [HIT_RAND] = "hit, interior slice, random region",
    [HIT_SEQ] = "hit, interior slice, sequential",
    [HIT_START] = "hit, region start, full length",
    [MISS_FRESH] = "miss+insert, fresh cache 0 -> N",
    [MISS_FIRST] = "miss+insert, a process's first cache 0 -> N",
    [MISS_AGAIN] = "miss+insert, repopulating",
    [MISS_RAND] = "miss+insert, random eighth again",
    [INV_HELD] = "invalidate one held region, by handle",
    [INV_RANGE] = "invalidate one held region, by range",
    [FREE_REG] = "free event, one idle region, address order",
    [FREE_REG_RAND] = "free event, one idle region, random order",
    [FREE_ALL] = "one free event over all N regions (per region)",
    [MEM] = "resident memory per cached region (bytes)",
    [FREE_GAP] = "free event, nothing registered",
    [PAIR_HIT] = "2 threads hit same regions (per op)",
    [PAIR_FREE] = "2 threads: free event on a region + get",
    [PAIR_MISS] = "2 threads missing (per miss)",
    [PAIR_MISS_REG] = "2 threads missing, 10 us a registration",
    [HIT_VS_INV] = "hit while a thread invalidates others",
    [HIT_VS_REG] = "hit while a thread registers (10 us each)",
};

struct row {
    enum kind kind;
    uint32_t n;
};

static const struct row rows[] = {
    { HIT_RAND, 1024 }, { HIT_RAND, 16384 }, { HIT_RAND, 65536 }, { HIT_RAND, 262144 },
    { HIT_SEQ, 1024 }, { HIT_SEQ, 65536 },
    { HIT_START, 1024 }, { HIT_START, 65536 },
    { MISS_FRESH, 1024 }, { MISS_FRESH, 16384 }, { MISS_FRESH, 65536 }, { MISS_FRESH, 262144 },
    { MISS_FIRST, 1024 }, { MISS_FIRST, 16384 }, { MISS_FIRST, 65536 }, { MISS_FIRST, 262144 },
    { MISS_AGAIN, 1024 }, { MISS_AGAIN, 65536 },
    { MISS_RAND, 1024 }, { MISS_RAND, 16384 }, { MISS_RAND, 65536 }, { MISS_RAND, 262144 },
    { INV_HELD, 1024 }, { INV_HELD, 16384 }, { INV_HELD, 65536 }, { INV_HELD, 262144 },
    { INV_RANGE, 1024 }, { INV_RANGE, 16384 }, { INV_RANGE, 65536 }, { INV_RANGE, 262144 },
    { FREE_REG, 1024 }, { FREE_REG, 16384 }, { FREE_REG, 65536 }, { FREE_REG, 262144 },
    { FREE_REG_RAND, 1024 }, { FREE_REG_RAND, 16384 }, { FREE_REG_RAND, 65536 }, { FREE_REG_RAND, 262144 },
    { FREE_ALL, 1024 }, { FREE_ALL, 16384 }, { FREE_ALL, 65536 }, { FREE_ALL, 262144 },
    { MEM, 1024 }, { MEM, 16384 }, { MEM, 65536 }, { MEM, 262144 },
    { FREE_GAP, 1024 }, { FREE_GAP, 65536 },
    { PAIR_HIT, 1024 }, { PAIR_HIT, 65536 },
    { PAIR_FREE, 1024 }, { PAIR_MISS, 1024 }, { PAIR_MISS, 65536 }, { PAIR_MISS_REG, 1024 }, { HIT_VS_INV, 1024 }, { HIT_VS_INV, 65536 },
    { HIT_VS_REG, 1024 }, { HIT_VS_REG, 65536 },
};

enum { ROWS = sizeof(rows) / sizeof(rows[0]) };

/* Lookups: (region, offset) pairs drawn once per process, the same for both caches' processes. */
static uint32_t *seq_i, *seq_off;

static void draw(uint32_t n, int sequential)
{
    size_t k;

    rng_state = 0x9e3779b97f4a7c15ull ^ n ^ ((uint64_t)sequential << 40);
    for (k = 0; k < HITS; k++) {
        seq_i[k] = sequential ? (uint32_t)(k % n) : (uint32_t)(rng() % n);
        seq_off[k] = (uint32_t)(rng() % ((REGION / 2) / 64)) * 64;
    }
}

static double hit_loop(struct cache *c, int start_only)
{
    uint64_t t0, r0 = regs;
    size_t k;

    for (k = 0; k < HITS / 10; k++)
        getput(c, addr_of(seq_i[k], start_only ? 0 : seq_off[k]), start_only ? REGION : SLICE);
    t0 = now_ns();
    for (k = 0; k < HITS; k++)
        getput(c, addr_of(seq_i[k], start_only ? 0 : seq_off[k]), start_only ? REGION : SLICE);
    t0 = now_ns() - t0;
    CHECK(regs == r0, "%s: a hit registered (%llu times)", c->ucx ? "ucx" : "drc", (unsigned long long)(regs - r0));
    return (double)t0 / HITS;
}

struct pair {
    struct cache *c;
    pthread_barrier_t go;
    double ns[2];
};

struct pair_arg {
    struct pair *p;
    int id;
};

static void *pair_thread(void *v)
{
    struct pair_arg *a = v;
    uint64_t t0;
    size_t k, j;

    pthread_barrier_wait(&a->p->go);
    t0 = now_ns();
    for (k = 0; k < HITS; k++) {
        /*
         * The same lookups as the one-thread row, read in order as it reads
         * them, thread 1 from the middle: the threads hit the same regions at
         * different moments. (Until 2026-12-04 thread i read entry
         * (k * 7919 + i * 104729) % HITS: a cache and TLB miss on the drawn
         * arrays per lookup that the one-thread row it is compared with does
         * not pay.)
         */
        j = (k + (size_t)a->id * (HITS / 2)) % HITS;
        getput(a->p->c, addr_of(seq_i[j], seq_off[j]), SLICE);
    }
    a->p->ns[a->id] = (double)(now_ns() - t0) / HITS;
    return NULL;
}

static double pair_hit(struct cache *c)
{
    struct pair p = { .c = c };
    struct pair_arg a[2] = { { &p, 0 }, { &p, 1 } };
    pthread_t t[2];
    uint64_t r0 = regs;
    int i;

    pin(0);
    pthread_barrier_init(&p.go, NULL, 2);
    for (i = 0; i < 2; i++)
        pthread_create(&t[i], NULL, pair_thread, &a[i]);
    for (i = 0; i < 2; i++)
        pthread_join(t[i], NULL);
    pthread_barrier_destroy(&p.go);
    pin(1);
    CHECK(regs == r0, "%s: a two-thread hit registered", c->ucx ? "ucx" : "drc");
    return p.ns[0] > p.ns[1] ? p.ns[0] : p.ns[1];
}

/*
 * The machine's ceiling for the two-thread hit row: no cache, the same
 * lookups (seq_i) over memory of drc's shape for N regions, read only: a
 * table of four slot pointers per region, each naming a 192-byte record,
 * in memory advised to huge pages as drc's arena is. A hit is the slot
 * load, a load from the record it names (two dependent loads, as a drc
 * hint hit is), and two locked adds to a line of the thread's own (a get's
 * and a put's reference in its thread slot: each a full barrier, so that
 * one thread's misses do not overlap from hit to hit, as drc's do not).
 * One thread, then two threads reading the same memory as pair_hit reads
 * its lookups; 2 * one / two is what two threads can gain on this machine
 * when they write nothing that the other reads.
 */
struct rec {
    uint64_t v[24];
};

struct ceil_arg {
    uint64_t refs __attribute__((aligned(64)));     /* the thread's own line */
    struct rec *const *slot;
    pthread_barrier_t *go;
    int id;
    uint64_t sum;
    double ns;
};

static void *ceil_thread(void *v)
{
    struct ceil_arg *a = v;
    uint64_t t0, sum = 0;
    size_t k, j;

    if (a->go)
        pthread_barrier_wait(a->go);
    t0 = now_ns();
    for (k = 0; k < HITS; k++) {
        j = (k + (size_t)a->id * (HITS / 2)) % HITS;
        sum += a->slot[(size_t)seq_i[j] * 4 + (seq_off[j] >> 14)]->v[seq_off[j] >> 3 & 7];
        __atomic_fetch_add(&a->refs, 1, __ATOMIC_SEQ_CST);
        __atomic_fetch_sub(&a->refs, 1, __ATOMIC_SEQ_CST);
    }
    a->ns = (double)(now_ns() - t0) / HITS;
    a->sum = sum;
    return NULL;
}

/* @size bytes, 2 MiB-aligned and advised MADV_HUGEPAGE (as src/core/arena.c maps); free with huge_free */
static void *huge_alloc(size_t size)
{
    size_t h = 2 << 20;
    char *p = mmap(NULL, size + h, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0), *q;

    if (p == MAP_FAILED)
        exit(2);
    q = (char *)(((uintptr_t)p + h - 1) & ~(uintptr_t)(h - 1));
    (void)madvise(q, size, MADV_HUGEPAGE);
    *(char **)(q + size - sizeof(char *)) = p;      /* the mapping, for huge_free */
    return q;
}

static void huge_free(void *q, size_t size)
{
    munmap(*(char **)((char *)q + size - sizeof(char *)), size + (2 << 20));
}

static double ceiling(uint32_t n)
{
    size_t rsize = (size_t)n * sizeof(struct rec) + 64, ssize = (size_t)n * 4 * sizeof(struct rec *) + 64;
    struct rec *recs = huge_alloc(rsize), **slot = huge_alloc(ssize);
    static struct ceil_arg one, two[2];
    pthread_barrier_t go;
    pthread_t t[2];
    double r;
    size_t i;
    int k;

    memset(recs, 1, (size_t)n * sizeof(*recs));
    for (i = 0; i < (size_t)n * 4; i++)
        slot[i] = &recs[i / 4];
    one = (struct ceil_arg){ .slot = slot };
    ceil_thread(&one);                  /* warm, pinned like the one-thread rows */
    ceil_thread(&one);
    pin(0);
    pthread_barrier_init(&go, NULL, 2);
    for (k = 0; k < 2; k++) {
        two[k] = (struct ceil_arg){ .slot = slot, .go = &go, .id = k };
        pthread_create(&t[k], NULL, ceil_thread, &two[k]);
    }
    for (k = 0; k < 2; k++)
        pthread_join(t[k], NULL);
    pthread_barrier_destroy(&go);
    pin(1);
    r = 2 * one.ns / (two[0].ns > two[1].ns ? two[0].ns : two[1].ns);
    if (one.sum + two[0].sum + two[1].sum == 42)
        putchar(' ');                   /* keeps the loads */
    huge_free(slot, ssize);
    huge_free(recs, rsize);
    return r;
}

/*
 * Two threads at once, each on its own half of the regions (@kind):
 *   PAIR_FREE   a free event over one of its regions (which invalidates and
 *               deregisters it), then a get that registers it again
 *   PAIR_MISS   a fresh cache filled, each thread its half (ns per miss);
 *               PAIR_MISS_REG the same, each registration spinning 10 us
 *   HIT_VS_INV  thread 0 hits its half; thread 1 invalidates held regions of
 *               its half by handle and registers them again (thread 0's ns);
 *               HIT_VS_REG the same, each registration spinning 10 us
 */
struct duo {
    struct cache *c;
    enum kind kind;
    uint32_t n;
    pthread_barrier_t go;
    int stop;
    double ns[2];
};

struct duo_arg {
    struct duo *d;
    int id;
};

static void *duo_thread(void *v)
{
    struct duo_arg *a = v;
    struct duo *d = a->d;
    uint32_t half = d->n / 2, base = (uint32_t)a->id * half, i;
    uint64_t t0, ops = 0, x = 0x12345u + (uint64_t)a->id;
    size_t k;

    pthread_barrier_wait(&d->go);
    t0 = now_ns();
    switch (d->kind) {
    case PAIR_FREE:
        for (k = 0; k < FREES / 8; k++, ops++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            i = base + (uint32_t)((x >> 33) % half);
            free_event(d->c, addr_of(i, 0), REGION);
            getput(d->c, addr_of(i, 0), REGION);
        }
        break;
    case PAIR_MISS:
    case PAIR_MISS_REG:
        for (i = base; i < base + half; i++, ops++)
            getput(d->c, addr_of(i, 0), REGION);
        break;
    case HIT_VS_INV:
    case HIT_VS_REG:
        if (a->id == 0) {
            for (k = 0; k < HITS; k++, ops++) {
                x = x * 6364136223846793005ull + 1442695040888963407ull;
                i = (uint32_t)((x >> 33) % half);
                getput(d->c, addr_of(i, seq_off[k]), SLICE);
            }
            __atomic_store_n(&d->stop, 1, __ATOMIC_RELEASE);
        } else {
            while (!__atomic_load_n(&d->stop, __ATOMIC_ACQUIRE)) {
                x = x * 6364136223846793005ull + 1442695040888963407ull;
                i = base + (uint32_t)((x >> 33) % half);
                inval_held(d->c, i);
                getput(d->c, addr_of(i, 0), REGION);
                ops++;
            }
        }
        break;
    case HIT_RAND:
    case HIT_SEQ:
    case HIT_START:
    case MISS_FRESH:
    case MISS_AGAIN:
    case MISS_RAND:
    case INV_HELD:
    case INV_RANGE:
    case FREE_REG:
    case FREE_REG_RAND:
    case FREE_ALL:
    case MEM:
    case MISS_FIRST:
    case FREE_GAP:
    case PAIR_HIT:
    case KINDS:
        break;
    }
    d->ns[a->id] = ops ? (double)(now_ns() - t0) / (double)ops : 0;
    return NULL;
}

static double duo_run(struct cache *c, enum kind kind, uint32_t n)
{
    struct duo d = { .c = c, .kind = kind, .n = n };
    struct duo_arg a[2] = { { &d, 0 }, { &d, 1 } };
    pthread_t t[2];
    int i;

    pin(0);
    __atomic_store_n(&reg_ns, kind == PAIR_MISS_REG || kind == HIT_VS_REG ? REG_WORK_NS : 0, __ATOMIC_RELAXED);
    pthread_barrier_init(&d.go, NULL, 2);
    for (i = 0; i < 2; i++)
        pthread_create(&t[i], NULL, duo_thread, &a[i]);
    for (i = 0; i < 2; i++)
        pthread_join(t[i], NULL);
    pthread_barrier_destroy(&d.go);
    __atomic_store_n(&reg_ns, 0, __ATOMIC_RELAXED);
    pin(1);
    if (kind == HIT_VS_INV || kind == HIT_VS_REG)
        return d.ns[0];
    return d.ns[0] > d.ns[1] ? d.ns[0] : d.ns[1];
}

static double pair_free(struct cache *c, uint32_t n)
{
    uint64_t d0 = deregs, r0 = regs;
    double ns = duo_run(c, PAIR_FREE, n);

    CHECK(deregs - d0 == 2 * (FREES / 8) && regs - r0 == 2 * (FREES / 8),
          "%s: %llu deregistrations and %llu registrations for %d free events and gets", c->ucx ? "ucx" : "drc",
          (unsigned long long)(deregs - d0), (unsigned long long)(regs - r0), 2 * (FREES / 8));
    return ns;
}

static double pair_miss(int ucx, uint32_t n, enum kind kind)
{
    uint64_t r0 = regs;
    double total = 0;
    size_t done = 0, want = kind == PAIR_MISS_REG ? 4 * (size_t)n : MAXN;  /* 10 us each: fewer */

    while (done < want) {
        struct cache c = cache_new(ucx);

        total += duo_run(&c, kind, n) * (n / 2);
        cache_free(&c);
        done += n;
    }
    CHECK(regs - r0 == done, "%s: %llu registrations for %zu misses in two threads", ucx ? "ucx" : "drc",
          (unsigned long long)(regs - r0), done);
    return total / (double)(done / 2);
}

static double hit_vs_inv(struct cache *c, uint32_t n, enum kind kind)
{
    uint64_t r0 = regs, d0 = deregs;
    double ns = duo_run(c, kind, n);

    CHECK(regs - r0 == deregs - d0, "%s: %llu registrations against %llu invalidations", c->ucx ? "ucx" : "drc",
          (unsigned long long)(regs - r0), (unsigned long long)(deregs - d0));
    return ns;
}

/*
 * Fresh misses: caches filled from empty until at least MAXN registrations,
 * after one cache of the same size filled and destroyed untimed. The row
 * measures a cache made where one of its size was before (drc's kept arena,
 * malloc's freed heap), whatever rows ran before it in this process: without
 * that fill, a process that had made no cache this large paid for new memory
 * in its first cache and at 262,144 regions (one cache a run) the median of
 * three ran into it (drc about 1.0 of UCX when BENCH_ONLY picked this row,
 * 0.8-0.9 in a full run). "a process's first cache" is that cost's own row.
 */
static uint32_t fresh_made;     /* the largest cache filled untimed so far */

static double miss_fresh(int ucx, uint32_t n)
{
    uint64_t total = 0, t0, r0;
    size_t done = 0;

    if (fresh_made < n) {
        struct cache c = cache_new(ucx);

        fill(&c, n);
        cache_free(&c);
        fresh_made = n;
    }
    r0 = regs;
    while (done < MAXN) {
        struct cache c = cache_new(ucx);

        t0 = now_ns();
        fill(&c, n);
        total += now_ns() - t0;
        cache_free(&c);
        done += n;
    }
    CHECK(regs - r0 == done, "%s: %llu registrations for %zu misses", ucx ? "ucx" : "drc",
          (unsigned long long)(regs - r0), done);
    return (double)total / (double)done;
}

/* Repopulation: the cache emptied by invalidating every region (untimed), then filled again. */
static double miss_again(struct cache *c, uint32_t n)
{
    uint64_t total = 0, t0, r0;
    size_t done = 0;
    uint32_t i;

    while (done < MAXN) {
        for (i = 0; i < n; i++)
            inval_held(c, i);
        r0 = regs;
        t0 = now_ns();
        for (i = 0; i < n; i++)
            getput(c, addr_of(i, 0), REGION);
        total += now_ns() - t0;
        CHECK(regs - r0 == n, "%s: %llu registrations repopulating %u regions", c->ucx ? "ucx" : "drc",
              (unsigned long long)(regs - r0), n);
        done += n;
    }
    return (double)total / (double)done;
}

static void shuffle(uint32_t *perm, uint32_t n)
{
    uint32_t i, j, t;

    for (i = n - 1; i > 0; i--) {
        j = (uint32_t)(rng() % (i + 1));
        t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
}

/*
 * An eighth of the cache per round, in random order: held regions
 * invalidated by handle (or by range, @what INV_RANGE), then registered
 * again in that order. Timed: the invalidations (INV_HELD, INV_RANGE), or
 * the registrations (MISS_RAND: misses in random order, each lookup finding
 * a stale hint or none, and an index whose leaves are not in cache once the
 * cache is large).
 */
static double eighth_rounds(struct cache *c, uint32_t n, uint32_t *perm, enum kind what)
{
    uint64_t total = 0, t0, d0, r0;
    uint32_t batch = n / 8 ? n / 8 : 1, i;
    size_t done = 0;

    for (i = 0; i < n; i++)
        perm[i] = i;
    while (done < FREES / 4) {
        shuffle(perm, n);
        d0 = deregs;
        t0 = now_ns();
        if (what == INV_RANGE)
            for (i = 0; i < batch; i++)
                inval_range(c, perm[i]);
        else
            for (i = 0; i < batch; i++)
                inval_held(c, perm[i]);
        if (what != MISS_RAND)
            total += now_ns() - t0;
        CHECK(deregs - d0 == batch, "%s: %llu deregistrations for %u invalidations", c->ucx ? "ucx" : "drc",
              (unsigned long long)(deregs - d0), batch);
        r0 = regs;
        t0 = now_ns();
        for (i = 0; i < batch; i++)
            getput(c, addr_of(perm[i], 0), REGION);
        if (what == MISS_RAND)
            total += now_ns() - t0;
        CHECK(regs - r0 == batch, "%s: %llu registrations for %u misses", c->ucx ? "ucx" : "drc",
              (unsigned long long)(regs - r0), batch);
        done += batch;
    }
    return (double)total / (double)done;
}

/*
 * Free events over idle registered regions, an eighth of the cache per
 * round, in address order (the next eighth each round) or random order, and
 * the get after them (sentinel_get); then registered again, untimed.
 */
static double free_rounds(struct cache *c, uint32_t n, uint32_t *perm, int random)
{
    uint64_t total = 0, t0, d0;
    uint32_t batch = n / 8 ? n / 8 : 1, i, next = 0;
    size_t done = 0;
    int found;

    for (i = 0; i < n; i++)
        perm[i] = i;
    while (done < FREES / 4) {
        if (random)
            shuffle(perm, n);
        else
            for (i = 0; i < batch; i++, next = (next + 1) % n)
                perm[i] = next;
        d0 = deregs;
        found = 0;
        t0 = now_ns();
        for (i = 0; i < batch; i++)
            found += free_event(c, addr_of(perm[i], 0), REGION);
        sentinel_get(c);
        total += now_ns() - t0;
        CHECK(deregs - d0 == batch && (c->ucx || found == (int)batch),
              "%s: %llu deregistrations (%d found) for %u free events over registered regions",
              c->ucx ? "ucx" : "drc", (unsigned long long)(deregs - d0), found, batch);
        sentinel_drop(c);
        for (i = 0; i < batch; i++)
            getput(c, addr_of(perm[i], 0), REGION);
        done += batch;
    }
    return (double)total / (double)done;
}

/* One free event over all @n regions and the get after it; ns per region. The cache is filled again, untimed. */
static double free_all(struct cache *c, uint32_t n)
{
    uint64_t total = 0, t0, d0;
    size_t done = 0;
    int found;

    while (done < MAXN / 4) {
        d0 = deregs;
        t0 = now_ns();
        found = free_event(c, arena, (size_t)n * STRIDE);
        sentinel_get(c);
        total += now_ns() - t0;
        CHECK(deregs - d0 == n && (c->ucx || found == (int)n),
              "%s: %llu deregistrations (%d found) for one free event over %u regions", c->ucx ? "ucx" : "drc",
              (unsigned long long)(deregs - d0), found, n);
        sentinel_drop(c);
        fill(c, n);
        done += n;
    }
    return (double)total / (double)done;
}

static long resident_bytes(void)
{
    long size = 0, res = 0;
    FILE *f = fopen("/proc/self/statm", "r");

    if (!f || fscanf(f, "%ld %ld", &size, &res) != 2)
        res = -1;
    if (f)
        fclose(f);
    return res * sysconf(_SC_PAGESIZE);
}

/*
 * BENCH_SMAPS=1: where the memory row's bytes are, on stderr: each anonymous mapping of 64 KiB or
 * more resident, with its size, resident and huge-page kilobytes (/proc/self/smaps).
 */
static void smaps_dump(const char *who, uint32_t n)
{
    char line[512], head[512] = "";
    unsigned long size = 0, rss = 0, huge;
    FILE *f = fopen("/proc/self/smaps", "r");

    while (f && fgets(line, sizeof(line), f)) {
        if (sscanf(line, "Size: %lu kB", &size) == 1)
            continue;
        if (sscanf(line, "Rss: %lu kB", &rss) == 1)
            continue;
        if (sscanf(line, "AnonHugePages: %lu kB", &huge) == 1) {
            if (rss >= 64 && !strchr(head, '/'))
                fprintf(stderr, "smaps %s %u: %8lu kB mapped %8lu kB resident %8lu kB huge  %.*s\n", who, n, size,
                        rss, huge, (int)strcspn(head, " "), head);
            continue;
        }
        if (strchr(line, '-') && strchr(line, ' ') && strchr(line, '-') < strchr(line, ' '))
            snprintf(head, sizeof(head), "%s", line);
    }
    if (f)
        fclose(f);
}

/*
 * A process's first cache, created and filled with @n regions: resident bytes per region (the
 * resident set after less before, over @n) in per[0], ns per miss of the fill in per[1]. In a
 * process forked for it from one that has made no cache yet (drc keeps a destroyed cache's arena
 * for the next one; malloc keeps freed memory), so that both caches start from nothing: their
 * memory is new to the process, each page faulted in as the fill first writes it. The memory the
 * libraries take at load is in both before and after.
 */
static void first_cache(int ucx, uint32_t n, double per[2])
{
    int fds[2], st;
    pid_t pid;

    per[0] = per[1] = -1;
    if (pipe(fds))
        return;
    pid = fork();
    if (pid == 0) {
        long before = resident_bytes(), after;
        struct cache c = cache_new(ucx);
        uint64_t t0 = now_ns();

        fill(&c, n);
        per[1] = (double)(now_ns() - t0) / n;
        after = resident_bytes();
        if (getenv("BENCH_SMAPS"))
            smaps_dump(ucx ? "ucx" : "drc", n);
        per[0] = before < 0 || after < 0 ? -1 : (double)(after - before) / n;
        if (write(fds[1], per, 2 * sizeof(*per)) != (ssize_t)(2 * sizeof(*per)))
            _exit(1);
        _exit(failed);     /* the cache goes with the process */
    }
    close(fds[1]);
    if (pid < 0 || read(fds[0], per, 2 * sizeof(*per)) != (ssize_t)(2 * sizeof(*per)))
        per[0] = per[1] = -1;
    close(fds[0]);
    if (pid > 0 && (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st)))
        per[0] = per[1] = -1;
    CHECK(per[0] >= 0, "%s: resident memory of %u regions not measured", ucx ? "ucx" : "drc", n);
}

static double mem_per_region(int ucx, uint32_t n)
{
    double per[2];

    first_cache(ucx, n, per);
    return per[0];
}

/*
 * Free events over the gaps between regions (64 KiB each, nothing registered
 * there). UCX queues each event and searches its page table for the range
 * on the next get; that get is timed too, so each cache pays its search.
 */
static double free_gaps(struct cache *c, uint32_t n)
{
    uint64_t t0, d0 = deregs;
    size_t k;
    int found = 0;

    for (k = 0; k < FREES / 10; k++)
        found += free_event(c, addr_of(seq_i[k], REGION), STRIDE - REGION);
    getput(c, addr_of(0, 0), REGION);
    t0 = now_ns();
    for (k = 0; k < FREES; k++)
        found += free_event(c, addr_of(seq_i[k % HITS], REGION), STRIDE - REGION);
    getput(c, addr_of(0, 0), REGION);     /* drains UCX's queue of ranges */
    t0 = now_ns() - t0;
    CHECK(deregs == d0 && !found, "%s: a free event in a gap invalidated", c->ucx ? "ucx" : "drc");
    (void)n;
    return (double)t0 / FREES;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;

    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    double s[MAXREPS];

    memcpy(s, v, (size_t)n * sizeof(*v));
    qsort(s, (size_t)n, sizeof(s[0]), cmp_double);
    return s[n / 2];
}

/* BENCH_ONLY=<part of a row name>[|<part>...]: measure those rows only */
static int wanted(const char *name)
{
    const char *only = getenv("BENCH_ONLY"), *p, *bar;
    char part[128];
    size_t len;

    if (!only || !*only)
        return 1;
    for (p = only;; p = bar + 1) {
        bar = strchr(p, '|');
        len = bar ? (size_t)(bar - p) : strlen(p);
        if (len && len < sizeof(part)) {
            memcpy(part, p, len);
            part[len] = '\0';
            if (strstr(name, part))
                return 1;
        }
        if (!bar)
            return 0;
    }
}

/* What a process reports: its UCX's name, then each row's median (PAIR_HIT rows: v[1] the paired
 * throughput ratio, v[2] the machine's ceiling for it, ceiling()). */
struct report {
    char name[48];
    int rows;
    double v[3][ROWS];
};

/* One process: every row RUNS times, each row's median written to @fd. */
static void child(int ucx, int fd)
{
    static struct report rep;
    double v[RUNS], w[RUNS], x[RUNS];
    uint32_t *perm = malloc(MAXN * sizeof(*perm));
    int k, run;

    memset(&rep, 0, sizeof(rep));
    snprintf(rep.name, sizeof(rep.name), "%s", ucx ? ucx_name() : "drc");
    rep.rows = ROWS;
    if (ucx)
        ucm_set_external_event(UCM_EVENT_VM_UNMAPPED);
    seq_i = malloc(HITS * sizeof(*seq_i));
    seq_off = malloc(HITS * sizeof(*seq_off));
    if (!perm || !seq_i || !seq_off)
        exit(2);
    pin(1);
    /* memory and the first cache's misses first, before this process makes a cache (first_cache says why) */
    for (k = 0; k < ROWS; k++) {
        double per[2];
        int j;

        if ((rows[k].kind != MEM && rows[k].kind != MISS_FIRST) || !wanted(kind_name[rows[k].kind]) || rep.v[0][k])
            continue;
        first_cache(ucx, rows[k].n, per);
        for (j = k; j < ROWS; j++)      /* both rows of this size from the one fill, where wanted */
            if (rows[j].n == rows[k].n && wanted(kind_name[rows[j].kind]))
                if (rows[j].kind == MEM || rows[j].kind == MISS_FIRST)
                    rep.v[0][j] = per[rows[j].kind == MISS_FIRST];
    }
    for (k = 0; k < ROWS; k++) {
        const struct row *rw = &rows[k];
        struct cache c;

        if (rw->kind == MEM || rw->kind == MISS_FIRST || !wanted(kind_name[rw->kind]))
            continue;
        draw(rw->n, rw->kind == HIT_SEQ);
        if (rw->kind == MISS_FRESH || rw->kind == PAIR_MISS || rw->kind == PAIR_MISS_REG) {
            for (run = 0; run < RUNS; run++)
                v[run] = rw->kind == MISS_FRESH ? miss_fresh(ucx, rw->n) : pair_miss(ucx, rw->n, rw->kind);
            rep.v[0][k] = median(v, RUNS);
            continue;
        }
        c = cache_new(ucx);
        fill(&c, rw->n);
        for (run = 0; run < RUNS; run++) {
            switch (rw->kind) {
            case HIT_RAND:
            case HIT_SEQ:
                v[run] = hit_loop(&c, 0);
                break;
            case HIT_START:
                v[run] = hit_loop(&c, 1);
                break;
            case MISS_AGAIN:
                v[run] = miss_again(&c, rw->n);
                break;
            case MISS_RAND:
                v[run] = eighth_rounds(&c, rw->n, perm, MISS_RAND);
                break;
            case INV_HELD:
            case INV_RANGE:
                v[run] = eighth_rounds(&c, rw->n, perm, rw->kind);
                break;
            case FREE_REG:
            case FREE_REG_RAND:
                v[run] = free_rounds(&c, rw->n, perm, rw->kind == FREE_REG_RAND);
                break;
            case FREE_ALL:
                v[run] = free_all(&c, rw->n);
                break;
            case FREE_GAP:
                v[run] = free_gaps(&c, rw->n);
                break;
            case PAIR_HIT:
                w[run] = hit_loop(&c, 0);   /* one thread (pinned), the same cache and lookups, just before */
                v[run] = pair_hit(&c);
                w[run] = 2 * w[run] / v[run];
                x[run] = ceiling(rw->n);
                break;
            case PAIR_FREE:
                v[run] = pair_free(&c, rw->n);
                break;
            case HIT_VS_INV:
            case HIT_VS_REG:
                v[run] = hit_vs_inv(&c, rw->n, rw->kind);
                break;
            case MEM:
            case MISS_FIRST:
            case PAIR_MISS:
            case PAIR_MISS_REG:
            case MISS_FRESH:
            case KINDS:
                break;
            }
        }
        rep.v[0][k] = median(v, RUNS);
        if (rw->kind == PAIR_HIT) {
            rep.v[1][k] = median(w, RUNS);
            rep.v[2][k] = median(x, RUNS);
        }
        cache_free(&c);
    }
    CHECK(regs == deregs, "%s: %llu registrations, %llu deregistrations", ucx ? "ucx" : "drc",
          (unsigned long long)regs, (unsigned long long)deregs);
    if (write(fd, &rep, sizeof(rep)) != (ssize_t)sizeof(rep))
        failed = 1;
    exit(failed);
}

static struct report res[COLS][MAXREPS];
static int ncols = 2, reps = REPS;

/* "1,234.5": the tables' numbers */
static const char *num(char *buf, double x, int prec)
{
    char raw[64], *dot, *o = buf;
    int len, lead, k;

    snprintf(raw, sizeof(raw), "%.*f", prec, x);
    dot = strchr(raw, '.');
    len = dot ? (int)(dot - raw) : (int)strlen(raw);
    lead = raw[0] == '-';
    for (k = 0; k < len; k++) {
        *o++ = raw[k];
        if (k >= lead && (len - 1 - k) % 3 == 0 && k != len - 1)
            *o++ = ',';
    }
    strcpy(o, raw + len);
    return buf;
}

/* column @col, measure @m, row @k over the rounds: median, and the range in *lo, *hi */
static double stat(int col, int m, int k, double *lo, double *hi)
{
    double v[MAXREPS];
    int rep;

    *lo = 1e300;
    *hi = -1e300;
    for (rep = 0; rep < reps; rep++) {
        v[rep] = res[col][rep].v[m][k];
        *lo = v[rep] < *lo ? v[rep] : *lo;
        *hi = v[rep] > *hi ? v[rep] : *hi;
    }
    return median(v, reps);
}

/* drc over column @col, row @k: the ratio of the medians, and the range of the rounds' ratios */
static double ratio(int col, int k, double *lo, double *hi)
{
    double a, b, l, h;
    int rep;

    *lo = 1e300;
    *hi = -1e300;
    for (rep = 0; rep < reps; rep++) {
        double q = res[col][rep].v[0][k] > 0 ? res[0][rep].v[0][k] / res[col][rep].v[0][k] : 0;

        *lo = q < *lo ? q : *lo;
        *hi = q > *hi ? q : *hi;
    }
    a = stat(0, 0, k, &l, &h);
    b = stat(col, 0, k, &l, &h);
    return b > 0 ? a / b : 0;
}

/* Start column @col's process for round @rep; its report lands in res[col][rep]. */
static void run_one(int col, int rep, const char *other)
{
    struct report *out = &res[col][rep];
    int fds[2], st;
    pid_t pid;

    if (pipe(fds))
        exit(2);
    fflush(NULL);
    pid = fork();
    if (pid == 0) {
        close(fds[0]);
        if (col == 2) {
            char fd[16];

            snprintf(fd, sizeof(fd), "%d", fds[1]);
            execl(other, other, "--child", fd, (char *)NULL);
            perror(other);
            _exit(2);
        }
        child(col == 1, fds[1]);
    }
    close(fds[1]);
    if (read(fds[0], out, sizeof(*out)) != (ssize_t)sizeof(*out) || out->rows != ROWS) {
        fprintf(stderr, "bench_cache: no report from column %d%s\n", col,
                col == 2 ? " (is the other binary built from this source?)" : "");
        failed = 1;
    }
    close(fds[0]);
    waitpid(pid, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st))
        failed = 1;
    fprintf(stderr, "round %d/%d: %s done\n", rep + 1, reps, out->name[0] ? out->name : "?");
}

/*
 * --memory-curve: the memory row at every multiple of 8,192 regions up to 262,144, drc's and this
 * build's UCX's side by side, one fresh process each. The row at the table's four sizes is one point
 * of a step curve: drc's arena takes huge pages, so its resident memory grows 2 MiB at a time, and
 * where the table's sizes fall on those steps is luck; the curve shows both caches between them.
 */
static int memory_curve(void)
{
    uint32_t n;
    double d, u;

    printf("regions, resident bytes per cached region: drc, %s, drc/%s\n", ucx_name(), ucx_name());
    for (n = 8192; n <= 262144; n += 8192) {
        d = mem_per_region(0, n);
        u = mem_per_region(1, n);
        printf("%u %.1f %.1f %.2f\n", n, d, u, u > 0 ? d / u : 0);
        fflush(stdout);
    }
    return failed ? 1 : 0;
}

int main(int argc, char **argv)
{
    const char *other = argc > 1 ? argv[1] : NULL, *env = getenv("BENCH_REPS");
    char b[3][64];
    int rep, j, col, k, m;

    arena = reserve((size_t)(MAXN + 1) * STRIDE);
    if (!arena) {
        perror("mmap");
        return 2;
    }
    if (argc == 3 && !strcmp(argv[1], "--child"))
        child(1, atoi(argv[2]));    /* the other UCX's column (run_one) */
    if (argc == 2 && !strcmp(argv[1], "--memory-curve"))
        return memory_curve();
    if (argc > 2 || (other && (!strcmp(other, "-h") || !strcmp(other, "--help")))) {
        fprintf(stderr, "usage: bench_cache [OTHER]   (OTHER: bench_cache built against another UCX, a column "
                        "of its own)\n       bench_cache --memory-curve   (the memory row from 8k to 256k regions)\n"
                        "       environment: BENCH_ONLY=part[|part...] BENCH_REPS=n (1-%d) BENCH_SMAPS=1\n",
                MAXREPS);
        return 2;
    }
    if (other)
        ncols = 3;
    if (env)
        reps = atoi(env) < 1 ? 1 : atoi(env) > MAXREPS ? MAXREPS : atoi(env);
    printf("drc vs UCX ucs_rcache: %d KiB regions at a %d KiB stride, 64 KiB-aligned, %d KiB slices at random\n"
           "64-byte offsets in a region's first half; %d processes per column, the first column of each round\n"
           "rotating; medians of per-process medians of %d runs [range]; drc/UCX: ratio of the medians\n"
           "[range of the rounds' ratios]; one-thread rows pinned to CPU 0\n",
           REGION >> 10, STRIDE >> 10, SLICE >> 10, reps, RUNS);
    fflush(stdout);
    for (rep = 0; rep < reps; rep++)
        for (j = 0; j < ncols; j++)
            run_one((rep + j) % ncols, rep, other);
    printf("\n| row (ns/op) | N | drc |");
    for (col = 1; col < ncols; col++)
        printf(" %s |", res[col][0].name);
    for (col = 1; col < ncols; col++)
        printf(" drc/%s |", res[col][0].name);
    printf("\n|---|---:|---:|");
    for (col = 1; col < ncols; col++)
        printf("---:|---:|");
    printf("\n");
    for (k = 0; k < ROWS; k++) {
        double lo, hi, q[COLS], qlo[COLS], qhi[COLS], med[COLS];
        char line[512];
        int prec = rows[k].kind == MEM ? 0 : 1, at;

        for (col = 0; col < ncols; col++)
            med[col] = stat(col, 0, k, &lo, &hi);
        if (med[0] == 0 && med[1] == 0)
            continue;   /* not measured (BENCH_ONLY) */
        at = snprintf(line, sizeof(line), "| %s | %u |", kind_name[rows[k].kind], rows[k].n);
        for (col = 0; col < ncols; col++) {
            med[col] = stat(col, 0, k, &lo, &hi);
            at += snprintf(line + at, sizeof(line) - (size_t)at, " %s [%s-%s] |", num(b[0], med[col], prec),
                           num(b[1], lo, prec), num(b[2], hi, prec));
        }
        for (col = 1; col < ncols; col++) {
            q[col] = ratio(col, k, &qlo[col], &qhi[col]);
            at += snprintf(line + at, sizeof(line) - (size_t)at, " %.2f [%.2f-%.2f] |", q[col], qlo[col], qhi[col]);
        }
        puts(line);
    }
    /* two threads on the same regions against one thread, same N: the pair's throughput over one thread's */
    for (k = 0; k < ROWS; k++) {
        if (rows[k].kind != PAIR_HIT)
            continue;
        for (j = 0; j < ROWS; j++) {
            double lo, hi;

            if (rows[j].kind != HIT_RAND || rows[j].n != rows[k].n || stat(0, 0, j, &lo, &hi) == 0 ||
                stat(0, 0, k, &lo, &hi) == 0)
                continue;   /* not measured (BENCH_ONLY) */
            printf("| 2-thread throughput / 1 thread | %u |", rows[k].n);
            for (col = 0; col < ncols; col++)
                printf(" %.2fx |", 2 * stat(col, 0, j, &lo, &hi) / stat(col, 0, k, &lo, &hi));
            printf("%s\n", ncols > 2 ? " | |" : " |");
        }
    }
    /*
     * The same, paired run by run in each process (v[1]), and the machine's
     * ceiling measured beside each pair (v[2], ceiling(): no cache, in every
     * column's processes): medians and ranges over the processes.
     */
    for (k = 0; k < ROWS; k++) {
        static const char *const what[3] = { NULL, "2-thread throughput / 1 thread, paired",
                                             "the machine: 2 threads / 1 of a read-only two-load loop" };

        if (rows[k].kind != PAIR_HIT || res[0][0].v[1][k] == 0)
            continue;
        for (m = 1; m < 3; m++) {
            printf("| %s | %u |", what[m], rows[k].n);
            for (col = 0; col < ncols; col++) {
                double lo, hi, med = stat(col, m, k, &lo, &hi);

                printf(" %.2fx [%.2f-%.2f] |", med, lo, hi);
            }
            printf("%s\n", ncols > 2 ? " | |" : " |");
        }
    }
    munmap(arena, (size_t)(MAXN + 1) * STRIDE);
    if (failed)
        fprintf(stderr, "bench_cache: a check failed (see above)\n");
    return failed;
}
