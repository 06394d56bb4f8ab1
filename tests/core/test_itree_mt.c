/*
 * The index's lockless walks (itree.h) against a writer: threads query
 * (floor, first, next) without the lock while a writer inserts and removes
 * under it, splitting, merging and freeing nodes as it goes.
 *
 * What a walk may answer: a node of the tree (never a pointer it read from
 * a node that was changing, such as another node of the index), or NULL
 * with *budget 0 when it saw the writer. When no writer ran between the
 * walk's start and a check under the lock afterwards (the index's count did
 * not move), the answer must be the one a naive list gives. Under TSan
 * every load of a walk must be atomic against the writer's stores.
 * Control: a walk whose answer is checked after a writer did run is not
 * held to the list (its count moved), and at least one such walk is seen,
 * so the check above is not vacuous: some walks did race the writer.
 * Half the writer's removals go along a walk's path, the entry after them
 * too, as memory freed in address order (itree.h's finger); half the walks
 * ask within the finger's leaf, and some of those checked against the list
 * began there (they visited one node before the next entry). Half of the
 * other removals are given where the insert put the node (remove_in, as a
 * removal by handle); removals inside a leaf leave dead entries, which
 * walks skip, and some of the walks checked ran while the tree had some.
 * A third of the walks, and the writer's walks before half its inserts and
 * before its removals along a path, begin at the leaf the last removal of
 * the node of their start's cell left (drc__itree_first_near, as a miss
 * after an invalidation does), which the writer may have changed in any
 * way since; some of those checked against the list began there.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <unistd.h>

#include "core/itree.h"

enum { N = 2048, READERS = 2, SPACE = 64 * N };

static struct drc__itree tree;
static struct drc__itree_node nodes[N];
static int in[N];                   /* under lock */
static struct drc__itree_bt *where[N];  /* what each insert answered (under lock) */
static struct drc__itree_bt *left[N];   /* atomic: the leaf each node's last removal left, or NULL */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int stop;
static long checked, raced, gave_up, finger_walks, dead_walks, near_walks;   /* the last three: under lock */

static uint64_t rnd(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* The list's first overlap of [s, l] in start order (the smallest start), under lock. */
static struct drc__itree_node *naive_first(uintptr_t s, uintptr_t l)
{
    struct drc__itree_node *best = NULL;
    int i;

    for (i = 0; i < N; i++)
        if (in[i] && nodes[i].start <= l && s <= nodes[i].last && (!best || nodes[i].start < best->start))
            best = &nodes[i];
    return best;
}

/* Under lock: take @x out along the path of a walk from its start, as a free event does. */
static void remove_along_walk(struct drc__itree_node *x)
{
    struct drc__itree_path path;
    int budget = DRC__ITREE_UNBOUNDED;

    assert_ptr_equal(drc__itree_first_near(&tree, x->start, x->start, &budget, &path,
                                           __atomic_load_n(&left[x - nodes], __ATOMIC_RELAXED)), x);
    __atomic_store_n(&left[x - nodes], drc__itree_remove_at(&tree, x, &path), __ATOMIC_RELAXED);
}

static void *writer(void *arg)
{
    uint64_t r = 0x1234567;
    struct drc__itree_path path;
    struct drc__itree_node *x;
    struct drc__itree_bt *lf;
    int i, k, budget;

    (void)arg;
    while (!__atomic_load_n(&stop, __ATOMIC_RELAXED)) {
        pthread_mutex_lock(&lock);
        for (k = 0; k < 16; k++) {
            i = (int)(rnd(&r) % N);
            if (in[i] && (rnd(&r) & 1)) {
                remove_along_walk(&nodes[i]);
                /* and the one after it, as memory freed in address order (the finger) */
                budget = DRC__ITREE_UNBOUNDED;
                x = drc__itree_first(&tree, nodes[i].last + 1, SPACE, &budget);
                in[i] = 0;
                if (x) {
                    remove_along_walk(x);
                    in[x - nodes] = 0;
                }
            } else if (in[i]) {
                if (rnd(&r) & 1)
                    lf = drc__itree_remove_in(&tree, &nodes[i], where[i]);
                else
                    lf = drc__itree_remove_at(&tree, &nodes[i], NULL);
                __atomic_store_n(&left[i], lf, __ATOMIC_RELAXED);
                in[i] = 0;
            } else {
                /* disjoint: node i lives in its own cell of 64 */
                __atomic_store_n(&nodes[i].start, (uintptr_t)i * 64 + rnd(&r) % 16, __ATOMIC_RELAXED);
                __atomic_store_n(&nodes[i].last, nodes[i].start + rnd(&r) % 40, __ATOMIC_RELAXED);
                if (rnd(&r) & 1) {
                    /* as a miss does: along a walk that may begin where the node's removal left off */
                    budget = DRC__ITREE_UNBOUNDED;
                    drc__itree_first_near(&tree, nodes[i].start, nodes[i].last, &budget, &path,
                                          __atomic_load_n(&left[i], __ATOMIC_RELAXED));
                    where[i] = drc__itree_insert_at(&tree, &nodes[i], &path);
                } else {
                    where[i] = drc__itree_insert(&tree, &nodes[i]);
                }
                in[i] = 1;
            }
        }
        pthread_mutex_unlock(&lock);
        usleep(20);     /* room for walks that meet no writer: not a timing assertion, the mix only */
    }
    return NULL;
}

static void *reader(void *arg)
{
    uint64_t r = (uintptr_t)arg * 0x9e3779b97f4a7c15ull + 1;
    long k, mine_checked = 0, mine_raced = 0, fingered = 0, neared = 0;

    /* until this reader has every kind of walk (events), or a cap a working index never needs */
    for (k = 0; k < 4000000 && (mine_checked < 2000 || !mine_raced || !fingered || !neared); k++) {
        uintptr_t s = rnd(&r) % SPACE, l = s + rnd(&r) % 200;
        unsigned seq = __atomic_load_n(&tree.seq, __ATOMIC_ACQUIRE), height;
        int budget = 256, first_nodes, near = 0;
        struct drc__itree_node *x, *y = NULL;
        struct drc__itree_path path;
        const struct drc__itree_bt *hint;

        if (rnd(&r) & 1) {
            /* half the walks within the finger's leaf, if the writer left one (a guess: any range is valid) */
            uintptr_t lo = __atomic_load_n(&tree.finger.lo, __ATOMIC_RELAXED);
            uintptr_t hi = __atomic_load_n(&tree.finger.hi, __ATOMIC_RELAXED);

            if (lo <= hi && hi - lo < SPACE) {
                s = lo + rnd(&r) % (hi - lo + 1);
                l = s + rnd(&r) % 200;
            }
        }
        height = __atomic_load_n(&tree.height, __ATOMIC_RELAXED);
        if (rnd(&r) % 3 == 0) {
            /* a third from the leaf the removal of the node of s's cell left, as a miss's lookup */
            hint = __atomic_load_n(&left[s / 64], __ATOMIC_RELAXED);
            x = drc__itree_first_near(&tree, s, l, &budget, &path, hint);
            near = hint && path.depth && path.leafonly && path.node[path.depth - 1] == hint;
        } else {
            x = drc__itree_first(&tree, s, l, &budget);
        }
        first_nodes = 256 - budget;     /* nodes the walk visited: one, if it began at the finger's leaf */

        if (x && budget > 0) {
            assert_true(x >= nodes && x < nodes + N);      /* a node of ours, nothing else */
            y = drc__itree_next(&tree, x, s, l, &budget);
            assert_true(!y || (y >= nodes && y < nodes + N));
        }
        if (budget <= 0) {
            __atomic_fetch_add(&gave_up, 1, __ATOMIC_RELAXED);
            mine_raced++;
            continue;
        }
        pthread_mutex_lock(&lock);
        if (!(seq & 1) && __atomic_load_n(&tree.seq, __ATOMIC_RELAXED) == seq) {
            assert_ptr_equal(x, naive_first(s, l));
            checked++;
            mine_checked++;
            dead_walks += tree.dead > 0;
            near_walks += near;
            neared += near;
            if (height > 1 && first_nodes == 1 && !near) {
                fingered++;
                finger_walks++;
            }
        } else {
            raced++;
            mine_raced++;
        }
        pthread_mutex_unlock(&lock);
    }
    return NULL;
}

static void lockless_walks_race_a_writer(void **state)
{
    pthread_t w, rd[READERS];
    int i;

    (void)state;
    drc__itree_init(&tree, 0);
    drc__itree_set_disjoint(&tree, 1);
    pthread_create(&w, NULL, writer, NULL);
    for (i = 0; i < READERS; i++)
        pthread_create(&rd[i], NULL, reader, (void *)(uintptr_t)(i + 1));
    for (i = 0; i < READERS; i++)
        pthread_join(rd[i], NULL);
    __atomic_store_n(&stop, 1, __ATOMIC_RELAXED);
    pthread_join(w, NULL);
    print_message("%ld walks checked against the list (%ld began at the finger's leaf, %ld at a leaf a removal "
                  "left, %ld ran while dead entries were in the tree), %ld raced the writer, %ld gave up\n", checked,
                  finger_walks, near_walks, dead_walks, raced, gave_up);
    assert_int_equal(drc__itree_check(&tree), tree.count);
    assert_true(checked > 0);
    assert_true(finger_walks > 0);        /* walks that began at the finger's leaf were checked too */
    assert_true(dead_walks > 0);          /* and walks past dead entries */
    assert_true(near_walks > 0);          /* and walks that began at a leaf a removal left */
    assert_true(raced + gave_up > 0);     /* the control: walks did meet the writer */
    drc__itree_fini(&tree);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(lockless_walks_race_a_writer),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
