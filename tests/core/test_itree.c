/*
 * Tests of src/core/itree.c: the interval tree against a naive list, in
 * both modes (augmented, and plain while the intervals are disjoint).
 *
 * After every insert and remove drc__itree_check() must accept the tree and
 * count its nodes, and every overlap query (first, then next until NULL) must
 * return exactly the overlapping intervals of the list, in start order.
 *
 * The source is included, so that the test also reaches its static helpers
 * (node_prev, which remove uses to keep the tree's largest node); the
 * Makefile then links the rest of the core without itree.o.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core/itree.c"

enum { MAXN = 512 };

struct model {
    struct drc__itree t;
    struct drc__itree_node n[MAXN];
    int in[MAXN];
    long count;
    uint64_t rng;
};

static uint64_t rnd(struct model *m)
{
    /* xorshift64: reproducible across runs */
    m->rng ^= m->rng << 13;
    m->rng ^= m->rng >> 7;
    m->rng ^= m->rng << 17;
    return m->rng;
}

static void ins(struct model *m, int i, uintptr_t start, uintptr_t last)
{
    m->n[i].start = start;
    m->n[i].last = last;
    drc__itree_insert(&m->t, &m->n[i]);
    m->in[i] = 1;
    m->count++;
    assert_int_equal(drc__itree_check(&m->t), m->count);
}

static void rem(struct model *m, int i)
{
    drc__itree_remove(&m->t, &m->n[i]);
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
    for (n = drc__itree_first(&m->t, s, l, &budget); n; n = drc__itree_next(&m->t, n, s, l, &budget)) {
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
    struct drc__itree t = { .root = NULL };
    int budget = DRC__ITREE_UNBOUNDED;

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
    free(m);
}

static void sorted_inserts_and_removes(void **state)
{
    struct model *m = model_new(3);
    int i;

    (void)state;
    for (i = 0; i < 200; i++)       /* ascending: rotations to the left */
        ins(m, i, (uintptr_t)i * 10, (uintptr_t)i * 10 + 15);
    for (i = 0; i < 200; i++)       /* descending: to the right */
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
        free(m);
    }
}

/* The in-order successor, the mirror of itree.c's node_prev, to walk the tree with. */
static struct drc__itree_node *succ(const struct drc__itree_node *n)
{
    struct drc__itree_node *p;

    if (n->right) {
        for (n = n->right; n->left; n = n->left)
            ;
        return (struct drc__itree_node *)n;
    }
    for (p = parent_of(n); p && n == p->right; p = parent_of(n))
        n = p;
    return p;
}

/* node_prev follows start order: walking succ from the smallest start visits every node once, node_prev mirrors it. */
static void prev_is_start_order(void **state)
{
    struct model *m = model_new(7);
    struct drc__itree_node *n, *p;
    int budget = DRC__ITREE_UNBOUNDED, step, i;
    long k;

    (void)state;
    for (step = 0; step < 3000; step++) {
        i = (int)(rnd(m) % MAXN);
        if (m->in[i]) {
            rem(m, i);
        } else {
            uintptr_t st = rnd(m) % 1000;

            ins(m, i, st, st + rnd(m) % 10);
        }
        if (step % 50)
            continue;
        n = drc__itree_first(&m->t, 0, UINTPTR_MAX, &budget);
        assert_true(!n || !node_prev(n));
        for (k = 0, p = NULL; n; p = n, n = succ(n), k++) {
            assert_ptr_equal(node_prev(n), p);
            if (p)
                assert_true(p->start <= n->start);
        }
        assert_int_equal(k, m->count);
    }
    free(m);
}

/* A disjoint interval in grid cell k (16 keys a cell), for plain mode. */
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
 * Plain mode (disjoint intervals, no subtree_last): the same answers as the
 * list, inserts in address order (under the largest node, no descent) and
 * at random, removals of the largest node too; then augmented in the
 * middle of its life, it takes overlapping intervals and still answers.
 */
static void plain_mode_answers_like_the_list(void **state)
{
    uint64_t seed;

    (void)state;
    for (seed = 1; seed <= 10; seed++) {
        struct model *m = model_new(seed * 0x2545f4914f6cdd1dull);
        uintptr_t k;
        int step, i;

        drc__itree_init_plain(&m->t);
        for (i = 0; i < MAXN / 2; i++)      /* address order: the append path */
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
            }
            if (step % 64 == 0 && m->t.max) {
                uintptr_t top = m->t.max->last;
                int budget = DRC__ITREE_UNBOUNDED;

                assert_ptr_equal(drc__itree_floor(&m->t, top + 1, &budget), m->t.max);
                assert_null(drc__itree_first(&m->t, top + 1, UINTPTR_MAX, &budget));
                rem(m, (int)(m->t.max - m->n));     /* the largest leaves: max moves to its predecessor */
            }
        }
        assert_int_equal(m->t.plain, 1);
        drc__itree_augment(&m->t);
        assert_int_equal(m->t.plain, 0);
        assert_int_equal(drc__itree_check(&m->t), m->count);   /* subtree_last now checked, and right */
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
        free(m);
    }
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
    free(m);

    m = model_new(4);                                           /* the same in plain mode */
    drc__itree_init_plain(&m->t);
    for (i = 0; i < 256; i++)
        ins(m, i, (uintptr_t)i * 2, (uintptr_t)i * 2);
    budget = 1;
    assert_null(drc__itree_first(&m->t, 3, 3, &budget));
    assert_true(budget <= 0);
    budget = 20;
    visited = 0;
    for (n = drc__itree_first(&m->t, 0, UINTPTR_MAX, &budget); n; n = drc__itree_next(&m->t, n, 0, UINTPTR_MAX, &budget))
        visited++;
    assert_true(visited < 256);
    assert_true(budget <= 0);
    free(m);
}

/* The checker itself must reject broken trees, or the tests above prove nothing. */
static void check_rejects_broken_trees(void **state)
{
    struct model *m = model_new(5);
    struct drc__itree_node *r;
    uintptr_t saved;
    int i;

    (void)state;
    for (i = 0; i < 15; i++)
        ins(m, i, (uintptr_t)i * 4, (uintptr_t)i * 4 + 2);
    r = m->t.root;

    saved = r->subtree_last;
    r->subtree_last = saved + 1;        /* wrong augmentation */
    assert_int_equal(drc__itree_check(&m->t), -1);
    r->subtree_last = saved;

    r->parent_red |= 1;                 /* red root */
    assert_int_equal(drc__itree_check(&m->t), -1);
    r->parent_red &= ~(uintptr_t)1;

    saved = r->start;
    r->start = UINTPTR_MAX - 1;         /* out of order (and start > last) */
    assert_int_equal(drc__itree_check(&m->t), -1);
    r->start = saved;

    saved = r->left->parent_red;
    r->left->parent_red = (uintptr_t)r->right | (saved & 1);   /* bad parent link, its colour kept */
    assert_int_equal(drc__itree_check(&m->t), -1);
    r->left->parent_red = saved;

    r->left->parent_red ^= 1;           /* black heights differ (or red-red) */
    assert_int_equal(drc__itree_check(&m->t), -1);
    r->left->parent_red ^= 1;

    saved = (uintptr_t)m->t.max;
    m->t.max = r;                       /* max is not the last node */
    assert_int_equal(drc__itree_check(&m->t), -1);
    m->t.max = (struct drc__itree_node *)saved;

    assert_int_equal(drc__itree_check(&m->t), 15);
    free(m);

    m = model_new(5);                   /* plain mode: intervals must be disjoint */
    drc__itree_init_plain(&m->t);
    for (i = 0; i < 15; i++)
        ins(m, i, (uintptr_t)i * 4, (uintptr_t)i * 4 + 2);
    m->n[3].last = m->n[4].start;       /* touches its successor */
    assert_int_equal(drc__itree_check(&m->t), -1);
    m->n[3].last = m->n[4].start - 1;
    assert_int_equal(drc__itree_check(&m->t), 15);
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
        cmocka_unit_test(prev_is_start_order),
        cmocka_unit_test(plain_mode_answers_like_the_list),
        cmocka_unit_test(budget_bounds_the_walk),
        cmocka_unit_test(check_rejects_broken_trees),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
