/*
 * The thread slots of a cache (struct stat_slot): the references hits count
 * there instead of in a region's word, the drain that moves them back into
 * the word before a region is released, and the per-thread counters that
 * drc_cache_stats sums. tryget_fast, the getter's side, is on the hit path
 * and stays in cache.c beside the lookup.
 */
#include <errno.h>
#include <string.h>

#include "core/cache_int.h"

/*
 * Thread references. Two threads hitting the same regions would write each
 * region's word on every get and put, and its line would cross between the
 * cores on almost every hit. So a hit counts its reference in a slot of its
 * own thread's line instead (struct stat_slot's ref[], beside its hit
 * counter): the region's line is only read, and stays in both cores' caches.
 * A region's users are then r->word's plus every slot's count of r; the
 * counts are interchangeable (a put takes one from its own slot, else from
 * the word, else from another thread's slot: a reference may be put by
 * another thread than took it). Only a region's release needs the sum, and
 * every release of a live or superseded region drains first, under c->lock:
 *
 *   getter (tryget_fast)                 drainer (drain_begin, c->lock held)
 *   (joined: refmask has my bit)         r->word |= DRAIN (CAS, SC)
 *   slot: r|n -> r|n+1 (CAS, SC)         for each slot of refmask:
 *   w = r->word (SC)                       r|n -> 0 (CAS, SC); moved += n
 *                                        one CAS: word += moved, and
 *   w has HELD, no DEAD, no DRAIN ?      USERS(word) == 0 ? release : clear DRAIN
 *     hit : undo, then tryget (word)
 *
 * Either the getter's load sees DRAIN (and its reference goes to the word,
 * or was moved there: the undo is a put, the word's tryget a get), or its
 * load came first in the single order of SC operations, and so did its
 * increment, which the drainer's load of that slot then sees and moves.
 * While DRAIN is set no put releases r (the word is not yet the sum): the
 * drainer's end does, if nothing is left. A region invalidated while held
 * (DEAD) is drained once, in retire; any later slot count of it is a
 * getter's that sees DEAD and undoes it, so its word stays the sum and its
 * last put releases it without the lock, as before. A cache with limits
 * keeps no thread references: its LRU needs every put that idles a region.
 * Nor does a cache that only one thread hits (join_refs): there a slot saves
 * nothing, and a drain costs an invalidation two more locked instructions
 * (the slot's CAS, the word's final one); with refmask 0 every release is
 * the word's CAS alone, as before.
 */

/*
 * The thread slots that refmask @m lets count references, in order: the
 * first after slot @i (-1 for the first of all), or -1 after the last. Bit
 * 63 covers slots 63 to DRC__TSLOTS (ref_bit).
 *   for (i = joined_next(m, -1); i >= 0; i = joined_next(m, i))
 */
static inline int joined_next(uint64_t m, int i)
{
    if (i >= 63)
        return i < DRC__TSLOTS ? i + 1 : -1;    /* inside bit 63's run: it is set, or i was not given */
    m &= ~0ull << (i + 1);
    return m ? __builtin_ctzll(m) : -1;
}

/*
 * May this thread count its hits' references in its slot? Only once a
 * second thread hit the cache: a cache one thread uses keeps every
 * reference in the word, and its invalidations drain nothing (refmask 0).
 * A thread joins under c->lock, once per cache, so that a drainer, which
 * holds the lock, reads a refmask that no thread changes meanwhile: with
 * no bit set, no slot holds anything and none can until it unlocks.
 */
__attribute__((noinline)) int join_refs(drc_cache_t *c, int i)
{
    uint64_t h;

    if (c->limited)
        return 0;
    h = LD(c->hitters);
    if (!(h & ref_bit(i)))
        h = __atomic_or_fetch(&c->hitters, ref_bit(i), __ATOMIC_RELAXED);
    if (!(h & (h - 1)))
        return 0;           /* the only thread that hit it so far */
    lock(c);
    __atomic_store_n(&c->refmask, LD(c->refmask) | ref_bit(i), __ATOMIC_SEQ_CST);
    unlock(c);
    return 1;
}

/* tryget_fast's reference in thread slot @i (joined). */
__attribute__((noinline)) int tryget_slot(drc_cache_t *c, struct drc_region *r, int i)
{
    struct stat_slot *st = &c->st[i];
    uintptr_t e;
    int k, empty;

again:
    empty = -1;
    for (k = 0; k < REFS; k++) {
        e = LD(st->ref[k]);
        if ((e & ~(uintptr_t)REF_N) == (uintptr_t)r) {
            if ((e & REF_N) == REF_N)
                return tryget(c, r);    /* this slot is full: the word */
            if (!__atomic_compare_exchange_n(&st->ref[k], &e, e + 1, 0, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED))
                goto again;             /* a drain or another thread's put changed it */
            goto check;
        }
        if (!e && empty < 0)
            empty = k;
    }
    if (empty < 0)
        return tryget(c, r);            /* three regions held already: the word */
    e = 0;
    if (!__atomic_compare_exchange_n(&st->ref[empty], &e, (uintptr_t)r | 1, 0, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED))
        goto again;
check:
    if ((LD_SC(r->word) & (HELD | DEAD | DRAIN)) == HELD)
        return 1;
    put_ref(c, r);          /* released, invalidated or being drained: undo, and do as the word says */
    return tryget(c, r);
}

/*
 * Thread slots' references (lockless): with @r, 1 if some slot counts one
 * to r; else the regions some slot counts a reference to and whose word
 * counts none (stats' in_use adds them to the word's), or with @any, 1 at
 * the first reference to anything.
 */
static int slot_holds(const struct stat_slot *st, const struct drc_region *r)
{
    int k;

    for (k = 0; k < REFS; k++)
        if ((LD_SC(st->ref[k]) & ~(uintptr_t)REF_N) == (uintptr_t)r)
            return 1;
    return 0;
}

/* Take one reference to r from thread slot @st (a put): 1, else 0 (it counts none). */
static int slot_put(struct stat_slot *st, const struct drc_region *r)
{
    uintptr_t e;
    int k;

    for (k = 0; k < REFS; k++) {
        e = LD_SC(st->ref[k]);
        while ((e & ~(uintptr_t)REF_N) == (uintptr_t)r)
            if (__atomic_compare_exchange_n(&st->ref[k], &e, (e & REF_N) == 1 ? 0 : e - 1, 0, __ATOMIC_SEQ_CST,
                                            __ATOMIC_RELAXED))
                return 1;
    }
    return 0;
}

__attribute__((noinline)) uint64_t slot_refs(const drc_cache_t *c, const struct drc_region *r, int any)
{
    const struct drc_region *seen[(DRC__TSLOTS + 1) * REFS], *q;
    uint64_t m = LD_SC(c->refmask), n = 0;
    unsigned j;
    uintptr_t e;
    int i, k;

    if (r && slot_holds(&c->st[drc__tslot()], r))
        return 1;       /* the caller's own reference, most likely */
    for (i = joined_next(m, -1); i >= 0; i = joined_next(m, i)) {
        if (r) {
            if (slot_holds(&c->st[i], r))
                return 1;
            continue;
        }
        for (k = 0; k < REFS; k++) {
            if (!(e = LD_SC(c->st[i].ref[k])))
                continue;
            if (any)
                return 1;
            q = (const struct drc_region *)(e & ~(uintptr_t)REF_N);
            if (USERS(LD_SC(q->word)))
                continue;
            for (j = 0; j < n && seen[j] != q; j++)
                ;
            if (j == n)
                seen[n++] = q;
        }
    }
    return r ? 0 : n;
}

/* Take one thread slot's references to r out of it (drain_begin): how many. */
static __attribute__((noinline)) uint64_t drain_slot(struct stat_slot *st, const struct drc_region *r)
{
    uint64_t n = 0;
    uintptr_t e;
    int k;

    for (k = 0; k < REFS; k++) {
        e = __atomic_load_n(&st->ref[k], __ATOMIC_SEQ_CST);
        while ((e & ~(uintptr_t)REF_N) == (uintptr_t)r)
            if (__atomic_compare_exchange_n(&st->ref[k], &e, 0, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
                n += e & REF_N;
                break;
            }
    }
    return n;
}

/*
 * Begin a drain (c->lock held; see "Thread references"): if r is HELD, set
 * DRAIN and @bits in its word, then take every thread slot's references to
 * r out of the slots; *moved says how many, and drain_end adds them to the
 * word. Until it does, the word is short of them: while DRAIN is set no put
 * acts on a count it reads (put_ref waits, became_idle leaves the release to
 * drain_end). 0 if r is not HELD (released already).
 */
int drain_begin(drc_cache_t *c, struct drc_region *r, uint64_t bits, uint64_t *moved)
{
    uint64_t w = LD(r->word), m;
    int i;

    ASSERT_LOCKED(c);
    *moved = 0;
    do {
        if (!(w & HELD))
            return 0;
    } while (!__atomic_compare_exchange_n(&r->word, &w, w | DRAIN | bits, 0, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED));
    m = LD_SC(c->refmask);
    for (i = joined_next(m, -1); i >= 0; i = joined_next(m, i))
        *moved += drain_slot(&c->st[i], r);
    return 1;
}

/*
 * End a drain, in one CAS: add the @moved references to the word, less one
 * if *take (a put's: *take is then cleared if there was none to take), and
 * then release r if @may_release and no user is left (r onto *dead: 1), else
 * clear DRAIN (0). The word's 0 <-> non-0 changes are counted as a get's and
 * a put's are (stats' in_use).
 */
int drain_end(drc_cache_t *c, struct drc_region *r, struct drc_region **dead, int may_release,
                     uint64_t moved, int *take)
{
    uint64_t w = LD_SC(r->word), users;
    int t, released = 0;

    for (;;) {
        t = take && *take && USERS(w) + moved > 0;
        users = USERS(w) + moved - (uint64_t)t;
        if (may_release && !users) {
            if (__atomic_compare_exchange_n(&r->word, &w, 0, 0, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED)) {
                if (USERS(w))
                    tally(c, ST_IDLED);
                r->next = *dead;
                *dead = r;
                released = 1;
                break;
            }
        } else if (__atomic_compare_exchange_n(&r->word, &w, (w & ~DRAIN) + moved - (uint64_t)t, 0,
                                               __ATOMIC_SEQ_CST, __ATOMIC_RELAXED)) {
            if (!USERS(w) != !users)
                tally(c, users ? ST_USED : ST_IDLED);
            break;
        }
    }
    if (take)
        *take = t;
    return released;
}

/* A region out of the tree that a drain released (c->lock): off the detached list, or counted as gone (off_held). */
static void released_detached(drc_cache_t *c, struct drc_region *r)
{
    if (LD(r->detached) == DETACHED_LIST)
        detached_del(c, r);
    else if (LD(r->detached) == DETACHED_OFF)
        tally(c, ST_OFF_GONE);
}

/*
 * Make r's word the sum of its references (takes c->lock), and take one of
 * them if *@take (cleared if there was none to take): how many users r had
 * (before the take), 0 if it was released already or is released here. A
 * region out of the tree left with none is released here: a put that idled
 * it while a drain was moving counts left its release to the drain's end.
 */
static uint64_t drain_locked(drc_cache_t *c, struct drc_region *r, int *take)
{
    struct drc_region *dead = NULL;
    uint64_t moved, n = 0;

    lock(c);
    if (drain_begin(c, r, 0, &moved)) {
        n = USERS(LD_SC(r->word)) + moved;
        if (drain_end(c, r, &dead, LD(r->detached) != LIVE, moved, take)) {
            released_detached(c, r);
            n = 0;
        }
    } else if (take) {
        *take = 0;      /* released: nobody holds it */
    }
    unlock(c);
    release_list(c, dead);
    return n;
}

/*
 * A put that found no reference in its own thread slot nor in the word: a
 * reference another thread took and handed over (counted in that thread's
 * slot), or a put too many. Another slot's count, else, under c->lock, a
 * drain makes the word the sum, and the put takes from it, or finds none.
 */
__attribute__((noinline)) int put_other(drc_cache_t *c, struct drc_region *r)
{
    uint64_t m = LD_SC(c->refmask);
    int i, take = 1;

    if (!m)
        return -EINVAL;     /* no slot counts references: the word's 0 says there is none to put */
    for (i = joined_next(m, -1); i >= 0; i = joined_next(m, i))
        if (slot_put(&c->st[i], r))
            return 0;
    drain_locked(c, r, &take);
    return take ? 0 : -EINVAL;
}

/*
 * Does anyone hold r? Its word or a thread slot says so without the lock;
 * when neither does, a drain may be moving a count from one to the other,
 * so ask again under c->lock with the word made the sum.
 */
int held(drc_cache_t *c, struct drc_region *r)
{
    if (USERS(LD_SC(r->word)) || slot_refs(c, r, 0))
        return 1;
    return LD(c->refmask) && drain_locked(c, r, NULL) != 0;
}

/* A reference to r in this thread's slot, put: 1, else 0 (none there). */
__attribute__((noinline)) int put_slot(drc_cache_t *c, struct drc_region *r)
{
    return slot_put(&c->st[drc__tslot()], r);
}

/* The sum of one per-thread counter. */
uint64_t tally_sum(const drc_cache_t *c, int what)
{
    uint64_t n = 0;
    int i;

    for (i = 0; i <= DRC__TSLOTS; i++)
        n += LD_SC(c->st[i].n[what]);
    return n;
}

/*
 * The references the regions' words count (c->lock not needed): the
 * per-thread 0->1 transitions (used) less the 1->0 ones (idled), read as
 * used, idled, used again until no reference was taken meanwhile (a few
 * tries): then no idled was read that is missing its used. *used and *idled
 * say what was read.
 */
static uint64_t word_users(const drc_cache_t *c, uint64_t *used, uint64_t *idled)
{
    uint64_t again = tally_sum(c, ST_USED);
    int tries;

    for (tries = 0; tries < 16; tries++) {
        *used = again;
        *idled = tally_sum(c, ST_IDLED);
        again = tally_sum(c, ST_USED);
        if (again == *used)
            break;
    }
    return *used > *idled ? *used - *idled : 0;
}

/*
 * stats' in_use: the word's users, and the regions that only thread slots
 * hold (see "Thread references"). The two are read one after the other, and
 * a thread that drops a word's reference and takes a slot's in between
 * (a miss's reference put, then a hit) would be counted twice, once in each,
 * though it never held both:
 *   reader                          thread
 *   word_users: A counted           holds A (the word's: a miss)
 *                                   put A: word 1 -> 0, idled++
 *                                   get B: slot r|0 -> B|1 (a hit)
 *   slot_refs: B counted            holds B
 *   used, idled again: idled moved: read again
 * The thread's idled++ comes before its slot's CAS, which the reader's load
 * of the slot reads, so the reader's second read of idled sees it. So a read
 * whose counts did not move counts each thread's references as they were at
 * one instant (the thread's own, during the read; a reference whose CAS is
 * done and whose count is not yet may be counted either way). Should they
 * keep moving, the larger of the two parts, which counts no thread twice.
 */
static uint64_t in_use(const drc_cache_t *c)
{
    uint64_t used, idled, words = word_users(c, &used, &idled), slots = 0;
    int tries;

    for (tries = 0; tries < 16; tries++) {
        slots = slot_refs(c, NULL, 0);
        if (!slots || (tally_sum(c, ST_USED) == used && tally_sum(c, ST_IDLED) == idled))
            return words + slots;
        words = word_users(c, &used, &idled);
    }
    return words > slots ? words : slots;
}

/* Regions of c->detached that a user holds (c->lock). */
static uint64_t held_in(const drc_cache_t *c)
{
    const struct drc_region *r;
    uint64_t held = 0;

    for (r = c->detached; r; r = region_ext(r)->lru_next)
        held += USERS(LD(r->word)) != 0;
    return held;
}

/*
 * O(1) in the number of regions, and lockless: every counter is kept as it
 * changes; in_use as in_use() says.
 */
void drc_cache_stats(drc_cache_t *c, struct drc_stats *s)
{
    uint32_t want;

    if (!s)
        return;
    want = s->comp_mask & DRC_STATS_ALL;    /* drc.h's ABI rule: write only what the caller's struct has */
    memset(s, 0, offsetof(struct drc_stats, comp_mask));
    s->comp_mask = want;
    if (want & DRC_STATS_DETACHED)
        s->detached = 0;
    if (want & DRC_STATS_DMABUF_DOWNGRADED)
        s->dmabuf_downgraded = 0;
    if (!c)
        return;
    s->hits = tally_sum(c, ST_HITS);
    s->in_use = in_use(c);
    s->deregs = tally_sum(c, ST_DEREGS);
    s->misses = LD(c->misses);
    s->merges = LD(c->merges);
    s->invalidated = LD(c->invalidated);
    s->evicted = LD(c->evicted);
    s->regs = LD(c->regs);
    s->regions = LD(c->regions);
    s->bytes = LD(c->bytes);
    if (want & DRC_STATS_DMABUF_DOWNGRADED)
        s->dmabuf_downgraded = LD(c->downgraded);
    if (want & DRC_STATS_DETACHED) {
        /* held invalid regions are counted as they leave; superseded ones sit in c->detached (few) */
        lock(c);
        s->detached = off_held(c) + held_in(c);
        unlock(c);
    }
}
