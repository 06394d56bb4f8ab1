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
 * the slot's user count plus the cache's own lockless hull check (cache.c),
 * which returns without the lock when the range is outside everything the
 * cache registered. tests/bench/bench_notify.c measures both.
 *
 * Use after free of a cache. A notifier announces itself on a slot (users++)
 * before it reads the slot's cache, and unsubscribe clears the slot before it
 * waits for the slot's users to drain:
 *
 *   notifier                         drc_cache_destroy -> unsubscribe
 *   users++            (seq_cst)     slot.cache = NULL   (seq_cst)
 *   c = slot.cache     (seq_cst)     while (users) yield (seq_cst)
 *   c ? drc_invalidate(c) : skip     free the cache
 *   users--            (release)
 *
 * With both sides sequentially consistent, either the notifier reads NULL or
 * unsubscribe reads its increment and waits, so no notifier uses a cache that
 * drc_cache_destroy frees.
 *
 * Re-entry. drc_invalidate() calls the backend's dereg() without a cache
 * lock, and a dereg() may free memory and so call drc_notify_free() again on
 * this thread (through a hook or directly). The nested call only adds to the
 * users counts and takes the caches' locks afresh, none of which is held, so
 * it cannot deadlock. The one thing a caller must not do is destroy a cache
 * from inside that cache's own dereg(): unsubscribe would wait for itself.
 *
 * The hook library (hook_preload.c, LD_PRELOADed) is told where drc lives on
 * the first subscribe: it calls drc_notify_free through the pointer it is
 * given, so a program that preloads the hook but never creates a cache never
 * enters drc at all.
 */
#include "notify.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>

enum { SLOTS = 64 };

struct slot {
    drc_cache_t *cache;     /* atomic: CAS NULL -> c on subscribe, store NULL on unsubscribe */
    unsigned users;         /* atomic: notifiers inside this slot */
} __attribute__((aligned(64)));

static struct slot slots[SLOTS];
static unsigned subscribed; /* atomic: caches in the table, for the early out */
static unsigned used;       /* atomic: 1 + the highest slot ever filled; only grows */

/* The hook library's entry point, if it is loaded: see hook_preload.c. */
typedef void drc_hook_attach_fn(int (*notify)(const void *, size_t), const unsigned *caches);

static void attach_hooks(void)
{
    drc_hook_attach_fn *attach;

    *(void **)&attach = dlsym(RTLD_DEFAULT, "drc_hook_attach");
    if (attach)
        attach(drc_notify_free, &subscribed);
}

int drc__notify_subscribe(drc_cache_t *c)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    unsigned i, u;

    /* Before the cache can register anything, so the hooks miss no free of what it registers. */
    pthread_once(&once, attach_hooks);
    for (i = 0; i < SLOTS; i++) {
        drc_cache_t *empty = NULL;

        if (!__atomic_compare_exchange_n(&slots[i].cache, &empty, c, 0, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED))
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

    for (i = 0; i < n; i++) {
        if (__atomic_load_n(&slots[i].cache, __ATOMIC_SEQ_CST) != c)
            continue;
        __atomic_store_n(&slots[i].cache, NULL, __ATOMIC_SEQ_CST);
        __atomic_fetch_sub(&subscribed, 1, __ATOMIC_SEQ_CST);
        while (__atomic_load_n(&slots[i].users, __ATOMIC_SEQ_CST))
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
    unsigned i, n;
    int k, total = 0;
    drc_cache_t *c;

    if (len && len - 1 > UINTPTR_MAX - (uintptr_t)addr)
        return -EINVAL;
    /*
     * The early out. A cache subscribes before it registers anything, and a
     * free that races the creation of a cache cannot free what that cache
     * has not registered yet, so reading 0 here misses nothing.
     */
    if (!len || !__atomic_load_n(&subscribed, __ATOMIC_ACQUIRE))
        return 0;
    n = __atomic_load_n(&used, __ATOMIC_ACQUIRE);
    for (i = 0; i < n; i++) {
        if (!__atomic_load_n(&slots[i].cache, __ATOMIC_ACQUIRE))
            continue;
        __atomic_fetch_add(&slots[i].users, 1, __ATOMIC_SEQ_CST);
        c = __atomic_load_n(&slots[i].cache, __ATOMIC_SEQ_CST);
        k = c ? drc_invalidate(c, addr, len) : 0;
        __atomic_fetch_sub(&slots[i].users, 1, __ATOMIC_RELEASE);
        if (k > 0)
            total += k;
    }
    return total;
}
