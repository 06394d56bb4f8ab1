/*
 * Thread tests of src/core/cache.c (also run under TSan).
 *
 * The backend is the recording double of backend.h: it hands out handle ids
 * in the order reg() is entered, which lets a test tell a registration begun
 * before an invalidation from one begun after it. No test asserts a timing:
 * where a test wants a thread to be inside reg(), the backend tells it so.
 */
#include <infiniband/verbs.h>
#include <pthread.h>
#include <sched.h>
#include <semaphore.h>
#include <signal.h>

#include <time.h>

#include "cachetest.h"
#include "core/notify.h"

/*
 * The miss's own source, with its announcement's window (between the look
 * at the lock word and the CAS) widened by a yield while `widen_window` is set:
 * the_races_again_in_one_process sets it.
 */
static int widen_window;
#define ANNOUNCE_WINDOW() ((void)(__atomic_load_n(&widen_window, __ATOMIC_RELAXED) && sched_yield()))
#include "core/cache_miss.c"

#define LW IBV_ACCESS_LOCAL_WRITE
#define RW IBV_ACCESS_REMOTE_WRITE
#define RR IBV_ACCESS_REMOTE_READ




/* ---- two threads missing on one range ------------------------------------ */

enum { THREADS = 4, ROUNDS = 150 };

struct same {
    drc_cache_t *c;
    pthread_barrier_t start, end;
    drc_region_t *got[THREADS];
    int err[THREADS];
    int round;
};

struct same_arg {
    struct same *s;
    int me;
};

static int slow_reg(struct tb *b, unsigned long id, void *arg)
{
    (void)b;
    (void)id;
    (void)arg;
    sched_yield();  /* a slow backend: widen the window in which others miss too */
    sched_yield();
    return 0;
}

static void *same_range_thread(void *p)
{
    struct same_arg *a = p;
    struct same *s = a->s;
    int k;

    for (k = 0; k < ROUNDS; k++) {
        pthread_barrier_wait(&s->start);
        /* every thread asks for an overlapping part of the round's fresh range */
        s->err[a->me] = drc_get(s->c, at(8 * (size_t)k, (size_t)a->me * 16), 64, LW, &s->got[a->me]);
        pthread_barrier_wait(&s->end);
        pthread_barrier_wait(&s->start);    /* main checks between the rounds */
    }
    return NULL;
}

static void concurrent_misses_leave_one_region(void **state)
{
    struct tb *b = tb_new();
    struct same s = { .c = mk(b, NULL) };
    struct same_arg args[THREADS];
    pthread_t th[THREADS];
    struct drc_stats st = { .comp_mask = DRC_STATS_ALL };
    int i, k;

    (void)state;
    b->reg_hook = slow_reg;
    pthread_barrier_init(&s.start, NULL, THREADS + 1);
    pthread_barrier_init(&s.end, NULL, THREADS + 1);
    for (i = 0; i < THREADS; i++) {
        args[i] = (struct same_arg){ &s, i };
        pthread_create(&th[i], NULL, same_range_thread, &args[i]);
    }
    for (k = 0; k < ROUNDS; k++) {
        pthread_barrier_wait(&s.start);
        pthread_barrier_wait(&s.end);
        /* one registration of page 8k, shared by all */
        for (i = 0; i < THREADS; i++) {
            assert_int_equal(s.err[i], 0);
            assert_int_equal(drc_region_valid(s.got[i]), 1);
        }
        assert_int_equal(tb_nreg(b), (unsigned long)k + 1);
        for (i = 1; i < THREADS; i++)
            assert_ptr_equal(s.got[i], s.got[0]);
        drc_cache_stats(s.c, &st);
        assert_int_equal(st.regions, (uint64_t)k + 1);
        assert_int_equal(st.in_use, 1);
        for (i = 0; i < THREADS; i++)
            assert_int_equal(drc_put(s.c, s.got[i]), 0);
        pthread_barrier_wait(&s.start);
    }
    for (i = 0; i < THREADS; i++)
        pthread_join(th[i], NULL);
    EXPECT_STATS(s.c, .hits = (uint64_t)ROUNDS * (THREADS - 1), .misses = ROUNDS, .regs = ROUNDS,
                 .regions = ROUNDS, .bytes = (uint64_t)ROUNDS * pg());
    pthread_barrier_destroy(&s.start);
    pthread_barrier_destroy(&s.end);
    done(b, s.c);
}

/* ---- an invalidation while another thread's reg() is blocked ------------- */

struct gate {
    pthread_mutex_t m;
    pthread_cond_t cv;
    int inside, open;
    unsigned long block_id;     /* the registration to hold back */
};

static int gated_reg(struct tb *b, unsigned long id, void *arg)
{
    struct gate *g = arg;

    (void)b;
    if (id != g->block_id)
        return 0;
    pthread_mutex_lock(&g->m);
    g->inside = 1;
    pthread_cond_broadcast(&g->cv);
    while (!g->open)
        pthread_cond_wait(&g->cv, &g->m);
    pthread_mutex_unlock(&g->m);
    return 0;
}

struct getter {
    drc_cache_t *c;
    const void *addr;
    size_t len;
    drc_region_t *r;
    int err;
};

static void *getter_thread(void *p)
{
    struct getter *g = p;

    g->err = drc_get(g->c, g->addr, g->len, LW, &g->r);
    return NULL;
}

static void invalidation_while_reg_is_blocked(void **state)
{
    struct tb *b = tb_new();
    drc_cache_t *c = mk(b, NULL);
    struct gate g = { .m = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER, .block_id = 1 };
    struct getter x = { .c = c, .addr = at(0, 0), .len = 2 * pg() };
    struct drc_stats st = { .comp_mask = DRC_STATS_ALL };
    drc_region_t *o;
    pthread_t th;

    (void)state;
    b->reg_hook = gated_reg;
    b->reg_arg = &g;
    pthread_create(&th, NULL, getter_thread, &x);
    pthread_mutex_lock(&g.m);
    while (!g.inside)
        pthread_cond_wait(&g.cv, &g.m);
    pthread_mutex_unlock(&g.m);

    /* reg() is blocked: the cache's lock must be free for everything else */
    drc_cache_stats(c, &st);
    assert_int_equal(st.misses, 1);
    assert_int_equal(st.regions, 0);
    o = get_ok(c, at(10, 0), pg(), LW);         /* another range: id 2 */
    assert_int_equal(rid(o), 2);
    assert_int_equal(drc_put(c, o), 0);
    assert_int_equal(drc_cache_destroy(c), -EBUSY);     /* a registration is in flight */
    /* the memory under the blocked registration is freed */
    assert_int_equal(drc_invalidate(c, at(1, 0), 1), 0);

    pthread_mutex_lock(&g.m);
    g.open = 1;
    pthread_cond_broadcast(&g.cv);
    pthread_mutex_unlock(&g.m);
    pthread_join(th, NULL);

    /* the raced registration (id 1) was never returned, and was deregistered */
    assert_int_equal(x.err, 0);
    assert_int_equal(rid(x.r), 3);
    assert_int_equal(tb_is_live(b, 1), 0);
    assert_int_equal(drc_region_valid(x.r), 1);
    EXPECT_STATS(c, .misses = 3, .regs = 3, .deregs = 1, .regions = 2, .bytes = 3 * pg(), .in_use = 1);
    assert_int_equal(drc_put(c, x.r), 0);
    done(b, c);
}

/* A second getter of the same range waits for the blocked one instead of registering again. */
static void second_getter_waits_for_pending_registration(void **state)
{
    struct tb *b = tb_new();
    drc_cache_t *c = mk(b, NULL);
    struct gate g = { .m = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER, .block_id = 1 };
    struct getter x = { .c = c, .addr = at(0, 0), .len = pg() };
    struct getter y = { .c = c, .addr = at(0, 8), .len = 8 };
    pthread_t tx, ty;

    (void)state;
    b->reg_hook = gated_reg;
    b->reg_arg = &g;
    pthread_create(&tx, NULL, getter_thread, &x);
    pthread_mutex_lock(&g.m);
    while (!g.inside)
        pthread_cond_wait(&g.cv, &g.m);
    pthread_mutex_unlock(&g.m);
    pthread_create(&ty, NULL, getter_thread, &y);
    /* y runs (or will run) while x's registration is pending; let x finish whenever y got there */
    sched_yield();
    pthread_mutex_lock(&g.m);
    g.open = 1;
    pthread_cond_broadcast(&g.cv);
    pthread_mutex_unlock(&g.m);
    pthread_join(tx, NULL);
    pthread_join(ty, NULL);
    assert_int_equal(x.err, 0);
    assert_int_equal(y.err, 0);
    assert_ptr_equal(x.r, y.r);
    assert_int_equal(tb_nreg(b), 1);
    EXPECT_STATS(c, .hits = 1, .misses = 1, .regs = 1, .regions = 1, .bytes = pg(), .in_use = 1);
    assert_int_equal(drc_put(c, x.r), 0);
    assert_int_equal(drc_put(c, y.r), 0);
    done(b, c);
}

/* ---- hits, misses and merges racing invalidations ------------------------ */

enum {
    SPACE = 16, HITTERS = 2, INVALIDATIONS = 5000, MIN_GETS = 20000,
    MAX_TRIES = 200000,     /* per hitter: keeps the backend's registrations under TB_MAX */
};

struct race {
    drc_cache_t *c;
    struct tb *b;
    unsigned long floor[SPACE];     /* atomic: no region covering page p may have an id <= floor[p] */
    int stop;                       /* atomic */
    unsigned long violations, not_live, bad_bounds, gets, errors;  /* atomic */
    int by_handle;                  /* invalidate with drc_region_invalidate, not by range */
    int disjoint;                   /* one-page regions on even pages only, one access: none overlap */
    unsigned long epoch;            /* atomic: by-handle invalidations returned so far */
};

/* by handle: dead_at[id] = the epoch at which region id was invalidated (0: never) */
static unsigned long dead_at[TB_MAX + 1];

struct hitter {
    struct race *x;
    uint64_t rng;
};

static uint64_t xs(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static void *hitter_thread(void *p)
{
    static const unsigned acc[] = { LW, RR, LW | RW, 0 };
    struct hitter *h = p;
    struct race *x = h->x;
    unsigned long snap[SPACE], epoch, dead;
    drc_region_t *r;
    uintptr_t s;
    size_t len, i, first, npages;
    int err, tries;

    for (tries = 0; tries < MAX_TRIES && !__atomic_load_n(&x->stop, __ATOMIC_ACQUIRE); tries++) {
        size_t page = xs(&h->rng) % SPACE, off = xs(&h->rng) % pg();
        size_t want = 1 + xs(&h->rng) % (2 * pg());
        unsigned a = acc[xs(&h->rng) % 4];

        if (x->disjoint) {
            page &= ~(size_t)1;     /* gaps on the odd pages: free events there take the lockless probe */
            off = 0;
            want = pg();
            a = LW;
        }
        if (page * pg() + off + want > SPACE * pg())
            want = SPACE * pg() - page * pg() - off;
        /* invalidations that returned before this get began */
        for (i = 0; i < SPACE; i++)
            snap[i] = __atomic_load_n(&x->floor[i], __ATOMIC_ACQUIRE);
        epoch = __atomic_load_n(&x->epoch, __ATOMIC_ACQUIRE);
        err = drc_get(x->c, at(page, off), want, a, &r);
        if (err) {
            /* -EAGAIN: invalidated again and again while registering, a documented outcome */
            if (err != -EAGAIN)
                __atomic_fetch_add(&x->errors, 1, __ATOMIC_RELAXED);
            continue;
        }
        __atomic_fetch_add(&x->gets, 1, __ATOMIC_RELAXED);
        drc_region_bounds(r, &s, &len);
        if (s > (uintptr_t)at(page, off) || s + len < (uintptr_t)at(page, off) + want ||
            (drc_region_access(r) & a) != a)
            __atomic_fetch_add(&x->bad_bounds, 1, __ATOMIC_RELAXED);
        /* held: its handle must still be registered */
        if (!tb_is_live(x->b, rid(r)))
            __atomic_fetch_add(&x->not_live, 1, __ATOMIC_RELAXED);
        /* a region invalidated by its handle before this get began */
        dead = __atomic_load_n(&dead_at[rid(r)], __ATOMIC_ACQUIRE);
        if (dead && dead <= epoch)
            __atomic_fetch_add(&x->violations, 1, __ATOMIC_RELAXED);
        first = (s - BASE) / pg();
        npages = len / pg();
        for (i = first; i < first + npages && i < SPACE; i++)
            if (rid(r) <= snap[i])
                __atomic_fetch_add(&x->violations, 1, __ATOMIC_RELAXED);
        /* still held: still registered, whatever was invalidated meanwhile */
        if (!tb_is_live(x->b, rid(r)))
            __atomic_fetch_add(&x->not_live, 1, __ATOMIC_RELAXED);
        drc_put(x->c, r);
    }
    return NULL;
}

static void race_invalidations(const struct drc_config *cfg, int by_handle, int disjoint)
{
    struct race x = { 0 };
    struct hitter h[HITTERS];
    pthread_t th[HITTERS];
    uint64_t rng = 42;
    struct drc_stats st = { .comp_mask = DRC_STATS_ALL };
    unsigned long before;
    int i, k;
    size_t p;

    x.b = tb_new();
    x.c = mk(x.b, cfg);
    x.by_handle = by_handle;
    x.disjoint = disjoint;
    memset(dead_at, 0, sizeof(dead_at));
    for (i = 0; i < HITTERS; i++) {
        h[i] = (struct hitter){ &x, 0x1234567ull * (uint64_t)(i + 1) };
        pthread_create(&th[i], NULL, hitter_thread, &h[i]);
    }
    /* run until both sides did enough: the hitters may start late on a loaded machine */
    for (k = 0; k < INVALIDATIONS || (__atomic_load_n(&x.gets, __ATOMIC_RELAXED) < MIN_GETS && k < 20 * INVALIDATIONS);
         k++) {
        size_t page = xs(&rng) % SPACE, n = 1 + xs(&rng) % 3;

        if (page + n > SPACE)
            n = SPACE - page;
        /* every registration entered before this point has an id <= before */
        before = tb_nreg(x.b);
        if (by_handle) {
            /* the region serving this page now, invalidated by its handle while held */
            drc_region_t *r;
            unsigned long next = x.epoch + 1;

            if (drc_get(x.c, at(page, 0), pg(), LW, &r))
                continue;
            assert_true(drc_region_invalidate(x.c, r) >= 0);
            __atomic_store_n(&dead_at[rid(r)], next, __ATOMIC_RELEASE);
            __atomic_store_n(&x.epoch, next, __ATOMIC_RELEASE);
            assert_int_equal(drc_put(x.c, r), 0);
            continue;
        }
        if (disjoint) {
            n = 1;
            assert_true(drc_notify_free(at(page, 0), pg()) >= 0);  /* a free event: gap or region */
        } else
            assert_true(drc_invalidate(x.c, at(page, xs(&rng) % 64), n * pg() - 64) >= 0);
        for (p = page; p < page + n; p++)
            __atomic_store_n(&x.floor[p], before, __ATOMIC_RELEASE);
        if (k % 64 == 0)
            sched_yield();
    }
    __atomic_store_n(&x.stop, 1, __ATOMIC_RELEASE);
    for (i = 0; i < HITTERS; i++)
        pthread_join(th[i], NULL);
    assert_int_equal(x.errors, 0);
    assert_int_equal(x.violations, 0);
    assert_int_equal(x.not_live, 0);
    assert_int_equal(x.bad_bounds, 0);
    drc_cache_stats(x.c, &st);
    print_message("%lu gets (%llu hits, %llu misses, %llu merges) against %d invalidations\n", x.gets,
                  (unsigned long long)st.hits, (unsigned long long)st.misses, (unsigned long long)st.merges, k);
    assert_int_equal(st.in_use, 0);
    assert_int_equal(st.regs, tb_nreg(x.b));
    assert_int_equal(st.regs - st.deregs, tb_live(x.b));
    assert_int_equal(tb_live(x.b), st.regions);
    if (cfg && cfg->max_regions)
        assert_true(st.regions <= cfg->max_regions);
    done(x.b, x.c);
}

static void gets_after_invalidate_never_return_old_regions(void **state)
{
    (void)state;
    race_invalidations(NULL, 0, 0);
}

static void same_race_without_merging(void **state)
{
    struct drc_config cfg = { .flags = DRC_F_NO_MERGE };

    (void)state;
    race_invalidations(&cfg, 0, 0);
}

static void same_race_with_eviction(void **state)
{
    struct drc_config cfg = { .max_regions = 3, .max_bytes = 6 * pg() };

    (void)state;
    race_invalidations(&cfg, 0, 0);
}

/* ---- stats while other threads take and drop references ---------------- */

struct refs {
    drc_cache_t *c;
    int me;
};

static void *refs_thread(void *p)
{
    struct refs *a = p;
    drc_region_t *r1, *r2;
    int k;

    for (k = 0; k < 20000; k++) {
        const void *addr = at(16 * (size_t)a->me + (size_t)k % 8, 0);

        if (drc_get(a->c, addr, 1, LW, &r1) || drc_get(a->c, addr, 1, LW, &r2))
            abort();
        drc_put(a->c, r2);
        drc_put(a->c, r1);
    }
    return NULL;
}

/*
 * stats takes no lock and walks nothing, and in_use (kept per thread) never
 * overcounts and is exact at rest: each thread holds at most one region at a
 * time, and drc.h promises that a snapshot counts no thread as holding more
 * than it held at once (the next test aims at the read that broke it).
 */
static void stats_are_kept_as_they_change(void **state)
{
    struct tb *b = tb_new();
    drc_cache_t *c = mk(b, NULL);
    struct refs args[2] = { { c, 0 }, { c, 1 } };
    struct drc_stats st = { .comp_mask = 0 };
    pthread_t th[2];
    int i;

    (void)state;
    for (i = 0; i < 2; i++)
        pthread_create(&th[i], NULL, refs_thread, &args[i]);
    for (i = 0; i < 2000; i++) {
        drc_cache_stats(c, &st);
        assert_true(st.in_use <= 2);        /* each thread holds at most one region at a time */
        assert_true(st.regions <= 16);
        assert_true(st.bytes <= 16 * pg());     /* each field is exact, the set is not one instant */
    }
    for (i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    EXPECT_STATS(c, .hits = 2 * 20000 * 2 - 16, .misses = 16, .regs = 16, .regions = 16, .bytes = 16 * pg());
    done(b, c);
}

/*
 * in_use while a thread moves from a reference in a region's word to one in
 * its thread slot: stats reads the word's counts and the slots one after the
 * other, and a thread that puts the one and takes the other in between was
 * counted twice (a miss hands out the word's reference, a hit a slot's, once
 * two threads hit the cache). What a user would check: one thread that never
 * holds more than one region at a time is never counted as holding two. The
 * reader is this thread: the worker stops it with a signal wherever it is in
 * its loop of drc_cache_stats, moves from A (a miss) to B (a hit) while it is
 * stopped, and holds B until that stats call has returned. Where the signal
 * lands is chance; over MOVES tries it lands between the two reads many
 * times. Under TSan a signal waits for the next interceptor (the mutex in the
 * loop), after the stats call: the test then runs without its power, never
 * falsely. (Seen to fail: before stats read the word's counts again after
 * the slots, it counted 2 here in every run.)
 */
enum { MOVES = 2000 };

static struct move {
    drc_cache_t *c;
    pthread_t reader;
    sem_t stopped, moved, ack;
    unsigned want_ack, stop;    /* atomic */
} mv;

/* the reader, stopped (async-signal-safe: sem_post, sem_wait) */
static void stopped_by_worker(int sig)
{
    (void)sig;
    sem_post(&mv.stopped);
    while (sem_wait(&mv.moved))
        ;
}

static void *move_thread(void *p)
{
    drc_region_t *a, *b;
    int k;

    (void)p;
    for (k = 0; k < MOVES && !__atomic_load_n(&mv.stop, __ATOMIC_SEQ_CST); k++) {
        if (drc_get(mv.c, at(0, 0), pg(), LW, &a))      /* a miss: the word's reference */
            abort();
        pthread_kill(mv.reader, SIGUSR1);
        while (sem_wait(&mv.stopped))
            ;
        drc_put(mv.c, a);
        if (drc_get(mv.c, at(4, 0), pg(), LW, &b))      /* a hit: this thread's slot */
            abort();
        __atomic_store_n(&mv.want_ack, 1, __ATOMIC_SEQ_CST);
        sem_post(&mv.moved);
        while (sem_wait(&mv.ack))       /* the stopped stats call returned */
            ;
        drc_put(mv.c, b);
        drc_invalidate(mv.c, at(0, 0), pg());           /* A misses again next time */
    }
    __atomic_store_n(&mv.stop, 1, __ATOMIC_SEQ_CST);
    return NULL;
}

static void stats_count_a_moving_reference_once(void **state)
{
    struct tb *b = tb_new();
    struct sigaction sa = { .sa_handler = stopped_by_worker }, old;
    struct drc_stats st = { .comp_mask = 0 };   /* no DRC_STATS_DETACHED: stopped, it holds no lock */
    pthread_mutex_t m = PTHREAD_MUTEX_INITIALIZER;
    drc_region_t *r;
    uint64_t most = 0;
    cpu_set_t cpus, pin;
    int i, n, one[2];
    pthread_t th;

    (void)state;
    mv = (struct move){ .c = mk(b, NULL), .reader = pthread_self() };
    sem_init(&mv.stopped, 0, 0);
    sem_init(&mv.moved, 0, 0);
    sem_init(&mv.ack, 0, 0);
    /* B registered and hit by this thread, so that the worker's hits count in its slot (it joins) */
    r = get_ok(mv.c, at(4, 0), pg(), LW);
    assert_int_equal(drc_put(mv.c, r), 0);
    r = get_ok(mv.c, at(4, 0), pg(), LW);
    assert_int_equal(drc_put(mv.c, r), 0);
    sigemptyset(&sa.sa_mask);
    sigaction(SIGUSR1, &sa, &old);
    pthread_create(&th, NULL, move_thread, NULL);
    /*
     * Each on a CPU of its own where there are two: on one, the worker would
     * run only when the reader sleeps or is preempted, and the signal would
     * land there, mostly after the wake-up of the worker, not inside stats.
     */
    sched_getaffinity(0, sizeof(cpus), &cpus);
    for (i = 0, n = 0; i < CPU_SETSIZE && n < 2; i++)
        if (CPU_ISSET(i, &cpus))
            one[n++] = i;
    if (n == 2) {
        CPU_ZERO(&pin);
        CPU_SET(one[0], &pin);
        pthread_setaffinity_np(pthread_self(), sizeof(pin), &pin);
        CPU_ZERO(&pin);
        CPU_SET(one[1], &pin);
        pthread_setaffinity_np(th, sizeof(pin), &pin);
    }
    while (!__atomic_load_n(&mv.stop, __ATOMIC_SEQ_CST)) {
        drc_cache_stats(mv.c, &st);
        if (st.in_use > most)
            most = st.in_use;
        if (__atomic_exchange_n(&mv.want_ack, 0, __ATOMIC_SEQ_CST))
            sem_post(&mv.ack);
        pthread_mutex_lock(&m);     /* an interceptor: TSan delivers the signal here */
        pthread_mutex_unlock(&m);
    }
    pthread_join(th, NULL);
    pthread_setaffinity_np(pthread_self(), sizeof(cpus), &cpus);
    sigaction(SIGUSR1, &old, NULL);
    assert_true(most <= 1);         /* the worker held one region at a time */
    assert_true(most == 1);         /* and stats saw it hold one */
    EXPECT_STATS(mv.c, .hits = 1 + MOVES, .misses = 1 + MOVES, .regs = 1 + MOVES, .deregs = MOVES,
                 .invalidated = MOVES, .regions = 1, .bytes = pg());
    done(b, mv.c);
}

/* ---- references that cross threads ------------------------------------- */

/*
 * A hit counts its reference in its own thread's slot of the cache (cache.c,
 * "Thread references"), and a user may put it from another thread, as a
 * transfer engine that posts on one thread and completes on another does.
 * What a user would check: the put succeeds, a put too many fails, the
 * region stays registered while any thread holds it after an invalidation,
 * is deregistered once when the last one lets go, and stats count a region
 * that two threads hold once. (Tried by hand: without the drain's move of
 * the slot counts into the word, invalidated_region_lives_while_two_threads_hold_it
 * sees the region deregistered under the first holder; with a put that
 * looks only in its own slot and the word, the handed-over puts fail with
 * -EINVAL.)
 */
enum { HANDED = 8 };

struct handover {
    drc_cache_t *c;
    drc_region_t *r[HANDED];
    int err[HANDED];
    int extra;          /* what one put too many returned */
};

static void *put_thread(void *p)
{
    struct handover *h = p;
    int i;

    for (i = 0; i < HANDED; i++)
        h->err[i] = drc_put(h->c, h->r[i]);
    h->extra = drc_put(h->c, h->r[0]);
    return NULL;
}

static void references_put_by_another_thread(void **state)
{
    struct tb *b = tb_new();
    drc_cache_t *c = mk(b, NULL);
    struct handover h = { .c = c };
    pthread_t th;
    int i;

    (void)state;
    /* four misses (the word's references), then hits: this thread's three slots, then the word */
    for (i = 0; i < HANDED; i++) {
        if (i == 4)
            hit_from_another_thread(c, at(0, 0));  /* a second thread hit: slots from now on */
        assert_int_equal(drc_get(c, at((size_t)i % 4, 0), pg(), LW, &h.r[i]), 0);
    }
    EXPECT_STATS(c, .hits = HANDED - 3, .misses = 4, .regs = 4, .regions = 4, .bytes = 4 * pg(), .in_use = 4);
    pthread_create(&th, NULL, put_thread, &h);
    pthread_join(th, NULL);
    for (i = 0; i < HANDED; i++)
        assert_int_equal(h.err[i], 0);
    assert_int_equal(h.extra, -EINVAL);
    EXPECT_STATS(c, .hits = HANDED - 3, .misses = 4, .regs = 4, .regions = 4, .bytes = 4 * pg(), .in_use = 0);
    assert_int_equal(drc_put(c, h.r[1]), -EINVAL);  /* and none left for this thread either */
    /* idle now: an invalidation deregisters all at once */
    assert_int_equal(drc_invalidate(c, at(0, 0), 4 * pg()), 4);
    assert_int_equal(tb_live(b), 0);
    done(b, c);
}

struct holder {
    drc_cache_t *c;
    drc_region_t *r;
    pthread_barrier_t *held, *invalidated;
    int err, live_after;
    struct tb *b;
};

static void *holder_thread(void *p)
{
    struct holder *h = p;

    h->err = drc_get(h->c, at(0, 64), 64, LW, &h->r);     /* a hit: this thread's slot */
    pthread_barrier_wait(h->held);
    pthread_barrier_wait(h->invalidated);
    h->live_after = h->r && tb_is_live(h->b, rid(h->r));
    return NULL;
}

static void invalidated_region_lives_while_two_threads_hold_it(void **state)
{
    struct tb *b = tb_new();
    drc_cache_t *c = mk(b, NULL);
    pthread_barrier_t held, invalidated;
    struct holder h[2];
    pthread_t th[2];
    drc_region_t *r;
    int i;

    (void)state;
    assert_int_equal(drc_get(c, at(0, 0), pg(), LW, &r), 0);
    assert_int_equal(drc_put(c, r), 0);
    pthread_barrier_init(&held, NULL, 3);
    pthread_barrier_init(&invalidated, NULL, 3);
    for (i = 0; i < 2; i++) {
        h[i] = (struct holder){ .c = c, .held = &held, .invalidated = &invalidated, .b = b };
        pthread_create(&th[i], NULL, holder_thread, &h[i]);
    }
    pthread_barrier_wait(&held);
    assert_ptr_equal(h[0].r, r);
    assert_ptr_equal(h[1].r, r);
    EXPECT_STATS(c, .hits = 2, .misses = 1, .regs = 1, .regions = 1, .bytes = pg(), .in_use = 1);
    assert_int_equal(drc_invalidate(c, at(0, 0), pg()), 1);
    assert_int_equal(tb_live(b), 1);            /* held twice: not deregistered */
    pthread_barrier_wait(&invalidated);
    for (i = 0; i < 2; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(h[i].err, 0);
        assert_true(h[i].live_after);
    }
    assert_int_equal(drc_put(c, r), 0);         /* one holder's reference, put by this thread */
    assert_int_equal(tb_live(b), 1);
    assert_int_equal(drc_put(c, r), 0);         /* the last */
    assert_int_equal(tb_live(b), 0);
    assert_int_equal(drc_put(c, r), -EINVAL);
    pthread_barrier_destroy(&held);
    pthread_barrier_destroy(&invalidated);
    done(b, c);
}

/*
 * The same, racing: two threads get (their hits in their slots) and hand
 * every region to a third, which checks it is still registered and puts
 * it, while this thread invalidates the pages under them. What a user would
 * check: every put succeeds, no region is deregistered while a thread still
 * holds it, and at the end nothing is held and every registration was
 * deregistered once. (With the drain's move of slot counts taken out, the
 * putter finds regions deregistered under it: tried by hand.)
 */
enum { QN = 64, HANDOVERS = 30000, HO_PAGES = 8 };

struct hoq {
    drc_cache_t *c;
    struct tb *b;
    pthread_mutex_t m;
    pthread_cond_t cv;
    drc_region_t *q[QN];
    unsigned head, tail;        /* m */
    int getters_left;           /* m */
    unsigned long put_errors, not_live, puts, get_errors;   /* atomic */
};

static void *ho_getter(void *p)
{
    struct hoq *h = p;
    uint64_t rng = (uint64_t)(uintptr_t)&rng | 1;
    drc_region_t *r;
    int i, err;

    for (i = 0; i < HANDOVERS; i++) {
        err = drc_get(h->c, at(xs(&rng) % HO_PAGES, 64), 64, LW, &r);
        if (err) {
            if (err != -EAGAIN)
                __atomic_fetch_add(&h->get_errors, 1, __ATOMIC_RELAXED);
            continue;
        }
        pthread_mutex_lock(&h->m);
        while (h->tail - h->head == QN)
            pthread_cond_wait(&h->cv, &h->m);
        h->q[h->tail++ % QN] = r;
        pthread_cond_broadcast(&h->cv);
        pthread_mutex_unlock(&h->m);
    }
    pthread_mutex_lock(&h->m);
    h->getters_left--;
    pthread_cond_broadcast(&h->cv);
    pthread_mutex_unlock(&h->m);
    return NULL;
}

static void *ho_putter(void *p)
{
    struct hoq *h = p;
    drc_region_t *r;

    for (;;) {
        pthread_mutex_lock(&h->m);
        while (h->tail == h->head && h->getters_left)
            pthread_cond_wait(&h->cv, &h->m);
        if (h->tail == h->head) {
            pthread_mutex_unlock(&h->m);
            return NULL;
        }
        r = h->q[h->head++ % QN];
        pthread_cond_broadcast(&h->cv);
        pthread_mutex_unlock(&h->m);
        if (!tb_is_live(h->b, rid(r)))
            __atomic_fetch_add(&h->not_live, 1, __ATOMIC_RELAXED);
        if (drc_put(h->c, r))
            __atomic_fetch_add(&h->put_errors, 1, __ATOMIC_RELAXED);
        __atomic_fetch_add(&h->puts, 1, __ATOMIC_RELAXED);
    }
}

static void handed_over_references_race_invalidations(void **state)
{
    struct hoq h = { 0 };
    struct drc_stats st = { .comp_mask = DRC_STATS_ALL };
    pthread_t g[2], pt;
    uint64_t rng = 7;
    unsigned long k = 0;
    int i;

    (void)state;
    h.b = tb_new();
    h.c = mk(h.b, NULL);
    pthread_mutex_init(&h.m, NULL);
    pthread_cond_init(&h.cv, NULL);
    h.getters_left = 2;
    for (i = 0; i < 2; i++)
        pthread_create(&g[i], NULL, ho_getter, &h);
    pthread_create(&pt, NULL, ho_putter, &h);
    while (__atomic_load_n(&h.puts, __ATOMIC_RELAXED) < 2 * HANDOVERS - 64 && k < 200000) {
        pthread_mutex_lock(&h.m);
        i = h.getters_left;
        pthread_mutex_unlock(&h.m);
        if (!i)
            break;
        assert_true(drc_invalidate(h.c, at(xs(&rng) % HO_PAGES, 0), pg()) >= 0);
        if (++k % 16 == 0)
            sched_yield();
    }
    for (i = 0; i < 2; i++)
        pthread_join(g[i], NULL);
    pthread_join(pt, NULL);
    drc_cache_stats(h.c, &st);
    print_message("%lu references handed over and put, %lu invalidations, %llu hits\n", h.puts, k,
                  (unsigned long long)st.hits);
    assert_int_equal(h.get_errors, 0);
    assert_int_equal(h.put_errors, 0);
    assert_int_equal(h.not_live, 0);
    assert_int_equal(st.in_use, 0);
    assert_int_equal(st.detached, 0);
    assert_int_equal(st.regs - st.deregs, tb_live(h.b));
    assert_true(st.hits > 0);
    pthread_cond_destroy(&h.cv);
    pthread_mutex_destroy(&h.m);
    done(h.b, h.c);
}

/* ---- a getter meeting a free in flight sleeps until it ends ------------- */

struct freewait {
    drc_cache_t *c;
    drc_region_t *r;
    int err;
    long cpu_us;        /* CPU time the getter used */
};

static long thread_cpu_us(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec * 1000000L + ts.tv_nsec / 1000;
}

static void *freewait_thread(void *p)
{
    struct freewait *f = p;
    long t0 = thread_cpu_us();

    f->err = drc_get(f->c, at(41, 0), pg(), LW, &f->r);
    f->cpu_us = thread_cpu_us() - t0;
    return NULL;
}

/*
 * The free bracket's guarantee (no registration of memory being freed) with a
 * getter that blocks: a cudaFree may synchronise the device for a long time,
 * and a getter used to spin on sched_yield for all of it.
 */
static void getter_sleeps_through_a_free_in_flight(void **state)
{
    struct tb *b = tb_new();
    struct freewait f = { .c = mk(b, NULL) };
    pthread_t th;
    int ticket;

    (void)state;
    ticket = drc__notify_begin(at(40, 0), 4 * pg());
    assert_true(ticket >= 0);
    pthread_create(&th, NULL, freewait_thread, &f);
    usleep(300 * 1000);                 /* the free takes its time */
    assert_int_equal(tb_nreg(b), 0);    /* nothing registered while it is in flight */
    drc__notify_end(ticket);
    pthread_join(th, NULL);
    assert_int_equal(f.err, 0);
    assert_int_equal(tb_nreg(b), 1);
    /* asleep, not spinning: a spin used about all of the 300 ms */
    if (f.cpu_us > 60 * 1000)
        fail_msg("the getter used %ld us of CPU while it waited", f.cpu_us);
    assert_int_equal(drc_put(f.c, f.r), 0);
    done(b, f.c);
}

/* drc_region_invalidate against hitters: a region invalidated by its handle is never returned again */
static void gets_after_invalidate_by_handle_never_return_it(void **state)
{
    (void)state;
    race_invalidations(NULL, 1, 0);
}

/*
 * Free events racing inserts where regions never overlap, so that an event
 * in a gap returns from the lockless probe (neighbour links, hint slot,
 * floor descent) and one on a region takes the lock: no get begun after an
 * event returned gets a region registered before it.
 */
static void free_event_probe_racing_inserts(void **state)
{
    (void)state;
    race_invalidations(NULL, 0, 1);
}


/* ---- the used-grain filter while the hint table grows ------------------- */

/*
 * 2 x 550 regions: the last of four grows at 1,024 regions, then 76 inserts into the grown table.
 * A hundred rounds, twenty under TSan (where a round takes about two seconds).
 */
#if defined(__SANITIZE_THREAD__)
#define TSAN_BUILD 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define TSAN_BUILD 1
#endif
#endif
#ifdef TSAN_BUILD
enum { FILL_ROUNDS = 20 };
#else
enum { FILL_ROUNDS = 100 };
#endif
enum { FILL_THREADS = 2, FILL_EACH = 550 };

struct filler {
    drc_cache_t *c;
    int me;
    int err;
};

/* Region j (of FILL_THREADS * FILL_EACH) is page 2j: every region has a gap after it. */
static void *filler_thread(void *p)
{
    struct filler *f = p;
    drc_region_t *r;
    size_t k, j;

    for (k = 0; k < FILL_EACH && !f->err; k++) {
        /* out of address order (7919 is prime to FILL_EACH): an insert may land where a fill has been */
        j = k * 7919 % FILL_EACH * FILL_THREADS + (size_t)f->me;
        f->err = drc_get(f->c, at(2 * j, 0), pg(), LW, &r);
        if (!f->err)
            f->err = drc_put(f->c, r);
    }
    return NULL;
}

/*
 * A free event in a gap returns without the lock when the hint table's
 * used-grain filter has no bit for it (cache.c, used_set). A table grown
 * while another thread inserts must not claim to know every region: two
 * threads fill a cache through three table grows, each grow's lockless
 * fill racing the other thread's inserts, some of them behind the fill's
 * walk; then an event over each region must find it (1) and one over each
 * gap nothing (0). A filter that missed a region inserted during the last
 * fill would return 0 for it: the memory would be freed with its
 * registration still cached. A hundred caches, for a hundred last fills
 * (without the count check on the fill, nine runs in ten fail; one in
 * four with twenty).
 */
static void free_events_find_regions_inserted_while_the_hints_grow(void **state)
{
    struct filler f[FILL_THREADS];
    pthread_t th[FILL_THREADS];
    size_t j, missed = 0;
    int i, round;

    (void)state;
    for (round = 0; round < FILL_ROUNDS; round++) {
        struct tb *b = tb_new();
        drc_cache_t *c = mk(b, NULL);

        for (i = 0; i < FILL_THREADS; i++) {
            f[i] = (struct filler){ .c = c, .me = i };
            pthread_create(&th[i], NULL, filler_thread, &f[i]);
        }
        for (i = 0; i < FILL_THREADS; i++) {
            pthread_join(th[i], NULL);
            assert_int_equal(f[i].err, 0);
        }
        for (j = 0; j < (size_t)FILL_THREADS * FILL_EACH; j++) {
            assert_int_equal(drc_invalidate(c, at(2 * j + 1, 0), pg()), 0);   /* the gap after region j */
            if (drc_invalidate(c, at(2 * j, pg() / 2), 1) != 1)
                missed++;
        }
        assert_int_equal(tb_live(b), 0);
        done(b, c);
    }
    assert_int_equal(missed, 0);
}

/* ---- the same races again and again, in one process ------------------------
 *
 * The three races above whose loser would be a second registration of the
 * same pages, a get after a free event returning a region registered before
 * it, or a reference handed over to a region being freed, run one after
 * the other DRC_MT_LOOPS times (default 20; 3 under TSan), with a yield in
 * each announced miss between its look at the lock word and its CAS
 * (get_slow's announce()), where another thread's lock section can begin:
 * the CAS must then fail. The control, by hand: a build that reads the
 * announcement's checks after its CAS (the announced miss of 592403a,
 * tests/bench/RESULTS.md) fails this test in every run, most often with a
 * second registration of one page (`concurrent_misses_leave_one_region`'s
 * count). Without the yield that build failed only in some machine states,
 * within 2 to 50 rounds of two processes side by side (one whose unlock
 * does not advance the lock word's version fails here one run in several;
 * test_cache_probe's window test fails it every time). To soak:
 * DRC_MT_LOOPS=2000 build/tests/core/test_cache_mt.
 */
static void concurrent_misses_leave_one_region(void **state);
static void free_event_probe_racing_inserts(void **state);
static void handed_over_references_race_invalidations(void **state);

static void the_races_again_in_one_process(void **state)
{
    const char *e = getenv("DRC_MT_LOOPS");
#if defined(__SANITIZE_THREAD__)
    long i, n = e ? atol(e) : 3;
#else
    long i, n = e ? atol(e) : 20;
#endif

    __atomic_store_n(&widen_window, 1, __ATOMIC_RELAXED);
    for (i = 0; i < n; i++) {
        alarm(240);     /* each round has its own time */
        concurrent_misses_leave_one_region(state);
        free_event_probe_racing_inserts(state);
        handed_over_references_race_invalidations(state);
    }
    __atomic_store_n(&widen_window, 0, __ATOMIC_RELAXED);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(concurrent_misses_leave_one_region, setup_alarm),
        cmocka_unit_test_setup(invalidation_while_reg_is_blocked, setup_alarm),
        cmocka_unit_test_setup(second_getter_waits_for_pending_registration, setup_alarm),
        cmocka_unit_test_setup(gets_after_invalidate_never_return_old_regions, setup_alarm),
        cmocka_unit_test_setup(same_race_without_merging, setup_alarm),
        cmocka_unit_test_setup(same_race_with_eviction, setup_alarm),
        cmocka_unit_test_setup(gets_after_invalidate_by_handle_never_return_it, setup_alarm),
        cmocka_unit_test_setup(free_event_probe_racing_inserts, setup_alarm),
        cmocka_unit_test_setup(free_events_find_regions_inserted_while_the_hints_grow, setup_alarm),
        cmocka_unit_test_setup(stats_are_kept_as_they_change, setup_alarm),
        cmocka_unit_test_setup(stats_count_a_moving_reference_once, setup_alarm),
        cmocka_unit_test_setup(getter_sleeps_through_a_free_in_flight, setup_alarm),
        cmocka_unit_test_setup(references_put_by_another_thread, setup_alarm),
        cmocka_unit_test_setup(invalidated_region_lives_while_two_threads_hold_it, setup_alarm),
        cmocka_unit_test_setup(handed_over_references_race_invalidations, setup_alarm),
        cmocka_unit_test_setup(the_races_again_in_one_process, setup_alarm),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
