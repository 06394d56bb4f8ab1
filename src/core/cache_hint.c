/*
 * The hint table (struct hint_tab: a grain of address space -> the region a
 * lookup last found there) and its used-grain filter: the filter's bits, the
 * table's allocation, and its growth with the cache. The lookups that read
 * them are in cache.c (lookup_lockless, nothing_there) and cache_miss.c
 * (plan_region). A replaced table gives its slot pages back (hint_drop).
 */
#include "core/cache_int.h"

#include <sys/mman.h>

/*
 * The used-grain filter: beside its slots, a hint table keeps one bit per
 * slot, set for every grain (modulo the table size, as slots are) that a
 * live region touches. publish() sets a region's bits under c->lock with
 * the sequence count odd, before the region is in the tree; nothing clears
 * a bit (a region that leaves keeps its bits: the filter may say "maybe"
 * where nothing is, never "nothing" where a region is). A free-event probe
 * (nothing_there) that finds every bit of its range clear, and the
 * sequence count unchanged around that read, knows that no live region
 * touched the range at that instant: one load from a table of slots / 8
 * bytes (16-32 KiB at 65,536 regions), where a descent of the tree costs
 * dependent loads, cache misses in a large cache. A table is complete when
 * it was made for an empty cache, or when hint_grow's lockless fill ran
 * with no writer in between (the count was even and unchanged from before
 * the fill to the install under the lock);
 * otherwise the probe skips the filter until the next grow. A miss uses it
 * too: a lookup over unused grains skips the lockless descent, and the
 * merge plan (under the lock) the overlap walk, so that a range registered
 * for the first time, in any order, pays one descent (the insert's).
 */
void used_set(struct hint_tab *t, uintptr_t start, uintptr_t last)
{
    uintptr_t g = start >> t->grain, end = last >> t->grain, nbits = ~(uintptr_t)0 >> t->shift;
    size_t w, words = (nbits >> 6) + 1;

    if (end - g >= nbits) {
        for (w = 0; w < words; w++)
            ST(t->used[w], ~(uint64_t)0);
        return;
    }
    for (;; g++) {
        w = (g & nbits) >> 6;
        ST(t->used[w], LD(t->used[w]) | (uint64_t)1 << (g & 63));    /* one writer: c->lock, or the
                                                                       * grower of a table not yet seen */
        if (g == end)
            break;
    }
}

/* 1 if no grain of [s, last] is used in @t (a complete table); 0 if one may be, or the range is long. */
int used_none(const struct hint_tab *t, uintptr_t s, uintptr_t last)
{
    uintptr_t g = s >> t->grain, end = last >> t->grain, nbits = ~(uintptr_t)0 >> t->shift;

    if (!LD(t->complete) || end - g >= 64)
        return 0;
    for (;; g++) {
        if (LD(t->used[(g & nbits) >> 6]) & (uint64_t)1 << (g & 63))
            return 0;
        if (g == end)
            return 1;
    }
}

/* A zeroed table of 2^bits slots from the cache's arena (no lock held), or NULL. */
struct hint_tab *hint_new(drc_cache_t *c, unsigned bits, struct hint_tab *older)
{
    size_t slots = sizeof(struct drc_region *) << bits, used = ((((size_t)1 << bits) >> 6) + 1) * sizeof(uint64_t);
    struct hint_tab *t = drc__arena_alloc(&c->arena, sizeof(*t) + slots + used);

    if (t) {
        t->shift = 64 - bits;
        t->grain = 12;
        t->older = older;
        t->used = (uint64_t *)(void *)&t->slot[(size_t)1 << bits];     /* after the slots: 8-aligned */
    }
    return t;
}

/*
 * The size (log2 slots) the hint table should grow to, or 0 (c->lock): it
 * doubles once the live regions reach half its slots, so that it keeps two
 * to four slots per region (16-32 bytes). The grain is the mean region size
 * rounded down to a power of two, and a slot is the grain number modulo the
 * table size: regions laid out with gaps no larger than themselves span at
 * most about two grains each, which then fit without a collision. Growing
 * 4x at a quarter full would keep four to sixteen slots per region: up to
 * 128 bytes per region, for no fewer collisions in that layout.
 */
unsigned hint_want(const drc_cache_t *c)
{
    unsigned bits = 64 - c->hint->shift;

    ASSERT_LOCKED(c);
    if (bits >= HINT_MAX_BITS || c->regions < (1ull << (bits - 1)))
        return 0;
    return bits + 1;
}

/*
 * Give a table's slot pages back (no lock held): a replaced one, or one
 * that lost the race to be installed (no reader ever saw it). A lockless
 * lookup or free-event probe may still hold a pointer to a replaced table,
 * so the table stays mapped, and only the pages wholly inside its slot
 * array are dropped: MADV_DONTNEED, after which private anonymous pages read
 * as zero. Its header (shift, grain, complete, used) and its used-grain
 * filter (1/64 of the table) stay as they were. What a reader that loaded
 * the old pointer may then see:
 *
 *   grower (hint_grow)                      lookup / free-event probe
 *                                           t = c->hint (the old table)
 *   lock; c->hint = new (release); unlock
 *   madvise(t's slot pages, DONTNEED)
 *                                           r = t->slot[i]: the old value, or 0
 *                                           used_none(t, ...): the old bits
 *                                           t->slot[i] = r (a lookup, after its walk)
 *
 * A slot is a guess that every lookup checks (bounds, tryget, bounds,
 * detached: lookup_lockless): 0 is NULL, a miss that walks the tree, and the
 * old value is as stale as it could have been before the drop. The filter,
 * whose clear bit would tell a probe "nothing there" (nothing_there), is
 * never dropped: a zeroed filter would send a free event past a live region
 * whose registration must go, and a probe that read the old pointer reads
 * the bits it would have read had the table been kept whole, validated by
 * the sequence count (the filter's comment above). A lookup that stores into a dropped page
 * faults one zeroed page back in: memory, not correctness, and at most a
 * page per lookup that was in flight across the install. madvise may be
 * intercepted (drc's hooks make it a free event over memory nobody
 * registered): called, as the arena calls it, with no cache lock held. If
 * it fails (mlocked memory), the pages simply stay.
 */
static void hint_drop(struct hint_tab *t)
{
    /*
     * Whole huge pages only: the arena's large mappings are advised
     * MADV_HUGEPAGE, and dropping part of a huge page splits it, so that the
     * rest of it (regions, index nodes, the next table, or the next cache's
     * memory once the arena keeps the mapping) faults back a small page at
     * a time: a fresh cache's fill took twice as long. A table under two
     * huge pages keeps its memory until drc_cache_destroy.
     */
    uintptr_t huge = (uintptr_t)DRC__ARENA_HUGE;
    uintptr_t lo = ((uintptr_t)&t->slot[0] + huge - 1) & ~(huge - 1);
    uintptr_t hi = (uintptr_t)t->used & ~(huge - 1);     /* the huge page the filter starts in stays */

    DRC_ASSERT_NO_LOCK();
    if (hi > lo)
        (void)madvise((void *)lo, hi - lo, MADV_DONTNEED);
}

/* Grow the hint table to 2^bits slots: allocated without the lock, installed under it. */
void hint_grow(drc_cache_t *c, unsigned bits)
{
    struct hint_tab *t = hint_new(c, bits, NULL), *old = NULL;
    uint64_t regions = LD(c->regions), bytes = LD(c->bytes);
    struct chunk *ch;
    struct drc_region *r;
    uintptr_t g, start, last;
    unsigned seq = __atomic_load_n(&c->seq, __ATOMIC_ACQUIRE);     /* before the fill's loads */
    unsigned i, k, carved;

    if (!t)
        return;     /* without memory, hits only get slower */
    /* the mean region size, rounded down to a power of two, at least a page */
    t->grain = regions ? 63 - (unsigned)__builtin_clzll(bytes / regions | 1) : c->page_shift;
    if (t->grain < c->page_shift)
        t->grain = c->page_shift;
    /*
     * Fill the new table with the live regions before it is installed, so
     * that lookups do not all miss it at once (a table grown at 65,536
     * regions has 128 Ki grains to learn). A lockless walk of the pool
     * chunks: one line per region, in allocation order, where an in-order
     * walk of the tree climbs to parents, a dependent cache miss per region
     * once the tree outgrows the caches. A region that changes under the walk
     * only leaves a slot stale, which lookups check anyway, or a bit set
     * where nothing is, which the filter allows. The first grains of each
     * region are enough for lookups near its start.
     */
    for (ch = __atomic_load_n(&c->chunks, __ATOMIC_ACQUIRE); ch; ch = ch->next) {
        carved = __atomic_load_n(&ch->carved, __ATOMIC_ACQUIRE);
        for (i = 0; i < carved; i++) {
            r = &ch->r[i];
            if (i + 8 < carved)
                __builtin_prefetch(&ch->r[i + 8]);  /* one line in three: 4 % off a fresh fill of 65,536 */
            if (!is_live(r))
                continue;
            start = LD(r->node.start);
            last = LD(r->node.last);
            used_set(t, start, last);
            for (k = region_grains(t, start, last, &g); k--; g++)
                __atomic_store_n(grain_slot(t, g), r, __ATOMIC_RELEASE);
        }
    }
    __atomic_thread_fence(__ATOMIC_ACQUIRE);    /* the fill's loads before the count's re-read */
    lock(c);
    /*
     * The filter is complete if no writer ran since the count was read: every
     * region live then was published in a window before that read, in a
     * chunk the walk reached (pushed, and carved, before that window), and
     * read as live (nothing took it out). A writer after this point sets
     * its bits in the table it finds, this one.
     */
    if (!(seq & 1) && LD(c->seq) == seq)
        ST(t->complete, 1);
    if (64 - c->hint->shift < bits) {
        old = t->older = c->hint;
        __atomic_store_n(&c->hint, t, __ATOMIC_RELEASE);
        t = NULL;
    }
    unlock(c);
    hint_drop(old ? old : t);    /* t: another thread grew it first; unused, its slots given back */
}
