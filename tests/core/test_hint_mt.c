/*
 * Thread tests of the hint table's growth (src/core/cache_hint.c), also run
 * under TSan: while one thread fills a cache through many table grows, each
 * of which installs a larger table and gives the replaced table's slot
 * pages back (they read as zero afterwards), other threads hit, free and
 * register again the regions already there. What a user checks: no get
 * that begins after a free event over a cached region returned hands out
 * the region it invalidated
 * (its memory may be gone: an rkey to it would let a peer write freed
 * memory). A held region is always still registered.
 *
 * The backend is the recording double of backend.h (handle ids in the order
 * registrations are entered). The control runs the same threads with the
 * free events left out: the checker then sees the old region again, so the
 * check can fail.
 */
#include <infiniband/verbs.h>
#include <pthread.h>
#include <sched.h>

#include "cachetest.h"

#define LW IBV_ACCESS_LOCAL_WRITE

/*
 * 8,192 regions: the table grows six times (256 slots to 16 Ki), each grow
 * racing the others' lookups. DRC_DEBUG builds (ASan, TSan) check the whole
 * tree at every unlock: 1,024 regions there, three grows.
 */
#ifdef DRC_DEBUG
enum { ROUNDS = 2, NREG = 1024 };
#else
enum { ROUNDS = 8, NREG = 8192 };
#endif
enum { CHECKERS = 2, MIN_ITERS = 256 };

struct race {
    drc_cache_t *c;
    struct tb *b;
    int control;                /* leave the free events out */
    unsigned order[NREG];       /* region j (page 2j) in the order the filler registers it */
    unsigned ready;             /* atomic: order[0..ready) are registered */
    int done;                   /* atomic: the filler finished */
    unsigned long events, gap_found, stale, not_live, errors;     /* atomic adds */
};

struct checker {
    struct race *x;
    int me;
    uint64_t rng;
};

static uint64_t xs(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static void add(unsigned long *n)
{
    __atomic_fetch_add(n, 1, __ATOMIC_RELAXED);
}

static void *filler_thread(void *p)
{
    struct race *x = p;
    drc_region_t *r;
    unsigned k;

    for (k = 0; k < NREG; k++) {
        if (drc_get(x->c, at(2 * (size_t)x->order[k], 0), pg(), LW, &r)) {
            add(&x->errors);
            continue;
        }
        drc_put(x->c, r);
        __atomic_store_n(&x->ready, k + 1, __ATOMIC_RELEASE);
        if (!(k & (k + 1)))
            usleep(2000);   /* a table grew (at powers of two): the others probe it with no writer at work */
    }
    __atomic_store_n(&x->done, 1, __ATOMIC_RELEASE);
    return NULL;
}

/*
 * A region of this checker's (j % CHECKERS == me: no other thread frees it),
 * registered: get it (hit or miss), put it, free it, then get it again: a
 * new registration, never the region the event invalidated. (The event's
 * count is not checked: one that finds the lock taken hands its range to the
 * holder and returns 0, and the hitter may hold the region, which then
 * stays registered until its put.) A free event in the gap after it finds
 * nothing.
 */
static void *checker_thread(void *p)
{
    struct checker *ck = p;
    struct race *x = ck->x;
    drc_region_t *r;
    unsigned long old;
    unsigned ready, j, iters = 0;

    /* until the filler is done, and at least MIN_ITERS rounds (a loaded machine may run the filler first) */
    while (!__atomic_load_n(&x->done, __ATOMIC_ACQUIRE) || iters < MIN_ITERS) {
        ready = __atomic_load_n(&x->ready, __ATOMIC_ACQUIRE);
        if (!ready) {
            sched_yield();
            continue;
        }
        j = x->order[xs(&ck->rng) % ready];
        if (j % CHECKERS != (unsigned)ck->me)
            continue;
        if (drc_get(x->c, at(2 * (size_t)j, 0), pg(), LW, &r)) {
            add(&x->errors);
            continue;
        }
        old = rid(r);
        drc_put(x->c, r);
        if (drc_invalidate(x->c, at(2 * (size_t)j + 1, 0), pg()) != 0)    /* the gap after it */
            add(&x->gap_found);
        if (!x->control) {
            if (drc_invalidate(x->c, at(2 * (size_t)j, 64), 64) < 0)
                add(&x->errors);
            add(&x->events);
        }
        if (drc_get(x->c, at(2 * (size_t)j, 128), 256, LW, &r)) {
            add(&x->errors);
            continue;
        }
        if (rid(r) == old)
            add(&x->stale);
        drc_put(x->c, r);
        iters++;
    }
    return NULL;
}

/* Gets of any registered region, held for a moment: a held region is registered. */
static void *hitter_thread(void *p)
{
    struct checker *h = p;
    struct race *x = h->x;
    drc_region_t *r;
    unsigned ready;

    while (!__atomic_load_n(&x->done, __ATOMIC_ACQUIRE)) {
        ready = __atomic_load_n(&x->ready, __ATOMIC_ACQUIRE);
        if (!ready) {
            sched_yield();
            continue;
        }
        if (drc_get(x->c, at(2 * (size_t)x->order[xs(&h->rng) % ready], 32), 32, LW, &r)) {
            add(&x->errors);
            continue;
        }
        if (!tb_is_live(x->b, rid(r)))
            add(&x->not_live);
        drc_put(x->c, r);
    }
    return NULL;
}

static void run(struct race *x, int control, uint64_t seed)
{
    struct checker ck[CHECKERS + 1];
    pthread_t th[CHECKERS + 2];
    unsigned k;
    int i;

    x->b = tb_new();
    x->c = mk(x->b, NULL);
    x->control = control;
    for (k = 0; k < NREG; k++)
        x->order[k] = (unsigned)(k * 5167u % NREG);   /* out of address order: grows fill a scattered table */
    for (i = 0; i <= CHECKERS; i++) {
        ck[i] = (struct checker){ .x = x, .me = i, .rng = seed * 0x9e3779b97f4a7c15ull + (uint64_t)i + 1 };
        pthread_create(&th[i], NULL, i < CHECKERS ? checker_thread : hitter_thread, &ck[i]);
    }
    pthread_create(&th[CHECKERS + 1], NULL, filler_thread, x);
    for (i = 0; i < CHECKERS + 2; i++)
        pthread_join(th[i], NULL);
    done(x->b, x->c);
}

static void no_stale_hit_while_tables_grow_and_drop(void **state)
{
    static struct race x;
    unsigned long events = 0;
    int round;

    (void)state;
    for (round = 0; round < ROUNDS; round++) {
        memset(&x, 0, sizeof(x));
        run(&x, 0, (uint64_t)round);
        assert_int_equal(x.errors, 0);
        assert_int_equal(x.gap_found, 0);
        assert_int_equal(x.stale, 0);
        assert_int_equal(x.not_live, 0);
        events += x.events;
    }
    print_message("%lu free events on cached regions while the tables grew\n", events);
    assert_true(events > 0);
}

/* The control: without the free events, the get after them returns the region it had (the check can fail). */
static void control_without_free_events_sees_the_old_region(void **state)
{
    static struct race x;

    (void)state;
    memset(&x, 0, sizeof(x));
    run(&x, 1, 99);
    assert_int_equal(x.errors, 0);
    assert_int_equal(x.not_live, 0);
    assert_true(x.stale > 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(no_stale_hit_while_tables_grow_and_drop, setup_alarm),
        cmocka_unit_test_setup(control_without_free_events_sees_the_old_region, setup_alarm),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
