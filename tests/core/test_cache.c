/*
 * Tests of src/core/cache.c through the public API, one thread.
 *
 * The backend is the recording double of backend.h (no RDMA device here): it
 * records every reg and dereg, fails on request, and runs callbacks inside
 * reg/dereg. Addresses are fake (cachetest.h): the cache never touches the
 * memory it registers. Every test ends by destroying its cache and checking
 * that each handle the backend gave out was deregistered exactly once.
 */
#include <infiniband/verbs.h>
#include <signal.h>

#include "core/cache.h"
#include "cachetest.h"

#define LW IBV_ACCESS_LOCAL_WRITE
#define RW IBV_ACCESS_REMOTE_WRITE
#define RR IBV_ACCESS_REMOTE_READ

/* Deadlocks turn into a failing test instead of a hang. */

/* ---- 1. hits ------------------------------------------------------------ */

static void hit_returns_containing_region_and_counts_references(void **state)
{
    struct tb *b = tb_new();
    drc_cache_t *c = mk(b, NULL);
    drc_region_t *r1, *r2, *r3;
    unsigned long id;

    (void)state;
    r1 = get_ok(c, at(0, 100), 200, LW | RR);
    id = rid(r1);
    assert_int_equal(id, 1);
    assert_int_equal(drc_region_valid(r1), 1);
    assert_bounds(r1, at(0, 0), pg());
    assert_int_equal(drc_region_access(r1), LW | RR);
    assert_int_equal(drc_region_lkey(r1), tb_lkey(id));
    assert_int_equal(drc_region_rkey(r1), tb_rkey(id));
    assert_int_equal(drc_region_type(r1), DRC_MEM_HOST);
    EXPECT_STATS(c, .misses = 1, .regs = 1, .regions = 1, .bytes = pg(), .in_use = 1);

    /* a sub-range with the same bits: the same region, one more reference */
    r2 = get_ok(c, at(0, 300), 10, LW | RR);
    assert_ptr_equal(r2, r1);
    assert_int_equal(tb_nreg(b), 1);
    EXPECT_STATS(c, .hits = 1, .misses = 1, .regs = 1, .regions = 1, .bytes = pg(), .in_use = 1);

    /* two references, two puts; a third finds the count at 0 */
    assert_int_equal(drc_put(c, r2), 0);
    EXPECT_STATS(c, .hits = 1, .misses = 1, .regs = 1, .regions = 1, .bytes = pg(), .in_use = 1);
    assert_int_equal(drc_put(c, r1), 0);
    EXPECT_STATS(c, .hits = 1, .misses = 1, .regs = 1, .regions = 1, .bytes = pg(), .in_use = 0);
    assert_int_equal(drc_put(c, r1), -EINVAL);

    /* idle regions stay cached and registered */
    assert_int_equal(tb_dereg_calls(b), 0);
    assert_int_equal(tb_is_live(b, id), 1);
    r3 = get_ok(c, at(0, 0), pg(), LW | RR);
    assert_ptr_equal(r3, r1);
    assert_int_equal(rid(r3), id);
    EXPECT_STATS(c, .hits = 2, .misses = 1, .regs = 1, .regions = 1, .bytes = pg(), .in_use = 1);
    assert_int_equal(drc_put(c, r3), 0);
    done(b, c);
}

static void many_references_balance(void **state)
{
    struct tb *b = tb_new();
    drc_cache_t *c = mk(b, NULL);
    drc_region_t *r[5];
    int i;

    (void)state;
    for (i = 0; i < 5; i++)
        r[i] = get_ok(c, at(2, (size_t)i), 1, LW);
    for (i = 1; i < 5; i++)
        assert_ptr_equal(r[i], r[0]);
    EXPECT_STATS(c, .hits = 4, .misses = 1, .regs = 1, .regions = 1, .bytes = pg(), .in_use = 1);
    assert_int_equal(drc_cache_destroy(c), -EBUSY);
    for (i = 0; i < 5; i++)
        assert_int_equal(drc_put(c, r[i]), 0);
    assert_int_equal(drc_put(c, r[0]), -EINVAL);
    EXPECT_STATS(c, .hits = 4, .misses = 1, .regs = 1, .regions = 1, .bytes = pg(), .in_use = 0);
    done(b, c);
}

/* ---- 2. page alignment -------------------------------------------------- */

static void check_args(struct tb *b, const drc_region_t *r, const void *start, size_t len, unsigned access)
{
    struct tb_rec rec = tb_get(b, rid(r));

    assert_int_equal(rec.args.start, (uintptr_t)start);
    assert_int_equal(rec.args.len, len);
    assert_int_equal(rec.args.start % pg(), 0);
    assert_int_equal(rec.args.len % pg(), 0);
    assert_int_equal(rec.args.type, DRC_MEM_HOST);
    assert_int_equal(rec.args.device, -1);
    assert_int_equal(rec.args.dmabuf_fd, -1);
    assert_int_equal(rec.args.access, access);
    assert_bounds(r, start, len);
}

static void registration_is_page_aligned(void **state)
{
    struct tb *b = tb_new();
    drc_cache_t *c = mk(b, NULL);
    drc_region_t *r[4];
    int i;

    (void)state;
    r[0] = get_ok(c, at(3, 5), 1, LW);                 /* inside one page */
    check_args(b, r[0], at(3, 0), pg(), LW);
    r[1] = get_ok(c, at(5, pg() - 1), 2, RR);          /* two bytes across a page boundary */
    check_args(b, r[1], at(5, 0), 2 * pg(), RR);
    r[2] = get_ok(c, at(8, 0), pg(), LW | RW);         /* exactly one page */
    check_args(b, r[2], at(8, 0), pg(), LW | RW);
    r[3] = get_ok(c, at(10, 1), 3 * pg(), 0);          /* three pages starting one byte in: four */
    check_args(b, r[3], at(10, 0), 4 * pg(), 0);
    EXPECT_STATS(c, .misses = 4, .regs = 4, .regions = 4, .bytes = 8 * pg(), .in_use = 4);
    for (i = 0; i < 4; i++)
        assert_int_equal(drc_put(c, r[i]), 0);
    done(b, c);
}

/* The last page of the address space: rounding up must not wrap. */
static void range_ending_at_top_of_address_space(void **state)
{
    struct tb *b = tb_new();
    drc_cache_t *c = mk(b, NULL);
    uintptr_t top = UINTPTR_MAX & ~(uintptr_t)(pg() - 1);
    drc_region_t *r;

    (void)state;
    r = get_ok(c, (const void *)(UINTPTR_MAX - 99), 100, LW);   /* the last byte is UINTPTR_MAX */
    check_args(b, r, (const void *)top, pg(), LW);
    assert_int_equal(drc_put(c, r), 0);
    assert_int_equal(drc_invalidate(c, (const void *)UINTPTR_MAX, 1), 1);
    assert_int_equal(tb_live(b), 0);
    EXPECT_STATS(c, .misses = 1, .invalidated = 1, .regs = 1, .deregs = 1);
    done(b, c);
}

/* A merge whose union would be the whole address space registers the request alone. */
static void merge_never_covers_whole_address_space(void **state)
{
    struct tb *b = tb_new();
    drc_cache_t *c = mk(b, NULL);
    uintptr_t top = UINTPTR_MAX & ~(uintptr_t)(pg() - 1);
    drc_region_t *lo, *hi, *mid;

    (void)state;
    lo = get_ok(c, (const void *)1, 2 * pg() - 1, LW);                     /* [0, 2 pages) */
    hi = get_ok(c, (const void *)(top - pg()), 2 * pg(), LW);              /* the top two pages */
    mid = get_ok(c, (const void *)pg(), top - pg() + 1, LW);               /* overlaps both */
    check_args(b, mid, (const void *)pg(), (size_t)0 - pg(), LW);
    assert_int_equal(b->reg_calls, 3);
    EXPECT_STATS(c, .misses = 3, .regs = 3, .regions = 3, .bytes = 4 * pg() + ((size_t)0 - pg()), .in_use = 3);
    assert_int_equal(drc_put(c, lo), 0);
    assert_int_equal(drc_put(c, hi), 0);
    assert_int_equal(drc_put(c, mid), 0);
    done(b, c);
}

/* ---- 3. coalescing ------------------------------------------------------ */

/* The relaxed access rule, opted into (DRC_F_ACCESS_SUPERSET): hits and merges across local bits. */
static const struct drc_config superset = { .flags = DRC_F_ACCESS_SUPERSET };

static void merge_covers_union_and_deregisters_idle(void **state)
{
    struct tb *b = tb_new();
    drc_cache_t *c = mk(b, &superset);
    drc_region_t *a, *bb, *u, *h;
    unsigned long ida, idb;
    int k;

    (void)state;
    a = get_ok(c, at(0, 0), pg(), LW | RW);
    ida = rid(a);
    assert_int_equal(drc_put(c, a), 0);
    bb = get_ok(c, at(2, 0), pg(), RW | IBV_ACCESS_RELAXED_ORDERING);
    idb = rid(bb);
    assert_int_equal(drc_put(c, bb), 0);

    /* [0.5, 2.5) pages touches pages 0..2: one region over the union, all local bits, the same remote bit */
    u = get_ok(c, at(0, pg() / 2), 2 * pg(), RW);
    check_args(b, u, at(0, 0), 3 * pg(), LW | RW | IBV_ACCESS_RELAXED_ORDERING);
    assert_int_equal(drc_region_access(u), LW | RW | IBV_ACCESS_RELAXED_ORDERING);
    /* the idle overlapped regions were deregistered before drc_get returned */
    assert_int_equal(tb_is_live(b, ida), 0);
    assert_int_equal(tb_is_live(b, idb), 0);
    EXPECT_STATS(c, .misses = 3, .merges = 1, .regs = 3, .deregs = 2, .regions = 1, .bytes = 3 * pg(),
                 .in_use = 1);
    /* and no later get returns them: every page now hits the union */
    for (k = 0; k < 3; k++) {
        h = get_ok(c, at((size_t)k, 0), 1, RW);
        assert_ptr_equal(h, u);
        assert_int_equal(drc_put(c, h), 0);
    }
    h = get_ok(c, at(0, 0), pg(), LW | RW);
    assert_ptr_equal(h, u);
    assert_int_equal(drc_put(c, h), 0);
    EXPECT_STATS(c, .hits = 4, .misses = 3, .merges = 1, .regs = 3, .deregs = 2, .regions = 1, .bytes = 3 * pg(),
                 .in_use = 1);
    assert_int_equal(drc_put(c, u), 0);
    done(b, c);
}

static void merge_with_busy_region_defers_its_dereg(void **state)
{
    struct tb *b = tb_new();
    drc_cache_t *c = mk(b, NULL);
    drc_region_t *a, *u, *h;
    unsigned long ida;

    (void)state;
    a = get_ok(c, at(0, 0), pg(), LW);
    ida = rid(a);
    u = get_ok(c, at(0, 0), 2 * pg(), LW);     /* overlaps a: the union supersedes it */
    assert_ptr_not_equal(u, a);
    check_args(b, u, at(0, 0), 2 * pg(), LW);
    /* a is still held: still registered, its handle and keys unchanged for its user */
    assert_int_equal(tb_is_live(b, ida), 1);
    assert_int_equal(rid(a), ida);
    assert_int_equal(drc_region_lkey(a), tb_lkey(ida));
    assert_bounds(a, at(0, 0), pg());
    EXPECT_STATS(c, .misses = 2, .merges = 1, .regs = 2, .regions = 1, .bytes = 2 * pg(), .in_use = 2);
    assert_int_equal(drc_put(c, u), 0);

    /* a left the tree at once: its exact range now returns the union */
    h = get_ok(c, at(0, 0), pg(), LW);
    assert_ptr_equal(h, u);
    assert_int_equal(drc_put(c, h), 0);

    /* the last put of a deregisters it */
    assert_int_equal(drc_put(c, a), 0);
    assert_int_equal(tb_is_live(b, ida), 0);
    EXPECT_STATS(c, .hits = 1, .misses = 2, .merges = 1, .regs = 2, .deregs = 1, .regions = 1, .bytes = 2 * pg());
    done(b, c);
}

static void local_access_upgrade_merges(void **state)
{
    struct tb *b = tb_new();
    drc_cache_t *c = mk(b, &superset);
    drc_region_t *a, *u;

    (void)state;
    a = get_ok(c, at(4, 0), 2 * pg(), RR);
    assert_int_equal(drc_put(c, a), 0);
    /* same range, a local bit a lacks: a miss, registered with the union of the bits */
    u = get_ok(c, at(5, 0), 2 * pg(), RR | LW);
    check_args(b, u, at(4, 0), 3 * pg(), LW | RR);
    assert_int_equal(tb_is_live(b, 1), 0);
    EXPECT_STATS(c, .misses = 2, .merges = 1, .regs = 2, .deregs = 1, .regions = 1, .bytes = 3 * pg(),
                 .in_use = 1);
    assert_int_equal(drc_put(c, u), 0);
    done(b, c);
}

/*
 * An rkey grants only what was asked, under the relaxed rule too: remote bits are never joined, and a hit
 * has exactly the remote bits asked.
 */
static void remote_access_is_never_widened(void **state)
{
    struct tb *b = tb_new();
    drc_cache_t *c = mk(b, &superset);
    drc_region_t *w, *r, *h, *x;

    (void)state;
    w = get_ok(c, at(4, 0), 2 * pg(), LW | RW);
    /* overlapping, other remote bits: registered alone with exactly what was asked, w stays */
    r = get_ok(c, at(5, 0), 2 * pg(), LW | RR);
    check_args(b, r, at(5, 0), 2 * pg(), LW | RR);
    assert_int_equal(tb_is_live(b, rid(w)), 1);
    /* controls: each is still found for its own bits, and a local subset hits */
    h = get_ok(c, at(4, 0), pg(), LW | RW);
    assert_ptr_equal(h, w);
    assert_int_equal(drc_put(c, h), 0);
    h = get_ok(c, at(6, 0), pg(), RR);
    assert_ptr_equal(h, r);
    assert_int_equal(drc_put(c, h), 0);
    assert_int_equal(b->reg_calls, 2);
    /* both remote bits over the overlap: neither serves, and neither is joined */
    x = get_ok(c, at(5, 0), pg(), RW | RR);
    check_args(b, x, at(5, 0), pg(), RW | RR);
    assert_int_equal(tb_is_live(b, rid(w)) + tb_is_live(b, rid(r)), 2);
    assert_int_equal(drc_put(c, x), 0);
    /* a region with more remote bits than asked is never handed out: x and w cover page 4.5, r has LW */
    h = get_ok(c, at(5, 0), pg(), RW);
    assert_int_equal(drc_region_access(h) & DRC_ACCESS_REMOTE, RW);
    assert_ptr_not_equal(h, x);
    assert_int_equal(drc_put(c, h), 0);
    h = get_ok(c, at(5, 0), pg(), RR);
    assert_ptr_equal(h, r);
    assert_int_equal(drc_put(c, h), 0);
    assert_int_equal(b->reg_calls, 3);
    /* a purely local request (only the lkey is of use) may share a region with remote bits */
    h = get_ok(c, at(5, 0), pg(), LW);
    assert_int_equal(b->reg_calls, 3);
    assert_int_equal(drc_put(c, h), 0);
    /* control: the same request again hits what it registered */
    x = get_ok(c, at(5, 0), pg(), RW | RR);
    assert_int_equal(drc_region_access(x), RW | RR);
    assert_int_equal(b->reg_calls, 3);
    assert_int_equal(drc_put(c, x), 0);
    assert_int_equal(drc_put(c, w), 0);
    assert_int_equal(drc_put(c, r), 0);
    done(b, c);
}

/*
 * Coalesced regions are disjoint, and the live tree keeps no subtree_last
 * while they are (plain mode, itree.h). The first region that overlaps
 * another (other remote bits) ends plain mode: from then on a query needs
 * subtree_last, computed at that moment for every region already there.
 * Every region, old and new, must still be found, by a get and by an
 * invalidation of a range (DRC_DEBUG builds also check the tree at every
 * unlock).
 */
/*
 * The default rule: a hit has exactly the bits asked. A LOCAL_WRITE-only request over a region registered
 * with REMOTE_WRITE gets a region of its own whose rkey allows no remote access; one without
 * RELAXED_ORDERING never gets a relaxed-ordering region; a miss never joins a region with other bits. The
 * control is the same sequence under DRC_F_ACCESS_SUPERSET, where the local request shares the remote
 * region (its rkey would let a peer write).
 */
static void access_is_exact_by_default(void **state)
{
    const unsigned RO = IBV_ACCESS_RELAXED_ORDERING;
    struct tb *b = tb_new();
    drc_cache_t *c = mk(b, NULL), *lax;
    drc_region_t *w, *l, *h, *ro, *plain;

    (void)state;
    w = get_ok(c, at(0, 0), 4 * pg(), LW | RW);
    l = get_ok(c, at(1, 0), pg(), LW);
    assert_ptr_not_equal(l, w);
    check_args(b, l, at(1, 0), pg(), LW);       /* its own pages, not joined with w */
    assert_int_equal(drc_region_access(l), LW);
    assert_int_equal(tb_is_live(b, rid(w)), 1);
    /* each is found again for its own bits, and only for them */
    h = get_ok(c, at(1, 8), 16, LW);
    assert_ptr_equal(h, l);
    assert_int_equal(drc_put(c, h), 0);
    h = get_ok(c, at(1, 8), 16, LW | RW);
    assert_ptr_equal(h, w);
    assert_int_equal(drc_put(c, h), 0);
    assert_int_equal(b->reg_calls, 2);
    /* RELAXED_ORDERING: never handed to a request that did not ask it, and the reverse */
    ro = get_ok(c, at(8, 0), pg(), LW | RW | RO);
    plain = get_ok(c, at(8, 0), pg(), LW | RW);
    assert_ptr_not_equal(plain, ro);
    assert_int_equal(drc_region_access(plain), LW | RW);
    assert_int_equal(drc_region_access(ro), LW | RW | RO);
    assert_int_equal(b->reg_calls, 4);
    assert_int_equal(drc_put(c, plain), 0);
    assert_int_equal(drc_put(c, ro), 0);
    assert_int_equal(drc_put(c, l), 0);
    assert_int_equal(drc_put(c, w), 0);
    done(b, c);

    /* control: the relaxed rule shares the remote region with the local request */
    b = tb_new();
    lax = mk(b, &superset);
    w = get_ok(lax, at(0, 0), 4 * pg(), LW | RW);
    l = get_ok(lax, at(1, 0), pg(), LW);
    assert_ptr_equal(l, w);
    assert_int_equal(drc_region_access(l) & DRC_ACCESS_REMOTE, RW);
    plain = get_ok(lax, at(8, 0), pg(), LW | RW | RO);
    ro = get_ok(lax, at(8, 0), pg(), LW | RW);
    assert_ptr_equal(ro, plain);
    assert_int_equal(b->reg_calls, 2);
    assert_int_equal(drc_put(lax, ro), 0);
    assert_int_equal(drc_put(lax, plain), 0);
    assert_int_equal(drc_put(lax, l), 0);
    assert_int_equal(drc_put(lax, w), 0);
    done(b, lax);
}

static void first_overlap_keeps_every_region_found(void **state)
{
    enum { N = 300 };
    struct tb *b = tb_new();
    drc_cache_t *c = mk(b, NULL);
    drc_region_t *r[N], *o, *h;
    unsigned long id[N];
    unsigned i, k;

    (void)state;
    for (i = 0; i < N; i++) {       /* out of address order: the plain tree takes descents and rotations */
        k = (i * 7919u) % N;
        r[k] = get_ok(c, at(4 * k, 0), 2 * pg(), LW | RW);
        id[k] = rid(r[k]);
        assert_int_equal(drc_put(c, r[k]), 0);
    }
    o = get_ok(c, at(4 * 150 + 1, 0), 4 * pg(), LW | RR);    /* overlaps 150 and 151: other remote bits */
    check_args(b, o, at(4 * 150 + 1, 0), 4 * pg(), LW | RR);
    assert_int_equal(drc_put(c, o), 0);
    assert_int_equal(b->reg_calls, N + 1);
    for (i = 0; i < N; i++) {       /* every region hits, the one it overlaps too */
        h = get_ok(c, at(4 * i, 8), pg(), LW | RW);
        assert_ptr_equal(h, r[i]);
        assert_int_equal(drc_put(c, h), 0);
    }
    h = get_ok(c, at(4 * 150 + 2, 0), pg(), LW | RR);
    assert_ptr_equal(h, o);
    assert_int_equal(drc_put(c, h), 0);
    assert_int_equal(b->reg_calls, N + 1);
    /* a range over 149..152 takes exactly those and o; their neighbours stay */
    assert_int_equal(drc_invalidate(c, at(4 * 149, 0), 4 * 4 * pg()), 5);   /* the four and o */
    for (i = 0; i < N; i++)
        assert_int_equal(tb_is_live(b, id[i]), i < 149 || i > 152);
    assert_int_equal(tb_is_live(b, rid(o)), 0);
    for (i = N; i-- > 0;) {         /* then each of the others by its own range, the last first */
        if (i >= 149 && i <= 152)
            continue;
        assert_int_equal(drc_invalidate(c, at(4 * i + 1, 0), 1), 1);
        assert_int_equal(tb_is_live(b, id[i]), 0);
    }
    assert_int_equal(tb_live(b), 0);
    done(b, c);
}

/*
 * Packed host sub-buffers (a transfer engine's 10,000 neighbours that share
 * their boundary pages): each miss joins its neighbour only while the union
 * stays within twice its own pages, so the total registered stays within
 * twice the buffer instead of re-registering a growing union every time.
 */
static void packed_neighbours_do_not_reregister_a_growing_union(void **state)
{
    enum { N = 10000, SUB = 100000 };
    struct tb *b = tb_new();
    drc_cache_t *c = mk(b, NULL);
    unsigned long i, total = 0;
    drc_region_t *r;

    (void)state;
    for (i = 0; i < N; i++) {
        r = get_ok(c, at(0, i * SUB), SUB, LW | RW | RR);
        assert_int_equal(drc_put(c, r), 0);
    }
    for (i = 0; i < tb_nreg(b); i++)
        total += b->rec[i].args.len;
    print_message("%lu registrations, %lu bytes for a %lu-byte buffer\n", tb_nreg(b), total, (unsigned long)N * SUB);
    assert_true(total <= 2ul * N * SUB);
    /* and each neighbour hits now */
    for (i = 0; i < N; i++) {
        r = get_ok(c, at(0, i * SUB), SUB, LW | RW | RR);
        assert_int_equal(drc_put(c, r), 0);
    }
    assert_int_equal(b->reg_calls, tb_nreg(b));
    done(b, c);
}

static void adjacent_pages_do_not_merge(void **state)
{
    struct tb *b = tb_new();
    drc_cache_t *c = mk(b, NULL);
    drc_region_t *a, *n;

    (void)state;
    a = get_ok(c, at(0, 0), pg(), LW);
    n = get_ok(c, at(1, 0), pg(), LW);
    assert_ptr_not_equal(a, n);
    check_args(b, n, at(1, 0), pg(), LW);
    assert_int_equal(tb_is_live(b, rid(a)), 1);
    EXPECT_STATS(c, .misses = 2, .regs = 2, .regions = 2, .bytes = 2 * pg(), .in_use = 2);
    assert_int_equal(drc_put(c, a), 0);
    assert_int_equal(drc_put(c, n), 0);
    done(b, c);
}

static void no_merge_registers_own_range(void **state)
{
    struct drc_config cfg = { .flags = DRC_F_NO_MERGE };
    struct tb *b = tb_new();
    drc_cache_t *c = mk(b, &cfg);
    drc_region_t *a, *n, *h;

    (void)state;
    a = get_ok(c, at(0, 0), 2 * pg(), LW);
    assert_int_equal(drc_put(c, a), 0);
    n = get_ok(c, at(1, 0), 2 * pg(), RR);
    check_args(b, n, at(1, 0), 2 * pg(), RR);
    assert_int_equal(tb_is_live(b, rid(a)), 1);
    EXPECT_STATS(c, .misses = 2, .regs = 2, .regions = 2, .bytes = 4 * pg(), .in_use = 1);
    /* both stay findable */
    h = get_ok(c, at(0, 0), 1, LW);
    assert_ptr_equal(h, a);
    assert_int_equal(drc_put(c, h), 0);
    h = get_ok(c, at(2, 0), pg(), RR);
    assert_ptr_equal(h, n);
    assert_int_equal(drc_put(c, h), 0);
    assert_int_equal(drc_put(c, n), 0);
    EXPECT_STATS(c, .hits = 2, .misses = 2, .regs = 2, .regions = 2, .bytes = 4 * pg());
    done(b, c);
}

/* ---- 4. invalidation ---------------------------------------------------- */

static void invalidate_by_handle(void **state)
{
    struct drc_config cfg = { .flags = DRC_F_NO_MERGE };
    struct tb *b = tb_new();
    drc_cache_t *c = mk(b, &cfg), *c2 = mk(b, NULL);
    drc_region_t *a, *o, *h;

    (void)state;
    a = get_ok(c, at(0, 0), 2 * pg(), LW);
    o = get_ok(c, at(1, 0), 2 * pg(), LW);     /* overlaps a (no merging) */
    assert_int_equal(drc_region_invalidate(c, a), 1);
    assert_int_equal(drc_region_valid(a), 0);
    assert_int_equal(tb_is_live(b, rid(a)), 1);     /* held: deregistered on its last put */
    assert_int_equal(drc_region_invalidate(c, a), 0);
    EXPECT_STATS(c, .misses = 2, .invalidated = 1, .regs = 2, .regions = 1, .bytes = 2 * pg(), .in_use = 2);
    /* no later get returns it; the overlapping region is untouched */
    h = get_ok(c, at(0, 0), pg(), LW);
    assert_ptr_not_equal(h, a);
    assert_int_equal(drc_put(c, h), 0);
    h = get_ok(c, at(2, 0), pg(), LW);
    assert_ptr_equal(h, o);
    assert_int_equal(drc_put(c, h), 0);
    /* a range invalidation does not count it again */
    assert_int_equal(drc_invalidate(c, at(0, 0), 1), 1);   /* the region registered just now */
    assert_int_equal(drc_put(c, a), 0);
    assert_int_equal(tb_is_live(b, rid(a)), 0);
    /* bad arguments change nothing */
    assert_int_equal(drc_region_invalidate(NULL, o), -EINVAL);
    assert_int_equal(drc_region_invalidate(c, NULL), -EINVAL);
    assert_int_equal(drc_region_invalidate(c2, o), -EINVAL);   /* not c2's */
    assert_int_equal(drc_put(c, o), 0);
    assert_int_equal(drc_region_invalidate(c, o), -EINVAL);    /* not held */
    assert_int_equal(drc_region_valid(o), 1);
    assert_int_equal(drc_cache_destroy(c2), 0);
    done(b, c);
}

/* A superseded region still held (in the detached tree) can be invalidated by its handle too. */
static void invalidate_superseded_by_handle(void **state)
{
    struct tb *b = tb_new();
    drc_cache_t *c = mk(b, NULL);
    drc_region_t *a, *u;

    (void)state;
    a = get_ok(c, at(0, 0), pg(), LW);
    u = get_ok(c, at(0, 0), 2 * pg(), LW);     /* supersedes a, which stays valid while held */
    assert_ptr_not_equal(a, u);
    assert_int_equal(drc_region_valid(a), 1);
    assert_int_equal(drc_region_invalidate(c, a), 1);
    assert_int_equal(drc_region_valid(a), 0);
    assert_int_equal(drc_region_valid(u), 1);
    assert_int_equal(drc_invalidate(c, at(0, 0), 1), 1);   /* u only */
    assert_int_equal(drc_put(c, a), 0);
    assert_int_equal(drc_put(c, u), 0);
    assert_int_equal(tb_live(b), 0);
    EXPECT_STATS(c, .misses = 2, .merges = 1, .invalidated = 2, .regs = 2, .deregs = 2);
    done(b, c);
}

static void invalidate_idle_deregisters_before_return(void **state)
{
    struct tb *b = tb_new();
    drc_cache_t *c = mk(b, NULL);
    drc_region_t *a, *o, *h;
    unsigned long ida, ido;

    (void)state;
    a = get_ok(c, at(0, 0), 2 * pg(), LW);
    ida = rid(a);
    assert_int_equal(drc_put(c, a), 0);
    o = get_ok(c, at(4, 0), pg(), LW);
    ido = rid(o);
    assert_int_equal(drc_put(c, o), 0);

    assert_int_equal(drc_invalidate(c, at(1, 10), 1), 1);   /* one byte inside a */
    assert_int_equal(tb_is_live(b, ida), 0);
    assert_int_equal(tb_is_live(b, ido), 1);
    EXPECT_STATS(c, .misses = 2, .invalidated = 1, .regs = 2, .deregs = 1, .regions = 1, .bytes = pg());

    /* a's range misses now; the other region is untouched */
    h = get_ok(c, at(0, 0), 1, LW);
    assert_int_not_equal(rid(h), ida);
    assert_int_equal(rid(h), 3);
    assert_int_equal(drc_put(c, h), 0);
    h = get_ok(c, at(4, 0), 1, LW);
    assert_int_equal(rid(h), ido);
    assert_int_equal(drc_put(c, h), 0);
    EXPECT_STATS(c, .hits = 1, .misses = 3, .invalidated = 1, .regs = 3, .deregs = 1, .regions = 2,
                 .bytes = 2 * pg());

    /* nothing there, or nothing asked: nothing invalidated */
    assert_int_equal(drc_invalidate(c, at(20, 0), 100 * pg()), 0);
    assert_int_equal(drc_invalidate(c, at(0, 0), 0), 0);
    EXPECT_STATS(c, .hits = 1, .misses = 3, .invalidated = 1, .regs = 3, .deregs = 1, .regions = 2,
                 .bytes = 2 * pg());
    done(b, c);
}

static void invalidate_busy_defers_dereg_to_last_put(void **state)
{
    struct tb *b = tb_new();
    drc_cache_t *c = mk(b, NULL);
    drc_region_t *a, *a2, *n;
    unsigned long ida;

    (void)state;
    a = get_ok(c, at(0, 0), pg(), LW);
    a2 = get_ok(c, at(0, 0), pg(), LW);
    ida = rid(a);
    assert_int_equal(drc_invalidate(c, at(0, 0), pg()), 1);
    assert_int_equal(drc_region_valid(a), 0);
    assert_int_equal(tb_is_live(b, ida), 1);     /* its user may still be doing RDMA with it */
    EXPECT_STATS(c, .hits = 1, .misses = 1, .invalidated = 1, .regs = 1, .in_use = 1);

    n = get_ok(c, at(0, 0), pg(), LW);
    assert_ptr_not_equal(n, a);
    assert_int_not_equal(rid(n), ida);
    assert_int_equal(drc_region_valid(n), 1);

    assert_int_equal(drc_put(c, a), 0);
    assert_int_equal(tb_is_live(b, ida), 1);     /* one reference left */
    assert_int_equal(drc_put(c, a2), 0);
    assert_int_equal(tb_is_live(b, ida), 0);
    assert_int_equal(drc_put(c, a2), -EINVAL);
    EXPECT_STATS(c, .hits = 1, .misses = 2, .invalidated = 1, .regs = 2, .deregs = 1, .regions = 1,
                 .bytes = pg(), .in_use = 1);
    assert_int_equal(drc_put(c, n), 0);
    done(b, c);
}

/*
 * Once two threads hit a cache, a hit counts its reference in its thread's
 * slot, not in the region's word (cache.c, "Thread references"): a region
 * held only through such hits is held all the same, by an invalidation, by destroy and by the stats. (Without the
 * drain's move of the slot counts into the word, the invalidation below
 * deregisters the held region at once.)
 */
static void region_held_only_by_hits_is_held(void **state)
{
    struct tb *b = tb_new();
    drc_cache_t *c = mk(b, NULL);
    drc_region_t *a, *h1, *h2;
    unsigned long ida;

    (void)state;
    a = get_ok(c, at(0, 0), pg(), LW);
    assert_int_equal(drc_put(c, a), 0);
    hit_from_another_thread(c, at(0, 0));  /* two threads hit it: this one's hits go to its slot */
    h1 = get_ok(c, at(0, 64), 64, LW);
    h2 = get_ok(c, at(0, 128), 64, LW);
    assert_ptr_equal(h1, a);
    assert_ptr_equal(h2, a);
    ida = rid(a);
    EXPECT_STATS(c, .hits = 3, .misses = 1, .regs = 1, .regions = 1, .bytes = pg(), .in_use = 1);
    assert_int_equal(drc_cache_destroy(c), -EBUSY);
    assert_int_equal(drc_region_invalidate(c, h1), 1);
    assert_int_equal(tb_is_live(b, ida), 1);
    assert_int_equal(drc_put(c, h1), 0);
    assert_int_equal(tb_is_live(b, ida), 1);     /* one hit's reference left */
    EXPECT_STATS(c, .hits = 3, .misses = 1, .invalidated = 1, .regs = 1, .in_use = 1);
    assert_int_equal(drc_put(c, h2), 0);
    assert_int_equal(tb_is_live(b, ida), 0);
    assert_int_equal(drc_put(c, h2), -EINVAL);
    EXPECT_STATS(c, .hits = 3, .misses = 1, .invalidated = 1, .regs = 1, .deregs = 1);
    done(b, c);
}

static void invalidate_marks_superseded_held_region(void **state)
{
    struct tb *b = tb_new();
    drc_cache_t *c = mk(b, NULL);
    drc_region_t *a, *u;
    unsigned long ida, idu;

    (void)state;
    a = get_ok(c, at(0, 0), pg(), LW);
    ida = rid(a);
    u = get_ok(c, at(0, 0), 2 * pg(), LW);
    idu = rid(u);
    assert_int_equal(drc_put(c, u), 0);
    assert_int_equal(drc_region_valid(a), 1);   /* superseded, not invalidated */

    /* both the union and the superseded region it replaced were valid */
    assert_int_equal(drc_invalidate(c, at(0, 0), 1), 2);
    assert_int_equal(drc_region_valid(a), 0);
    assert_int_equal(drc_region_valid(u), 0);
    assert_int_equal(tb_is_live(b, idu), 0);
    assert_int_equal(tb_is_live(b, ida), 1);
    EXPECT_STATS(c, .misses = 2, .merges = 1, .invalidated = 2, .regs = 2, .deregs = 1, .in_use = 1);
    /* invalidating it again counts nothing */
    assert_int_equal(drc_invalidate(c, at(0, 0), pg()), 0);
    assert_int_equal(drc_put(c, a), 0);
    assert_int_equal(tb_is_live(b, ida), 0);
    EXPECT_STATS(c, .misses = 2, .merges = 1, .invalidated = 2, .regs = 2, .deregs = 2);
    done(b, c);
}

struct in_reg {
    drc_cache_t *c;
    int times;                  /* hook runs left; -1 for always */
    const void *addr;           /* range to invalidate; NULL: the range being registered */
    size_t len;
    int result;                 /* last drc_invalidate result */
    unsigned long stale_id;     /* the first registration it invalidated */
};

static int invalidate_in_reg(struct tb *b, unsigned long id, void *arg)
{
    struct in_reg *x = arg;
    struct tb_rec rec = tb_get(b, id);

    if (x->times == 0)
        return 0;
    if (x->times > 0)
        x->times--;
    if (!x->stale_id)
        x->stale_id = id;
    if (x->addr)
        x->result = drc_invalidate(x->c, x->addr, x->len);
    else
        x->result = drc_invalidate(x->c, (const void *)rec.args.start, rec.args.len);
    return 0;
}

static void registration_raced_by_invalidation_is_dropped(void **state)
{
    struct tb *b = tb_new();
    drc_cache_t *c = mk(b, NULL);
    struct in_reg x = { .c = c, .times = 1 };
    drc_region_t *r;

    (void)state;
    b->reg_hook = invalidate_in_reg;
    b->reg_arg = &x;
    /* the memory is freed (and invalidated) while the backend registers it */
    r = get_ok(c, at(0, 0), pg(), LW);
    assert_int_equal(x.stale_id, 1);
    assert_int_equal(x.result, 0);              /* nothing valid was there yet */
    assert_int_not_equal(rid(r), 1);            /* never the raced registration */
    assert_int_equal(rid(r), 2);
    assert_int_equal(tb_is_live(b, 1), 0);      /* which was deregistered */
    assert_int_equal(drc_region_valid(r), 1);
    EXPECT_STATS(c, .misses = 2, .regs = 2, .deregs = 1, .regions = 1, .bytes = pg(), .in_use = 1);
    assert_int_equal(drc_put(c, r), 0);
    done(b, c);
}

static void registration_always_raced_fails_with_nothing_cached(void **state)
{
    struct tb *b = tb_new();
    drc_cache_t *c = mk(b, NULL);
    struct in_reg x = { .c = c, .times = -1 };
    drc_region_t *r = NULL;
    struct drc_stats s = { .comp_mask = DRC_STATS_ALL };

    (void)state;
    b->reg_hook = invalidate_in_reg;
    b->reg_arg = &x;
    assert_int_equal(drc_get(c, at(0, 0), pg(), LW, &r), -EAGAIN);
    assert_int_equal(tb_live(b), 0);
    assert_true(tb_nreg(b) >= 2);
    drc_cache_stats(c, &s);
    assert_int_equal(s.regs, tb_nreg(b));
    assert_int_equal(s.deregs, tb_nreg(b));
    assert_int_equal(s.misses, tb_nreg(b));
    assert_int_equal(s.regions, 0);
    assert_int_equal(s.in_use, 0);
    assert_int_equal(s.hits, 0);
    /* once the memory stops being freed, the range registers normally */
    x.times = 0;
    r = get_ok(c, at(0, 0), pg(), LW);
    assert_int_equal(tb_live(b), 1);
    assert_int_equal(drc_put(c, r), 0);
    done(b, c);
}

static void invalidation_of_other_range_in_reg_keeps_registration(void **state)
{
    struct tb *b = tb_new();
    drc_cache_t *c = mk(b, NULL);
    struct in_reg x = { .c = c, .times = 1, .addr = at(1, 0), .len = pg() };
    drc_region_t *r;

    (void)state;
    b->reg_hook = invalidate_in_reg;
    b->reg_arg = &x;
    r = get_ok(c, at(0, 0), pg(), LW);          /* [0, 1) pages; [1, 2) is disjoint */
    assert_int_equal(rid(r), 1);
    EXPECT_STATS(c, .misses = 1, .regs = 1, .regions = 1, .bytes = pg(), .in_use = 1);
    assert_int_equal(drc_put(c, r), 0);
    done(b, c);
}

static void invalidation_racing_a_merge(void **state)
{
    struct tb *b = tb_new();
    drc_cache_t *c = mk(b, NULL);
    struct in_reg x = { .c = c, .times = 0, .addr = at(0, 0), .len = pg() };
    drc_region_t *a, *r;

    (void)state;
    a = get_ok(c, at(0, 0), pg(), LW);          /* id 1, held */
    b->reg_hook = invalidate_in_reg;
    b->reg_arg = &x;
    x.times = 1;
    /* the merged registration [0, 2) is raced by an invalidation of [0, 1): dropped */
    r = get_ok(c, at(0, pg() / 2), pg(), RR);
    assert_int_equal(x.stale_id, 2);
    assert_int_equal(x.result, 1);              /* a */
    assert_int_equal(tb_is_live(b, 2), 0);
    assert_int_equal(drc_region_valid(a), 0);
    /* the retry found nothing valid to merge with: its own pages only, access as asked */
    assert_int_equal(rid(r), 3);
    check_args(b, r, at(0, 0), 2 * pg(), RR);
    EXPECT_STATS(c, .misses = 3, .invalidated = 1, .regs = 3, .deregs = 1, .regions = 1, .bytes = 2 * pg(),
                 .in_use = 2);
    assert_int_equal(drc_put(c, a), 0);
    assert_int_equal(tb_is_live(b, 1), 0);
    assert_int_equal(drc_put(c, r), 0);
    done(b, c);
}

/* ---- 5. limits ---------------------------------------------------------- */

static void getput(drc_cache_t *c, size_t page, size_t pages)
{
    drc_region_t *r = get_ok(c, at(page, 0), pages * pg(), LW);

    assert_int_equal(drc_put(c, r), 0);
}

/*
 * Free events over memory freed in address order, one region after the
 * other, in an index of three levels: the walk of each may start at the
 * leaf where the removal before it left off (itree.h, the finger) instead
 * of descending. Between them, free events far behind and far ahead of that
 * leaf, whose walks must not start there, and one over the gap after the
 * next region, whose walk does and must find nothing. Each must take out
 * its own region and no other: it is deregistered, one region fewer is
 * live, and the next region still hits. Controls, by hand: a walk that
 * takes the finger's leaf for a key below its first start misses a region
 * behind (a free event that invalidates nothing), and one above its last
 * start invalidates another region than the one freed.
 */
static void free_events_in_address_order_take_their_own_region(void **state)
{
    enum { N = 3000 };
    struct tb *b = tb_new();
    drc_cache_t *c = mk(b, NULL);
    static unsigned long id[N];
    static int gone[N];
    unsigned long regs, live = N;
    drc_region_t *r;
    int i, j;

    (void)state;
    for (i = 0; i < N; i++) {
        r = get_ok(c, at(4 * (size_t)i, 0), 2 * pg(), LW);
        id[i] = rid(r);
        assert_int_equal(drc_put(c, r), 0);
    }
    regs = b->reg_calls;
#define FREE_ONE(k)                                                                      \
    do {                                                                                 \
        assert_int_equal(drc_notify_free(at(4 * (size_t)(k), 0), 2 * pg()), 1);         \
        assert_int_equal(tb_is_live(b, id[k]), 0);                                       \
        assert_int_equal(tb_live(b), --live);                                            \
        gone[k] = 1;                                                                     \
    } while (0)
    for (i = 0; i < N; i++) {
        if (gone[i] || i % 7 == 0)
            continue;               /* every seventh is kept for the free events behind */
        FREE_ONE(i);
        if (i + 2 >= N)
            continue;
        assert_int_equal(drc_notify_free(at(4 * (size_t)i + 6, 0), 2 * pg()), 0);  /* the gap after i + 1 */
        assert_int_equal(tb_live(b), live);
        if (!gone[i + 1]) {
            r = get_ok(c, at(4 * (size_t)i + 4, 8), pg(), LW);
            assert_int_equal(rid(r), id[i + 1]);                            /* i + 1 still hits */
            assert_int_equal(drc_put(c, r), 0);
        }
        if (i % 10 == 1 && (j = (i - 50) / 7 * 7) > 0 && !gone[j])
            FREE_ONE(j);            /* behind */
        else if (i % 10 == 3 && (j = i + 50) < N && j % 7 && !gone[j])
            FREE_ONE(j);            /* ahead */
    }
    for (i = 0; i < N; i++)
        if (!gone[i])
            FREE_ONE(i);
#undef FREE_ONE
    assert_int_equal(b->reg_calls, regs);
    assert_int_equal(tb_live(b), 0);
    done(b, c);
}

/*
 * Invalidations by handle in an index of many leaves (itree.c), between
 * registrations that split those leaves: a live region keeps the leaf its
 * insert answered, and a removal by handle starts there when the region is
 * still inside it, else it descends (drc__itree_remove_in). Each must take
 * out its own region and no other: it reads invalid and is deregistered,
 * the regions beside it still hit, and the cache counts what is left. The
 * same with DRC_F_REVOKE, whose revoking list reuses the word that holds a
 * live region's leaf, and with a limit, whose evictions take regions out
 * the same way. Regions at every other page; the gaps are registered as
 * the invalidations go.
 */
static void invalidate_by_handle_in_a_large_index(void **state)
{
    enum { N = 300 };
    const struct drc_config cfgs[3] = { { .flags = 0 }, { .flags = DRC_F_REVOKE }, { .max_regions = 2 * N / 3 } };
    struct drc_stats st;
    drc_region_t *r, *nb;
    size_t i, j, k, gaps;
    unsigned long id;
    unsigned long ids[N];
    char gap[N], out[N];

    (void)state;
    for (k = 0; k < 3; k++) {
        struct tb *b = tb_new();
        drc_cache_t *c = mk(b, &cfgs[k]);

        memset(gap, 0, sizeof(gap));
        memset(out, 0, sizeof(out));
        for (i = 0; i < N; i++) {
            r = get_ok(c, at(2 * i, 0), pg(), LW);
            ids[i] = rid(r);
            assert_int_equal(drc_put(c, r), 0);
        }
        for (j = 0, gaps = 0; j < N; j++) {
            i = (j * 7) % N;                        /* 7 and N share no factor: each once */
            r = get_ok(c, at(2 * i, 0), pg(), LW);  /* a hit (or, under the limit, a miss) */
            id = rid(r);
            if (j % 3 == 0) {
                getput(c, 2 * ((i * 11) % N) + 1, 1);   /* a gap between two regions: a leaf may split */
                gaps += !gap[(i * 11) % N];
                gap[(i * 11) % N] = 1;
            }
            assert_int_equal(drc_region_invalidate(c, r), 1);
            assert_int_equal(drc_region_valid(r), 0);
            assert_int_equal(tb_is_live(b, id), k == 1 ? 0 : 1);   /* revoked: deregistered already */
            assert_int_equal(drc_put(c, r), 0);
            assert_int_equal(tb_is_live(b, id), 0);
            out[i] = 1;
            if (i + 1 < N && !out[i + 1]) {         /* the next region still hits, valid */
                nb = get_ok(c, at(2 * (i + 1), 0), pg(), LW);
                assert_int_equal(drc_region_valid(nb), 1);
                assert_bounds(nb, at(2 * (i + 1), 0), pg());
                if (k < 2)
                    assert_int_equal(rid(nb), ids[i + 1]);  /* the same registration (without limits) */
                assert_int_equal(drc_put(c, nb), 0);
            }
            r = get_ok(c, at(2 * i, 0), pg(), LW);  /* registered again: a miss */
            assert_int_not_equal(rid(r), id);
            assert_int_equal(drc_put(c, r), 0);
            assert_int_equal(drc_invalidate(c, at(2 * i, 0), pg()), 1);
        }
        drc_cache_stats(c, &st);
        assert_int_equal(st.invalidated, 2 * N);
        if (k < 2)
            assert_int_equal(st.regions, gaps);     /* the gap regions, each once */
        else
            assert_true(st.regions <= 2 * N / 3 && st.evicted > 0);
        done(b, c);
    }
}

/*
 * drc_invalidate right after a lookup of the range: the lockless probe finds
 * the region in the hint slot, and the lock takes it as the range's only
 * region when it is live and holds the whole range, while regions are
 * disjoint (cache.c, range_holder). Each case checks what the user sees:
 * how many regions went, and that no lookup returns them. Where regions
 * overlap (DRC_F_NO_MERGE, a second registration over the slot's region's
 * pages) the slot's region is not the only one: both must go. Control: a
 * range wider than the slot's region, and a range that only touches it,
 * take the walk and find the same. Mutant seen to fail: the slot's region
 * taken as the range's only one while regions overlap (no check in
 * range_holder, no walk after it: 1 region out of 2).
 */
static void invalidate_range_from_the_hint_slot(void **state)
{
    struct drc_config cfg = { .flags = DRC_F_NO_MERGE };
    struct tb *b = tb_new();
    drc_cache_t *c = mk(b, NULL), *o = mk(b, &cfg);
    drc_region_t *a, *n, *h;
    unsigned long ida, idn;

    (void)state;
    /* disjoint: the slot's region, alone */
    a = get_ok(c, at(0, 0), 4 * pg(), LW);
    n = get_ok(c, at(8, 0), pg(), LW);
    ida = rid(a);
    assert_int_equal(drc_put(c, a), 0);
    assert_int_equal(drc_put(c, n), 0);
    getput(c, 1, 1);                                        /* the slot of page 1 names a */
    assert_int_equal(drc_invalidate(c, at(1, 0), pg()), 1);
    assert_int_equal(tb_is_live(b, ida), 0);
    h = get_ok(c, at(1, 0), pg(), LW);                      /* registered anew */
    assert_int_not_equal(rid(h), ida);
    assert_int_equal(drc_put(c, h), 0);
    h = get_ok(c, at(8, 0), pg(), LW);                      /* the other region untouched */
    assert_ptr_equal(h, n);
    assert_int_equal(drc_put(c, h), 0);
    /* control: a range past the slot's region (from page 1 to page 9): both, by the walk */
    assert_int_equal(drc_invalidate(c, at(1, 0), 8 * pg()), 2);
    EXPECT_STATS(c, .hits = 2, .misses = 3, .invalidated = 3, .regs = 3, .deregs = 3);

    /* overlapping regions: the slot's region holds the range, and another overlaps it */
    a = get_ok(o, at(0, 0), 4 * pg(), LW);
    n = get_ok(o, at(2, 0), 4 * pg(), RR);                  /* over a's pages 2-3: no merging */
    ida = rid(a);
    idn = rid(n);
    assert_int_equal(drc_put(o, n), 0);
    assert_int_equal(drc_put(o, a), 0);
    h = get_ok(o, at(2, 0), 1, LW);                         /* the slot of page 2 names a */
    assert_ptr_equal(h, a);
    assert_int_equal(drc_put(o, h), 0);
    assert_int_equal(drc_invalidate(o, at(2, 0), pg()), 2);
    assert_int_equal(tb_is_live(b, ida), 0);
    assert_int_equal(tb_is_live(b, idn), 0);
    h = get_ok(o, at(2, 0), 1, RR);
    assert_int_not_equal(rid(h), idn);
    assert_int_equal(drc_put(o, h), 0);
    /* control: a range that only touches the region (its last byte and the next page) walks */
    assert_int_equal(drc_invalidate(o, (const char *)at(3, 0) - 1, 2), 1);
    assert_int_equal(drc_cache_destroy(o), 0);
    done(b, c);
}

static void max_regions_evicts_least_recently_idle(void **state)
{
    struct drc_config cfg = { .max_regions = 3 };
    struct tb *b = tb_new();
    drc_cache_t *c = mk(b, &cfg);
    drc_region_t *d, *e;

    (void)state;
    getput(c, 0, 1);    /* A id 1 */
    getput(c, 2, 1);    /* B id 2 */
    getput(c, 4, 1);    /* C id 3 */
    getput(c, 0, 1);    /* A again: now the most recently idle; order B C A */
    EXPECT_STATS(c, .hits = 1, .misses = 3, .regs = 3, .regions = 3, .bytes = 3 * pg());
    d = get_ok(c, at(6, 0), pg(), LW);          /* D id 4: B goes */
    assert_int_equal(tb_dereg_calls(b), 1);
    assert_int_equal(b->order[0], 2);
    assert_int_equal(drc_put(c, d), 0);
    e = get_ok(c, at(8, 0), pg(), LW);          /* E id 5: C goes */
    assert_int_equal(tb_dereg_calls(b), 2);
    assert_int_equal(b->order[1], 3);
    assert_int_equal(drc_put(c, e), 0);
    EXPECT_STATS(c, .hits = 1, .misses = 5, .evicted = 2, .regs = 5, .deregs = 2, .regions = 3,
                 .bytes = 3 * pg());
    /* the survivors hit */
    getput(c, 0, 1);
    getput(c, 6, 1);
    getput(c, 8, 1);
    EXPECT_STATS(c, .hits = 4, .misses = 5, .evicted = 2, .regs = 5, .deregs = 2, .regions = 3,
                 .bytes = 3 * pg());
    assert_int_equal(tb_is_live(b, 1), 1);
    done(b, c);
}

static void busy_regions_are_never_evicted(void **state)
{
    struct drc_config cfg = { .max_regions = 1 };
    struct tb *b = tb_new();
    drc_cache_t *c = mk(b, &cfg);
    drc_region_t *r[3];
    int i;

    (void)state;
    for (i = 0; i < 3; i++)
        r[i] = get_ok(c, at(2 * (size_t)i, 0), pg(), LW);
    /* over the limit, all in use: stats show the excess */
    EXPECT_STATS(c, .misses = 3, .regs = 3, .regions = 3, .bytes = 3 * pg(), .in_use = 3);
    assert_int_equal(tb_live(b), 3);
    /* each region that becomes idle while over the limit is evicted */
    assert_int_equal(drc_put(c, r[2]), 0);
    assert_int_equal(tb_is_live(b, 3), 0);
    EXPECT_STATS(c, .misses = 3, .evicted = 1, .regs = 3, .deregs = 1, .regions = 2, .bytes = 2 * pg(),
                 .in_use = 2);
    assert_int_equal(drc_put(c, r[1]), 0);
    assert_int_equal(tb_is_live(b, 2), 0);
    /* within the limit again: the last one stays */
    assert_int_equal(drc_put(c, r[0]), 0);
    assert_int_equal(tb_is_live(b, 1), 1);
    EXPECT_STATS(c, .misses = 3, .evicted = 2, .regs = 3, .deregs = 2, .regions = 1, .bytes = pg());
    done(b, c);
}

static void max_bytes_evicts_least_recently_idle(void **state)
{
    struct drc_config cfg = { .max_bytes = 3 * pg() };
    struct tb *b = tb_new();
    drc_cache_t *c = mk(b, &cfg);

    (void)state;
    getput(c, 0, 1);    /* id 1: 1 page */
    getput(c, 2, 2);    /* id 2: 2 pages, 3 in all */
    EXPECT_STATS(c, .misses = 2, .regs = 2, .regions = 2, .bytes = 3 * pg());
    getput(c, 6, 1);    /* id 3: 4 pages: id 1 goes */
    assert_int_equal(tb_dereg_calls(b), 1);
    assert_int_equal(b->order[0], 1);
    EXPECT_STATS(c, .misses = 3, .evicted = 1, .regs = 3, .deregs = 1, .regions = 2, .bytes = 3 * pg());
    getput(c, 10, 2);   /* id 4: 5 pages: id 2 (2 pages) goes */
    assert_int_equal(tb_dereg_calls(b), 2);
    assert_int_equal(b->order[1], 2);
    EXPECT_STATS(c, .misses = 4, .evicted = 2, .regs = 4, .deregs = 2, .regions = 2, .bytes = 3 * pg());
    getput(c, 20, 4);   /* id 5 alone exceeds the limit: everything else goes, then itself when idle */
    EXPECT_STATS(c, .misses = 5, .evicted = 5, .regs = 5, .deregs = 5, .regions = 0, .bytes = 0);
    done(b, c);
}

/* ---- 6. backend calls run without the cache's lock ----------------------- */

struct reenter {
    drc_cache_t *c;
    int fired;
    struct drc_stats seen;
    int inner_get, inner_put, inval;
    unsigned long inner_id;
    size_t get_page, inval_page;
};

/* Run inside the backend's reg or dereg (once): stats, a get+put of page get_page, an invalidate of page inval_page. */
static int reenter(struct tb *b, unsigned long id, void *arg)
{
    struct reenter *x = arg;
    drc_region_t *r = NULL;

    (void)b;
    (void)id;
    if (x->fired++)
        return 0;
    x->seen.comp_mask = DRC_STATS_ALL;
    drc_cache_stats(x->c, &x->seen);
    x->inner_get = drc_get(x->c, at(x->get_page, 0), pg(), LW, &r);
    x->inner_id = r ? rid(r) : 0;
    x->inner_put = r ? drc_put(x->c, r) : -1;
    x->inval = drc_invalidate(x->c, at(x->inval_page, 0), pg());
    return 0;
}

static void backend_reg_may_call_into_cache(void **state)
{
    struct tb *b = tb_new();
    drc_cache_t *c = mk(b, NULL);
    struct reenter x = { .c = c, .fired = 1, .get_page = 5, .inval_page = 10 };
    drc_region_t *r;

    (void)state;
    b->reg_hook = reenter;
    b->reg_arg = &x;
    getput(c, 10, 1);   /* id 1, idle */
    x.fired = 0;
    r = get_ok(c, at(0, 0), pg(), LW);          /* id 2; inside its reg: stats, get (id 3), invalidate id 1 */
    assert_int_equal(rid(r), 2);
    assert_int_equal(x.seen.regions, 1);
    assert_int_equal(x.seen.misses, 2);
    assert_int_equal(x.inner_get, 0);
    assert_int_equal(x.inner_id, 3);
    assert_int_equal(x.inner_put, 0);
    assert_int_equal(x.inval, 1);
    assert_int_equal(tb_is_live(b, 1), 0);
    EXPECT_STATS(c, .misses = 3, .invalidated = 1, .regs = 3, .deregs = 1, .regions = 2, .bytes = 2 * pg(),
                 .in_use = 1);
    assert_int_equal(drc_put(c, r), 0);
    done(b, c);
}

static void backend_dereg_may_call_into_cache(void **state)
{
    struct tb *b = tb_new();
    drc_cache_t *c = mk(b, NULL);
    struct reenter x = { .c = c, .get_page = 8, .inval_page = 4 };
    drc_region_t *h;

    (void)state;
    getput(c, 0, 1);    /* id 1 */
    getput(c, 4, 1);    /* id 2 */
    b->dereg_hook = reenter;
    b->dereg_arg = &x;
    /* dereg of id 1 registers [8, 9) (id 3) and invalidates id 2 */
    assert_int_equal(drc_invalidate(c, at(0, 0), pg()), 1);
    assert_int_equal(x.inner_get, 0);
    assert_int_equal(x.inner_id, 3);
    assert_int_equal(x.inval, 1);
    assert_int_equal(tb_is_live(b, 1), 0);
    assert_int_equal(tb_is_live(b, 2), 0);
    EXPECT_STATS(c, .misses = 3, .invalidated = 2, .regs = 3, .deregs = 2, .regions = 1, .bytes = pg());
    h = get_ok(c, at(8, 0), 1, LW);
    assert_int_equal(rid(h), 3);
    assert_int_equal(drc_put(c, h), 0);
    done(b, c);
}

/* ---- 7. bad input ------------------------------------------------------- */

static void bad_get_arguments_change_nothing(void **state)
{
    static const unsigned bad_access[] = { IBV_ACCESS_ZERO_BASED, IBV_ACCESS_ON_DEMAND, IBV_ACCESS_HUGETLB,
                                           1u << 31, ~0u, LW | (1u << 7) };
    struct tb *b = tb_new();
    drc_cache_t *c = mk(b, NULL);
    drc_region_t *r = NULL, *a;
    size_t i;

    (void)state;
    a = get_ok(c, at(0, 0), pg(), LW);
    assert_int_equal(drc_get(NULL, at(0, 0), 1, LW, &r), -EINVAL);
    assert_int_equal(drc_get(c, at(0, 0), 1, LW, NULL), -EINVAL);
    assert_int_equal(drc_get(c, at(0, 0), 0, LW, &r), -EINVAL);
    assert_int_equal(drc_get(c, (const void *)(UINTPTR_MAX - 10), 100, LW, &r), -EINVAL);
    assert_int_equal(drc_get(c, (const void *)(UINTPTR_MAX - 99), 101, LW, &r), -EINVAL);
    assert_int_equal(drc_get(c, (const void *)2, SIZE_MAX, LW, &r), -EINVAL);
    /* NULL (the header promises -EINVAL), and ranges whose page-rounded form is the whole address
     * space: its length does not fit in a size_t (the backend would be asked for len 0) */
    assert_int_equal(drc_get(c, NULL, 1, LW, &r), -EINVAL);
    assert_int_equal(drc_get(c, NULL, SIZE_MAX, LW, &r), -EINVAL);
    assert_int_equal(drc_get(c, (const void *)1, SIZE_MAX, LW, &r), -EINVAL);
    assert_int_equal(drc_get(c, (const void *)1, SIZE_MAX - 1, LW, &r), -EINVAL);
    assert_int_equal(drc_get(c, (const void *)(pg() - 1), SIZE_MAX - pg() + 2, LW, &r), -EINVAL);
    for (i = 0; i < sizeof(bad_access) / sizeof(bad_access[0]); i++)
        assert_int_equal(drc_get(c, at(0, 0), 1, bad_access[i], &r), -EINVAL);
    assert_null(r);
    assert_int_equal(b->reg_calls, 1);
    EXPECT_STATS(c, .misses = 1, .regs = 1, .regions = 1, .bytes = pg(), .in_use = 1);
    /* every accepted bit is accepted */
    r = get_ok(c, at(2, 0), 1, DRC_ACCESS_MASK);
    assert_int_equal(drc_region_access(r), DRC_ACCESS_MASK);
    assert_int_equal(drc_put(c, r), 0);
    assert_int_equal(drc_put(c, a), 0);
    done(b, c);
}

static void bad_put_changes_nothing(void **state)
{
    struct tb *b = tb_new();
    drc_cache_t *c = mk(b, NULL), *c2 = mk(b, NULL);
    drc_region_t *a, *h;

    (void)state;
    a = get_ok(c, at(0, 0), pg(), LW);
    assert_int_equal(drc_put(NULL, a), -EINVAL);
    assert_int_equal(drc_put(c, NULL), -EINVAL);
    assert_int_equal(drc_put(c2, a), -EINVAL);  /* not c2's region */
    EXPECT_STATS(c, .misses = 1, .regs = 1, .regions = 1, .bytes = pg(), .in_use = 1);
    assert_int_equal(drc_put(c, a), 0);
    /* a put of an idle region: refused, the region stays cached and registered */
    assert_int_equal(drc_put(c, a), -EINVAL);
    assert_int_equal(drc_put(c, a), -EINVAL);
    EXPECT_STATS(c, .misses = 1, .regs = 1, .regions = 1, .bytes = pg());
    assert_int_equal(tb_is_live(b, 1), 1);
    h = get_ok(c, at(0, 0), 1, LW);
    assert_ptr_equal(h, a);
    assert_int_equal(drc_put(c, h), 0);
    assert_int_equal(drc_cache_destroy(c2), 0);
    done(b, c);
}

static void bad_invalidate_and_create_arguments(void **state)
{
    struct tb *b = tb_new();
    drc_cache_t *c = mk(b, NULL), *out = NULL;
    struct drc_backend be = b->be;
    struct drc_config cfg = { .flags = 1u << 20 };

    (void)state;
    getput(c, 0, 1);
    assert_int_equal(drc_invalidate(NULL, at(0, 0), 1), -EINVAL);
    assert_int_equal(drc_invalidate(c, (const void *)(UINTPTR_MAX - 10), 100), -EINVAL);
    assert_int_equal(drc_invalidate(c, (const void *)2, SIZE_MAX), -EINVAL);
    assert_int_equal(drc_notify_free((const void *)2, SIZE_MAX), -EINVAL);
    assert_int_equal(drc_notify_free((const void *)(UINTPTR_MAX - 10), 100), -EINVAL);
    EXPECT_STATS(c, .misses = 1, .regs = 1, .regions = 1, .bytes = pg());

    assert_int_equal(drc_cache_create(NULL, NULL, &out), -EINVAL);
    assert_int_equal(drc_cache_create(&be, NULL, NULL), -EINVAL);
    assert_int_equal(drc_cache_create(&be, &cfg, &out), -EINVAL);
    be.reg = NULL;
    assert_int_equal(drc_cache_create(&be, NULL, &out), -EINVAL);
    be = b->be;
    be.dereg = NULL;
    assert_int_equal(drc_cache_create(&be, NULL, &out), -EINVAL);
    assert_null(out);
    assert_int_equal(drc_cache_destroy(NULL), -EINVAL);
    done(b, c);
}

static void null_accessors_are_safe(void **state)
{
    struct drc_stats s = { .comp_mask = DRC_STATS_ALL };
    uintptr_t st = 1;
    size_t len = 1;
    struct tb *b = tb_new();
    drc_cache_t *c = mk(b, NULL);

    (void)state;
    assert_int_equal(drc_region_valid(NULL), 0);
    drc_region_bounds(NULL, &st, &len);
    assert_int_equal(st, 0);
    assert_int_equal(len, 0);
    assert_int_equal(drc_region_lkey(NULL), 0);
    assert_int_equal(drc_region_rkey(NULL), 0);
    assert_null(drc_region_handle(NULL));
    assert_int_equal(drc_region_access(NULL), 0);
    memset(&s, 0xff, sizeof(s));
    drc_cache_stats(NULL, &s);
    assert_int_equal(s.hits + s.misses + s.regions + s.in_use + s.bytes, 0);
    drc_cache_stats(c, NULL);
    done(b, c);
}

static void backend_failure_returns_its_errno_and_caches_nothing(void **state)
{
    static const int errs[] = { -EFAULT, -ENOMEM, -EPERM, -EOPNOTSUPP, -EAGAIN };
    struct tb *b = tb_new();
    drc_cache_t *c = mk(b, NULL);
    drc_region_t *r = NULL, *a;
    size_t i;

    (void)state;
    for (i = 0; i < sizeof(errs) / sizeof(errs[0]); i++) {
        b->reg_fail = errs[i];
        assert_int_equal(drc_get(c, at(0, 0), pg(), LW, &r), errs[i]);
        assert_null(r);
        assert_int_equal(b->reg_calls, i + 1);  /* returned as it is, not retried (-EAGAIN too) */
    }
    assert_int_equal(tb_live(b), 0);
    EXPECT_STATS(c, .misses = 5);
    /* a failure is not cached: the next get asks the backend again */
    a = get_ok(c, at(0, 0), pg(), LW);
    assert_int_equal(rid(a), 1);
    assert_int_equal(drc_put(c, a), 0);

    /* a failed merge leaves the regions it would have replaced as they were */
    b->reg_fail = -EIO;
    assert_int_equal(drc_get(c, at(0, 0), 3 * pg(), LW, &r), -EIO);
    assert_int_equal(tb_is_live(b, 1), 1);
    EXPECT_STATS(c, .misses = 7, .regs = 1, .regions = 1, .bytes = pg());
    a = get_ok(c, at(0, 0), 1, LW);
    assert_int_equal(rid(a), 1);
    assert_int_equal(drc_put(c, a), 0);
    EXPECT_STATS(c, .hits = 1, .misses = 7, .regs = 1, .regions = 1, .bytes = pg());
    done(b, c);
}

static void dereg_failure_is_returned_and_region_released(void **state)
{
    struct tb *b = tb_new();
    drc_cache_t *c = mk(b, NULL);
    drc_region_t *a;

    (void)state;
    a = get_ok(c, at(0, 0), pg(), LW);
    assert_int_equal(drc_invalidate(c, at(0, 0), 1), 1);
    b->dereg_fail = -EIO;
    assert_int_equal(drc_put(c, a), -EIO);
    assert_int_equal(tb_live(b), 0);
    EXPECT_STATS(c, .misses = 1, .invalidated = 1, .regs = 1, .deregs = 1);
    assert_int_equal(drc_put(c, a), -EINVAL);
    done(b, c);
}

static int released;
static void count_release(void *ctx)
{
    struct tb *b = ctx;

    assert_int_equal(tb_live(b), 0);    /* after every region is deregistered */
    released++;
}

static void backend_size_limit(void **state)
{
    struct drc__cache_opts o = { .max_len = 4 * pg(), .release = count_release };
    struct tb *b = tb_new();
    drc_cache_t *c = NULL;
    drc_region_t *r = NULL, *a, *n;

    (void)state;
    assert_int_equal(drc__cache_create(&b->be, NULL, &o, &c), 0);
    assert_int_equal(drc_get(c, at(0, 1), 4 * pg(), LW, &r), -E2BIG);     /* 5 pages */
    assert_int_equal(b->reg_calls, 0);
    a = get_ok(c, at(0, 0), 3 * pg(), LW);
    assert_int_equal(drc_put(c, a), 0);
    /* the union [0, 5) would be too large: [2, 5) is registered alone */
    n = get_ok(c, at(2, 0), 3 * pg(), LW | RR);
    check_args(b, n, at(2, 0), 3 * pg(), LW | RR);
    assert_int_equal(tb_is_live(b, 1), 1);
    EXPECT_STATS(c, .misses = 3, .regs = 2, .regions = 2, .bytes = 6 * pg(), .in_use = 1);
    assert_int_equal(drc_put(c, n), 0);
    released = 0;
    assert_int_equal(drc_cache_destroy(c), 0);
    assert_int_equal(released, 1);
    assert_int_equal(tb_all_released_once(b), 0);
    tb_free(b);
}

/* ---- 8. destroy --------------------------------------------------------- */

static void destroy_is_busy_while_referenced(void **state)
{
    struct tb *b = tb_new();
    drc_cache_t *c = mk(b, NULL);
    drc_region_t *a, *h;

    (void)state;
    a = get_ok(c, at(0, 0), pg(), LW);
    getput(c, 4, 1);
    assert_int_equal(drc_cache_destroy(c), -EBUSY);
    assert_int_equal(tb_dereg_calls(b), 0);     /* nothing freed */
    /* the cache still works */
    h = get_ok(c, at(0, 0), 1, LW);
    assert_ptr_equal(h, a);
    assert_int_equal(drc_put(c, h), 0);
    assert_int_equal(drc_put(c, a), 0);
    EXPECT_STATS(c, .hits = 1, .misses = 2, .regs = 2, .regions = 2, .bytes = 2 * pg());
    done(b, c);
}

static void destroy_is_busy_while_detached_region_is_held(void **state)
{
    struct tb *b = tb_new();
    drc_cache_t *c = mk(b, NULL);
    drc_region_t *a, *inv;

    (void)state;
    a = get_ok(c, at(0, 0), pg(), LW);
    getput(c, 0, 2);        /* supersedes a, which is still held */
    assert_int_equal(drc_cache_destroy(c), -EBUSY);
    assert_int_equal(drc_put(c, a), 0);
    inv = get_ok(c, at(8, 0), pg(), LW);
    assert_int_equal(drc_invalidate(c, at(8, 0), 1), 1);   /* invalid, still held */
    assert_int_equal(drc_cache_destroy(c), -EBUSY);
    assert_int_equal(drc_put(c, inv), 0);
    done(b, c);
}

static void destroy_deregisters_every_idle_region(void **state)
{
    struct tb *b = tb_new();
    drc_cache_t *c = mk(b, NULL);
    size_t i;

    (void)state;
    for (i = 0; i < 100; i++)
        getput(c, 2 * i, 1);
    EXPECT_STATS(c, .misses = 100, .regs = 100, .regions = 100, .bytes = 100 * pg());
    assert_int_equal(tb_live(b), 100);
    done(b, c);     /* destroy: all 100 deregistered exactly once */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(hit_returns_containing_region_and_counts_references),
        cmocka_unit_test(many_references_balance),
        cmocka_unit_test(registration_is_page_aligned),
        cmocka_unit_test(range_ending_at_top_of_address_space),
        cmocka_unit_test(merge_never_covers_whole_address_space),
        cmocka_unit_test(merge_covers_union_and_deregisters_idle),
        cmocka_unit_test(merge_with_busy_region_defers_its_dereg),
        cmocka_unit_test(local_access_upgrade_merges),
        cmocka_unit_test(remote_access_is_never_widened),
        cmocka_unit_test(access_is_exact_by_default),
        cmocka_unit_test(first_overlap_keeps_every_region_found),
        cmocka_unit_test(packed_neighbours_do_not_reregister_a_growing_union),
        cmocka_unit_test(adjacent_pages_do_not_merge),
        cmocka_unit_test(no_merge_registers_own_range),
        cmocka_unit_test(invalidate_by_handle),
        cmocka_unit_test(invalidate_superseded_by_handle),
        cmocka_unit_test(invalidate_idle_deregisters_before_return),
        cmocka_unit_test(invalidate_busy_defers_dereg_to_last_put),
        cmocka_unit_test(region_held_only_by_hits_is_held),
        cmocka_unit_test(invalidate_marks_superseded_held_region),
        cmocka_unit_test(registration_raced_by_invalidation_is_dropped),
        cmocka_unit_test(registration_always_raced_fails_with_nothing_cached),
        cmocka_unit_test(invalidation_of_other_range_in_reg_keeps_registration),
        cmocka_unit_test(invalidation_racing_a_merge),
        cmocka_unit_test(invalidate_by_handle_in_a_large_index),
        cmocka_unit_test(invalidate_range_from_the_hint_slot),
        cmocka_unit_test(max_regions_evicts_least_recently_idle),
        cmocka_unit_test(busy_regions_are_never_evicted),
        cmocka_unit_test(max_bytes_evicts_least_recently_idle),
        cmocka_unit_test_setup(backend_reg_may_call_into_cache, setup_alarm),
        cmocka_unit_test_setup(backend_dereg_may_call_into_cache, setup_alarm),
        cmocka_unit_test(bad_get_arguments_change_nothing),
        cmocka_unit_test(bad_put_changes_nothing),
        cmocka_unit_test(bad_invalidate_and_create_arguments),
        cmocka_unit_test(null_accessors_are_safe),
        cmocka_unit_test(backend_failure_returns_its_errno_and_caches_nothing),
        cmocka_unit_test(dereg_failure_is_returned_and_region_released),
        cmocka_unit_test(backend_size_limit),
        cmocka_unit_test(free_events_in_address_order_take_their_own_region),
        cmocka_unit_test(destroy_is_busy_while_referenced),
        cmocka_unit_test(destroy_is_busy_while_detached_region_is_held),
        cmocka_unit_test(destroy_deregisters_every_idle_region),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
