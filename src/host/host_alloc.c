/*
 * drc_host_alloc / drc_host_free: host buffers from a jemalloc arena of drc's
 * own, whose extent hooks invalidate memory before it goes back to the OS.
 *
 * Why an arena, and not hooks on munmap/madvise alone: glibc's malloc gives
 * memory back through internal aliases of munmap, madvise and sbrk that no
 * preloaded library sees, so a registered buffer from malloc can be unmapped
 * behind the cache's back and the same addresses handed out again on other
 * pages. jemalloc instead lets an arena choose its extent hooks, the one
 * place every page of the arena passes through on its way out: dalloc
 * (munmap), destroy, decommit, and the two purges (MADV_FREE, MADV_DONTNEED).
 * Each hook here calls drc_notify_free() on the extent, then the default
 * hook of arena 0, so the cache forgets the range before its pages go. A
 * buffer freed and allocated again at the same address without a purge in
 * between keeps its pages, and so rightly keeps its cached registration.
 *
 * jemalloc calls hooks with its own reentrancy guard up, so what
 * drc_notify_free() does inside them (the backend's ibv_dereg_mr may free
 * memory) goes to arena 0 and cannot deadlock on this arena, and nothing
 * drc holds a cache lock around ever allocates from this arena.
 *
 * Debian's libjemalloc (5.3) has unprefixed names: mallocx, dallocx, mallctl.
 */
#include "host/host_alloc.h"

#include <errno.h>
#include <jemalloc/jemalloc.h>
#include <pthread.h>
#include <stdio.h>
#include <unistd.h>

#include "drc.h"
#include "drc_host.h"

static extent_hooks_t *defaults;    /* arena 0's hooks, set once in init */
static unsigned arena;              /* set once in init */
static int init_err;                /* 0 or the negative errno init ended with */
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void *hook_alloc(extent_hooks_t *h, void *addr, size_t size, size_t align, bool *zero, bool *commit,
                        unsigned ind)
{
    (void)h;
    return defaults->alloc(defaults, addr, size, align, zero, commit, ind);
}

static bool hook_dalloc(extent_hooks_t *h, void *addr, size_t size, bool committed, unsigned ind)
{
    (void)h;
    drc_notify_free(addr, size);    /* even if the default opts out (retains): the purge follows */
    return defaults->dalloc(defaults, addr, size, committed, ind);
}

static void hook_destroy(extent_hooks_t *h, void *addr, size_t size, bool committed, unsigned ind)
{
    (void)h;
    drc_notify_free(addr, size);
    defaults->destroy(defaults, addr, size, committed, ind);
}

static bool hook_commit(extent_hooks_t *h, void *addr, size_t size, size_t off, size_t len, unsigned ind)
{
    (void)h;
    return defaults->commit(defaults, addr, size, off, len, ind);
}

static bool hook_decommit(extent_hooks_t *h, void *addr, size_t size, size_t off, size_t len, unsigned ind)
{
    (void)h;
    drc_notify_free((char *)addr + off, len);
    return defaults->decommit(defaults, addr, size, off, len, ind);
}

static bool hook_purge_lazy(extent_hooks_t *h, void *addr, size_t size, size_t off, size_t len, unsigned ind)
{
    (void)h;
    drc_notify_free((char *)addr + off, len);   /* MADV_FREE: the kernel may drop them any time now */
    return defaults->purge_lazy(defaults, addr, size, off, len, ind);
}

static bool hook_purge_forced(extent_hooks_t *h, void *addr, size_t size, size_t off, size_t len, unsigned ind)
{
    (void)h;
    drc_notify_free((char *)addr + off, len);
    return defaults->purge_forced(defaults, addr, size, off, len, ind);
}

static bool hook_split(extent_hooks_t *h, void *addr, size_t size, size_t a, size_t b, bool committed,
                       unsigned ind)
{
    (void)h;
    return defaults->split(defaults, addr, size, a, b, committed, ind);
}

static bool hook_merge(extent_hooks_t *h, void *a, size_t asize, void *b, size_t bsize, bool committed,
                       unsigned ind)
{
    (void)h;
    return defaults->merge(defaults, a, asize, b, bsize, committed, ind);
}

/* A hook the default table lacks stays NULL: jemalloc then treats the operation as refused. */
static extent_hooks_t hooks;

static void init(void)
{
    extent_hooks_t *mine = &hooks;
    size_t sz = sizeof(defaults);

    if (mallctl("arena.0.extent_hooks", &defaults, &sz, NULL, 0) || !defaults) {
        init_err = -ENOMEM;
        return;
    }
    hooks = (extent_hooks_t){
        .alloc = defaults->alloc ? hook_alloc : NULL,
        .dalloc = defaults->dalloc ? hook_dalloc : NULL,
        .destroy = defaults->destroy ? hook_destroy : NULL,
        .commit = defaults->commit ? hook_commit : NULL,
        .decommit = defaults->decommit ? hook_decommit : NULL,
        .purge_lazy = defaults->purge_lazy ? hook_purge_lazy : NULL,
        .purge_forced = defaults->purge_forced ? hook_purge_forced : NULL,
        .split = defaults->split ? hook_split : NULL,
        .merge = defaults->merge ? hook_merge : NULL,
    };
    sz = sizeof(arena);
    if (mallctl("arenas.create", &arena, &sz, &mine, sizeof(mine)))
        init_err = -ENOMEM;
}

void *drc_host_alloc(size_t size)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    void *p;

    pthread_once(&once, init);
    if (init_err || !size) {
        errno = init_err ? -init_err : EINVAL;
        return NULL;
    }
    /*
     * No thread cache: a freed buffer goes straight back to this arena, where
     * its purge is seen. A buffer of a page or more starts on a page (jemalloc
     * would otherwise offset large ones inside their first page), so that it
     * shares no page, and no registration, with its neighbours.
     */
    p = mallocx(size, MALLOCX_ARENA(arena) | MALLOCX_TCACHE_NONE | (size >= page ? MALLOCX_ALIGN(page) : 0));
    if (!p)
        errno = ENOMEM;
    return p;
}

void drc_host_free(void *ptr)
{
    if (ptr)
        dallocx(ptr, MALLOCX_TCACHE_NONE);
}

int drc__host_purge(void)
{
    char name[64];

    pthread_once(&once, init);
    if (init_err)
        return init_err;
    snprintf(name, sizeof(name), "arena.%u.purge", arena);
    return mallctl(name, NULL, NULL, NULL, 0) ? -EIO : 0;
}
