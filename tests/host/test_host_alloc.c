/*
 * Tests of drc_host_alloc / drc_host_free (src/host/host_alloc.c): memory from
 * drc's jemalloc arena keeps its registration while jemalloc keeps its
 * pages, and is invalidated before jemalloc gives the pages back to the OS.
 * The backend is the recording DOUBLE of backend.h; its dereg hook looks at
 * the buffer at the moment of deregistration, to check that it still holds
 * what was written there (the pages have not gone yet).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "backend.h"
#include "drc.h"
#include "drc_host.h"
#include "host/host_alloc.h"

#define ACCESS 0x7u
#define LEN (4u << 20)

struct seen {
    const unsigned char *buf;
    int calls;
    int intact;     /* every dereg saw the buffer's first and last byte still 0xab */
};

static int look_at_buffer(struct tb *b, unsigned long id, void *arg)
{
    struct seen *s = arg;

    (void)b;
    (void)id;
    s->calls++;
    s->intact = (s->calls == 1 || s->intact) && s->buf[0] == 0xab && s->buf[LEN - 1] == 0xab;
    return 0;
}

static void test_alloc_gives_page_aligned_writable_memory(void **state)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    unsigned char *p = drc_host_alloc(LEN), *small = drc_host_alloc(100);

    (void)state;
    assert_non_null(p);
    assert_non_null(small);
    assert_int_equal((uintptr_t)p % page, 0);
    memset(p, 1, LEN);
    memset(small, 2, 100);
    assert_int_equal(p[LEN - 1], 1);
    assert_null(drc_host_alloc(0));
    drc_host_free(p);
    drc_host_free(small);
    drc_host_free(NULL);
}

/* An idle registration survives free (same pages) and goes at the purge, before the pages do. */
static void test_purge_invalidates_before_the_pages_go(void **state)
{
    struct tb *b = tb_new();
    struct seen s = { 0 };
    drc_cache_t *c;
    drc_region_t *r;
    unsigned char *p;

    (void)state;
    assert_int_equal(drc_cache_create(&b->be, NULL, &c), 0);
    p = drc_host_alloc(LEN);
    assert_non_null(p);
    memset(p, 0xab, LEN);
    s.buf = p;
    b->dereg_hook = look_at_buffer;
    b->dereg_arg = &s;
    assert_int_equal(drc_get(c, p, LEN, ACCESS, &r), 0);
    assert_int_equal(drc_put(c, r), 0);
    drc_host_free(p);
    assert_int_equal(tb_live(b), 1);        /* freed to the arena, pages kept: still correct to keep */
    assert_int_equal(drc__host_purge(), 0);
    assert_int_equal(tb_live(b), 0);
    assert_int_equal(s.calls, 1);
    assert_true(s.intact);
    assert_int_equal(drc_cache_destroy(c), 0);
    assert_int_equal(tb_all_released_once(b), 0);
    tb_free(b);
}

/* A region still held at the purge is invalidated, and deregistered at its last put. */
static void test_held_region_is_invalidated_then_released(void **state)
{
    struct tb *b = tb_new();
    drc_cache_t *c;
    drc_region_t *r, *again;
    unsigned char *p;

    (void)state;
    assert_int_equal(drc_cache_create(&b->be, NULL, &c), 0);
    p = drc_host_alloc(LEN);
    assert_non_null(p);
    assert_int_equal(drc_get(c, p, LEN, ACCESS, &r), 0);
    drc_host_free(p);
    assert_int_equal(drc__host_purge(), 0);
    assert_false(drc_region_valid(r));
    assert_int_equal(tb_live(b), 1);
    /* the same addresses again (whatever jemalloc hands out there): a new registration */
    assert_int_equal(drc_get(c, p, LEN, ACCESS, &again), 0);
    assert_ptr_not_equal(again, r);
    assert_int_equal(tb_nreg(b), 2);
    assert_int_equal(drc_put(c, r), 0);
    assert_int_equal(drc_put(c, again), 0);
    assert_int_equal(tb_live(b), 1);
    assert_int_equal(drc_cache_destroy(c), 0);
    assert_int_equal(tb_all_released_once(b), 0);
    tb_free(b);
}

/* Memory of other allocators is not this arena's: its purge leaves their registrations alone. */
static void test_purge_leaves_other_memory_alone(void **state)
{
    struct tb *b = tb_new();
    drc_cache_t *c;
    drc_region_t *r;
    void *other = aligned_alloc(4096, LEN);

    (void)state;
    assert_non_null(other);
    assert_int_equal(drc_cache_create(&b->be, NULL, &c), 0);
    assert_int_equal(drc_get(c, other, LEN, ACCESS, &r), 0);
    assert_int_equal(drc_put(c, r), 0);
    assert_int_equal(drc__host_purge(), 0);
    assert_int_equal(tb_live(b), 1);
    assert_int_equal(drc_cache_destroy(c), 0);
    assert_int_equal(tb_all_released_once(b), 0);
    tb_free(b);
    free(other);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_alloc_gives_page_aligned_writable_memory),
        cmocka_unit_test(test_purge_invalidates_before_the_pages_go),
        cmocka_unit_test(test_held_region_is_invalidated_then_released),
        cmocka_unit_test(test_purge_leaves_other_memory_alone),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
