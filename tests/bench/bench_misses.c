/*
 * Where a hit, a held invalidation and a miss go to memory: drc and UCX's
 * ucs_rcache on bench_cache's workload at 65,536 regions, for callgrind's
 * cache model (tests/bench/counts.sh runs it and prints the counts per
 * operation; tests/bench/RESULTS.md's "Why the missed rows are missed" quotes them).
 *
 * Usage: bench_misses [drc|ucx [N]] (neither: both, one process each). The caches, the backend that does no
 * work, the regions (64 KiB at a 128 KiB stride in reserved address space)
 * and the operations are bench_cache's; each operation is its own
 * non-inlined function (op_hit, op_invalidate, op_miss), so that
 * callgrind's inclusive cost of it is the cost of N / 8 * ROUNDS of them.
 * A round: shuffle the regions, hit the first N / 8 at a random interior
 * slice, invalidate them held, register them again, in that order (as
 * bench_cache's held-invalidation row does). Natively it prints ns per
 * operation too, but bench_cache is the one to time with.
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

__attribute__((noinline)) void op_invalidate(uint32_t i)
{
    void *r = get(i, 0, REGION);

    must(r);
    if (cache.ucx)
        ucs_rcache_region_invalidate(cache.u, r, ucx_inv_done, NULL);
    else if (drc_region_invalidate(cache.d, r) != 1) {
        fprintf(stderr, "bench_misses: a held region was not invalidated\n");
        exit(1);
    }
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

static int run(const char *name, uint32_t n)
{
    uint32_t batch = n / 8, i, j, t, *perm;
    uint64_t ns[3] = { 0 }, t0;
    int k;

    if (!strcmp(name, "ucx"))
        ucm_set_external_event(UCM_EVENT_VM_UNMAPPED);     /* as bench_cache: no hook patched in */
    perm = malloc(n * sizeof(*perm));
    space = mmap(NULL, (size_t)n * STRIDE, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (!perm || space == MAP_FAILED)
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
    }
    if (cache.ucx)
        ucs_rcache_destroy(cache.u);
    else if (drc_cache_destroy(cache.d))
        return 1;
    printf("%s, %u regions: %u of each operation; ns per op_hit %.1f, op_invalidate %.1f, op_miss %.1f\n",
           name, n, ROUNDS * batch, (double)ns[0] / (ROUNDS * batch), (double)ns[1] / (ROUNDS * batch),
           (double)ns[2] / (ROUNDS * batch));
    if (regs != deregs || regs != n + (unsigned long)ROUNDS * batch) {
        fprintf(stderr, "bench_misses: %llu registrations, %llu deregistrations\n", (unsigned long long)regs,
                (unsigned long long)deregs);
        return 1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    uint32_t n = argc > 2 ? (uint32_t)strtoul(argv[2], NULL, 0) : 65536;
    int k, st, failed = 0;
    pid_t pid;

    if ((argc > 1 && strcmp(argv[1], "drc") && strcmp(argv[1], "ucx")) || n < 8) {
        fprintf(stderr, "usage: bench_misses [drc|ucx [N >= 8]]\n");
        return 2;
    }
    if (argc > 1)
        return run(argv[1], n);
    for (k = 0; k < 2; k++) {   /* both caches, each in a process of its own */
        fflush(stdout);
        pid = fork();
        if (pid == 0)
            exit(run(k ? "ucx" : "drc", n));
        if (pid < 0 || waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st))
            failed = 1;
    }
    return failed;
}
