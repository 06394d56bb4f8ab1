/*
 * The registration cache's rooms (cache.c is the map): what its files share.
 * The structs, the reference word's bits, the atomics, and the helpers a hit
 * inlines; the prototypes of the functions one file of the cache calls in
 * another. Nothing here is seen outside src/core/cache*.c.
 */
#ifndef DRC_CACHE_INT_H
#define DRC_CACHE_INT_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "core/arena.h"
#include "core/cache.h"
#include "core/itree.h"
#include "core/mem.h"
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
 * hit paid six calls with their spills (make bench-counts shows the
 * difference; tests/bench/RESULTS.md has the figures).
 */
#define HIT_INLINE inline __attribute__((always_inline))

#define LD(x)       __atomic_load_n(&(x), __ATOMIC_RELAXED)
#define ST(x, v)    __atomic_store_n(&(x), (v), __ATOMIC_RELAXED)
#define LD_SC(x)    __atomic_load_n(&(x), __ATOMIC_SEQ_CST)
#define ST_SC(x, v) __atomic_store_n(&(x), (v), __ATOMIC_SEQ_CST)

enum {
    HINT_MIN_BITS = 8,     /* the first table: 256 slots */
    HINT_MAX_BITS = 20,    /* the largest: 1 Mi slots (8 MiB) */
    HINT_GRAINS   = 4,     /* a region's slots: those of its first grains (region_grains) */
    LOOKUP_BUDGET = 256,   /* nodes a lockless walk may visit (depth of 2^64 nodes is < 128) */
    REG_RETRIES   = 8,     /* registrations raced by an invalidation before -EAGAIN */
    RACED         = 2,     /* get_slow: an invalidation raced the registration; not an errno, so
                            * that a backend's own -EAGAIN is returned, not retried */
    CHUNK_MIN     = 64,    /* regions of the first pool chunk; each next one has as many as the cache */
    CHUNK_MAX     = 1024,  /* has already (doubling), up to this (64 KiB of records, as much of ext) */
    INVQ          = 32,    /* invalidations a contended free event may hand to the lock holder */
    SPIN_CHECK    = 512,   /* lock(): pauses between looks at a taken c->lock */
    SPIN_MAX      = 4096,  /* lock(): pauses before it sleeps on it */
};

#define KNOWN_FLAGS (DRC_F_NO_MERGE | DRC_F_VALIDATE | DRC_F_DMABUF_PCIE | DRC_F_REVOKE | DRC_F_ACCESS_SUPERSET)

struct chunk;

/*
 * A region record is one cache line: all a hit reads and writes (word,
 * access, detached, chunk, node), the keys a user reads after a hit, and all
 * an invalidation and the release after it read or write (valid, revoked,
 * handle, next). The tree's index is apart (itree.h): an insert or a removal
 * writes no other region's line. What only some regions need is in their
 * second line, struct region_ext, in a parallel array of the region's pool
 * chunk (region_ext()), whose pages become resident only where a region
 * writes its own: a cache of host regions without limits never does.
 */
struct drc_region {
    uint64_t word;                  /* HELD | users, atomic */
    unsigned access;                /* atomic: a stale lookup may read it during reuse */
    uint8_t detached;               /* atomic, written under c->lock: LIVE, DETACHED_LIST, DETACHED_OFF */
    uint8_t valid;                  /* atomic */
    uint8_t revoked;                /* atomic, DRC_F_REVOKE: set under c->lock by revoke_take, cleared on release */
    uint8_t kind;                   /* enum drc_mem_type | KIND_EXT; set before publication, then constant
                                     * while referenced (a lookup reads it only holding a reference) */
    struct chunk *chunk;            /* its pool chunk (its cache, its ext[]): set when the chunk is carved */
    struct drc__itree_node node;    /* the range, in c->tree's index while live (atomic fields) */
    void *handle;                   /* set before publication (release store of word), then constant */
    uint32_t lkey, rkey;            /* likewise */
    union {                         /* c->lock */
        struct drc_region *next;    /* pool link; or a release or revoking list, then c->freed */
        struct drc__itree_bt *leaf; /* live: where its insert put it, leaf and place (region_leaf) */
    };
} __attribute__((aligned(64)));

/*
 * A region's second line. Written only by the regions that use it, read only
 * where the first line says it was written:
 *   lru_prev, lru_next  a limited cache's live regions (every one of them),
 *                       and the superseded regions still held (DETACHED_LIST:
 *                       c->detached's list): read only on those lists;
 *   mem                 the memory's description, for memory other than host
 *                       memory (KIND_EXT set, from the region's first
 *                       publication of such memory on): host memory is all
 *                       one description (host_mem, region_mem()), so a host
 *                       region writes none. mem.chunks stays the slot's
 *                       while the cache lives, whatever its later regions are.
 */
struct region_ext {
    struct drc_region *lru_prev, *lru_next;     /* c->lock */
    struct region_mem mem;          /* KIND_EXT: set before publication, constant while referenced */
} __attribute__((aligned(64)));

/* struct drc_region's kind: the memory's type, and whether ext->mem was ever written */
enum { KIND_TYPE = 0x7f, KIND_EXT = 0x80 };

_Static_assert(sizeof(struct drc_region) == 64,
               "a hit, an invalidation and its release touch one line, the only one a host region writes");
_Static_assert(sizeof(struct region_ext) == 64, "a region's second line");
_Static_assert(DRC_MEM_HOST == 0 && (int)DRC_MEM_CUDA <= (int)KIND_TYPE, "enum drc_mem_type fits in kind");

/*
 * The hint table: a lossy, direct-mapped map from a grain of address space
 * (2^grain bytes: the power of two at or below the mean region size when the
 * table was made, or twice that where regions lie apart (hint_grow), so that
 * a lookup anywhere inside a region, not only at its start, keys one of the
 * two or three grains the region touches) to the
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
 * cannot change), then !detached (lookup_lockless).
 * The table grows in place as the cache grows (hint_grow, cache_hint.c):
 * the slots of every table a cache has are the first ones of one range of
 * address space (c->slots), and a larger table is a new header, with a
 * filter of its own, installed under c->lock. A lookup that still reads an
 * older header reads the slots that header knows, a prefix of the new ones.
 * Slot memory only ever holds NULL or a region of this cache, so whichever
 * header a lookup read, what it finds is a guess that it checks. Headers
 * and filters stay in the arena until drc_cache_destroy.
 */
struct hint_tab {
    unsigned shift;                 /* 64 - log2(slots) */
    unsigned grain;                 /* log2 of the bytes one slot covers */
    int complete;                   /* atomic: `used` has a bit for every grain of every live region */
    unsigned fgrain;                /* log2 of the bytes one bit of `used` covers: grain, or grain - 1 */
    uint64_t *used;                 /* atomic words: as many bits as slots (the used-grain filter, cache_hint.c) */
    struct drc_region **slot;       /* c->slots: every table of a cache has the same (atomic slots) */
    uintptr_t base;                 /* the grain number of slot 0 (grain_index) */
    uintptr_t fbase;                /* the filter grain number of bit 0 (cache_hint.c: filter_index) */
};

/*
 * Pool memory: n regions carved from the cache's arena, and their second
 * lines (ext[i] is r[i]'s), never returned while the cache lives. A limited
 * cache writes every ext (its LRU): it takes them from c->arena; an
 * unlimited one from c->ext_arena (lazy: pages resident only where written).
 */
struct chunk {
    struct chunk *next;             /* set before the chunk is published in c->chunks */
    drc_cache_t *cache;             /* set by chunk_new */
    struct region_ext *ext;         /* likewise */
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
 * c->lock is a 64-bit word of drc's own, c->lw (cache_queue.c). Its low half
 * is the futex word: LW_LOCKED, LW_WAITERS (a thread sleeps on it), and one
 * bit for each of the first LW_SLOTS thread slots, set while that thread's
 * miss is announced: pending like those on c->pending, but entered by one
 * CAS that finds the lock free, with no lock section (get_slow's
 * announce()). Its high half is a version that every unlock advances, so
 * that a CAS expecting the word a load saw fails if any lock section began
 * since. A bit is set only while the lock is free, and cleared only by its
 * thread's unlock: under c->lock, the announced misses do not change.
 */
enum { LW_LOCKED = 1u, LW_WAITERS = 2u, LW_SHIFT = 2, LW_SLOTS = 30 };
#define LW_ANNOUNCED ((uint64_t)(~0u << LW_SHIFT))
#define LW_SLOT(i) ((uint64_t)1 << ((i) + LW_SHIFT))
#define LW_SLOT_OF(bits) (__builtin_ctz(bits) - LW_SHIFT)  /* the slot of the lowest announced bit in @bits */
#define LW_VERSION ((uint64_t)1 << 32)     /* one unlock */

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
    struct drc_region **slots;      /* the hint slots: room for HINT_MAX_BITS (drc__arena_table) */
    size_t slots_stale;             /* bytes of c->slots that a destroyed cache may have written (hint_init) */
    unsigned page_shift;
    int inert;                      /* atomic: inherited by a fork() child (drc__cache_forked) */
    uint64_t refmask;               /* atomic, set under c->lock: bit i (63: 63 and up) once thread slot i
                                     * may count references in its ref[] (join_refs) */
    uint64_t hitters;               /* atomic: bit i once thread slot i hit (tryget_fast) */
    int overlapping;                /* atomic, set under c->lock, never cleared: live regions may overlap */
    unsigned npending;              /* atomic, changed under c->lock: registrations pending or being inserted
                                     * (those on c->pending; an announced miss has its bit in c->lw instead) */

    uint64_t lw __attribute__((aligned(64)));   /* atomic: c->lock (LW_LOCKED, LW_WAITERS, announced misses,
                                                 * the version: cache_queue.c); on a line of its own but for
                                                 * the fields below, which its holder writes (or an announcing
                                                 * miss) */
    unsigned pending_gen;           /* atomic, a futex: bumped under c->lock as a pending registration ends
                                     * while getters wait for it (wait_pending) */
    struct drc_region *detached;    /* atomic, changed under c->lock: DETACHED_LIST regions (detached_add) */
    struct pending *pending;        /* atomic, changed under c->lock: an announcing miss reads the head */
    unsigned pending_waiters;       /* c->lock: getters asleep on pending_gen */
    struct pending announced[LW_SLOTS];     /* thread slot i's announced miss, while bit LW_SLOT(i) of c->lw
                                             * is set (get_slow's announce()) */
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
    struct drc__arena ext_arena;    /* lazy: the chunks' ext[] of an unlimited cache (struct chunk) */
    size_t max_regions, max_bytes, max_len;
    void (*release)(void *ctx);
    unsigned (*export_flags)(void *ctx, int device);    /* drc__cache_opts; NULL: flags decide */
    void (*forked)(void *ctx);                          /* drc__cache_opts */
    uint64_t downgraded;            /* atomic: registrations given the default dmabuf type for the PCIe type asked */
    uint64_t misses, merges, invalidated, evicted, regs, regions, bytes;  /* written under c->lock with ST,
                                                                           * read by stats without it */

    struct stat_slot st[DRC__TSLOTS + 1];      /* per thread (tslot.h); [DRC__TSLOTS] is shared, atomic adds */
#ifdef DRC_DEBUG
    pthread_t owner;                /* atomic: the thread holding c->lock, or 0 */
#endif
};

#ifdef DRC_DEBUG
#define ASSERT_LOCKED(c) DRC_ASSERT(pthread_equal(LD((c)->owner), pthread_self()))
#define ASSERT_WRITING(c) DRC_ASSERT(pthread_equal(LD((c)->owner), pthread_self()) && (LD((c)->seq) & 1))
#else
#define ASSERT_LOCKED(c) ((void)0)
#define ASSERT_WRITING(c) ((void)0)
#endif

/*
 * Names shared between the files of the cache keep their short names in the
 * source and are linked as drc__cache_<name> (as jemalloc's private_namespace.h
 * does), so that no static link of libdrc.a meets a `lock` or a `retire` of
 * its user's. Each is defined in the file its prototype names.
 */
#define be_reg(...) drc__cache_be_reg(__VA_ARGS__)
#define be_dereg(...) drc__cache_be_dereg(__VA_ARGS__)
#define tryget(...) drc__cache_tryget(__VA_ARGS__)
#define lru_append(...) drc__cache_lru_append(__VA_ARGS__)
#define is_live(...) drc__cache_is_live(__VA_ARGS__)
#define retire(...) drc__cache_retire(__VA_ARGS__)
#define off_held(...) drc__cache_off_held(__VA_ARGS__)
#define evict(...) drc__cache_evict(__VA_ARGS__)
#define put_ref(...) drc__cache_put_ref(__VA_ARGS__)
#define invalidate_locked(...) drc__cache_invalidate_locked(__VA_ARGS__)
#define check_trees(...) drc__cache_check_trees(__VA_ARGS__)
#define queued(...) drc__cache_queued(__VA_ARGS__)
#define lock_contended(...) drc__cache_lock_contended(__VA_ARGS__)
#define unlock(...) drc__cache_unlock(__VA_ARGS__)
#define unlock_announced(...) drc__cache_unlock_announced(__VA_ARGS__)
#define wait_pending(...) drc__cache_wait_pending(__VA_ARGS__)
#define pending_done(...) drc__cache_pending_done(__VA_ARGS__)
#define invq_run(...) drc__cache_invq_run(__VA_ARGS__)
#define queue_invalidation(...) drc__cache_queue_invalidation(__VA_ARGS__)
#define join_refs(...) drc__cache_join_refs(__VA_ARGS__)
#define tryget_slot(...) drc__cache_tryget_slot(__VA_ARGS__)
#define slot_refs(...) drc__cache_slot_refs(__VA_ARGS__)
#define drain_begin(...) drc__cache_drain_begin(__VA_ARGS__)
#define drain_end(...) drc__cache_drain_end(__VA_ARGS__)
#define put_other(...) drc__cache_put_other(__VA_ARGS__)
#define held(...) drc__cache_held(__VA_ARGS__)
#define put_slot(...) drc__cache_put_slot(__VA_ARGS__)
#define tally_sum(...) drc__cache_tally_sum(__VA_ARGS__)
#define used_set(...) drc__cache_used_set(__VA_ARGS__)
#define used_none(...) drc__cache_used_none(__VA_ARGS__)
#define hint_new(...) drc__cache_hint_new(__VA_ARGS__)
#define hint_init(...) drc__cache_hint_init(__VA_ARGS__)
#define hint_fini(...) drc__cache_hint_fini(__VA_ARGS__)
#define hint_want(...) drc__cache_hint_want(__VA_ARGS__)
#define hint_grow(...) drc__cache_hint_grow(__VA_ARGS__)
#define mem_alloc(...) drc__cache_mem_alloc(__VA_ARGS__)
#define mem_free(...) drc__cache_mem_free(__VA_ARGS__)
#define pool_get(...) drc__cache_pool_get(__VA_ARGS__)
#define chunk_new(...) drc__cache_chunk_new(__VA_ARGS__)
#define chunk_drop(...) drc__cache_chunk_drop(__VA_ARGS__)
#define release_list(...) drc__cache_release_list(__VA_ARGS__)
#define get_slow(...) drc__cache_get_slow(__VA_ARGS__)

/* cache.c */
int be_reg(drc_cache_t *c, const struct drc_reg_args *a, void **handle, uint32_t *lkey, uint32_t *rkey);
int be_dereg(drc_cache_t *c, void *handle);
int tryget(drc_cache_t *c, struct drc_region *r);
void lru_append(drc_cache_t *c, struct drc_region *r);
int is_live(const struct drc_region *r);
void retire(drc_cache_t *c, struct drc_region *r, struct drc_region **dead);
uint64_t off_held(const drc_cache_t *c);
void evict(drc_cache_t *c, struct drc_region **dead);
int put_ref(drc_cache_t *c, struct drc_region *r);
int release_list(drc_cache_t *c, struct drc_region *dead);
int invalidate_locked(drc_cache_t *c, uintptr_t s, uintptr_t last, struct drc_region **dead,
                      struct drc_region **revoking, struct drc__itree_path *path, struct drc_region *hr);
#ifdef DRC_DEBUG
/* The expensive level: every invariant of both trees, and the live count. */
void check_trees(const drc_cache_t *c);
#endif

/* cache_queue.c */
int queued(const drc_cache_t *c, uintptr_t s, uintptr_t last);
void lock_contended(drc_cache_t *c);
void unlock(drc_cache_t *c);
void unlock_announced(drc_cache_t *c, uint64_t bit);
void wait_pending(drc_cache_t *c);
void pending_done(drc_cache_t *c);
int queue_invalidation(drc_cache_t *c, uintptr_t s, uintptr_t last);
void invq_run(drc_cache_t *c);

/* cache_refs.c */
int join_refs(drc_cache_t *c, int i);
int tryget_slot(drc_cache_t *c, struct drc_region *r, int i);
uint64_t slot_refs(const drc_cache_t *c, const struct drc_region *r, int any);
int drain_begin(drc_cache_t *c, struct drc_region *r, uint64_t bits, uint64_t *moved);
int drain_end(drc_cache_t *c, struct drc_region *r, struct drc_region **dead, int may_release,
              uint64_t moved, int *take);
int put_other(drc_cache_t *c, struct drc_region *r);
int held(drc_cache_t *c, struct drc_region *r);
int put_slot(drc_cache_t *c, struct drc_region *r);
uint64_t tally_sum(const drc_cache_t *c, int what);

/* cache_hint.c */
void used_set(struct hint_tab *t, uintptr_t start, uintptr_t last);
int used_none(const struct hint_tab *t, uintptr_t s, uintptr_t last);
struct hint_tab *hint_new(drc_cache_t *c, unsigned bits);
int hint_init(drc_cache_t *c);
void hint_fini(drc_cache_t *c);
unsigned hint_want(const drc_cache_t *c);
void hint_grow(drc_cache_t *c, unsigned bits);

/* cache_pool.c */
void *mem_alloc(size_t size);
void mem_free(void *p);
struct drc_region *pool_get(drc_cache_t *c, struct chunk **spare);
struct chunk *chunk_new(drc_cache_t *c);
void chunk_drop(drc_cache_t *c, struct chunk *ch);

/*
 * What a lockless lookup that missed learned for the miss after it: no live
 * region overlapped [start, last] (the pages of the range asked) when its
 * walk began, and `path` leads where their insert goes. Under the lock, if
 * the tree has not changed since (drc__itree_unchanged), the miss's plan
 * takes that answer instead of walking again, and its insert takes the path:
 * a miss in random order descends once, not twice (tests/core/test_cache_probe.c).
 */
struct probe {
    int none;                       /* 0: nothing learned (a hit, a torn walk, overlaps, or no walk) */
    uintptr_t start, last;
    struct drc__itree_path path;
};

/* cache_miss.c */
int get_slow(drc_cache_t *c, uintptr_t s, uintptr_t last, unsigned access, int widen, struct probe *pr,
             struct drc_region **out);

/*
 * A live region leaves the tree: released if idle, else detached until its
 * last put. A superseded region is still valid, and goes into c->detached so
 * that a range invalidation can still find it (DETACHED_LIST); an invalid
 * one needs no finding (DETACHED_OFF): it is only counted, and its last put
 * releases it without the lock. The state is set before the CAS that would
 * release it, so the put that races the CAS sees which it is.
 */
enum { LIVE = 0, DETACHED_LIST = 1, DETACHED_OFF = 2 };

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

static inline void locked(drc_cache_t *c)
{
#ifdef DRC_DEBUG
    drc__lock_depth++;
    ST(c->owner, pthread_self());
#endif
    if (LD_SC(c->ninvq))
        invq_run(c);    /* before anything this holder looks up (see queue_invalidation) */
}

/*
 * A live region's index leaf and place in it, as its insert answered
 * (c->lock): a hint that drc__itree_remove_in checks. Read before r goes on any list (a release
 * list, a revoking list): those links reuse the word.
 */
static inline struct drc__itree_bt *region_leaf(const struct drc_region *r)
{
    return r->leaf;
}

/* The cache a region belongs to (drc_put's check): through its chunk. */
static HIT_INLINE drc_cache_t *region_cache(const struct drc_region *r)
{
    return r->chunk->cache;
}

/* A region's second line: the same index in its chunk's ext[]. */
static inline struct region_ext *region_ext(const struct drc_region *r)
{
    const struct chunk *ch = r->chunk;

    return &ch->ext[r - ch->r];
}

static inline enum drc_mem_type region_type(const struct drc_region *r)
{
    return (enum drc_mem_type)(r->kind & KIND_TYPE);
}

/*
 * What every classification says of host memory (mem.h: device -1, the whole
 * address space, no buffer id, context or chunks); publish checks it.
 */
#define host_mem drc__cache_host_mem
extern const struct region_mem host_mem;

/* A region's memory (its reader holds a reference, or c->lock): host_mem, or the one its ext holds. */
static inline const struct region_mem *region_mem(const struct drc_region *r)
{
    return region_type(r) == DRC_MEM_HOST ? &host_mem : &region_ext(r)->mem;
}

/* The slot's VMM chunk records (struct region_chunks), NULL if it never had any. */
static inline struct region_chunks *region_chunks(const struct drc_region *r)
{
    return r->kind & KIND_EXT ? region_ext(r)->mem.chunks : NULL;
}

/*
 * c->detached: the superseded regions a user still holds (DETACHED_LIST),
 * linked through the LRU's links, which a region out of the tree does not
 * use. A list, not an index: a region is superseded while held only when a
 * merge takes in memory that a user holds a reference to, so the list is
 * short, and a range invalidation walks it only when it is not empty.
 */
static inline void detached_add(drc_cache_t *c, struct drc_region *r)
{
    struct region_ext *e = region_ext(r);

    e->lru_prev = NULL;
    e->lru_next = c->detached;
    if (c->detached)
        region_ext(c->detached)->lru_prev = r;
    ST(c->detached, r);
}

static inline void detached_del(drc_cache_t *c, struct drc_region *r)
{
    struct region_ext *e = region_ext(r);

    if (e->lru_prev)
        region_ext(e->lru_prev)->lru_next = e->lru_next;
    else
        ST(c->detached, e->lru_next);
    if (e->lru_next)
        region_ext(e->lru_next)->lru_prev = e->lru_prev;
}

static inline struct drc_region *region_of(struct drc__itree_node *n)
{
    /* through void *: n is inside a 64-byte-aligned region, which clang's -Wcast-align cannot know */
    return (struct drc_region *)(void *)((char *)n - offsetof(struct drc_region, node));
}

/*
 * An rkey grants only what was asked (drc.h). By default a region serves a
 * request only if it has exactly the bits asked: a peer handed the key of a
 * LOCAL_WRITE-only registration must find it refuses remote access, whoever
 * else registered the memory and with what (an unmodified engine publishes
 * every rkey). This strict hit rule, rather than a region of its own for
 * every local-only request: requests with the same bits still share, which
 * is every engine's steady state (one set of bits per buffer), and the test
 * is one compare on the hit path. A request with other bits misses once and
 * then hits its own region, which may overlap the others. DRC_F_ACCESS_SUPERSET
 * relaxes it to: every bit asked, and exactly the remote bits asked when any
 * is asked (a purely local request may share a region with remote bits).
 */
static HIT_INLINE int serves(const drc_cache_t *c, unsigned have, unsigned want)
{
    if (!(c->flags & DRC_F_ACCESS_SUPERSET))
        return have == want;
    return (have & want) == want &&
           (!(want & DRC_ACCESS_REMOTE) || (have & DRC_ACCESS_REMOTE) == (want & DRC_ACCESS_REMOTE));
}

static inline void seq_begin(drc_cache_t *c)
{
    ST(c->seq, c->seq + 1);
    __atomic_thread_fence(__ATOMIC_RELEASE);   /* odd count before any tree store */
}

static inline void seq_end(drc_cache_t *c)
{
    __atomic_store_n(&c->seq, c->seq + 1, __ATOMIC_RELEASE);
}

static inline size_t region_len(const struct drc_region *r)
{
    return LD(r->node.last) - LD(r->node.start) + 1;
}

/*
 * The index of grain number @g in @t's slots (or, with the filter's grains,
 * its filter bits: cache_hint.c's filter_index): its distance from @base,
 * the grain where the cache's lowest registration started when the table
 * was made, modulo the table's size. A cache whose regions lie together
 * then fills the table's first slots, the ones every smaller table of it
 * filled before: a table that grows in place touches no new page until the
 * regions spread over more grains (with slots taken from grain 0, the grains
 * of 65,536 regions filled one half of the table, and the smaller table
 * before had filled the other).
 */
static inline uintptr_t hint_index(const struct hint_tab *t, uintptr_t g, uintptr_t base)
{
    return (g - base) & (~(uintptr_t)0 >> t->shift);
}

/* The slot index of grain number @g (at t->grain) in @t. */
static inline uintptr_t grain_index(const struct hint_tab *t, uintptr_t g)
{
    return hint_index(t, g, t->base);
}

/* The slot of grain number @g in @t. */
static inline struct drc_region **grain_slot(struct hint_tab *t, uintptr_t g)
{
    return &t->slot[grain_index(t, g)];
}

/*
 * What a slot holds: NULL, a region (64-byte aligned), or, once the region
 * there has left the tree, the index leaf it left, tagged in bit 0
 * (hint_forget): a lookup there walks from that leaf, no descent
 * (drc__itree_first_near checks it).
 */
static inline struct drc_region *slot_of_leaf(const struct drc__itree_bt *leaf)
{
    return leaf ? (struct drc_region *)((uintptr_t)leaf | 1) : NULL;
}

static inline int slot_is_leaf(const struct drc_region *r)
{
    return (int)((uintptr_t)r & 1);
}

/* The leaf a slot's value names, or NULL if it names none (NULL or a region). */
static inline const struct drc__itree_bt *slot_leaf(const struct drc_region *r)
{
    return slot_is_leaf(r) ? (const struct drc__itree_bt *)((uintptr_t)r & ~(uintptr_t)1) : NULL;
}

/* The slot of a lookup at @s in the current table. */
static inline struct drc_region **hint_slot(const drc_cache_t *c, uintptr_t s)
{
    struct hint_tab *t = __atomic_load_n(&c->hint, __ATOMIC_ACQUIRE);

    return grain_slot(t, s >> t->grain);
}

/*
 * The grains of [start, last] whose slots are a region's own: its first
 * HINT_GRAINS (or fewer), the first in *g; returns how many. hint_grow's
 * fill leaves the region there, and hint_forget empties them as it leaves.
 */
static inline unsigned region_grains(const struct hint_tab *t, uintptr_t start, uintptr_t last, uintptr_t *g)
{
    uintptr_t more = (last >> t->grain) - (start >> t->grain);

    *g = start >> t->grain;
    return more < HINT_GRAINS ? (unsigned)more + 1 : HINT_GRAINS;
}

/* A locked counter (c->lock held): stats reads it without the lock. */
#define INC(x, v) ST(x, (x) + (v))

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

static inline uint64_t ref_bit(int i)
{
    return 1ull << (i < 63 ? i : 63);
}

/* Take c->lock if it is free (announced misses stay announced); 1 if taken. No locked() here. */
static inline int trylock(drc_cache_t *c)
{
    uint64_t w = __atomic_load_n(&c->lw, __ATOMIC_RELAXED);

    while (!(w & LW_LOCKED))
        if (__atomic_compare_exchange_n(&c->lw, &w, w | LW_LOCKED, 1, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED))
            return 1;
    return 0;
}

static inline void lock(drc_cache_t *c)
{
    /* never re-entered: an allocator or hook called under c->lock would deadlock here */
    DRC_ASSERT_NO_LOCK();
    if (!trylock(c))
        lock_contended(c);     /* out of line: the uncontended path stays as short as it was */
    locked(c);
}

/* The announced misses' bits (c->lock held: they do not change under it). */
static inline unsigned announced(const drc_cache_t *c)
{
    return (unsigned)(LD(c->lw) & LW_ANNOUNCED);
}

#endif
