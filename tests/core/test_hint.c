/*
 * The hint table's memory (src/core/cache_hint.c): what a user sees in the
 * process's resident set. The table keeps two to four slots per cached
 * region, and a table replaced as the cache grows gives its slot pages back
 * (its filter and header stay), so the cache's own resident memory stays
 * near the region slots themselves.
 *
 * Resident bytes are read with mincore() over the cache's pool chunks and
 * each hint table (the structs of cache_int.h, reached only here to
 * find those addresses). The regions are fake addresses scattered over a
 * large space (the recording backend of backend.h registers nothing), so
 * that every page of every table is written by the fill and the lookups:
 * without the drop, each replaced table would stay resident in full.
 */
#include <stdlib.h>
#include <sys/mman.h>

#include "cachetest.h"
#include "core/cache_int.h"

#define LW IBV_ACCESS_LOCAL_WRITE
#define HUGE ((size_t)2 << 20)

/* regions (fewer in DRC_DEBUG builds, which check the whole tree at every unlock); pages they are scattered over */
#ifdef DRC_DEBUG
enum { N = 4096, SPREAD = 1 << 26 };
#else
enum { N = 65536, SPREAD = 1 << 26 };
#endif

/* Page i of the spread: distinct for distinct i < SPREAD (an odd multiplier modulo a power of two). */
static size_t scattered(size_t i)
{
    return (i * 0x9e3779b1u) & (SPREAD - 1);
}

/* A table's whole allocation: header, slots, filter. */
static size_t table_resident(const struct hint_tab *t)
{
    size_t slots = (size_t)1 << (64 - t->shift);

    return resident_bytes((uintptr_t)t, (uintptr_t)&t->used[(slots >> 6) + 1]);
}

/* The region slots: every pool chunk. */
static size_t chunks_resident(const drc_cache_t *c, size_t *nchunks)
{
    const struct chunk *ch;
    size_t bytes = 0;

    for (ch = c->chunks; ch; ch = ch->next, ++*nchunks)
        bytes += resident_bytes((uintptr_t)ch, (uintptr_t)&ch->r[ch->n]);
    return bytes;
}

/*
 * 65,536 regions of one page (4,096 in DRC_DEBUG builds), scattered: the current table is resident (the
 * control: the measurement sees a table the fill wrote everywhere), at most
 * 32 bytes of slots per region, and the tables it replaced hold no more than
 * their header and filter pages (before, all of each stayed: 170 bytes per
 * region here; the regression check is this plain build's, where the
 * tables are large). In all, the cache's chunks and tables stay within the
 * region slots, the table, and a page or two per allocation.
 */
static void replaced_tables_give_their_pages_back(void **state)
{
    struct tb *b = tb_new();
    drc_cache_t *c = mk(b, NULL);
    const struct hint_tab *t, *cur;
    size_t i, cur_bytes, old_bytes = 0, tables = 0, cur_slots, region_bytes, nchunks = 0;
    drc_region_t *r;

    (void)state;
    for (i = 0; i < N; i++) {
        r = get_ok(c, at(scattered(i), 0), pg(), LW);
        assert_int_equal(drc_put(c, r), 0);
    }
    for (i = 0; i < N; i++) {   /* hits: every lookup leaves its region in the current table */
        r = get_ok(c, at(scattered(i), 8), 64, LW);
        assert_int_equal(drc_put(c, r), 0);
    }
    cur = c->hint;
    cur_slots = (size_t)1 << (64 - cur->shift);
    cur_bytes = table_resident(cur);
    for (t = cur->older; t; t = t->older, tables++)
        old_bytes += table_resident(t);
    region_bytes = chunks_resident(c, &nchunks);
    print_message("%zu slots for %d regions: table %zu KiB resident, %zu replaced tables %zu KiB, "
                  "%zu region chunks %zu KiB; %zu bytes per region in all\n", cur_slots, N, cur_bytes >> 10,
                  tables, old_bytes >> 10, nchunks, region_bytes >> 10, (cur_bytes + old_bytes + region_bytes) / N);
    /* the control: the same measurement sees the current table, written all over, resident */
    assert_true(cur_bytes >= cur_slots * sizeof(void *) / 4 * 3);
    /*
     * Replaced: a page of header and slots, a page of slots and filter, and the filter (1/64 of the
     * slots); and one huge page, in case khugepaged collapses a range that had dropped pages in it
     * while the test runs (seen once on a loaded machine with THP on).
     */
    assert_true(old_bytes <= tables * 2 * pg() + cur_slots * sizeof(void *) / 64 + HUGE);
    /* in all: the region slots, 32 bytes of slots per region, and a page or two per chunk and table */
    assert_true(cur_bytes + old_bytes + region_bytes <= N * (sizeof(struct drc_region) + 4 * sizeof(void *)) +
                                                            cur_slots / 8 + (nchunks + tables + 1) * 2 * pg() + HUGE);
    /* two to four slots per region, after as many grows from 256 slots */
    assert_true(cur_slots >= 2 * (size_t)N && cur_slots <= 4 * (size_t)N);
    assert_true(tables >= 5);
    done(b, c);
}

/*
 * What makes the drop safe: a probe that loaded a replaced table's pointer
 * before the install reads its used-grain filter after the drop, and must
 * still find a bit for every region that was live when the table was
 * replaced (a clear bit tells a free event "nothing there", and the event
 * would return with the registration still cached). Every replaced table is
 * complete and keeps the bit of each region registered before it was
 * replaced (one thread: those registered up to the get that grew it); the control: the
 * filter does say "nothing" for grains no region touches.
 */
static void replaced_tables_keep_their_filter(void **state)
{
    struct tb *b = tb_new();
    drc_cache_t *c = mk(b, NULL);
    const struct hint_tab *t, *seen[64];
    size_t i, k, before[64], tables = 0, lost = 0, clear_gaps = 0;
    uintptr_t s;
    drc_region_t *r;

    (void)state;
    for (i = 0; i < N; i++) {
        t = c->hint;
        r = get_ok(c, at(scattered(i), 0), pg(), LW);
        assert_int_equal(drc_put(c, r), 0);
        if (c->hint != t && tables < 64) {
            seen[tables] = t;       /* replaced by this get's grow: regions 0..i were in it */
            before[tables++] = i + 1;
        }
    }
    for (k = 0; k < tables; k++) {
        t = seen[k];
        assert_int_equal(t->complete, 1);
        for (i = 0; i < before[k]; i++) {
            s = (uintptr_t)at(scattered(i), 0);
            lost += used_none(t, s, s + pg() - 1);
            s = (uintptr_t)at(scattered(i) ^ 1, 0);   /* no region there unless another's page */
            clear_gaps += used_none(t, s, s + pg() - 1);
        }
    }
    print_message("%zu replaced tables: %zu bits lost, %zu gaps found clear\n", tables, lost, clear_gaps);
    assert_true(tables >= 5);
    assert_int_equal(lost, 0);
    assert_true(clear_gaps > 0);
    done(b, c);
}

/* The current table's slot for a lookup at @a. */
static const struct drc_region *slot_of(const drc_cache_t *c, const void *a)
{
    return *hint_slot(c, (uintptr_t)a);
}

/*
 * A region that leaves the tree empties the hint slots that still name it
 * (hint_forget), so that the next lookup there does not read a released
 * region's line: invalidated by handle, by range, and by a free event. A
 * neighbour's slot keeps its region. The control: before each invalidation
 * every slot of the region named it (the lookups left it there), so an
 * invalidation that left them as they were fails the check after it.
 */
static void a_leaving_region_empties_its_slots(void **state)
{
    struct tb *b = tb_new();
    drc_cache_t *c = mk(b, NULL);
    drc_region_t *r, *nb, *h;
    size_t how, k, p;

    (void)state;
    for (how = 0; how < 3; how++) {
        p = 16 * how;
        r = get_ok(c, at(p, 0), 4 * pg(), LW);          /* four pages: four grains of a new table */
        assert_int_equal(drc_put(c, r), 0);
        nb = get_ok(c, at(p + 8, 0), pg(), LW);
        assert_int_equal(drc_put(c, nb), 0);
        for (k = 0; k < 4; k++) {
            h = get_ok(c, at(p, k * pg() + 64), 64, LW);
            assert_ptr_equal(h, r);
            assert_int_equal(drc_put(c, h), 0);
            assert_ptr_equal(slot_of(c, at(p, k * pg())), r);      /* the control */
        }
        if (how == 0) {
            h = get_ok(c, at(p, 0), 64, LW);
            assert_int_equal(drc_region_invalidate(c, h), 1);
            assert_int_equal(drc_put(c, h), 0);
        } else if (how == 1) {
            assert_int_equal(drc_invalidate(c, at(p, 0), 4 * pg()), 1);
        } else {
            drc_notify_free(at(p, 0), 4 * pg());
        }
        for (k = 0; k < 4; k++)
            assert_null(slot_of(c, at(p, k * pg())));
        assert_ptr_equal(slot_of(c, at(p + 8, 0)), nb);
    }
    done(b, c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(replaced_tables_give_their_pages_back, setup_alarm),
        cmocka_unit_test_setup(replaced_tables_keep_their_filter, setup_alarm),
        cmocka_unit_test_setup(a_leaving_region_empties_its_slots, setup_alarm),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
