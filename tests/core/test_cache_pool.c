/*
 * The pool's memory (src/core/cache_pool.c): what a cached region costs in
 * the process's resident set. A region record is one cache line; its second
 * line (struct region_ext: the LRU links, the description of device memory)
 * sits in a parallel array of its pool chunk that only the regions needing
 * it write: a host region of a cache without limits never does, so those
 * pages never become resident, and a region costs the user one line.
 *
 * Resident pages are read with mincore() over each pool chunk's ext[] (the
 * structs of cache_int.h, reached only here to find those addresses), the
 * pages wholly inside the part carved (an array's first page may hold its
 * mapping's header, which the arena writes). An unlimited cache takes those
 * arrays from an arena of 4 KiB pages (MADV_NOHUGEPAGE), so what is checked
 * holds whatever the machine's transparent huge page setting. The controls:
 * the same check finds the arrays resident where regions write them, in a
 * cache of CUDA regions (their memory's description) and in a cache with
 * limits (its LRU links). The CUDA layer is stood in for at the core's own
 * seam (mem.h), by a classifier that calls every range CUDA memory of
 * device 0 and a dmabuf export that is not supported, so that the miss
 * registers with fd -1 as it does without a dmabuf.
 */
#include <stdlib.h>
#include <sys/mman.h>

#include "cachetest.h"
#include "core/cache_int.h"
#include "core/mem.h"
#include "memseam.h"

#define LW IBV_ACCESS_LOCAL_WRITE

/* regions (fewer in DRC_DEBUG builds, which check the whole tree at every unlock) */
#ifdef DRC_DEBUG
enum { N = 4096 };
#else
enum { N = 16384 };
#endif

static int cuda_classify(uintptr_t addr, size_t len, struct drc__mem *m)
{
    (void)addr;
    (void)len;
    *m = (struct drc__mem){ .type = DRC_MEM_CUDA, .device = 0, .lo = 0, .hi = UINTPTR_MAX, .buffer_id = 1 };
    return 0;
}

static const struct drc__mem_ops all_cuda = {
    .classify = cuda_classify, .export_range = seam_no_export, .unchanged = seam_unchanged,
};

/* Resident bytes of the pages wholly inside [lo, hi), and in *pages the bytes of those pages. */
static size_t resident_inside(uintptr_t lo, uintptr_t hi, size_t *pages)
{
    size_t page = pg();

    lo = (lo + page - 1) & ~(uintptr_t)(page - 1);
    hi &= ~(uintptr_t)(page - 1);
    if (hi <= lo)
        return 0;
    *pages += hi - lo;
    return resident_bytes(lo, hi);
}

/* Resident bytes of the second lines of every region handed out; *checked: the bytes looked at. */
static size_t ext_resident(const drc_cache_t *c, size_t *checked)
{
    const struct chunk *ch;
    size_t bytes = 0;

    *checked = 0;
    for (ch = c->chunks; ch; ch = ch->next)
        bytes += resident_inside((uintptr_t)ch->ext, (uintptr_t)&ch->ext[ch->carved], checked);
    return bytes;
}

/* N one-page regions, two pages apart (none overlaps: no merge), each put back; all of type @type. */
static void fill(drc_cache_t *c, enum drc_mem_type type)
{
    drc_region_t *r;
    size_t i;

    for (i = 0; i < N; i++) {
        r = get_ok(c, at(2 * i, 0), pg(), LW);
        assert_int_equal(drc_region_type(r), type);
        assert_int_equal(drc_put(c, r), 0);
    }
    for (i = 0; i < N; i += 7) {    /* hits, which read only the first line */
        r = get_ok(c, at(2 * i, 64), 64, LW);
        assert_int_equal(drc_put(c, r), 0);
    }
}

/*
 * Host regions of an unlimited cache: not one page of their second lines is
 * resident, and the region records are one line each; the regions and their
 * keys are what a user asked for all the same.
 */
static void host_regions_leave_their_second_line_untouched(void **state)
{
    struct tb *b = tb_new();
    drc_cache_t *c = mk(b, NULL);
    size_t checked, bytes;
    struct drc_stats s;

    (void)state;
    fill(c, DRC_MEM_HOST);
    bytes = ext_resident(c, &checked);
    print_message("%d host regions: %zu of %zu KiB of second lines resident\n", N, bytes >> 10, checked >> 10);
    assert_true(checked >= (size_t)N * sizeof(struct region_ext) / 2);    /* most of them looked at */
    assert_int_equal(bytes, 0);
    assert_int_equal(sizeof(struct drc_region), 64);
    drc_cache_stats(c, &s);
    assert_int_equal(s.regions, N);
    assert_int_equal(s.misses, N);
    done(b, c);
}

/* The control: CUDA regions write their memory's description there, and the check sees it. */
static void cuda_regions_write_their_second_line(void **state)
{
    struct tb *b = tb_new();
    drc_cache_t *c = mk(b, NULL);
    size_t checked, bytes;

    (void)state;
    drc__mem_set_ops(&all_cuda);
    fill(c, DRC_MEM_CUDA);
    drc__mem_set_ops(NULL);
    bytes = ext_resident(c, &checked);
    print_message("%d CUDA regions: %zu of %zu KiB of second lines resident\n", N, bytes >> 10, checked >> 10);
    assert_true(checked >= (size_t)N * sizeof(struct region_ext) / 2);
    assert_true(bytes >= checked / 2);
    done(b, c);
}

/* The control: a cache with limits links every live region in its LRU, through the second line. */
static void a_limited_cache_writes_its_lru_links(void **state)
{
    struct tb *b = tb_new();
    struct drc_config cfg = { .max_regions = 1 << 30 };
    drc_cache_t *c = mk(b, &cfg);
    size_t checked, bytes;

    (void)state;
    fill(c, DRC_MEM_HOST);
    bytes = ext_resident(c, &checked);
    print_message("%d host regions, limited cache: %zu of %zu KiB of second lines resident\n", N, bytes >> 10,
                  checked >> 10);
    assert_true(checked >= (size_t)N * sizeof(struct region_ext) / 2);
    assert_true(bytes >= checked / 2);
    done(b, c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(host_regions_leave_their_second_line_untouched, setup_alarm),
        cmocka_unit_test_setup(cuda_regions_write_their_second_line, setup_alarm),
        cmocka_unit_test_setup(a_limited_cache_writes_its_lru_links, setup_alarm),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
