/*
 * Shared helpers for the cache tests: exact stats comparison and fake
 * addresses. The cache never touches the memory it registers (the backend is
 * the recording double of backend.h), so the tests use page-aligned fake
 * addresses that need not be mapped.
 */
#ifndef DRC_TEST_CACHETEST_H
#define DRC_TEST_CACHETEST_H

#include <infiniband/verbs.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmocka.h>

#include "backend.h"
#include "drc.h"

#define BASE ((uintptr_t)0x40000000)

static inline size_t pg(void)
{
    return (size_t)sysconf(_SC_PAGESIZE);
}

/*
 * Resident bytes of the pages from @lo's (rounded down) to @hi (rounded up),
 * by mincore(): what the process's resident set holds of that memory.
 */
static inline size_t resident_bytes(uintptr_t lo, uintptr_t hi)
{
    size_t page = pg(), n, i, bytes = 0;
    unsigned char *vec;

    lo &= ~(uintptr_t)(page - 1);
    hi = (hi + page - 1) & ~(uintptr_t)(page - 1);
    if (hi <= lo)
        return 0;
    n = (hi - lo) / page;
    vec = malloc(n);
    assert_non_null(vec);
    assert_int_equal(mincore((void *)lo, hi - lo, vec), 0);
    for (i = 0; i < n; i++)
        bytes += (vec[i] & 1) ? page : 0;
    free(vec);
    return bytes;
}

/* The fake address @n pages (plus @off bytes) above BASE. */
static inline const void *at(size_t n, size_t off)
{
    return (const void *)(BASE + n * pg() + off);
}

/* @r covers exactly [start, start + len). */
static inline void assert_bounds(const drc_region_t *r, const void *start, size_t len)
{
    uintptr_t s;
    size_t l;

    drc_region_bounds(r, &s, &l);
    assert_int_equal(s, (uintptr_t)start);
    assert_int_equal(l, len);
}

/* A cache over the recording backend @b; @cfg may be NULL. */
static inline drc_cache_t *mk(struct tb *b, const struct drc_config *cfg)
{
    drc_cache_t *c = NULL;

    assert_int_equal(drc_cache_create(&b->be, cfg, &c), 0);
    assert_non_null(c);
    return c;
}

/* Destroy @c and check what a user would: nothing left registered, every handle released once. */
static inline void done(struct tb *b, drc_cache_t *c)
{
    assert_int_equal(drc_cache_destroy(c), 0);
    assert_int_equal(tb_live(b), 0);
    assert_int_equal(tb_all_released_once(b), 0);
    tb_free(b);
}

/*
 * Hits count their references in their thread's slot (cache.c, "Thread
 * references") only once a second thread hit the cache: hit_from_another_thread()
 * makes one get and put @addr (which must hit) on a thread of its own.
 */
struct other_hit {
    drc_cache_t *c;
    const void *addr;
    int err;
};

static inline void *other_hit_thread(void *p)
{
    struct other_hit *o = p;
    drc_region_t *r;

    o->err = drc_get(o->c, o->addr, 1, IBV_ACCESS_LOCAL_WRITE, &r);
    if (!o->err)
        o->err = drc_put(o->c, r);
    return NULL;
}

static inline void hit_from_another_thread(drc_cache_t *c, const void *addr)
{
    struct other_hit o = { c, addr, 0 };
    pthread_t t;

    assert_int_equal(pthread_create(&t, NULL, other_hit_thread, &o), 0);
    pthread_join(t, NULL);
    assert_int_equal(o.err, 0);
}

/* A deadlock fails the test (SIGALRM) instead of hanging it. */
static inline int setup_alarm(void **state)
{
    (void)state;
    alarm(240);
    return 0;
}

static inline void expect_stats_(drc_cache_t *c, struct drc_stats want, const char *file, int line)
{
    struct drc_stats s = { .comp_mask = DRC_STATS_ALL };
    int bad = 0;

    drc_cache_stats(c, &s);
#define F(x)                                                                                               \
    if (s.x != want.x) {                                                                                   \
        fprintf(stderr, "%s:%d: stats." #x " is %llu, expected %llu\n", file, line,                       \
                (unsigned long long)s.x, (unsigned long long)want.x);                                      \
        bad = 1;                                                                                           \
    }
    F(hits) F(misses) F(merges) F(invalidated) F(evicted) F(regs) F(deregs) F(regions) F(bytes) F(in_use)
#undef F
    if (bad)
        _fail(file, line);
}

/* Every 0.1 field of drc_stats checked (not the later ones, e.g. detached); the fields not named must be 0. */
#define EXPECT_STATS(c, ...) expect_stats_((c), (struct drc_stats){ __VA_ARGS__ }, __FILE__, __LINE__)

/* The backend id behind a region. */
static inline unsigned long rid(const drc_region_t *r)
{
    return tb_id(drc_region_handle(r));
}

/* drc_get that must succeed. */
static inline drc_region_t *get_ok_(drc_cache_t *c, const void *a, size_t len, unsigned acc, const char *file,
                                    int line)
{
    drc_region_t *r = NULL;
    int err = drc_get(c, a, len, acc, &r);

    if (err || !r) {
        fprintf(stderr, "%s:%d: drc_get returned %d (%s)\n", file, line, err, drc_strerror(err));
        _fail(file, line);
    }
    return r;
}
#define get_ok(c, a, len, acc) get_ok_((c), (a), (len), (acc), __FILE__, __LINE__)

#endif
