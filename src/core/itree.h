/*
 * An interval index over closed intervals [start, last]: a B+ tree of
 * compact nodes apart from the intervals' owners.
 *
 * Each owner embeds a struct drc__itree_node (its interval); the tree keeps
 * (start, last, node) triples in leaves of up to DRC__ITREE_FAN entries, in
 * start order, and each inner entry keeps the smallest start and the
 * largest `last` of its child's subtree, so that an overlap query skips
 * every subtree that ends before the query starts. A descent reads a few
 * lines of a node per level, and the upper levels of a tree of 2^18
 * intervals fit in a core's L2; a red-black tree threaded through the
 * owners took one owner's line per level, about 2 log2 n dependent misses
 * once the owners outgrow the caches.
 *
 * Concurrency contract: insert and remove need the owner's lock. first,
 * next and floor may also run without it, concurrently with a writer. The
 * tree has its own sequence count, odd while a writer changes nodes; a
 * lockless walk reads every word atomically and, before it follows a
 * pointer it read from a node (a child, a sibling, an owner's node), checks
 * that the count has not moved since the walk began. So every pointer it
 * follows was read from a tree at rest, and points to a node of the level
 * it expects (or to an owner's node). The node it then reads may be changed
 * or freed under it: freed nodes are kept, never returned, until
 * drc__itree_fini(), so what it reads is a node's memory, maybe stale,
 * whose next pointer is checked the same way. A walk that sees the count
 * move gives up: it returns NULL and sets *budget to 0. Each walk is bounded
 * by *budget; the caller must still validate what it found (cache.c does so
 * with its own sequence count), as a walk that did not see the count move
 * answered for one instant only.
 *
 * Node memory: a tree made with drc__itree_init(t, 0) (or zeroed) takes
 * its nodes from malloc, as it needs them (tests, fuzzers). An owner that
 * may not allocate under its lock makes it with drc__itree_init(t, 1) and,
 * before an insert, gives it the nodes drc__itree_need() asks for, carved
 * from its own memory (drc__itree_give); remove never allocates.
 *
 * The tree keeps its largest entry (max): an insert at or past it and a
 * floor of a key at or past its start search nothing. It also keeps the
 * path to where a removal at the edge of a leaf left off (finger): a walk of
 * disjoint intervals that begins while the tree is as that removal left
 * it, for a key from the leaf's first start to the next leaf's, starts
 * there. Memory freed in address order takes the first entry of a leaf,
 * then the next, which is the first then (top down, the last, then the one
 * before): each free event's walk skips the descent.
 *
 * A removal from a leaf of disjoint intervals (remove_in, or remove_at
 * along a walk's path) of any entry but the tree's largest leaves the
 * entry dead in place, its node pointer cleared,
 * instead of moving the entries after it; walks skip it, an insert nearby
 * takes its place, and a writer that moves entries drops it (itree.c).
 * Removals answer the leaf they left; an owner that keeps it may begin a
 * later walk near there at that leaf (drc__itree_first_near), which checks
 * that the leaf still holds the floor of its key: an interval inserted
 * again where it was removed, after a walk from its leaf, goes into its
 * own dead entry with no descent.
 *
 * Two intervals A and B overlap iff A.start <= B.last && B.start <= A.last.
 */
#ifndef DRC_ITREE_H
#define DRC_ITREE_H

#include <stddef.h>
#include <stdint.h>

struct drc__itree_node {
    uintptr_t start, last;          /* the interval, closed; constant while in a tree */
};

struct drc__itree_bt;

enum { DRC__ITREE_MAXH = 32 };     /* levels: nodes of 4 entries or more hold 2^64 in 32 */

/*
 * Where a walk found its node: the nodes from the root down and the entry
 * taken in each, and the tree's count when the walk began (the path holds
 * while the count has not moved). A walk of disjoint intervals follows the
 * path an insert of its start would take (seek, key): it also tells
 * drc__itree_insert_at where that insert goes.
 */
struct drc__itree_path {
    unsigned seq, depth;            /* depth 0: no path */
    int seek;                       /* the path of an insert of `key` */
    int fingered;                   /* its levels above the leaf are the finger's (bt_finger) */
    int walked;                     /* a walk's, not yet removed along: its removal may leave a finger */
    int leafonly;                   /* only the leaf is recorded (a walk that began at a hint): the levels
                                     * above are found by a descent when a writer needs them */
    uintptr_t key;
    unsigned at;                    /* seek: the place of `key` among its leaf's entries */
    struct drc__itree_bt *node[DRC__ITREE_MAXH];
    unsigned idx[DRC__ITREE_MAXH];
};

struct drc__itree {
    struct drc__itree_bt *root;     /* atomic; NULL when empty */
    unsigned height;                /* atomic: levels, 0 when empty, 1 when the root is a leaf */
    unsigned seq;                   /* atomic: odd while insert or remove changes nodes */
    long count;                     /* intervals in the tree */
    long dead;                      /* dead entries in its leaves (itree.c's bt_compact) */
    struct drc__itree_bt *spare;    /* free nodes, linked through their next: never given back */
    unsigned nspare;
    int given;                      /* 1: nodes come only from drc__itree_give (never malloc) */
    int disjoint;                   /* atomic: the owner promises no two intervals overlap */
    void *all;                      /* malloc'd nodes, for drc__itree_fini (itree.c's bt_node_new) */
    struct drc__itree_node *max;    /* atomic: the node with the largest start (the last of equal ones) */
    struct drc__itree_finger {      /* where the last removal at a leaf's edge left off (bt_finger) */
        unsigned seq, depth;        /* atomic: the count it holds for; the path's */
        struct drc__itree_bt *leaf; /* atomic; NULL: none */
        uintptr_t lo, hi;           /* atomic: the leaf's first start; the next leaf's less 1 (or the top) */
        struct drc__itree_bt *node[DRC__ITREE_MAXH];    /* atomic: the path to the leaf, as in a path */
        unsigned idx[DRC__ITREE_MAXH];
    } finger;
};

/*
 * Entries per node: 18 fill the seven lines of a node exactly (tests build
 * the tree with a smaller fan, to reach more levels with few intervals).
 */
#ifndef DRC__ITREE_FAN
#define DRC__ITREE_FAN 18
#endif
/* Bytes per node: three words per entry and a 16-byte header, 64-byte aligned */
#define DRC__ITREE_NODE (((size_t)DRC__ITREE_FAN * 24 + 16 + 63) / 64 * 64)

/*
 * Start @t empty. @given: 0, nodes come from malloc when an insert needs
 * one; 1, only from drc__itree_give().
 */
void drc__itree_init(struct drc__itree *t, int given);

/*
 * The owner promises (1) that no two intervals in @t overlap, or takes the
 * promise back (0, the default), under its lock, before it inserts an
 * interval that overlaps another. While it holds, an overlap query starts
 * at the floor of its start, found by counting keys, instead of scanning each
 * node from its first entry; a lockless walk that read the promise and
 * met the overlapping insert sees the count move. A promise given again
 * after it was taken back drops every dead entry first (a walk of every
 * leaf).
 */
void drc__itree_set_disjoint(struct drc__itree *t, int disjoint);

/* Free the nodes malloc gave (nothing for given nodes: their owner frees them). */
void drc__itree_fini(struct drc__itree *t);

/* Nodes the next insert may need that the tree does not have spare (owner's lock). */
unsigned drc__itree_need(const struct drc__itree *t);

/*
 * Give @t the memory [mem, mem + size) for nodes (64-byte aligned; owner's
 * lock). It becomes the tree's until its owner frees it after
 * drc__itree_fini(): a lockless walk may read a freed node until then.
 */
void drc__itree_give(struct drc__itree *t, void *mem, size_t size);

/*
 * Insert @n (start and last set by the caller). Equal starts are allowed,
 * and overlaps. A tree of given nodes must have had drc__itree_need() met.
 * Returns where @n was put, for drc__itree_remove_in: its leaf, with its
 * place in the leaf in the address's low bits (an opaque hint, never to be
 * dereferenced by the owner).
 */
struct drc__itree_bt *drc__itree_insert(struct drc__itree *t, struct drc__itree_node *n);

/*
 * The same, given the path of a walk from @n's start (drc__itree_first_at
 * of disjoint intervals): with no descent if the tree has not changed
 * since, else as drc__itree_insert(). Returns where @n was put, as that.
 */
struct drc__itree_bt *drc__itree_insert_at(struct drc__itree *t, struct drc__itree_node *n,
                                           const struct drc__itree_path *p);

/*
 * Remove @n, which must be in @t. drc__itree_remove_in and
 * drc__itree_remove_at return the leaf @n left when it stays a leaf of the
 * tree (its entry dead there, or cut with no node merged), else NULL: where
 * a later walk near @n's start may begin (drc__itree_first_near).
 */
void drc__itree_remove(struct drc__itree *t, struct drc__itree_node *n);

/*
 * The same, given what @n's insert answered (drc__itree_insert or
 * drc__itree_insert_at), or NULL: with no descent if @n is still in that
 * leaf and is not the tree's largest, in a tree of disjoint intervals,
 * else as drc__itree_remove(); with no search of the leaf either if @n is
 * still at the place answered. The leaf may have changed
 * since in any way: the answer is checked, never trusted. A removal of a
 * region its owner holds by handle, whose lookup never walked the index,
 * pays no descent.
 */
struct drc__itree_bt *drc__itree_remove_in(struct drc__itree *t, struct drc__itree_node *n,
                                           struct drc__itree_bt *leaf);

/*
 * The same, given where drc__itree_first_at() found @n: with no descent if
 * the tree has not changed since (its count has not moved), else along a
 * descent's path. Under the owner's lock; the walk may have been lockless.
 * Afterwards @p leads to @n's successor in its leaf (drc__itree_at) if no
 * node changed shape, else holds no path (depth 0): a run of entries is
 * taken out one after the other with no descent between them. A path of
 * its leaf only (drc__itree_first_near) is followed where @n's entry may
 * die in place; any other removal descends.
 */
struct drc__itree_bt *drc__itree_remove_at(struct drc__itree *t, struct drc__itree_node *n,
                                           struct drc__itree_path *p);

/*
 * The overlapping node with the smallest start, and the next one after @n in
 * start order (@n must be in @t). *budget is decremented for every tree node
 * visited; when it reaches 0, or the walk saw a writer, the walk gives up,
 * sets *budget to 0 and returns NULL. Pass a large budget under the lock.
 */
struct drc__itree_node *drc__itree_first(const struct drc__itree *t, uintptr_t start, uintptr_t last,
                                         int *budget);
struct drc__itree_node *drc__itree_next(const struct drc__itree *t, const struct drc__itree_node *n,
                                        uintptr_t start, uintptr_t last, int *budget);

/* drc__itree_first, and where it found its node in *@p (depth 0 if it found none). */
struct drc__itree_node *drc__itree_first_at(const struct drc__itree *t, uintptr_t start, uintptr_t last,
                                            int *budget, struct drc__itree_path *p);

/*
 * drc__itree_first_at, starting at leaf @near if it still holds the floor of
 * @start (a leaf an insert or a removal answered, kept since: it may have
 * changed in any way, or left the tree, and is checked, never trusted), in
 * a tree of disjoint intervals; else as drc__itree_first_at. The path it
 * records may then hold the leaf only (leafonly): an insert or a removal
 * along it that must change a level above finds that level by a descent.
 */
struct drc__itree_node *drc__itree_first_near(const struct drc__itree *t, uintptr_t start, uintptr_t last,
                                              int *budget, struct drc__itree_path *path,
                                              const struct drc__itree_bt *near);

/*
 * 1 if the tree has not changed since the walk that filled @p began (owner's
 * lock, or without it: one load of the count): what that walk answered, an
 * entry or none, is still the answer. drc__itree_first_at records that point
 * in @p whatever it answers.
 */
int drc__itree_unchanged(const struct drc__itree *t, const struct drc__itree_path *p);

/* The node at the end of @p if the tree has not changed since the walk that recorded it, else NULL (owner's lock). */
struct drc__itree_node *drc__itree_at(const struct drc__itree *t, const struct drc__itree_path *p);

/*
 * The node with the largest start <= @key (the last of equal starts), or
 * NULL. Where intervals do not overlap, it is the only node that can
 * contain a range starting at @key.
 */
struct drc__itree_node *drc__itree_floor(const struct drc__itree *t, uintptr_t key, int *budget);

/*
 * Check every invariant (order, each inner entry's smallest start and
 * largest last, equal depth of the leaves, their sibling chain, the count)
 * and return the node count, or -1 if one is broken. O(n): for tests,
 * fuzzers and DRC_DEBUG builds.
 */
long drc__itree_check(const struct drc__itree *t);

#define DRC__ITREE_UNBOUNDED (1 << 30)

#endif
