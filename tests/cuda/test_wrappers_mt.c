/*
 * Thread tests of the free path (src/cuda/wrappers.c, src/cuda/free.c,
 * src/core/notify.c); also run under TSan.
 *
 * The property a user relies on: once a free of a range has begun (the
 * wrapper has notified), no drc_get() on that range that starts afterwards
 * returns the region registered on the old memory; it returns a region
 * registered after the free, or misses. The backend is the recording DOUBLE
 * of backend.h; the driver is THE CUDA double (tests/fake_cuda.h): each
 * round frees its allocation through the wrapper and allocates it again at
 * the same address (the double, as the driver, gives a freed gap of the same
 * size back), and the double's free callback bumps a "memory generation"
 * inside the free, after drc was notified. The backend stamps each
 * registration with the generation it saw when reg() began, so a stale
 * region is one whose stamp is older than the generation a getter saw
 * before its drc_get.
 */
#include <infiniband/verbs.h>
#include <pthread.h>
#include <sched.h>

#include "cachetest.h"
#include "drc_cuda.h"
#include "fake_cuda.h"

enum { ROUNDS = 3000, GETTERS = 2, PAGES = 4 };

static unsigned long gen = 1;           /* atomic: bumped inside every free of the double, after drc was notified */
static unsigned long stamp[TB_MAX + 1]; /* atomic: stamp[id] = generation when reg of id began */
static int stop;                        /* atomic */
static drc_cache_t *cache;
static struct tb *backend;

static drc__cuptr alloc;                /* the allocation, at the same address every round */

static void bump(uintptr_t ptr, size_t len, const char *entry, void *arg)
{
    (void)ptr;
    (void)len;
    (void)entry;
    (void)arg;
    /* the memory is going (and, for the next round, the same VA holds new memory) */
    __atomic_fetch_add(&gen, 1, __ATOMIC_SEQ_CST);
}

static int stamp_reg(struct tb *b, unsigned long id, void *arg)
{
    (void)b;
    (void)arg;
    __atomic_store_n(&stamp[id], __atomic_load_n(&gen, __ATOMIC_SEQ_CST), __ATOMIC_SEQ_CST);
    return 0;
}

static void *getter(void *arg)
{
    unsigned long bad = 0, *stale = arg;
    drc_region_t *r;
    int k = 0;

    while (!__atomic_load_n(&stop, __ATOMIC_SEQ_CST)) {
        unsigned long seen = __atomic_load_n(&gen, __ATOMIC_SEQ_CST);

        /* different sub-ranges of the allocation, so misses, merges and hits all happen */
        if (drc_get(cache, (const void *)(uintptr_t)(alloc + (k++ % PAGES) * pg()), pg(), IBV_ACCESS_LOCAL_WRITE,
                    &r) == 0) {
            if (__atomic_load_n(&stamp[rid(r)], __ATOMIC_SEQ_CST) < seen)
                bad++;
            drc_put(cache, r);
        }
    }
    *stale = bad;
    return NULL;
}

static void test_free_racing_get_never_returns_the_old_region(void **state)
{
    pthread_t t[GETTERS];
    unsigned long stale[GETTERS];
    struct drc_stats s = { .comp_mask = DRC_STATS_ALL };
    int i, frees = 1;

    (void)state;
    backend = tb_new();
    backend->reg_hook = stamp_reg;
    fc_reset();
    assert_int_equal(cuMemAlloc_v2(&alloc, PAGES * pg()), 0);
    fake_cuda_on_free(bump, NULL);
    assert_int_equal(drc_cache_create(&backend->be, NULL, &cache), 0);
    for (i = 0; i < GETTERS; i++)
        assert_int_equal(pthread_create(&t[i], NULL, getter, &stale[i]), 0);
    /* at least ROUNDS frees, and on until some of them found a live region to invalidate (bounded) */
    for (i = 0; i < 100 * ROUNDS; i++, frees++) {
        drc__cuptr again = 0;

        /* the wrapper looks the allocation up, notifies, then frees; the next round's memory takes its place */
        assert_int_equal(drc_cuMemFree(alloc), 0);
        assert_int_equal(cuMemAlloc_v2(&again, PAGES * pg()), 0);
        assert_true(again == alloc);
        if (i % 64 == 0) {
            sched_yield();
            drc_cache_stats(cache, &s);
            if (i >= ROUNDS && s.invalidated >= 10)
                break;
        }
    }
    __atomic_store_n(&stop, 1, __ATOMIC_SEQ_CST);
    for (i = 0; i < GETTERS; i++) {
        assert_int_equal(pthread_join(t[i], NULL), 0);
        assert_int_equal(stale[i], 0);
    }
    drc_cache_stats(cache, &s);
    printf("%d frees, %llu gets hit, %llu missed, %llu regions invalidated\n", frees,
           (unsigned long long)s.hits, (unsigned long long)s.misses, (unsigned long long)s.invalidated);
    assert_true(s.invalidated > 0);     /* the race was real: frees found live regions */
    assert_int_equal(drc_cache_destroy(cache), 0);
    assert_int_equal(tb_all_released_once(backend), 0);
    tb_free(backend);
    fake_cuda_on_free(NULL, NULL);
    assert_int_equal(cuMemFree_v2(alloc), 0);
    drc__cuda_set_driver(NULL);
}

/* Caches created and destroyed while other threads notify: no notifier touches a freed cache (TSan/ASan). */
static void *notifier(void *arg)
{
    (void)arg;
    while (!__atomic_load_n(&stop, __ATOMIC_SEQ_CST))
        drc_notify_free(at(0, 0), 8 * pg());
    return NULL;
}

static void test_notify_racing_create_destroy(void **state)
{
    pthread_t t[2];
    struct tb *b = tb_new();
    drc_cache_t *c;
    int i;

    (void)state;
    __atomic_store_n(&stop, 0, __ATOMIC_SEQ_CST);
    for (i = 0; i < 2; i++)
        assert_int_equal(pthread_create(&t[i], NULL, notifier, NULL), 0);
    for (i = 0; i < 500; i++) {
        drc_region_t *r;
        int err;

        assert_int_equal(drc_cache_create(&b->be, NULL, &c), 0);
        /* the notifiers free this very range without pause: -EAGAIN is the documented answer then */
        err = drc_get(c, at((size_t)(i % 8), 0), pg(), 1, &r);
        assert_true(err == 0 || err == -EAGAIN);
        if (!err)
            assert_int_equal(drc_put(c, r), 0);
        assert_int_equal(drc_cache_destroy(c), 0);
    }
    __atomic_store_n(&stop, 1, __ATOMIC_SEQ_CST);
    for (i = 0; i < 2; i++)
        assert_int_equal(pthread_join(t[i], NULL), 0);
    assert_int_equal(tb_all_released_once(b), 0);
    tb_free(b);
}


int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_free_racing_get_never_returns_the_old_region, setup_alarm),
        cmocka_unit_test_setup(test_notify_racing_create_destroy, setup_alarm),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
