/*
 * The cache's arena (src/core/arena.c): zeroed, aligned memory carved from
 * mappings that grow; mappings of 2 MiB or more huge-page aligned and advised,
 * and still working where the advice is refused (madvise is wrapped: see the
 * Makefile); a destroyed arena's mappings kept for the next one within the
 * process-wide bound, zeroed again when reused, and unmapped beyond it; a
 * cache's regions unmapped by drc_cache_destroy() when nothing is kept.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "cachetest.h"
#include "core/arena.h"

#define MIB ((size_t)1 << 20)

int __real_madvise(void *addr, size_t len, int advice);

static int refuse_advice;       /* madvise fails as where THP is compiled out */
static unsigned long hugepage_advised;

int __wrap_madvise(void *addr, size_t len, int advice);
int __wrap_madvise(void *addr, size_t len, int advice)
{
#ifdef MADV_HUGEPAGE
    if (advice == MADV_HUGEPAGE) {
        if (refuse_advice) {
            errno = EINVAL;
            return -1;
        }
        hugepage_advised++;
    }
#endif
    return __real_madvise(addr, len, advice);
}

/* Is the page at @p mapped? */
static int mapped(const void *p)
{
    unsigned char v;

    return mincore((void *)((uintptr_t)p & ~(uintptr_t)(pg() - 1)), pg(), &v) == 0;
}

static int all_zero(const char *p, size_t n)
{
    size_t i;

    for (i = 0; i < n; i++)
        if (p[i])
            return 0;
    return 1;
}

static int keep_none(void **state)
{
    (void)state;
    drc__arena_keep(0);
    refuse_advice = 0;
    return 0;
}

static void alloc_is_zeroed_aligned_and_grows(void **state)
{
    struct drc__arena a;
    char *p[64];
    size_t total = 0;
    int i;

    (void)state;
    drc__arena_init(&a);
    for (i = 0; i < 64; i++) {
        size_t size = (size_t)(i * 7919 % 300000) + 1;

        p[i] = drc__arena_alloc(&a, size);
        assert_non_null(p[i]);
        assert_int_equal((uintptr_t)p[i] % 64, 0);
        assert_true(all_zero(p[i], size));
        memset(p[i], 0xa5, size);       /* no two overlap: each still holds its own fill below */
        p[i][0] = (char)i;
        total += size;
    }
    for (i = 0; i < 64; i++)
        assert_int_equal(p[i][0], (char)i);
    assert_true(a.mapped >= total);
    assert_true(a.mapped <= 4 * total + 64 * MIB);  /* geometric: no mapping per allocation */
    /* larger than any mapping the arena would make next: it gets one of its own */
    p[0] = drc__arena_alloc(&a, 40 * MIB);
    assert_non_null(p[0]);
    assert_true(all_zero(p[0], 40 * MIB));
    drc__arena_fini(&a);
}

static void large_mappings_are_huge_aligned_and_advised(void **state)
{
    struct drc__arena a;
    unsigned long before = hugepage_advised;
    char *p;

    (void)state;
    drc__arena_init(&a);
    p = drc__arena_alloc(&a, 3 * MIB);
    assert_non_null(p);
    /* the mapping starts 64 bytes before the first allocation from it, on a 2 MiB boundary */
    assert_int_equal(((uintptr_t)p - 64) % DRC__ARENA_HUGE, 0);
#ifdef MADV_HUGEPAGE
    assert_true(hugepage_advised > before);
#else
    (void)before;
#endif
    drc__arena_fini(&a);
}

static void without_huge_pages_it_still_works(void **state)
{
    struct drc__arena a;
    char *p;

    (void)state;
    refuse_advice = 1;
    drc__arena_init(&a);
    p = drc__arena_alloc(&a, 5 * MIB);
    assert_non_null(p);
    assert_true(all_zero(p, 5 * MIB));
    memset(p, 1, 5 * MIB);
    drc__arena_fini(&a);
    refuse_advice = 0;
}

static void kept_mappings_are_reused_zeroed_and_bounded(void **state)
{
    struct drc__arena a, b;
    char *p, *q;

    (void)state;
    assert_int_equal(drc__arena_keep(64 * MIB), 0);
    drc__arena_init(&a);
    p = drc__arena_alloc(&a, 100 << 10);
    assert_non_null(p);
    memset(p, 0x5a, 100 << 10);
    drc__arena_fini(&a);
    assert_true(drc__arena_keep(64 * MIB) > 0);     /* kept */
    assert_true(mapped(p));

    drc__arena_init(&b);
    q = drc__arena_alloc(&b, 100 << 10);
    assert_ptr_equal(q, p);                         /* the kept mapping, reused */
    assert_true(all_zero(q, 100 << 10));            /* and zeroed again */
    drc__arena_fini(&b);

    /* lowering the bound unmaps what it no longer allows */
    assert_int_equal(drc__arena_keep(0), 0);
    assert_false(mapped(p));

    /* a mapping larger than the bound is unmapped at fini */
    drc__arena_keep(4 * MIB);
    drc__arena_init(&a);
    p = drc__arena_alloc(&a, 6 * MIB);
    assert_non_null(p);
    drc__arena_fini(&a);
    assert_false(mapped(p));
    assert_true(drc__arena_keep(4 * MIB) <= 4 * MIB);
}

/*
 * A request too large for what the current mapping has left goes to a new
 * mapping, and that rest is kept: smaller requests use it up before the
 * newer mapping's (under huge pages its last page is resident anyway).
 * Control: a request larger than the old rest comes from the new mapping.
 */
static void an_older_mappings_rest_is_used_first(void **state)
{
    struct drc__arena a;
    char *first, *big, *small, *larger, *again;

    (void)state;
    drc__arena_init(&a);
    first = drc__arena_alloc(&a, 100 << 10);        /* the first mapping: 256 KiB */
    big = drc__arena_alloc(&a, 1 * MIB);            /* past its rest: a new mapping */
    assert_non_null(first);
    assert_non_null(big);
    assert_true(big < first || big >= first + (256 << 10));
    small = drc__arena_alloc(&a, 50 << 10);
    assert_ptr_equal(small, first + (100 << 10));   /* the old rest, right after the first */
    larger = drc__arena_alloc(&a, 200 << 10);       /* more than the old rest has left */
    assert_ptr_equal(larger, big + MIB);            /* control: the new mapping's rest */
    again = drc__arena_alloc(&a, 64);
    assert_ptr_equal(again, small + (50 << 10));    /* the old rest is still the smaller one that fits */
    assert_true(all_zero(small, 50 << 10) && all_zero(larger, 200 << 10));
    drc__arena_fini(&a);
}

/*
 * A lazy arena's mapping (the region records' second lines) is kept for the
 * next lazy arena with its pages given back: still mapped, nothing resident
 * past its header's page, and what the next one hands out reads zero, at the
 * same address (no new mapping). A plain arena never takes it. Control:
 * with nothing to be kept, the mapping is unmapped.
 */
static void a_lazy_arenas_mapping_is_kept_empty_for_the_next(void **state)
{
    struct drc__arena a, b;
    size_t page = pg(), len = 200 << 10;
    char *p, *q, *r;

    (void)state;
    drc__arena_keep(64 * MIB);
    drc__arena_init_lazy(&a);
    p = drc__arena_alloc(&a, len);
    assert_non_null(p);
    memset(p, 0x5a, len);                           /* a cache of device regions wrote its second lines */
    drc__arena_fini(&a);
    assert_true(mapped(p));
    assert_int_equal(resident_bytes(((uintptr_t)p + page) & ~(uintptr_t)(page - 1), (uintptr_t)p + len), 0);
    drc__arena_init(&b);                            /* a plain arena does not take it */
    r = drc__arena_alloc(&b, len);
    assert_non_null(r);
    assert_true(r + len <= p || r >= p + len);
    drc__arena_init_lazy(&a);
    q = drc__arena_alloc(&a, len);
    assert_ptr_equal(q, p);
    assert_true(all_zero(q, len));
    drc__arena_fini(&a);
    drc__arena_fini(&b);
    drc__arena_keep(0);                             /* unmaps what lazy arenas kept */
    assert_false(mapped(p));

    drc__arena_init_lazy(&a);                       /* control: nothing may be kept */
    p = drc__arena_alloc(&a, len);
    assert_non_null(p);
    drc__arena_fini(&a);
    assert_false(mapped(p));
}

/* A cache's regions live in its arena: drc_cache_destroy() gives them back (none kept: unmapped). */
static void destroy_unmaps_a_caches_memory(void **state)
{
    struct tb *b = tb_new();
    drc_cache_t *c = mk(b, NULL);
    drc_region_t *r, *first = NULL;
    size_t i;

    (void)state;
    for (i = 0; i < 5000; i++) {    /* several pool chunks and hint tables */
        assert_int_equal(drc_get(c, at(2 * i, 0), pg(), 1, &r), 0);
        if (!first)
            first = r;
        assert_int_equal(drc_put(c, r), 0);
    }
    assert_true(mapped(first));
    done(b, c);
    assert_false(mapped(first));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(alloc_is_zeroed_aligned_and_grows, keep_none),
        cmocka_unit_test_setup(large_mappings_are_huge_aligned_and_advised, keep_none),
        cmocka_unit_test_setup(without_huge_pages_it_still_works, keep_none),
        cmocka_unit_test_setup(kept_mappings_are_reused_zeroed_and_bounded, keep_none),
        cmocka_unit_test_setup(an_older_mappings_rest_is_used_first, keep_none),
        cmocka_unit_test_setup(a_lazy_arenas_mapping_is_kept_empty_for_the_next, keep_none),
        cmocka_unit_test_setup(destroy_unmaps_a_caches_memory, keep_none),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
