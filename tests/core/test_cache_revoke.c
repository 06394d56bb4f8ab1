/*
 * DRC_F_REVOKE (drc.h), one thread: an invalidation deregisters a region that
 * users still hold before it returns, exactly once, and the last put frees
 * only drc's memory. Each test has its control: the same steps without the
 * flag, where the deregistration waits for the last put.
 *
 * The backend is the recording double of backend.h; its dereg hook records
 * whether the deregistration ran inside the invalidation. In the DRC_DEBUG
 * builds (ASan, TSan) be_dereg also asserts that no cache lock is held.
 */
#include <infiniband/verbs.h>

#include "cachetest.h"

#define LW IBV_ACCESS_LOCAL_WRITE

static int in_invalidate;           /* set around the invalidations under test */
static int deregs_inside;           /* deregistrations the hook saw while in_invalidate */

static int count_inside(struct tb *b, unsigned long id, void *arg)
{
    (void)b;
    (void)id;
    (void)arg;
    deregs_inside += in_invalidate;
    return 0;
}

static drc_cache_t *mk_flags(struct tb *b, unsigned flags)
{
    struct drc_config cfg = { .flags = flags };

    in_invalidate = deregs_inside = 0;
    b->dereg_hook = count_inside;
    return mk(b, &cfg);
}

static int invalidate(drc_cache_t *c, const void *a, size_t len)
{
    int n;

    in_invalidate = 1;
    n = drc_invalidate(c, a, len);
    in_invalidate = 0;
    return n;
}

static void held_region(unsigned flags)
{
    struct tb *b = tb_new();
    drc_cache_t *c = mk_flags(b, flags);
    drc_region_t *a, *a2, *n;
    unsigned long ida;
    int revoke = !!(flags & DRC_F_REVOKE);

    a = get_ok(c, at(0, 0), pg(), LW);
    a2 = get_ok(c, at(0, 0), pg(), LW);    /* two holders */
    ida = rid(a);
    assert_int_equal(invalidate(c, at(0, 0), pg()), 1);
    assert_int_equal(drc_region_valid(a), 0);
    /* revoke: gone from the NIC before the free goes on, and inside the invalidation */
    assert_int_equal(tb_is_live(b, ida), !revoke);
    assert_int_equal(deregs_inside, revoke);
    assert_int_equal(tb_dereg_calls(b), revoke);
    /* the handle the backend released is never handed out; the keys are the old, dead ones */
    if (revoke)
        assert_null(drc_region_handle(a));
    else
        assert_int_equal(rid(a), ida);
    assert_int_equal(drc_region_lkey(a), tb_lkey(ida));
    assert_int_equal(drc_region_rkey(a), tb_rkey(ida));
    EXPECT_STATS(c, .hits = 1, .misses = 1, .invalidated = 1, .regs = 1, .deregs = (uint64_t)revoke, .in_use = 1);

    n = get_ok(c, at(0, 0), pg(), LW);     /* the memory again: a new registration */
    assert_int_not_equal(rid(n), ida);
    assert_int_equal(drc_put(c, a), 0);
    assert_int_equal(tb_is_live(b, ida), !revoke);
    assert_int_equal(drc_put(c, a2), 0);   /* the last put: deregisters only without revoke */
    assert_int_equal(tb_is_live(b, ida), 0);
    assert_int_equal(tb_get(b, ida).deregs, 1);
    assert_int_equal(tb_dereg_calls(b), 1);
    assert_int_equal(drc_put(c, a2), -EINVAL);
    EXPECT_STATS(c, .hits = 1, .misses = 2, .invalidated = 1, .regs = 2, .deregs = 1, .regions = 1,
                 .bytes = pg(), .in_use = 1);
    assert_int_equal(drc_put(c, n), 0);
    done(b, c);
}

/* What a user checks: the free's invalidation takes the held MR off the NIC; without the flag, the last put does. */
static void revoke_deregisters_held_region_before_invalidate_returns(void **state)
{
    (void)state;
    held_region(DRC_F_REVOKE);
}

static void control_without_revoke_last_put_deregisters(void **state)
{
    (void)state;
    held_region(0);
}

/* The allocator's path: drc_notify_free reaches every cache; only the revoking one deregisters now. */
static void notify_free_revokes(void **state)
{
    struct tb *b1 = tb_new(), *b2 = tb_new();
    drc_cache_t *c1 = mk_flags(b1, DRC_F_REVOKE), *c2;
    drc_region_t *r1, *r2;
    unsigned long id1, id2;

    (void)state;
    c2 = mk(b2, NULL);
    r1 = get_ok(c1, at(0, 0), 4 * pg(), LW);
    r2 = get_ok(c2, at(0, 0), 4 * pg(), LW);
    id1 = rid(r1);
    id2 = rid(r2);
    assert_int_equal(drc_notify_free(at(1, 0), pg()), 2);
    assert_int_equal(tb_is_live(b1, id1), 0);  /* revoked */
    assert_int_equal(tb_is_live(b2, id2), 1);  /* control: still registered, held */
    assert_int_equal(drc_put(c1, r1), 0);
    assert_int_equal(drc_put(c2, r2), 0);
    assert_int_equal(tb_is_live(b2, id2), 0);
    assert_int_equal(tb_dereg_calls(b1), 1);
    done(b1, c1);
    done(b2, c2);
}

/* A held region superseded by a merge, then freed: revoked too (it sits in the detached tree). */
static void revoke_superseded_held_region(void **state)
{
    struct tb *b = tb_new();
    drc_cache_t *c = mk_flags(b, DRC_F_REVOKE);
    drc_region_t *a, *u;
    unsigned long ida, idu;

    (void)state;
    a = get_ok(c, at(0, 0), 2 * pg(), LW);
    u = get_ok(c, at(1, 0), 2 * pg(), LW);     /* overlaps a: registers the union, a is superseded */
    ida = rid(a);
    idu = rid(u);
    assert_int_not_equal(ida, idu);
    assert_int_equal(drc_put(c, u), 0);        /* the union idle, a held */
    assert_int_equal(tb_is_live(b, ida), 1);   /* superseded but valid: not revoked by a merge */
    assert_int_equal(invalidate(c, at(0, 0), pg()), 2);
    assert_int_equal(tb_is_live(b, ida), 0);
    assert_int_equal(tb_is_live(b, idu), 0);
    assert_int_equal(deregs_inside, 2);
    assert_null(drc_region_handle(a));
    assert_int_equal(invalidate(c, at(0, 0), pg()), 0);    /* a second free: nothing more */
    assert_int_equal(drc_put(c, a), 0);
    assert_int_equal(tb_dereg_calls(b), 2);
    done(b, c);
}

/* drc_region_invalidate on a revoking cache: the caller's keys die now; a second call does nothing. */
static void region_invalidate_revokes(void **state)
{
    struct tb *b = tb_new();
    drc_cache_t *c = mk_flags(b, DRC_F_REVOKE);
    drc_region_t *a;
    unsigned long ida;

    (void)state;
    a = get_ok(c, at(0, 0), pg(), LW);
    ida = rid(a);
    assert_int_equal(drc_region_invalidate(c, a), 1);
    assert_int_equal(tb_is_live(b, ida), 0);
    assert_int_equal(drc_region_invalidate(c, a), 0);
    assert_int_equal(drc_invalidate(c, at(0, 0), pg()), 0);
    assert_int_equal(tb_dereg_calls(b), 1);
    assert_int_equal(drc_put(c, a), 0);
    assert_int_equal(tb_dereg_calls(b), 1);
    done(b, c);
}

/* Idle regions: deregistered before the invalidation returns, with or without the flag, once. */
static void revoke_idle_region_once(void **state)
{
    struct tb *b = tb_new();
    drc_cache_t *c = mk_flags(b, DRC_F_REVOKE);
    drc_region_t *a;
    unsigned long ida;

    (void)state;
    a = get_ok(c, at(0, 0), pg(), LW);
    ida = rid(a);
    assert_int_equal(drc_put(c, a), 0);
    assert_int_equal(invalidate(c, at(0, 0), pg()), 1);
    assert_int_equal(tb_is_live(b, ida), 0);
    assert_int_equal(deregs_inside, 1);
    EXPECT_STATS(c, .misses = 1, .invalidated = 1, .regs = 1, .deregs = 1);
    done(b, c);
}

/*
 * The holder's put inside the revoking dereg (a put racing the revoke, made
 * deterministic): the put is not the last (the revoker holds a reference),
 * and the revoker's release does not deregister a second time.
 */
static drc_cache_t *put_cache;
static drc_region_t *put_region;

static int put_inside_dereg(struct tb *b, unsigned long id, void *arg)
{
    (void)b;
    (void)id;
    (void)arg;
    if (put_region) {
        assert_int_equal(drc_put(put_cache, put_region), 0);
        put_region = NULL;
    }
    return 0;
}

static void put_during_revoke(void **state)
{
    struct tb *b = tb_new();
    drc_cache_t *c = mk_flags(b, DRC_F_REVOKE);
    unsigned long id;

    (void)state;
    b->dereg_hook = put_inside_dereg;
    put_cache = c;
    put_region = get_ok(c, at(0, 0), pg(), LW);
    id = rid(put_region);
    assert_int_equal(drc_invalidate(c, at(0, 0), pg()), 1);
    assert_null(put_region);
    assert_int_equal(tb_get(b, id).deregs, 1);
    assert_int_equal(b->bad_deregs, 0);
    EXPECT_STATS(c, .misses = 1, .invalidated = 1, .regs = 1, .deregs = 1);
    done(b, c);
}

/* An unknown flag is still refused: the bit is known now. */
static void revoke_flag_is_accepted(void **state)
{
    struct tb *b = tb_new();
    struct drc_config cfg = { .flags = DRC_F_REVOKE | DRC_F_NO_MERGE };
    drc_cache_t *c = NULL;

    (void)state;
    assert_int_equal(drc_cache_create(&b->be, &cfg, &c), 0);
    assert_int_equal(drc_cache_destroy(c), 0);
    cfg.flags = 1u << 15;
    assert_int_equal(drc_cache_create(&b->be, &cfg, &c), -EINVAL);
    tb_free(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(revoke_deregisters_held_region_before_invalidate_returns),
        cmocka_unit_test(control_without_revoke_last_put_deregisters),
        cmocka_unit_test(notify_free_revokes),
        cmocka_unit_test(revoke_superseded_held_region),
        cmocka_unit_test(region_invalidate_revokes),
        cmocka_unit_test(revoke_idle_region_once),
        cmocka_unit_test(put_during_revoke),
        cmocka_unit_test(revoke_flag_is_accepted),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
