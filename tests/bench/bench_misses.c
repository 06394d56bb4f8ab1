/*
 * Where a hit, an invalidation and a miss go to memory: drc and UCX's
 * ucs_rcache on bench_cache's workload at 65,536 regions, for callgrind's
 * cache model (tests/bench/counts.sh runs it and prints the counts per
 * operation; tests/bench/profile.sh splits drc's by function).
 *
 * Usage: bench_misses [drc|ucx [N [random|address]]] (neither: both, one
 * process each). The caches, the backend that does no work, the regions (64
 * KiB at a 128 KiB stride in reserved address space, 64 KiB-aligned) and the
 * operations are bench_cache's; each operation is its own non-inlined
 * function, so that callgrind's inclusive cost of it over the calls the
 * program prints is the cost of one. A round: shuffle the regions; take the
 * first N / 8 and
 *   op_hit         hit each at a random interior slice
 *   op_invalidate  invalidate each held, by handle (get, invalidate, put)
 *   op_miss        register each again
 *   op_range       invalidate each held, by range (drc_invalidate; UCX's
 *                  free event), then op_refill registers it again
 *   op_free        a free event over each, idle (drc_notify_free; UCX's
 *                  munmap event), in the shuffled order or, with
 *                  `address`, N / 8 regions in address order (the next
 *                  ones each round); then
 *   op_drain       once: the get that misses after them, where UCX
 *                  deregisters what its events invalidated (bench_cache's
 *                  sentinel_get), then the sentinel is dropped and
 *                  op_refill registers the N / 8 again.
 * After the rounds, once (bench_cache's "repopulating" row): every region
 * invalidated by handle, then
 *   op_again       each registered again, in address order (N of them).
 * Natively it prints ns per operation too, but bench_cache is the one to
 * time with.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>

#include "pair.h"

enum {
    REGION = 64 << 10,
    STRIDE = 128 << 10,
    SLICE  = 32 << 10,
    ROUNDS = 4,
};

static char *space;
static uint32_t sentinel;   /* the region after the N: bench_cache's SENTINEL */
static struct cache cache;
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rng(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

static void *get(uint32_t i, size_t off, size_t len)
{
    return cache_get(&cache, space + (size_t)i * STRIDE + off, len);
}

static void put(void *r)
{
    cache_put(&cache, r);
}

static void must(void *r)
{
    if (!r) {
        fprintf(stderr, "bench_misses: a get failed\n");
        exit(1);
    }
}

__attribute__((noinline)) void op_hit(uint32_t i, size_t off)
{
    void *r = get(i, off, SLICE);

    must(r);
    put(r);
}

/* UCX's munmap hook, minus the system call (exported by libucm, not declared in its public header) */
void ucm_event_enter(void);
void ucm_event_leave(void);
void ucm_event_dispatch(ucm_event_type_t event_type, ucm_event_t *event);

static void free_event(void *a, size_t len)
{
    ucm_event_t ev;

    if (!cache.ucx) {
        if (drc_notify_free(a, len) != 1) {
            fprintf(stderr, "bench_misses: a free event did not invalidate its region\n");
            exit(1);
        }
        return;
    }
    ev.vm_unmapped.address = a;
    ev.vm_unmapped.size = len;
    ucm_event_enter();
    ucm_event_dispatch(UCM_EVENT_VM_UNMAPPED, &ev);
    ucm_event_leave();
}

__attribute__((noinline)) void op_invalidate(uint32_t i)
{
    void *r = get(i, 0, REGION);

    must(r);
    if (cache.ucx)
        ucx_region_invalidate(cache.u, r);
    else if (drc_region_invalidate(cache.d, r) != 1) {
        fprintf(stderr, "bench_misses: a held region was not invalidated\n");
        exit(1);
    }
    put(r);
}

__attribute__((noinline)) void op_range(uint32_t i)
{
    void *r = get(i, 0, REGION);

    must(r);
    if (cache.ucx)
        free_event(space + (size_t)i * STRIDE, REGION);
    else if (drc_invalidate(cache.d, space + (size_t)i * STRIDE, REGION) != 1) {
        fprintf(stderr, "bench_misses: a held region was not invalidated by range\n");
        exit(1);
    }
    put(r);
}

__attribute__((noinline)) void op_free(uint32_t i)
{
    free_event(space + (size_t)i * STRIDE, REGION);
}

__attribute__((noinline)) void op_drain(void)
{
    void *r = get(sentinel, 0, REGION);

    must(r);
    put(r);
}

__attribute__((noinline)) void op_refill(uint32_t i)
{
    void *r = get(i, 0, REGION);

    must(r);
    put(r);
}


/* registers region i (its first registration: the fill, not counted) */
static void fill(uint32_t i)
{
    void *r = get(i, 0, REGION);

    must(r);
    put(r);
}

/* registers region i again, after op_invalidate took it out */
__attribute__((noinline)) void op_miss(uint32_t i)
{
    void *r = get(i, 0, REGION);

    must(r);
    put(r);
}

/* registers region i again, the cache emptied (repopulation, in address order) */
__attribute__((noinline)) void op_again(uint32_t i)
{
    void *r = get(i, 0, REGION);

    must(r);
    put(r);
}

/* invalidates region i, held, by handle (untimed: the sentinel after op_drain, the emptying before op_again) */
static void drop(uint32_t i)
{
    void *r = get(i, 0, REGION);

    must(r);
    if (cache.ucx)
        ucx_region_invalidate(cache.u, r);
    else
        drc_region_invalidate(cache.d, r);
    put(r);
}

static int run(const char *name, uint32_t n, int address)
{
    uint32_t batch = n / 8, i, j, t, *perm, *order, next = 0;
    uint64_t ns[6] = { 0 }, t0;
    int k;

    if (!strcmp(name, "ucx"))
        ucm_set_external_event(UCM_EVENT_VM_UNMAPPED);     /* as bench_cache: no hook patched in */
    perm = malloc(n * sizeof(*perm));
    order = malloc(batch * sizeof(*order));
    sentinel = n;
    space = reserve((size_t)(n + 1) * STRIDE);
    if (!perm || !order || !space)
        return 2;
    cache = cache_new(!strcmp(name, "ucx"));
    for (i = 0; i < n; i++) {
        perm[i] = i;
        fill(i);
    }
    for (k = 0; k < ROUNDS; k++) {
        for (i = n - 1; i > 0; i--) {
            j = (uint32_t)(rng() % (i + 1));
            t = perm[i];
            perm[i] = perm[j];
            perm[j] = t;
        }
        t0 = now_ns();
        for (i = 0; i < batch; i++)
            op_hit(perm[i], (size_t)(rng() % ((REGION / 2) / 64)) * 64);
        ns[0] += now_ns() - t0;
        t0 = now_ns();
        for (i = 0; i < batch; i++)
            op_invalidate(perm[i]);
        ns[1] += now_ns() - t0;
        t0 = now_ns();
        for (i = 0; i < batch; i++)
            op_miss(perm[i]);
        ns[2] += now_ns() - t0;
        t0 = now_ns();
        for (i = 0; i < batch; i++)
            op_range(perm[i]);
        ns[3] += now_ns() - t0;
        for (i = 0; i < batch; i++)
            op_refill(perm[i]);
        for (i = 0; i < batch; i++, next = (next + 1) % n)
            order[i] = address ? next : perm[i];
        t0 = now_ns();
        for (i = 0; i < batch; i++)
            op_free(order[i]);
        op_drain();
        ns[4] += now_ns() - t0;
        drop(sentinel);
        for (i = 0; i < batch; i++)
            op_refill(order[i]);
    }
    for (i = 0; i < n; i++)
        drop(i);
    t0 = now_ns();
    for (i = 0; i < n; i++)
        op_again(i);
    ns[5] = now_ns() - t0;
    if (cache.ucx)
        ucs_rcache_destroy(cache.u);
    else if (drc_cache_destroy(cache.d))
        return 1;
    printf("%s, %u regions, free events in %s order: %u of each operation (op_drain %u, op_refill %u, "
           "op_again %u); ns per op_hit %.1f, op_invalidate %.1f, op_miss %.1f, op_range %.1f, op_free with "
           "op_drain %.1f, op_again %.1f\n",
           name, n, address ? "address" : "random", ROUNDS * batch, ROUNDS, 2 * ROUNDS * batch, n,
           (double)ns[0] / (ROUNDS * batch), (double)ns[1] / (ROUNDS * batch), (double)ns[2] / (ROUNDS * batch),
           (double)ns[3] / (ROUNDS * batch), (double)ns[4] / (ROUNDS * batch), (double)ns[5] / n);
    if (regs != deregs || regs != 2 * (unsigned long)n + (unsigned long)ROUNDS * (3 * batch + 1)) {
        fprintf(stderr, "bench_misses: %llu registrations, %llu deregistrations\n", (unsigned long long)regs,
                (unsigned long long)deregs);
        return 1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    uint32_t n = argc > 2 ? (uint32_t)strtoul(argv[2], NULL, 0) : 65536;
    int k, st, failed = 0, address = argc > 3 && !strcmp(argv[3], "address");
    pid_t pid;

    if ((argc > 1 && strcmp(argv[1], "drc") && strcmp(argv[1], "ucx")) || n < 8 ||
        (argc > 3 && !address && strcmp(argv[3], "random"))) {
        fprintf(stderr, "usage: bench_misses [drc|ucx [N >= 8 [random|address]]]\n");
        return 2;
    }
    if (argc > 1)
        return run(argv[1], n, address);
    for (k = 0; k < 2; k++) {   /* both caches, each in a process of its own */
        fflush(stdout);
        pid = fork();
        if (pid == 0)
            exit(run(k ? "ucx" : "drc", n, 0));
        if (pid < 0 || waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st))
            failed = 1;
    }
    return failed;
}
