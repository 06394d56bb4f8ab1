/*
 * The interval index (itree.h): a B+ tree of (start, last, node) entries.
 *
 * Leaves hold the entries in start order (equal starts in insertion order)
 * and are chained left to right by `next`. An inner node's entry i holds
 * child i, the smallest start in that child's subtree (key) and the largest
 * last (last), exactly, so that:
 *   - a floor or an insert descends by key, one node per level;
 *   - an overlap query descends to the leftmost child whose largest last
 *     reaches the query's start, and stops at the first key past its last
 *     (every later entry starts later);
 *   - the next overlapping entry is found along the leaf chain.
 * A removal inside a leaf of disjoint intervals leaves its entry dead in
 * place (bt_compact's comment). Nodes split when full and merge with, or
 * borrow from, a sibling when they fall under a quarter (all but the last
 * leaf, which may hold fewer). The last leaf, full, gives an entry at its
 * very end alone to its new sibling, and another node gives that entry and
 * a quarter, so that intervals inserted in address order fill their leaves
 * (a cache fills in address order more often than not).
 *
 * Every store into a node is an atomic word store and every load outside
 * the lock an atomic load, because lockless walks (itree.h) read nodes
 * that a writer is changing; the sequence count decides whether what they
 * read may be followed. Nothing here sleeps or calls out.
 */
#include <stdlib.h>
#include <string.h>

#include "core/cache.h"     /* DRC_ASSERT */
#include "core/itree.h"

enum { F = DRC__ITREE_FAN, LOW = F / 4, MAXH = DRC__ITREE_MAXH };

struct drc__itree_bt {
    unsigned n;                     /* entries, dead ones included; first, in the line of the first keys */
    unsigned short level;           /* 0: leaf */
    unsigned short dead;            /* leaf: entries taken out in place (bt_tomb), ptr NULL */
    struct drc__itree_bt *next;     /* leaf: the next leaf to the right; spare: the next spare */
    uintptr_t key[F];               /* leaf: the entry's start; inner: the child's smallest start */
    uintptr_t last[F];              /* leaf: the entry's last; inner: the child's largest last */
    void *ptr[F];                   /* leaf: a struct drc__itree_node *; inner: a child */
} __attribute__((aligned(64)));

typedef struct drc__itree_bt bt;

_Static_assert(sizeof(bt) == DRC__ITREE_NODE, "itree.h's node size is a node's size");
_Static_assert(F >= 4 && F % 2 == 0 && LOW >= 1, "splits into two of at least LOW");
_Static_assert(F <= 64, "an entry's position fits in a node address's low bits (bt_hint)");

#define LD(x)    __atomic_load_n(&(x), __ATOMIC_RELAXED)
#define ST(x, v) __atomic_store_n(&(x), (v), __ATOMIC_RELAXED)

#if defined(__SANITIZE_THREAD__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wtsan"    /* the fences order the count against atomic loads (cache_int.h) */
#endif

/* ---- the sequence count ---------------------------------------------------- */

static void bt_w_begin(struct drc__itree *t)
{
    ST(t->seq, t->seq + 1);
    __atomic_thread_fence(__ATOMIC_RELEASE);   /* odd before any node store */
    ST(t->finger.leaf, (bt *)NULL);     /* none but the one this window may leave (the count wraps) */
}

static void bt_w_end(struct drc__itree *t)
{
    __atomic_store_n(&t->seq, t->seq + 1, __ATOMIC_RELEASE);
}

/* Has a writer run since @seq was read? Called before a walk follows a pointer it read. */
static inline int bt_moved(const struct drc__itree *t, unsigned seq)
{
    __atomic_thread_fence(__ATOMIC_ACQUIRE);   /* the node loads before the re-read */
    return LD(t->seq) != seq;
}

/* A node's entry count as a lockless walk may read it: never past the arrays. */
static inline unsigned bt_count_of(const bt *b)
{
    unsigned n = LD(b->n);

    return n <= F ? n : F;
}

/* ---- node memory ----------------------------------------------------------- */

void drc__itree_init(struct drc__itree *t, int given)
{
    memset(t, 0, sizeof(*t));
    t->given = given;
}

static unsigned bt_compact(struct drc__itree *t, struct drc__itree_bt *b, unsigned pos);
static void bt_refresh_all(struct drc__itree_bt *b);

void drc__itree_set_disjoint(struct drc__itree *t, int disjoint)
{
    struct drc__itree_bt *b;

    if (disjoint && !t->disjoint && t->root) {
        /*
         * Given again: the inserts since it was taken back kept no order
         * with the dead entries (bt_compact's comment), so none may stay.
         */
        bt_w_begin(t);
        for (b = t->root; b->level; b = b->ptr[0])
            ;
        for (; b; b = b->next)
            bt_compact(t, b, 0);
        bt_refresh_all(t->root);    /* a leaf whose first entry was dead starts later now */
        bt_w_end(t);
    }
    ST(t->disjoint, disjoint);
}

/*
 * A node from malloc (a tree of tests and fuzzers) comes after a line of its
 * own that links it to the tree's others, for drc__itree_fini: the node
 * itself has no room to spare.
 */
struct bt_malloced {
    struct bt_malloced *all;
} __attribute__((aligned(64)));

void drc__itree_fini(struct drc__itree *t)
{
    struct bt_malloced *m, *nx;

    for (m = t->all; m; m = nx) {
        nx = m->all;
        free(m);
    }
    memset(t, 0, sizeof(*t));
}

unsigned drc__itree_need(const struct drc__itree *t)
{
    unsigned want = t->height + 1;      /* a split at every level and a new root */

    return t->nspare >= want ? 0 : want - t->nspare;
}

static void bt_spare_push(struct drc__itree *t, bt *b)
{
    ST(b->n, 0u);
    ST(b->dead, (unsigned short)0);
    ST(b->next, t->spare);
    t->spare = b;
    t->nspare++;
}

void drc__itree_give(struct drc__itree *t, void *mem, size_t size)
{
    char *p = mem;

    for (; size >= sizeof(bt); size -= sizeof(bt), p += sizeof(bt))
        bt_spare_push(t, (bt *)(void *)p);
}

static bt *bt_node_new(struct drc__itree *t, unsigned level)
{
    bt *b = t->spare;

    if (b) {
        t->spare = b->next;
        t->nspare--;
    } else {
        struct bt_malloced *m;

        DRC_ASSERT(!t->given);      /* the owner gives what drc__itree_need() asks */
        m = aligned_alloc(64, sizeof(*m) + sizeof(*b));
        if (!m)
            abort();                /* only trees of tests and fuzzers allocate */
        memset(m, 0, sizeof(*m) + sizeof(*b));
        m->all = t->all;
        t->all = m;
        b = (bt *)(void *)(m + 1);
    }
    for (unsigned j = 0; j < F; j++)
        ST(b->key[j], UINTPTR_MAX);
    ST(b->n, 0u);
    ST(b->level, (unsigned short)level);
    ST(b->dead, (unsigned short)0);
    ST(b->next, (bt *)NULL);
    return b;
}

/* ---- helpers (writer side, or a walk's reads) ------------------------------- */

/*
 * The first entry whose key is >= k (lower), or > k (upper); n if none.
 * A count of the keys at or below k, not a halving: the keys are sorted,
 * so the count is the answer, and its F loads do not depend on each other.
 * A halving (branchless, or it mispredicts at every other step over random
 * keys) chains four loads a level, each waiting for the one before: in a
 * node that is not in cache, two or three of its lines missed one after
 * the other, where the count misses them all at once. The keys past n
 * are UINTPTR_MAX (bt_setn), so the count runs over all F; the answer is
 * clamped to n, for a key of UINTPTR_MAX and for a lockless walk that
 * reads a node in change.
 */
static inline unsigned bt_upper(const bt *b, unsigned n, uintptr_t k)
{
    unsigned i = 0, j;

#pragma GCC unroll 32
    for (j = 0; j < F; j++)
        i += LD(b->key[j]) <= k;
    return i < n ? i : n;
}

/*
 * Ask for every line of a node a descent has just reached. The walk reads
 * its keys, then one entry's last or pointer, which entry the keys decide:
 * in a node that is not in cache, those are two misses one after the
 * other. Asked for together on arrival, they cost one wait. A prefetch
 * never faults, and nodes are never unmapped (the arena), so a lockless
 * walk may ask for a node that a writer has just given back.
 */
static inline void bt_prefetch(const bt *b)
{
    const char *p = (const char *)b;
    size_t o;

#pragma GCC unroll 8
    for (o = 64; o < sizeof(bt); o += 64)
        __builtin_prefetch(p + o);
}

/* Keys are integers: those below k are those at or below k - 1. */
static inline unsigned bt_lower(const bt *b, unsigned n, uintptr_t k)
{
    return k ? bt_upper(b, n, k - 1) : 0;
}

/* Set b's entry count; the keys of the entries it gives up become UINTPTR_MAX (bt_upper). */
static inline void bt_setn(bt *b, unsigned n)
{
    unsigned j;

    for (j = n; j < b->n; j++)
        ST(b->key[j], UINTPTR_MAX);
    ST(b->n, n);
}

static uintptr_t bt_max_last(const bt *b)
{
    uintptr_t m = 0;
    unsigned i;

    for (i = 0; i < b->n; i++)
        if (b->last[i] > m)
            m = b->last[i];
    return m;
}

static inline void bt_set(bt *b, unsigned i, uintptr_t key, uintptr_t last, void *p)
{
    ST(b->key[i], key);
    ST(b->last[i], last);
    ST(b->ptr[i], p);
}

static inline void bt_copy(bt *to, unsigned i, const bt *from, unsigned j)
{
    bt_set(to, i, from->key[j], from->last[j], from->ptr[j]);
}

/* Refresh entry i of inner node b from its child. */
static inline void bt_refresh(bt *b, unsigned i)
{
    const bt *c = b->ptr[i];

    ST(b->key[i], c->key[0]);
    ST(b->last[i], bt_max_last(c));
}

/* Every inner entry of b's subtree, bottom up (drc__itree_set_disjoint). */
static void bt_refresh_all(bt *b)
{
    unsigned i;

    for (i = 0; b->level && i < b->n; i++) {
        bt_refresh_all(b->ptr[i]);
        bt_refresh(b, i);
    }
}

/*
 * What an insert answers (drc__itree_insert, drc__itree_insert_at): the leaf
 * and the entry's position in it, in the low bits of the leaf's address
 * (nodes are 64-byte aligned). Its owner keeps it, opaque, and gives it
 * back to drc__itree_remove_in, which checks both parts.
 */
static inline bt *bt_hint(bt *leaf, unsigned pos)
{
    return (bt *)((uintptr_t)leaf | pos);
}

static inline bt *bt_hint_leaf(const struct drc__itree_bt *h)
{
    return (bt *)((uintptr_t)h & ~(uintptr_t)63);
}

static inline unsigned bt_hint_pos(const struct drc__itree_bt *h)
{
    return (unsigned)((uintptr_t)h & 63);
}

/*
 * Dead entries. A removal from a leaf of disjoint intervals of any entry
 * but the tree's largest (bt_tomb_ok) clears the entry's pointer and
 * counts it in the leaf's `dead` instead of moving every entry after it:
 * one line written, not the three arrays' tails (a removal by handle in a
 * large cache missed on most of the leaf's seven lines), and no climb.
 * The dead entry keeps its key and last, so the node above keeps the
 * leaf's first start exactly (a dead first entry's), and a largest last
 * at or above the largest of what is left: the inner `last`s are bounds,
 * exact when written, that a dead entry dropped since may leave high (an
 * overlap walk that goes down where nothing reaches its start backs up;
 * the walk of disjoint intervals does not read them). Walks skip dead
 * entries, and a leaf always has live ones: LOW, the root and the last
 * leaf one.
 *
 * What a walk of disjoint intervals relies on: every dead entry starts
 * after every live entry before it ends. Then, when the floor of a key
 * (among all entries) is dead, no live entry before it reaches the key,
 * and the answer can only be the next live entry. It holds when an entry
 * dies: the live ones before it were live together with it, disjoint.
 * Removals only take live entries away. An insert of x keeps it if no
 * entry after x's place starts within x: bt_room drops the dead entries of
 * x's leaf if one after x's place does, and the next leaf's if x ends its
 * leaf and that one's first entry, dead, does (bt_compact_next); a live
 * entry after x starts past x's end, or it would overlap x, and so does
 * every entry after that one. While the promise is taken back, inserts
 * keep no such order, so a promise given again drops every dead entry
 * (drc__itree_set_disjoint).
 *
 * Dropping a dead first entry changes the leaf's first start, which the
 * node above keeps: every writer that drops dead entries carries it up.
 * The climbs of inserts and removals compare it (drc__itree_insert_at,
 * bt_remove_path, and bt_ins, bt_rm, which always climb), bt_compact_next
 * climbs the path to the next leaf, a merge or a borrow refreshes both
 * entries above, a promise given again refreshes every inner node, and an
 * insert into a dead first entry (bt_put_dead) climbs as any insert that
 * changed its leaf's first start. drc__itree_floor, which answers a live
 * start, goes back to the leaf before when a leaf's entries up to its key
 * are all dead. drc__itree_check checks all of this.
 */

/*
 * Drop b's dead entries (a leaf's, in a writer's window). Returns where
 * entry @pos, live or b->n, is now.
 */
static unsigned bt_compact(struct drc__itree *t, bt *b, unsigned pos)
{
    unsigned i, j = 0, at = pos;

    if (!b->dead)
        return pos;
    t->dead -= b->dead;
    for (i = 0; i < b->n; i++) {
        if (i == pos)
            at = j;
        if (!b->ptr[i])
            continue;
        if (j != i)
            bt_copy(b, j, b, i);
        j++;
    }
    if (pos >= b->n)
        at = j;
    bt_setn(b, j);
    ST(b->dead, (unsigned short)0);
    return at;
}

/*
 * The @depth levels above @leaf, from the root, of the path to it (a
 * writer's, which has the leaf but not that path): a descent by @first,
 * the leaf's first start as the level above holds it (inner keys are
 * exact, and starts unique while intervals are disjoint).
 */
static void bt_path_above(const struct drc__itree *t, const bt *leaf, uintptr_t first, bt **node, unsigned *idx,
                          unsigned depth)
{
    bt *b = t->root;
    unsigned d, i;

    for (d = 0; d < depth; d++) {
        i = bt_upper(b, b->n, first);
        node[d] = b;
        idx[d] = i = i ? i - 1 : 0;
        b = b->ptr[i];
    }
    DRC_ASSERT(b == leaf);
    (void)leaf;
}

/*
 * Drop the dead entries of leaf @nx (a writer's window), which is not on
 * the caller's path, and carry its new first start up the path to it,
 * found by its first start before the drop.
 */
static void bt_compact_next(struct drc__itree *t, bt *nx)
{
    bt *node[MAXH], *c;
    unsigned idx[MAXH], d = t->height - 1;

    bt_path_above(t, nx, nx->key[0], node, idx, d);
    bt_compact(t, nx, 0);
    while (d-- > 0) {
        c = node[d]->ptr[idx[d]];
        if (node[d]->key[idx[d]] == c->key[0])
            break;
        ST(node[d]->key[idx[d]], c->key[0]);
    }
}

/*
 * Where x goes in leaf b, given its place @i among all entries: the same,
 * or, after b drops its dead entries, among the live ones. They go if an
 * entry after x's place starts within x, and the next leaf's go if x ends
 * b and its first entry, dead, starts within x: so that every dead entry
 * still starts after every live entry before it ends (bt_compact's
 * comment).
 */
static inline unsigned bt_room(struct drc__itree *t, bt *b, unsigned i, const struct drc__itree_node *x)
{
    if (b->dead && i < b->n && b->key[i] <= x->last)
        i = bt_compact(t, b, i);
    if (i == b->n && b->next && b->next->dead && b->next->key[0] <= x->last)
        bt_compact_next(t, b->next);    /* x's successor is the next leaf's first entry, dead */
    return i;
}

/*
 * Put (key, last, p) at place i of leaf b, which has dead entries: into the
 * dead entry nearest to i, moving the entries between them by one, so that
 * the leaf takes it without growing, splitting or moving more. A region
 * registered again where it died (the same start) goes into its own dead
 * entry, the floor of its start, with nothing moved. The leaf's first
 * start may change (a dead first entry taken): the caller climbs if it
 * did. Returns where it went.
 */
static unsigned bt_put_dead(struct drc__itree *t, bt *b, unsigned i, uintptr_t key, uintptr_t last, void *p)
{
    unsigned l = i, r = i, j;

    for (;;) {
        if (l > 0 && !b->ptr[--l]) {            /* before i: the entries after it move left */
            for (j = l; j + 1 < i; j++)
                bt_copy(b, j, b, j + 1);
            i--;
            break;
        }
        if (r < b->n && !b->ptr[r]) {           /* at or after i: the entries up to it move right */
            for (j = r; j > i; j--)
                bt_copy(b, j, b, j - 1);
            break;
        }
        if (r < b->n)
            r++;
        DRC_ASSERT(l || r < b->n);     /* b->dead counts entries of [0, n) */
    }
    bt_set(b, i, key, last, p);
    ST(b->dead, (unsigned short)(b->dead - 1));
    t->dead--;
    return i;
}

/*
 * Put (key, last, p) at position i of b (a leaf with dead entries: in the
 * nearest, bt_put_dead). If b is full, split it and return the new right
 * sibling (its level and leaf link set), else NULL. *at, if @at is given:
 * the node the entry went into, b or the sibling, and its place (bt_hint).
 */
static bt *bt_put(struct drc__itree *t, bt *b, unsigned i, uintptr_t key, uintptr_t last, void *p, bt **at)
{
    unsigned n = b->n, j, h;
    bt *r;

    if (b->dead) {
        i = bt_put_dead(t, b, i, key, last, p);
        if (at)
            *at = bt_hint(b, i);
        return NULL;
    }
    if (n < F) {
        for (j = n; j > i; j--)
            bt_copy(b, j, b, j - 1);
        bt_set(b, i, key, last, p);
        bt_setn(b, n + 1);
        if (at)
            *at = bt_hint(b, i);
        return NULL;
    }
    r = bt_node_new(t, b->level);
    /*
     * An entry at the very end, so that address-order fills pack their
     * nodes: the tree's last leaf keeps all it has and its new sibling, the
     * last leaf now, takes that entry alone; any other node gives LOW of its
     * entries, so that every node but the root and the last leaf keeps at
     * least LOW. The last leaf may hold fewer: it has a sibling to merge
     * with or borrow from (its parent has two entries or more: it took the
     * leaf beside the one that split, or it too keeps LOW), and it is never
     * the left one of the two (bt_fix). An inner node keeps LOW even at the
     * end: one with a single child could not fix that child.
     */
    h = i != F ? F / 2 : b->level || b->next ? F - LOW + 1 : F;
    for (j = h; j < F; j++)
        bt_copy(r, j - h, b, j);
    bt_setn(r, F - h);
    bt_setn(b, h);
    if (i <= h && i < F)
        bt_put(t, b, i, key, last, p, at);
    else
        bt_put(t, r, i - h, key, last, p, at);
    if (!b->level) {
        ST(r->next, b->next);
        ST(b->next, r);
    }
    return r;
}

/* The new root above a root that split into itself and @nb. */
static void bt_grow(struct drc__itree *t, bt *nb)
{
    bt *root = bt_node_new(t, t->height);

    bt_set(root, 0, t->root->key[0], bt_max_last(t->root), t->root);
    bt_set(root, 1, nb->key[0], bt_max_last(nb), nb);
    bt_setn(root, 2u);
    ST(t->height, t->height + 1);
    ST(t->root, root);
}

/* ---- insert ------------------------------------------------------------------ */

/*
 * (bt_inserted and bt_removed are inlined: out of line, the bottom-up loops
 * of a path paid a call per level.)
 *
 * After x went into the subtree of b's entry i (child c): that entry's
 * smallest start and largest last, and, if c split off @nb, nb beside it.
 * Returns b's own new sibling if b split in turn, else NULL, then with
 * *settled 1 if the entry did not change (the levels above need nothing).
 */
static inline __attribute__((always_inline)) bt *bt_inserted(struct drc__itree *t, bt *b, unsigned i, const struct drc__itree_node *x, bt *nb,
                                                           int *settled)
{
    const bt *c = b->ptr[i];
    int same = 1;

    *settled = 0;
    if (b->key[i] != c->key[0]) {
        ST(b->key[i], c->key[0]);
        same = 0;
    }
    if (x->last > b->last[i]) {
        ST(b->last[i], x->last);
        same = 0;
    }
    if (!nb) {
        *settled = same;    /* b's smallest start and largest last are as they were: so is every level above */
        return NULL;
    }
    bt_refresh(b, i);      /* the largest last may have moved to the new sibling */
    return bt_put(t, b, i + 1, nb->key[0], bt_max_last(nb), nb, NULL);
}

/* @append: x starts at or after every start in the tree: it goes at the end of each node, no search. */
static bt *bt_ins(struct drc__itree *t, bt *b, struct drc__itree_node *x, int append, bt **at)
{
    unsigned i = append ? b->n : bt_upper(b, b->n, x->start);
    bt *nb;

    if (!b->level)
        return bt_put(t, b, bt_room(t, b, i, x), x->start, x->last, x, at);
    int settled;

    i = i ? i - 1 : 0;     /* the last child whose smallest start is <= x's, or the first */
    bt_prefetch(b->ptr[i]);
    nb = bt_ins(t, b->ptr[i], x, append, at);
    return bt_inserted(t, b, i, x, nb, &settled);
}

struct drc__itree_bt *drc__itree_insert(struct drc__itree *t, struct drc__itree_node *x)
{
    bt *b, *nb;

    bt_w_begin(t);
    if (!t->root) {
        b = bt_node_new(t, 0);
        bt_set(b, 0, x->start, x->last, x);
        bt_setn(b, 1u);
        ST(t->height, 1u);
        ST(t->root, b);
    } else {
        nb = bt_ins(t, t->root, x, x->start >= t->max->start, &b);
        if (nb)
            bt_grow(t, nb);
    }
    if (!t->max || x->start >= t->max->start)
        ST(t->max, x);
    t->count++;
    bt_w_end(t);
    return b;
}

/*
 * Is entry @pos of a leaf of @n entries neither its first nor its last, in a
 * tree of disjoint intervals? Then an insert or removal there leaves every
 * level above as it was: the leaf's smallest start is another entry's, and
 * the bound above on its largest last holds (an interval inserted there
 * ends before the next entry starts; a removal lowers nothing). The climb
 * that would find each level unchanged (bt_inserted, bt_removed) reads
 * each parent's `last` line, which the descent did not, a cache miss in a
 * large tree: it is skipped.
 */
static inline int bt_inside(const struct drc__itree *t, unsigned pos, unsigned n)
{
    return pos > 0 && pos + 1 < n && LD(t->disjoint);
}

/* The same for a removal from a leaf of @n entries, which must also keep LOW without it (no underflow). */
static inline int bt_cut_inside(const struct drc__itree *t, unsigned pos, unsigned n)
{
    return bt_inside(t, pos, n) && n - 1 >= LOW;
}

/*
 * May entry @pos of @leaf die in place (bt_compact's comment)? Not the
 * tree's largest (t->max), in a tree of disjoint intervals, and LOW live
 * entries stay.
 */
static inline int bt_tomb_ok(const struct drc__itree *t, const bt *leaf, unsigned pos)
{
    return leaf->n - leaf->dead - 1u >= (unsigned)LOW && LD(t->disjoint) && leaf->ptr[pos] != t->max;
}

/* Entry @pos of @leaf dies (bt_tomb_ok): its pointer only. */
static inline void bt_tomb(struct drc__itree *t, bt *leaf, unsigned pos)
{
    ST(leaf->ptr[pos], NULL);
    ST(leaf->dead, (unsigned short)(leaf->dead + 1));
    t->dead++;
}

/*
 * Along the path of a walk from x's start (bt_first_disjoint), valid while
 * the count has not moved: each node d of it is the child of entry idx[d-1]
 * of node d - 1, the one an insert of x descends to. Bottom up, as bt_ins()
 * unwinds.
 */
struct drc__itree_bt *drc__itree_insert_at(struct drc__itree *t, struct drc__itree_node *x,
                                           const struct drc__itree_path *p)
{
    bt *found[MAXH], *const *node = p ? p->node : NULL;
    unsigned d, pos, at_idx[MAXH];
    const unsigned *idx = p ? p->idx : NULL;
    bt *leaf, *nb, *at;
    uintptr_t first;
    int settled;

    if (!p || !p->seek || !p->depth || p->seq != t->seq || p->depth != t->height || p->key != x->start)
        return drc__itree_insert(t, x);
    bt_w_begin(t);
    d = p->depth - 1;
    leaf = p->node[d];
    first = leaf->key[0];
    pos = bt_room(t, leaf, p->at, x);   /* the walk's count of the leaf's keys: nothing changed since */
    nb = bt_put(t, leaf, pos, x->start, x->last, x, &at);
    if (!nb && bt_inside(t, bt_hint_pos(at), leaf->n) && leaf->key[0] == first)
        d = 0;      /* the levels above are as they were: no climb (bt_inside; its first start stayed) */
    else if (d && p->leafonly) {
        bt_path_above(t, leaf, first, found, at_idx, d);
        node = found;
        idx = at_idx;
    }
    for (; d > 0; d--) {
        nb = bt_inserted(t, node[d - 1], idx[d - 1], x, nb, &settled);
        if (!nb && settled)
            break;
    }
    if (nb)
        bt_grow(t, nb);
    if (x->start >= t->max->start)
        ST(t->max, x);
    t->count++;
    bt_w_end(t);
    return at;
}

/* ---- remove ------------------------------------------------------------------ */

/* Take entry i out of b. */
static void bt_cut(bt *b, unsigned i)
{
    unsigned j;

    for (j = i; j + 1 < b->n; j++)
        bt_copy(b, j, b, j + 1);
    bt_setn(b, b->n - 1);
}

/* Child i of inner node b has fewer than LOW entries: merge it with a sibling, or borrow from one. */
static void bt_fix(struct drc__itree *t, bt *b, unsigned i)
{
    unsigned li = i + 1 < b->n ? i : i - 1, j, total, want;
    bt *l = b->ptr[li], *r = b->ptr[li + 1];

    bt_compact(t, l, 0);
    bt_compact(t, r, 0);
    total = l->n + r->n;
    if (total <= F) {
        for (j = 0; j < r->n; j++)
            bt_copy(l, l->n + j, r, j);
        bt_setn(l, total);
        if (!l->level)
            ST(l->next, r->next);
        bt_cut(b, li + 1);
        bt_refresh(b, li);
        bt_spare_push(t, r);
        return;
    }
    want = total / 2;
    if (l->n < want) {          /* move r's first entries to l's end */
        unsigned k = want - l->n;

        for (j = 0; j < k; j++)
            bt_copy(l, l->n + j, r, j);
        bt_setn(l, want);
        for (j = 0; j + k < r->n; j++)
            bt_copy(r, j, r, j + k);
        bt_setn(r, r->n - k);
    } else {                    /* move l's last entries to r's front */
        unsigned k = l->n - want;

        for (j = r->n; j-- > 0;)
            bt_copy(r, j + k, r, j);
        for (j = 0; j < k; j++)
            bt_copy(r, j, l, want + j);
        bt_setn(r, r->n + k);
        bt_setn(l, want);
    }
    bt_refresh(b, li);
    bt_refresh(b, li + 1);
}

/*
 * After x left the subtree of b's entry i (child c): merge or refill c if
 * it fell under LOW (b has a sibling for it: an inner node has 2 entries
 * or more), else that entry's smallest start and, if x was its largest
 * last, the new one. 1 if no node changed shape; *settled 1 if the entry
 * did not change either (the levels above need nothing).
 */
static inline __attribute__((always_inline)) int bt_removed(struct drc__itree *t, bt *b, unsigned i, const struct drc__itree_node *x,
                                                          int *settled)
{
    const bt *c = b->ptr[i];

    *settled = 0;
    if (c->n < LOW) {
        bt_fix(t, b, i);
        return 0;
    }
    if (b->key[i] != c->key[0])
        ST(b->key[i], c->key[0]);
    else if (x->last != b->last[i])
        *settled = 1;       /* the entry is as it was: so is every level above */
    if (x->last == b->last[i])
        ST(b->last[i], bt_max_last(c));    /* x may have been the largest: else it stays */
    return 1;
}

/* Remove x from b's subtree: 1 if it was there. */
static int bt_rm(struct drc__itree *t, bt *b, const struct drc__itree_node *x)
{
    uintptr_t k = x->start;
    unsigned i = bt_lower(b, b->n, k);
    int settled;

    if (!b->level) {
        bt_compact(t, b, 0);
        for (i = bt_lower(b, b->n, k); i < b->n && b->key[i] == k; i++)
            if (b->ptr[i] == x) {
                bt_cut(b, i);
                return 1;
            }
        return 0;
    }
    /* equal starts may span children: every child whose range can hold k, from the left */
    for (i = i ? i - 1 : 0; i < b->n && b->key[i] <= k; i++) {
        if (!bt_rm(t, b->ptr[i], x))
            continue;
        bt_removed(t, b, i, x, &settled);
        return 1;
    }
    return 0;
}

int drc__itree_unchanged(const struct drc__itree *t, const struct drc__itree_path *p)
{
    return !(p->seq & 1) && p->seq == LD(t->seq);     /* also read without the lock (get_slow's announce) */
}

struct drc__itree_node *drc__itree_at(const struct drc__itree *t, const struct drc__itree_path *p)
{
    const bt *leaf;

    if (!p || !p->depth || p->seq != t->seq || p->depth != t->height)
        return NULL;
    leaf = p->node[p->depth - 1];
    return p->idx[p->depth - 1] < leaf->n ? leaf->ptr[p->idx[p->depth - 1]] : NULL;
}

/* The entry with the largest start: the last of the rightmost leaf (owner's lock). */
static struct drc__itree_node *bt_last_entry(const struct drc__itree *t)
{
    const bt *b = t->root;

    if (!b)
        return NULL;
    while (b->level)
        b = b->ptr[b->n - 1];
    return b->ptr[b->n - 1];
}

/*
 * Take out entry idx of the path's leaf, bottom up, as bt_rm() unwinds. 1
 * if no node was merged, borrowed from or freed: the path then still leads
 * to the leaf, whose entry idx is now x's successor there (if it has one).
 */
static int bt_remove_path(struct drc__itree *t, struct drc__itree_node *x, struct drc__itree_path *p)
{
    bt *leaf = p->node[p->depth - 1];
    unsigned d, pos = p->idx[p->depth - 1];
    uintptr_t first = leaf->key[0];
    int same = 1, settled, inside;

    if (bt_tomb_ok(t, leaf, pos)) {
        bt_tomb(t, leaf, pos);
        while (++pos < leaf->n && !leaf->ptr[pos])
            ;       /* the successor, if it is in this leaf */
        p->idx[p->depth - 1] = pos;
        return 1;
    }
    p->idx[p->depth - 1] = pos = bt_compact(t, leaf, pos);
    inside = bt_cut_inside(t, pos, leaf->n) && leaf->key[0] == first;     /* no level above changes */
    bt_cut(leaf, pos);
    for (d = inside ? 0 : p->depth - 1; d > 0; d--) {
        same &= bt_removed(t, p->node[d - 1], p->idx[d - 1], x, &settled);
        if (settled)
            break;
    }
    return same;
}

/*
 * The path to x by a descent on its start (owner's lock): at each level the
 * last child whose smallest start is at or before it, then x in the leaf.
 * 0 if x is not in that leaf (equal starts spanning leaves: bt_rm then).
 */
static int bt_seek(const struct drc__itree *t, const struct drc__itree_node *x, struct drc__itree_path *p)
{
    bt *b = t->root;
    unsigned d = 0, i;

    for (; b->level && d + 1 < MAXH; d++) {
        i = bt_upper(b, b->n, x->start);
        p->node[d] = b;
        p->idx[d] = i ? i - 1 : 0;
        b = b->ptr[p->idx[d]];
        bt_prefetch(b);
    }
    i = bt_upper(b, b->n, x->start);
    if (i && b->ptr[i - 1] == x)
        i--;                            /* the last of its start: every start, while they are unique */
    else                                /* among equal starts */
        for (i = bt_lower(b, b->n, x->start); i < b->n && b->key[i] == x->start && b->ptr[i] != x; i++)
            ;
    if (i >= b->n || b->ptr[i] != x)
        return 0;
    p->node[d] = b;
    p->idx[d] = i;
    p->depth = d + 1;
    p->seek = 0;
    p->fingered = 0;
    p->leafonly = 0;
    return 1;
}

/*
 * Inside a removal's window that changed no node's shape: the path it left
 * @p at (the removed entry's successor, or its leaf's end) becomes the
 * finger, for the count the window ends at. Only the first removal along
 * a caller's walk, at a leaf's edge or after a walk that began at the
 * finger, leaves one: those are the removals of memory freed in order (the
 * first entry, then the next one). A removal inside a leaf, in random
 * order, or the rest of a run along one path (one event over many entries)
 * copies no path. A path whose levels above the leaf are the finger's
 * (fingered: its walk began there) writes only the leaf's part. A walk
 * that reads the finger while it is written began before the window: the
 * count it checks before it follows the leaf has moved (bt_finger).
 */
static void bt_finger_set(struct drc__itree *t, struct drc__itree_path *p)
{
    bt *leaf = p->node[p->depth - 1];
    unsigned d, pos = p->idx[p->depth - 1];     /* the successor's: n, or after dead ones only, at an edge */
    uintptr_t hi;

    if (!leaf->n || leaf->level)
        return;
    for (d = pos; d > 0 && !leaf->ptr[d - 1]; d--)
        ;           /* back over x's entry and the dead ones before it, lines the removal read */
    if (!p->fingered && d && pos < leaf->n)
        return;     /* x was inside its leaf, in a walk that descended: random order, most likely */
    if (!p->fingered) {
        for (d = 0; d + 1 < p->depth; d++) {
            ST(t->finger.node[d], p->node[d]);
            ST(t->finger.idx[d], p->idx[d]);
        }
        p->fingered = 1;    /* now they are */
    }
    /* up to the next leaf's first start: the first key to the right along the path (inner keys are exact) */
    for (hi = UINTPTR_MAX, d = p->depth - 1; d-- > 0;)
        if (p->idx[d] + 1 < p->node[d]->n) {
            hi = p->node[d]->key[p->idx[d] + 1] - 1;
            break;
        }
    ST(t->finger.lo, leaf->key[0]);
    ST(t->finger.hi, hi);
    ST(t->finger.depth, p->depth);
    ST(t->finger.seq, t->seq + 1);      /* bt_w_end's */
    ST(t->finger.leaf, leaf);
}

void drc__itree_remove(struct drc__itree *t, struct drc__itree_node *x)
{
    (void)drc__itree_remove_at(t, x, NULL);
}

/*
 * Where the leaf x's insert answered still holds x, and x may die there
 * (bt_tomb_ok: not the tree's largest, in a tree of disjoint intervals,
 * and LOW live entries stay), x dies with no descent
 * and no climb; at the place the insert answered, with no search of the
 * leaf either, if it is still there. Since then the leaf may have split,
 * merged or borrowed, or gone back to the spare nodes and come out again
 * at another level: the hint is a node's memory all the same (nodes are
 * never freed while the tree lives), and it holds x only if x is among its
 * entries. A spare node has none, and x is in one leaf only, so finding it
 * there is enough. A split moves the upper entries to a new leaf on the
 * right, which none of their regions hears of: past the leaf's last entry,
 * x is looked for in the next leaf too, once (in a random-order workload
 * at 262,144 regions, a fifth of the removals found their region there).
 */
struct drc__itree_bt *drc__itree_remove_in(struct drc__itree *t, struct drc__itree_node *x,
                                           struct drc__itree_bt *hint)
{
    bt *leaf = bt_hint_leaf(hint);
    unsigned pos = bt_hint_pos(hint);

    if (!leaf || leaf->level || !leaf->n)
        goto descend;
    /* x in one entry of one leaf: if it is that one, x is still where its insert put it */
    if (pos >= leaf->n || leaf->ptr[pos] != x) {
        pos = bt_upper(leaf, leaf->n, x->start);    /* starts are unique: x is the last at or before its own */
        if (pos == leaf->n && leaf->ptr[pos - 1] != x && leaf->next) {
            /*
             * x starts after every entry here: a split since moved it right,
             * most likely to the leaf that split made, this one's next. A
             * leaf with entries is in the tree (a spare has none), and so is
             * the leaf after it; x is among that one's entries or not.
             */
            leaf = leaf->next;
            bt_prefetch(leaf);
            pos = bt_upper(leaf, leaf->n, x->start);
        }
        if (!pos || leaf->ptr[pos - 1] != x)
            goto descend;
        pos--;
    }
    if (bt_tomb_ok(t, leaf, pos)) {
        bt_w_begin(t);
        bt_tomb(t, leaf, pos);
        t->count--;
        bt_w_end(t);
        return leaf;
    }
descend:
    return drc__itree_remove_at(t, x, NULL);
}

/*
 * Along the path of a walk (drc__itree_first_at) if it holds, else along
 * one found by a descent. Afterwards *p, if given, leads to x's successor
 * in its leaf when no node changed shape (drc__itree_at), else holds no
 * path: a caller taking out a run of entries walks along it.
 */
struct drc__itree_bt *drc__itree_remove_at(struct drc__itree *t, struct drc__itree_node *x,
                                           struct drc__itree_path *p)
{
    struct drc__itree_path own;
    bt *root, *leaf = NULL;
    int same;

    if (!p) {
        p = &own;
        own.depth = 0;
    }
    if (p->depth && p->leafonly &&
        !(drc__itree_at(t, p) == x && bt_tomb_ok(t, p->node[p->depth - 1], p->idx[p->depth - 1])))
        p->depth = 0;   /* only a removal that changes no level above goes along a leaf alone */
    if (drc__itree_at(t, p) != x && !(t->root && bt_seek(t, x, p))) {
        int found;

        bt_w_begin(t);      /* equal starts across leaves: the recursive search */
        found = t->root && bt_rm(t, t->root, x);
        DRC_ASSERT(found);
        (void)found;
        same = 0;
    } else {
        bt_w_begin(t);
        same = bt_remove_path(t, x, p);
        leaf = p->node[p->depth - 1];
    }
    root = t->root;
    if (root && root->level && root->n == 1) {
        ST(t->root, (bt *)root->ptr[0]);
        ST(t->height, t->height - 1);
        bt_spare_push(t, root);
        same = 0;
    } else if (root && !root->n) {
        ST(t->root, (bt *)NULL);
        ST(t->height, 0u);
        bt_spare_push(t, root);
        same = 0;
    }
    if (t->max == x)
        ST(t->max, bt_last_entry(t));
    t->count--;
    if (p != &own && p->walked) {
        if (same && !p->leafonly)
            bt_finger_set(t, p);    /* a caller's walk found x: the next walk may be for its successor */
        p->walked = 0;              /* a run along it (one event over many entries) leaves none */
    }
    bt_w_end(t);
    p->seq = t->seq;        /* the path holds across this removal if no node changed shape */
    if (!same)
        p->depth = 0;
    return same ? leaf : NULL;
}

/* ---- walks (with or without the lock) ----------------------------------------- */

/*
 * Start a walk: the root, or NULL for an empty tree (then *seqp is
 * meaningless) or a writer at work (*budget set to 0).
 */
static inline const bt *bt_walk_root(const struct drc__itree *t, unsigned *seqp, int *budget)
{
    unsigned seq = __atomic_load_n(&t->seq, __ATOMIC_ACQUIRE);
    const bt *b;

    *seqp = seq;
    if (seq & 1) {
        *budget = 0;
        return NULL;
    }
    b = LD(t->root);
    if (bt_moved(t, seq)) {
        *budget = 0;
        return NULL;
    }
    return b;
}

static inline struct drc__itree_node *bt_gave_up(int *budget)
{
    *budget = 0;
    return NULL;
}

/*
 * Step a walk along the leaf chain: 1 with *b the next leaf, 0 after the
 * last leaf, -1 if the walk must give up (a writer ran, the budget ran
 * out, or the leaf read is empty: one in change).
 */
static inline int bt_next_leaf(const struct drc__itree *t, unsigned seq, const bt **b, int *budget)
{
    const bt *p = LD((*b)->next);

    if (bt_moved(t, seq) || --*budget <= 0)
        return -1;
    if (!p)
        return 0;
    bt_prefetch(p);
    if (!bt_count_of(p))
        return -1;
    *b = p;
    return 1;
}

/*
 * Down to the leaf a descent for key reaches, then back from key's place
 * over dead entries to a live one. A leaf whose entries up to key are all
 * dead (its first ones) sends the walk back along its path to the subtree
 * before, and down its right edge to that leaf's last live entry.
 */
struct drc__itree_node *drc__itree_floor(const struct drc__itree *t, uintptr_t key, int *budget)
{
    struct { const bt *b; unsigned i; } up[MAXH];
    unsigned seq, i, n, d = 0;
    const bt *b = bt_walk_root(t, &seq, budget);
    struct drc__itree_node *m;
    void *p = NULL;

    if (b && (m = LD(t->max)) && key >= LD(m->start))
        return bt_moved(t, seq) ? bt_gave_up(budget) : m;   /* at or past the largest start: no descent */
    if (!b)
        return NULL;
    for (;;) {
        if (--*budget <= 0 || d >= MAXH)
            return bt_gave_up(budget);
        n = bt_count_of(b);
        i = bt_upper(b, n, key);
        if (!LD(b->level))
            break;
        p = i ? LD(b->ptr[i - 1]) : NULL;
        /* every load that decides what p is comes before the check: p is used only if it passes */
        if (bt_moved(t, seq))
            return bt_gave_up(budget);
        if (!i)
            return NULL;    /* every start in b is past key */
        up[d].b = b;
        up[d++].i = i - 1;
        b = p;
        bt_prefetch(b);
    }
    for (;;) {
        while (i > 0 && !(p = LD(b->ptr[i - 1])))
            i--;            /* a dead entry: the live one before it */
        if (i > 0)
            return bt_moved(t, seq) ? bt_gave_up(budget) : p;
        while (d > 0 && !up[d - 1].i)
            d--;
        if (!d)
            return bt_moved(t, seq) ? bt_gave_up(budget) : NULL;
        b = up[d - 1].b;    /* the child before the one the walk went down, then its right edge */
        i = --up[d - 1].i;
        for (;;) {
            p = LD(b->ptr[i]);
            if (bt_moved(t, seq) || --*budget <= 0 || d >= MAXH)
                return bt_gave_up(budget);
            b = p;
            bt_prefetch(b);
            n = bt_count_of(b);
            if (!LD(b->level))
                break;
            if (!n)
                return bt_gave_up(budget);  /* a node in change */
            i = n - 1;
            up[d].b = b;
            up[d++].i = i;
        }
        i = n;
    }
}

struct drc__itree_node *drc__itree_first(const struct drc__itree *t, uintptr_t start, uintptr_t last,
                                         int *budget)
{
    return drc__itree_first_at(t, start, last, budget, NULL);
}

/*
 * The finger's leaf (struct drc__itree), if the tree is as the removal that
 * left it there left it (its count is the walk's @seq) and @start lies
 * between the leaf's first start and the next leaf's: the floor of start
 * is then in that leaf (every earlier start is in an earlier leaf, every
 * later one in a later leaf), the leaf a descent for start reaches, along
 * the finger's path, which goes to @path (levels above the leaf; *depth is
 * the leaf's). NULL: walk from the root. The leaf is followed only after
 * the count is checked, as every pointer a walk follows (a finger read
 * while a window rewrote it fails that check); its entries are read as
 * any node's, and answer only if the count holds to the end.
 */
static inline const bt *bt_finger(const struct drc__itree *t, unsigned seq, uintptr_t start,
                                  struct drc__itree_path *path, unsigned *depth)
{
    const bt *b = LD(t->finger.leaf);
    unsigned d, k;

    if (!b || LD(t->finger.seq) != seq || LD(t->finger.lo) > start || LD(t->finger.hi) < start)
        return NULL;
    d = LD(t->finger.depth);
    if (bt_moved(t, seq) || !d || d > MAXH)
        return NULL;
    if (path) {
        for (k = 0; k + 1 < d; k++) {
            path->node[k] = LD(t->finger.node[k]);
            path->idx[k] = LD(t->finger.idx[k]);
        }
        path->fingered = 1;
    }
    *depth = d - 1;
    return b;
}

/*
 * A test's seam: after bt_near answered a leaf, before the walk uses the
 * height read for it (test_itree empties the tree there); nothing in the
 * product.
 */
#ifndef ITREE_NEAR_WINDOW
#define ITREE_NEAR_WINDOW() ((void)0)
#endif

/*
 * Leaf @b, if the floor of @start is there while the count is @seq: a leaf
 * of the tree (a spare has no entries), whose first start is at or before
 * @start, and which holds an entry past it or is followed by a leaf that
 * starts past it (or by none). Every start in an earlier leaf is at or
 * before its first, every start in a later one past the entry past @start:
 * the floor is among its entries. NULL: walk from the root. @b is any
 * node's memory (a hint kept since it was a leaf: nodes are never freed);
 * what is read of it counts only if the count holds.
 */
static inline const bt *bt_near(const struct drc__itree *t, unsigned seq, const bt *b, uintptr_t start)
{
    const bt *nx;
    unsigned n;

    bt_prefetch(b);
    n = bt_count_of(b);
    if (!n || LD(b->level) || LD(b->key[0]) > start)
        return NULL;
    if (LD(b->key[n - 1]) <= start) {
        nx = LD(b->next);
        if (bt_moved(t, seq) || (nx && LD(nx->key[0]) <= start))
            return NULL;
    }
    return bt_moved(t, seq) ? NULL : b;
}

/*
 * The overlap query of disjoint intervals: an entry that starts before the
 * last one starting at or before `start` (its floor) ends before that one
 * starts, so only the floor and the entries after it can overlap. The
 * walk goes down to the floor's leaf as an insert of `start` would (the
 * path it records is also that insert's), then takes the floor if it
 * reaches `start`, else the next entry if it starts by `last`.
 */
static struct drc__itree_node *bt_first_disjoint(const struct drc__itree *t, unsigned seq, const bt *b,
                                                 uintptr_t start, uintptr_t last, int *budget,
                                                 struct drc__itree_path *path, const bt *near)
{
    const struct drc__itree_node *m = LD(t->max);
    unsigned depth = 0, i, n, level;
    /* first: memory freed top down leaves it at the right edge's leaf */
    const bt *f = bt_finger(t, seq, start, path, &depth);
    /*
     * At or past the largest start (a cache filled in address order asks
     * there at every miss): the walk and its path follow the right edge,
     * no search. m is an owner's node, never freed; what is read of it is
     * used only if the count has not moved (checked below, before any
     * pointer is followed), and while m is in the tree its start is constant.
     */
    int edge = !f && m && start >= LD(m->start);
    void *p;

    if (path) {
        path->leafonly = 0;
        if (!f)
            path->fingered = 0;
    }
    if (!f && !edge && near) {
        /*
         * The height is read before bt_near's last look at the count, so
         * that it is the tree's whose leaf bt_near answered (at least 1).
         * Read after, it may be a writer's that has emptied the tree since:
         * 0, and a depth of -1 would index the path (test_itree).
         */
        unsigned h = LD(t->height);

        if (h && h <= MAXH && (f = bt_near(t, seq, near, start))) {
            ITREE_NEAR_WINDOW();
            depth = h - 1;
            if (path)
                path->leafonly = depth > 0;
        }
    }
    for (;;) {
        if (f) {                    /* the floor of start is in the finger's leaf: no descent */
            b = f;
            n = bt_count_of(b);
            i = bt_upper(b, n, start);
            break;
        }
        n = bt_count_of(b);
        i = edge ? n : bt_upper(b, n, start);
        level = LD(b->level);
        if (!level)
            break;
        i = i ? i - 1 : 0;
        p = LD(b->ptr[i]);
        if (bt_moved(t, seq))
            return bt_gave_up(budget);
        if (path) {
            path->node[depth] = (bt *)b;
            path->idx[depth] = i;
        }
        if (++depth >= MAXH || --*budget <= 0)
            return bt_gave_up(budget);
        b = p;
        bt_prefetch(b);
    }
    if (path) {
        path->node[depth] = (bt *)b;
        path->idx[depth] = F;       /* no entry of this leaf, until one is found in it below */
        path->depth = depth + 1;
        path->seq = seq;
        path->seek = 1;
        path->key = start;
        path->at = i;               /* where an insert of start goes in this leaf, while the count holds */
    }
    int beyond = 0;                 /* the entry found is in the leaf after the path's */

    if (i && LD(b->last[i - 1]) >= start && (p = LD(b->ptr[i - 1]))) {
        i--;                        /* the floor reaches start */
    } else {
        /*
         * The next live entry. A dead floor is no answer, and no live entry
         * before it reaches start either (bt_compact's comment).
         */
        for (;; i++) {
            if (i >= n) {           /* the next entry is in the next leaf */
                int step = bt_next_leaf(t, seq, &b, budget);

                if (step <= 0)
                    return step < 0 ? bt_gave_up(budget) : NULL;
                n = bt_count_of(b);
                i = 0;
                /*
                 * The path still leads where an insert of `start` goes (the
                 * end of the floor's leaf): it stays, with no entry of its
                 * leaf (drc__itree_at answers NULL), so that a miss whose
                 * floor ends its leaf inserts with no descent.
                 */
                beyond = 1;
            }
            if (LD(b->key[i]) > last)
                return bt_moved(t, seq) ? bt_gave_up(budget) : NULL;
            if ((p = LD(b->ptr[i])))
                break;
        }
    }
    if (bt_moved(t, seq))
        return bt_gave_up(budget);
    if (path && path->depth && !beyond)
        path->idx[path->depth - 1] = i;
    return p;
}

struct drc__itree_node *drc__itree_first_at(const struct drc__itree *t, uintptr_t start, uintptr_t last,
                                            int *budget, struct drc__itree_path *path)
{
    return drc__itree_first_near(t, start, last, budget, path, NULL);
}

struct drc__itree_node *drc__itree_first_near(const struct drc__itree *t, uintptr_t start, uintptr_t last,
                                              int *budget, struct drc__itree_path *path,
                                              const struct drc__itree_bt *near)
{
    struct { const bt *b; unsigned i; } up[MAXH];
    unsigned seq, i = 0, n, depth = 0, level, d;
    const bt *b = bt_walk_root(t, &seq, budget);
    void *p;

    if (path) {
        path->depth = 0;
        path->seq = seq;    /* an answer of none holds while the count stays (drc__itree_unchanged) */
        path->walked = 1;   /* its first removal may leave the finger (drc__itree_remove_at) */
    }
    if (!b)
        return NULL;
    if (--*budget <= 0)
        return bt_gave_up(budget);
    if (LD(t->disjoint))        /* after the count (drc__itree_set_disjoint) */
        return bt_first_disjoint(t, seq, b, start, last, budget, path, bt_hint_leaf(near));
    for (;;) {
        n = bt_count_of(b);
        level = LD(b->level);
        /* from the first entry, skipping those whose subtree ends before `start` (and dead entries) */
        for (; i < n; i++) {
            if (LD(b->key[i]) > last)
                return bt_moved(t, seq) ? bt_gave_up(budget) : NULL;  /* every later entry starts later */
            if (LD(b->last[i]) >= start && (level || LD(b->ptr[i])))
                break;
        }
        while (i == n) {        /* nothing here: back up to the parent's next child */
            if (!depth)
                return bt_moved(t, seq) ? bt_gave_up(budget) : NULL;
            depth--;
            b = up[depth].b;
            n = bt_count_of(b);
            for (i = up[depth].i + 1; i < n; i++) {
                if (LD(b->key[i]) > last)
                    return bt_moved(t, seq) ? bt_gave_up(budget) : NULL;
                if (LD(b->last[i]) >= start)
                    break;
            }
        }
        p = LD(b->ptr[i]);
        level = LD(b->level);
        if (bt_moved(t, seq) || !p)
            return bt_gave_up(budget);
        if (!level) {
            if (path && depth + 1 < MAXH) {
                for (d = 0; d < depth; d++) {
                    path->node[d] = (bt *)up[d].b;
                    path->idx[d] = up[d].i;
                }
                path->node[depth] = (bt *)b;
                path->idx[depth] = i;
                path->depth = depth + 1;
                path->seq = seq;
                path->seek = 0;
                path->fingered = 0;
                path->leafonly = 0;
            }
            return p;
        }
        if (depth >= MAXH || --*budget <= 0)
            return bt_gave_up(budget);
        up[depth].b = b;
        up[depth].i = i;
        depth++;
        b = p;
        bt_prefetch(b);
        i = 0;
    }
}

struct drc__itree_node *drc__itree_next(const struct drc__itree *t, const struct drc__itree_node *x,
                                        uintptr_t start, uintptr_t last, int *budget)
{
    uintptr_t k = LD(x->start);
    unsigned seq, i, n, h;
    const bt *b = bt_walk_root(t, &seq, budget);
    void *p;

    /* find x: down the leftmost path that can hold k, then along the leaves */
    for (h = 0; b && LD(b->level); h++) {
        if (--*budget <= 0 || h >= MAXH)
            return bt_gave_up(budget);
        i = bt_lower(b, bt_count_of(b), k);
        p = LD(b->ptr[i ? i - 1 : 0]);
        if (bt_moved(t, seq))
            return bt_gave_up(budget);
        b = p;
        bt_prefetch(b);
    }
    if (!b)
        return NULL;
    if (--*budget <= 0)
        return bt_gave_up(budget);
    for (i = bt_lower(b, bt_count_of(b), k);; i++) {
        if (i >= bt_count_of(b)) {
            int step = bt_next_leaf(t, seq, &b, budget);

            if (step <= 0)
                return step < 0 ? bt_gave_up(budget) : NULL;   /* 0: x is not in the tree (lockless) */
            i = 0;
        }
        if (LD(b->key[i]) != k)
            return bt_moved(t, seq) ? bt_gave_up(budget) : NULL;
        if (LD(b->ptr[i]) == x)
            break;
    }
    /* then the next entry that overlaps, in start order */
    for (i++;; i++) {
        n = bt_count_of(b);
        if (i >= n) {
            int step = bt_next_leaf(t, seq, &b, budget);

            if (step <= 0)
                return step < 0 ? bt_gave_up(budget) : NULL;
            i = 0;
        }
        if (LD(b->key[i]) > last)
            return bt_moved(t, seq) ? bt_gave_up(budget) : NULL;
        if (LD(b->last[i]) >= start && (p = LD(b->ptr[i])))    /* a dead entry is skipped */
            return bt_moved(t, seq) ? bt_gave_up(budget) : p;
    }
}

/* ---- check ----------------------------------------------------------------------- */

struct chk {
    long count, dead;
    const bt *prev_leaf;
    uintptr_t prev_key;
    uintptr_t live_last;            /* the largest last of the live entries so far */
    int any_live;
    int bad;
};

static void bt_chk(const struct drc__itree *t, const bt *b, unsigned level, int is_root, struct chk *s)
{
    unsigned i, dead = 0;

    if (s->bad)
        return;
    /* LOW entries; the root one (a leaf) or two, the last leaf one (bt_put) */
    if (b->level != level || b->n > F || b->n < (is_root ? (level ? 2u : 1u) : level || b->next ? (unsigned)LOW : 1u)) {
        s->bad = 1;
        return;
    }
    for (i = b->n; i < F; i++)
        if (b->key[i] != UINTPTR_MAX) {     /* the count's padding (bt_setn) */
            s->bad = 1;
            return;
        }
    for (i = 0; i < b->n && !s->bad; i++) {
        if (b->key[i] < s->prev_key) {
            s->bad = 1;
            return;
        }
        if (!level) {
            const struct drc__itree_node *x = b->ptr[i];

            if (!x) {       /* dead (bt_compact's comment): after what lives before it ends */
                if (b->last[i] < b->key[i] || (t->disjoint && s->any_live && s->live_last >= b->key[i])) {
                    s->bad = 1;
                    return;
                }
                dead++;
                s->prev_key = b->key[i];
                continue;
            }
            if (x->start != b->key[i] || x->last != b->last[i] || x->last < x->start) {
                s->bad = 1;
                return;
            }
            s->prev_key = b->key[i];
            s->count++;
            if (!s->any_live || x->last > s->live_last)
                s->live_last = x->last;
            s->any_live = 1;
        } else {
            const bt *c = b->ptr[i];

            /* its smallest start exactly; its largest last or more (a dead last entry dropped since) */
            if (!c || !c->n || c->n > F || c->key[0] != b->key[i] || bt_max_last(c) > b->last[i]) {
                s->bad = 1;
                return;
            }
            bt_chk(t, c, level - 1, 0, s);
        }
    }
    if (!level) {
        /* the dead count, and LOW live entries (the root and the last leaf: one) */
        if (dead != b->dead || b->n - dead < (is_root || !b->next ? 1u : (unsigned)LOW))
            s->bad = 1;
        s->dead += dead;
        if (s->prev_leaf && s->prev_leaf->next != b)
            s->bad = 1;
        s->prev_leaf = b;
    } else if (b->dead) {
        s->bad = 1;
    }
}

/*
 * A finger that holds for the tree as it is (its count) is a path from the
 * root to a leaf with entries, whose first start it keeps, and the last key
 * before the next leaf's first start: what a walk that takes it (bt_finger)
 * relies on.
 */
static int bt_chk_finger(const struct drc__itree *t)
{
    const struct drc__itree_finger *f = &t->finger;
    const bt *b = t->root;
    unsigned d;

    if (!f->leaf || f->seq != t->seq)
        return 1;
    if (f->depth != t->height || f->depth > MAXH)
        return 0;
    for (d = 0; d + 1 < f->depth; d++) {
        if (!b->level || f->idx[d] >= b->n || f->node[d] != b)
            return 0;
        b = b->ptr[f->idx[d]];
    }
    return b == f->leaf && !b->level && b->n && f->lo == b->key[0] &&
           f->hi == (b->next ? b->next->key[0] - 1 : UINTPTR_MAX);
}

long drc__itree_check(const struct drc__itree *t)
{
    struct chk s = { 0, 0, NULL, 0, 0, 0, 0 };

    if (t->seq & 1)
        return -1;
    if (!t->root)
        return t->height || t->count || t->dead ? -1 : 0;
    if (!t->height)
        return -1;
    bt_chk(t, t->root, t->height - 1, 1, &s);
    if (s.bad || (s.prev_leaf && s.prev_leaf->next) || s.count != t->count || s.dead != t->dead ||
        !bt_chk_finger(t))
        return -1;
    return s.count;
}
