/*
 * The hint table's memory (src/core/cache_hint.c): what a user sees in the
 * process's resident set. The table keeps two to four slots per cached
 * region, and grows in place: every table of a cache keeps its slots in one
 * range of address space, so the slots of the tables it outgrew are the
 * first ones of the current table, not memory of their own, and the cache's
 * own resident memory stays near the region slots themselves. A destroyed
 * cache's range may serve the next cache: none of its regions may show
 * through.
 *
 * Resident bytes are read with mincore() over the cache's pool chunks and
 * its slots (the structs of cache_int.h, reached only here to find those
 * addresses). The regions are fake addresses scattered over a large space
 * (the recording backend of backend.h registers nothing), so that every
 * page of the table is written by the fill and the lookups.
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

/* The slots' address space: every table's slots, and room for the largest. */
static size_t slots_resident(const drc_cache_t *c)
{
    return resident_bytes((uintptr_t)c->slots, (uintptr_t)(c->slots + ((size_t)1 << HINT_MAX_BITS)));
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

/* Is @p one of @c's regions (a pool slot, live or not)? */
static int own_region(const drc_cache_t *c, const struct drc_region *p)
{
    const struct chunk *ch;

    for (ch = c->chunks; ch; ch = ch->next)
        if (p >= &ch->r[0] && p < &ch->r[ch->n])
            return 1;
    return 0;
}

/*
 * 65,536 regions of one page (4,096 in DRC_DEBUG builds), scattered: of the
 * slots' space, exactly the current table is resident, at most 32 bytes of
 * slots per region; the tables it outgrew take no memory of their own (each
 * was a prefix of it, and every header names the same slots). The control:
 * the same measurement sees the current table, written all over, resident.
 * In all, the cache's chunks and slots stay within the region slots, the
 * table, and a page or two per allocation (with a table of its own per
 * size, they were 170 bytes per region here).
 */
static void the_table_grows_in_place(void **state)
{
    struct tb *b = tb_new();
    drc_cache_t *c = mk(b, NULL);
    const struct hint_tab *first = c->hint, *cur;
    size_t i, cur_bytes, all_bytes, cur_slots, region_bytes, nchunks = 0, grows = 0;
    drc_region_t *r;

    (void)state;
    for (i = 0; i < N; i++) {
        cur = c->hint;
        r = get_ok(c, at(scattered(i), 0), pg(), LW);
        assert_int_equal(drc_put(c, r), 0);
        grows += c->hint != cur;
        assert_ptr_equal(c->hint->slot, c->slots);      /* every table: the same slots */
    }
    for (i = 0; i < N; i++) {   /* hits: every lookup leaves its region in the current table */
        r = get_ok(c, at(scattered(i), 8), 64, LW);
        assert_int_equal(drc_put(c, r), 0);
    }
    cur = c->hint;
    assert_ptr_equal(first->slot, cur->slot);
    cur_slots = (size_t)1 << (64 - cur->shift);
    cur_bytes = resident_bytes((uintptr_t)c->slots, (uintptr_t)(c->slots + cur_slots));
    all_bytes = slots_resident(c);
    region_bytes = chunks_resident(c, &nchunks);
    print_message("%zu slots for %d regions after %zu grows: table %zu KiB resident, slot space %zu KiB, "
                  "%zu region chunks %zu KiB; %zu bytes per region in all\n", cur_slots, N, grows,
                  cur_bytes >> 10, all_bytes >> 10, nchunks, region_bytes >> 10, (all_bytes + region_bytes) / N);
    assert_true(cur_bytes >= cur_slots * sizeof(void *) / 4 * 3);      /* the control */
    assert_int_equal(all_bytes, cur_bytes);     /* nothing past the current table */
    assert_true(all_bytes + region_bytes <= N * (sizeof(struct drc_region) + 4 * sizeof(void *)) +
                                                 (nchunks + 1) * 2 * pg());
    /* two to four slots per region, after as many grows from 256 slots */
    assert_true(cur_slots >= 2 * (size_t)N && cur_slots <= 4 * (size_t)N);
    assert_true(grows >= 5);
    done(b, c);
}

/*
 * A destroyed cache's slot space, kept (drc__arena_table), serves the next
 * cache: the regions the old cache left in its slots must not show through
 * any table of the new one, since the new cache's arena may reuse their
 * memory for anything. The new cache grows over every slot the old one
 * wrote, at other addresses, so that its own fill and lookups leave most of
 * them alone: each slot of its table must be empty or one of its own
 * regions. The control: the space is the same one, and the old cache left
 * regions in it at the destroy.
 */
static void a_reused_slot_space_shows_no_old_region(void **state)
{
    struct tb *b = tb_new();
    drc_cache_t *c = mk(b, NULL);
    struct drc_region **space, *p;
    size_t i, n = N / 4, old_slots, left = 0, foreign = 0, own = 0;
    drc_region_t *r;

    (void)state;
    for (i = 0; i < n; i++) {
        r = get_ok(c, at(scattered(i), 0), pg(), LW);
        assert_int_equal(drc_put(c, r), 0);
    }
    space = c->slots;
    old_slots = (size_t)1 << (64 - c->hint->shift);
    drc__arena_keep(0);                     /* nothing kept from earlier tests: this cache's space is */
    drc__arena_keep(DRC__ARENA_KEEP);       /* the one kept (DRC_DEBUG builds keep nothing by default) */
    done(b, c);     /* its regions idle in the tree: the destroy deregisters them */
    for (i = 0; i < old_slots; i++)
        left += __atomic_load_n(&space[i], __ATOMIC_RELAXED) != NULL;

    b = tb_new();
    c = mk(b, NULL);
    assert_ptr_equal(c->slots, space);      /* the control: the same space */
    for (i = 0; i < n; i++) {
        r = get_ok(c, at(scattered(i) ^ 1, 0), pg(), LW);    /* other pages than the old cache's */
        assert_int_equal(drc_put(c, r), 0);
    }
    assert_true(((size_t)1 << (64 - c->hint->shift)) >= old_slots);
    for (i = 0; i < old_slots; i++) {
        p = __atomic_load_n(&c->slots[i], __ATOMIC_RELAXED);
        foreign += p && !own_region(c, p);
        own += p && own_region(c, p);
    }
    print_message("%zu slots: the destroyed cache left %zu regions in them; the new cache's table holds %zu of "
                  "its own, %zu others\n", old_slots, left, own, foreign);
    assert_true(left > old_slots / 8);      /* the control: there was something to show through */
    assert_true(own > 0);
    assert_int_equal(foreign, 0);
    done(b, c);
    drc__arena_keep(0);
}

/*
 * A probe that loaded a replaced table's header before the install reads
 * that table's used-grain filter after it, and must still find a bit for
 * every region that was live when the table was replaced (a clear bit tells
 * a free event "nothing there", and the event would return with the
 * registration still cached). Every replaced table is complete and keeps
 * the bit of each region registered before it was replaced (one thread:
 * those registered up to the get that grew it); the control: the filter
 * does say "nothing" for grains no region touches.
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
 * A region that leaves the tree takes its name out of the hint slots that
 * still hold it (hint_forget), so that the next lookup there does not read
 * a released region's line: invalidated by handle, by range, and by a free
 * event. They hold the index leaf it left instead, where the next lookup
 * there begins its walk, and that lookup (the miss that registers the
 * range again) finds nothing there and puts the new region in the slot. A
 * neighbour's slot keeps its region. The control: before each invalidation
 * every slot of the region named it (the lookups left it there), so an
 * invalidation that left them as they were fails the check after it.
 */
static void a_leaving_region_empties_its_slots(void **state)
{
    struct tb *b = tb_new();
    drc_cache_t *c = mk(b, NULL);
    drc_region_t *r, *nb, *h;
    const struct drc__itree_bt *leaf;
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
        leaf = (const void *)((uintptr_t)region_leaf(r) & ~(uintptr_t)63);     /* the leaf of its entry */
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
            assert_ptr_equal(slot_of(c, at(p, k * pg())), slot_of_leaf(leaf));
        assert_ptr_equal(slot_of(c, at(p + 8, 0)), nb);
        h = get_ok(c, at(p, 64), 64, LW);               /* a miss from that leaf */
        assert_ptr_equal(slot_of(c, at(p, 0)), h);
        assert_int_equal(drc_put(c, h), 0);
    }
    done(b, c);
}

/*
 * The grain. Regions that lie apart, here 16 pages at a 32-page stride,
 * get grains of twice their mean size: a slot each, so that the slots'
 * resident memory is one slot per region of the span, not two. Regions side
 * by side (16 pages at a 16-page stride) keep grains of their size, where
 * grains twice as large would put two regions in each slot. What a user
 * sees: every hit leaves its region in its own slot, and the slots' memory;
 * and the used-grain filter keeps grains of the regions' size, so that it
 * still says "nothing" over the gaps. The controls: the apart fill's slots with grains of the mean size would
 * take twice the bound below (its span is two grains a region); the side
 * by side fill's checks that each region keeps its slot fail with grains
 * twice their size, and the gaps' check with a filter of the slots' grains
 * (the three mutants were run).
 */
static void regions_apart_take_grains_twice_their_size(void **state)
{
    struct tb *b;
    drc_cache_t *c;
    drc_region_t *h, **regs = malloc(N * sizeof(*regs));
    size_t stride, i, size = 16 * pg(), slots;
    unsigned lg = 63 - (unsigned)__builtin_clzll(16 * pg());

    (void)state;
    assert_non_null(regs);
    for (stride = 32; stride >= 16; stride -= 16) {
        drc__arena_keep(0);     /* a fresh slot space: nothing resident that another cache wrote */
        b = tb_new();
        c = mk(b, NULL);
        for (i = 0; i < N; i++) {
            regs[i] = get_ok(c, at(i * stride, 0), size, LW);
            assert_int_equal(drc_put(c, regs[i]), 0);
        }
        for (i = 0; i < N; i++) {     /* hits, each leaving its region in its slot */
            h = get_ok(c, at(i * stride, size / 2 + 64), 64, LW);
            assert_ptr_equal(h, regs[i]);
            assert_int_equal(drc_put(c, h), 0);
        }
        for (i = 0; i < N; i++) {     /* after all of them: each slot still holds its own region */
            assert_ptr_equal(slot_of(c, at(i * stride, 0)), regs[i]);
            assert_ptr_equal(slot_of(c, at(i * stride, size - 1)), regs[i]);
        }
        /*
         * The used-grain filter keeps grains of the regions' size: it says
         * "nothing" over each gap between regions apart (what makes a free
         * event there cheap), though the gap is in its region's slot grain.
         */
        for (i = 0; i < N && stride == 32; i++) {
            assert_false(used_none(c->hint, (uintptr_t)at(i * stride, 0), (uintptr_t)at(i * stride, 64)));
            assert_true(used_none(c->hint, (uintptr_t)at(i * stride, size), (uintptr_t)at(i * stride, 2 * size - 1)));
        }
        slots = slots_resident(c);
        print_message("%zu regions of %zu KiB at a %zu KiB stride: grain %u, slots %zu KiB resident\n", (size_t)N,
                      size >> 10, stride * pg() >> 10, c->hint->grain, slots >> 10);
        assert_int_equal(c->hint->grain, stride == 32 ? lg + 1 : lg);
        assert_true(slots <= N * sizeof(void *) + 2 * pg());
        done(b, c);
    }
    free(regs);
#ifdef DRC_DEBUG
    drc__arena_keep(0);
#else
    drc__arena_keep(DRC__ARENA_KEEP);
#endif
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(the_table_grows_in_place, setup_alarm),
        cmocka_unit_test_setup(a_reused_slot_space_shows_no_old_region, setup_alarm),
        cmocka_unit_test_setup(replaced_tables_keep_their_filter, setup_alarm),
        cmocka_unit_test_setup(a_leaving_region_empties_its_slots, setup_alarm),
        cmocka_unit_test_setup(regions_apart_take_grains_twice_their_size, setup_alarm),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
