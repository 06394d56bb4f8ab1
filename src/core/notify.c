/*
 * drc_notify_free(): invalidate a range in every live cache of the process.
 *
 * It may run inside an allocator's free path (a CUDA free hook, a jemalloc
 * extent hook, a CUPTI callback), so it allocates nothing and takes no lock
 * but the caches' own, which no allocator holds: drc never calls an
 * allocator with c->lock held (cache.c's lock order). Caches sit in a fixed
 * table of slots that never moves, so a notifier walks it without a lock.
 *
 * Cost when nothing is registered: with no cache at all, one load of
 * `subscribed`; with caches, per cache one atomic increment and decrement of
 * a user count in a line of this thread's own plus the cache's own lockless
 * hull check (cache.c), which returns without the lock when the range is
 * outside everything the cache registered. tests/bench/bench_notify.c
 * measures both.
 *
 * Use after free of a cache. A notifier announces itself on a slot before it
 * reads the slot's cache, and unsubscribe clears the slot before it waits for
 * the slot's users to drain. The users of slot i are counted per thread:
 * users[t][i] is the notifiers of thread slot t (tslot.h) inside slot i, so
 * two threads issuing free events write two lines of their own, not one
 * shared count. A row is shared only by threads beyond DRC__TSLOTS, which is
 * why every increment, and every decrement of that shared row, is an atomic
 * add. A row of its own has one writer (a nested call on the same thread,
 * from a hook or a signal handler, is balanced before it returns), so its
 * decrement is a load and a release store: no locked instruction, and its
 * value is as exact as an add's.
 *
 *   notifier (thread slot t)             drc_cache_destroy -> unsubscribe
 *   users[t][i]++        (seq_cst)       slot.cache = NULL        (seq_cst)
 *   c = slot.cache       (seq_cst)       for each row u:
 *   c ? drc_invalidate(c) : skip           while (users[u][i]) yield (seq_cst)
 *   users[t][i]--        (release)       free the cache
 *
 * The increment, the load of the slot after it, the store of NULL and the
 * drain's loads are sequentially consistent; the decrement is a release.
 * Take a notifier that read c, not NULL. Its load precedes the store of NULL
 * in the single order S of seq_cst operations, so its increment does too,
 * and so it precedes every load of the drain in S, whichever row the drain
 * reads first. A seq_cst load that follows a seq_cst change of the same word
 * in S reads that change or a later one, so each load of row t reads a count
 * that includes this notifier until its decrement (the changes of a row are
 * atomic adds, or its only writer's stores: its value is exact at every point
 * of its order), and the drain stays on row t until it reads the decrement or
 * a later change, which orders the notifier's use of c before the free: a
 * later add continues the release sequence the decrement heads, and a later
 * decrement is a release of its own. A notifier whose
 * increment follows the store of NULL in S reads NULL (or a cache subscribed
 * since). So, as with one count per slot, no notifier uses a cache that
 * drc_cache_destroy frees: each row is an exact count of its own, and the
 * drain waits for every row in turn.
 *
 * Re-entry. drc_invalidate() calls the backend's dereg() without a cache
 * lock, and a dereg() may free memory and so call drc_notify_free() again on
 * this thread (through a hook or directly). The nested call only adds to the
 * users counts and takes the caches' locks afresh, none of which is held, so
 * it cannot deadlock. The one thing a caller must not do is destroy a cache
 * from inside that cache's own dereg(): unsubscribe would wait for itself.
 *
 * Frees in flight. drc_notify_free() alone leaves a window: a registration
 * that begins after the invalidation but before the real free exports the
 * memory that is about to go, is inserted, and is then found by lookups
 * made after the free (on the new memory at the same address). The wrappers
 * and hooks therefore bracket the real free with drc__notify_begin/end, as
 * mmu_interval_notifier brackets with invalidate_range_start/end:
 *
 *   freer                                 getter (cache.c get_slow)
 *   publish [s, last] in `freeing` (SC)   lock; add pending; unlock (or announce)
 *   invalidate every cache                drc__notify_wait_frees(range):
 *     (marks overlapping pending stale)     wait while an overlapping free
 *   real free                               is published (SC loads)
 *   clear the entry                       export + reg; stale ? retry : insert
 *
 * Either the getter sees the entry and waits until the memory is gone (its
 * export then sees the new memory, or fails), or the freer's invalidation
 * sees the pending registration and marks it stale. The store-buffering case
 * where the cache's hull check lets the invalidation skip the lock is closed
 * by the freer's SC fence before it reads a hull and the getter's SC stores
 * of the hull (cache_miss.c, widen_hull) and of its pending count (or the
 * SC CAS that announces the miss), before its SC loads of the entries.
 *
 * fork(). The child has one thread and a copy of every cache, whose locks
 * other parent threads may have held and whose registrations (and backend
 * context) are the parent's. The atfork child handler makes each subscribed
 * cache inert (cache.c, drc__cache_forked) and empties the table, the
 * frees in flight and the users counts, as UCX purges its caches on fork:
 * in the child the hooks and drc_notify_free see no cache and do nothing,
 * and no backend call is ever made for an inherited cache. A cache created
 * in the child afterwards works as usual.
 *
 * The preload library (src/preload/, LD_PRELOADed) is told where drc lives on
 * the first subscribe (the preload ABI, preload_abi.h): it begins and ends frees
 * through the pointers it is given, so a program that preloads it but never
 * creates a cache never enters drc at all.
 */
#include "core/notify.h"
#include "core/preload_abi.h"

#include "core/mem.h"

#include "core/cache.h"
#include "core/fork.h"
#include "core/tslot.h"

#include <dlfcn.h>
#include <errno.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

/* TSan does not model fences and gcc warns about them (-Wtsan); they are needed all the same. */
#if defined(__SANITIZE_THREAD__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wtsan"
#endif

enum { SLOTS = 64 };

struct slot {
    drc_cache_t *cache;     /* atomic: CAS NULL -> c on subscribe, store NULL on unsubscribe */
};

/*
 * The caches and their users. slot[] is read by every notifier and written
 * on subscribe and unsubscribe only. users[t][i], atomic: the notifiers of
 * thread slot t inside slot i (see "Use after free" above); a row is 256
 * bytes, whole lines, and a thread writes only its own. The slots come first
 * in a page-aligned block, so that no count sits at a slot's address modulo
 * 4 KiB: when the row of thread slot 1 did (users placed before the slots),
 * a free event paid for the load of slot.cache after the increment (4K
 * aliasing of the load with the store).
 */
static struct {
    struct slot slot[SLOTS];
    unsigned users[DRC__TSLOTS + 1][SLOTS];
} table __attribute__((aligned(4096)));

enum { FREEING = 64, F_EMPTY = 0, F_CLAIMED = 1, F_PUBLISHED = 2 };

/* A free in flight: notified, not yet done. */
struct freeing {
    unsigned state;         /* atomic: F_*; start and last are written between CLAIMED and PUBLISHED */
    uintptr_t start, last;  /* atomic */
};

static struct freeing freeing[FREEING];
static unsigned freeing_used;   /* atomic: 1 + the highest entry ever claimed; only grows */
static unsigned freeing_wide;   /* atomic: frees in flight that found no entry: they overlap everything */
static unsigned freeing_gen;    /* atomic: bumped when an entry ends or is published; a futex */
static unsigned freeing_sleepers; /* atomic: getters asleep on freeing_gen */
static unsigned subscribed; /* atomic: caches in the table, for the early out */
static unsigned used;       /* atomic: 1 + the highest slot ever filled; only grows */

/* What the preload library is handed (preload_abi.h). */
static struct drc__preload_ops hook_ops = {
    .version = 2, .begin = drc__notify_begin, .end = drc__notify_end, .caches = &subscribed,
};

void drc__notify_set_cuda_hooks(int (*begin_free)(unsigned long long), int (*begin_teardown)(int),
                                int (*ctx_device)(void *), void (*primary_released)(int))
{
    hook_ops.begin_free = begin_free;
    hook_ops.begin_teardown = begin_teardown;
    hook_ops.ctx_device = ctx_device;
    hook_ops.primary_released = primary_released;
}

/* The preload library's entry point, if it is loaded: see src/preload/preload_cuda.c. */
static void attach_hooks(void)
{
    void (*attach)(const struct drc__preload_ops *);

    *(void **)&attach = dlsym(RTLD_DEFAULT, "drc_hook_attach");
    if (attach)
        attach(&hook_ops);
}

/* The caches' fork child handler (core/fork.h): see "fork()" above. Only this thread exists. */
static void forked_child(void)
{
    unsigned i;
    drc_cache_t *c;

    for (i = 0; i < SLOTS; i++) {
        c = __atomic_load_n(&table.slot[i].cache, __ATOMIC_RELAXED);
        if (c)
            drc__cache_forked(c);
        __atomic_store_n(&table.slot[i].cache, NULL, __ATOMIC_RELAXED);
    }
    memset(table.users, 0, sizeof(table.users));    /* counts of parent threads that do not exist here */
    for (i = 0; i < FREEING; i++)
        __atomic_store_n(&freeing[i].state, F_EMPTY, __ATOMIC_RELAXED);
    __atomic_store_n(&freeing_wide, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&freeing_sleepers, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&subscribed, 0, __ATOMIC_SEQ_CST);
}

static void notify_init(void)
{
    attach_hooks();
    drc__fork_register(DRC__FORK_CACHES, NULL, NULL, forked_child);
}

int drc__notify_subscribe(drc_cache_t *c)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    unsigned i, u;

    /* Before the cache can register anything, so the hooks miss no free of what it registers. */
    pthread_once(&once, notify_init);
    for (i = 0; i < SLOTS; i++) {
        drc_cache_t *empty = NULL;

        if (!__atomic_compare_exchange_n(&table.slot[i].cache, &empty, c, 0, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED))
            continue;
        u = __atomic_load_n(&used, __ATOMIC_RELAXED);
        while (u < i + 1 && !__atomic_compare_exchange_n(&used, &u, i + 1, 1, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED))
            ;
        __atomic_fetch_add(&subscribed, 1, __ATOMIC_SEQ_CST);
        return 0;
    }
    return -ENOSPC;
}

void drc__notify_unsubscribe(drc_cache_t *c)
{
    unsigned i, n = __atomic_load_n(&used, __ATOMIC_SEQ_CST);
    int t;

    for (i = 0; i < n; i++) {
        if (__atomic_load_n(&table.slot[i].cache, __ATOMIC_SEQ_CST) != c)
            continue;
        __atomic_store_n(&table.slot[i].cache, NULL, __ATOMIC_SEQ_CST);
        __atomic_fetch_sub(&subscribed, 1, __ATOMIC_SEQ_CST);
        for (t = 0; t <= DRC__TSLOTS; t++)
            while (__atomic_load_n(&table.users[t][i], __ATOMIC_SEQ_CST))
                sched_yield();
        return;
    }
}

int drc__notify_active(void)
{
    return __atomic_load_n(&subscribed, __ATOMIC_ACQUIRE) != 0;
}

int drc_notify_free(const void *addr, size_t len)
{
    unsigned i, n, *mine;
    int k, t, total = 0;
    drc_cache_t *c;

    if (len && len - 1 > UINTPTR_MAX - (uintptr_t)addr)
        return -EINVAL;
    if (len)
        drc__mem_released((uintptr_t)addr, len);    /* the shared dmabuf exports of the range, cache or not */
    /*
     * The early out. A cache subscribes before it registers anything, and a
     * free that races the creation of a cache cannot free what that cache
     * has not registered yet, so reading 0 here misses nothing.
     */
    if (!len || !__atomic_load_n(&subscribed, __ATOMIC_ACQUIRE))
        return 0;
    n = __atomic_load_n(&used, __ATOMIC_ACQUIRE);
    t = drc__tslot();
    mine = table.users[t];      /* this thread's row, the same at both ends of a nested call */
    for (i = 0; i < n; i++) {
        if (!__atomic_load_n(&table.slot[i].cache, __ATOMIC_ACQUIRE))
            continue;
        __atomic_fetch_add(&mine[i], 1, __ATOMIC_SEQ_CST);
        c = __atomic_load_n(&table.slot[i].cache, __ATOMIC_SEQ_CST);
        k = c ? drc__cache_invalidate(c, addr, len) : 0;
        if (t == DRC__TSLOTS)
            __atomic_fetch_sub(&mine[i], 1, __ATOMIC_RELEASE);
        else    /* the row's only writer: see "Use after free" above */
            __atomic_store_n(&mine[i], __atomic_load_n(&mine[i], __ATOMIC_RELAXED) - 1, __ATOMIC_RELEASE);
        if (k > 0)
            total += k;
    }
    return total;
}

/*
 * Getters sleep on freeing_gen instead of spinning through a whole free
 * (a cudaFree can synchronise the device for milliseconds). No lock: a
 * futex word and a sleeper count, all sequentially consistent.
 *   freer (end)                       getter (wait_frees)
 *   entry state = EMPTY                sleepers++
 *   sleepers ? gen++, wake all : skip  g = gen
 *                                      overlaps ? futex_wait(gen, g) : done
 *                                      sleepers--
 * If the freer reads sleepers == 0, the getter's sleepers++ is later, so
 * its overlap check is later than the EMPTY store and sees it. Otherwise
 * the wake comes after gen++: either the getter read the old gen and
 * futex_wait returns at once (the word changed) or is woken, or it read the
 * new gen, and then its check sees EMPTY. With no sleeper a free pays one
 * load for this.
 */
static void freeing_changed(void)
{
    if (!__atomic_load_n(&freeing_sleepers, __ATOMIC_SEQ_CST))
        return;
    __atomic_fetch_add(&freeing_gen, 1, __ATOMIC_SEQ_CST);
    syscall(SYS_futex, &freeing_gen, FUTEX_WAKE_PRIVATE, INT32_MAX, NULL, NULL, 0);
}

int drc__notify_begin(const void *addr, size_t len)
{
    uintptr_t s = (uintptr_t)addr;
    unsigned i, u, st;

    if (!len || len - 1 > UINTPTR_MAX - s || !__atomic_load_n(&subscribed, __ATOMIC_ACQUIRE))
        return -1;      /* nothing to bracket: no cache (one that appears now has not registered this) */
    for (i = 0; i < FREEING; i++) {
        st = F_EMPTY;
        if (__atomic_load_n(&freeing[i].state, __ATOMIC_RELAXED) != F_EMPTY ||
            !__atomic_compare_exchange_n(&freeing[i].state, &st, F_CLAIMED, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED))
            continue;
        __atomic_store_n(&freeing[i].start, s, __ATOMIC_RELAXED);
        __atomic_store_n(&freeing[i].last, s + (len - 1), __ATOMIC_RELAXED);
        __atomic_store_n(&freeing[i].state, F_PUBLISHED, __ATOMIC_SEQ_CST);
        freeing_changed();  /* a getter asleep on a claimed entry may now see it does not overlap */
        u = __atomic_load_n(&freeing_used, __ATOMIC_RELAXED);
        while (u < i + 1 &&
               !__atomic_compare_exchange_n(&freeing_used, &u, i + 1, 1, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED))
            ;
        break;
    }
    if (i == FREEING)
        __atomic_fetch_add(&freeing_wide, 1, __ATOMIC_SEQ_CST);
    __atomic_thread_fence(__ATOMIC_SEQ_CST);    /* published before any cache's hull is read */
    drc_notify_free(addr, len);
    return (int)i;
}

void drc__notify_end(int ticket)
{
    if (ticket < 0)
        return;
    if (ticket == FREEING)
        __atomic_fetch_sub(&freeing_wide, 1, __ATOMIC_SEQ_CST);
    else
        __atomic_store_n(&freeing[ticket].state, F_EMPTY, __ATOMIC_SEQ_CST);
    freeing_changed();
}

/* 1 if a free overlapping [s, last] is in flight. */
static int freeing_overlaps(uintptr_t s, uintptr_t last)
{
    unsigned i, n = __atomic_load_n(&freeing_used, __ATOMIC_SEQ_CST), st;

    if (__atomic_load_n(&freeing_wide, __ATOMIC_SEQ_CST))
        return 1;
    for (i = 0; i < n; i++) {
        st = __atomic_load_n(&freeing[i].state, __ATOMIC_SEQ_CST);
        if (st == F_CLAIMED)
            return 1;   /* being filled in: a moment */
        if (st == F_PUBLISHED && __atomic_load_n(&freeing[i].start, __ATOMIC_RELAXED) <= last &&
            s <= __atomic_load_n(&freeing[i].last, __ATOMIC_RELAXED))
            return 1;
    }
    return 0;
}

int drc__notify_freeing(uintptr_t s, uintptr_t last)
{
    return freeing_overlaps(s, last);
}

void drc__notify_wait_frees(uintptr_t s, uintptr_t last)
{
    unsigned g, spins;

    /*
     * No fence: the caller made its pending registration known by SC
     * operations (notify.h), which come before these SC loads in the
     * single order of SC operations.
     */
    /* a short free (a host munmap) is over in a few yields: sleep only on a long one (a cudaFree) */
    for (spins = 0; spins < 64; spins++) {
        if (!freeing_overlaps(s, last))
            return;
        sched_yield();
    }
    __atomic_fetch_add(&freeing_sleepers, 1, __ATOMIC_SEQ_CST);
    for (;;) {
        g = __atomic_load_n(&freeing_gen, __ATOMIC_SEQ_CST);
        if (!freeing_overlaps(s, last))
            break;
        syscall(SYS_futex, &freeing_gen, FUTEX_WAIT_PRIVATE, g, NULL, NULL, 0);
    }
    __atomic_fetch_sub(&freeing_sleepers, 1, __ATOMIC_SEQ_CST);
}
