/*
 * drc never calls the allocator with c->lock held (issue 9 item 5).
 *
 * jemalloc, tcmalloc and mimalloc give pages back (munmap, madvise) from
 * inside malloc and free; with drc's host hooks loaded that reaches
 * drc_invalidate on the same thread. If the cache allocated under its own
 * lock, that call would deadlock on it (or, in DRC_DEBUG builds, assert).
 *
 * The test binary wraps the allocator calls of the library objects
 * (-Wl,--wrap=aligned_alloc,--wrap=calloc,--wrap=free, and mmap, munmap and
 * madvise, which the cache's arena calls: see the Makefile): while armed,
 * every allocation, free and mapping call first invalidates a registered page
 * of the cache, as such an allocator's hook (or drc's own munmap and madvise
 * hooks) would. The cache is driven through the places that allocate: new
 * pool chunks and larger hint tables, carved from arenas that map more
 * memory as the cache grows (256 KiB, then doubling).
 */
#include <infiniband/verbs.h>
#include <stdlib.h>
#include <sys/mman.h>

#include "cachetest.h"

#define LW IBV_ACCESS_LOCAL_WRITE

void *__real_aligned_alloc(size_t align, size_t size);
void *__real_calloc(size_t n, size_t size);
void __real_free(void *p);

static drc_cache_t *armed;     /* the cache the "allocator" invalidates into, or NULL */
static int inside;
static unsigned long reentries, found;

static void reenter(void)
{
    int k;

    if (!armed || inside)
        return;
    inside = 1;
    k = drc_invalidate(armed, at(1000, 0), pg());   /* the allocator gives a page back */
    assert_true(k >= 0);
    reentries++;
    found += k > 0;
    inside = 0;
}

void *__wrap_aligned_alloc(size_t align, size_t size);
void *__wrap_aligned_alloc(size_t align, size_t size)
{
    reenter();
    return __real_aligned_alloc(align, size);
}

void *__wrap_calloc(size_t n, size_t size);
void *__wrap_calloc(size_t n, size_t size)
{
    reenter();
    return __real_calloc(n, size);
}

void __wrap_free(void *p);
void __wrap_free(void *p)
{
    reenter();
    __real_free(p);
}

void *__real_mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off);
int __real_munmap(void *addr, size_t len);
int __real_madvise(void *addr, size_t len, int advice);

void *__wrap_mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off);
void *__wrap_mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
    reenter();
    return __real_mmap(addr, len, prot, flags, fd, off);
}

int __wrap_munmap(void *addr, size_t len);
int __wrap_munmap(void *addr, size_t len)
{
    reenter();
    return __real_munmap(addr, len);
}

int __wrap_madvise(void *addr, size_t len, int advice);
int __wrap_madvise(void *addr, size_t len, int advice)
{
    reenter();
    return __real_madvise(addr, len, advice);
}

static int short_alarm(void **state)
{
    (void)state;
    alarm(180);     /* the bug this tests is a deadlock: a guard only (DRC_DEBUG builds check the whole tree at every unlock, O(n) each) */
    return 0;
}

static void allocator_may_reenter_drc_on_every_allocation(void **state)
{
    struct tb *b = tb_new();
    drc_cache_t *c = mk(b, NULL);
    int i;

    (void)state;
    for (i = 0; i < 10000; i++) {
        /* the page the allocator gives back: registered again (unarmed) whenever it was taken out */
        armed = NULL;
        assert_int_equal(drc_put(c, get_ok(c, at(1000, 0), pg(), LW)), 0);
        armed = c;
        assert_int_equal(drc_put(c, get_ok(c, at(2 * (size_t)i, 0), pg(), LW)), 0);
    }
    armed = NULL;
    /* the arenas' mappings as the cache grew: the region records' past 256 KiB and 768 KiB (an
     * mmap each), the second lines' lazy arena past 256 KiB (mmap, madvise MADV_NOHUGEPAGE): each
     * call re-entered drc, and the first of each growth found the registered page (so it took the
     * cache's lock) */
    assert_true(reentries >= 4);
    assert_true(found >= 3);
    done(b, c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(allocator_may_reenter_drc_on_every_allocation, short_alarm),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
