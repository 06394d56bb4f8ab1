/*
 * Region memory: the pool of free regions (pool chunks carved from the
 * cache's arena, type-stable while the cache lives), the deregistration of a
 * release list and its way back to the pool, and drc's few allocations
 * outside the arena. Nothing here is done under c->lock but pool_get.
 */
#include <stdlib.h>
#include <string.h>

#include "core/cache_int.h"

/*
 * Every allocation and free of drc's own memory goes through these (and
 * drc__arena_alloc, for pool chunks and hint tables): never under c->lock.
 */
void *mem_alloc(size_t size)
{
    void *p;

    DRC_ASSERT_NO_LOCK();
    p = aligned_alloc(64, (size + 63) & ~(size_t)63);
    if (p)
        memset(p, 0, size);
    return p;
}

void mem_free(void *p)
{
    DRC_ASSERT_NO_LOCK();
    if (p)
        free(p);
}

/*
 * A free region (c->lock): a released one, else the next of the newest
 * chunk, carved when it is first handed out (so that its fields are
 * written with the rest of it, one line in cache, not in a pass over the
 * whole chunk first). When the chunk is used up it takes the chunk *spare,
 * which the caller allocated without the lock, and clears *spare; with no
 * spare it returns NULL: the caller drops the lock, allocates, and asks again.
 */
struct drc_region *pool_get(drc_cache_t *c, struct chunk **spare)
{
    struct drc_region *r;
    struct chunk *ch;

    ASSERT_LOCKED(c);
    if (!c->pool)
        c->pool = __atomic_exchange_n(&c->freed, NULL, __ATOMIC_ACQUIRE);
    if (c->pool) {
        r = c->pool;
        c->pool = r->next;
        /*
         * The next miss takes the next region: ask for its line now. The
         * list is in the order regions were freed, the most recent first, so
         * past the first few it runs into lines long out of cache, and each
         * one's link is read only when it is taken: a miss that waits on
         * memory under the lock, one region at a time, unless asked for ahead.
         */
        if (c->pool)
            __builtin_prefetch(c->pool);
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
    r->kind = DRC_MEM_HOST;     /* no KIND_EXT: its ext is not written until it needs it */
    r->chunk = ch;
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
struct chunk *chunk_new(drc_cache_t *c)
{
    struct chunk *ch, *rest, *head;
    struct region_ext *ext;
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
    /* the ext[] first: lost if the chunk then fails (a lazy arena's, never written, costs no memory) */
    ext = drc__arena_alloc_raw(c->limited ? &c->arena : &c->ext_arena, n * sizeof(*ext));
    if (!ext)
        return NULL;
    ch = drc__arena_alloc_raw(&c->arena, sizeof(*ch) + n * sizeof(ch->r[0]));
    if (ch) {
        ch->cache = c;
        ch->ext = ext;
        ch->n = n;
    }
    return ch;
}

/* A chunk from chunk_new that pool_get did not take: kept for the next chunk_new (arena memory is not freed). */
void chunk_drop(drc_cache_t *c, struct chunk *ch)
{
    if (!ch)
        return;
    ch->next = __atomic_load_n(&c->unused, __ATOMIC_RELAXED);
    while (!__atomic_compare_exchange_n(&c->unused, &ch->next, ch, 1, __ATOMIC_RELEASE, __ATOMIC_RELAXED))
        ;
}
