/*
 * DRC_F_REVOKE under threads (also run under TSan): the races of the
 * revocation timeline in cache.c (above revoke_take).
 *   - a drc_put racing the revoke: the handle is deregistered exactly once,
 *     and before the invalidation returns, whichever of the two goes first;
 *   - two invalidations of one held region: one dereg, and after both
 *     returned the region is off the backend;
 *   - drc_get/drc_put in loops against invalidations of the same range: every
 *     handle deregistered exactly once, none twice, nothing left at the end.
 * The backend is the recording double of backend.h; no test asserts a timing.
 */
#include <infiniband/verbs.h>
#include <pthread.h>
#include <sched.h>

#include "cachetest.h"

#define LW IBV_ACCESS_LOCAL_WRITE

enum { ROUNDS = 300, GETTERS = 3, LOOPS = 2000 };

static drc_cache_t *mk_revoke(struct tb *b)
{
    struct drc_config cfg = { .flags = DRC_F_REVOKE };

    return mk(b, &cfg);
}

/* ---- a put racing the revoke --------------------------------------------- */

struct race {
    drc_cache_t *c;
    pthread_barrier_t go, done;
    drc_region_t *r;
    int inval_first;        /* this round: 0 the put starts first, 1 the invalidation */
};

static void *putter(void *p)
{
    struct race *s = p;
    int k;

    for (k = 0; k < ROUNDS; k++) {
        pthread_barrier_wait(&s->go);
        if (s->inval_first)
            sched_yield();
        assert_int_equal(drc_put(s->c, s->r), 0);
        pthread_barrier_wait(&s->done);
    }
    return NULL;
}

static void put_racing_revoke(void **state)
{
    struct tb *b = tb_new();
    struct race s = { .c = mk_revoke(b) };
    pthread_t t;
    unsigned long id;
    int k;

    (void)state;
    pthread_barrier_init(&s.go, NULL, 2);
    pthread_barrier_init(&s.done, NULL, 2);
    assert_int_equal(pthread_create(&t, NULL, putter, &s), 0);
    for (k = 0; k < ROUNDS; k++) {
        s.r = get_ok(s.c, at(0, 0), pg(), LW);
        s.inval_first = k & 1;
        id = rid(s.r);
        pthread_barrier_wait(&s.go);
        if (!s.inval_first)
            sched_yield();
        assert_int_equal(drc_invalidate(s.c, at(0, 0), pg()), 1);
        /* returned: off the backend, whoever dropped the last reference */
        assert_int_equal(tb_is_live(b, id), 0);
        pthread_barrier_wait(&s.done);
        assert_int_equal(tb_get(b, id).deregs, 1);
    }
    pthread_join(t, NULL);
    assert_int_equal(b->bad_deregs, 0);
    pthread_barrier_destroy(&s.go);
    pthread_barrier_destroy(&s.done);
    done(b, s.c);
}

/* ---- two invalidations of one held region -------------------------------- */

struct twice {
    drc_cache_t *c;
    pthread_barrier_t go, done;
    int n[2];
};

static void *invalidator(void *p)
{
    struct twice *s = p;
    int k;

    for (k = 0; k < ROUNDS; k++) {
        pthread_barrier_wait(&s->go);
        s->n[1] = drc_invalidate(s->c, at(0, 0), pg());
        pthread_barrier_wait(&s->done);
    }
    return NULL;
}

static void two_invalidations_one_dereg(void **state)
{
    struct tb *b = tb_new();
    struct twice s = { .c = mk_revoke(b) };
    drc_region_t *r;
    pthread_t t;
    unsigned long id;
    int k;

    (void)state;
    pthread_barrier_init(&s.go, NULL, 2);
    pthread_barrier_init(&s.done, NULL, 2);
    assert_int_equal(pthread_create(&t, NULL, invalidator, &s), 0);
    for (k = 0; k < ROUNDS; k++) {
        r = get_ok(s.c, at(0, 0), pg(), LW);
        id = rid(r);
        pthread_barrier_wait(&s.go);
        s.n[0] = drc_invalidate(s.c, at(0, 0), pg());
        pthread_barrier_wait(&s.done);
        assert_int_equal(s.n[0] + s.n[1], 1);  /* one of them invalidated it */
        assert_int_equal(tb_is_live(b, id), 0);
        assert_int_equal(tb_get(b, id).deregs, 1);
        assert_int_equal(drc_region_valid(r), 0);
        assert_null(drc_region_handle(r));
        assert_int_equal(drc_put(s.c, r), 0);
        assert_int_equal(tb_get(b, id).deregs, 1);
    }
    pthread_join(t, NULL);
    assert_int_equal(b->bad_deregs, 0);
    pthread_barrier_destroy(&s.go);
    pthread_barrier_destroy(&s.done);
    done(b, s.c);
}

/* ---- getters against invalidations --------------------------------------- */

struct storm {
    drc_cache_t *c;
    int stop;
};

static void *getter(void *p)
{
    struct storm *s = p;
    drc_region_t *r;
    int k, err;

    for (k = 0; k < LOOPS; k++) {
        err = drc_get(s->c, at((size_t)(k % 3), 0), 2 * pg(), LW, &r);
        if (err == -EAGAIN)
            continue;       /* raced by invalidations REG_RETRIES times */
        assert_int_equal(err, 0);
        (void)drc_region_lkey(r);
        (void)drc_region_handle(r);
        if (k % 5 == 0)
            sched_yield();  /* hold it a while */
        assert_int_equal(drc_put(s->c, r), 0);
    }
    return NULL;
}

static void *storm_invalidator(void *p)
{
    struct storm *s = p;
    int k = 0;

    while (!__atomic_load_n(&s->stop, __ATOMIC_ACQUIRE)) {
        assert_true(drc_invalidate(s->c, at((size_t)(k++ % 4), 0), pg()) >= 0);
        sched_yield();
    }
    return NULL;
}

static void gets_against_revokes(void **state)
{
    struct tb *b = tb_new();
    struct storm s = { .c = mk_revoke(b) };
    pthread_t g[GETTERS], inv[2];
    struct drc_stats st = { .comp_mask = DRC_STATS_ALL };
    int i;

    (void)state;
    for (i = 0; i < 2; i++)
        assert_int_equal(pthread_create(&inv[i], NULL, storm_invalidator, &s), 0);
    for (i = 0; i < GETTERS; i++)
        assert_int_equal(pthread_create(&g[i], NULL, getter, &s), 0);
    for (i = 0; i < GETTERS; i++)
        pthread_join(g[i], NULL);
    __atomic_store_n(&s.stop, 1, __ATOMIC_RELEASE);
    for (i = 0; i < 2; i++)
        pthread_join(inv[i], NULL);
    drc_cache_stats(s.c, &st);
    assert_int_equal(st.in_use, 0);
    assert_int_equal(st.detached, 0);
    assert_int_equal(b->bad_deregs, 0);
    assert_int_equal(drc_invalidate(s.c, at(0, 0), 8 * pg()) >= 0, 1);
    done(b, s.c);       /* every handle deregistered exactly once */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(put_racing_revoke, setup_alarm),
        cmocka_unit_test_setup(two_invalidations_one_dereg, setup_alarm),
        cmocka_unit_test_setup(gets_against_revokes, setup_alarm),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
