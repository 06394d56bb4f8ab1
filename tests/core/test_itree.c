/*
 * Tests of src/core/itree.c: the interval index against a naive list.
 *
 * After every insert and remove drc__itree_check() must accept the tree and
 * count its nodes, and every overlap query (first, then next until NULL) must
 * return exactly the overlapping intervals of the list, in start order.
 *
 * The source is included, with a fan of 8 instead of 16, so that a few
 * hundred intervals make trees of four and five levels (splits, merges and
 * borrows of inner nodes, the root growing and shrinking) and the test
 * reaches the nodes themselves; the Makefile then links the rest of the
 * core without itree.o. fuzz/fuzz_itree.c runs the fan of 18.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#define DRC__ITREE_FAN 8
static void (*near_window)(void);   /* run once where a walk from a leaf has been answered that leaf */
#define ITREE_NEAR_WINDOW() (near_window ? near_window() : (void)0)
#include "core/itree.c"

enum { MAXN = 512 };

struct model {
    struct drc__itree t;
    struct drc__itree_node n[MAXN];
    int in[MAXN];
    long count;
    uint64_t rng;
    long along;         /* inserts and removes that went along a walk's path (no descent) */
    long near;          /* of them, walks that began at a leaf they were given (drc__itree_first_near) */
    struct drc__itree_bt *put[MAXN];    /* what each interval's insert answered */
    struct drc__itree_bt *left[MAXN];   /* the leaf each interval's removal left, or NULL */
};

static uint64_t rnd(struct model *m)
{
    /* xorshift64: reproducible across runs */
    m->rng ^= m->rng << 13;
    m->rng ^= m->rng >> 7;
    m->rng ^= m->rng << 17;
    return m->rng;
}

static uint64_t rnd(struct model *m);

/*
 * A leaf for a walk from @key to begin at (drc__itree_first_near), as a
 * cache's hint slot gives one: the one interval i's removal left, what the
 * insert of the live interval starting last at or before @key answered, or
 * another interval's insert (each since split, merged, given back or
 * handed out again at another level), the root (an inner node, once the
 * tree grows), or none.
 */
static const struct drc__itree_bt *near_of(struct model *m, int i, uintptr_t key)
{
    int j, f = -1;

    switch (rnd(m) % 5) {
    case 0:
        return NULL;
    case 1:
        return m->t.root;
    case 2:
        j = (int)(rnd(m) % MAXN);
        return m->put[j] ? bt_hint_leaf(m->put[j]) : NULL;
    case 3:
        for (j = 0; j < MAXN; j++)
            if (m->in[j] && m->n[j].start <= key && (f < 0 || m->n[j].start > m->n[f].start))
                f = j;
        return f >= 0 ? bt_hint_leaf(m->put[f]) : NULL;
    default:
        return i >= 0 ? m->left[i] : NULL;
    }
}

/*
 * Half of the inserts and removes go along the path of a walk from the
 * interval's start, as the cache's misses and free events do (insert_at,
 * remove_at), a walk that may begin at a leaf it is given; the tree must
 * end the same either way.
 */
static void ins(struct model *m, int i, uintptr_t start, uintptr_t last)
{
    struct drc__itree_path path;
    int budget = DRC__ITREE_UNBOUNDED;

    m->n[i].start = start;
    m->n[i].last = last;
    if (rnd(m) & 1) {
        drc__itree_first_near(&m->t, start, last, &budget, &path, near_of(m, i, start));
        m->put[i] = drc__itree_insert_at(&m->t, &m->n[i], &path);
        m->along += path.depth && path.seek;
        m->near += path.depth && path.leafonly;
    } else {
        m->put[i] = drc__itree_insert(&m->t, &m->n[i]);
    }
    m->in[i] = 1;
    m->count++;
    assert_int_equal(drc__itree_check(&m->t), m->count);
}

static void rem(struct model *m, int i)
{
    struct drc__itree_path path;
    int budget = DRC__ITREE_UNBOUNDED;

    if (rnd(m) & 1) {
        m->along += drc__itree_first_near(&m->t, m->n[i].start, m->n[i].start, &budget, &path,
                                          near_of(m, i, m->n[i].start)) == &m->n[i] &&
                    drc__itree_at(&m->t, &path) == &m->n[i];
        m->near += path.depth && path.leafonly;
        m->left[i] = drc__itree_remove_at(&m->t, &m->n[i], &path);
    } else {
        m->left[i] = drc__itree_remove_at(&m->t, &m->n[i], NULL);
    }
    /* a leaf of the tree, holding no entry of i's */
    assert_true(!m->left[i] || (!m->left[i]->level && m->left[i]->n));
    m->in[i] = 0;
    m->count--;
    assert_int_equal(drc__itree_check(&m->t), m->count);
}

/* The tree's answer to [s, l] must be the list's, each node once, starts non-decreasing. */
static void query(struct model *m, uintptr_t s, uintptr_t l)
{
    static int seen[MAXN];
    struct drc__itree_node *n;
    int budget = DRC__ITREE_UNBOUNDED, i, want = 0, got = 0;
    uintptr_t prev = 0;

    memset(seen, 0, sizeof(seen));
    n = drc__itree_first(&m->t, s, l, &budget);
    /* a walk that begins at a leaf it was given, whichever, answers the same */
    assert_ptr_equal(drc__itree_first_near(&m->t, s, l, &budget, NULL, near_of(m, -1, s)), n);
    for (; n; n = drc__itree_next(&m->t, n, s, l, &budget)) {
        i = (int)(n - m->n);
        assert_true(i >= 0 && i < MAXN);
        assert_true(m->in[i]);
        assert_false(seen[i]);
        assert_true(n->start <= l && s <= n->last);
        assert_true(n->start >= prev);
        prev = n->start;
        seen[i] = 1;
        got++;
    }
    for (i = 0; i < MAXN; i++)
        if (m->in[i] && m->n[i].start <= l && s <= m->n[i].last) {
            want++;
            assert_true(seen[i]);
        }
    assert_int_equal(got, want);
}

static struct model *model_new(uint64_t seed)
{
    struct model *m = calloc(1, sizeof(*m));

    assert_non_null(m);
    m->rng = seed;
    return m;
}

static void empty_tree(void **state)
{
    struct drc__itree t;
    int budget = DRC__ITREE_UNBOUNDED;

    drc__itree_init(&t, 0);

    (void)state;
    assert_int_equal(drc__itree_check(&t), 0);
    assert_null(drc__itree_first(&t, 0, UINTPTR_MAX, &budget));
}

static void overlap_is_closed_at_both_ends(void **state)
{
    struct model *m = model_new(1);

    (void)state;
    ins(m, 0, 10, 20);
    query(m, 20, 30);   /* touches last */
    query(m, 0, 10);    /* touches start */
    query(m, 21, 30);
    query(m, 0, 9);
    {
        int budget = DRC__ITREE_UNBOUNDED;
        assert_ptr_equal(drc__itree_first(&m->t, 20, 20, &budget), &m->n[0]);
        assert_ptr_equal(drc__itree_first(&m->t, 10, 10, &budget), &m->n[0]);
        assert_null(drc__itree_first(&m->t, 21, 21, &budget));
        assert_null(drc__itree_first(&m->t, 9, 9, &budget));
    }
    drc__itree_fini(&m->t);
    free(m);
}

static void extremes_and_equal_starts(void **state)
{
    struct model *m = model_new(2);
    int i;

    (void)state;
    ins(m, 0, 0, UINTPTR_MAX);
    ins(m, 1, UINTPTR_MAX, UINTPTR_MAX);
    ins(m, 2, 0, 0);
    for (i = 3; i < 40; i++)
        ins(m, i, 100, 100 + (uintptr_t)i);     /* equal starts */
    query(m, 0, UINTPTR_MAX);
    query(m, UINTPTR_MAX, UINTPTR_MAX);
    query(m, 0, 0);
    query(m, 120, 125);
    query(m, 139, 200);
    for (i = 3; i < 40; i += 2)
        rem(m, i);
    query(m, 100, 110);
    rem(m, 0);
    query(m, 1, UINTPTR_MAX - 1);
    drc__itree_fini(&m->t);
    free(m);
}

static void sorted_inserts_and_removes(void **state)
{
    struct model *m = model_new(3);
    int i;

    (void)state;
    for (i = 0; i < 200; i++)       /* ascending: full nodes split at their end */
        ins(m, i, (uintptr_t)i * 10, (uintptr_t)i * 10 + 15);
    for (i = 0; i < 200; i++)       /* descending: at their start */
        ins(m, 200 + i, (uintptr_t)(199 - i) * 10 + 3, (uintptr_t)(199 - i) * 10 + 4);
    query(m, 0, UINTPTR_MAX);
    query(m, 995, 1005);
    for (i = 0; i < 400; i += 3)
        rem(m, i);
    query(m, 0, UINTPTR_MAX);
    query(m, 1500, 1500);
    for (i = 0; i < 400; i++)
        if (m->in[i])
            rem(m, i);
    assert_null(m->t.root);
    drc__itree_fini(&m->t);
    free(m);
}

static void random_against_naive_list(void **state)
{
    uint64_t seed;

    (void)state;
    for (seed = 1; seed <= 20; seed++) {
        struct model *m = model_new(seed * 0x9e3779b97f4a7c15ull);
        uintptr_t space = seed % 2 ? 64 : 100000;   /* small spaces: many overlaps and equal starts */
        int step;

        for (step = 0; step < 4000; step++) {
            int i = (int)(rnd(m) % MAXN);
            uintptr_t s = rnd(m) % space, l = s + rnd(m) % (space / 8 + 1);

            if (m->in[i])
                rem(m, i);
            else
                ins(m, i, s, l);
            if (step % 4 == 0)
                query(m, s, s + rnd(m) % (space / 4 + 1));
        }
        query(m, 0, UINTPTR_MAX);
        drc__itree_fini(&m->t);
        free(m);
    }
}

/* floor(k) must be the list's largest start <= k (the last of equal starts: any of them, by start). */
static void floor_is(struct model *m, uintptr_t k)
{
    struct drc__itree_node *x;
    int budget = DRC__ITREE_UNBOUNDED, i, want = -1;

    x = drc__itree_floor(&m->t, k, &budget);
    for (i = 0; i < MAXN; i++)
        if (m->in[i] && m->n[i].start <= k && (want < 0 || m->n[i].start > m->n[want].start))
            want = i;
    if (want < 0) {
        assert_null(x);
    } else {
        assert_non_null(x);
        assert_true(m->in[x - m->n]);
        assert_true(x->start == m->n[want].start);
    }
    assert_true(budget > 0);
}

static void floor_answers_like_the_list(void **state)
{
    struct model *m = model_new(11);
    int step, i;

    (void)state;
    floor_is(m, 0);
    for (step = 0; step < 4000; step++) {
        i = (int)(rnd(m) % MAXN);
        if (m->in[i]) {
            rem(m, i);
        } else {
            uintptr_t st = rnd(m) % 3000;

            ins(m, i, st, st + rnd(m) % 10);
        }
        if (step % 3 == 0)
            floor_is(m, rnd(m) % 3100);
    }
    floor_is(m, UINTPTR_MAX);
    drc__itree_fini(&m->t);
    free(m);
}

/* Nodes in the tree (leaves and inner), by a walk of the levels. */
static long nodes_in(const struct drc__itree *t)
{
    const bt *level[MAXN], *next[MAXN];
    long n = 0, k, w, j;

    if (!t->root)
        return 0;
    level[0] = t->root;
    for (w = 1; w;) {
        long nw = 0;

        for (k = 0; k < w; k++) {
            n++;
            if (level[k]->level)
                for (j = 0; j < (long)level[k]->n; j++)
                    next[nw++] = level[k]->ptr[j];
        }
        memcpy(level, next, (size_t)nw * sizeof(next[0]));
        w = nw;
    }
    return n;
}

/*
 * Intervals inserted in address order (how a cache is mostly filled) pack
 * the leaves: the last leaf, full, gives an entry at its end alone to its
 * new sibling, so every leaf but the last is full. Another full leaf that
 * takes an entry at its end gives that entry and LOW - 1 more: every leaf
 * but the last keeps LOW. Control: the same intervals at random make more
 * nodes (halves).
 */
static void address_order_packs_the_nodes(void **state)
{
    struct model *m = model_new(12), *r = model_new(13);
    long packed, halves, leaves = 0;
    const bt *b, *first;
    int i, perm[MAXN];

    (void)state;
    for (i = 0; i < MAXN - 1; i++)
        ins(m, i, (uintptr_t)i * 8, (uintptr_t)i * 8 + 3);
    for (first = m->t.root; first->level; first = first->ptr[0])
        ;
    for (b = first; b; b = b->next, leaves++)
        assert_true(b->n == F || (!b->next && b->n >= 1));
    assert_int_equal(leaves, (MAXN - 1 + F - 1) / F);
    packed = nodes_in(&m->t);
    /* the first leaf's end, [F * 8 - 4, F * 8 - 3]: it keeps F - LOW + 1, its new sibling LOW */
    ins(m, MAXN - 1, (uintptr_t)F * 8 - 4, (uintptr_t)F * 8 - 3);
    assert_int_equal(first->n, F - LOW + 1);
    assert_int_equal(first->next->n, LOW);
    assert_int_equal(drc__itree_check(&m->t), m->count);
    for (i = 0; i < MAXN; i++)
        perm[i] = i;
    for (i = MAXN - 1; i > 0; i--) {
        int j = (int)(rnd(r) % (uint64_t)(i + 1)), x = perm[i];

        perm[i] = perm[j];
        perm[j] = x;
    }
    for (i = 0; i < MAXN - 1; i++)
        ins(r, perm[i], (uintptr_t)perm[i] * 8, (uintptr_t)perm[i] * 8 + 3);
    halves = nodes_in(&r->t);
    assert_true(halves > packed);
    query(m, 0, UINTPTR_MAX);
    drc__itree_fini(&m->t);
    drc__itree_fini(&r->t);
    free(m);
    free(r);
}

/*
 * A tree of given nodes takes no memory of its own: need() says how many
 * nodes an insert may take, and removes put nodes back on the spare list,
 * so that an owner that gives what need() asks never fails an insert.
 */
static void given_nodes_are_enough(void **state)
{
    static char mem[MAXN * 2][DRC__ITREE_NODE] __attribute__((aligned(64)));
    struct model *m = model_new(14);
    size_t used = 0;
    int step, i;

    (void)state;
    drc__itree_init(&m->t, 1);
    for (step = 0; step < 3000; step++) {
        unsigned need = drc__itree_need(&m->t);

        i = (int)(rnd(m) % MAXN);
        if (m->in[i]) {
            rem(m, i);
            continue;
        }
        assert_true(need <= m->t.height + 1);
        if (need) {
            assert_true(used + need <= MAXN * 2);
            drc__itree_give(&m->t, mem[used], need * (size_t)DRC__ITREE_NODE);
            used += need;
        }
        ins(m, i, rnd(m) % 5000, rnd(m) % 5000 + 5000);
    }
    assert_null(m->t.all);              /* nothing came from malloc */
    assert_true(used < MAXN * 2);
    query(m, 0, UINTPTR_MAX);
    drc__itree_fini(&m->t);
    free(m);
}

/* A disjoint interval in grid cell k (16 keys a cell). */
static void ins_cell(struct model *m, int i, uintptr_t k)
{
    uintptr_t start = k * 16 + rnd(m) % 4;

    ins(m, i, start, start + rnd(m) % 12);
}

static int cell_taken(const struct model *m, uintptr_t k)
{
    int i;

    for (i = 0; i < MAXN; i++)
        if (m->in[i] && m->n[i].start / 16 == k)
            return 1;
    return 0;
}

/*
 * Under the owner's promise of disjoint intervals (the overlap query starts
 * at the floor of its start): the same answers as the list, then, the
 * promise taken back, overlapping intervals and still the list's answers.
 * Control: a query that starts at the floor while intervals overlap misses
 * one, which the list sees.
 */
static void disjoint_promise_answers_like_the_list(void **state)
{
    uint64_t seed;

    (void)state;
    for (seed = 1; seed <= 10; seed++) {
        struct model *m = model_new(seed * 0x2545f4914f6cdd1dull);
        uintptr_t k;
        int step, i;

        drc__itree_set_disjoint(&m->t, 1);
        for (i = 0; i < MAXN / 2; i++)      /* address order */
            ins_cell(m, i, (uintptr_t)i * 3);
        query(m, 0, UINTPTR_MAX);
        query(m, 700, 900);
        for (step = 0; step < 3000; step++) {
            i = (int)(rnd(m) % MAXN);
            if (m->in[i]) {
                rem(m, i);
            } else {
                do
                    k = rnd(m) % (4 * MAXN);
                while (cell_taken(m, k));
                ins_cell(m, i, k);
            }
            if (step % 8 == 0) {
                uintptr_t s = rnd(m) % (64 * MAXN + 64);

                query(m, s, s + rnd(m) % 200);
                query(m, s, s);
                floor_is(m, s);
            }
        }
        assert_true(m->along > 100);        /* the paths were taken, not only the fallbacks */
        assert_true(m->near > 100);         /* some of them from a leaf given */
        drc__itree_set_disjoint(&m->t, 0);
        for (step = 0; step < 1000; step++) {
            uintptr_t s = rnd(m) % (64 * MAXN), l = s + rnd(m) % 300;

            i = (int)(rnd(m) % MAXN);
            if (m->in[i])
                rem(m, i);
            else
                ins(m, i, s, l);            /* overlaps allowed now */
            if (step % 4 == 0)
                query(m, s, l);
        }
        query(m, 0, UINTPTR_MAX);
        drc__itree_fini(&m->t);
        free(m);
    }
    {
        struct model *m = model_new(99);
        int budget = DRC__ITREE_UNBOUNDED, i;

        for (i = 0; i < 40; i++)
            ins(m, i, 1000 + (uintptr_t)i * 10, 1000 + (uintptr_t)i * 10 + 5);
        ins(m, 40, 0, 5000);                /* overlaps them all, starts first */
        assert_ptr_equal(drc__itree_first(&m->t, 1395, 1395, &budget), &m->n[40]);
        drc__itree_set_disjoint(&m->t, 1);  /* a broken promise: the walk starts at 1390's entry */
        assert_ptr_not_equal(drc__itree_first(&m->t, 1395, 1395, &budget), &m->n[40]);
        drc__itree_fini(&m->t);
        free(m);
    }
}

/*
 * A path holds only while the tree has not changed: after any insert or
 * remove, drc__itree_at() refuses it, and remove_at / insert_at fall back
 * to a descent (the tree stays well formed, the right node goes). Control:
 * the same path with no change in between is taken.
 */
static void a_path_goes_stale_when_the_tree_changes(void **state)
{
    struct model *m = model_new(21);
    struct drc__itree_path path;
    int budget = DRC__ITREE_UNBOUNDED, i;

    (void)state;
    drc__itree_set_disjoint(&m->t, 1);
    for (i = 0; i < 300; i++)
        ins(m, i, (uintptr_t)i * 16, (uintptr_t)i * 16 + 7);
    assert_ptr_equal(drc__itree_first_at(&m->t, 100 * 16 + 3, 100 * 16 + 3, &budget, &path), &m->n[100]);
    assert_ptr_equal(drc__itree_at(&m->t, &path), &m->n[100]);     /* control: unchanged, taken */
    rem(m, 7);                                                      /* any change */
    assert_null(drc__itree_at(&m->t, &path));
    drc__itree_remove_at(&m->t, &m->n[100], &path);                 /* falls back to a descent */
    m->in[100] = 0;
    m->count--;
    assert_int_equal(drc__itree_check(&m->t), m->count);
    query(m, 0, UINTPTR_MAX);

    assert_null(drc__itree_first_at(&m->t, 100 * 16 + 3, 100 * 16 + 3, &budget, &path));
    assert_true(path.depth && path.seek);                           /* the insert's path, nothing found */
    ins(m, 250 + 50, 5000, 5001);                                   /* a change */
    m->n[100].start = 100 * 16;
    m->n[100].last = 100 * 16 + 7;
    drc__itree_insert_at(&m->t, &m->n[100], &path);                 /* stale: falls back */
    m->in[100] = 1;
    m->count++;
    assert_int_equal(drc__itree_check(&m->t), m->count);
    query(m, 0, UINTPTR_MAX);
    drc__itree_fini(&m->t);
    free(m);
}

/*
 * A run of entries taken out one after the other: after each removal the
 * path leads to the successor (drc__itree_at) unless a node changed shape,
 * so a range of n entries costs one descent and a few, not n. Control: a
 * path is refused after any other change (the test above).
 */
static void a_run_goes_out_along_the_path(void **state)
{
    struct model *m = model_new(22);
    struct drc__itree_path path;
    struct drc__itree_node *x;
    int budget = DRC__ITREE_UNBOUNDED, i, along = 0, descents = 0;

    (void)state;
    drc__itree_set_disjoint(&m->t, 1);
    for (i = 0; i < 400; i++)
        ins(m, i, (uintptr_t)i * 16, (uintptr_t)i * 16 + 7);
    x = drc__itree_first_at(&m->t, 100 * 16, 300 * 16 + 7, &budget, &path);
    while (x) {
        i = (int)(x - m->n);
        assert_true(i >= 100 && i <= 300 && m->in[i]);
        drc__itree_remove_at(&m->t, x, &path);
        m->in[i] = 0;
        m->count--;
        assert_int_equal(drc__itree_check(&m->t), m->count);
        x = drc__itree_at(&m->t, &path);
        if (x && x->start > 300 * 16 + 7)
            break;
        if (x) {
            along++;
        } else {
            descents++;
            x = drc__itree_first_at(&m->t, 100 * 16, 300 * 16 + 7, &budget, &path);
        }
    }
    for (i = 0; i < 400; i++)
        assert_int_equal(m->in[i], i < 100 || i > 300);
    assert_true(along > 2 * descents);      /* most of the run went along the path (full leaves: 3 to 1) */
    query(m, 0, UINTPTR_MAX);
    drc__itree_fini(&m->t);
    free(m);
}

/* Is x among the entries of the leaf of hint h (what an insert answered), and where (-1: not there)? */
static int leaf_pos(const struct drc__itree_bt *h, const struct drc__itree_node *x)
{
    const bt *b = bt_hint_leaf(h);
    unsigned i;

    if (!b || b->level)
        return -1;
    for (i = 0; i < b->n; i++)
        if (b->ptr[i] == x)
            return (int)i;
    return -1;
}

/*
 * Insert node i as [start, last] along @path (drc__itree_insert_at; NULL: by
 * a descent), into the model too: what the insert answered.
 */
static struct drc__itree_bt *put_at(struct model *m, int i, uintptr_t start, uintptr_t last,
                                    const struct drc__itree_path *path)
{
    m->n[i].start = start;
    m->n[i].last = last;
    m->in[i] = 1;
    m->count++;
    return m->put[i] = drc__itree_insert_at(&m->t, &m->n[i], path);
}

static struct drc__itree_bt *put_in(struct model *m, int i, uintptr_t start, uintptr_t last)
{
    return put_at(m, i, start, last, NULL);
}

/* Take node i out given what its insert answered (drc__itree_remove_in), out of the model too. */
static void take_in(struct model *m, int i, struct drc__itree_bt *hint)
{
    m->left[i] = drc__itree_remove_in(&m->t, &m->n[i], hint);
    m->in[i] = 0;
    m->count--;
}

/*
 * An insert answers the leaf it put its interval in and the entry's place
 * there, by a descent or along a path, when the leaf split or not, in
 * address order (splits at the very end) and in random order (splits in
 * the middle). Removals by a handle's leaf (drc__itree_remove_in) count on
 * it.
 */
static void an_insert_answers_its_leaf(void **state)
{
    struct model *m = model_new(31);
    struct drc__itree_path path;
    struct drc__itree_bt *leaf;
    int budget, i, j, k;

    (void)state;
    drc__itree_set_disjoint(&m->t, 1);
    for (k = 0; k < 2; k++) {
        for (j = 0; j < 256; j++) {
            i = k ? (int)(256 + (j * 97) % 256) : j;     /* address order, then a permutation */
            m->n[i].start = (uintptr_t)i * 16;
            m->n[i].last = (uintptr_t)i * 16 + 7;
            budget = DRC__ITREE_UNBOUNDED;
            if (j & 1) {
                drc__itree_first_at(&m->t, m->n[i].start, m->n[i].last, &budget, &path);
                leaf = drc__itree_insert_at(&m->t, &m->n[i], &path);
            } else {
                leaf = drc__itree_insert(&m->t, &m->n[i]);
            }
            m->in[i] = 1;
            m->count++;
            assert_int_equal(drc__itree_check(&m->t), m->count);
            assert_int_equal(leaf_pos(leaf, &m->n[i]), (int)bt_hint_pos(leaf));
        }
    }
    assert_true(m->t.height >= 3);
    drc__itree_fini(&m->t);
    free(m);
}

/*
 * drc__itree_remove_in takes out an interval given the leaf and place its
 * insert answered, which the steps since may have left as they were,
 * moved (an insert before it in the leaf), split (the interval moved to
 * the new sibling), merged away into the spare nodes, or handed out again
 * at another level; or given no leaf, another interval's, or its own leaf
 * with another place. Every removal must leave the tree whole and
 * answering like the list. The scenario must give many removals a leaf
 * that still holds its interval inside it (the case that skips the
 * descent), many of them at the place answered, and many a leaf that does
 * not. Control: a removal that trusted its leaf without finding the
 * interval in it cut another interval (the mutant of the change that
 * brought this in, run once), and one that trusted the place without
 * checking the entry there killed another interval (run once too).
 */
static void a_removal_checks_the_leaf_it_is_given(void **state)
{
    struct model *m = model_new(37);
    struct drc__itree_bt *leaf[MAXN] = { 0 };
    const bt *b;
    int i, j, pos, inside = 0, placed = 0, beside = 0, elsewhere = 0, steps;

    (void)state;
    drc__itree_set_disjoint(&m->t, 1);
    for (i = 0; i < 400; i += 2) {      /* every other slot: room for inserts between them later */
        m->n[i].start = (uintptr_t)i * 16;
        m->n[i].last = (uintptr_t)i * 16 + 7;
        leaf[i] = drc__itree_insert(&m->t, &m->n[i]);
        m->in[i] = 1;
        m->count++;
    }
    for (steps = 0; steps < 3000; steps++) {
        i = (int)(rnd(m) % 400);
        if (!m->in[i]) {
            m->n[i].start = (uintptr_t)i * 16;
            m->n[i].last = (uintptr_t)i * 16 + 7;
            leaf[i] = drc__itree_insert(&m->t, &m->n[i]);
            m->in[i] = 1;
            m->count++;
        } else {
            j = (int)(rnd(m) % 8);
            if (j == 0)
                leaf[i] = NULL;                         /* no hint */
            else if (j == 1)
                leaf[i] = leaf[(i + 2) % 400];          /* another interval's (maybe stale too) */
            else if (j == 2)
                leaf[i] = m->t.root;                    /* an inner node, once the tree has levels */
            else if (j == 3)
                leaf[i] = leaf[(i + 360) % 400];        /* one well to the left: past it and its next */
            else if (j == 4)                            /* its leaf, another place */
                leaf[i] = bt_hint(bt_hint_leaf(leaf[i]), (bt_hint_pos(leaf[i]) + 1) % F);
            pos = leaf_pos(leaf[i], &m->n[i]);
            b = bt_hint_leaf(leaf[i]);
            if (pos > 0 && (unsigned)pos + 1 < b->n && b->n - b->dead > LOW) {
                inside++;
                placed += pos == (int)bt_hint_pos(leaf[i]);
            } else if (b && !b->level && b->n && b->next &&
                       b->key[b->n - 1] < m->n[i].start && leaf_pos(b->next, &m->n[i]) >= 0) {
                beside++;                               /* split since: moved to the next leaf */
            } else {
                elsewhere++;
            }
            drc__itree_remove_in(&m->t, &m->n[i], leaf[i]);
            m->in[i] = 0;
            m->count--;
        }
        assert_int_equal(drc__itree_check(&m->t), m->count);
        if (!(steps % 64))
            query(m, 0, UINTPTR_MAX);
    }
    query(m, 0, UINTPTR_MAX);
    print_message("%d removals inside their leaf (%d at the place answered), %d beside it, %d elsewhere\n",
                  inside, placed, beside, elsewhere);
    assert_true(inside > 300 && placed > 100 && inside - placed > 100 && beside > 50 && elsewhere > 300);

    /* a tree without the disjoint promise: every removal by its leaf falls back, and is right */
    drc__itree_set_disjoint(&m->t, 0);
    for (i = 0; i < 400; i++)
        if (m->in[i] && leaf_pos(leaf[i], &m->n[i]) > 0) {
            drc__itree_remove_in(&m->t, &m->n[i], leaf[i]);
            m->in[i] = 0;
            m->count--;
            assert_int_equal(drc__itree_check(&m->t), m->count);
        }
    query(m, 0, UINTPTR_MAX);
    drc__itree_fini(&m->t);
    free(m);
}

/*
 * A removal inside a leaf of disjoint intervals kills the entry in place:
 * its pointer only; the entries after it stay where they were, and its
 * key and last stay too. Walks skip it: an overlap query over its range
 * answers none, floor the live entry before it, next the one after it. A
 * leaf's first entry dies too (its start stays the leaf's key); the tree's
 * largest is cut. An interval registered again at its start takes its own
 * dead entry back, nothing moved. An insert whose interval covers a dead
 * start compacts the leaf first: one inserted over dead entries' ranges
 * (no live overlap: the promise holds) is found by a query past a dead
 * start. A promise given again drops every dead entry. Controls: the dead
 * entry's key and last are still in the leaf, so only the skip makes those
 * answers right; without the compaction (the mutant, run once) the query
 * inside the new interval past the dead starts answered none: the walk
 * took the dead floor, then the next live start, past the query.
 */
static void a_removal_inside_a_leaf_kills_its_entry(void **state)
{
    struct model *m = model_new(41);
    struct drc__itree_bt *h[8];
    struct drc__itree_path path;
    struct drc__itree_node *x;
    bt *b;
    int i, budget;

    (void)state;
    drc__itree_set_disjoint(&m->t, 1);
    for (i = 0; i < 6; i++)         /* one leaf of the fan of 8: [100 i, 100 i + 9] */
        h[i] = put_in(m, i, (uintptr_t)i * 100, (uintptr_t)i * 100 + 9);
    b = bt_hint_leaf(h[2]);
    assert_true(b == m->t.root && !b->level && b->n == 6);

    take_in(m, 2, h[2]);
    assert_int_equal(drc__itree_check(&m->t), m->count);
    assert_int_equal(b->n, 6);
    assert_int_equal(b->dead, 1);
    assert_null(b->ptr[2]);
    assert_int_equal(b->key[2], 200);                   /* control: still there */
    assert_int_equal(b->last[2], 209);
    assert_ptr_equal(b->ptr[3], &m->n[3]);              /* nothing moved */
    query(m, 200, 209);
    query(m, 205, 350);
    query(m, 0, UINTPTR_MAX);
    budget = DRC__ITREE_UNBOUNDED;
    assert_ptr_equal(drc__itree_floor(&m->t, 205, &budget), &m->n[1]);
    assert_ptr_equal(drc__itree_first(&m->t, 205, 305, &budget), &m->n[3]);
    assert_ptr_equal(drc__itree_next(&m->t, &m->n[1], 0, UINTPTR_MAX, &budget), &m->n[3]);
    assert_true(budget > 0);

    /* along a walk's path too (a free event): the path is left at the successor */
    budget = DRC__ITREE_UNBOUNDED;
    x = drc__itree_first_at(&m->t, 300, 300, &budget, &path);
    assert_ptr_equal(x, &m->n[3]);
    drc__itree_remove_at(&m->t, &m->n[3], &path);
    m->in[3] = 0;
    m->count--;
    assert_int_equal(drc__itree_check(&m->t), m->count);
    assert_int_equal(b->dead, 2);
    assert_ptr_equal(drc__itree_at(&m->t, &path), &m->n[4]);
    query(m, 0, UINTPTR_MAX);

    /* registered again where it died: into its own dead entry, nothing moved */
    h[2] = put_in(m, 2, 200, 209);
    assert_int_equal(drc__itree_check(&m->t), m->count);
    assert_ptr_equal(bt_hint_leaf(h[2]), b);
    assert_int_equal(bt_hint_pos(h[2]), 2);
    assert_int_equal(b->dead, 1);
    assert_int_equal(b->n, 6);
    assert_ptr_equal(b->ptr[4], &m->n[4]);
    query(m, 0, UINTPTR_MAX);
    take_in(m, 2, h[2]);
    assert_int_equal(b->dead, 2);

    /* the tree's largest entry is cut, not killed: its last entry stays live */
    take_in(m, 5, h[5]);
    assert_int_equal(drc__itree_check(&m->t), m->count);
    assert_int_equal(b->dead, 0);                       /* the cut compacted the leaf */
    assert_ptr_equal(m->t.max, &m->n[4]);
    assert_ptr_equal(b->ptr[b->n - 1], &m->n[4]);
    h[5] = put_in(m, 5, 500, 509);
    assert_int_equal(drc__itree_check(&m->t), m->count);

    /* a leaf's first entry dies too: its start stays the leaf's key */
    take_in(m, 0, h[0]);
    assert_int_equal(drc__itree_check(&m->t), m->count);
    assert_int_equal(b->dead, 1);
    assert_null(b->ptr[0]);
    assert_int_equal(b->key[0], 0);
    budget = DRC__ITREE_UNBOUNDED;
    assert_null(drc__itree_floor(&m->t, 50, &budget));
    assert_ptr_equal(drc__itree_floor(&m->t, 150, &budget), &m->n[1]);
    assert_null(drc__itree_first(&m->t, 0, 9, &budget));
    assert_true(budget > 0);
    query(m, 0, UINTPTR_MAX);

    /* dead again, then an insert over the dead ranges */
    for (i = 2; i < 4; i++)
        h[i] = put_in(m, i, (uintptr_t)i * 100, (uintptr_t)i * 100 + 9);
    for (i = 2; i < 4; i++)
        take_in(m, i, h[i]);
    assert_int_equal(b->dead, 2);
    m->n[6].start = 150;
    m->n[6].last = 350;
    budget = DRC__ITREE_UNBOUNDED;
    assert_null(drc__itree_first_at(&m->t, 150, 350, &budget, &path));     /* a miss: nothing live there */
    drc__itree_insert_at(&m->t, &m->n[6], &path);
    m->in[6] = 1;
    m->count++;
    assert_int_equal(drc__itree_check(&m->t), m->count);
    assert_int_equal(b->dead, 0);
    budget = DRC__ITREE_UNBOUNDED;
    assert_ptr_equal(drc__itree_first(&m->t, 220, 220, &budget), &m->n[6]);
    assert_ptr_equal(drc__itree_first(&m->t, 320, 330, &budget), &m->n[6]);
    query(m, 220, 220);
    query(m, 0, UINTPTR_MAX);

    /* a promise given again drops the dead entries that overlapping inserts kept no order with */
    take_in(m, 4, h[4]);                                /* n[1], n[6], n[4] (dead), n[5] */
    assert_int_equal(b->dead, 1);
    drc__itree_set_disjoint(&m->t, 0);
    drc__itree_set_disjoint(&m->t, 1);
    assert_int_equal(b->dead, 0);
    assert_int_equal(drc__itree_check(&m->t), m->count);
    query(m, 0, UINTPTR_MAX);
    drc__itree_fini(&m->t);
    free(m);
}

/*
 * A leaf's first entry dead: floor of a key past it and before the next
 * live entry goes back to the leaf before; an interval inserted at the end
 * of that leaf over the dead start (no live overlap) makes the next leaf
 * drop its dead entries first, and carries its new first start up, so
 * that a query past the dead start finds the new interval. Control:
 * without that (the mutant, run once) the walk went down to the next leaf
 * by its dead first start, took the next live entry and answered none.
 */
static void a_dead_first_entry_is_dropped_before_an_insert_covers_it(void **state)
{
    struct model *m = model_new(43);
    struct drc__itree_bt *h[40];
    struct drc__itree_path path;
    struct drc__itree_node *prev;
    bt *a, *b;
    uintptr_t k;
    int i, budget, e0;

    (void)state;
    drc__itree_set_disjoint(&m->t, 1);
    for (i = 0; i < 40; i++)
        h[i] = put_in(m, i, (uintptr_t)i * 100, (uintptr_t)i * 100 + 9);
    for (a = m->t.root; a->level; a = a->ptr[0])
        ;
    b = a->next;
    assert_non_null(b);
    k = b->key[0];
    e0 = (int)(k / 100);
    prev = a->ptr[a->n - 1];
    take_in(m, e0, h[e0]);
    assert_int_equal(drc__itree_check(&m->t), m->count);
    assert_int_equal(b->dead, 1);
    assert_null(b->ptr[0]);
    budget = DRC__ITREE_UNBOUNDED;
    assert_ptr_equal(drc__itree_floor(&m->t, k + 5, &budget), prev);      /* back to the leaf before */
    assert_true(budget > 0);

    m->n[40 + 0].start = k - 50;
    m->n[40 + 0].last = k + 20;
    budget = DRC__ITREE_UNBOUNDED;
    assert_null(drc__itree_first_at(&m->t, k - 50, k + 20, &budget, &path));  /* a miss */
    drc__itree_insert_at(&m->t, &m->n[40], &path);
    m->in[40] = 1;
    m->count++;
    assert_int_equal(drc__itree_check(&m->t), m->count);
    assert_int_equal(b->dead, 0);
    assert_int_equal(b->key[0], k + 100);
    budget = DRC__ITREE_UNBOUNDED;
    assert_ptr_equal(drc__itree_first(&m->t, k + 5, k + 5, &budget), &m->n[40]);
    query(m, k + 5, k + 5);
    query(m, 0, UINTPTR_MAX);
    drc__itree_fini(&m->t);
    free(m);
}

/*
 * The path of an insert of `key`, searched level by level as bt_ins()
 * descends (the reference for the walk's right-edge shortcut).
 */
static unsigned searched_path(const struct drc__itree *t, uintptr_t key, bt **node, unsigned *idx)
{
    const bt *b = t->root;
    unsigned d = 0, i;

    for (; b->level; b = b->ptr[i], d++) {
        i = bt_upper(b, b->n, key);
        i = i ? i - 1 : 0;
        node[d] = (bt *)b;
        idx[d] = i;
    }
    node[d] = (bt *)b;
    return d + 1;
}

static void expect_searched_path(const struct model *m, uintptr_t key, const struct drc__itree_path *p, int *same)
{
    bt *node[DRC__ITREE_MAXH];
    unsigned idx[DRC__ITREE_MAXH], depth = searched_path(&m->t, key, node, idx), d;

    *same = p->depth == depth && p->seek && p->key == key;
    for (d = 0; *same && d < depth; d++)
        *same = p->node[d] == node[d] && (d + 1 == depth || p->idx[d] == idx[d]);
}

/*
 * A walk from at or past the largest start (every miss of a cache filled
 * in address order) follows the right edge without searching its nodes:
 * its answer and its path must be those of the searched walk, and an
 * insert along that path must leave the tree whole. Control: with a wrong
 * largest entry the shortcut answers an entry that does not overlap, along
 * a path the searched walk does not take.
 */
static void the_right_edge_is_walked_without_search(void **state)
{
    struct model *m = model_new(23);
    struct drc__itree_path path;
    int budget = DRC__ITREE_UNBOUNDED, i, same;
    uintptr_t s;

    (void)state;
    drc__itree_set_disjoint(&m->t, 1);
    for (i = 0; i < 400; i++) {
        s = (uintptr_t)i * 16;
        if (i) {
            assert_null(drc__itree_first_at(&m->t, s, s + 7, &budget, &path));
            expect_searched_path(m, s, &path, &same);
            assert_true(same);
        }
        m->n[i].start = s;
        m->n[i].last = s + 7;
        drc__itree_insert_at(&m->t, &m->n[i], i ? &path : NULL);
        m->in[i] = 1;
        m->count++;
        assert_int_equal(drc__itree_check(&m->t), m->count);
    }
    assert_true(m->t.height >= 3);          /* fan 8, packed: several levels of right edge */
    /* at the largest start, and inside the largest entry: the entry itself, along its path */
    assert_ptr_equal(drc__itree_first_at(&m->t, 399 * 16, 399 * 16, &budget, &path), &m->n[399]);
    assert_ptr_equal(drc__itree_at(&m->t, &path), &m->n[399]);
    assert_ptr_equal(drc__itree_first_at(&m->t, 399 * 16 + 5, 401 * 16, &budget, &path), &m->n[399]);
    drc__itree_remove_at(&m->t, &m->n[399], &path);
    m->in[399] = 0;
    m->count--;
    assert_int_equal(drc__itree_check(&m->t), m->count);
    assert_ptr_equal(m->t.max, &m->n[398]);
    query(m, 0, UINTPTR_MAX);

    /* control: a largest entry that is not the last one sends the walk down the wrong edge */
    m->t.max = &m->n[10];
    assert_ptr_equal(drc__itree_first_at(&m->t, 200 * 16 + 8, 200 * 16 + 9, &budget, &path), &m->n[398]);
    expect_searched_path(m, 200 * 16 + 8, &path, &same);
    assert_false(same);
    m->t.max = &m->n[398];
    drc__itree_fini(&m->t);
    free(m);
}

/*
 * Entries taken out in address order, each found by a walk from its start
 * (memory freed in order, one free event after the other), then in
 * descending order (mappings grow down): the walk after a
 * removal at a leaf's edge starts at that leaf (the finger), visiting one
 * node where a descent visits one a level. Each walk must answer its entry
 * along the path a descent takes (the removal climbs along it: a leaf's first
 * entry sets its parent's key), and the tree must stay whole. Controls: a
 * walk after an insert (the count moved) descends; a finger that claims
 * starts its leaf does not hold sends the walk to the wrong leaf, whose
 * path is not the descent's.
 */
static void a_walk_after_a_removal_starts_at_its_leaf(void **state)
{
    struct model *m = model_new(24);
    struct drc__itree_path path;
    int budget, i, same, fingered = 0, walks = 0;
    uintptr_t s;

    (void)state;
    drc__itree_set_disjoint(&m->t, 1);
    for (i = 0; i < 400; i++)
        ins(m, i, (uintptr_t)i * 16, (uintptr_t)i * 16 + 7);
    assert_true(m->t.height >= 3);
    for (i = 0; i < 399; i++) {
        s = (uintptr_t)i * 16;
        budget = DRC__ITREE_UNBOUNDED;
        assert_ptr_equal(drc__itree_first_at(&m->t, s + 2, s + 3, &budget, &path), &m->n[i]);
        expect_searched_path(m, s + 2, &path, &same);
        assert_true(same);
        assert_ptr_equal(drc__itree_at(&m->t, &path), &m->n[i]);
        walks++;
        fingered += DRC__ITREE_UNBOUNDED - budget == 1;     /* the leaf alone */
        drc__itree_remove_at(&m->t, &m->n[i], &path);
        m->in[i] = 0;
        m->count--;
        assert_int_equal(drc__itree_check(&m->t), m->count);
        if (i == 200) {
            /* control: an insert moves the count, and the walk after it descends */
            ins(m, 450, 10000, 10007);
            budget = DRC__ITREE_UNBOUNDED;
            assert_ptr_equal(drc__itree_first(&m->t, s + 16, s + 16, &budget), &m->n[i + 1]);
            assert_int_equal(DRC__ITREE_UNBOUNDED - budget, m->t.height);
        }
    }
    assert_true(fingered > walks / 2);      /* every walk but the first of a leaf, after merges */
    query(m, 0, UINTPTR_MAX);

    /* the same from the top down (mappings grow down: memory freed in the order it was mapped) */
    for (i = 0; i < 399; i++)
        ins(m, i, (uintptr_t)i * 16, (uintptr_t)i * 16 + 7);
    fingered = walks = 0;
    for (i = 399; i-- > 0;) {
        s = (uintptr_t)i * 16;
        budget = DRC__ITREE_UNBOUNDED;
        assert_ptr_equal(drc__itree_first_at(&m->t, s + 2, s + 3, &budget, &path), &m->n[i]);
        expect_searched_path(m, s + 2, &path, &same);
        assert_true(same);
        walks++;
        fingered += DRC__ITREE_UNBOUNDED - budget == 1;
        drc__itree_remove_at(&m->t, &m->n[i], &path);
        m->in[i] = 0;
        m->count--;
        assert_int_equal(drc__itree_check(&m->t), m->count);
    }
    /*
     * each walk that crosses to the leaf before descends: with this test's fan
     * of 8, the merges at the top leave leaves of two to four entries
     */
    assert_true(fingered > walks / 3);
    query(m, 0, UINTPTR_MAX);

    /* control: a finger whose bounds lie takes a key of another leaf to its leaf */
    for (i = 0; i < 399; i++)
        ins(m, i, (uintptr_t)i * 16, (uintptr_t)i * 16 + 7);
    budget = DRC__ITREE_UNBOUNDED;
    assert_ptr_equal(drc__itree_first_at(&m->t, 100 * 16, 100 * 16, &budget, &path), &m->n[100]);
    drc__itree_remove_at(&m->t, &m->n[100], &path);
    m->in[100] = 0;
    m->count--;
    assert_int_equal(drc__itree_check(&m->t), m->count);
    if (m->t.finger.leaf && m->t.finger.seq == m->t.seq) {
        uintptr_t lo = m->t.finger.lo;

        budget = DRC__ITREE_UNBOUNDED;
        assert_ptr_equal(drc__itree_first_at(&m->t, 101 * 16, 101 * 16, &budget, &path), &m->n[101]);
        assert_int_equal(DRC__ITREE_UNBOUNDED - budget, 1);        /* taken: 101 is in its leaf */
        m->t.finger.lo = 0;
        budget = DRC__ITREE_UNBOUNDED;
        drc__itree_first_at(&m->t, 20 * 16, 20 * 16, &budget, &path);
        expect_searched_path(m, 20 * 16, &path, &same);
        assert_false(same);
        assert_int_equal(drc__itree_check(&m->t), -1);              /* the checker sees it too */
        m->t.finger.lo = lo;
        assert_int_equal(drc__itree_check(&m->t), m->count);
    } else {
        fail_msg("the removal of 100 along its walk left no finger");
    }
    drc__itree_fini(&m->t);
    free(m);
}

static void budget_bounds_the_walk(void **state)
{
    struct model *m = model_new(4);
    struct drc__itree_node *n;
    int i, budget, visited = 0;

    (void)state;
    for (i = 0; i < 256; i++)
        ins(m, i, (uintptr_t)i, (uintptr_t)i);
    budget = 1;
    assert_null(drc__itree_first(&m->t, 255, 255, &budget));    /* deeper than one step */
    assert_true(budget <= 0);
    budget = 20;
    for (n = drc__itree_first(&m->t, 0, UINTPTR_MAX, &budget); n; n = drc__itree_next(&m->t, n, 0, UINTPTR_MAX, &budget))
        visited++;
    assert_true(visited < 256);                                 /* gave up early */
    assert_true(budget <= 0);
    drc__itree_fini(&m->t);
    free(m);
}

/* The checker itself must reject broken trees, or the tests above prove nothing. */
static void check_rejects_broken_trees(void **state)
{
    struct model *m = model_new(5);
    bt *root, *leaf, *nx;
    uintptr_t saved;
    long count;
    int i;

    (void)state;
    for (i = 0; i < 100; i++)
        ins(m, i, (uintptr_t)i * 4, (uintptr_t)i * 4 + 2);
    root = m->t.root;
    assert_true(root->level >= 1);
    for (leaf = root; leaf->level; leaf = leaf->ptr[0])
        ;

    saved = root->last[0];
    root->last[0] = saved - 1;          /* an inner entry's largest last is below its subtree's (above is allowed) */
    assert_int_equal(drc__itree_check(&m->t), -1);
    root->last[0] = saved;

    saved = root->key[1];
    root->key[1] = saved - 1;           /* an inner entry's smallest start is wrong */
    assert_int_equal(drc__itree_check(&m->t), -1);
    root->key[1] = saved;

    saved = leaf->key[1];
    leaf->key[1] = UINTPTR_MAX - 1;     /* a leaf entry out of order, not its node's start */
    assert_int_equal(drc__itree_check(&m->t), -1);
    leaf->key[1] = saved;

    nx = leaf->next;
    leaf->next = nx->next;              /* a leaf left out of the chain */
    assert_int_equal(drc__itree_check(&m->t), -1);
    leaf->next = nx;

    count = m->t.count;
    m->t.count = count + 1;             /* the count is wrong */
    assert_int_equal(drc__itree_check(&m->t), -1);
    m->t.count = count;

    m->t.seq++;                         /* a writer at work */
    assert_int_equal(drc__itree_check(&m->t), -1);
    m->t.seq++;

    assert_int_equal(drc__itree_check(&m->t), 100);
    drc__itree_fini(&m->t);
    free(m);
}

/* A walk from [s, l] that begins at @near: its answer, and whether it began there (the path holds its leaf only). */
static struct drc__itree_node *walk_near(struct model *m, uintptr_t s, uintptr_t l, const bt *near,
                                         struct drc__itree_path *path, int *began)
{
    int budget = DRC__ITREE_UNBOUNDED;
    struct drc__itree_node *x = drc__itree_first_near(&m->t, s, l, &budget, path, near);

    assert_true(budget > 0);
    *began = path->depth == m->t.height && path->leafonly && path->node[path->depth - 1] == near;
    return x;
}

/*
 * A walk given a leaf (a cache's hint slot keeps the one a region left, for
 * the miss that registers it again) begins there when the floor of its
 * start is among the leaf's entries, and records that leaf alone as its
 * path; an insert along that path that changes no level above (into its own
 * dead entry) goes in with no descent, one that must change them (the
 * leaf's end, a split) finds the levels by a descent, and a removal along
 * it that cannot leave its entry dead seeks a full path. Any other leaf,
 * an inner node or a spare node given is refused and the walk descends.
 * Every answer is the list's and the tree stays whole. The controls: the
 * refused leaves are checked with a key whose floor they do not hold, so
 * a walk that took them would answer the wrong entry (without the check of
 * the leaf's first start, the mutant run once, the walk from the last leaf
 * for a key in the first answered none; without the check of the next
 * leaf's first start, from the first leaf for a key in the last).
 */
static void a_walk_begins_at_the_leaf_it_is_given(void **state)
{
    enum { W = 80 };    /* intervals: ten leaves of the fan of 8, three levels */
    struct model *m = model_new(43);
    struct drc__itree_path path;
    struct drc__itree_bt *h;
    const bt *leaf, *first, *lastleaf, *spare;
    int i, k, began, pos;

    (void)state;
    drc__itree_set_disjoint(&m->t, 1);
    for (i = 0; i < W; i++)         /* [100 i, 100 i + 9], in address order: packed leaves of the fan of 8 */
        put_in(m, i, (uintptr_t)i * 100, (uintptr_t)i * 100 + 9);
    assert_int_equal(drc__itree_check(&m->t), m->count);
    assert_true(m->t.height >= 3);
    for (first = m->t.root; first->level; first = first->ptr[0])
        ;
    for (lastleaf = first; lastleaf->next; lastleaf = lastleaf->next)
        ;

    /* an interval inside a leaf leaves it dead in place: the removal answers that leaf */
    for (k = 20; bt_hint_pos(m->put[k]) < 1 || bt_hint_pos(m->put[k]) + 2 >= bt_hint_leaf(m->put[k])->n; k++)
        ;
    leaf = bt_hint_leaf(m->put[k]);
    pos = (int)bt_hint_pos(m->put[k]);
    take_in(m, k, m->put[k]);
    assert_ptr_equal(m->left[k], leaf);
    assert_null(leaf->ptr[pos]);

    /* registered again: the walk begins at that leaf, finds nothing, and the insert takes the dead entry */
    assert_null(walk_near(m, (uintptr_t)k * 100, (uintptr_t)k * 100 + 9, leaf, &path, &began));
    assert_true(began);
    assert_ptr_equal(walk_near(m, (uintptr_t)k * 100 + 5, (uintptr_t)k * 100 + 150, leaf, &path, &began),
                     &m->n[k + 1]);
    assert_true(began);
    assert_null(walk_near(m, (uintptr_t)k * 100, (uintptr_t)k * 100 + 9, leaf, &path, &began));
    h = put_at(m, k, (uintptr_t)k * 100, (uintptr_t)k * 100 + 9, &path);
    assert_int_equal(drc__itree_check(&m->t), m->count);
    assert_ptr_equal(h, bt_hint((bt *)leaf, (unsigned)pos));     /* its own entry, nothing moved */
    assert_int_equal(leaf->dead, 0);
    query(m, 0, UINTPTR_MAX);

    /* refused: a leaf that does not hold the floor (either side), an inner node, a spare node */
    assert_ptr_equal(walk_near(m, 105, 105, lastleaf, &path, &began), &m->n[1]);
    assert_false(began);
    assert_ptr_equal(walk_near(m, W * 100 - 95, W * 100 - 95, first, &path, &began), &m->n[W - 1]);
    assert_false(began);
    assert_ptr_equal(walk_near(m, 3005, 3005, m->t.root, &path, &began), &m->n[30]);
    assert_false(began);
    for (i = 0; i < W; i += 2)      /* merges give nodes back */
        take_in(m, i, m->put[i]);
    for (i = 1; i < W; i += 4)
        take_in(m, i, NULL);
    for (i = 7; i < W; i += 16)     /* a full leaf keeps LOW live entries: half of them merge */
        take_in(m, i, NULL);
    assert_int_equal(drc__itree_check(&m->t), m->count);
    spare = m->t.spare;
    assert_non_null(spare);
    assert_ptr_equal(walk_near(m, 305, 305, spare, &path, &began), &m->n[3]);
    assert_false(began);
    query(m, 0, UINTPTR_MAX);

    /*
     * Along a leaf alone, inserts that change the levels above: after a
     * leaf's last entry (its bound above grows), and into full leaves
     * (splits), each from the leaf that holds the floor of its start.
     */
    for (i = 0; i < W; i++) {
        uintptr_t s = (uintptr_t)i * 100 + 50;      /* between interval i and i + 1 */

        if (!m->in[i])
            s = (uintptr_t)i * 100;                 /* or where i was */
        leaf = m->in[i] ? bt_hint_leaf(m->put[i]) : m->left[i];
        assert_null(walk_near(m, s, s + 9, leaf, &path, &began));
        m->near += began;
        put_at(m, W + i, s, s + 9, &path);
        assert_int_equal(drc__itree_check(&m->t), m->count);
    }
    assert_true(m->near > 20);
    query(m, 0, UINTPTR_MAX);

    /* removals along a leaf alone: dead in place where they may, else by a path sought */
    for (i = 0; i < 2 * W; i++) {
        if (!m->in[i])
            continue;
        leaf = bt_hint_leaf(m->put[i]);
        if (walk_near(m, m->n[i].start, m->n[i].start, leaf, &path, &began) != &m->n[i])
            fail();
        m->left[i] = drc__itree_remove_at(&m->t, &m->n[i], &path);
        m->in[i] = 0;
        m->count--;
        assert_int_equal(drc__itree_check(&m->t), m->count);
        assert_true(!m->left[i] || (!m->left[i]->level && m->left[i]->n));
    }
    query(m, 0, UINTPTR_MAX);
    assert_int_equal(m->count, 0);
    drc__itree_fini(&m->t);
    free(m);
}

/*
 * A walk from a leaf (drc__itree_first_near) reads the tree's height for
 * the path it records from that leaf. A writer may empty the tree right
 * after bt_near answered the leaf: the walk must then give up or answer
 * nothing the count lets anyone trust, and never index its path by the
 * height of the empty tree. The test empties the tree in that window
 * (ITREE_NEAR_WINDOW, a seam the product compiles to nothing). The
 * control, by hand: a build that reads the height after bt_near, as the
 * walk did until the eighth session of 2026-12-06, writes the path at
 * depth (unsigned)-1 here and crashes (so did a lookup of test_cache_mt's
 * thread loop, in one of about 7,700 rounds; most likely another, with no
 * message, was the same).
 */
static struct model *window_model;

static void empty_the_tree(void)
{
    struct model *m = window_model;
    int i;

    near_window = NULL;
    for (i = 0; i < MAXN; i++)
        if (m->in[i])
            take_in(m, i, NULL);
}

static void a_walk_from_a_leaf_survives_the_tree_emptied_under_it(void **state)
{
    enum { W = 80 };
    struct model *m = model_new(47);
    struct drc__itree_path path;
    struct drc__itree_node *x;
    const bt *leaf;
    int i, k, budget = DRC__ITREE_UNBOUNDED;

    (void)state;
    drc__itree_set_disjoint(&m->t, 1);
    for (i = 0; i < W; i++)
        put_in(m, i, (uintptr_t)i * 100, (uintptr_t)i * 100 + 9);
    assert_true(m->t.height >= 3);
    for (k = 20; bt_hint_pos(m->put[k]) < 1 || bt_hint_pos(m->put[k]) + 2 >= bt_hint_leaf(m->put[k])->n; k++)
        ;
    take_in(m, k, m->put[k]);       /* the leaf it left: the walk's hint */
    leaf = m->left[k];
    assert_non_null(leaf);
    window_model = m;
    near_window = empty_the_tree;
    x = drc__itree_first_near(&m->t, (uintptr_t)k * 100, (uintptr_t)k * 100 + 9, &budget, &path, leaf);
    assert_null(near_window);       /* the window was reached: the walk had begun at the leaf */
    assert_true(!x || budget <= 0 || !drc__itree_unchanged(&m->t, &path));
    assert_int_equal(m->t.height, 0);
    assert_int_equal(drc__itree_check(&m->t), 0);
    drc__itree_fini(&m->t);
    free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(empty_tree),
        cmocka_unit_test(overlap_is_closed_at_both_ends),
        cmocka_unit_test(extremes_and_equal_starts),
        cmocka_unit_test(sorted_inserts_and_removes),
        cmocka_unit_test(random_against_naive_list),
        cmocka_unit_test(floor_answers_like_the_list),
        cmocka_unit_test(address_order_packs_the_nodes),
        cmocka_unit_test(given_nodes_are_enough),
        cmocka_unit_test(disjoint_promise_answers_like_the_list),
        cmocka_unit_test(a_path_goes_stale_when_the_tree_changes),
        cmocka_unit_test(a_run_goes_out_along_the_path),
        cmocka_unit_test(an_insert_answers_its_leaf),
        cmocka_unit_test(a_removal_checks_the_leaf_it_is_given),
        cmocka_unit_test(a_removal_inside_a_leaf_kills_its_entry),
        cmocka_unit_test(a_dead_first_entry_is_dropped_before_an_insert_covers_it),
        cmocka_unit_test(the_right_edge_is_walked_without_search),
        cmocka_unit_test(a_walk_begins_at_the_leaf_it_is_given),
        cmocka_unit_test(a_walk_from_a_leaf_survives_the_tree_emptied_under_it),
        cmocka_unit_test(a_walk_after_a_removal_starts_at_its_leaf),
        cmocka_unit_test(budget_bounds_the_walk),
        cmocka_unit_test(check_rejects_broken_trees),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
