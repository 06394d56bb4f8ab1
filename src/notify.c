/*
 * drc_notify_free(): invalidate a range in every live cache of the process.
 *
 * It may run inside an allocator's free path, so it allocates nothing and
 * takes no lock but the caches' own (which no allocator holds). Caches sit in
 * a fixed table of slots. A notifier announces itself on a slot (users++)
 * before it reads the slot's cache, and unsubscribe clears the slot before it
 * waits for the slot's users to drain; with both sides sequentially
 * consistent, either the notifier sees the cleared slot or unsubscribe sees
 * the notifier, so a cache is never used after drc_cache_destroy frees it.
 */
#include "notify.h"

#include <errno.h>
#include <sched.h>
#include <stdint.h>

enum { SLOTS = 64 };

struct slot {
    drc_cache_t *cache;     /* atomic */
    unsigned users;         /* atomic: notifiers inside this slot */
} __attribute__((aligned(64)));

static struct slot slots[SLOTS];
static unsigned subscribed; /* atomic: caches in the table, for the early out */

int drc__notify_subscribe(drc_cache_t *c)
{
    int i;

    for (i = 0; i < SLOTS; i++) {
        drc_cache_t *empty = NULL;

        if (__atomic_compare_exchange_n(&slots[i].cache, &empty, c, 0, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED)) {
            __atomic_fetch_add(&subscribed, 1, __ATOMIC_SEQ_CST);
            return 0;
        }
    }
    return -ENOSPC;
}

void drc__notify_unsubscribe(drc_cache_t *c)
{
    int i;

    for (i = 0; i < SLOTS; i++) {
        if (__atomic_load_n(&slots[i].cache, __ATOMIC_SEQ_CST) != c)
            continue;
        __atomic_store_n(&slots[i].cache, NULL, __ATOMIC_SEQ_CST);
        __atomic_fetch_sub(&subscribed, 1, __ATOMIC_SEQ_CST);
        while (__atomic_load_n(&slots[i].users, __ATOMIC_SEQ_CST))
            sched_yield();
        return;
    }
}

int drc_notify_free(const void *addr, size_t len)
{
    int i, n, total = 0;
    drc_cache_t *c;

    if (len && len - 1 > UINTPTR_MAX - (uintptr_t)addr)
        return -EINVAL;
    if (!len || !__atomic_load_n(&subscribed, __ATOMIC_RELAXED))
        return 0;
    for (i = 0; i < SLOTS; i++) {
        if (!__atomic_load_n(&slots[i].cache, __ATOMIC_RELAXED))
            continue;
        __atomic_fetch_add(&slots[i].users, 1, __ATOMIC_SEQ_CST);
        c = __atomic_load_n(&slots[i].cache, __ATOMIC_SEQ_CST);
        n = c ? drc_invalidate(c, addr, len) : 0;
        __atomic_fetch_sub(&slots[i].users, 1, __ATOMIC_RELEASE);
        if (n > 0)
            total += n;
    }
    return total;
}
