/*
 * The ABI rule of drc.h: a program built against an older header keeps working with a newer
 * library. Its structs end earlier than the library's; the library reads (drc_config,
 * drc_backend) and writes (drc_stats) only the fields the caller's comp_mask covers. Each "old"
 * struct below is the 0.1 layout, laid flush against a page the test has made inaccessible: a
 * library that read or wrote past it would crash the test. And a newer program's unknown bits
 * are refused (inputs) or cleared (outputs), never guessed at.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>

#include <cmocka.h>

#include "cachetest.h"

/* The 0.1 layouts, as a program built against the 0.1 header has them. */
struct config_0_1 {
    size_t max_regions, max_bytes;
    unsigned flags;
    enum drc_policy policy;
    uint32_t comp_mask;
};
struct backend_0_1 {
    int (*reg)(void *ctx, const struct drc_reg_args *a, void **handle, uint32_t *lkey, uint32_t *rkey);
    int (*dereg)(void *ctx, void *handle);
    void *ctx;
    uint32_t comp_mask;
};
struct stats_0_1 {
    uint64_t hits, misses, merges, invalidated, evicted, regs, deregs, regions, bytes, in_use;
    uint32_t comp_mask;
};

/* The 0.1 fields are where the current header has them: the prefix is shared. */
static void layouts_share_the_0_1_prefix(void **state)
{
    (void)state;
    assert_int_equal(offsetof(struct drc_config, comp_mask), offsetof(struct config_0_1, comp_mask));
    assert_int_equal(offsetof(struct drc_backend, comp_mask), offsetof(struct backend_0_1, comp_mask));
    assert_int_equal(offsetof(struct drc_stats, in_use), offsetof(struct stats_0_1, in_use));
    assert_int_equal(offsetof(struct drc_stats, comp_mask), offsetof(struct stats_0_1, comp_mask));
    assert_true(sizeof(struct drc_stats) > sizeof(struct stats_0_1));   /* stats grew: detached */
}

/* @size bytes that end where an inaccessible page begins; unmap with guard_free(). */
static void *guarded(size_t size, void **map)
{
    char *p = mmap(NULL, 2 * pg(), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

    assert_true(p != MAP_FAILED);
    assert_int_equal(mprotect(p + pg(), pg(), PROT_NONE), 0);
    *map = p;
    return p + pg() - size;
}

static void guard_free(void *map)
{
    munmap(map, 2 * pg());
}

/* An old program's config and backend, flush against a guard page, create a working cache. */
static void old_config_and_backend_still_work(void **state)
{
    struct tb *b = tb_new();
    void *m1, *m2;
    struct config_0_1 *cfg = guarded(sizeof(*cfg), &m1);
    struct backend_0_1 *be = guarded(sizeof(*be), &m2);
    drc_cache_t *c = NULL;
    drc_region_t *r;

    (void)state;
    memset(cfg, 0, sizeof(*cfg));
    cfg->max_regions = 1;
    be->reg = tb_reg;
    be->dereg = tb_dereg;
    be->ctx = b;
    be->comp_mask = 0;
    assert_int_equal(drc_cache_create((const struct drc_backend *)be, (const struct drc_config *)cfg, &c), 0);
    guard_free(m1);     /* the library kept copies: the caller's structs may go */
    guard_free(m2);
    assert_int_equal(drc_get(c, at(0, 0), pg(), 1, &r), 0);
    assert_int_equal(drc_put(c, r), 0);
    assert_int_equal(drc_get(c, at(4, 0), pg(), 1, &r), 0);   /* max_regions 1 was read: page 0 is evicted */
    assert_int_equal(drc_put(c, r), 0);
    EXPECT_STATS(c, .misses = 2, .evicted = 1, .regs = 2, .deregs = 1, .regions = 1, .bytes = pg());
    done(b, c);
}

/* An old program's drc_stats, flush against a guard page: the library writes nothing past it. */
static void old_stats_struct_is_not_overrun(void **state)
{
    struct tb *b = tb_new();
    drc_cache_t *c = mk(b, NULL);
    void *m;
    struct stats_0_1 *s = guarded(sizeof(*s), &m);
    drc_region_t *r;

    (void)state;
    memset(s, 0xab, sizeof(*s));
    s->comp_mask = 0;       /* the 0.1 header knows no later field */
    assert_int_equal(drc_get(c, at(0, 0), pg(), 1, &r), 0);
    drc_cache_stats(c, (struct drc_stats *)s);
    assert_int_equal(s->misses, 1);
    assert_int_equal(s->hits, 0);
    assert_int_equal(s->in_use, 1);
    assert_int_equal(s->comp_mask, 0);
    guard_free(m);
    assert_int_equal(drc_put(c, r), 0);
    done(b, c);
}

/* A current program asks for the later fields and gets them; a bit from a newer header is cleared. */
static void stats_fill_what_is_asked_and_known(void **state)
{
    struct tb *b = tb_new();
    drc_cache_t *c = mk(b, NULL);
    struct drc_stats s;
    drc_region_t *r;

    (void)state;
    assert_int_equal(drc_get(c, at(0, 0), pg(), 1, &r), 0);
    assert_int_equal(drc_invalidate(c, at(0, 0), pg()), 1);    /* r is detached: invalid, still held */
    memset(&s, 0xab, sizeof(s));
    s.comp_mask = DRC_STATS_ALL | (1u << 31);
    drc_cache_stats(c, &s);
    assert_int_equal(s.comp_mask, DRC_STATS_DETACHED | DRC_STATS_DMABUF_DOWNGRADED);
    assert_int_equal(s.detached, 1);
    assert_int_equal(s.dmabuf_downgraded, 0);  /* host memory: no dmabuf */
    assert_int_equal(s.in_use, 1);
    assert_int_equal(s.regions, 0);
    memset(&s, 0xab, sizeof(s));
    s.comp_mask = 0;                                            /* not asked: not written */
    drc_cache_stats(c, &s);
    assert_int_equal(s.comp_mask, 0);
    assert_true(s.detached == 0xababababababababull);
    assert_true(s.dmabuf_downgraded == 0xababababababababull);
    assert_int_equal(drc_put(c, r), 0);
    done(b, c);
}

/* A program built when drc_stats ended at detached asks for it alone: nothing is written past it. */
static void stats_struct_with_detached_only_is_not_overrun(void **state)
{
    struct tb *b = tb_new();
    drc_cache_t *c = mk(b, NULL);
    size_t size = offsetof(struct drc_stats, detached) + sizeof(uint64_t);
    void *m;
    struct drc_stats *s = guarded(size, &m);
    drc_region_t *r;

    (void)state;
    assert_true(size < sizeof(struct drc_stats));
    memset(s, 0xab, size);
    s->comp_mask = DRC_STATS_DETACHED;
    assert_int_equal(drc_get(c, at(0, 0), pg(), 1, &r), 0);
    drc_cache_stats(c, s);
    assert_int_equal(s->comp_mask, DRC_STATS_DETACHED);
    assert_int_equal(s->detached, 0);
    assert_int_equal(s->misses, 1);
    guard_free(m);
    assert_int_equal(drc_put(c, r), 0);
    done(b, c);
}

/* A config or backend from a newer header, with a bit this library does not know: -EINVAL. */
static void unknown_input_bits_are_refused(void **state)
{
    struct tb *b = tb_new();
    struct drc_config cfg = { .comp_mask = 1u << 31 };
    struct drc_backend be = b->be;
    drc_cache_t *c = NULL;

    (void)state;
    assert_int_equal(drc_cache_create(&b->be, &cfg, &c), -EINVAL);
    be.comp_mask = 1;
    assert_int_equal(drc_cache_create(&be, NULL, &c), -EINVAL);
    assert_null(c);
    tb_free(b);
}

/* A backend reads a later drc_reg_args field only under its bit: none is set by this library. */
static void reg_args_comp_mask_is_set(void **state)
{
    struct tb *b = tb_new();
    drc_cache_t *c = mk(b, NULL);
    drc_region_t *r;

    (void)state;
    assert_int_equal(drc_get(c, at(0, 0), pg(), 1, &r), 0);
    assert_int_equal(tb_get(b, 1).args.comp_mask, 0);
    assert_int_equal(drc_put(c, r), 0);
    done(b, c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(layouts_share_the_0_1_prefix),
        cmocka_unit_test(old_config_and_backend_still_work),
        cmocka_unit_test(old_stats_struct_is_not_overrun),
        cmocka_unit_test(stats_fill_what_is_asked_and_known),
        cmocka_unit_test(stats_struct_with_detached_only_is_not_overrun),
        cmocka_unit_test(unknown_input_bits_are_refused),
        cmocka_unit_test(reg_args_comp_mask_is_set),
    };

    return cmocka_run_group_tests(tests, setup_alarm, NULL);
}
