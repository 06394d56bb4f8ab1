/*
 * The miss's probe (struct probe, src/core/cache_int.h): a lockless lookup
 * that walked the index and found nothing over the range's pages hands that
 * answer to the miss after it, whose plan, under the lock, takes it without
 * walking again only if the index has not changed since. What could go wrong
 * is a plan that trusts an answer the index moved under, or one given for
 * other pages than it registers: it would register a region over memory a
 * live region already serves (two NIC registrations of the same memory, an
 * overlap that coalescing promises never to leave), where the right answer
 * is a hit or a merge.
 *
 * The window between the probe and the plan is reached without threads: the
 * core's memory classifier (mem.h), which every miss calls after its lookup
 * and before it takes the lock, is stood in for by one that, once armed,
 * registers memory itself on the same cache (a nested drc_get, as another
 * thread's miss would in that window). To make the lookup walk at all, the
 * range was registered once and invalidated (its grains stay marked used),
 * and its hint slot was taken by another region since (no stale hint sends
 * it to the locked path before the walk).
 *
 * The controls: the first scenario with the nested registration of a range
 * that does not touch the request (the index still moves: the plan walks,
 * and registers the request as a region of its own); the widened one not
 * widened (the request's page alone, beside the other region). And, by
 * hand: a build whose plan takes the probe without drc__itree_unchanged()
 * fails the first test (a second registration of the same pages), and one
 * that takes it without comparing the planned range fails the widened one
 * (no merge, a region beside another).
 *
 * The announced miss (get_slow's announce(), which takes the probe's
 * "nothing" with one CAS on the lock word instead of the first lock
 * section): in the first test its checks, read before the CAS, find the
 * index moved, and the miss plans under the lock. The next three register
 * with the miss announced (white-box: its bit in c->lw, nothing counted in
 * npending) and check what the lock section guaranteed: an invalidation of
 * the range during the registration drops it (the free event's lockless
 * probe must see the bit, and the invalidation mark the record stale), one
 * of another range does not (the control), and a second miss of the same
 * pages waits for the announced one and hits its region (one registration).
 * By hand: a build whose invalidation does not mark announced records, or
 * whose lockless probe does not read the bits, fails the first of them;
 * one whose pending_overlaps does not read the announced records fails the
 * last. The last two reach the window between the announcement's look at
 * the lock word and its CAS through the miss's own source (included below
 * with its seam): a lock section there must make the CAS fail, which a
 * build whose unlock leaves the version as it was does not.
 */

#include <pthread.h>
#include <sched.h>

#include "cachetest.h"
#include "core/cache.h"
#include "core/cache_int.h"
#include "core/mem.h"
#include "memseam.h"

/*
 * The miss's own source, whose announcement's window (between the look at
 * the lock word and the CAS) is reached once for the cache in window_cache,
 * and there takes and lets go of its lock if window_section.
 */
static drc_cache_t *window_cache;
static int window_section;

static void in_window(drc_cache_t *c)
{
    if (c != window_cache)
        return;
    window_cache = NULL;
    if (window_section) {
        lock(c);
        unlock(c);
    }
}

#define ANNOUNCE_WINDOW() in_window(c)
#include "core/cache_miss.c"

#define LW IBV_ACCESS_LOCAL_WRITE

/* pages: the request R, the region whose record takes R's hint slot H, and far away F */
enum { R = 8, H = 40, F = 200, ALLOC = 16 };

static drc_cache_t *nested_cache;
static const void *nested_addr;
static size_t nested_len;
static int armed, cuda_alloc;
static drc_region_t *nested_region;

/* Host memory, or with cuda_alloc CUDA memory whose allocation is pages [0, ALLOC); armed: register once. */
static int classify(uintptr_t addr, size_t len, struct drc__mem *m)
{
    (void)len;
    if (cuda_alloc && addr < (uintptr_t)at(ALLOC, 0))
        *m = (struct drc__mem){ .type = DRC_MEM_CUDA, .device = 0, .lo = 0, .hi = UINTPTR_MAX, .buffer_id = 1,
                                .alloc_lo = BASE, .alloc_hi = (uintptr_t)at(ALLOC, 0) };
    else
        *m = (struct drc__mem){ .type = DRC_MEM_HOST, .device = -1, .lo = 0, .hi = UINTPTR_MAX };
    if (armed) {
        armed = 0;      /* the nested miss classifies too: it must not recurse */
        assert_int_equal(drc_get(nested_cache, nested_addr, nested_len, LW, &nested_region), 0);
    }
    return 0;
}

static const struct drc__mem_ops ops = {
    .classify = classify, .export_range = seam_no_export, .unchanged = seam_unchanged,
};

static void put_ok(drc_cache_t *c, drc_region_t *r)
{
    assert_int_equal(drc_put(c, r), 0);
}

static struct drc_stats stats(drc_cache_t *c)
{
    struct drc_stats s = { .comp_mask = 0 };

    drc_cache_stats(c, &s);
    return s;
}

/*
 * A cache where a get of page @page walks the index and finds nothing: the
 * page was registered and invalidated (its grain stays marked used), and
 * page H was registered after it, taking its record and with it the hint
 * slot's pointer (a record is reused last-freed first).
 */
static drc_cache_t *walked(struct tb *b, size_t page)
{
    drc_cache_t *c = mk(b, NULL);
    drc_region_t *r;

    drc__mem_set_ops(&ops);
    r = get_ok(c, at(page, 0), pg(), LW);
    assert_int_equal(drc_region_invalidate(c, r), 1);
    put_ok(c, r);
    put_ok(c, get_ok(c, at(H, 0), pg(), LW));
    assert_int_equal(stats(c).regions, 1);
    return c;
}

/* walked(R) on CUDA memory whose allocation is pages [0, ALLOC), with an idle region at page 2 */
static drc_cache_t *walked_in_allocation(struct tb *b)
{
    drc_cache_t *c;

    cuda_alloc = 1;
    c = walked(b, R);
    put_ok(c, get_ok(c, at(2, 0), pg(), LW));  /* page 2: in the allocation, not in R's page */
    return c;
}

static void arm(drc_cache_t *c, size_t page, size_t pages)
{
    nested_cache = c;
    nested_addr = at(page, 0);
    nested_len = pages * pg();
    nested_region = NULL;
    armed = 1;
}

static void finish(struct tb *b, drc_cache_t *c)
{
    if (nested_region)
        put_ok(c, nested_region);
    nested_region = NULL;
    done(b, c);
    drc__mem_set_ops(NULL);
    cuda_alloc = 0;
}

/*
 * The same pages registered in the window: the plan walks (the index moved),
 * finds that region, and the miss is a hit on it. One registration for both.
 */
static void a_probe_the_index_moved_under_is_walked_again(void **state)
{
    struct tb *b = tb_new();
    drc_cache_t *c = walked(b, R);
    struct drc_stats s0 = stats(c), s1;
    drc_region_t *r;

    (void)state;
    arm(c, R, 1);
    r = get_ok(c, at(R, 0), pg(), LW);
    assert_false(armed);                    /* the window was reached */
    assert_ptr_equal(r, nested_region);     /* the nested miss's region: a hit */
    s1 = stats(c);
    assert_int_equal(s1.regs - s0.regs, 1);
    assert_int_equal(s1.regions, 2);        /* H and R, once */
    assert_int_equal(s1.hits - s0.hits, 1);
    put_ok(c, r);
    finish(b, c);
}

/* The control: far pages registered in the window; the request is a miss of its own, a region beside it. */
static void control_the_window_registers_elsewhere(void **state)
{
    struct tb *b = tb_new();
    drc_cache_t *c = walked(b, R);
    struct drc_stats s0 = stats(c), s1;
    drc_region_t *r;

    (void)state;
    arm(c, F, 1);
    r = get_ok(c, at(R, 0), pg(), LW);
    assert_false(armed);
    assert_ptr_not_equal(r, nested_region);
    assert_bounds(r, at(R, 0), pg());
    s1 = stats(c);
    assert_int_equal(s1.regs - s0.regs, 2);
    assert_int_equal(s1.regions, 3);
    put_ok(c, r);
    finish(b, c);
}

/*
 * A widened miss (drc__get_widened on CUDA memory: the whole allocation,
 * pages [0, ALLOC)) registers other pages than its lookup probed. A live
 * region inside the allocation, away from the request, is not in the pages
 * probed, and the index does not move in between: the plan must walk its
 * own range, find that region and merge it, not take the probe's "nothing".
 */
static void a_widened_miss_walks_its_own_range(void **state)
{
    struct tb *b = tb_new();
    drc_cache_t *c;
    struct drc_stats s0, s1;
    drc_region_t *r;

    (void)state;
    c = walked_in_allocation(b);
    s0 = stats(c);
    assert_int_equal(drc__get_widened(c, at(R, 0), pg(), LW, &r), 0);
    assert_bounds(r, (const void *)BASE, ALLOC * pg());
    s1 = stats(c);
    assert_int_equal(s1.regs - s0.regs, 1);
    assert_int_equal(s1.merges - s0.merges, 1); /* page 2's region joined it */
    assert_int_equal(s1.regions, 2);            /* H and the allocation: no region beside it */
    put_ok(c, r);
    finish(b, c);
}

/* The control: the same request not widened registers its page alone, beside page 2's region. */
static void control_unwidened_registers_beside(void **state)
{
    struct tb *b = tb_new();
    drc_cache_t *c;
    struct drc_stats s0, s1;
    drc_region_t *r;

    (void)state;
    c = walked_in_allocation(b);
    s0 = stats(c);
    r = get_ok(c, at(R, 0), pg(), LW);
    assert_bounds(r, at(R, 0), pg());
    s1 = stats(c);
    assert_int_equal(s1.regs - s0.regs, 1);
    assert_int_equal(s1.merges - s0.merges, 0);
    assert_int_equal(s1.regions, 3);
    put_ok(c, r);
    finish(b, c);
}

/* ---- the announced miss ---- */

struct in_reg {
    drc_cache_t *c;
    const void *addr;           /* invalidated from inside the registration; NULL: nothing */
    int announced;              /* the registration ran with the miss announced */
    int result;                 /* what drc_invalidate returned */
    pthread_t other;            /* a second get of the same pages, started from inside (second_get) */
    int second_get;
    drc_region_t *other_region;
};

/* Is the miss being registered announced, not on c->pending? (the lock is free: a registration holds none) */
static int miss_announced(drc_cache_t *c)
{
    return (__atomic_load_n(&c->lw, __ATOMIC_SEQ_CST) & LW_ANNOUNCED) && !__atomic_load_n(&c->npending,
                                                                                          __ATOMIC_SEQ_CST);
}

static void *second_get(void *arg)
{
    struct in_reg *x = arg;

    assert_int_equal(drc_get(x->c, at(R, 0), pg(), LW, &x->other_region), 0);
    return NULL;
}

static int in_reg(struct tb *b, unsigned long id, void *arg)
{
    struct in_reg *x = arg;

    (void)b;
    (void)id;
    if (x->announced)
        return 0;       /* the first registration only */
    x->announced = 1 + miss_announced(x->c);
    if (x->addr)
        x->result = drc_invalidate(x->c, x->addr, pg());
    if (x->second_get) {
        assert_int_equal(pthread_create(&x->other, NULL, second_get, x), 0);
        /* until it sleeps on the announced miss (or, in a build where it would not wait, it is done) */
        while (!__atomic_load_n(&x->c->pending_waiters, __ATOMIC_SEQ_CST) &&
               !__atomic_load_n(&x->other_region, __ATOMIC_SEQ_CST))
            sched_yield();
    }
    return 0;
}

/* walked(R), with the backend's hook in every registration from now on */
static drc_cache_t *announcing(struct tb *b, struct in_reg *x)
{
    drc_cache_t *c = walked(b, R);

    x->c = c;
    b->reg_hook = in_reg;
    b->reg_arg = x;
    return c;
}

/*
 * A free while the announced miss registers R: of R's pages (@raced), that
 * registration is dropped and the retry kept; of other pages (the control),
 * it is kept as it is.
 */
static void free_during_announced_miss(int raced)
{
    struct tb *b = tb_new();
    struct in_reg x = { .addr = at(raced ? R : F, 0) };
    drc_cache_t *c = announcing(b, &x);
    struct drc_stats s0 = stats(c), s1;
    unsigned long first = tb_nreg(b) + 1;
    drc_region_t *r;

    r = get_ok(c, at(R, 0), pg(), LW);
    assert_int_equal(x.announced, 2);           /* announced (and raced, or not) */
    assert_int_equal(x.result, 0);              /* nothing valid was there yet */
    s1 = stats(c);
    if (raced) {
        assert_int_not_equal(rid(r), first);        /* never the raced registration */
        assert_int_equal(tb_is_live(b, first), 0);  /* which is deregistered */
    } else {
        assert_int_equal(rid(r), first);
    }
    assert_int_equal(drc_region_valid(r), 1);
    assert_int_equal(s1.regs - s0.regs, raced ? 2 : 1);
    assert_int_equal(s1.deregs - s0.deregs, raced ? 1 : 0);
    assert_int_equal(s1.regions, 2);            /* H and R */
    put_ok(c, r);
    finish(b, c);
}

static void an_announced_miss_raced_by_a_free_is_dropped(void **state)
{
    (void)state;
    free_during_announced_miss(1);
}

static void control_an_announced_miss_beside_a_free_is_kept(void **state)
{
    (void)state;
    free_during_announced_miss(0);
}

/* Another thread's miss of the same pages waits for the announced one, then hits its region. */
static void a_second_miss_waits_for_the_announced_one(void **state)
{
    struct tb *b = tb_new();
    struct in_reg x = { .second_get = 1 };
    drc_cache_t *c = announcing(b, &x);
    struct drc_stats s0 = stats(c), s1;
    drc_region_t *r;

    (void)state;
    r = get_ok(c, at(R, 0), pg(), LW);
    assert_int_equal(pthread_join(x.other, NULL), 0);
    assert_int_equal(x.announced, 2);
    assert_ptr_equal(x.other_region, r);        /* a hit on the announced miss's region */
    s1 = stats(c);
    assert_int_equal(s1.regs - s0.regs, 1);     /* one registration for both */
    assert_int_equal(s1.regions, 2);
    put_ok(c, x.other_region);
    put_ok(c, r);
    finish(b, c);
}

/*
 * A lock section that begins between the announcement's look at the lock
 * word and its CAS (one that changes nothing the checks read) makes the
 * CAS fail: the miss goes to the lock and registers as pending there. A
 * build whose unlock does not advance the word's version fails it (the
 * word is as it was, the CAS succeeds). The control: the same miss with no
 * section in the window is announced.
 */
static void window(int section)
{
    struct tb *b = tb_new();
    struct in_reg x = { .addr = NULL };
    drc_cache_t *c = announcing(b, &x);
    struct drc_stats s0 = stats(c), s1;
    drc_region_t *r;

    window_cache = c;
    window_section = section;
    r = get_ok(c, at(R, 0), pg(), LW);
    assert_null(window_cache);                  /* the window was reached */
    assert_int_equal(x.announced, section ? 1 : 2);
    s1 = stats(c);
    assert_int_equal(s1.regs - s0.regs, 1);
    assert_int_equal(s1.misses - s0.misses, 1);
    assert_int_equal(s1.regions, 2);
    put_ok(c, r);
    finish(b, c);
}

static void a_lock_section_in_the_window_stops_the_announcement(void **state)
{
    (void)state;
    window(1);
}

static void control_no_section_in_the_window(void **state)
{
    (void)state;
    window(0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(a_probe_the_index_moved_under_is_walked_again, setup_alarm),
        cmocka_unit_test_setup(control_the_window_registers_elsewhere, setup_alarm),
        cmocka_unit_test_setup(a_widened_miss_walks_its_own_range, setup_alarm),
        cmocka_unit_test_setup(control_unwidened_registers_beside, setup_alarm),
        cmocka_unit_test_setup(an_announced_miss_raced_by_a_free_is_dropped, setup_alarm),
        cmocka_unit_test_setup(control_an_announced_miss_beside_a_free_is_kept, setup_alarm),
        cmocka_unit_test_setup(a_second_miss_waits_for_the_announced_one, setup_alarm),
        cmocka_unit_test_setup(a_lock_section_in_the_window_stops_the_announcement, setup_alarm),
        cmocka_unit_test_setup(control_no_section_in_the_window, setup_alarm),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
