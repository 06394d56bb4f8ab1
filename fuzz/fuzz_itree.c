/*
 * Fuzz target for src/core/itree.c: one property, the tree answers like a
 * naive array. The input is a program of insert / remove / overlap query /
 * floor query on a small key space (many overlaps and equal starts). After
 * every step drc__itree_check() must accept the tree and count its nodes,
 * and every answer must equal the array's. Removals go along a walk's path,
 * by a descent, or given the leaf the node's insert answered, which the
 * steps since may have split, merged or given back; a removal along a path
 * is followed, at times, by the walk and removal of the entry after it, as
 * memory freed in address order does. Walks before inserts, removals and
 * queries may begin at a leaf given (drc__itree_first_near): the one the
 * node's removal left, another node's insert answered, or none, each of
 * which the steps since may have changed; a query's answer must be the
 * descent's. 160 intervals make a tree of
 * three levels of 18 (splits, merges and borrows of inner nodes);
 * tests/core/test_itree.c reaches more levels with a smaller fan. An odd
 * first byte starts the tree with the owner's promise that its intervals
 * are disjoint, which the program takes back, as the cache does, just
 * before it inserts the first interval that overlaps another; with its
 * second bit also set, the promise is kept and such inserts are skipped,
 * so that a whole program runs the disjoint paths.
 */
#include <string.h>

#include "fuzz.h"
#include "core/itree.h"

enum { NODES = 160, KEYS = 256 };

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct fuzz_in in = { data, size };
    struct drc__itree t;
    struct drc__itree_path path;
    struct drc__itree_node n[NODES];
    struct drc__itree_bt *leaf[NODES];      /* where each insert put its node: a hint, stale or not */
    struct drc__itree_bt *left[NODES];      /* the leaf each node's removal left: where a walk may begin */
    int in_tree[NODES] = { 0 }, seen[NODES];
    long count = 0;
    int steps = 0, strict = 0, mode;

    memset(n, 0, sizeof(n));
    memset(leaf, 0, sizeof(leaf));
    memset(left, 0, sizeof(left));
    drc__itree_init(&t, 0);
    mode = fuzz_more(&in) ? fuzz_u8(&in) : 0;
    if (mode & 1)
        drc__itree_set_disjoint(&t, 1);     /* taken back, as the cache does, before the first overlap */
    strict = (mode & 3) == 3;               /* or kept: an insert that would overlap is skipped */
    while (fuzz_more(&in) && steps++ < 4096) {
        uint8_t op = fuzz_u8(&in) % 4;
        int i = (int)fuzz_range(&in, 0, NODES - 1), j, got, want, budget = DRC__ITREE_UNBOUNDED;
        uintptr_t s = fuzz_range(&in, 0, KEYS - 1), l = s + fuzz_range(&in, 0, 15);
        struct drc__itree_node *x;
        uintptr_t prev = 0;

        /*
         * A leaf for a walk to begin at (drc__itree_first_near), as a cache's
         * hint slot keeps one: none, the one node i's removal left, or where
         * the insert of node j (the key's low bits) put it, each stale or not.
         */
        const struct drc__itree_bt *near = (s >> 2) & 1 ? left[i] : (s >> 3) & 1 ? leaf[(i + s) % NODES] : NULL;

        /* the very top of the key space too: closed intervals ending at UINTPTR_MAX */
        if (s == KEYS - 1) {
            s = UINTPTR_MAX - (l - s);
            l = UINTPTR_MAX;
        }
        switch (op) {
        case 0:     /* insert node i, or remove it if it is in */
        case 1:
            if (in_tree[i] && op == 1) {
                /* along the path of a walk from its start, as a free event does */
                budget = DRC__ITREE_UNBOUNDED;
                drc__itree_first_near(&t, n[i].start, n[i].start, &budget, &path, near);
                left[i] = drc__itree_remove_at(&t, &n[i], &path);
                in_tree[i] = 0;
                count--;
                /*
                 * and the entry after it, by a walk of its own, as the next
                 * free event of memory freed in address order (the walk may
                 * start at the leaf the removal left off at: the finger)
                 */
                for (want = -1, j = 0; j < NODES && t.disjoint && (s & 2); j++)
                    if (in_tree[j] && n[j].start > n[i].start && (want < 0 || n[j].start < n[want].start))
                        want = j;
                if (want >= 0) {
                    FUZZ_ASSERT(drc__itree_check(&t) == count);
                    budget = DRC__ITREE_UNBOUNDED;
                    x = drc__itree_first_at(&t, n[want].start, n[want].start, &budget, &path);
                    FUZZ_ASSERT(x == &n[want]);
                    left[want] = drc__itree_remove_at(&t, &n[want], &path);
                    in_tree[want] = 0;
                    count--;
                }
            } else if (in_tree[i]) {
                if (s & 1)      /* given where its insert put it, as a removal by handle does */
                    left[i] = drc__itree_remove_in(&t, &n[i], leaf[i]);
                else
                    left[i] = drc__itree_remove_at(&t, &n[i], NULL);
                in_tree[i] = 0;
                count--;
            } else {
                for (j = 0; j < NODES && t.disjoint; j++)
                    if (in_tree[j] && n[j].start <= l && s <= n[j].last)
                        break;
                if (j < NODES && t.disjoint && strict)
                    break;                  /* it would overlap: the promise stays, the insert is skipped */
                if (j < NODES && t.disjoint)
                    drc__itree_set_disjoint(&t, 0);
                n[i].start = s;
                n[i].last = l;
                if (op == 1) {      /* along the path of the overlap walk before it, as a miss does */
                    budget = DRC__ITREE_UNBOUNDED;
                    drc__itree_first_near(&t, s, l, &budget, &path, near);
                    leaf[i] = drc__itree_insert_at(&t, &n[i], &path);
                } else {
                    leaf[i] = drc__itree_insert(&t, &n[i]);
                }
                in_tree[i] = 1;
                count++;
            }
            FUZZ_ASSERT(drc__itree_check(&t) == count);
            break;
        case 2:     /* overlap query [s, l]: each overlapping node once, in start order */
            memset(seen, 0, sizeof(seen));
            got = want = 0;
            x = drc__itree_first(&t, s, l, &budget);
            FUZZ_ASSERT(drc__itree_first_near(&t, s, l, &budget, NULL, near) == x);
            for (; x; x = drc__itree_next(&t, x, s, l, &budget)) {
                j = (int)(x - n);
                FUZZ_ASSERT(j >= 0 && j < NODES && in_tree[j] && !seen[j]);
                FUZZ_ASSERT(x->start <= l && s <= x->last);
                FUZZ_ASSERT(x->start >= prev);
                prev = x->start;
                seen[j] = 1;
                got++;
            }
            FUZZ_ASSERT(budget > 0);
            for (j = 0; j < NODES; j++)
                if (in_tree[j] && n[j].start <= l && s <= n[j].last) {
                    FUZZ_ASSERT(seen[j]);
                    want++;
                }
            FUZZ_ASSERT(got == want);
            break;
        case 3:     /* floor(s): the largest start <= s */
            x = drc__itree_floor(&t, s, &budget);
            want = -1;
            for (j = 0; j < NODES; j++)
                if (in_tree[j] && n[j].start <= s && (want < 0 || n[j].start > n[want].start))
                    want = j;
            if (want < 0) {
                FUZZ_ASSERT(x == NULL);
            } else {
                FUZZ_ASSERT(x != NULL && in_tree[x - n]);
                FUZZ_ASSERT(x->start == n[want].start);
            }
            break;
        }
    }
    drc__itree_fini(&t);
    return 0;
}
