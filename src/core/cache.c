/*
 * The registration cache.
 *
 * A region is one backend registration, in one of three places:
 *   live      in c->tree (and on the LRU list of a cache with limits): lookups find it;
 *   detached  superseded by a merge while a user held it (in c->detached,
 *             where a range invalidation still finds it), or invalidated
 *             while held (in no tree, DEAD in its word, counted by
 *             off_held); no lookup finds it, its last put releases it;
 *   free      on c->pool, deregistered, waiting to be reused.
 * Every region ever handed out sits in a pool chunk (c->chunks): a walk of
 * the chunks finds the live ones (is_live) in allocation order, one line
 * each, where an in-order walk of the tree climbs to parents.
 * Region memory is never returned while the cache lives (it is type-stable,
 * as with SLAB_TYPESAFE_BY_RCU), so a lockless lookup may always read it: it
 * comes from the cache's arena (arena.c), with the hint tables, and goes
 * back only in drc_cache_destroy().
 *
 * The reference word, r->word = HELD | DEAD? | DRAIN? | users (with the
 * counts in threads' slots once two threads hit the cache: "Thread
 * references", below, and DRAIN there):
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
 * increment fails. A walk that raced a rotation may miss r or wander; the
 * count catches both, and `budget` bounds the wandering. Before walking, a
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
 * region.
 *
 * Lock order: a notify slot (notify.c), then c->lock. No backend or CUDA call
 * is made with c->lock held, and nothing is allocated, freed, mapped or
 * unmapped under it: an allocator may give memory back (and drc's own hooks
 * see munmap and madvise) and so re-enter drc_invalidate on this thread.
 * DRC_DEBUG builds assert both (lock(), call-out sites), assert which lock a
 * function needs, and check both trees whenever c->lock is released. In a
 * fork() child every inherited cache is inert (drc__cache_forked).
 */
#include "core/cache.h"

#include <errno.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/arena.h"
#include "core/itree.h"
#include "core/mem.h"
#include "core/notify.h"
#include "core/tslot.h"

/*
 * The VMM chunk records of a region's memory (struct drc__mem's chunk[]), kept
 * out of struct drc_region so that only regions of multi-chunk VMM memory pay
 * for them. A region slot gets one the first time it is published with
 * chunks (allocated before the lock, attached under it) and keeps it until the
 * cache is destroyed, so a reader holding a reference never sees it freed.
 */
struct region_chunks {
    unsigned n;
    struct drc__mem_chunk chunk[DRC__MEM_CHUNKS];
};

/* struct drc__mem without the chunk records: those are in *chunks (n == 0, or no chunks, for none) */
struct region_mem {
    enum drc_mem_type type;
    int device;
    uintptr_t lo, hi;
    uint64_t buffer_id;
    void *ctx;
    struct region_chunks *chunks;
};

/*
 * gcc refuses atomic_thread_fence under -fsanitize=thread (-Wtsan: TSan does
 * not model fences). Keep the TSan build the same code: the fences only order
 * the sequence count against the tree's atomic stores and loads, and every
 * non-atomic field a lookup reads is published by the release store of r->word
 * that tryget()'s CAS reads, which TSan does model.
 */
#if defined(__SANITIZE_THREAD__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wtsan"
#endif

#define HELD     (1ull << 63)
#define DEAD     (1ull << 62)
#define DRAIN    (1ull << 61)
#define USERS(w) ((w) & ~(HELD | DEAD | DRAIN))

/*
 * Small helpers of a hit (tally, count_hit, covers, handed_over) are always
 * inlined: gcc -O2 kept them out of line, for their many callers, and a hint
 * hit paid six calls with their spills (callgrind, a drc-only loop of
 * interior hits over 1,024 regions: 305 -> 251 instructions a get+put).
 */
#define HIT_INLINE inline __attribute__((always_inline))

#define LD(x)       __atomic_load_n(&(x), __ATOMIC_RELAXED)
#define ST(x, v)    __atomic_store_n(&(x), (v), __ATOMIC_RELAXED)
#define LD_SC(x)    __atomic_load_n(&(x), __ATOMIC_SEQ_CST)
#define ST_SC(x, v) __atomic_store_n(&(x), (v), __ATOMIC_SEQ_CST)

enum {
    HINT_MIN_BITS = 8,     /* the first table: 256 slots */
    HINT_MAX_BITS = 20,    /* the largest: 1 Mi slots (8 MiB) */
    LOOKUP_BUDGET = 256,   /* nodes a lockless walk may visit (depth of 2^64 nodes is < 128) */
    REG_RETRIES   = 8,     /* registrations raced by an invalidation before -EAGAIN */
    RACED         = 2,     /* get_slow: an invalidation raced the registration; not an errno, so
                            * that a backend's own -EAGAIN is returned, not retried */
    CHUNK_MIN     = 64,    /* regions of the first pool chunk; each next one has as many as the cache */
    CHUNK_MAX     = 1024,  /* has already (doubling), up to this (192 KiB) */
    INVQ          = 32,    /* invalidations a contended free event may hand to the lock holder */
    SPIN_CHECK    = 512,   /* lock(): pauses between looks at a taken c->lock */
    SPIN_MAX      = 4096,  /* lock(): pauses before it sleeps on it */
};

#define KNOWN_FLAGS (DRC_F_NO_MERGE | DRC_F_VALIDATE | DRC_F_DMABUF_PCIE | DRC_F_REVOKE)

struct drc_region {
    /*
     * First cache line: all a hit reads and writes (word, access, detached,
     * cache, node.start/last), all a floor descent reads (node.left,
     * node.right) and all a rotation or recolouring reads of a node
     * (node.parent_red: a removal reads it in the parent, the sibling and its
     * children). node.subtree_last (used once regions overlap) spills into
     * the second. Nothing else of another region is written by an insert or
     * a removal: regions keep no links to their neighbours in address order,
     * which cost a removal two more lines, the neighbours' (held
     * invalidation under callgrind, make bench-counts: 8.2 L2 misses -> 4.7).
     */
    uint64_t word;                  /* HELD | users, atomic */
    unsigned access;                /* atomic: a stale lookup may read it during reuse */
    int detached;                   /* atomic, written under c->lock */
    drc_cache_t *cache;             /* set once, when the pool chunk is carved */
    struct drc__itree_node node;    /* atomic fields, see itree.h */
    /*
     * Second line: what an invalidation and the release after it read or
     * write (valid, revoked, handle, next), and the keys a user reads after
     * a hit; the memory's description (read when a region is made, merged
     * or validated) comes last.
     */
    void *handle;                   /* set before publication (release store of word), then constant */
    uint32_t lkey, rkey;            /* likewise */
    int valid;                      /* atomic */
    int revoked;                    /* atomic, DRC_F_REVOKE: set under c->lock by revoke_take, cleared on release */
    struct drc_region *next;        /* c->lock: pool link; or a release list, then c->freed */
    struct drc_region *lru_prev, *lru_next;     /* c->lock; live regions of a limited cache */
    struct region_mem mem;          /* set before publication, constant while referenced */
} __attribute__((aligned(64)));

_Static_assert(offsetof(struct drc_region, node.parent_red) + sizeof(uintptr_t) <= 64,
               "a region's hit fields and its tree links fill its first cache line");
_Static_assert(offsetof(struct drc_region, lru_next) + sizeof(void *) <= 128,
               "an invalidation and its release touch a region's first two lines only");

/*
 * The hint table: a lossy, direct-mapped map from a grain of address space
 * (2^grain bytes: the power of two at or below the mean region size when the
 * table was made, so that a lookup anywhere inside a region, not only at its
 * start, keys one of the two or three grains the region touches) to the
 * region a lookup last found there, so that a hit is one slot load and
 * one region line instead of a tree descent (about 2 log2 n dependent loads,
 * each a coin-toss branch on random addresses). The slot is the grain number
 * modulo the table size, not a hash: neighbouring grains sit in neighbouring
 * slots, so lookups in address order share slot lines, and one contiguous
 * arena of regions fills the table without collisions. The table comes from
 * the cache's arena (arena.c): fresh pages are not written until a slot is.
 * Lookups fill it with release stores (a slot is read with acquire: it
 * hands over the region's memory, chunk included), without the lock;
 * nothing else writes it, and nothing clears it: a slot may point to a
 * region that has since been detached, released or reused,
 * so a lookup checks what it finds: bounds, tryget, bounds again (now they
 * cannot change), then !detached (lookup_lockless). Tables are replaced by
 * larger ones under c->lock as the cache grows; a replaced table stays in
 * the arena (a lockless lookup may still read it) until drc_cache_destroy.
 */
struct hint_tab {
    struct hint_tab *older;         /* the table this one replaced */
    unsigned shift;                 /* 64 - log2(slots) */
    unsigned grain;                 /* log2 of the bytes one slot covers */
    int complete;                   /* atomic: `used` has a bit for every grain of every live region */
    uint64_t *used;                 /* atomic words: one bit per slot (below) */
    struct drc_region *slot[];      /* atomic */
};

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
 * bytes (32 KiB at 65,536 regions), where a descent of the tree costs
 * dependent loads, cache misses in a large cache. A table is complete when
 * it was made for an empty cache, or when hint_grow's lockless fill ran
 * with no writer in between (the count was even and unchanged from before
 * the fill to the install under the lock);
 * otherwise the probe skips the filter until the next grow. A miss uses it
 * too: a lookup over unused grains skips the lockless descent, and the
 * merge plan (under the lock) the overlap walk, so that a range registered
 * for the first time, in any order, pays one descent (the insert's).
 */
static void used_set(struct hint_tab *t, uintptr_t start, uintptr_t last)
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
static int used_none(const struct hint_tab *t, uintptr_t s, uintptr_t last)
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

/* Pool memory: n regions carved from the cache's arena, never returned while the cache lives. */
struct chunk {
    struct chunk *next;             /* set before the chunk is published in c->chunks */
    unsigned n;
    unsigned carved;                /* atomic, written under c->lock: r[0..carved) were handed out and have
                                     * their free-region fields (pool_get); the rest are raw memory */
    struct drc_region r[];
};

struct pending {
    uintptr_t start, last;
    int stale;                      /* set by an invalidation of an overlapping range */
    struct pending *next;
};

/*
 * Per-thread counters (see tally()): hits, the region references that took a
 * region's users from 0 to 1 (used) and from 1 to 0 (idled), so that
 * stats.in_use = used - idled needs no lock and no walk, and deregistrations
 * (counted after the backend returns, with no lock: two threads freeing
 * would otherwise write one shared line at every dereg).
 */
enum { ST_HITS, ST_USED, ST_IDLED, ST_DEREGS, ST_OFF_GONE, ST_N };   /* ST_OFF_GONE: see off_held() */

/* A range handed to the holder of c->lock by a free event that found it taken (see queue_invalidation). */
struct invq_ent {
    unsigned state;                 /* atomic: Q_EMPTY, Q_CLAIMED (being written), Q_READY */
    uintptr_t start, last;          /* atomic */
};

enum { Q_EMPTY, Q_CLAIMED, Q_READY };

/*
 * A reference slot (struct stat_slot's ref[]): a region pointer (64-byte
 * aligned) with a count of references in its low bits, 0 when empty.
 */
enum { REFS = 3, REF_N = 63 };

struct stat_slot {
    uint64_t n[ST_N];               /* atomic; written only by the slot's owner thread (see tally) */
    uintptr_t ref[REFS];            /* atomic, CAS only: references this thread took (see tryget_fast) */
} __attribute__((aligned(64)));

_Static_assert(sizeof(struct stat_slot) == 64, "a thread's counters and references fill one line");

struct drc_cache {
    /* read by every lookup, written only under lock */
    struct drc__itree tree;
    unsigned seq;                   /* odd while c->tree is being changed */
    unsigned flags;
    int limited;                    /* max_regions or max_bytes set: keep the LRU exact */
    size_t page;
    struct drc_backend be;
    uintptr_t lo, hi;               /* atomic: hull of every range registered or being registered */
    struct hint_tab *hint;          /* atomic: replaced under c->lock (release store) */
    unsigned page_shift;
    int inert;                      /* atomic: inherited by a fork() child (drc__cache_forked) */
    uint64_t refmask;               /* atomic, set under c->lock: bit i (63: 63 and up) once thread slot i
                                     * may count references in its ref[] (join_refs) */
    uint64_t hitters;               /* atomic: bit i once thread slot i hit (tryget_fast) */
    int overlapping;                /* atomic, set under c->lock, never cleared: live regions may overlap */
    unsigned npending;              /* atomic, changed under c->lock: registrations pending or being inserted */

    pthread_mutex_t lock __attribute__((aligned(64)));     /* alone on its line: waiters read it (lock()) */
    pthread_cond_t pending_done __attribute__((aligned(64)));
    struct drc__itree detached;
    struct pending *pending;
    unsigned pending_waiters;       /* c->lock: getters asleep on pending_done */
    struct drc_region *lru_head, *lru_tail;     /* least recently idle first; kept only if limited */
    struct drc_region *pool;
    struct drc_region *freed;       /* atomic: deregistered regions pushed without the lock; pool_get takes them */
    uint64_t ndetached;             /* atomic, written under c->lock: regions retired DETACHED_OFF and not
                                     * released there (see off_held) */
    unsigned ninvq;                 /* atomic: queued invalidations not yet done (claimed or ready) */
    struct drc_region *qdead;       /* c->lock: released by queued invalidations, deregistered after unlock */
    struct invq_ent invq[INVQ];
    struct chunk *chunks;           /* atomic, pushed under c->lock (release): lockless walks read it */
    struct chunk *unused;           /* atomic: chunks carved for a pool that another thread refilled first */
    unsigned nslots;                /* atomic, written under c->lock: regions in c->chunks */
    struct drc__arena arena;        /* chunks and hint tables; its own lock, never taken under c->lock */
    size_t max_regions, max_bytes, max_len;
    void (*release)(void *ctx);
    unsigned (*export_flags)(void *ctx, int device);    /* drc__cache_opts; NULL: flags decide */
    uint64_t misses, merges, invalidated, evicted, regs, regions, bytes;  /* written under c->lock with ST,
                                                                           * read by stats without it */

    struct stat_slot st[DRC__TSLOTS + 1];      /* per thread (tslot.h); [DRC__TSLOTS] is shared, atomic adds */
#ifdef DRC_DEBUG
    pthread_t owner;                /* atomic: the thread holding c->lock, or 0 */
#endif
};

#ifdef DRC_DEBUG
__thread int drc__lock_depth;

void drc__assert_fail(const char *what, const char *file, int line)
{
    fprintf(stderr, "drc: %s:%d: assertion failed: %s\n", file, line, what);
    abort();
}

#define ASSERT_LOCKED(c) DRC_ASSERT(pthread_equal(LD((c)->owner), pthread_self()))
#define ASSERT_WRITING(c) DRC_ASSERT(pthread_equal(LD((c)->owner), pthread_self()) && (LD((c)->seq) & 1))

/* The expensive level: every invariant of both trees, and the live count. */
static void check_trees(const drc_cache_t *c);
#else
#define ASSERT_LOCKED(c) ((void)0)
#define ASSERT_WRITING(c) ((void)0)
#endif

static void invq_run(drc_cache_t *c);
static int release_list(drc_cache_t *c, struct drc_region *dead);
static HIT_INLINE void tally(drc_cache_t *c, int what);
static uint64_t tally_sum(const drc_cache_t *c, int what);

/*
 * Is a queued invalidation over [s, last] (or one being written) not done
 * yet? With @s > @last: is any ready? Reads every entry: called only while
 * ninvq says some are queued.
 */
static int queued(const drc_cache_t *c, uintptr_t s, uintptr_t last)
{
    unsigned i, st;

    for (i = 0; i < INVQ; i++) {
        st = __atomic_load_n(&c->invq[i].state, __ATOMIC_SEQ_CST);
        if (st == Q_READY && (s > last || (LD(c->invq[i].start) <= last && s <= LD(c->invq[i].last))))
            return 1;
        if (st == Q_CLAIMED && s <= last)
            return 1;   /* its range is being written: assume the worst */
    }
    return 0;
}

static void locked(drc_cache_t *c)
{
#ifdef DRC_DEBUG
    drc__lock_depth++;
    ST(c->owner, pthread_self());
#endif
    if (LD_SC(c->ninvq))
        invq_run(c);    /* before anything this holder looks up (see queue_invalidation) */
}

/* A spin-wait hint: the core waits without hogging the pipeline, and lets its sibling run */
static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("isb" ::: "memory");
#else
    __asm__ __volatile__("" ::: "memory");
#endif
}

/* Does c->lock look free? A load of glibc's lock word shares its line, where a trylock takes it. */
static inline int lock_looks_free(drc_cache_t *c)
{
#ifdef __GLIBC__
    return __atomic_load_n(&c->lock.__data.__lock, __ATOMIC_RELAXED) == 0;
#else
    (void)c;
    return 1;
#endif
}

/*
 * Take c->lock: try, spin, then sleep. A section under c->lock is short (no
 * call out of drc, nothing allocated), so a thread that finds it taken spins
 * with a pause instruction (lock_contended), looking at the lock word every
 * SPIN_CHECK pauses, and sleeps in pthread_mutex_lock only after SPIN_MAX.
 * On the 2-vCPU development machine (a PVM guest) a system call costs 0.1 to
 * 1.2 us, depending on the host, so a contended pthread_mutex_lock that
 * sleeps, and the unlock that must then wake it, cost as much as the section
 * they wait for or more. The sparse checks matter as much as the spin
 * (tests/bench/RESULTS.md, "Two threads on two vCPUs"): a waiter that checks after every
 * pause (or every 16) takes the lock the moment it is released, so the
 * cache's lines cross between the cores on every section; one that checks
 * every 512 pauses (8-10 us here) lets the holder run several sections back
 * to back (two threads missing at 1,024 regions, one interleaved run: about
 * 1,100 ns a miss with the plain mutex, 1,500 checking after every pause,
 * 600 every 512). Every way in goes through lock() or a trylock; the
 * hand-offs of unlock() and queue_invalidation() do not change.
 */
static __attribute__((noinline)) void lock_contended(drc_cache_t *c)
{
    unsigned spins;

    for (spins = 1;; spins++) {
        cpu_relax();
        if (spins % SPIN_CHECK)
            continue;
        if (lock_looks_free(c) && pthread_mutex_trylock(&c->lock) == 0)
            return;
        if (spins >= SPIN_MAX) {
            pthread_mutex_lock(&c->lock);
            return;
        }
    }
}

static inline void lock(drc_cache_t *c)
{
    /* never re-entered: an allocator or hook called under c->lock would deadlock here */
    DRC_ASSERT_NO_LOCK();
    if (pthread_mutex_trylock(&c->lock) != 0)
        lock_contended(c);     /* out of line: the uncontended path stays as short as it was */
    locked(c);
}

static void unlock_once(drc_cache_t *c)
{
    struct drc_region *dead;

    if (LD_SC(c->ninvq))
        invq_run(c);    /* what was handed to this holder */
    dead = c->qdead;
    c->qdead = NULL;
#ifdef DRC_DEBUG
    ASSERT_LOCKED(c);
    DRC_ASSERT(!(c->seq & 1));
    check_trees(c);
    ST(c->owner, (pthread_t)0);
    drc__lock_depth--;
#endif
    pthread_mutex_unlock(&c->lock);
    release_list(c, dead);
}

/*
 * Unlock, then look at the queue again: a free event that found the lock
 * taken queued its range and then tried the lock; if that try failed, this
 * holder had not unlocked yet, so its load below (after the unlock) sees the
 * range. One of the two runs it.
 */
static void unlock(drc_cache_t *c)
{
    unlock_once(c);
    while (LD_SC(c->ninvq) && queued(c, 1, 0) && pthread_mutex_trylock(&c->lock) == 0) {
        locked(c);
        unlock_once(c);
    }
}

/* Sleep on pending_done (c->lock held); the lock is not ours while we sleep. */
static void wait_pending(drc_cache_t *c)
{
    if (LD_SC(c->ninvq))
        invq_run(c);    /* nothing handed to this holder may wait for its sleep */
#ifdef DRC_DEBUG
    ST(c->owner, (pthread_t)0);
    drc__lock_depth--;
#endif
    c->pending_waiters++;
    pthread_cond_wait(&c->pending_done, &c->lock);
    c->pending_waiters--;
    locked(c);
}

/* The backend's calls: never under a cache lock (drc.h promises it). */
static int be_reg(drc_cache_t *c, const struct drc_reg_args *a, void **handle, uint32_t *lkey, uint32_t *rkey)
{
    DRC_ASSERT_NO_LOCK();
    return c->be.reg(c->be.ctx, a, handle, lkey, rkey);
}

static int be_dereg(drc_cache_t *c, void *handle)
{
    int err;

    DRC_ASSERT_NO_LOCK();
    err = c->be.dereg(c->be.ctx, handle);
    tally(c, ST_DEREGS);
    return err;
}

/*
 * Every allocation and free of drc's own memory goes through these (and
 * drc__arena_alloc, for pool chunks and hint tables): never under c->lock.
 */
static void *mem_alloc(size_t size)
{
    void *p;

    DRC_ASSERT_NO_LOCK();
    p = aligned_alloc(64, (size + 63) & ~(size_t)63);
    if (p)
        memset(p, 0, size);
    return p;
}

static void mem_free(void *p)
{
    DRC_ASSERT_NO_LOCK();
    if (p)
        free(p);
}

static struct drc_region *region_of(struct drc__itree_node *n)
{
    /* through void *: n is inside a 64-byte-aligned region, which clang's -Wcast-align cannot know */
    return (struct drc_region *)(void *)((char *)n - offsetof(struct drc_region, node));
}

/*
 * Counting without a shared atomic on the hit path: a thread's counts go in
 * its own slot of every cache (tslot.h), which only it writes, so a plain
 * load and store (atomic, relaxed) counts exactly. Threads beyond
 * DRC__TSLOTS share the last slot with atomic adds.
 */
static HIT_INLINE void tally(drc_cache_t *c, int what)
{
    int i = drc__tslot();

    if (i == DRC__TSLOTS)
        __atomic_fetch_add(&c->st[i].n[what], 1, __ATOMIC_RELAXED);
    else
        ST(c->st[i].n[what], LD(c->st[i].n[what]) + 1);
}

static HIT_INLINE void count_hit(drc_cache_t *c)
{
    tally(c, ST_HITS);
}

/* A locked counter (c->lock held): stats reads it without the lock. */
#define INC(x, v) ST(x, (x) + (v))

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

static void seq_begin(drc_cache_t *c)
{
    ST(c->seq, c->seq + 1);
    __atomic_thread_fence(__ATOMIC_RELEASE);   /* odd count before any tree store */
}

static void seq_end(drc_cache_t *c)
{
    __atomic_store_n(&c->seq, c->seq + 1, __ATOMIC_RELEASE);
}

/*
 * An rkey grants only what was asked (drc.h): a region serves a request if it
 * has every bit asked, and exactly the remote bits asked when any is asked.
 * A purely local request (no remote bit: only the lkey is of use) may share a
 * region whose remote bits were asked, for that range, by its registrants.
 */
static int serves(unsigned have, unsigned want)
{
    return (have & want) == want &&
           (!(want & DRC_ACCESS_REMOTE) || (have & DRC_ACCESS_REMOTE) == (want & DRC_ACCESS_REMOTE));
}

/* A region containing [s, last] that serves @access, or NULL. */
static struct drc_region *find_containing(const drc_cache_t *c, uintptr_t s, uintptr_t last, unsigned access,
                                          int *budget)
{
    const struct drc__itree *t = &c->tree;
    struct drc__itree_node *n;
    struct drc_region *r;

    /*
     * Coalesced regions do not overlap, so the region starting last at or
     * before s is the only candidate: one cache line per level. Once regions
     * may overlap (DRC_F_NO_MERGE, merges refused by a size limit or by the
     * remote bits), a failed floor falls through to the full overlap walk.
     * A region that overlaps another is published inside the writer's
     * window that sets `overlapping`, so a lookup that read it unset and
     * kept an unchanged count saw a tree without overlaps.
     */
    n = drc__itree_floor(t, s, budget);
    if (n && LD(n->last) >= last && serves(LD(region_of(n)->access), access))
        return region_of(n);
    if (!LD(c->overlapping))
        return NULL;
    for (n = drc__itree_first(t, s, last, budget); n; n = drc__itree_next(t, n, s, last, budget)) {
        if (LD(n->start) > s)
            break;      /* in start order: no later node starts early enough */
        r = region_of(n);
        if (LD(n->last) >= last && serves(LD(r->access), access))
            return r;
    }
    return NULL;
}

/* Add a user to a region that is live or detached; 0 if it is neither. */
static int tryget(drc_cache_t *c, struct drc_region *r)
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
static inline uint64_t ref_bit(int i)
{
    return 1ull << (i < 63 ? i : 63);
}

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

static int put_ref(drc_cache_t *c, struct drc_region *r);

/*
 * May this thread count its hits' references in its slot? Only once a
 * second thread hit the cache: a cache one thread uses keeps every
 * reference in the word, and its invalidations drain nothing (refmask 0).
 * A thread joins under c->lock, once per cache, so that a drainer, which
 * holds the lock, reads a refmask that no thread changes meanwhile: with
 * no bit set, no slot holds anything and none can until it unlocks.
 */
static __attribute__((noinline)) int join_refs(drc_cache_t *c, int i)
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
static __attribute__((noinline)) int tryget_slot(drc_cache_t *c, struct drc_region *r, int i)
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

static inline int tryget_fast(drc_cache_t *c, struct drc_region *r)
{
    int i = drc__tslot();

    if ((LD(r->word) & (HELD | DEAD | DRAIN)) != HELD)
        return tryget(c, r);    /* released (tryget fails), invalidated or being drained: the word */
    if (!(LD(c->refmask) & ref_bit(i)) && (LD(c->hitters) == ref_bit(i) || !join_refs(c, i)))
        return tryget(c, r);    /* the only thread that hits this cache: the word */
    return tryget_slot(c, r, i);
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

static __attribute__((noinline)) uint64_t slot_refs(const drc_cache_t *c, const struct drc_region *r, int any)
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
static int drain_begin(drc_cache_t *c, struct drc_region *r, uint64_t bits, uint64_t *moved)
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
static int drain_end(drc_cache_t *c, struct drc_region *r, struct drc_region **dead, int may_release,
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

static void lru_unlink(drc_cache_t *c, struct drc_region *r)
{
    if (r->lru_prev)
        r->lru_prev->lru_next = r->lru_next;
    else
        c->lru_head = r->lru_next;
    if (r->lru_next)
        r->lru_next->lru_prev = r->lru_prev;
    else
        c->lru_tail = r->lru_prev;
}

static void lru_append(drc_cache_t *c, struct drc_region *r)
{
    r->lru_next = NULL;
    r->lru_prev = c->lru_tail;
    if (c->lru_tail)
        c->lru_tail->lru_next = r;
    else
        c->lru_head = r;
    c->lru_tail = r;
}

static size_t region_len(const struct drc_region *r)
{
    return LD(r->node.last) - LD(r->node.start) + 1;
}

/* Take a live region out of the tree and the LRU (c->lock, seq odd). */
static void unlink_live(drc_cache_t *c, struct drc_region *r)
{
    ASSERT_WRITING(c);
    drc__itree_remove(&c->tree, &r->node);
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
 * A live region leaves the tree: released if idle, else detached until its
 * last put. A superseded region is still valid, and goes into c->detached so
 * that a range invalidation can still find it (DETACHED_TREE); an invalid
 * one needs no finding (DETACHED_OFF): it is only counted, and its last put
 * releases it without the lock. The state is set before the CAS that would
 * release it, so the put that races the CAS sees which it is.
 */
enum { LIVE = 0, DETACHED_TREE = 1, DETACHED_OFF = 2 };

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
static int is_live(const struct drc_region *r)
{
    /* acquire: a lockless walk that sees HELD reads the bounds publish() stored before it */
    return (__atomic_load_n(&r->word, __ATOMIC_ACQUIRE) & HELD) && LD(r->detached) == LIVE;
}

static void retire(drc_cache_t *c, struct drc_region *r, struct drc_region **dead)
{
    uint64_t w, moved;

    unlink_live(c, r);
    if (LD(r->valid)) {
        ST_SC(r->detached, DETACHED_TREE);
        if (!try_release(c, r, dead))
            drc__itree_insert(&c->detached, &r->node);
    } else {
        /*
         * Counted under the lock before a put can see DEAD; the put that
         * releases it counts that in its own thread slot (off_held), with
         * no locked add on either side. The state needs no SC store here,
         * unlike DETACHED_TREE's above (whose CAS may fail and then writes
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

/*
 * Regions invalidated while held that are not released yet (c->lock): those
 * retired, less the releases that puts counted. A put's count may not be
 * visible yet, never one ahead of its retire (which was under the lock):
 * the answer is never low. Reads every thread slot: called only when the
 * trees and the pending list are empty, by destroy, and by stats.
 */
static uint64_t off_held(const drc_cache_t *c)
{
    uint64_t gone = tally_sum(c, ST_OFF_GONE), in = LD(c->ndetached);

    return in > gone ? in - gone : 0;
}

static int over_limits(const drc_cache_t *c)
{
    return (c->max_regions && c->regions > c->max_regions) || (c->max_bytes && c->bytes > c->max_bytes);
}

/* Evict idle live regions, least recently idle first, until within limits (c->lock, seq odd). */
static void evict(drc_cache_t *c, struct drc_region **dead)
{
    struct drc_region *r = c->lru_head, *next;

    ASSERT_WRITING(c);
    for (; r && over_limits(c); r = next) {
        next = r->lru_next;
        if (try_release(c, r, dead)) {
            unlink_live(c, r);
            INC(c->evicted, 1);
        }
    }
}

/*
 * A free region (c->lock): a released one, else the next of the newest
 * chunk, carved when it is first handed out (so that its fields are
 * written with the rest of it, one line in cache, not in a pass over the
 * whole chunk first). When the chunk is used up it takes the chunk *spare,
 * which the caller allocated without the lock, and clears *spare; with no
 * spare it returns NULL: the caller drops the lock, allocates, and asks again.
 */
static struct drc_region *pool_get(drc_cache_t *c, struct chunk **spare)
{
    struct drc_region *r;
    struct chunk *ch;

    ASSERT_LOCKED(c);
    if (!c->pool)
        c->pool = __atomic_exchange_n(&c->freed, NULL, __ATOMIC_ACQUIRE);
    if (c->pool) {
        r = c->pool;
        c->pool = r->next;
        return r;
    }
    ch = c->chunks;
    if (!ch || ch->carved == ch->n) {
        if (!(ch = *spare))
            return NULL;
        *spare = NULL;
        ch->carved = 0;
        ch->next = c->chunks;
        __atomic_store_n(&c->chunks, ch, __ATOMIC_RELEASE);   /* its n, carved and next first */
        ST(c->nslots, c->nslots + ch->n);
    }
    /* what a free region must have (chunk_new does not zero): publish sets the rest */
    r = &ch->r[ch->carved];     /* the lowest address first out */
    r->word = 0;
    r->revoked = 0;
    r->mem.chunks = NULL;
    r->cache = c;
    /* release: a chunk walk that counts r reads its word of 0, not raw memory */
    __atomic_store_n(&ch->carved, ch->carved + 1, __ATOMIC_RELEASE);
    return r;
}

/*
 * A pool chunk for pool_get (no lock held): one another thread carved and did
 * not need, else a new one from the arena with as many regions as the cache
 * has (CHUNK_MIN to CHUNK_MAX), so that a growing cache takes few trips here.
 * NULL without memory.
 */
static struct chunk *chunk_new(drc_cache_t *c)
{
    struct chunk *ch, *rest, *head;
    unsigned n = LD(c->nslots);

    /* c->unused is only pushed to and emptied whole, so no pop can meet a reused head (ABA) */
    if ((ch = __atomic_exchange_n(&c->unused, NULL, __ATOMIC_ACQUIRE))) {
        for (rest = ch->next; rest; rest = head) {
            head = rest->next;
            rest->next = __atomic_load_n(&c->unused, __ATOMIC_RELAXED);
            while (!__atomic_compare_exchange_n(&c->unused, &rest->next, rest, 1, __ATOMIC_RELEASE,
                                                __ATOMIC_RELAXED))
                ;
        }
        ch->next = NULL;
        return ch;
    }
    n = n < CHUNK_MIN ? CHUNK_MIN : n > CHUNK_MAX ? CHUNK_MAX : n;
    ch = drc__arena_alloc_raw(&c->arena, sizeof(*ch) + n * sizeof(ch->r[0]));
    if (ch)
        ch->n = n;
    return ch;
}

/* A chunk from chunk_new that pool_get did not take: kept for the next chunk_new (arena memory is not freed). */
static void chunk_drop(drc_cache_t *c, struct chunk *ch)
{
    if (!ch)
        return;
    ch->next = __atomic_load_n(&c->unused, __ATOMIC_RELAXED);
    while (!__atomic_compare_exchange_n(&c->unused, &ch->next, ch, 1, __ATOMIC_RELEASE, __ATOMIC_RELAXED))
        ;
}

/* Deregister every region on @dead (no lock held) and return them to the pool. */
static int release_list(drc_cache_t *c, struct drc_region *dead)
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
    return !c->tree.root && !c->detached.root && !c->pending && !off_held(c);
}

static void widen_hull(drc_cache_t *c, uintptr_t start, uintptr_t last)
{
    if (start < c->lo)
        __atomic_store_n(&c->lo, start, __ATOMIC_RELEASE);
    if (last > c->hi)
        __atomic_store_n(&c->hi, last, __ATOMIC_RELEASE);
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
    if (LD(r->detached) == DETACHED_TREE) {
        if (try_release(c, r, &dead))
            drc__itree_remove(&c->detached, &r->node);
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

static struct drc_region **hint_slot(const drc_cache_t *c, uintptr_t s)
{
    struct hint_tab *t = __atomic_load_n(&c->hint, __ATOMIC_ACQUIRE);

    return &t->slot[(s >> t->grain) & (~(uintptr_t)0 >> t->shift)];
}

static HIT_INLINE int covers(const struct drc_region *r, uintptr_t s, uintptr_t last, unsigned access)
{
    return LD(r->node.start) <= s && LD(r->node.last) >= last && serves(LD(r->access), access);
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

static struct drc_region *lookup_lockless(drc_cache_t *c, uintptr_t s, uintptr_t last, unsigned access)
{
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
    hs = hint_slot(c, s);
    r = __atomic_load_n(hs, __ATOMIC_ACQUIRE);   /* the region's memory as its publisher left it */
    if (r && covers(r, s, last, access)) {
        if (!tryget_fast(c, r))
            return NULL;        /* released since it was left here: most likely a miss, and the locked
                                 * path (which any miss takes) finds a region that replaced it, and
                                 * leaves it here; no descent for nothing */
        if (covers(r, s, last, access) && !handed_over(c, r) && LD_SC(r->detached) == LIVE)
            return r;
        put_ref(c, r);            /* left the tree, or was reused: walk it, and the walk replaces the hint */
    }
    /*
     * Beyond the hull (a cache filled in address order), or over grains no
     * live region touches (the used-grain filter: a range registered for
     * the first time, in any order): a miss without the descent. A wrong
     * "miss" here only sends the lookup to the locked path.
     */
    if (s < LD(c->lo) || last > LD(c->hi) || used_none(__atomic_load_n(&c->hint, __ATOMIC_ACQUIRE), s, last))
        return NULL;
    for (tries = 0; tries < 2; tries++) {
        seq = __atomic_load_n(&c->seq, __ATOMIC_ACQUIRE);
        if (seq & 1)
            return NULL;        /* a writer is at work: wait for it on the lock */
        budget = LOOKUP_BUDGET;
        r = find_containing(c, s, last, access, &budget);
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

static int pending_overlaps(const drc_cache_t *c, uintptr_t s, uintptr_t last)
{
    const struct pending *p;

    for (p = c->pending; p; p = p->next)
        if (p->start <= last && s <= p->last)
            return 1;
    return 0;
}

static void pending_unlink(drc_cache_t *c, struct pending *p)
{
    struct pending **pp;

    for (pp = &c->pending; *pp != p; pp = &(*pp)->next)
        ;
    *pp = p->next;
    if (c->pending_waiters)
        pthread_cond_broadcast(&c->pending_done);
}

/* A miss: what to register, given the overlapping live regions (c->lock). */
struct plan {
    uintptr_t start, last;
    unsigned access;
    int merging;
    int overlaps;       /* a live region overlapping it stays: set c->overlapping */
};

/* May r be joined into a registration of @m with @access? Same memory, and never wider remote bits. */
static int joinable(const struct drc_region *r, const struct drc__mem *m, unsigned access)
{
    return r->mem.type == m->type && r->mem.device == m->device && LD(r->node.start) >= m->lo &&
           LD(r->node.last) < m->hi &&  /* hi is exclusive (mem.h) */
           (r->access & DRC_ACCESS_REMOTE) == (access & DRC_ACCESS_REMOTE);
}

/*
 * One overlap walk under the lock: a live region that serves [s, last]
 * (returned in *hit), else the plan of the miss. A miss is coalesced with
 * every overlapping joinable region, unless the union would be more than
 * twice the request's own page range: then it is registered alone,
 * overlapping its neighbours, so that buffers packed next to each other
 * (sharing their boundary pages) never re-register a growing union.
 */
static int plan_region(drc_cache_t *c, uintptr_t s, uintptr_t last, unsigned access, const struct drc__mem *m,
                       struct plan *p, struct drc_region **hit)
{
    struct drc__itree_node *n;
    uintptr_t start = s & ~(uintptr_t)(c->page - 1), end = last | (c->page - 1);
    int budget = DRC__ITREE_UNBOUNDED;

    ASSERT_LOCKED(c);
    *hit = NULL;
    p->start = start;
    p->last = end;
    p->access = access;
    p->merging = 0;
    p->overlaps = 0;
    /* no live region touches a grain of the pages (the filter is exact enough under the lock): no walk */
    n = used_none(c->hint, start, end) ? NULL : drc__itree_first(&c->tree, start, end, &budget);
    for (; n; n = drc__itree_next(&c->tree, n, start, end, &budget)) {
        struct drc_region *r = region_of(n);

        if (n->start <= s && n->last >= last && serves(r->access, access)) {
            *hit = r;
            return 0;
        }
        if ((c->flags & DRC_F_NO_MERGE) || !joinable(r, m, access)) {
            p->overlaps = 1;
            continue;
        }
        if (n->start < p->start)
            p->start = n->start;
        if (n->last > p->last)
            p->last = n->last;
        p->access |= r->access;
        p->merging = 1;
    }
    if (c->max_len && end - start >= c->max_len)
        return -E2BIG;
    if (p->merging && ((c->max_len && p->last - p->start >= c->max_len) || p->last - p->start == UINTPTR_MAX ||
                       (p->last - p->start) / 2 > end - start)) {
        p->start = start;       /* too large for the device, for a size_t, or for what was asked */
        p->last = end;
        p->access = access;
        p->merging = 0;
        p->overlaps = 1;
    }
    return 0;
}

/* Move every live region the new one joins out of the tree (c->lock, seq odd). */
static void supersede(drc_cache_t *c, const struct plan *p, const struct drc__mem *m, struct drc_region **dead)
{
    struct drc__itree_node *n, *next;
    int budget = DRC__ITREE_UNBOUNDED;

    ASSERT_WRITING(c);
    for (n = drc__itree_first(&c->tree, p->start, p->last, &budget); n; n = next) {
        struct drc_region *r = region_of(n);

        next = drc__itree_next(&c->tree, n, p->start, p->last, &budget);
        if (joinable(r, m, p->access) && n->start >= p->start && n->last <= p->last)
            retire(c, r, dead);
    }
    INC(c->merges, 1);
}

static int register_plan(drc_cache_t *c, const struct plan *p, const struct drc__mem *m, void **handle,
                         uint32_t *lkey, uint32_t *rkey)
{
    struct drc_reg_args a = {
        .start = p->start, .len = p->last - p->start + 1, .type = m->type, .device = m->device,
        .dmabuf_fd = -1, .dmabuf_offset = 0, .access = p->access,
    };
    int err = 0;

    if (m->type == DRC_MEM_CUDA)
        err = (DRC_ASSERT_NO_LOCK(), drc__mem_export(m, a.start, a.len,
                                                     c->export_flags ? c->export_flags(c->be.ctx, m->device) : c->flags,
                                                     &a.dmabuf_fd, &a.dmabuf_offset));
    if (err == -EOPNOTSUPP)
        err = 0;    /* no dmabuf here (proprietary GPU module): the backend gets fd -1 and may use peermem */
    if (!err)
        err = be_reg(c, &a, handle, lkey, rkey);
    if (a.dmabuf_fd >= 0)
        close(a.dmabuf_fd);     /* the MR holds the buffer now */
    return err;
}

/* A zeroed table of 2^bits slots from the cache's arena (no lock held), or NULL. */
static struct hint_tab *hint_new(drc_cache_t *c, unsigned bits, struct hint_tab *older)
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

/* The size (log2 slots) the hint table should grow to, or 0 (c->lock): four slots per live region. */
static unsigned hint_want(const drc_cache_t *c)
{
    unsigned bits = 64 - c->hint->shift;

    ASSERT_LOCKED(c);
    if (bits >= HINT_MAX_BITS || c->regions < (1ull << (bits - 2)))
        return 0;
    return bits + 2 < HINT_MAX_BITS ? bits + 2 : HINT_MAX_BITS;
}

/* Grow the hint table to 2^bits slots: allocated without the lock, installed under it. */
static void hint_grow(drc_cache_t *c, unsigned bits)
{
    struct hint_tab *t = hint_new(c, bits, NULL);
    uint64_t regions = LD(c->regions), bytes = LD(c->bytes);
    struct chunk *ch;
    struct drc_region *r;
    uintptr_t g, start, last, mask = ((uintptr_t)1 << bits) - 1;
    unsigned seq = __atomic_load_n(&c->seq, __ATOMIC_ACQUIRE);     /* before the fill's loads */
    unsigned i, carved;

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
     * walk of the tree climbs to parents, dependent cache misses (about
     * 90 ns per region at 65,536). A region that changes under the walk
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
            for (g = start >> t->grain; g <= last >> t->grain && g - (start >> t->grain) < 4; g++)
                __atomic_store_n(&t->slot[g & mask], r, __ATOMIC_RELEASE);
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
        t->older = c->hint;
        __atomic_store_n(&c->hint, t, __ATOMIC_RELEASE);
        t = NULL;
    }
    unlock(c);
    (void)t;        /* if another thread grew it first: unused, in the arena until destroy */
}

/* Fill a pooled region and put it in the tree (c->lock, seq odd). */
static void publish(drc_cache_t *c, struct drc_region *r, const struct plan *p, const struct drc__mem *m,
                    void *handle, uint32_t lkey, uint32_t rkey)
{
    ASSERT_WRITING(c);
    DRC_ASSERT(LD(r->word) == 0 && r->cache == c);
    ST(r->node.start, p->start);
    ST(r->node.last, p->last);
    ST(r->access, p->access);
    ST(r->valid, 1);
    ST(r->detached, 0);
    /* r->mem.chunks is the slot's own (get_slow attached one if m has chunks) */
    DRC_ASSERT(!m->nchunks || r->mem.chunks);
    r->mem = (struct region_mem){ .type = m->type, .device = m->device, .lo = m->lo, .hi = m->hi,
                                  .buffer_id = m->buffer_id, .ctx = m->ctx, .chunks = r->mem.chunks };
    if (r->mem.chunks) {
        r->mem.chunks->n = m->nchunks;
        memcpy(r->mem.chunks->chunk, m->chunk, m->nchunks * sizeof(m->chunk[0]));
    }
    r->handle = handle;
    r->lkey = lkey;
    r->rkey = rkey;
    __atomic_store_n(&r->word, HELD + 1, __ATOMIC_RELEASE);   /* the fields above, then the count */
    used_set(c->hint, p->start, p->last);       /* seq is odd: a probe that read the bits before retries */
    drc__itree_insert(&c->tree, &r->node);
    if (c->limited)
        lru_append(c, r);
    INC(c->regions, 1);
    INC(c->bytes, region_len(r));
    tally(c, ST_USED);      /* HELD + 1 */
}

/*
 * The locked path: a hit the lockless walk could not take, or a miss.
 * Returns 0 with a cached *out, 1 with a region registered just now, RACED
 * if an invalidation raced the registration, or an error.
 */
static int get_slow(drc_cache_t *c, uintptr_t s, uintptr_t last, unsigned access, struct drc_region **out)
{
    struct drc_region *r, *dead = NULL;
    struct chunk *spare = NULL;
    struct region_chunks *ext = NULL;     /* chunk records for r, if m has them and r has none */
    struct drc__mem m;
    struct pending pend;
    struct plan p;
    void *handle = NULL;
    uint32_t lkey = 0, rkey = 0;
    int err, registered;
    unsigned grow;

    DRC_ASSERT_NO_LOCK();
    if ((last | (c->page - 1)) - (s & ~(uintptr_t)(c->page - 1)) == UINTPTR_MAX)
        return -EINVAL;     /* page-rounded, it is the whole address space: its length does not fit (no
                             * region can contain it, so a lookup has missed it already) */
    err = drc__mem_classify(s, last - s + 1, &m);   /* a driver call: before the lock */
    if (err)
        return err;
    lock(c);
    for (;;) {
        err = plan_region(c, s, last, access, &m, &p, &r);
        if (r) {
            if (!USERS(__atomic_fetch_add(&r->word, 1, __ATOMIC_SEQ_CST)))
                tally(c, ST_USED);
            __atomic_store_n(hint_slot(c, s), r, __ATOMIC_RELEASE);
            unlock(c);
            count_hit(c);
            *out = r;
            return 0;
        }
        if (!pending_overlaps(c, s, last))
            break;
        wait_pending(c);
    }
    INC(c->misses, 1);
    if (err) {
        unlock(c);
        return err;
    }
    pend = (struct pending){ .start = p.start, .last = p.last, .stale = 0, .next = c->pending };
    c->pending = &pend;
    __atomic_fetch_add(&c->npending, 1, __ATOMIC_SEQ_CST);    /* before the frees are read (notify.c) */
    widen_hull(c, p.start, p.last);
    unlock(c);

    drc__notify_wait_frees(p.start, p.last);    /* never export memory a hook is freeing (notify.c) */
    err = register_plan(c, &p, &m, &handle, &lkey, &rkey);
    registered = !err;
    if (!err && m.nchunks && !(ext = mem_alloc(sizeof(*ext))))     /* multi-chunk VMM memory only */
        err = -ENOMEM;

    lock(c);
    r = NULL;
    while (!err && !pend.stale && !(r = pool_get(c, &spare))) {
        /* the pool is empty: allocate without the lock (an allocator may re-enter drc), still pending */
        unlock(c);
        spare = chunk_new(c);
        lock(c);
        if (!spare)
            err = -ENOMEM;
    }
    pending_unlink(c, &pend);
    INC(c->regs, (uint64_t)registered);
    if (!err && pend.stale)
        err = RACED;        /* it may map memory that is being freed: never insert it */
    if (err) {
        __atomic_fetch_sub(&c->npending, 1, __ATOMIC_SEQ_CST);
        unlock(c);
        chunk_drop(c, spare);
        mem_free(ext);
        if (registered)
            be_dereg(c, handle);
        return err;
    }
    if (m.nchunks && !r->mem.chunks) {
        r->mem.chunks = ext;    /* the slot keeps it until drc_cache_destroy() */
        ext = NULL;
    }
    seq_begin(c);
    if (p.merging)
        supersede(c, &p, &m, &dead);
    if (p.overlaps && !c->overlapping) {
        drc__itree_augment(&c->tree);   /* once, O(n): from now on queries need subtree_last (itree.h) */
        ST_SC(c->overlapping, 1);
    }
    publish(c, r, &p, &m, handle, lkey, rkey);
    __atomic_store_n(hint_slot(c, s), r, __ATOMIC_RELEASE);
    if (c->limited)
        evict(c, &dead);
    seq_end(c);
    __atomic_fetch_sub(&c->npending, 1, __ATOMIC_SEQ_CST);    /* inserted: a probe now finds it (see drc_invalidate) */
    grow = hint_want(c);
    unlock(c);
    release_list(c, dead);
    chunk_drop(c, spare);   /* a chunk another thread's made unneeded */
    mem_free(ext);          /* r had chunk records of its own */
    if (grow)
        hint_grow(c, grow);
    *out = r;
    return 1;
}

/* DRC_F_VALIDATE: is a CUDA hit still the buffer it was registered on? */
static int stale_hit(drc_cache_t *c, const struct drc_region *r, uintptr_t s, uintptr_t last)
{
    struct drc__mem m;

    DRC_ASSERT_NO_LOCK();
    if (!(c->flags & DRC_F_VALIDATE) || r->mem.type != DRC_MEM_CUDA)
        return 0;
    /* the region's struct drc__mem again: constant while the hit holds its reference */
    m = (struct drc__mem){ .type = r->mem.type, .device = r->mem.device, .lo = r->mem.lo, .hi = r->mem.hi,
                           .buffer_id = r->mem.buffer_id, .ctx = r->mem.ctx,
                           .nchunks = r->mem.chunks ? r->mem.chunks->n : 0 };
    if (m.nchunks)
        memcpy(m.chunk, r->mem.chunks->chunk, m.nchunks * sizeof(m.chunk[0]));
    return !drc__mem_unchanged(&m, s, last - s + 1);
}

int drc_get(drc_cache_t *c, const void *addr, size_t len, unsigned access, drc_region_t **out)
{
    struct drc_region *r;
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
        r = lookup_lockless(c, s, last, access);
        if (r) {
            count_hit(c);
            err = 0;
        } else if ((err = get_slow(c, s, last, access, &r)) == RACED) {
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

/* drc_put's last put of a region invalidated while held: its CAS took the word to 0 (see drc_put). */
static __attribute__((noinline)) int put_released(drc_cache_t *c, struct drc_region *r)
{
    tally(c, ST_IDLED);
    tally(c, ST_OFF_GONE);
    r->next = NULL;
    return release_list(c, r);
}

/* A region out of the tree that a drain released (c->lock): off the detached tree, or counted as gone (off_held). */
static void released_detached(drc_cache_t *c, struct drc_region *r)
{
    if (LD(r->detached) == DETACHED_TREE)
        drc__itree_remove(&c->detached, &r->node);
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
static __attribute__((noinline)) int put_other(drc_cache_t *c, struct drc_region *r)
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
static int held(drc_cache_t *c, struct drc_region *r)
{
    if (USERS(LD_SC(r->word)) || slot_refs(c, r, 0))
        return 1;
    return LD(c->refmask) && drain_locked(c, r, NULL) != 0;
}

/* A reference to r in this thread's slot, put: 1, else 0 (none there). */
static __attribute__((noinline)) int put_slot(drc_cache_t *c, struct drc_region *r)
{
    return slot_put(&c->st[drc__tslot()], r);
}

static int put_ref(drc_cache_t *c, struct drc_region *r)
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
    if (!c || !r || r->cache != c)
        return -EINVAL;
    if (LD(c->inert))
        return 0;           /* the parent's region: nothing to do in a fork child */
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
 *   unlock; wait for frees in flight       npending, detached.root: 0, 0 ?
 *   register                               walk the tree: nothing overlaps ?
 *   lock; seq++; insert; seq++             seq == s ?  nothing there
 *   npending-- (SC); unlock
 * A registration counted before the probe's load of npending sends the
 * probe to the lock. One counted after it began after the probe's instant:
 * it is the race that every invalidation has with a registration begun
 * after it, closed for frees by the bracket of notify.c (npending is
 * stored before the getter reads the frees in flight, and the freer's entry
 * is published before the probe reads npending: one of the two sees the
 * other). An insert that the walk could miss changes seq.
 */
static int nothing_there(drc_cache_t *c, uintptr_t s, uintptr_t last)
{
    unsigned seq = __atomic_load_n(&c->seq, __ATOMIC_ACQUIRE);
    int budget = LOOKUP_BUDGET;

    if ((seq & 1) || LD_SC(c->npending) || LD(c->detached.root))
        return 0;
    /*
     * No live region touches a grain of the range (one load, from a table
     * that stays in cache), or none overlaps it: the tree's overlap query,
     * while regions are disjoint one descent for the floor of s and the
     * node after it (or none, past the largest region).
     */
    if (!used_none(__atomic_load_n(&c->hint, __ATOMIC_ACQUIRE), s, last) &&
        (drc__itree_first(&c->tree, s, last, &budget) || budget <= 0))
        return 0;               /* something there (or a torn walk): the locked path decides */
    __atomic_thread_fence(__ATOMIC_ACQUIRE);    /* the walk's loads before the re-read */
    return LD(c->seq) == seq;
}

static int invalidate_locked(drc_cache_t *c, uintptr_t s, uintptr_t last, struct drc_region **dead,
                             struct drc_region **revoking);
static int queue_invalidation(drc_cache_t *c, uintptr_t s, uintptr_t last);

/*
 * The memory is going away: what the device layer keeps for it (the shared
 * dmabuf export, which would keep freed GPU memory taken) goes too, then this
 * cache's regions. drc_notify_free() releases once and calls
 * drc__cache_invalidate() for each cache.
 */
int drc_invalidate(drc_cache_t *c, const void *addr, size_t len)
{
    if (c && len && (uintptr_t)addr + (len - 1) >= (uintptr_t)addr && !LD(c->inert))
        drc__mem_released((uintptr_t)addr, len);
    return drc__cache_invalidate(c, addr, len);
}

int drc__cache_invalidate(drc_cache_t *c, const void *addr, size_t len)
{
    struct drc_region *dead = NULL, *revoking = NULL;
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
    if (nothing_there(c, s, last))
        return 0;
    if (pthread_mutex_trylock(&c->lock) != 0) {
        /* DRC_F_REVOKE promises the deregistration before return: never handed to the holder */
        if (!(c->flags & DRC_F_REVOKE) && queue_invalidation(c, s, last))
            return 0;   /* the holder of the lock does it, before any get can see the range */
        lock(c);        /* the queue is full */
    } else {
        locked(c);
    }
    count = invalidate_locked(c, s, last, &dead, &revoking);
    unlock(c);
    release_list(c, dead);
    revoke_list(c, revoking);
    return count;
}

/*
 * The body of an invalidation (c->lock held): regions out, held ones detached, pending ones stale;
 * with DRC_F_REVOKE, every region it invalidates also goes on @revoking (NULL only from the queue,
 * which a revoking cache never uses).
 */
static int invalidate_locked(drc_cache_t *c, uintptr_t s, uintptr_t last, struct drc_region **dead,
                             struct drc_region **revoking)
{
    struct drc_region *r;
    struct drc__itree_node *n, *next;
    struct pending *p;
    int count = 0, budget;

    ASSERT_LOCKED(c);
    budget = DRC__ITREE_UNBOUNDED;
    n = drc__itree_first(&c->tree, s, last, &budget);
    if (n) {
        /* one descent: the successor is found before n leaves (next stays in the tree) */
        seq_begin(c);
        for (; n; n = next) {
            next = drc__itree_next(&c->tree, n, s, last, &budget);
            r = region_of(n);
            ST_SC(r->valid, 0);
            revoke_take(c, r, revoking);    /* DRC_F_REVOKE: before retire, while r is live */
            retire(c, r, dead);
            count++;
        }
        seq_end(c);
    }
    for (n = drc__itree_first(&c->detached, s, last, &budget); n;
         n = drc__itree_next(&c->detached, n, s, last, &budget)) {
        r = region_of(n);
        if (LD(r->valid)) {
            ST_SC(r->valid, 0);
            revoke_take(c, r, revoking);
            count++;
        }
    }
    for (p = c->pending; p; p = p->next)
        if (p->start <= last && s <= p->last)
            p->stale = 1;
    INC(c->invalidated, (uint64_t)count);
    if (nothing_registered(c)) {
        __atomic_store_n(&c->lo, UINTPTR_MAX, __ATOMIC_RELEASE);
        __atomic_store_n(&c->hi, 0, __ATOMIC_RELEASE);
    }
    return count;
}

/*
 * A free event that finds c->lock taken hands its range to the holder
 * instead of sleeping on the lock (as UCX's rcache queues unmap events),
 * and drc_invalidate's guarantee still holds when it returns:
 *   free event (lock taken)            holder                 later drc_get
 *   claim an entry, write the range    ...                    takes r (hint or walk)
 *   ninvq++ (SC); entry READY (SC)     (lock(): run queue)    ninvq != 0 and an entry
 *   trylock: taken? return             unlock(): run queue,     over r READY or CLAIMED?
 *                                        unlock, one READY ?    drop r, take the lock,
 *                                        trylock and run it     whose lock() runs the
 *                                                               queue; else r detached?
 * A get that begins after the event returned reads ninvq after the
 * increment and the entry after READY, so until the range is done it drops
 * every region over it (the region, not the request: a region is
 * invalidated whole) and goes to the lock, and every lock() runs the queue
 * before looking anything up.
 * The queue is run (regions retired inside the writer's window, pending
 * registrations made stale) before the entry is emptied and ninvq
 * decremented, so a get that reads either sees them
 * retired. The holder's unlock and the event's trylock are ordered: if the
 * try fails, the holder's load after its unlock sees the READY entry (or
 * the event's own retry runs it). Idle regions are deregistered by the
 * thread that ran the queue, after its unlock. Returns 0 if the queue was
 * full (the caller takes the lock).
 */
static int queue_invalidation(drc_cache_t *c, uintptr_t s, uintptr_t last)
{
    unsigned i, st;

    for (i = 0; i < INVQ; i++) {
        st = Q_EMPTY;
        if (__atomic_load_n(&c->invq[i].state, __ATOMIC_RELAXED) != Q_EMPTY ||
            !__atomic_compare_exchange_n(&c->invq[i].state, &st, Q_CLAIMED, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED))
            continue;
        ST(c->invq[i].start, s);
        ST(c->invq[i].last, last);
        __atomic_fetch_add(&c->ninvq, 1, __ATOMIC_SEQ_CST);   /* before we return: gets go to the lock */
        __atomic_store_n(&c->invq[i].state, Q_READY, __ATOMIC_SEQ_CST);
        if (pthread_mutex_trylock(&c->lock) == 0) {
            locked(c);      /* runs it */
            unlock(c);
        }
        return 1;
    }
    return 0;
}

/* Run every READY queued invalidation (c->lock held); their idle regions go to c->qdead. */
static void invq_run(drc_cache_t *c)
{
    unsigned i;

    ASSERT_LOCKED(c);
    for (i = 0; i < INVQ; i++) {
        if (__atomic_load_n(&c->invq[i].state, __ATOMIC_ACQUIRE) != Q_READY)
            continue;
        invalidate_locked(c, LD(c->invq[i].start), LD(c->invq[i].last), &c->qdead, NULL);
        __atomic_store_n(&c->invq[i].state, Q_EMPTY, __ATOMIC_RELEASE);
        __atomic_fetch_sub(&c->ninvq, 1, __ATOMIC_SEQ_CST);   /* after the regions left: see above */
    }
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
    c->hint = hint_new(c, HINT_MIN_BITS, NULL);
    if (c->hint) {
        c->hint->grain = c->page_shift;
        c->hint->complete = 1;      /* no region yet: no bit to set */
    }
    if (!c->hint) {
        err = -ENOMEM;
        goto err_hint;
    }
    if (cfg) {
        c->flags = cfg->flags;
        c->max_regions = cfg->max_regions;
        c->max_bytes = cfg->max_bytes;
    }
    c->limited = c->max_regions || c->max_bytes;
    /*
     * Coalesced regions are disjoint until `overlapping`: the tree keeps no
     * subtree_last until then (itree.h), and computes it for every region
     * when the first overlap arrives, once, under the lock (2-4 ms at
     * 65,536 regions). A cache that never merges expects overlaps: it keeps
     * subtree_last from the start.
     */
    if (!(c->flags & DRC_F_NO_MERGE))
        drc__itree_init_plain(&c->tree);
    if (o) {
        c->max_len = o->max_len;
        c->release = o->release;
        c->export_flags = o->export_flags;
    }
    pthread_mutex_init(&c->lock, NULL);
    pthread_cond_init(&c->pending_done, NULL);
    err = drc__notify_subscribe(c);
    if (err)
        goto err_subscribe;
    *out = c;
    return 0;

err_subscribe:
    pthread_cond_destroy(&c->pending_done);
    pthread_mutex_destroy(&c->lock);
err_hint:
    drc__arena_fini(&c->arena);
    mem_free(c);
    return err;
}

int drc_region_invalidate(drc_cache_t *c, drc_region_t *r)
{
    struct drc_region *dead = NULL, *revoking = NULL;
    int n = 0;

    if (!c || !r || r->cache != c || !held(c, r))
        return -EINVAL;     /* the caller's reference keeps r from being released or reused below */
    if (LD(c->inert))
        return 0;
    lock(c);
    if (LD(r->detached) == LIVE) {
        seq_begin(c);
        /* a release store: drc_region_valid() readers need no order beyond it, and the word's RMWs follow */
        __atomic_store_n(&r->valid, 0, __ATOMIC_RELEASE);
        revoke_take(c, r, &revoking);
        retire(c, r, &dead);
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
 * may have been held by a parent thread that does not exist here: made anew.
 */
void drc__cache_forked(drc_cache_t *c)
{
    ST(c->inert, 1);
    memset(c->invq, 0, sizeof(c->invq));    /* ranges queued by parent threads: the parent's business */
    c->ninvq = 0;
    c->qdead = NULL;
    pthread_mutex_init(&c->lock, NULL);
    pthread_cond_init(&c->pending_done, NULL);
    drc__arena_forked(&c->arena);
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
static void check_trees(const drc_cache_t *c)
{
    long live = drc__itree_check(&c->tree), det = drc__itree_check(&c->detached);

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

/* Regions of @t that a user holds (c->lock). */
static uint64_t held_in(const struct drc__itree *t)
{
    struct drc__itree_node *n;
    int budget = DRC__ITREE_UNBOUNDED;
    uint64_t held = 0;

    for (n = drc__itree_first(t, 0, UINTPTR_MAX, &budget); n; n = drc__itree_next(t, n, 0, UINTPTR_MAX, &budget))
        held += USERS(LD(region_of(n)->word)) != 0;
    return held;
}

/*
 * Is a live region held (c->lock)? A walk of the chunks (is_live, which
 * check_trees holds to the tree): one line per region in allocation order,
 * where an in-order walk of the tree climbs to parents, dependent cache
 * misses (about 90 ns a region at 65,536).
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
    return c->pending || c->detached.root || off_held(c) || live_held(c) || slot_refs(c, NULL, 1);
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
            mem_free(ch->r[i].mem.chunks);
    drc__arena_fini(&c->arena);     /* every chunk and hint table */
    pthread_cond_destroy(&c->pending_done);
    pthread_mutex_destroy(&c->lock);
    mem_free(c);
    return 0;
}

/* The sum of one per-thread counter. */
static uint64_t tally_sum(const drc_cache_t *c, int what)
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
    if (want & DRC_STATS_DETACHED) {
        /* held invalid regions are counted as they leave; superseded ones sit in c->detached (few) */
        lock(c);
        s->detached = off_held(c) + held_in(&c->detached);
        unlock(c);
    }
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
    return r ? r->mem.type : DRC_MEM_HOST;
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
    return r->cache;
}
