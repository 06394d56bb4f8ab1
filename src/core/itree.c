/*
 * Augmented red-black interval tree; see itree.h for the contract.
 *
 * The red-black rules are the textbook ones (root black, no red node with a
 * red child, the same number of black nodes on every root-to-NULL path).
 * The augmentation (none in plain mode, see itree.h) is kept exact by
 * three rules:
 *   - insert raises subtree_last on its way down, before the new leaf links;
 *   - remove recomputes every node from the lowest changed one to the root,
 *     before rebalancing;
 *   - a rotation keeps the set of intervals under the rotated pair, so the
 *     node that moves up inherits the old top's value and only the node that
 *     moves down is recomputed.
 *
 * Every field is written with ST() because a lockless lookup may read it
 * at any moment (see LD/ST below); the colour, which shares a word with the
 * parent pointer, is read only by writers, the parent by both.
 */
#include "core/itree.h"

#include <stddef.h>

/*
 * Release stores and acquire loads (plain moves on x86): a lockless reader
 * that loads a link to a node just inserted also sees the node's memory as
 * its owner initialised it. The reader's sequence count decides whether
 * what it read counts; these only make the reads themselves well-defined.
 */
#define LD(x)    __atomic_load_n(&(x), __ATOMIC_ACQUIRE)
#define ST(x, v) __atomic_store_n(&(x), (v), __ATOMIC_RELEASE)

typedef struct drc__itree_node node_t;

/*
 * A node's parent and colour share one word (parent | RED: nodes are at
 * least 8-aligned), so that all a descent, a rotation or a recolouring
 * reads of a node is in its first 40 bytes: the cache embeds them in the
 * region's first cache line. Lockless readers load the word and mask the
 * colour; writers store it whole (ST), keeping the half they do not change.
 */
#define RED ((uintptr_t)1)

static inline node_t *parent_of(const node_t *n)
{
    return (node_t *)(LD(n->parent_red) & ~RED);
}

static inline int red_of(const node_t *n)
{
    return (int)(n->parent_red & RED);     /* writers only */
}

static inline void set_parent(node_t *n, const node_t *p)
{
    ST(n->parent_red, (uintptr_t)p | (n->parent_red & RED));
}

static inline void set_red(node_t *n, int red)
{
    ST(n->parent_red, (n->parent_red & ~RED) | (uintptr_t)!!red);
}

/* Plain mode: read by lockless queries, so atomic; it changes once, under the owner's lock. */
static int is_plain(const struct drc__itree *t)
{
    return __atomic_load_n(&t->plain, __ATOMIC_ACQUIRE);
}

static void recompute(node_t *n)
{
    uintptr_t m = n->last;

    if (n->left && n->left->subtree_last > m)
        m = n->left->subtree_last;
    if (n->right && n->right->subtree_last > m)
        m = n->right->subtree_last;
    ST(n->subtree_last, m);
}

static void replace_child(struct drc__itree *t, node_t *parent, node_t *old, node_t *new)
{
    if (!parent)
        ST(t->root, new);
    else if (parent->left == old)
        ST(parent->left, new);
    else
        ST(parent->right, new);
}

/* x's right child y takes x's place; x becomes y's left child. */
static void rotate_left(struct drc__itree *t, node_t *x)
{
    node_t *y = x->right, *p = parent_of(x);

    ST(x->right, y->left);
    if (y->left)
        set_parent(y->left, x);
    ST(y->left, x);
    set_parent(x, y);
    set_parent(y, p);
    replace_child(t, p, x, y);
    if (!is_plain(t)) {
        ST(y->subtree_last, x->subtree_last);
        recompute(x);
    }
}

/* Mirror of rotate_left. */
static void rotate_right(struct drc__itree *t, node_t *x)
{
    node_t *y = x->left, *p = parent_of(x);

    ST(x->left, y->right);
    if (y->right)
        set_parent(y->right, x);
    ST(y->right, x);
    set_parent(x, y);
    set_parent(y, p);
    replace_child(t, p, x, y);
    if (!is_plain(t)) {
        ST(y->subtree_last, x->subtree_last);
        recompute(x);
    }
}

static int is_red(const node_t *n)
{
    return n && red_of(n);
}

static void insert_fixup(struct drc__itree *t, node_t *n)
{
    node_t *p, *g, *u;

    while ((p = parent_of(n)) && red_of(p)) {
        g = parent_of(p);   /* exists: a red node is never the root */
        if (p == g->left) {
            u = g->right;
            if (is_red(u)) {
                set_red(p, 0);
                set_red(u, 0);
                set_red(g, 1);
                n = g;
                continue;
            }
            if (n == p->right) {
                rotate_left(t, p);
                n = p;
                p = parent_of(n);
            }
            set_red(p, 0);
            set_red(g, 1);
            rotate_right(t, g);
        } else {
            u = g->left;
            if (is_red(u)) {
                set_red(p, 0);
                set_red(u, 0);
                set_red(g, 1);
                n = g;
                continue;
            }
            if (n == p->left) {
                rotate_right(t, p);
                n = p;
                p = parent_of(n);
            }
            set_red(p, 0);
            set_red(g, 1);
            rotate_left(t, g);
        }
    }
    set_red(t->root, 0);
}

void drc__itree_init_plain(struct drc__itree *t)
{
    t->root = NULL;
    t->max = NULL;
    t->plain = 1;
}

static uintptr_t augment(node_t *n)
{
    uintptr_t m = n->last, sub;

    if (n->left && (sub = augment(n->left)) > m)
        m = sub;
    if (n->right && (sub = augment(n->right)) > m)
        m = sub;
    ST(n->subtree_last, m);
    return m;
}

void drc__itree_augment(struct drc__itree *t)
{
    if (!is_plain(t))
        return;
    if (t->root)
        augment(t->root);   /* recursion depth: the tree's height, under 2 log2 n */
    __atomic_store_n(&t->plain, 0, __ATOMIC_RELEASE);    /* after the values: a query that sees 0 uses them */
}

void drc__itree_insert(struct drc__itree *t, struct drc__itree_node *n)
{
    node_t *p = NULL, *cur = t->root, *hi = NULL;
    int plain = is_plain(t);

    if (plain && t->max && n->start > t->max->start) {
        p = t->max;         /* after every interval, and nothing to raise: under the largest, whose right is NULL */
    } else {
        while (cur) {
            p = cur;
            if (!plain && cur->subtree_last < n->last)
                ST(cur->subtree_last, n->last);
            if (n->start < cur->start) {
                hi = cur;       /* the last node the descent went left at follows n */
                cur = cur->left;
            } else {
                cur = cur->right;
            }
        }
    }
    if (!hi)
        ST(t->max, n);      /* it never went left: n comes last */
    /* n may be recycled memory that a lockless reader still walks: atomic stores */
    ST(n->left, (node_t *)NULL);
    ST(n->right, (node_t *)NULL);
    ST(n->parent_red, (uintptr_t)p | RED);     /* a new node is red */
    ST(n->subtree_last, n->last);
    if (!p)
        ST(t->root, n);
    else if (n->start < p->start)
        ST(p->left, n);
    else
        ST(p->right, n);
    insert_fixup(t, n);
}

/* Put v where u is, as far as u's parent is concerned. */
static void transplant(struct drc__itree *t, node_t *u, node_t *v)
{
    replace_child(t, parent_of(u), u, v);
    if (v)
        set_parent(v, parent_of(u));
}

/* x (possibly NULL) under parent xp carries an extra black. */
static void remove_fixup(struct drc__itree *t, node_t *x, node_t *xp)
{
    node_t *w;

    while (x != t->root && !is_red(x)) {
        if (x == xp->left) {
            w = xp->right;  /* non-NULL: xp's right side has black height >= 1 */
            if (red_of(w)) {
                set_red(w, 0);
                set_red(xp, 1);
                rotate_left(t, xp);
                w = xp->right;
            }
            if (!is_red(w->left) && !is_red(w->right)) {
                set_red(w, 1);
                x = xp;
                xp = parent_of(x);
                continue;
            }
            if (!is_red(w->right)) {
                set_red(w->left, 0);
                set_red(w, 1);
                rotate_right(t, w);
                w = xp->right;
            }
            set_red(w, red_of(xp));
            set_red(xp, 0);
            set_red(w->right, 0);
            rotate_left(t, xp);
        } else {
            w = xp->left;
            if (red_of(w)) {
                set_red(w, 0);
                set_red(xp, 1);
                rotate_right(t, xp);
                w = xp->left;
            }
            if (!is_red(w->left) && !is_red(w->right)) {
                set_red(w, 1);
                x = xp;
                xp = parent_of(x);
                continue;
            }
            if (!is_red(w->left)) {
                set_red(w->right, 0);
                set_red(w, 1);
                rotate_left(t, w);
                w = xp->left;
            }
            set_red(w, red_of(xp));
            set_red(xp, 0);
            set_red(w->left, 0);
            rotate_right(t, xp);
        }
        x = t->root;
    }
    if (x)
        set_red(x, 0);
}

/* The node before @n in start order (in-order predecessor), or NULL. Writers only: no atomics. */
static node_t *node_prev(const node_t *n)
{
    node_t *p;

    if (n->left) {
        for (n = n->left; n->right; n = n->right)
            ;
        return (node_t *)n;
    }
    for (p = parent_of(n); p && n == p->left; p = parent_of(n))
        n = p;
    return p;
}

void drc__itree_remove(struct drc__itree *t, struct drc__itree_node *z)
{
    node_t *x, *xp, *y, *n, *moved = NULL;
    uintptr_t old;
    int removed_red;

    if (z == t->max)
        ST(t->max, node_prev(z));
    if (!z->left || !z->right) {
        x = z->left ? z->left : z->right;
        xp = parent_of(z);
        removed_red = red_of(z);
        transplant(t, z, x);
    } else {
        /* z's successor y takes z's place and colour; y's old slot loses a node */
        for (y = z->right; y->left; y = y->left)
            ;
        removed_red = red_of(y);
        x = y->right;
        if (parent_of(y) == z) {
            xp = y;
        } else {
            xp = parent_of(y);
            transplant(t, y, x);
            ST(y->right, z->right);
            set_parent(y->right, y);
        }
        transplant(t, z, y);
        ST(y->left, z->left);
        set_parent(y->left, y);
        set_red(y, red_of(z));
        moved = y;
    }
    /*
     * z's interval left every subtree from xp to the root, and a moved y left
     * those below its new place. Only the path child of each of these nodes
     * changed, so once one keeps its value every node above it does too —
     * except the moved y, whose stored value is that of its old place: it is
     * always recomputed, and the stop applies above it. In plain mode there
     * is nothing to recompute.
     */
    for (n = is_plain(t) ? NULL : xp; n;) {
        old = n->subtree_last;
        recompute(n);
        if (n == moved)
            moved = NULL;
        else if (n->subtree_last == old) {
            if (!moved)
                break;
            n = moved;  /* unchanged up to y: recompute y, then go on above it */
            continue;
        }
        n = parent_of(n);
    }
    if (!removed_red)
        remove_fixup(t, x, xp);
}

/* Leftmost node under n that overlaps [start, last]. */
static node_t *subtree_search(const node_t *n, uintptr_t start, uintptr_t last, int *budget)
{
    const node_t *left, *right;

    for (;;) {
        if (--*budget < 0)
            return NULL;
        left = LD(n->left);
        if (left && start <= LD(left->subtree_last)) {
            n = left;   /* something in the left subtree ends late enough: the answer, if any, is there */
            continue;
        }
        if (LD(n->start) > last)
            return NULL;    /* n and everything right of it start too late */
        if (start <= LD(n->last))
            return (node_t *)n;
        right = LD(n->right);
        if (!right || start > LD(right->subtree_last))
            return NULL;
        n = right;
    }
}

/*
 * The floor of key (largest start <= key, the rightmost of equal ones) and,
 * in *ceil, the node after it in start order (smallest start > key): one
 * descent finds both (ceil NULL: the floor only, inlined without the
 * other). NULL with *budget 0 if the budget ran out.
 */
static inline __attribute__((always_inline)) node_t *floor_ceil(const struct drc__itree *t, uintptr_t key,
                                                                int *budget, node_t **ceil)
{
    const node_t *n = LD(t->max);
    uintptr_t best = 0, above = 0, right;
    int b = *budget;

    if (n && LD(n->start) <= key) {
        if (ceil)
            *ceil = NULL;
        return (node_t *)n;     /* at or after the largest start (a cache filled in address order): no descent */
    }
    n = LD(t->root);
    /*
     * Select with a mask instead of branching: on random keys the direction
     * is a coin toss at every level, and a mispredicted branch costs more
     * than loading both children (they share the node's cache line).
     */
    while (n) {
        if (--b < 0) {
            *budget = 0;
            if (ceil)
                *ceil = NULL;
            return NULL;
        }
        right = -(uintptr_t)(LD(n->start) <= key);
        best = ((uintptr_t)n & right) | (best & ~right);
        if (ceil)
            above = (above & right) | ((uintptr_t)n & ~right);
        n = (const node_t *)(((uintptr_t)LD(n->right) & right) | ((uintptr_t)LD(n->left) & ~right));
    }
    *budget = b;
    if (ceil)
        *ceil = (node_t *)above;
    return (node_t *)best;
}

/* Plain mode, lockless: the node after n in start order (NULL at the end, or when the budget runs out). */
static node_t *step(const node_t *n, int *budget)
{
    const node_t *from, *left;

    if ((left = LD(n->right))) {
        do {
            if (--*budget < 0)
                return NULL;
            n = left;
        } while ((left = LD(n->left)));
        return (node_t *)n;
    }
    do {    /* climb until we arrive from a left child */
        if (--*budget < 0)
            return NULL;
        from = n;
        n = parent_of(n);
    } while (n && LD(n->right) == from);
    return (node_t *)n;
}

struct drc__itree_node *drc__itree_first(const struct drc__itree *t, uintptr_t start, uintptr_t last,
                                         int *budget)
{
    const node_t *root;

    if (is_plain(t)) {
        /* disjoint: the floor of start if it reaches start, else its successor if it starts by last */
        node_t *ceil, *f = floor_ceil(t, start, budget, &ceil);

        if (f && LD(f->last) >= start)
            return f;
        return ceil && LD(ceil->start) <= last ? ceil : NULL;
    }
    root = LD(t->root);
    if (!root || LD(root->subtree_last) < start)
        return NULL;
    return subtree_search(root, start, last, budget);
}

struct drc__itree_node *drc__itree_next(const struct drc__itree *t, const struct drc__itree_node *n,
                                        uintptr_t start, uintptr_t last, int *budget)
{
    const node_t *right, *from;

    if (is_plain(t)) {
        /* disjoint: n reaches start, so its successor does too; it overlaps if it starts by last */
        if (n == LD(t->max))
            return NULL;
        n = step(n, budget);
        return n && LD(n->start) <= last ? (node_t *)n : NULL;
    }
    right = LD(n->right);
    for (;;) {
        /* Invariant: every overlapping node before n in start order was returned already. */
        if (right && start <= LD(right->subtree_last))
            return subtree_search(right, start, last, budget);
        do {    /* climb until we arrive from a left child: that parent is next in order */
            if (--*budget < 0)
                return NULL;
            from = n;
            n = parent_of(n);
            if (!n)
                return NULL;
            right = LD(n->right);
        } while (right == from);
        if (LD(n->start) > last)
            return NULL;
        if (start <= LD(n->last))
            return (node_t *)n;
    }
}

struct drc__itree_node *drc__itree_floor(const struct drc__itree *t, uintptr_t key, int *budget)
{
    return floor_ceil(t, key, budget, NULL);
}

struct check {
    const node_t *prev;     /* in-order predecessor */
    long count;
    int plain;
};

/* Returns the black height of n's subtree, or -1. */
static int check_node(const node_t *n, const node_t *parent, struct check *ck)
{
    int lh, rh;
    uintptr_t m;

    if (!n)
        return 1;
    if (parent_of(n) != parent || n->start > n->last)
        return -1;
    if (red_of(n) && parent && red_of(parent))
        return -1;
    lh = check_node(n->left, n, ck);
    if (lh < 0)
        return -1;
    if (ck->prev && (ck->prev->start > n->start || (ck->plain && ck->prev->last >= n->start)))
        return -1;      /* out of order, or overlapping in plain mode */
    ck->prev = n;
    ck->count++;
    rh = check_node(n->right, n, ck);
    if (rh < 0 || lh != rh)
        return -1;
    m = n->last;
    if (n->left && n->left->subtree_last > m)
        m = n->left->subtree_last;
    if (n->right && n->right->subtree_last > m)
        m = n->right->subtree_last;
    if (!ck->plain && n->subtree_last != m)
        return -1;
    return lh + !red_of(n);
}

long drc__itree_check(const struct drc__itree *t)
{
    struct check ck = { NULL, 0, is_plain(t) };

    if (t->root && red_of(t->root))
        return -1;
    if (check_node(t->root, NULL, &ck) < 0 || t->max != ck.prev)
        return -1;      /* broken, or max is not the last node in start order */
    return ck.count;
}
