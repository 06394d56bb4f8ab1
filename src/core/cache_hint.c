/*
 * The hint table (struct hint_tab: a grain of address space -> the region a
 * lookup last found there) and its used-grain filter: the filter's bits, the
 * table's allocation, and its growth with the cache. The lookups that read
 * them are in cache.c (lookup_lockless, nothing_there) and cache_miss.c
 * (plan_region). Every table of a cache keeps its slots in one range of
 * address space, which the table grows over in place (hint_grow).
 */
#include "core/cache_int.h"

#include <errno.h>

/* The bit of filter grain @g (grain number at t->fgrain) in @t's filter. */
static inline uintptr_t filter_index(const struct hint_tab *t, uintptr_t g)
{
    return hint_index(t, g, t->fbase);
}

/*
 * The used-grain filter: beside its slots, a hint table keeps as many bits
 * as slots, one set for every filter grain (modulo the table size, as slots
 * are) that a live region touches. A filter grain is the mean region size
 * (t->fgrain), which may be half the slots' grain (hint_grow): a gap
 * between two regions apart stays clear. publish() sets a region's bits under c->lock with
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
    uintptr_t g = start >> t->fgrain, end = last >> t->fgrain, nbits = ~(uintptr_t)0 >> t->shift, i;
    size_t w, words = (nbits >> 6) + 1;

    if (end - g >= nbits) {
        for (w = 0; w < words; w++)
            ST(t->used[w], ~(uint64_t)0);
        return;
    }
    for (;; g++) {
        i = filter_index(t, g);
        ST(t->used[i >> 6], LD(t->used[i >> 6]) | (uint64_t)1 << (i & 63));   /* one writer: c->lock, or the
                                                                               * grower of a table not yet seen */
        if (g == end)
            break;
    }
}

/* 1 if no grain of [s, last] is used in @t (a complete table); 0 if one may be, or the range is long. */
int used_none(const struct hint_tab *t, uintptr_t s, uintptr_t last)
{
    uintptr_t g = s >> t->fgrain, end = last >> t->fgrain, i;

    if (!LD(t->complete) || end - g >= 64)
        return 0;
    for (;; g++) {
        i = filter_index(t, g);
        if (LD(t->used[i >> 6]) & (uint64_t)1 << (i & 63))
            return 0;
        if (g == end)
            return 1;
    }
}

/*
 * A table of 2^bits slots (no lock held), or NULL: a header and a zeroed
 * filter from the cache's arena, and the cache's slots, of which the caller
 * zeroes any that a cache before this one left (c->slots_stale).
 */
struct hint_tab *hint_new(drc_cache_t *c, unsigned bits)
{
    size_t used = ((((size_t)1 << bits) >> 6) + 1) * sizeof(uint64_t);
    struct hint_tab *t = drc__arena_alloc(&c->arena, sizeof(*t) + used);

    if (t) {
        t->shift = 64 - bits;
        t->grain = t->fgrain = 12;
        t->used = (uint64_t *)(void *)(t + 1);
        t->slot = c->slots;
    }
    return t;
}

/*
 * Empty slots [from, to) of c->slots that a destroyed cache may have written
 * (c->slots_stale), before any table that reaches them is seen: slots past
 * that were never written and read zero.
 */
static void slots_unstale(drc_cache_t *c, size_t from, size_t to)
{
    size_t stale = c->slots_stale / sizeof(*c->slots);

    for (; from < to && from < stale; from++)
        __atomic_store_n(&c->slots[from], NULL, __ATOMIC_RELAXED);
}

/*
 * The slots' address space and the first table (drc_cache_create, no lock):
 * room for the largest table, resident where written. The space may be a
 * destroyed cache's, kept (drc__arena_table): its slots name that cache's
 * regions, whose memory this cache's arena may reuse for anything, so no
 * table may show a lookup one of them. The first table's are zeroed here,
 * and hint_grow zeroes the ones each larger table adds before it installs
 * it. 0 or -ENOMEM.
 */
int hint_init(drc_cache_t *c)
{
    c->slots = drc__arena_table(sizeof(*c->slots) << HINT_MAX_BITS, &c->slots_stale);
    if (!c->slots)
        return -ENOMEM;
    slots_unstale(c, 0, (size_t)1 << HINT_MIN_BITS);
    c->hint = hint_new(c, HINT_MIN_BITS);
    if (!c->hint)
        return -ENOMEM;
    c->hint->grain = c->hint->fgrain = c->page_shift;
    c->hint->complete = 1;      /* no region yet: no bit to set */
    return 0;
}

/* drc_cache_destroy, or a failed create (no lock): the slots' space goes back, kept or unmapped. */
void hint_fini(drc_cache_t *c)
{
    size_t written = c->hint ? sizeof(*c->slots) << (64 - c->hint->shift) : 0;

    if (c->slots)
        drc__arena_table_fini(c->slots, sizeof(*c->slots) << HINT_MAX_BITS,
                              written > c->slots_stale ? written : c->slots_stale);
    c->slots = NULL;
}

/*
 * The size (log2 slots) the hint table should grow to, or 0 (c->lock): it
 * doubles once the live regions reach half its slots, so that it keeps two
 * to four slots per region (16-32 bytes). The grain is the mean region size
 * rounded down to a power of two, or twice that where regions lie apart
 * (hint_grow), and a slot is the grain number modulo the table size: regions
 * laid out with gaps no larger than themselves span at most about two grains
 * each, which then fit without a collision. Growing
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
 * Fill @t (not installed yet) with the live regions, and set its filter: a
 * lockless walk of the pool chunks (hint_grow); *live, how many it read as
 * live. With @trial, returns how many of them found the slot of their first
 * grain already taken by another in this fill, and stops as soon as more
 * than one in sixteen of at least 256 did (hint_grow then fills again with
 * finer grains): regions side by side show it at once. Without, 0.
 */
static size_t hint_fill(drc_cache_t *c, struct hint_tab *t, size_t *live, int trial)
{
    struct chunk *ch;
    struct drc_region *r;
    uintptr_t g, start, last;
    size_t shared = 0, i, j;
    unsigned k, n, carved;

    *live = 0;
    for (ch = __atomic_load_n(&c->chunks, __ATOMIC_ACQUIRE); ch; ch = ch->next) {
        carved = __atomic_load_n(&ch->carved, __ATOMIC_ACQUIRE);
        for (k = 0; k < carved; k++) {
            r = &ch->r[k];
            if (k + 8 < carved)
                __builtin_prefetch(&ch->r[k + 8]);  /* one line in three: 4 % off a fresh fill of 65,536 */
            if (!is_live(r))
                continue;
            start = LD(r->node.start);
            last = LD(r->node.last);
            ++*live;
            if (trial) {
                /* the filter grains of its first slot grain (one or two): does a region before it touch one? */
                g = (start >> t->grain) << (t->grain - t->fgrain);
                i = filter_index(t, g);
                j = filter_index(t, g + (t->grain - t->fgrain));
                shared += ((LD(t->used[i >> 6]) >> (i & 63)) | (LD(t->used[j >> 6]) >> (j & 63))) & 1;
                if (*live >= 256 && shared * 16 > *live)
                    return shared;
            }
            used_set(t, start, last);
            for (n = region_grains(t, start, last, &g); n--; g++)
                __atomic_store_n(grain_slot(t, g), r, __ATOMIC_RELEASE);
        }
    }
    return shared;
}

/*
 * Grow the hint table to 2^bits slots: made and filled without the lock,
 * installed under it. In place: the new table's first slots are the old
 * one's, with what lookups left in them, and its others are slots no table
 * of this cache had yet. What the old table's lookups see meanwhile:
 *
 *   grower                                   lookup that read the old header
 *   zero the added slots a cache before
 *     this one left (c->slots_stale)         (reads only the old, first slots)
 *   fill: r into the slots of its grains
 *     under the new mask (a first slot: a
 *     guess for the old mask as good as any)  slot[i] = r, after its walk
 *   lock; c->hint = new (release); unlock
 *                                            a lookup of the new header: its
 *                                            slots hold NULL or regions of
 *                                            this cache, guesses it checks
 *
 * Two threads may grow at once (both saw hint_want ask, under the lock):
 * each zeroes and fills the same added slots, and only a table larger than
 * the one installed is installed; a zeroing that comes after the other's
 * install only empties slots, which makes lookups walk.
 */
void hint_grow(drc_cache_t *c, unsigned bits)
{
    struct hint_tab *t, *cur = __atomic_load_n(&c->hint, __ATOMIC_ACQUIRE);
    uint64_t regions = LD(c->regions), bytes = LD(c->bytes);
    uintptr_t lo;
    unsigned seq = __atomic_load_n(&c->seq, __ATOMIC_ACQUIRE);     /* before the fill's loads */
    unsigned grain;
    size_t live, shared;

    if (64 - cur->shift >= bits || !(t = hint_new(c, bits)))
        return;     /* grown already; or without memory, where hits only get slower */
    slots_unstale(c, (size_t)1 << (64 - cur->shift), (size_t)1 << bits);
    /* the mean region size, rounded down to a power of two, at least a page */
    grain = regions ? 63 - (unsigned)__builtin_clzll(bytes / regions | 1) : c->page_shift;
    if (grain < c->page_shift)
        grain = c->page_shift;
    lo = __atomic_load_n(&c->lo, __ATOMIC_ACQUIRE);
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
     *
     * First with grains of twice the mean size: where regions lie apart (as
     * far from each other as they are long, or further), each still has a
     * grain of its own, and the table's written slots, the memory they take
     * and the lines hits read are half as many. If more than one region in
     * sixteen then shares the slot of its first grain (regions side by side:
     * the trial fill stops as soon as that is clear), the fill is made again
     * with grains of the mean size; the slots the first fill wrote are
     * guesses like any other. The used-grain filter keeps grains of the
     * mean size either way (fgrain): a free event over the gap between two
     * regions apart, in a slot grain of one of them, finds no bit there.
     */
    t->fgrain = grain;
    t->fbase = lo == UINTPTR_MAX ? 0 : lo >> t->fgrain;   /* filter_index */
    t->grain = grain + 1;
    t->base = t->fbase >> 1;                              /* grain_index: lo >> t->grain */
    shared = hint_fill(c, t, &live, 1);
    if (shared * 16 > live) {
        t->grain = grain;
        t->base = t->fbase;
        hint_fill(c, t, &live, 0);      /* the filter's bits are the same at either slot grain */
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
    if (64 - c->hint->shift < bits)
        __atomic_store_n(&c->hint, t, __ATOMIC_RELEASE);
    unlock(c);      /* if another thread grew it first, t's header and filter stay unused in the arena */
}
