/*
 * The registration cache.
 *
 * A region is one backend registration, in one of three places:
 *   live      in c->tree, the index (and on the LRU list of a cache with limits): lookups find it;
 *   detached  superseded by a merge while a user held it (on the list
 *             c->detached, where a range invalidation still finds it), or invalidated
 *             while held (in no tree, DEAD in its word, counted by
 *             off_held); no lookup finds it, its last put releases it;
 *   free      on c->pool, deregistered, waiting to be reused.
 * Every region ever handed out sits in a pool chunk (c->chunks): a walk of
 * the chunks finds the live ones (is_live) in allocation order, one line
 * each.
 * Region memory is never returned while the cache lives (it is type-stable,
 * as with SLAB_TYPESAFE_BY_RCU), so a lockless lookup may always read it: it
 * comes from the cache's arena (arena.c), with the hint tables, and goes
 * back only in drc_cache_destroy(). A lockless lookup reads a region's
 * first line only; its second line (struct region_ext, in the chunk's
 * ext[]: the LRU links, device memory's description) is read under
 * c->lock or with a reference held, and only where the region wrote it.
 *
 * A region's states against its fields (DETACHED_* is r->detached):
 *   state              where                  word                detached       valid  next
 *   free               c->pool, c->freed, or  0                   stale          stale  pool link
 *                      an uncarved chunk slot
 *   live               c->tree (+ LRU)        HELD|users          LIVE           1      -
 *   being drained      c->tree, or as below   ...|DRAIN (lock)    as it was      as is  -
 *   superseded, held   c->detached            HELD|users          DETACHED_LIST  1 -> 0 revoking list
 *   invalidated, held  no tree (ndetached)    HELD|DEAD|users     DETACHED_OFF   0      revoking list
 *   released           a release list         0                   as it was      as is  release list
 *                      (dead, c->qdead), then c->freed
 * users is r->word's count plus every thread slot's count of r (cache_refs.c);
 * only a drain makes the word the sum. revoked (DRC_F_REVOKE) is set while a
 * revoker holds r and cleared by release_list; a registration not yet
 * inserted is no region: it is a struct pending on c->pending (get_slow).
 *
 * The reference word, r->word = HELD | DEAD? | DRAIN? | users (with the
 * counts in threads' slots once two threads hit the cache: "Thread
 * references", cache_refs.c, and DRAIN there):
 *   HELD is set while the region is live or detached. It is cleared only
 *   by CAS(HELD -> 0) under c->lock, or by CAS(HELD|DEAD -> 0), so only when
 *   no user holds the region; the thread whose CAS succeeds deregisters it.
 *   Users are added and dropped without the lock. A put that leaves exactly
 *   HELD on a detached region takes the lock to release it; `detached` is
 *   set before the CAS that would release it, so either that CAS sees the
 *   user gone, or the user's put sees `detached` and releases it itself.
 *   DEAD marks a region invalidated while held (retire): it is in no tree,
 *   so the put that leaves exactly HELD|DEAD releases it without the lock.
 *   The bit is in the word, not beside it, so that a put learns it from its
 *   own decrement and never acts on a region that was released meanwhile.
 *
 * Lookups take no lock: they walk c->tree under a sequence count.
 *   writer (c->lock held)             lockless lookup
 *                                     s = seq (even, else give up)
 *   seq++  (odd)                      walk the tree, find r
 *   remove r, CAS(r->word HELD->0)    CAS(r->word w -> w+1) if HELD set
 *   seq++  (even)                     seq == s ?  keep r : drop r, retry
 * If the lookup's increment lands before the writer's CAS, the writer sees a
 * user and detaches r instead of releasing it, and the lookup either returns
 * r (it was live when taken: the lookup is ordered before the writer) or
 * sees the changed count and drops it. If the writer's CAS lands first, the
 * increment fails. A walk that raced a writer may miss r; the count
 * catches it (the index's own count also keeps the walk from following a
 * pointer it read from a node in change: itree.h), and `budget` bounds it. Before walking, a
 * lookup tries the hint table (see struct hint_tab): a guess, validated by
 * the reference it takes (lookup_lockless), refused if the region was
 * detached. Invariant for every path that takes a region out of the tree:
 * it sets `detached` inside the writer's window (retire), or releases the
 * region (HELD cleared) first (evict), so that a stale hint can never be
 * taken for a live region. A free event where nothing is registered takes
 * no lock either (nothing_there, with its timeline).
 *
 * Registrations run without the lock (the backend may be slow, or free
 * memory and so call back into drc_invalidate), as in mmu_interval_notifier:
 *   getter                               invalidator
 *   lock; add pending [start, end]; unlock
 *   export, backend reg                  lock; remove overlapping regions;
 *                                        mark overlapping pending stale; unlock
 *   lock; drop pending; stale ? dereg, retry : insert; unlock
 * so a registration that raced an invalidation of its range is never
 * inserted. A getter that misses on a range overlapping another's pending
 * registration waits for it, so two threads missing together leave one
 * region. Where the first section would have nothing to decide (the lockless
 * lookup found nothing over the pages, and they are registered as they are),
 * the getter *announces* its miss instead: it reads the checks the section
 * would have made, then one CAS that expects the lock word it saw free
 * (unchanged: no lock section began since, as every unlock advances the
 * word's version) sets its thread's bit, with its pending range beside it
 * (cache_miss.c: announce()); invalidators and later getters read the
 * announced ranges as they read c->pending.
 *
 * Lock order: a notify slot (notify.c), then c->lock. No backend or CUDA call
 * is made with c->lock held, and nothing is allocated, freed, mapped or
 * unmapped under it: an allocator may give memory back (and drc's own hooks
 * see munmap and madvise) and so re-enter drc_invalidate on this thread.
 * DRC_DEBUG builds assert both (lock(), call-out sites), assert which lock a
 * function needs, and check both trees whenever c->lock is released. In a
 * fork() child every inherited cache is inert (drc__cache_forked).
 *
 * A put racing a drain (the drain of "Thread references", cache_refs.c): the
 * putter's reference may be in its slot, moved into the word, or the word's.
 *   drainer (c->lock held)                putter (put_ref)
 *   CAS word: w -> w | DRAIN              put_slot: r|1 -> 0 in its slot ?
 *                                           done: that count is no longer
 *                                           one the drain can move
 *   drain_slot: r|n -> 0; moved += n      else (moved, or the word's): the word
 *                                           USERS 0, DRAIN ? wait (cpu_relax)
 *                                           for the sum
 *   drain_end, one CAS: word += moved;    USERS > 0: CAS w -> w - 1 (any
 *     none left and may release ?           reference does: they are alike);
 *     release : clear DRAIN                 none left: became_idle; DEAD|DRAIN
 *                                           leaves the release to drain_end,
 *                                           a superseded region takes c->lock
 *                                           after the drainer and drains anew
 * A put never reads a word that DRAIN says is short as "no user left": it
 * waits, or decrements a count that is there; and drain_end's one CAS adds
 * what it moved to whatever the puts left.
 *
 * The files (behind core/cache_int.h: the structs, the word's bits, the
 * atomics, the helpers a hit inlines):
 *   cache.c        region lifetime (retire, release, evict), the lookup and
 *                  the hit (drc_get, drc_put), invalidation, revoke, create,
 *                  destroy, fork, the region accessors
 *   cache_miss.c   the miss: plan, registration against a pending entry,
 *                  publication
 *   cache_refs.c   thread references and the drain; the per-thread counters
 *                  and drc_cache_stats
 *   cache_hint.c   the hint table and the used-grain filter
 *   cache_queue.c  c->lock and the hand-off queue of free events
 *   cache_pool.c   pool chunks, free regions, drc's own allocations
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/cache_int.h"
#include "core/notify.h"

#ifdef DRC_DEBUG
__thread int drc__lock_depth;

void drc__assert_fail(const char *what, const char *file, int line)
{
    fprintf(stderr, "drc: %s:%d: assertion failed: %s\n", file, line, what);
    abort();
}

#endif

/* The backend's calls: never under a cache lock (drc.h promises it). */
int be_reg(drc_cache_t *c, const struct drc_reg_args *a, void **handle, uint32_t *lkey, uint32_t *rkey)
{
    DRC_ASSERT_NO_LOCK();
    return c->be.reg(c->be.ctx, a, handle, lkey, rkey);
}

int be_dereg(drc_cache_t *c, void *handle)
{
    int err;

    DRC_ASSERT_NO_LOCK();
    err = c->be.dereg(c->be.ctx, handle);
    tally(c, ST_DEREGS);
    return err;
}

/* [addr, addr+len) as a closed range; -EINVAL for len 0 or overflow. */
static int closed_range(const void *addr, size_t len, uintptr_t *start, uintptr_t *last)
{
    uintptr_t s = (uintptr_t)addr;

    if (len == 0 || len - 1 > UINTPTR_MAX - s)
        return -EINVAL;
    *start = s;
    *last = s + (len - 1);
    return 0;
}

/*
 * A region containing [s, last] that serves @access, or NULL; in *pr, for
 * the miss after it, whether no region overlapped the range's pages.
 */
static struct drc_region *find_containing(const drc_cache_t *c, uintptr_t s, uintptr_t last, unsigned access,
                                          int *budget, struct probe *pr, const struct drc__itree_bt *near)
{
    const struct drc__itree *t = &c->tree;
    struct drc__itree_node *n;
    struct drc_region *r;
    uintptr_t ps = s & ~(uintptr_t)(c->page - 1), pl = last | (c->page - 1);

    /*
     * Coalesced regions do not overlap, so the first region overlapping the
     * range's pages is the only candidate: regions are whole pages, so one
     * that touches the page of s contains s. One descent, which records
     * where an insert of those pages goes: if nothing is there, the miss
     * that follows plans and inserts along it (get_slow), no walk again.
     * Once regions may overlap (DRC_F_NO_MERGE, merges refused by a size
     * limit or by the remote bits), the full overlap walk. A region that
     * overlaps another is published inside the writer's window that sets
     * `overlapping`, so a lookup that read it unset and kept an unchanged
     * count saw a tree without overlaps.
     */
    if (!LD(c->overlapping)) {
        n = drc__itree_first_near(t, ps, pl, budget, &pr->path, near);
        if (n && LD(n->start) <= s && LD(n->last) >= last && serves(c, LD(region_of(n)->access), access))
            return region_of(n);
        if (!n && *budget > 0) {
            pr->none = 1;
            pr->start = ps;
            pr->last = pl;
        }
        return NULL;
    }
    for (n = drc__itree_first(t, s, last, budget); n; n = drc__itree_next(t, n, s, last, budget)) {
        if (LD(n->start) > s)
            break;      /* in start order: no later node starts early enough */
        r = region_of(n);
        if (LD(n->last) >= last && serves(c, LD(r->access), access))
            return r;
    }
    return NULL;
}

/* Add a user to a region that is live or detached; 0 if it is neither. */
int tryget(drc_cache_t *c, struct drc_region *r)
{
    uint64_t w = LD(r->word);

    do {
        if (!(w & HELD))
            return 0;
    } while (!__atomic_compare_exchange_n(&r->word, &w, w + 1, 1, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED));
    if (!USERS(w))
        tally(c, ST_USED);
    return 1;
}

static inline int tryget_fast(drc_cache_t *c, struct drc_region *r)
{
    int i = drc__tslot();

    if ((LD(r->word) & (HELD | DEAD | DRAIN)) != HELD)
        return tryget(c, r);    /* released (tryget fails), invalidated or being drained: the word */
    if (!(LD(c->refmask) & ref_bit(i)) && (LD(c->hitters) == ref_bit(i) || !join_refs(c, i)))
        return tryget(c, r);    /* the only thread that hits this cache: the word */
    return tryget_slot(c, r, i);
}

static void lru_unlink(drc_cache_t *c, struct drc_region *r)
{
    struct region_ext *e = region_ext(r);

    if (e->lru_prev)
        region_ext(e->lru_prev)->lru_next = e->lru_next;
    else
        c->lru_head = e->lru_next;
    if (e->lru_next)
        region_ext(e->lru_next)->lru_prev = e->lru_prev;
    else
        c->lru_tail = e->lru_prev;
}

void lru_append(drc_cache_t *c, struct drc_region *r)
{
    struct region_ext *e = region_ext(r);

    e->lru_next = NULL;
    e->lru_prev = c->lru_tail;
    if (c->lru_tail)
        region_ext(c->lru_tail)->lru_next = r;
    else
        c->lru_head = r;
    c->lru_tail = r;
}

/*
 * The hint slots of a region leaving the tree that still name it (c->lock):
 * the slots hint_grow's fill gives it (region_grains). They name @leaf
 * instead, the leaf its removal left (or nothing, NULL), so that the next
 * lookup there, most often the miss that registers the memory again, does
 * not read the region's line only to find it released or reused, and
 * begins its walk at that leaf (slot_of_leaf, drc__itree_first_near).
 * Slots are guesses that every lookup checks: a lookup that stores the
 * region again after this leaves it as stale as it was, a leaf that has
 * changed since fails the walk's checks, and a slot that names another
 * region is left alone.
 */
static inline void hint_forget(const drc_cache_t *c, const struct drc_region *r, const struct drc__itree_bt *leaf)
{
    struct hint_tab *t = c->hint;
    struct drc_region **slot;
    uintptr_t g;
    unsigned k;

    for (k = region_grains(t, r->node.start, r->node.last, &g); k--; g++) {
        slot = grain_slot(t, g);
        if (__atomic_load_n(slot, __ATOMIC_RELAXED) == r)
            __atomic_store_n(slot, slot_of_leaf(leaf), __ATOMIC_RELAXED);
    }
}

/*
 * Take a live region out of the tree and the LRU (c->lock, seq odd); @path:
 * where a walk found it (drc__itree_remove_at checks that it holds, and
 * leaves it at r's successor), or NULL or empty (no walk found it): then
 * @leaf, region_leaf(r) read before anything linked r on a list
 * (drc__itree_remove_in checks it).
 */
static void unlink_live(drc_cache_t *c, struct drc_region *r, struct drc__itree_path *path,
                        struct drc__itree_bt *leaf)
{
    ASSERT_WRITING(c);
    if (path && path->depth)
        leaf = drc__itree_remove_at(&c->tree, &r->node, path);
    else
        leaf = drc__itree_remove_in(&c->tree, &r->node, leaf);
    hint_forget(c, r, leaf);
    if (c->limited)
        lru_unlink(c, r);   /* without limits nothing evicts: no LRU to keep (two random lines saved) */
    INC(c->regions, -1);
    INC(c->bytes, -region_len(r));
}

/* Release r if its word is still @w, which has no user: the caller deregisters everything on *dead. */
static int try_release_w(struct drc_region *r, uint64_t w, struct drc_region **dead)
{

    if (!__atomic_compare_exchange_n(&r->word, &w, 0, 0, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED))
        return 0;
    r->next = *dead;
    *dead = r;
    return 1;
}

static int try_release(drc_cache_t *c, struct drc_region *r, struct drc_region **dead)
{
    uint64_t moved;

    if (!LD(c->refmask))
        return try_release_w(r, HELD, dead);    /* no slot counts references (join_refs; never with limits) */
    return drain_begin(c, r, 0, &moved) && drain_end(c, r, dead, 1, moved, NULL);
}

/*
 * Is a region that a chunk walk found live (in c->tree)? Under c->lock, or
 * with no other thread, exactly: pooled and released regions have a word
 * of 0, detached ones a `detached` state, and both are set in the window
 * that takes a region out. Without the lock (hint_grow), a guess that the
 * sequence count validates; it reads only regions whose carve was
 * published (a word of 0 first) and fields that are atomic, never a
 * pointer out of a region, so a region carved from a reused mapping and
 * not yet published is never followed anywhere (the neighbour links were:
 * a walk along them could step from a region just linked to its successor
 * field before publish() had stored it, and follow arena garbage).
 */
int is_live(const struct drc_region *r)
{
    /* acquire: a lockless walk that sees HELD reads the bounds publish() stored before it */
    return (__atomic_load_n(&r->word, __ATOMIC_ACQUIRE) & HELD) && LD(r->detached) == LIVE;
}

static void retire_at(drc_cache_t *c, struct drc_region *r, struct drc_region **dead,
                      struct drc__itree_path *path, struct drc__itree_bt *leaf)
{
    uint64_t w, moved;

    unlink_live(c, r, path, leaf);
    if (LD(r->valid)) {
        ST_SC(r->detached, DETACHED_LIST);
        if (!try_release(c, r, dead))
            detached_add(c, r);
    } else {
        /*
         * Counted under the lock before a put can see DEAD; the put that
         * releases it counts that in its own thread slot (off_held), with
         * no locked add on either side. The state needs no SC store here,
         * unlike DETACHED_LIST's above (whose CAS may fail and then writes
         * nothing a put could synchronise with): the fetch_or always writes
         * the word, so a put whose decrement comes after it in the word's
         * order reads `detached` through that release, and one whose
         * decrement came first leaves the release to us.
         */
        INC(c->ndetached, 1);
        __atomic_store_n(&r->detached, DETACHED_OFF, __ATOMIC_RELEASE);
        if (LD(c->refmask)) {
            /* the threads' references into the word, once: after it, any slot count of r is undone */
            if (drain_begin(c, r, DEAD, &moved) && drain_end(c, r, dead, 1, moved, NULL))
                INC(c->ndetached, -1);
            return;
        }
        w = __atomic_fetch_or(&r->word, DEAD, __ATOMIC_SEQ_CST) | DEAD;
        if (!USERS(w) && try_release_w(r, w, dead))
            INC(c->ndetached, -1);
    }
}

void retire(drc_cache_t *c, struct drc_region *r, struct drc_region **dead)
{
    retire_at(c, r, dead, NULL, region_leaf(r));
}

/*
 * Regions invalidated while held that are not released yet (c->lock): those
 * retired, less the releases that puts counted. A put's count may not be
 * visible yet, never one ahead of its retire (which was under the lock):
 * the answer is never low. Reads every thread slot: called only when the
 * trees and the pending list are empty, by destroy, and by stats.
 */
uint64_t off_held(const drc_cache_t *c)
{
    uint64_t gone = tally_sum(c, ST_OFF_GONE), in = LD(c->ndetached);

    return in > gone ? in - gone : 0;
}

static int over_limits(const drc_cache_t *c)
{
    return (c->max_regions && c->regions > c->max_regions) || (c->max_bytes && c->bytes > c->max_bytes);
}

/* Evict idle live regions, least recently idle first, until within limits (c->lock, seq odd). */
void evict(drc_cache_t *c, struct drc_region **dead)
{
    struct drc_region *r = c->lru_head, *next;
    struct drc__itree_bt *leaf;

    ASSERT_WRITING(c);
    for (; r && over_limits(c); r = next) {
        next = region_ext(r)->lru_next;
        leaf = region_leaf(r);          /* before try_release links r on *dead */
        if (try_release(c, r, dead)) {
            unlink_live(c, r, NULL, leaf);
            INC(c->evicted, 1);
        }
    }
}

/* Deregister every region on @dead (no lock held) and return them to the pool. */
int release_list(drc_cache_t *c, struct drc_region *dead)
{
    struct drc_region *r, *tail = NULL, *head;
    int err = 0, e;

    if (!dead)
        return 0;
    for (r = dead; r; r = r->next) {
        /* revoked (DRC_F_REVOKE): its revoker deregistered it already; only drc's memory goes back */
        e = LD_SC(r->revoked) ? 0 : be_dereg(c, r->handle);
        ST(r->revoked, 0);
        if (e && !err)
            err = e;
        tail = r;
    }
    /*
     * Back to the pool without taking the lock a second time: push the whole
     * list on c->freed. Only pool_get (under c->lock) takes from it, and it
     * takes everything at once, so a push can never meet a half-taken list.
     */
    head = __atomic_load_n(&c->freed, __ATOMIC_RELAXED);
    do {
        tail->next = head;
    } while (!__atomic_compare_exchange_n(&c->freed, &head, dead, 1, __ATOMIC_RELEASE, __ATOMIC_RELAXED));
    return err;
}

/*
 * DRC_F_REVOKE (drc.h): an invalidation deregisters every region it
 * invalidates, held ones too, before it returns, and the last put of each
 * then frees only drc's memory. The invalidator takes a reference of its
 * own on each such region under c->lock (revoke_take), so that no put can
 * release and reuse it while the backend deregisters it; after unlock it
 * deregisters each and drops that reference (revoke_list), and whichever
 * reference goes last releases the region, skipping dereg (release_list reads
 * `revoked`). Only the invalidation that turns `valid` from 1 to 0, under
 * c->lock, revokes a region, so exactly one dereg happens:
 *
 *   invalidator                           holder                  other getter
 *   lock; valid = 0                                               (lockless lookup of r:
 *   revoke_take: word+1, revoked = 1                               sees detached or a changed
 *   retire (DEAD: in no tree); unlock                              seq, drops r; never returns it)
 *                                         drc_put: word-1, users left
 *   dereg(handle) -- keys dead now        (no release: ours holds it)
 *   put_ref: word-1 -> last? release,     drc_region_handle: NULL
 *          no dereg (revoked)
 *                                         or the holder's put is the last:
 *                                         release, no dereg (revoked)
 *   second invalidation of the range: finds no valid region (DEAD ones are in
 *   no tree, superseded ones read valid 0): no revoke, no dereg.
 *
 * A lookup that took r just before the invalidator's window (ordered before
 * the free) holds it like any user: r is revoked under it. `revoked` is
 * stored before the invalidator's decrement, and the release that reads it
 * comes after that decrement in r->word's order, so it always sees it.
 */
static void revoke_take(drc_cache_t *c, struct drc_region *r, struct drc_region **revoking)
{
    ASSERT_LOCKED(c);
    /*
     * Live or in c->detached, under c->lock: HELD is set, tryget succeeds.
     * Idle regions too: a put that just idled a superseded one waits for
     * c->lock to release it, and would deregister it after we returned.
     */
    if (!(c->flags & DRC_F_REVOKE) || !revoking || !tryget(c, r))
        return;
    ST_SC(r->revoked, 1);
    r->next = *revoking;    /* r->next is free: r is on no pool or release list while HELD */
    *revoking = r;
}

/*
 * Invalidate live region r (c->lock, seq odd, r->valid already 0): revoke_take
 * (DRC_F_REVOKE: before retire, while r is live), then retire_at. r's leaf is
 * read first: revoke_take's list link reuses its word.
 */
static void revoke_retire(drc_cache_t *c, struct drc_region *r, struct drc_region **dead,
                          struct drc_region **revoking, struct drc__itree_path *path)
{
    struct drc__itree_bt *leaf = region_leaf(r);

    revoke_take(c, r, revoking);
    retire_at(c, r, dead, path, leaf);
}

/* Deregister each region revoke_take took (no lock held), then drop the reference it took. */
static void revoke_list(drc_cache_t *c, struct drc_region *r)
{
    struct drc_region *next;

    for (; r; r = next) {
        next = r->next;     /* before put_ref: the last one reuses r->next for a release list */
        be_dereg(c, r->handle);
        put_ref(c, r);
    }
}

static int nothing_registered(const drc_cache_t *c)
{
    return !c->tree.root && !c->detached && !c->pending && !announced(c) && !off_held(c);
}

/* The last user of r is gone (its put left @w, HELD or HELD|DEAD): release a detached region, refresh the LRU. */
static int became_idle(drc_cache_t *c, struct drc_region *r, uint64_t w)
{
    struct drc_region *dead = NULL;

    tally(c, ST_IDLED);
    if (w & DEAD) {
        if (w & DRAIN)
            return 0;   /* retire is moving thread references into the word: its drain_end releases */
        /* invalidated while held, in no tree: nothing but the count to update, no lock */
        if (!try_release_w(r, w, &dead))
            return 0;   /* a stale lookup took it meanwhile: its put releases it */
        tally(c, ST_OFF_GONE);
        return release_list(c, dead);
    }
    if (!LD_SC(r->detached) && !c->limited)
        return 0;
    lock(c);
    if (LD(r->detached) == DETACHED_LIST) {
        if (try_release(c, r, &dead))
            detached_del(c, r);
    } else if (c->limited && LD(r->detached) == LIVE && (LD(r->word) & HELD)) {
        /* live: it is now the most recently idle */
        lru_unlink(c, r);
        lru_append(c, r);
        if (over_limits(c)) {
            seq_begin(c);
            evict(c, &dead);
            seq_end(c);
        }
    }
    unlock(c);
    return release_list(c, dead);
}

static HIT_INLINE int covers(const drc_cache_t *c, const struct drc_region *r, uintptr_t s, uintptr_t last, unsigned access)
{
    return LD(r->node.start) <= s && LD(r->node.last) >= last && serves(c, LD(r->access), access);
}

/*
 * Is held region r over a range that a free event handed to the lock holder
 * (queue_invalidation)? Then it must not be returned: the event has
 * returned, and r leaves the tree when the holder runs the queue. Checked
 * after r is otherwise validated and before the final detached check, so
 * that a queue run in between is seen there.
 */
static HIT_INLINE int handed_over(const drc_cache_t *c, const struct drc_region *r)
{
    return LD_SC(c->ninvq) && queued(c, LD(r->node.start), LD(r->node.last));
}

static HIT_INLINE struct drc_region *lookup_lockless(drc_cache_t *c, uintptr_t s, uintptr_t last,
                                                    unsigned access, struct probe *pr)
{
    const struct drc__itree_bt *near;
    struct drc_region *r, **hs;
    unsigned seq;
    int budget, tries;

    /*
     * The hint: no sequence count. Once tryget holds r, r cannot be released
     * or reused, so its bounds and bits are what they will stay: check them
     * again, then that r is still live. Every path out of the tree either
     * sets `detached` before the CAS that would release r (retire: then our
     * SC load sees it, or our CAS came first and the lookup is ordered before
     * that writer) or releases r first (evict: then tryget failed). A region
     * being published holds the count of its getter and is inserted in the
     * same locked section: taking it is a lookup ordered after that insert.
     * So writers elsewhere in the cache never make a hint hit retry.
     */
    pr->none = 0;               /* struct probe: nothing learned, unless the descent below finds nothing */
    hs = hint_slot(c, s);
    r = __atomic_load_n(hs, __ATOMIC_ACQUIRE);   /* the region's memory as its publisher left it */
    if (r && !slot_is_leaf(r) && covers(c, r, s, last, access)) {
        if (!tryget_fast(c, r))
            return NULL;        /* released since it was left here: most likely a miss, and the locked
                                 * path (which any miss takes) finds a region that replaced it, and
                                 * leaves it here; no descent for nothing */
        if (covers(c, r, s, last, access) && !handed_over(c, r) && LD_SC(r->detached) == LIVE)
            return r;
        put_ref(c, r);            /* left the tree, or was reused: walk it, and the walk replaces the hint */
    }
    /*
     * Beyond the hull (a cache filled in address order), or over grains no
     * live region touches (the used-grain filter: a range registered for
     * the first time, in any order): a miss without the descent. A wrong
     * "miss" here only sends the lookup to the locked path.
     */
    near = slot_leaf(r);
    if (s < LD(c->lo) || last > LD(c->hi) ||
        (!near && used_none(__atomic_load_n(&c->hint, __ATOMIC_ACQUIRE), s, last)))
        return NULL;
    for (tries = 0; tries < 2; tries++) {
        seq = __atomic_load_n(&c->seq, __ATOMIC_ACQUIRE);
        if (seq & 1)
            return NULL;        /* a writer is at work: wait for it on the lock */
        budget = LOOKUP_BUDGET;
        r = find_containing(c, s, last, access, &budget, pr, near);
        if (!r || !tryget_fast(c, r))
            return NULL;
        __atomic_thread_fence(__ATOMIC_ACQUIRE);    /* the walk's loads before the re-read */
        /* seq unchanged: no writer ran since the first load, so r was live in the tree then */
        if (LD(c->seq) == seq && !handed_over(c, r) && !LD_SC(r->detached)) {
            __atomic_store_n(hs, r, __ATOMIC_RELEASE);
            return r;
        }
        put_ref(c, r);
    }
    return NULL;
}

/* DRC_F_VALIDATE: is a CUDA hit still the buffer it was registered on? */
static __attribute__((noinline)) int stale_check(const struct drc_region *r, uintptr_t s, uintptr_t last)
{
    const struct region_mem *rm = region_mem(r);
    struct drc__mem m;

    DRC_ASSERT_NO_LOCK();
    /* the region's struct drc__mem again: constant while the hit holds its reference */
    m = (struct drc__mem){ .type = rm->type, .device = rm->device, .lo = rm->lo, .hi = rm->hi,
                           .buffer_id = rm->buffer_id, .ctx = rm->ctx,
                           .nchunks = rm->chunks ? rm->chunks->n : 0 };
    if (m.nchunks)
        memcpy(m.chunk, rm->chunks->chunk, m.nchunks * sizeof(m.chunk[0]));
    return !drc__mem_unchanged(&m, s, last - s + 1);
}

static HIT_INLINE int stale_hit(const drc_cache_t *c, const struct drc_region *r, uintptr_t s, uintptr_t last)
{
    return (c->flags & DRC_F_VALIDATE) && region_type(r) == DRC_MEM_CUDA && stale_check(r, s, last);
}

/*
 * drc_get, drc__get_widened and drc__get_view; one body, inlined in each. A miss widens (cache_miss.c:
 * widen_to) unless @access shares a bit with @no_widen (cache.h); computed on the miss only.
 */
static HIT_INLINE int get(drc_cache_t *c, const void *addr, size_t len, unsigned access, unsigned no_widen,
                          drc_region_t **out)
{
    struct drc_region *r;
    struct probe pr;
    uintptr_t s, last, rs;
    size_t rlen;
    int err, tries;

    if (!c || !out || !addr || (access & ~DRC_ACCESS_MASK))
        return -EINVAL;
    err = closed_range(addr, len, &s, &last);
    if (err)
        return err;
    if (LD(c->inert))
        return -ESTALE;
    for (tries = 0; tries < REG_RETRIES; tries++) {
        r = lookup_lockless(c, s, last, access, &pr);
        if (r) {
            count_hit(c);
            err = 0;
        } else if ((err = get_slow(c, s, last, access, !((access | DRC__NO_WIDEN_EVER) & no_widen), &pr, &r)) ==
                   RACED) {
            continue;
        } else if (err < 0) {
            return err;
        }
        if (err == 0 && stale_hit(c, r, s, last)) {
            /* freed and reallocated behind every hook: treat it as the invalidation it was */
            drc_region_bounds(r, &rs, &rlen);
            put_ref(c, r);
            drc_invalidate(c, (const void *)rs, rlen);
            continue;
        }
        *out = r;
        return 0;
    }
    return -EAGAIN;
}

int drc_get(drc_cache_t *c, const void *addr, size_t len, unsigned access, drc_region_t **out)
{
    return get(c, addr, len, access, DRC__NO_WIDEN_EVER, out);
}

int drc__get_widened(drc_cache_t *c, const void *addr, size_t len, unsigned access, drc_region_t **out)
{
    return get(c, addr, len, access, 0, out);
}

/* drc_put's last put of a region invalidated while held: its CAS took the word to 0 (see drc_put). */
static __attribute__((noinline)) int put_released(drc_cache_t *c, struct drc_region *r)
{
    tally(c, ST_IDLED);
    tally(c, ST_OFF_GONE);
    r->next = NULL;
    return release_list(c, r);
}

int put_ref(drc_cache_t *c, struct drc_region *r)
{
    uint64_t w;

    /* a thread slot first, if any thread joined (a hit's reference: tryget_fast) */
    if (LD(c->refmask) && put_slot(c, r))
        return 0;
    w = LD(r->word);
    for (;;) {
        if (!USERS(w)) {
            if (!(w & DRAIN))
                return put_other(c, r);
            cpu_relax();    /* a drain is moving slot counts into the word: wait for them */
            w = LD_SC(r->word);
            continue;
        }
        /*
         * The last user of a region invalidated while held (HELD|DEAD|1)
         * drops its reference and releases the region in one CAS, where
         * became_idle's path takes two (the decrement, then CAS(HELD|DEAD
         * -> 0)). The same outcomes: a stale lookup's tryget lands before
         * it (then w has two users and this only decrements) or after it
         * (HELD is clear: the tryget fails). Out of line, so that the hit's
         * put saves no registers.
         */
        if (w == (HELD | DEAD | 1)) {
            if (__atomic_compare_exchange_n(&r->word, &w, 0, 1, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED))
                return put_released(c, r);
            continue;
        }
        if (__atomic_compare_exchange_n(&r->word, &w, w - 1, 1, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED))
            break;
    }
    return USERS(w - 1) ? 0 : became_idle(c, r, w - 1);
}

int drc_put(drc_cache_t *c, drc_region_t *r)
{
    if (!c || !r || region_cache(r) != c)
        return -EINVAL;
    if (LD(c->inert))
        return 0;           /* the parent's region: nothing to do in a fork child */
    return put_ref(c, r);
}

int drc__get_view(drc_cache_t *c, const void *addr, size_t len, unsigned access, unsigned no_widen,
                  struct drc__region_view *v)
{
    int err = get(c, addr, len, access, no_widen, &v->region);
    struct drc_region *r;

    if (err)
        return err;
    r = v->region;
    v->handle = !LD_SC(r->revoked) ? r->handle : NULL;     /* drc_region_handle()'s rule */
    v->lkey = r->lkey;
    v->rkey = r->rkey;
    v->type = region_type(r);
    return 0;
}

int drc__region_put(drc_region_t *r)
{
    drc_cache_t *c = region_cache(r);

    if (LD(c->inert))
        return 0;           /* as drc_put */
    return put_ref(c, r);
}

/*
 * The lockless probe of an invalidation (a free event): 1 if, at one instant,
 * no live region overlapped [s, last], no registration was pending or being
 * inserted, and no superseded region (still valid) was held. Then there is
 * nothing to invalidate, and drc_invalidate returns without the lock. It is
 * the hit path's protocol (the used-grain filter of struct hint_tab, or a
 * walk of the tree, under the sequence count: a writer changes both inside
 * its window), read as:
 *   getter (miss)                          probe
 *   lock; add pending; npending++ (SC)     s = seq (even, else take the lock)
 *   unlock; wait for frees in flight       npending, announced bits, detached:
 *                                            0, 0, 0 ?
 *   register                               walk the tree: nothing overlaps ?
 *   lock; seq++; insert; seq++             seq == s ?  nothing there
 *   npending-- (release); unlock
 * (An announced miss replaces the first line's section by its SC CAS, which
 * sets its bit, and the last line's count by its unlock, which clears it.)
 * A registration counted before the probe's load of npending sends the
 * probe to the lock. One counted after it began after the probe's instant:
 * it is the race that every invalidation has with a registration begun
 * after it, closed for frees by the bracket of notify.c (npending is
 * stored before the getter reads the frees in flight, and the freer's entry
 * is published before the probe reads npending: one of the two sees the
 * other). An insert that the walk could miss changes seq.
 */
static inline __attribute__((always_inline)) int nothing_there(drc_cache_t *c, uintptr_t s, uintptr_t last,
                                                              struct drc__itree_path *path,
                                                              struct drc_region **hr)
{
    unsigned seq = __atomic_load_n(&c->seq, __ATOMIC_ACQUIRE);
    int budget = LOOKUP_BUDGET;
    struct drc_region *r, **hs;

    if ((seq & 1) || LD_SC(c->npending) || (LD_SC(c->lw) & LW_ANNOUNCED) || LD(c->detached))
        return 0;
    /*
     * No live region touches a grain of the range (one load, from a table
     * that stays in cache), or none overlaps it: the tree's overlap query,
     * while regions are disjoint one descent for the floor of s and the
     * node after it (or none, past the largest region). Before the descent,
     * if @hr is given (cache_invalidate's by_hint), the hint slot of s: a
     * region there that looks live and holds the whole range answers
     * "something there" in *hr, and the locked path checks it (range_holder)
     * before it takes it as the range's only region.
     */
    if (!used_none(__atomic_load_n(&c->hint, __ATOMIC_ACQUIRE), s, last)) {
        hs = hint_slot(c, s);
        if (!hr)
            __builtin_prefetch(hs, 1);      /* for hint_forget, should a region go: during the walk */
        r = hr ? __atomic_load_n(hs, __ATOMIC_ACQUIRE) : NULL;
        if (r && !slot_is_leaf(r) && LD(r->node.start) <= s && LD(r->node.last) >= last && is_live(r)) {
            *hr = r;
            return 0;
        }
        if (drc__itree_first_near(&c->tree, s, last, &budget, path, slot_leaf(r)) || budget <= 0)
            return 0;           /* something there (or a torn walk): the locked path decides, from
                                 * where the walk found it if the tree has not changed since */
    }
    __atomic_thread_fence(__ATOMIC_ACQUIRE);    /* the walk's loads before the re-read */
    return LD(c->seq) == seq;
}

/*
 * The memory is going away: what the device layer keeps for it (the shared
 * dmabuf export, which would keep freed GPU memory taken) goes too, then this
 * cache's regions. drc_notify_free() releases once and calls
 * drc__cache_invalidate() for each cache.
 */
/*
 * @by_hint: the lockless probe asks the hint slot of the range's start
 * before it walks (nothing_there). drc_invalidate() does: a caller that
 * invalidates a range has most often just used it, and its lookup left the
 * slot and the region in cache, where the walk's lower levels are not. A
 * free event does not: it comes long after the memory's last lookup, its
 * slot is a cache miss of its own, and in a large table that miss costs
 * more than the walk's upper levels, which stay in cache
 * (tests/bench/RESULTS.md has the measurements).
 */
static inline __attribute__((always_inline)) int cache_invalidate(drc_cache_t *c, const void *addr, size_t len,
                                                                 int by_hint)
{
    struct drc_region *dead = NULL, *revoking = NULL, *hr = NULL;
    struct drc__itree_path path;
    uintptr_t s, last;
    int count;

    if (!c)
        return -EINVAL;
    if (len == 0)
        return 0;
    if (closed_range(addr, len, &s, &last))
        return -EINVAL;
    if (LD(c->inert))
        return 0;           /* a fork child never deregisters the parent's regions */
    /* The hull covers every pending registration too, so skipping here misses none. */
    if (last < __atomic_load_n(&c->lo, __ATOMIC_ACQUIRE) || s > __atomic_load_n(&c->hi, __ATOMIC_ACQUIRE))
        return 0;
    path.depth = 0;
    if (nothing_there(c, s, last, &path, by_hint ? &hr : NULL))
        return 0;
    if (!trylock(c)) {
        /* DRC_F_REVOKE promises the deregistration before return: never handed to the holder */
        if (!(c->flags & DRC_F_REVOKE) && queue_invalidation(c, s, last))
            return 0;   /* the holder of the lock does it, before any get can see the range */
        lock(c);        /* the queue is full */
    } else {
        locked(c);
    }
    count = invalidate_locked(c, s, last, &dead, &revoking, &path, hr);
    unlock(c);
    release_list(c, dead);
    revoke_list(c, revoking);
    return count;
}

int drc_invalidate(drc_cache_t *c, const void *addr, size_t len)
{
    if (c && len && (uintptr_t)addr + (len - 1) >= (uintptr_t)addr && !LD(c->inert))
        drc__mem_released((uintptr_t)addr, len);
    return cache_invalidate(c, addr, len, 1);
}

int drc__cache_invalidate(drc_cache_t *c, const void *addr, size_t len)
{
    return cache_invalidate(c, addr, len, 0);
}

/*
 * Is @r (a hint slot's region, read without the lock) live in the tree,
 * holding all of [s, last], while regions are disjoint (c->lock)? Then no
 * other live region overlaps the range. Under the lock a region is live
 * exactly when its word is HELD and it is not detached (is_live), and a
 * live region's bounds are constant: what the lockless read saw may have
 * been a region since released or reused, which this reads anew.
 */
static int range_holder(const drc_cache_t *c, const struct drc_region *r, uintptr_t s, uintptr_t last)
{
    return r && !LD(c->overlapping) && is_live(r) && r->node.start <= s && r->node.last >= last;
}

/*
 * The body of an invalidation (c->lock held): regions out, held ones detached, pending ones stale;
 * with DRC_F_REVOKE, every region it invalidates also goes on @revoking (NULL only from the queue,
 * which a revoking cache never uses). @hr: the region the lockless probe found in the hint slot of
 * s, or NULL; taken as the range's only region if range_holder() says so, else the tree is walked.
 */
int invalidate_locked(drc_cache_t *c, uintptr_t s, uintptr_t last, struct drc_region **dead,
                      struct drc_region **revoking, struct drc__itree_path *path, struct drc_region *hr)
{
    struct drc__itree_path own;
    struct drc_region *r;
    struct drc__itree_node *n;
    struct pending *p;
    int count = 0, budget, more;
    unsigned bits;

    ASSERT_LOCKED(c);
    budget = DRC__ITREE_UNBOUNDED;
    if (!path) {
        path = &own;
        own.depth = 0;
    }
    /*
     * The first region in the range: where the lockless probe found it, if
     * the tree has not changed since (its count did not move: the same
     * tree, the same answer), else a walk. The path also takes it out of
     * the tree with no second descent (drc__itree_remove_at), and leaves
     * the path at its successor, where the next region of the range is.
     */
    if (range_holder(c, hr, s, last)) {
        n = &hr->node;      /* the range's only region; no walk found it: out from its leaf (unlink_live) */
    } else {
        n = drc__itree_at(&c->tree, path);
        if (!n)
            n = drc__itree_first_at(&c->tree, s, last, &budget, path);
    }
    if (n) {
        seq_begin(c);
        while (n) {
            /* disjoint regions (no overlap yet): none after one that reaches past the range */
            more = LD(c->overlapping) || LD(n->last) < last;
            r = region_of(n);
            ST_SC(r->valid, 0);
            revoke_retire(c, r, dead, revoking, path);
            count++;
            if (!more)
                break;
            /*
             * Every region of the range before n's successor is out: the
             * successor along the path if it overlaps; if it does not, while
             * regions are disjoint, no later one does; else a walk from the
             * range's start finds the next one, or none.
             */
            n = drc__itree_at(&c->tree, path);
            if (n && LD(n->start) <= last && LD(n->last) >= s)
                continue;
            if (n && !LD(c->overlapping))
                break;
            n = drc__itree_first_at(&c->tree, s, last, &budget, path);
        }
        seq_end(c);
    }
    for (r = c->detached; r; r = region_ext(r)->lru_next) {
        if (LD(r->node.start) <= last && s <= LD(r->node.last) && LD(r->valid)) {
            ST_SC(r->valid, 0);
            revoke_take(c, r, revoking);
            count++;
        }
    }
    for (p = c->pending; p; p = p->next)
        if (p->start <= last && s <= p->last)
            p->stale = 1;
    for (bits = announced(c); bits; bits &= bits - 1) {
        p = &c->announced[LW_SLOT_OF(bits)];
        if (p->start <= last && s <= p->last)
            p->stale = 1;
    }
    INC(c->invalidated, (uint64_t)count);
    if (nothing_registered(c)) {
        __atomic_store_n(&c->lo, UINTPTR_MAX, __ATOMIC_RELEASE);
        __atomic_store_n(&c->hi, 0, __ATOMIC_RELEASE);
    }
    return count;
}

int drc__cache_create(const struct drc_backend *be, const struct drc_config *cfg,
                      const struct drc__cache_opts *o, drc_cache_t **out)
{
    drc_cache_t *c;
    int err;

    /* drc.h's ABI rule: only the fields a caller's comp_mask covers are read (none after 0.1's yet) */
    if (!be || !out || !be->reg || !be->dereg || be->comp_mask ||
        (cfg && ((cfg->flags & ~KNOWN_FLAGS) || cfg->comp_mask)))
        return -EINVAL;
    drc__mem_prepare();     /* the device layer's driver, loaded here rather than in the first miss */
    c = mem_alloc(sizeof(*c));
    if (!c)
        return -ENOMEM;
    c->be.reg = be->reg;      /* field by field: an older caller's struct may end earlier */
    c->be.dereg = be->dereg;
    c->be.ctx = be->ctx;
    c->page = (size_t)sysconf(_SC_PAGESIZE);
    c->page_shift = (unsigned)__builtin_ctzll(c->page);
    c->lo = UINTPTR_MAX;
    drc__arena_init(&c->arena);
    drc__arena_init_lazy(&c->ext_arena);
    if ((err = hint_init(c)))
        goto err_hint;
    if (cfg) {
        c->flags = cfg->flags;
        c->max_regions = cfg->max_regions;
        c->max_bytes = cfg->max_bytes;
    }
    c->limited = c->max_regions || c->max_bytes;
    drc__itree_init(&c->tree, 1);   /* its nodes from the arena, given before the lock (get_slow) */
    /*
     * Coalesced regions are disjoint until `overlapping`: the index walks
     * them as such (itree.h) until the first overlap arrives. A cache that
     * never merges expects overlaps from the start.
     */
    drc__itree_set_disjoint(&c->tree, !(c->flags & DRC_F_NO_MERGE));
    if (o) {
        c->max_len = o->max_len;
        c->release = o->release;
        c->export_flags = o->export_flags;
        c->forked = o->forked;
    }
    err = drc__notify_subscribe(c);
    if (err)
        goto err_hint;
    *out = c;
    return 0;

err_hint:
    hint_fini(c);
    drc__arena_fini(&c->ext_arena);
    drc__arena_fini(&c->arena);
    mem_free(c);
    return err;
}

int drc_region_invalidate(drc_cache_t *c, drc_region_t *r)
{
    struct drc_region *dead = NULL, *revoking = NULL;
    int n = 0;

    if (!c || !r || region_cache(r) != c || !held(c, r))
        return -EINVAL;     /* the caller's reference keeps r from being released or reused below */
    if (LD(c->inert))
        return 0;
    lock(c);
    if (LD(r->detached) == LIVE) {
        seq_begin(c);
        /* a release store: drc_region_valid() readers need no order beyond it, and the word's RMWs follow */
        __atomic_store_n(&r->valid, 0, __ATOMIC_RELEASE);
        revoke_retire(c, r, &dead, &revoking, NULL);
        seq_end(c);
        n = 1;
    } else if (LD(r->valid)) {
        ST_SC(r->valid, 0);     /* superseded but still valid: now it is not */
        revoke_take(c, r, &revoking);
        n = 1;
    }
    INC(c->invalidated, (uint64_t)n);
    unlock(c);
    release_list(c, dead);      /* empty: the caller still holds r */
    revoke_list(c, revoking);   /* DRC_F_REVOKE: r, deregistered now */
    return n;
}

/*
 * In a fork() child (notify.c's atfork handler, only this thread exists):
 * the cache is the parent's, its registrations and backend context too. It
 * becomes inert: no backend call ever again, lookups fail with -ESTALE, puts
 * and invalidations do nothing, destroy frees drc's memory only. Its lock
 * may have been held by a parent thread that does not exist here: made anew,
 * as are the backend's (drc__cache_opts.forked). core/fork.h has the order.
 */
void drc__cache_forked(drc_cache_t *c)
{
    ST(c->inert, 1);
    memset(c->invq, 0, sizeof(c->invq));    /* ranges queued by parent threads: the parent's business */
    c->ninvq = 0;
    c->qdead = NULL;
    c->lw = 0;              /* the lock, and the misses that parent threads announced */
    c->pending_gen = 0;
    c->pending_waiters = 0;
    drc__arena_forked(&c->arena);
    drc__arena_forked(&c->ext_arena);
    if (c->forked)
        c->forked(c->be.ctx);   /* the backend's own locks (a verbs cache's decision lock) */
#ifdef DRC_DEBUG
    c->owner = (pthread_t)0;
    drc__lock_depth = 0;
#endif
}

int drc_cache_create(const struct drc_backend *be, const struct drc_config *cfg, drc_cache_t **out)
{
    return drc__cache_create(be, cfg, NULL, out);
}

#ifdef DRC_DEBUG
/* Called at every unlock: the trees are well formed and c->regions counts the live one. */
void check_trees(const drc_cache_t *c)
{
    long live = drc__itree_check(&c->tree), det = 0;
    const struct drc_region *d;

    for (d = c->detached; d; d = region_ext(d)->lru_next, det++)
        DRC_ASSERT(LD(d->detached) == DETACHED_LIST &&
                   (!region_ext(d)->lru_next || region_ext(region_ext(d)->lru_next)->lru_prev == d));

    DRC_ASSERT(live >= 0 && (uint64_t)live == c->regions);
    {
        struct drc__itree_node *n;
        int budget = DRC__ITREE_UNBOUNDED;
        const struct chunk *ch;
        uint64_t found = 0;
        unsigned i;

        for (n = drc__itree_first(&c->tree, 0, UINTPTR_MAX, &budget); n;
             n = drc__itree_next(&c->tree, n, 0, UINTPTR_MAX, &budget)) {
            DRC_ASSERT(is_live(region_of(n)));
            /* the used-grain filter of a complete table never says "nothing" over a live region */
            DRC_ASSERT(!used_none(c->hint, n->start, n->start) && !used_none(c->hint, n->last, n->last));
        }
        /* a chunk walk finds exactly the tree's regions */
        for (ch = c->chunks; ch; ch = ch->next)
            for (i = 0; i < ch->carved; i++)
                found += is_live(&ch->r[i]);
        DRC_ASSERT(found == c->regions);
    }
    DRC_ASSERT(det >= 0);
    DRC_ASSERT(!c->limited || !c->regions == !c->lru_head);
}
#endif

/*
 * Is a live region held (c->lock)? A walk of the chunks (is_live, which
 * check_trees holds to the tree): one line per region in allocation order,
 * which the prefetcher follows, where a walk of the index adds its leaves
 * and reaches the regions in address order.
 */
static int live_held(const drc_cache_t *c)
{
    const struct chunk *ch;
    unsigned i;

    for (ch = c->chunks; ch; ch = ch->next)
        for (i = 0; i < ch->carved; i++)
            if (is_live(&ch->r[i]) && USERS(LD(ch->r[i].word)))
                return 1;
    return 0;
}

static int busy(const drc_cache_t *c)
{
    return c->pending || announced(c) || c->detached || off_held(c) || live_held(c) || slot_refs(c, NULL, 1);
}

int drc_cache_destroy(drc_cache_t *c)
{
    struct chunk *ch;
    unsigned i;

    if (!c)
        return -EINVAL;
    if (!LD(c->inert)) {
        lock(c);
        if (busy(c)) {
            unlock(c);
            return -EBUSY;
        }
        unlock(c);
        drc__notify_unsubscribe(c);     /* no drc_notify_free() reaches c after this */
        for (ch = c->chunks; ch; ch = ch->next)
            for (i = 0; i < ch->carved; i++)
                if (is_live(&ch->r[i]))
                    be_dereg(c, ch->r[i].handle);
        if (c->release)
            c->release(c->be.ctx);
    }   /* else a fork child's copy: free drc's own memory only, the registrations are the parent's */
    for (ch = c->chunks; ch; ch = ch->next)
        for (i = 0; i < ch->carved; i++)
            mem_free(region_chunks(&ch->r[i]));
    hint_fini(c);
    drc__arena_fini(&c->ext_arena);
    drc__arena_fini(&c->arena);     /* every chunk, hint table header and filter */
    mem_free(c);
    return 0;
}

int drc_region_valid(const drc_region_t *r)
{
    return r && LD_SC(r->valid);
}

void drc_region_bounds(const drc_region_t *r, uintptr_t *start, size_t *len)
{
    if (start)
        *start = r ? LD(r->node.start) : 0;
    if (len)
        *len = r ? region_len(r) : 0;
}

uint32_t drc_region_lkey(const drc_region_t *r)
{
    return r ? r->lkey : 0;
}

uint32_t drc_region_rkey(const drc_region_t *r)
{
    return r ? r->rkey : 0;
}

void *drc_region_handle(const drc_region_t *r)
{
    /* revoked (DRC_F_REVOKE): the backend released the handle, never hand it out */
    return r && !LD_SC(r->revoked) ? r->handle : NULL;
}

enum drc_mem_type drc_region_type(const drc_region_t *r)
{
    return r ? region_type(r) : DRC_MEM_HOST;
}

unsigned drc_region_access(const drc_region_t *r)
{
    return r ? LD(r->access) : 0;
}

const struct drc_backend *drc__cache_backend(const drc_cache_t *c)
{
    return &c->be;
}

drc_cache_t *drc__region_cache(const drc_region_t *r)
{
    return region_cache(r);
}

