/*
 * An augmented red-black interval tree over closed intervals [start, last].
 *
 * Each node keeps subtree_last, the largest `last` in its subtree, so an
 * overlap query can skip every subtree that ends before the query starts.
 * Nodes are embedded in their owner (see container_of in cache.c).
 *
 * Concurrency contract: insert and remove need the owner's lock. first and
 * next may also run without it, concurrently with a writer: every field they
 * read is loaded atomically and every field a writer changes is stored
 * atomically, so a lockless reader never sees a torn pointer. It may see a
 * tree in the middle of a rotation and so miss a node or, in theory, walk in
 * a circle; `budget` bounds the steps it takes and the caller must validate
 * what it found (cache.c does so with a sequence count). The nodes a lockless
 * reader can reach must stay mapped memory for as long as it may run.
 *
 * Two intervals A and B overlap iff A.start <= B.last && B.start <= A.last.
 *
 * Plain mode (drc__itree_init_plain): while its owner promises that no two
 * intervals overlap, the tree keeps no subtree_last. Where intervals are
 * disjoint, the only node before a query that can reach into it is the
 * floor of its start, and every later overlapping node follows in start
 * order, so one descent (which finds the floor and the node after it) and
 * in-order steps answer every query; the writers skip the stores of
 * subtree_last along an insert's path (each a line written on every
 * insert, the root's among them when regions come in address order) and
 * the recomputation after a removal. In either mode the tree keeps its
 * largest node: a floor at or after its start, and in plain mode an insert
 * after it, need no descent. The owner ends plain mode, once, with
 * drc__itree_augment() before it inserts an overlapping interval.
 */
#ifndef DRC_ITREE_H
#define DRC_ITREE_H

#include <stdint.h>

struct drc__itree_node {
    uintptr_t start, last;          /* the interval, closed */
    struct drc__itree_node *left, *right;
    uintptr_t parent_red;           /* the parent's address | 1 if this node is red */
    uintptr_t subtree_last;         /* max `last` over this subtree; last, so that an embedding may
                                     * keep the 40 bytes before it in one cache line (cache.c does) */
};

struct drc__itree {
    struct drc__itree_node *root;
    struct drc__itree_node *max;    /* atomic: the node with the largest start (the last of equal ones) */
    int plain;                      /* atomic: 1 in plain mode (above); zero-initialised trees are augmented */
};

/* Start @t empty in plain mode (its owner keeps its intervals disjoint). */
void drc__itree_init_plain(struct drc__itree *t);

/*
 * End plain mode: compute subtree_last of every node (O(n), no allocation),
 * then let queries use it. Under the owner's lock, in the writer's window
 * that lets intervals overlap (lockless readers must validate across it).
 */
void drc__itree_augment(struct drc__itree *t);

/*
 * Insert @n (start and last set by the caller). Equal starts are allowed,
 * and overlaps, except in plain mode.
 */
void drc__itree_insert(struct drc__itree *t, struct drc__itree_node *n);

/* Remove @n, which must be in @t. */
void drc__itree_remove(struct drc__itree *t, struct drc__itree_node *n);

/*
 * The overlapping node with the smallest start, and the next one after @n in
 * start order. *budget is decremented for every node visited; when it reaches
 * 0 the walk gives up and returns NULL. Pass a large budget under the lock.
 */
struct drc__itree_node *drc__itree_first(const struct drc__itree *t, uintptr_t start, uintptr_t last,
                                         int *budget);
struct drc__itree_node *drc__itree_next(const struct drc__itree *t, const struct drc__itree_node *n,
                                        uintptr_t start, uintptr_t last, int *budget);

/*
 * The node with the largest start <= @key (the rightmost of equal starts), or
 * NULL. A plain descent that reads one node per level: where intervals do not
 * overlap, it is the only node that can contain a range starting at @key.
 */
struct drc__itree_node *drc__itree_floor(const struct drc__itree *t, uintptr_t key, int *budget);

/*
 * Check every invariant (BST order, red-black rules, parent links,
 * subtree_last) and return the node count, or -1 if one is broken.
 * O(n): for tests, fuzzers and DRC_DEBUG builds.
 */
long drc__itree_check(const struct drc__itree *t);

#define DRC__ITREE_UNBOUNDED (1 << 30)

#endif
