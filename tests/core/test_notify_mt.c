/*
 * Thread tests of src/core/notify.c (also run under TSan): free events from
 * several threads at once, each counting itself in its own row of the users
 * table, while caches are created and destroyed under them.
 *
 * What a user would check:
 *   - drc_invalidate's guarantee through drc_notify_free: once a free event
 *     returned, no drc_get begun after it returns a region registered before
 *     it over the freed range (the floors of test_cache_mt.c);
 *   - drc_cache_destroy returns only once no free event is inside the cache:
 *     a free event that invalidated one of its regions and is still in the
 *     backend's dereg() keeps destroy (its unsubscribe) waiting.
 *
 * Seeing a notifier inside a cache: the destroyed cache's backend (the
 * recording double of backend.h) runs a hook in every dereg() a worker
 * makes, which counts itself in, waits until the destroyer has begun to
 * destroy, lets it run a little, then looks whether the cache is marked
 * dead. The destroyer marks it dead when drc_cache_destroy returned. The
 * control marks it dead before drc_cache_destroy is called, which is what a
 * destroy that did not wait for its notifiers (an unsubscribe without its
 * drain) would look like to the hook: the hook must then see it, so the
 * check is known to fail when it should. The control does not really skip
 * the drain: that would free the cache under the worker, which ASan and
 * TSan would report before any assertion could. (With the drain taken out
 * of drc__notify_unsubscribe, the first test fails at its check that no
 * worker is inside once destroy returned: tried by hand, not kept as a
 * build.) No test asserts a timing:
 * each wait ends when what it waits for happened or after WAIT_MS of the
 * clock, whichever comes first, and a round in which no worker reached a
 * hook is only counted. (A round can have none: a free event that finds the
 * cache's lock held queues its range for the holder, and the destroyer, which
 * holds it for its gets, then deregisters the region itself. Bounded by
 * two million yields instead, such a round took minutes under ASan on two
 * vCPUs with four threads runnable.)
 */
#include <infiniband/verbs.h>
#include <pthread.h>
#include <sched.h>
#include <time.h>

#include "cachetest.h"

#define LW IBV_ACCESS_LOCAL_WRITE

enum {
    SPACE = 16,         /* pages of fake address space that free events and gets share */
    WORKERS = 3,        /* threads issuing free events and gets */
    ROUNDS = 60,        /* caches created and destroyed under them */
    WAIT_MS = 2000,     /* bound on every wait below: a stuck thread ends its wait, never the test */
    HOLD_YIELDS = 50,   /* a hook's pause once destroy has begun: time for a destroy that does not wait */
};

/* One destroyed cache: what its backend's dereg hook and the destroyer share (all atomic). */
struct round {
    int inside;         /* workers in the hook now */
    int entered;        /* workers that entered the hook in this round */
    int destroying;     /* the destroyer has begun (and may be inside drc_cache_destroy) */
    int dead;           /* the cache counts as freed */
    int seen_dead;      /* hooks that found the cache dead while inside it */
};

/* Yield until *flag (atomic) is non-zero or WAIT_MS passed; returns *flag. */
static int wait_for(int *flag)
{
    struct timespec t0, t;
    unsigned k;
    int v;

    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (k = 1; !(v = __atomic_load_n(flag, __ATOMIC_SEQ_CST)); k++) {
        sched_yield();
        if (k % 64)
            continue;
        clock_gettime(CLOCK_MONOTONIC, &t);
        if ((t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000 >= WAIT_MS)
            break;
    }
    return v;
}

static __thread int worker;     /* this thread issues free events (only workers' deregs are watched) */

static int watched_dereg(struct tb *b, unsigned long id, void *arg)
{
    struct round *r = arg;
    int k;

    (void)b;
    (void)id;
    if (!worker)
        return 0;       /* the destroyer's own deregs of the regions left */
    __atomic_fetch_add(&r->inside, 1, __ATOMIC_SEQ_CST);
    __atomic_fetch_add(&r->entered, 1, __ATOMIC_SEQ_CST);
    wait_for(&r->destroying);
    for (k = 0; k < HOLD_YIELDS; k++)
        sched_yield();
    if (__atomic_load_n(&r->dead, __ATOMIC_SEQ_CST))
        __atomic_fetch_add(&r->seen_dead, 1, __ATOMIC_SEQ_CST);
    __atomic_fetch_sub(&r->inside, 1, __ATOMIC_SEQ_CST);
    return 0;
}

struct shared {
    drc_cache_t *c;             /* lives through the whole test: the gets' cache */
    struct tb *b;
    unsigned long floor[SPACE]; /* atomic: no region of c covering page p may have an id <= floor[p] */
    int stop;                   /* atomic */
    unsigned long violations, gets, frees, errors;  /* atomic */
};

struct worker_arg {
    struct shared *x;
    uint64_t rng;
};

static uint64_t xs(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static void raise_floor(unsigned long *f, unsigned long v)
{
    unsigned long old = __atomic_load_n(f, __ATOMIC_RELAXED);

    while (old < v && !__atomic_compare_exchange_n(f, &old, v, 1, __ATOMIC_RELEASE, __ATOMIC_RELAXED))
        ;
}

static void *worker_thread(void *p)
{
    struct worker_arg *a = p;
    struct shared *x = a->x;
    unsigned long snap[SPACE], before;
    drc_region_t *r;
    uintptr_t s;
    size_t len, page, n, i;
    int err;

    worker = 1;
    while (!__atomic_load_n(&x->stop, __ATOMIC_ACQUIRE)) {
        page = xs(&a->rng) % SPACE;
        n = page + 2 <= SPACE ? 1 + xs(&a->rng) % 2 : 1;
        /* gets stop before the backend runs out of handles (TB_MAX); free events go on */
        if (xs(&a->rng) % 2 || tb_nreg(x->b) > TB_MAX / 2) {
            /* a free event: every registration entered before it has an id <= before */
            before = tb_nreg(x->b);
            if (drc_notify_free(at(page, 0), n * pg()) < 0)
                __atomic_fetch_add(&x->errors, 1, __ATOMIC_RELAXED);
            for (i = page; i < page + n; i++)
                raise_floor(&x->floor[i], before);
            __atomic_fetch_add(&x->frees, 1, __ATOMIC_RELAXED);
            continue;
        }
        for (i = 0; i < SPACE; i++)
            snap[i] = __atomic_load_n(&x->floor[i], __ATOMIC_ACQUIRE);
        err = drc_get(x->c, at(page, xs(&a->rng) % 64), n * pg() - 64, LW, &r);
        if (err) {
            if (err != -EAGAIN)     /* freed again and again while it registered: documented */
                __atomic_fetch_add(&x->errors, 1, __ATOMIC_RELAXED);
            continue;
        }
        __atomic_fetch_add(&x->gets, 1, __ATOMIC_RELAXED);
        drc_region_bounds(r, &s, &len);
        for (i = (s - BASE) / pg(); i < (s - BASE + len) / pg() && i < SPACE; i++)
            if (rid(r) <= snap[i])
                __atomic_fetch_add(&x->violations, 1, __ATOMIC_RELAXED);
        if (drc_put(x->c, r))
            __atomic_fetch_add(&x->errors, 1, __ATOMIC_RELAXED);
    }
    return NULL;
}

/*
 * Caches come and go under the workers' free events. Each round: a cache
 * with a region on every page (workers' free events then deregister them,
 * inside watched_dereg), a wait until a worker is in a hook, then the
 * destroy. @early_dead: the control (see the top of the file).
 */
static void notifiers_against_destroy(int early_dead)
{
    struct shared x = { 0 };
    struct worker_arg args[WORKERS];
    pthread_t th[WORKERS];
    unsigned long exercised = 0, seen_dead = 0;
    int i, k;
    size_t p;

    x.b = tb_new();
    x.c = mk(x.b, NULL);
    for (i = 0; i < WORKERS; i++) {
        args[i] = (struct worker_arg){ &x, 0x9e3779b97f4a7c15ull * (uint64_t)(i + 1) };
        pthread_create(&th[i], NULL, worker_thread, &args[i]);
    }
    for (k = 0; k < ROUNDS; k++) {
        struct round rd = { 0 };
        struct tb *b = tb_new();
        drc_cache_t *c = mk(b, NULL);
        drc_region_t *r;
        int err;

        b->dereg_hook = watched_dereg;
        b->dereg_arg = &rd;
        for (p = 0; p < SPACE; p++) {
            err = drc_get(c, at(p, 0), pg(), LW, &r);
            assert_true(err == 0 || err == -EAGAIN);
            if (!err)
                assert_int_equal(drc_put(c, r), 0);
        }
        wait_for(&rd.inside);
        exercised += __atomic_load_n(&rd.inside, __ATOMIC_SEQ_CST) != 0;
        if (early_dead)
            __atomic_store_n(&rd.dead, 1, __ATOMIC_SEQ_CST);
        __atomic_store_n(&rd.destroying, 1, __ATOMIC_SEQ_CST);
        assert_int_equal(drc_cache_destroy(c), 0);
        /* destroy returned: no worker may still be inside c, in the hook or anywhere else */
        assert_int_equal(__atomic_load_n(&rd.inside, __ATOMIC_SEQ_CST), 0);
        __atomic_store_n(&rd.dead, 1, __ATOMIC_SEQ_CST);
        seen_dead += (unsigned long)__atomic_load_n(&rd.seen_dead, __ATOMIC_SEQ_CST);
        assert_int_equal(tb_live(b), 0);
        assert_int_equal(tb_all_released_once(b), 0);
        tb_free(b);
    }
    __atomic_store_n(&x.stop, 1, __ATOMIC_RELEASE);
    for (i = 0; i < WORKERS; i++)
        pthread_join(th[i], NULL);
    print_message("%s: %d caches destroyed, %lu with a worker inside at destroy, %lu hooks saw a dead cache; "
                  "%lu free events, %lu gets\n", early_dead ? "control (dead before destroy)" : "destroy, then dead",
                  ROUNDS, exercised, seen_dead, x.frees, x.gets);
    assert_int_equal(x.errors, 0);
    assert_int_equal(x.violations, 0);
    assert_true(exercised >= ROUNDS / 2);   /* the window was there to be caught in most rounds */
    if (early_dead)
        assert_true(seen_dead > 0);         /* the control: a cache dead under a notifier is seen */
    else
        assert_int_equal(seen_dead, 0);
    done(x.b, x.c);
}

static void destroy_waits_for_free_events_inside(void **state)
{
    (void)state;
    notifiers_against_destroy(0);
}

static void control_a_cache_dead_under_a_notifier_is_seen(void **state)
{
    (void)state;
    notifiers_against_destroy(1);
}

/*
 * More threads issuing free events than there are thread slots (tslot.h):
 * the ones beyond share the last row of the users table, with atomic adds,
 * and destroy still waits for every one of them.
 */
enum { MANY = 72 };

struct many {
    drc_cache_t *c;
    pthread_barrier_t go;
    int stop;
    unsigned long notified;
};

static void *many_thread(void *p)
{
    struct many *m = p;
    int n;

    pthread_barrier_wait(&m->go);   /* all alive at once: every slot taken, the rest share */
    while (!__atomic_load_n(&m->stop, __ATOMIC_ACQUIRE)) {
        n = drc_notify_free(at(0, 0), SPACE * pg());
        if (n > 0)
            __atomic_fetch_add(&m->notified, (unsigned long)n, __ATOMIC_RELAXED);
        sched_yield();
    }
    return NULL;
}

static void free_events_beyond_the_thread_slots(void **state)
{
    struct many m = { 0 };
    pthread_t th[MANY];
    struct tb *b = tb_new();
    int i, k;
    size_t p;

    (void)state;
    pthread_barrier_init(&m.go, NULL, MANY + 1);
    for (i = 0; i < MANY; i++)
        pthread_create(&th[i], NULL, many_thread, &m);
    pthread_barrier_wait(&m.go);
    for (k = 0; k < 200; k++) {
        drc_cache_t *c = mk(b, NULL);
        drc_region_t *r;
        int err;

        for (p = 0; p < 4; p++) {
            err = drc_get(c, at(p, 0), pg(), LW, &r);
            assert_true(err == 0 || err == -EAGAIN);
            if (!err)
                assert_int_equal(drc_put(c, r), 0);
        }
        assert_int_equal(drc_cache_destroy(c), 0);
    }
    __atomic_store_n(&m.stop, 1, __ATOMIC_RELEASE);
    for (i = 0; i < MANY; i++)
        pthread_join(th[i], NULL);
    pthread_barrier_destroy(&m.go);
    print_message("%lu regions invalidated by %d threads\n", m.notified, MANY);
    assert_int_equal(tb_live(b), 0);
    assert_int_equal(tb_all_released_once(b), 0);
    tb_free(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(destroy_waits_for_free_events_inside, setup_alarm),
        cmocka_unit_test_setup(control_a_cache_dead_under_a_notifier_is_seen, setup_alarm),
        cmocka_unit_test_setup(free_events_beyond_the_thread_slots, setup_alarm),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
