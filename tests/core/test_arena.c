/*
 * The cache's arena (src/core/arena.c): zeroed, aligned memory carved from
 * mappings that grow, made resident a carve at a time; mappings of 2 MiB or
 * more huge-page aligned, in 4 KiB pages until the carve has taken three
 * quarters of a huge page, then that page collapsed into one, and all of it
 * working where the advice is refused (madvise is wrapped: see the
 * Makefile); a destroyed arena's mappings kept for the next one within the
 * process-wide bound, zeroed again when reused, and unmapped beyond it; a
 * cache's regions unmapped by drc_cache_destroy() when nothing is kept.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "cachetest.h"
#include "core/arena.h"

#define MIB ((size_t)1 << 20)

int __real_madvise(void *addr, size_t len, int advice);

#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25
#endif
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

static int refuse_advice;       /* madvise fails as where THP is compiled out, or the kernel predates MADV_COLLAPSE */

/* The last ranges advised, by advice: where a test looks for a mapping's advice. */
enum { A_HUGE, A_NOHUGE, A_COLLAPSE, A_KINDS, A_LAST = 16 };
static struct advised {
    uintptr_t lo, hi;
} advised[A_KINDS][A_LAST];
static unsigned advised_n[A_KINDS];
static size_t populated_calls, populated_bytes;

static void note_advice(int kind, void *addr, size_t len)
{
    advised[kind][advised_n[kind]++ % A_LAST] = (struct advised){ (uintptr_t)addr, (uintptr_t)addr + len };
}

/* The range advised @kind lately that holds [@lo, @hi), or NULL. */
static const struct advised *advised_at(int kind, uintptr_t lo, uintptr_t hi)
{
    int i;

    for (i = 0; i < A_LAST; i++)
        if (advised[kind][i].lo <= lo && hi <= advised[kind][i].hi)
            return &advised[kind][i];
    return NULL;
}

int __wrap_madvise(void *addr, size_t len, int advice);
int __wrap_madvise(void *addr, size_t len, int advice)
{
    int kind = -1;

    if (advice == MADV_POPULATE_WRITE) {
        populated_calls++;
        populated_bytes += len;
    }
#ifdef MADV_HUGEPAGE
    if (advice == MADV_HUGEPAGE)
        kind = A_HUGE;
#endif
#ifdef MADV_NOHUGEPAGE
    if (advice == MADV_NOHUGEPAGE)
        kind = A_NOHUGE;
#endif
    if (advice == MADV_COLLAPSE)
        kind = A_COLLAPSE;
    if (kind < 0)
        return __real_madvise(addr, len, advice);
    if (refuse_advice && kind != A_NOHUGE) {
        errno = EINVAL;
        return -1;
    }
    note_advice(kind, addr, len);
    return __real_madvise(addr, len, advice);
}

/* Are transparent huge pages on here (`always` or `madvise`)? What arena.c asks before it collapses. */
static int thp_on(void)
{
    char buf[64] = "";
    int fd = open("/sys/kernel/mm/transparent_hugepage/enabled", O_RDONLY);
    ssize_t n = fd >= 0 ? read(fd, buf, sizeof(buf) - 1) : -1;

    if (fd >= 0)
        close(fd);
    return n > 0 && !strstr(buf, "[never]");
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

/*
 * A mapping of 2 MiB or more is huge-page aligned and starts in 4 KiB pages
 * (MADV_NOHUGEPAGE): a carve that has taken part of a huge page holds only
 * the 4 KiB pages it wrote. Once the carve passes three quarters of a huge
 * page, that page is collapsed into one (MADV_HUGEPAGE, MADV_COLLAPSE), and
 * not before. Where THP is off nothing is collapsed. The controls, run: a
 * build that advises the whole mapping MADV_HUGEPAGE, as drc did before,
 * fails the advice check; one that adds that advice to this one's fails
 * the resident check where THP is on (2,048 KiB resident); one that
 * collapses a page only once the carve has passed it whole fails the
 * second collapse check.
 */
static void large_mappings_take_huge_pages_as_they_fill(void **state)
{
    struct drc__arena a;
    const size_t h = DRC__ARENA_HUGE;
    char *p, *q, *page1;
    int thp = thp_on();

    (void)state;
    memset(advised, 0, sizeof(advised));
    drc__arena_init(&a);
    p = drc__arena_alloc(&a, 3 * MIB);     /* the arena's first mapping, 4 MiB: the first huge page and half the second */
    assert_non_null(p);
    /* the mapping starts 64 bytes before the first allocation from it, on a 2 MiB boundary */
    assert_int_equal(((uintptr_t)p - 64) % h, 0);
    page1 = p - 64 + h;
    memset(p, 1, 3 * MIB);
    assert_non_null(advised_at(A_NOHUGE, (uintptr_t)p - 64, (uintptr_t)p - 64 + 2 * h));
    /* the second page is carved a half: 4 KiB pages, resident where written, not collapsed */
    assert_null(advised_at(A_COLLAPSE, (uintptr_t)page1, (uintptr_t)page1 + h));
    assert_true(resident_bytes((uintptr_t)page1, (uintptr_t)page1 + h) <= MIB + 2 * pg());
    /* the first, carved whole, collapsed where THP is on */
    assert_true(!advised_at(A_COLLAPSE, (uintptr_t)p - 64, (uintptr_t)page1) == !thp);
    /* past three quarters of the second: collapsed too */
    q = drc__arena_alloc(&a, MIB / 2 + 64);
    assert_ptr_equal(q, p + 3 * MIB);
    assert_true(!advised_at(A_COLLAPSE, (uintptr_t)page1, (uintptr_t)page1 + h) == !thp);
    if (thp && resident_bytes((uintptr_t)page1, (uintptr_t)page1 + h) == h)
        print_message("the kernel collapsed the page: all of it resident\n");
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

/*
 * The same through a cache: filled until a region lands in a mapping of
 * 2 MiB or more, that mapping holds only what the carve reached (4 KiB
 * pages), not a huge page; filled on, the region's huge page is collapsed
 * where THP is on once the carve has passed three quarters of it (the
 * control: the wrap sees the advice the page did not get before). Before,
 * a cache of 65,536 regions held 2 MiB of which it had carved 100 KiB.
 */
static void a_cache_holds_what_it_carved_of_its_last_huge_page(void **state)
{
    struct tb *b;
    drc_cache_t *c;
    drc_region_t *r;
    const struct advised *m;
    uintptr_t page = 0;
    size_t i, resident = 0;

    (void)state;
    memset(advised, 0, sizeof(advised));    /* earlier tests' ranges, unmapped since, may be mapped again */
    b = tb_new();
    c = mk(b, NULL);
    for (i = 0; i < 200000; i++) {
        r = get_ok(c, at(2 * i, 0), pg(), IBV_ACCESS_LOCAL_WRITE);
        assert_int_equal(drc_put(c, r), 0);
        if (!page && (m = advised_at(A_NOHUGE, (uintptr_t)r, (uintptr_t)r + 64)) && m->hi - m->lo >= DRC__ARENA_HUGE) {
            page = (uintptr_t)r & ~(uintptr_t)(DRC__ARENA_HUGE - 1);     /* the first region in such a mapping */
            resident = resident_bytes(page, page + DRC__ARENA_HUGE);
        }
        if (page && advised_at(A_COLLAPSE, page, page + DRC__ARENA_HUGE))
            break;
    }
    print_message("the first region in a mapping of 2 MiB or more: its huge page %zu KiB resident; "
                  "collapsed after %zu regions\n", resident >> 10, i);
    assert_true(page != 0);
    assert_true(resident < DRC__ARENA_HUGE / 2);
    assert_true((i < 200000) == thp_on());
    done(b, c);
}

/*
 * A cache's first fill does not fault its memory in a page at a time: what
 * the arena carves from fresh memory is made resident in one call per carve
 * (MADV_POPULATE_WRITE: the kernel counts the pages it populates among the
 * process's page faults, so the wrap counts the calls instead). 20,000
 * regions take at least their records' 1.25 MB populated, in fewer calls
 * than one per 50 regions. The control, run: a build without the call
 * populates nothing.
 */
static void a_caches_first_fill_is_not_a_fault_a_page(void **state)
{
    struct tb *b;
    drc_cache_t *c;
    drc_region_t *r;
    const size_t n = 20000;
    size_t i, calls, bytes;

    (void)state;
    b = tb_new();
    c = mk(b, NULL);
    calls = populated_calls;
    bytes = populated_bytes;
    for (i = 0; i < n; i++) {
        r = get_ok(c, at(2 * i, 0), pg(), IBV_ACCESS_LOCAL_WRITE);
        assert_int_equal(drc_put(c, r), 0);
    }
    calls = populated_calls - calls;
    bytes = populated_bytes - bytes;
    print_message("%zu regions: %zu KiB populated in %zu calls\n", n, bytes >> 10, calls);
    assert_true(bytes >= n * 64);
    assert_true(calls < n / 50);
    done(b, c);
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
        cmocka_unit_test_setup(large_mappings_take_huge_pages_as_they_fill, keep_none),
        cmocka_unit_test_setup(without_huge_pages_it_still_works, keep_none),
        cmocka_unit_test_setup(kept_mappings_are_reused_zeroed_and_bounded, keep_none),
        cmocka_unit_test_setup(an_older_mappings_rest_is_used_first, keep_none),
        cmocka_unit_test_setup(a_lazy_arenas_mapping_is_kept_empty_for_the_next, keep_none),
        cmocka_unit_test_setup(destroy_unmaps_a_caches_memory, keep_none),
        cmocka_unit_test_setup(a_cache_holds_what_it_carved_of_its_last_huge_page, keep_none),
        cmocka_unit_test_setup(a_caches_first_fill_is_not_a_fault_a_page, keep_none),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
