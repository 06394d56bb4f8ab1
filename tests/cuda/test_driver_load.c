/*
 * When drc looks for the CUDA driver (src/cuda/driver.c's dlopen of
 * libcuda.so.1, reached through core/mem.h's prepare): when a cache is
 * created, once per process, never in a miss. Where no libcuda is installed
 * the loader searches its whole path for one, which costs more than a first
 * cache's thousand misses; a user who times the first registration, or who
 * registers from a latency-bound thread, sees that search there unless the
 * creation made it.
 *
 * dlopen is wrapped (-Wl,--wrap=dlopen: tests/cuda/test_driver_load_LDFLAGS)
 * to count the searches for libcuda. The program links THE CUDA double as
 * libcuda.so.1 (the folder's rule), so the search finds it, as it finds the
 * real driver in a CUDA program, and nothing here installs the double in
 * drc's table by hand (no fc_reset): the table is what drc's own search gave.
 * Each test runs in this one process, in order: the first one sees the
 * process before any cache.
 */
#include <dlfcn.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include <cmocka.h>

#include "drc.h"
#include "fake_cuda.h"

static int searches;   /* dlopen()s of libcuda.so.1 */

void *__real_dlopen(const char *file, int mode);
void *__wrap_dlopen(const char *file, int mode)
{
    if (file && strstr(file, "libcuda.so"))
        searches++;
    return __real_dlopen(file, mode);
}

static int regs;

static int null_reg(void *ctx, const struct drc_reg_args *a, void **h, uint32_t *lkey, uint32_t *rkey)
{
    (void)ctx;
    (void)a;
    *h = (void *)(uintptr_t)++regs;
    *lkey = *rkey = 1;
    return 0;
}

static int null_dereg(void *ctx, void *h)
{
    (void)ctx;
    (void)h;
    return 0;
}

static drc_cache_t *new_cache(void)
{
    const struct drc_backend be = { .reg = null_reg, .dereg = null_dereg };
    drc_cache_t *c;

    assert_int_equal(drc_cache_create(&be, NULL, &c), 0);
    return c;
}

/* The process's first cache searches for the driver; its first miss, and the next cache, do not. */
static void creating_a_cache_loads_the_driver_not_the_first_miss(void **state)
{
    char *host = mmap(NULL, 64 << 10, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    drc_cache_t *c, *c2;
    drc_region_t *r;

    (void)state;
    assert_true(host != MAP_FAILED);
    assert_int_equal(searches, 0);      /* nothing of drc has asked for the driver yet */
    c = new_cache();
    assert_int_equal(searches, 1);      /* the creation searched */
    assert_int_equal(drc_get(c, host, 64 << 10, 0, &r), 0);
    assert_int_equal(regs, 1);
    assert_int_equal(drc_region_type(r), DRC_MEM_HOST);
    assert_int_equal(searches, 1);      /* the first miss did not */
    assert_int_equal(drc_put(c, r), 0);
    c2 = new_cache();
    assert_int_equal(searches, 1);      /* once per process */
    assert_int_equal(drc_cache_destroy(c2), 0);
    assert_int_equal(drc_cache_destroy(c), 0);
    munmap(host, 64 << 10);
}

/* The driver the creation found is the one each miss asks: GPU memory is classified as such. */
static void the_driver_found_at_creation_classifies_the_misses(void **state)
{
    unsigned long long dptr = 0;
    drc_cache_t *c;
    drc_region_t *r;

    (void)state;
    fake_cuda_reset();
    assert_int_equal(cuMemAlloc_v2(&dptr, 4 << 20), 0);
    c = new_cache();
    assert_int_equal(drc_get(c, (void *)(uintptr_t)dptr, 64 << 10, 0, &r), 0);
    assert_int_equal(drc_region_type(r), DRC_MEM_CUDA);
    assert_int_equal(drc_put(c, r), 0);
    assert_int_equal(searches, 1);
    assert_int_equal(drc_cache_destroy(c), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(creating_a_cache_loads_the_driver_not_the_first_miss),
        cmocka_unit_test(the_driver_found_at_creation_classifies_the_misses),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
