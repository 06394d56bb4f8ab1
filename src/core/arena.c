/*
 * A cache's own memory: region chunks, index nodes and hint table headers
 * (cache.c), carved from anonymous mappings that the arena owns until
 * drc_cache_destroy(), and the hint slots' address space (drc__arena_table).
 *
 * Why not malloc: a cache's memory is never returned while the cache lives
 * (regions are type-stable, hint tables are read by lockless lookups), and
 * all of it goes at once when it is destroyed. From malloc that is many small
 * blocks that glibc gives back to the kernel (heap trim) at the destroy, so the
 * next cache takes a page fault on every 4 KiB it touches again: about 10-20 us
 * each on a virtual machine, more than the miss itself. Here:
 *   - mappings grow geometrically with the cache (256 KiB, doubling, at most
 *     32 MiB each, or as large as one request needs), so a cache of a few
 *     regions maps little and touches less;
 *   - a request too large for what the current mapping has left goes to a
 *     new one, and the two largest rests are kept, the smaller used first:
 *     under huge pages the page a rest starts in is resident already, and a
 *     cache that left one such rest per mapping kept a few MiB that nothing
 *     used (a fifth of its memory at 65,536 regions);
 *   - what a cache carves from fresh memory is made resident in one call
 *     (MADV_POPULATE_WRITE), not a fault per 4 KiB page as the cache first
 *     writes it: on a virtual machine a fault can cost more than a miss;
 *   - mappings of 2 MiB or more are 2 MiB-aligned and take huge pages as
 *     the carve fills them: 4 KiB pages at first (MADV_NOHUGEPAGE), and once
 *     the carve has taken three quarters of a huge page, that page collapsed
 *     into one (MADV_HUGEPAGE, then MADV_COLLAPSE: Linux 6.1), so that the
 *     regions and index of a large cache are reached through few TLB
 *     entries. Advised huge pages from the start, each page the carve
 *     entered was resident whole however little of it the cache used: the
 *     last one was up to 2 MiB, a fifth of a cache of 65,536 regions. Now a
 *     cache holds what its carve reached, and at most a quarter of a huge
 *     page more. The price, as a cache first grows: the pages made resident
 *     4 KiB at a time, and a copy of 2 MiB per collapse (which may also
 *     compact memory to find a huge page). Where THP is off (`never`), or
 *     madvise refuses, the same mapping stays in 4 KiB pages: nothing else
 *     changes;
 *   - a destroyed arena's mappings are kept for the next arena, process-wide,
 *     up to DRC__ARENA_KEEP bytes (64 MiB: glibc's own dynamic trim threshold
 *     lets a malloc arena keep as much at its top), and mappings of 2 MiB or
 *     more are marked MADV_FREE when kept, so that under memory pressure the
 *     kernel takes their pages back without swapping (they then read zero;
 *     either way drc__arena_alloc zeroes what it carves from a reused
 *     mapping, and drc__arena_alloc_raw leaves it to its caller). Smaller
 *     ones are kept as they are: on the development machine's kernel a 4 KiB
 *     page marked MADV_FREE faulted again when next written, which is the
 *     cost this file avoids. The rest is unmapped.
 *     DRC_DEBUG builds keep nothing by default, so that a use after destroy
 *     faults instead of reading a later cache's memory.
 *   - a table that grows in place (drc__arena_table: the hint slots, which
 *     lockless lookups read through whichever table header they loaded, so
 *     that a larger table must keep the smaller one's slots where they are)
 *     is address space for the largest table, resident only where written:
 *     its first 2 MiB in 4 KiB pages (a small cache's table stays small),
 *     the rest advised MADV_HUGEPAGE. A destroyed cache's is kept for the
 *     next one, a few at a time, its written bytes counted in the bound
 *     above; the next owner zeroes what it reaches of them.
 *   - a lazy arena (drc__arena_init_lazy: the region records' second lines,
 *     which a cache of host regions without limits never writes) is the
 *     opposite: 4 KiB pages (MADV_NOHUGEPAGE), nothing written but each
 *     mapping's header, so that memory its users do not write never becomes
 *     resident. Its mappings are kept only for later lazy arenas, a few at
 *     a time, with every page but the header's given back (MADV_DONTNEED:
 *     they read zero again) and the rest of the header's page zeroed: a
 *     process that makes and destroys caches would otherwise map, advise,
 *     fault and unmap one for each cache.
 *
 * Nothing here may run with a cache's c->lock held (DRC_ASSERT_NO_LOCK):
 * mmap, munmap and madvise may be intercepted (drc's own host hooks turn
 * munmap and madvise into free events, which take cache locks). The arena's
 * lock guards only its pointers: no call is made while it is held. The kept
 * set is a few atomic slots, so a fork() child never inherits a held lock of
 * it; an arena's own lock is made anew in the child (drc__arena_forked).
 */
#include "core/arena.h"

#include <fcntl.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/cache.h"

struct drc__arena_map {
    struct drc__arena_map *next;    /* in the arena's list */
    size_t size;                    /* a power of two; the mapping starts here */
} __attribute__((aligned(64)));

enum {
    FIRST      = 256 << 10,         /* the first mapping of an arena */
    MAX_MAP    = 32 << 20,          /* mappings double up to this (larger only for a larger request) */
    KEEP_SLOTS = 16,
    LAZY_SLOTS = 4,
    TABLE_SLOTS = 4,
};

/* Kept mappings: address | log2(size) (mappings are page-aligned), 0 for an empty slot. Atomic. */
static uintptr_t kept[KEEP_SLOTS];
static uintptr_t lazy_kept[LAZY_SLOTS];    /* lazy arenas' (address space and a header page each) */
static uintptr_t tables_kept[TABLE_SLOTS]; /* drc__arena_table's: address | table_tag() */
static size_t kept_bytes;           /* atomic: reserved before a slot is filled, released after it is emptied */
#ifdef DRC_DEBUG
static size_t keep_max = 0;         /* atomic */
#else
static size_t keep_max = DRC__ARENA_KEEP;
#endif

#define LD(x) __atomic_load_n(&(x), __ATOMIC_RELAXED)

#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25    /* Linux 6.1; older kernels refuse it (EINVAL), and the pages stay 4 KiB */
#endif
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  /* Linux 5.14; older kernels refuse it, and each page faults when first written */
#endif

static size_t tag_size(uintptr_t t)
{
    return (size_t)1 << (t & 63);
}

static struct drc__arena_map *tag_map(uintptr_t t)
{
    return (struct drc__arena_map *)(t & ~(uintptr_t)63);
}

/* Does a mapping of @size bytes take huge pages (as its carve fills them, huge_passed)? Never a lazy arena's. */
static int in_huge_pages(size_t size, int lazy)
{
    return size >= DRC__ARENA_HUGE && !lazy;
}

/* @size bytes at a DRC__ARENA_HUGE-aligned address (@flags with MAP_PRIVATE | MAP_ANONYMOUS), or NULL. */
static char *map_huge_aligned(size_t size, int flags)
{
    char *p = mmap(NULL, size + DRC__ARENA_HUGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | flags, -1, 0);
    char *q;

    if (p == MAP_FAILED)
        return NULL;
    q = (char *)(((uintptr_t)p + DRC__ARENA_HUGE - 1) & ~(uintptr_t)(DRC__ARENA_HUGE - 1));
    if (q > p)
        munmap(p, (size_t)(q - p));
    if (p + DRC__ARENA_HUGE > q)
        munmap(q + size, (size_t)(p + DRC__ARENA_HUGE - q));
    return q;
}

/*
 * A new mapping of @size bytes (a power of two). One that takes huge pages
 * (in_huge_pages) is huge-page aligned and starts in 4 KiB pages, until
 * huge_passed collapses them; @lazy: advised MADV_NOHUGEPAGE for good
 * (drc__arena_init_lazy).
 */
static struct drc__arena_map *map_new(size_t size, int lazy)
{
    char *p;

    if (in_huge_pages(size, lazy)) {
        if (!(p = map_huge_aligned(size, 0)))
            return NULL;
#ifdef MADV_NOHUGEPAGE
        (void)madvise(p, size, MADV_NOHUGEPAGE);    /* 4 KiB pages until its carve passes 3/4 (huge_passed) */
#endif
        return (struct drc__arena_map *)(void *)p;
    }
    p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
#ifdef MADV_NOHUGEPAGE
    if (lazy)
        (void)madvise(p, size, MADV_NOHUGEPAGE);   /* with THP `always`, one write would fault 2 MiB */
#endif
    return (struct drc__arena_map *)(void *)p;
}

static uintptr_t tag_of(const struct drc__arena_map *m)
{
    return (uintptr_t)m | (uintptr_t)__builtin_ctzll(m->size);
}

/* Put tag @t in an empty slot of @set (n slots); 0 if every slot is full. */
static int slot_put(uintptr_t *set, int n, uintptr_t t)
{
    uintptr_t z;
    int i;

    for (i = 0; i < n; i++) {
        z = 0;
        if (__atomic_compare_exchange_n(&set[i], &z, t, 0, __ATOMIC_RELEASE, __ATOMIC_RELAXED))
            return 1;
    }
    return 0;
}

/* The slot of @set (n slots) with the smallest mapping of at least @size bytes, or -1. */
static int slot_best(const uintptr_t *set, int n, size_t size)
{
    uintptr_t t;
    int i, best = -1;

    for (i = 0; i < n; i++) {
        t = LD(set[i]);
        if (t && tag_size(t) >= size && (best < 0 || tag_size(t) < tag_size(LD(set[best]))))
            best = i;
    }
    return best;
}

/* Count @bytes more as kept if the bound allows (1), else 0: nothing is kept where the bound is 0. */
static int keep_reserve(size_t bytes)
{
    size_t b = __atomic_load_n(&kept_bytes, __ATOMIC_RELAXED);

    do {
        if (!LD(keep_max) || bytes > LD(keep_max) || b > LD(keep_max) - bytes)
            return 0;
    } while (!__atomic_compare_exchange_n(&kept_bytes, &b, b + bytes, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
    return 1;
}

/* Keep @m for a later arena if the bound allows; 0 if the caller must unmap it. */
static int keep_put(struct drc__arena_map *m)
{
    size_t size = m->size;

    if (!keep_reserve(size))
        return 0;
#if defined(MADV_FREE) && !defined(NO_MADV_FREE)
    if (in_huge_pages(size, 0))
        (void)madvise(m, size, MADV_FREE);      /* the kernel may take the pages back under pressure */
#endif
    if (slot_put(kept, KEEP_SLOTS, tag_of(m)))     /* its bytes already counted in kept_bytes */
        return 1;
    __atomic_fetch_sub(&kept_bytes, size, __ATOMIC_RELAXED);
    return 0;
}

/*
 * Take the smallest mapping of at least @size bytes from @set (n slots): its
 * tag, or 0 if there is none, or if another arena took each one tried
 * (@tries times). One that another arena swapped in meanwhile, smaller, goes
 * back; with every slot full it is unmapped, and its bytes added to *lost.
 */
static uintptr_t slot_take(uintptr_t *set, int n, size_t size, int tries, size_t *lost)
{
    uintptr_t t;
    int best;

    for (; tries > 0; tries--) {
        if ((best = slot_best(set, n, size)) < 0)
            return 0;
        t = __atomic_exchange_n(&set[best], 0, __ATOMIC_ACQUIRE);
        if (!t)
            continue;   /* another arena took it */
        if (tag_size(t) >= size)
            return t;
        if (!slot_put(set, n, t)) {
            *lost += tag_size(t);
            munmap(tag_map(t), tag_size(t));
        }
    }
    return 0;
}

/* The smallest kept mapping of at least @size bytes, or NULL. Its contents are stale: the caller zeroes. */
static struct drc__arena_map *keep_take(size_t size)
{
    struct drc__arena_map *m;
    size_t gone = 0;
    uintptr_t t = slot_take(kept, KEEP_SLOTS, size, 4, &gone);

    __atomic_fetch_sub(&kept_bytes, gone + (t ? tag_size(t) : 0), __ATOMIC_RELAXED);
    if (!t)
        return NULL;
    m = tag_map(t);
    m->size = tag_size(t);  /* MADV_FREE may have taken the header's page: it reads zero then */
    return m;
}

/*
 * Keep a lazy arena's mapping for a later one: its pages read zero again,
 * but the header's, which stays resident and whose rest is zeroed here. 0 if
 * the caller must unmap it (the slots are full, or nothing may be kept).
 */
static int lazy_put(struct drc__arena_map *m)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);

    if (!LD(keep_max) || m->size <= page)
        return 0;
    memset(m + 1, 0, page - sizeof(*m));
    if (madvise((char *)m + page, m->size - page, MADV_DONTNEED))
        return 0;
    return slot_put(lazy_kept, LAZY_SLOTS, tag_of(m));
}

/* A kept lazy mapping of at least @size bytes (the smallest), or NULL. It reads zero but its header. */
static struct drc__arena_map *lazy_take(size_t size)
{
    size_t gone = 0;    /* lazy mappings are not counted in kept_bytes */
    uintptr_t t = slot_take(lazy_kept, LAZY_SLOTS, size, 1, &gone);

    return t ? tag_map(t) : NULL;   /* none, or another arena took it: a fresh mapping then */
}

/*
 * Tables (drc__arena_table): the address is DRC__ARENA_HUGE-aligned, so the
 * low bits hold log2 of the size (bits 6-11) and of the dirty bytes rounded
 * up to a power of two, plus one (bits 0-5; 0: none dirty).
 */
static uintptr_t table_tag(void *p, size_t size, size_t dirty)
{
    uintptr_t d = dirty ? (uintptr_t)(64 - __builtin_clzll(((unsigned long long)dirty - 1) | 1)) + 1 : 0;

    return (uintptr_t)p | (uintptr_t)__builtin_ctzll(size) << 6 | d;
}

static size_t table_dirty(uintptr_t t)
{
    return t & 63 ? (size_t)1 << ((t & 63) - 1) : 0;
}

static size_t table_size(uintptr_t t)
{
    return (size_t)1 << (t >> 6 & 63);
}

static void *table_addr(uintptr_t t)
{
    return (void *)(t & ~(uintptr_t)(DRC__ARENA_HUGE - 1));
}

/* Unmap a kept table, taken out of its slot: its dirty bytes no longer count as kept. */
static void table_unmap(uintptr_t t)
{
    __atomic_fetch_sub(&kept_bytes, table_dirty(t), __ATOMIC_RELAXED);
    munmap(table_addr(t), table_size(t));
}

void *drc__arena_table(size_t size, size_t *dirty)
{
    uintptr_t t;
    char *q;
    int i;

    DRC_ASSERT_NO_LOCK();
    for (i = 0; i < TABLE_SLOTS; i++) {
        t = LD(tables_kept[i]);
        if (!t || table_size(t) != size || !(t = __atomic_exchange_n(&tables_kept[i], 0, __ATOMIC_ACQUIRE)))
            continue;
        if (table_size(t) == size) {
            __atomic_fetch_sub(&kept_bytes, table_dirty(t), __ATOMIC_RELAXED);
            *dirty = table_dirty(t);
            return table_addr(t);
        }
        if (!slot_put(tables_kept, TABLE_SLOTS, t))     /* another size, swapped in meanwhile */
            table_unmap(t);
    }
    if (!(q = map_huge_aligned(size, MAP_NORESERVE)))
        return NULL;
#ifdef MADV_NOHUGEPAGE
    (void)madvise(q, DRC__ARENA_HUGE, MADV_NOHUGEPAGE);     /* with THP `always`, one write would fault 2 MiB */
#endif
#ifdef MADV_HUGEPAGE
    if (size > DRC__ARENA_HUGE)
        (void)madvise(q + DRC__ARENA_HUGE, size - DRC__ARENA_HUGE, MADV_HUGEPAGE);
#endif
    *dirty = 0;
    return q;
}

void drc__arena_table_fini(void *p, size_t size, size_t dirty)
{
    uintptr_t t = table_tag(p, size, dirty);

    DRC_ASSERT_NO_LOCK();
    if (!p)
        return;
    dirty = table_dirty(t);
    if (!keep_reserve(dirty)) {
        munmap(p, size);
        return;
    }
#if defined(MADV_FREE) && !defined(NO_MADV_FREE)
    if (dirty > DRC__ARENA_HUGE)    /* its huge pages, as keep_put's (the next owner zeroes them anyway) */
        (void)madvise((char *)p + DRC__ARENA_HUGE, dirty - DRC__ARENA_HUGE, MADV_FREE);
#endif
    if (!slot_put(tables_kept, TABLE_SLOTS, t))
        table_unmap(t);     /* every slot full: its reservation goes back with it */
}

void drc__arena_init(struct drc__arena *a)
{
    memset(a, 0, sizeof(*a));
    pthread_mutex_init(&a->lock, NULL);
    a->next = FIRST;
}

void drc__arena_init_lazy(struct drc__arena *a)
{
    drc__arena_init(a);
    a->lazy = 1;
}

static size_t room(const struct drc__arena_rest *r)
{
    return (size_t)(r->end - r->cur);
}

/* The rest with less room (a->lock held). */
static struct drc__arena_rest *smaller(struct drc__arena *a)
{
    return &a->rest[room(&a->rest[1]) < room(&a->rest[0])];
}

/*
 * @size bytes from one of the two rests (a->lock held), or NULL: from the
 * one with less room that holds them, so that an older mapping's rest is
 * used up by small requests before the newer, larger one.
 */
static char *carve(struct drc__arena *a, size_t size, int *dirty, int *huge)
{
    struct drc__arena_rest *r = smaller(a);
    char *p;

    if (room(r) < size)
        r = &a->rest[r == &a->rest[0]];     /* the other one */
    if (room(r) < size)
        return NULL;
    p = r->cur;
    r->cur += size;
    *dirty = r->dirty;
    *huge = r->huge;
    return p;
}

/* Are transparent huge pages on (`always` or `madvise`)? Read once; no malloc (a hook may be calling). */
static int thp_on(void)
{
    static int on = -1;     /* atomic: -1 not read yet */
    int v = __atomic_load_n(&on, __ATOMIC_RELAXED), fd;
    char buf[64];
    ssize_t n;

    if (v >= 0)
        return v;
    v = 0;
    fd = open("/sys/kernel/mm/transparent_hugepage/enabled", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        n = read(fd, buf, sizeof(buf) - 1);
        buf[n > 0 ? n : 0] = 0;
        v = n > 0 && !strstr(buf, "[never]");
        close(fd);
    }
    __atomic_store_n(&on, v, __ATOMIC_RELAXED);
    return v;
}

/* Fresh memory just carved: its pages resident in one call, not a fault each (resident ones stay as they are). */
static void populate(char *p, size_t size)
{
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t lo = (uintptr_t)p & ~(page - 1), hi = ((uintptr_t)p + size + page - 1) & ~(page - 1);

    (void)madvise((void *)lo, hi - lo, MADV_POPULATE_WRITE);
}

/*
 * A carve of a mapping in huge pages went from @from to @to: each huge page
 * whose carve it took past three quarters becomes one huge page
 * (MADV_COLLAPSE), its last quarter resident with it; a page carved less is
 * 4 KiB pages, resident only where the carve reached.
 */
static void huge_passed(char *from, char *to)
{
    const uintptr_t h = DRC__ARENA_HUGE, q = h / 4 * 3;
    uintptr_t lo = (((uintptr_t)from - q) & ~(h - 1)) + h;     /* the first page whose mark is past @from */
    uintptr_t hi = (((uintptr_t)to - q) & ~(h - 1)) + h;       /* past the last whose mark @to reached */

    if (hi <= lo || !thp_on())
        return;
#ifdef MADV_HUGEPAGE
    (void)madvise((void *)lo, hi - lo, MADV_HUGEPAGE);
#endif
    (void)madvise((void *)lo, hi - lo, MADV_COLLAPSE);     /* refused: 4 KiB pages, khugepaged may collapse */
}

/*
 * A carve of @size bytes at @p, with no lock held: zeroed where the mapping is
 * reused (@dirty) and its caller wants zeros, made resident where it is fresh,
 * and the huge pages the carve filled, from @from on, collapsed (@huge).
 */
static void *carved(const struct drc__arena *a, char *p, size_t size, char *from, int dirty, int zero, int huge)
{
    if (dirty && zero)
        memset(p, 0, size);
    else if (!dirty && !a->lazy)
        populate(p, size);
    if (huge)
        huge_passed(from, p + size);
    return p;
}

static void *arena_alloc(struct drc__arena *a, size_t size, int zero)
{
    struct drc__arena_map *m;
    struct drc__arena_rest nr, *small;
    size_t want, n;
    char *p;
    int dirty, huge;

    DRC_ASSERT_NO_LOCK();
    size = (size + 63) & ~(size_t)63;
    if (size > SIZE_MAX / 4)
        return NULL;
    pthread_mutex_lock(&a->lock);
    if ((p = carve(a, size, &dirty, &huge))) {
        pthread_mutex_unlock(&a->lock);
        return carved(a, p, size, p, dirty, zero, huge);
    }
    want = a->next;
    pthread_mutex_unlock(&a->lock);
    while (want < size + sizeof(*m))
        want *= 2;
    dirty = 1;
    if (a->lazy && (m = lazy_take(want))) {
        dirty = 0;      /* it reads zero past its header, which holds its size (lazy_put) */
    } else if (a->lazy || !(m = keep_take(want))) {
        dirty = 0;      /* fresh anonymous memory reads zero: not touched until used */
        if (!(m = map_new(want, a->lazy)))
            return NULL;
        m->size = want;
    }
    p = (char *)(m + 1);
    pthread_mutex_lock(&a->lock);
    m->next = a->maps;
    a->maps = m;
    a->mapped += m->size;
    /*
     * Three rests now: the new mapping's and the two kept. The two largest
     * stay; the smallest is given up (under huge pages, the one page it
     * shares with what was carved before it is resident all the same).
     */
    huge = in_huge_pages(m->size, a->lazy);
    nr = (struct drc__arena_rest){ p + size, (char *)m + m->size, dirty, huge };
    small = smaller(a);
    if (room(&nr) > room(small))
        *small = nr;
    n = m->size < MAX_MAP ? 2 * m->size : MAX_MAP;
    if (n > a->next)
        a->next = n;
    pthread_mutex_unlock(&a->lock);
    return carved(a, p, size, (char *)m, dirty, zero, huge);
}

void *drc__arena_alloc(struct drc__arena *a, size_t size)
{
    return arena_alloc(a, size, 1);
}

void *drc__arena_alloc_raw(struct drc__arena *a, size_t size)
{
    void *p = arena_alloc(a, size, 0);

#ifdef DRC_DEBUG
    if (p && !a->lazy)
        memset(p, 0xa5, size);  /* whatever a destroyed arena left: a caller must not count on zero */
#endif
    return p;
}

void drc__arena_fini(struct drc__arena *a)
{
    struct drc__arena_map *m, *next;

    DRC_ASSERT_NO_LOCK();
    for (m = a->maps; m; m = next) {
        next = m->next;     /* before keep_put: MADV_FREE may zero it */
        if (a->lazy ? !lazy_put(m) : !keep_put(m))
            munmap(m, m->size);
    }
    a->maps = NULL;
    memset(a->rest, 0, sizeof(a->rest));
    a->mapped = 0;
    pthread_mutex_destroy(&a->lock);
}

void drc__arena_forked(struct drc__arena *a)
{
    pthread_mutex_init(&a->lock, NULL);
}

size_t drc__arena_keep(size_t max)
{
    uintptr_t t;
    int i;

    __atomic_store_n(&keep_max, max, __ATOMIC_RELAXED);
    for (i = 0; !max && i < LAZY_SLOTS; i++)
        if ((t = __atomic_exchange_n(&lazy_kept[i], 0, __ATOMIC_ACQUIRE)))
            munmap(tag_map(t), tag_size(t));
    for (i = 0; i < KEEP_SLOTS && __atomic_load_n(&kept_bytes, __ATOMIC_RELAXED) > max; i++)
        if ((t = __atomic_exchange_n(&kept[i], 0, __ATOMIC_ACQUIRE))) {
            __atomic_fetch_sub(&kept_bytes, tag_size(t), __ATOMIC_RELAXED);
            munmap(tag_map(t), tag_size(t));
        }
    for (i = 0; i < TABLE_SLOTS && (!max || __atomic_load_n(&kept_bytes, __ATOMIC_RELAXED) > max); i++)
        if ((t = __atomic_exchange_n(&tables_kept[i], 0, __ATOMIC_ACQUIRE)))
            table_unmap(t);
    return __atomic_load_n(&kept_bytes, __ATOMIC_RELAXED);
}
