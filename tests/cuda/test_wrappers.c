/*
 * Tests of src/cuda/wrappers.c (the explicit free wrappers), src/core/notify.c
 * (drc_notify_free) and src/cuda/torch.c (the PyTorch allocator entry points).
 *
 * The CUDA driver is THE double (tests/fake_cuda.h), installed with
 * fc_reset(). The allocation the regions lie in is added to it at fake page
 * addresses (fc_add: the cache never touches the memory); torch.c's segments
 * are its own (cuMemCreate and cuMemMap, or cuMemAlloc). The double runs a
 * callback inside each free, while the memory still exists, and the callback
 * looks at what drc did: a user checks that no region of the allocation
 * could still be returned once the memory is gone, so it records whether the
 * region a test holds was already invalid and whether the idle one was
 * already deregistered. fc.free_rc makes the double's frees return a result
 * no driver returns on success, which the wrappers must hand back unchanged.
 */
#include <dlfcn.h>
#include <infiniband/verbs.h>
#include <string.h>

#include "cachetest.h"
#include "drc_cuda.h"
#include "fake_cuda.h"

enum { ALLOC_PAGES = 8, FAKE_RESULT = 77, NOT_FOUND = 500 };

static struct {
    struct tb *b;
    drc_region_t *held;         /* a region the test holds across the free */
    unsigned long idle_id;      /* the backend id of an idle region of the allocation */
    int calls, held_valid_at_free, idle_live_at_free;
    drc__cuptr freed;
    const char *entry;          /* the double's entry point that freed */
} fk;

static drc__cuptr alloc_base(void)
{
    return (drc__cuptr)(uintptr_t)at(16, 0);
}

/* Inside each free of the double, before the memory goes. */
static void look(uintptr_t ptr, size_t len, const char *entry, void *arg)
{
    (void)len;
    (void)arg;
    fk.calls++;
    fk.freed = ptr;
    fk.entry = entry;
    fk.held_valid_at_free = drc_region_valid(fk.held);
    fk.idle_live_at_free = tb_is_live(fk.b, fk.idle_id);
}

/*
 * What the double knows at alloc_base(): one plain allocation of ALLOC_PAGES
 * pages; the same pages as one-page VMM chunks (mapped separately, so each
 * unmaps alone); nothing (host memory, unknown to the driver); or no driver
 * at all (drc's table empty).
 */
enum mem { PLAIN, CHUNKS, UNKNOWN, NO_DRIVER };

/* A cache with two regions inside the allocation: one held, one idle. */
static drc_cache_t *setup_regions(enum mem kind)
{
    drc_cache_t *c;
    drc_region_t *idle;
    size_t i;

    memset(&fk, 0, sizeof(fk));
    fk.b = tb_new();
    fc_reset();
    fake_cuda_on_free(look, NULL);
    if (kind == PLAIN)
        assert_non_null(fc_add(alloc_base(), ALLOC_PAGES * pg(), 0, 1));
    for (i = 0; kind == CHUNKS && i < ALLOC_PAGES; i++)
        assert_non_null(fc_add_vmm((uintptr_t)at(16 + i, 0), pg(), 0, 1 + i, 1));
    if (kind == NO_DRIVER)
        drc__cuda_set_driver(NULL);
    assert_int_equal(drc_cache_create(&fk.b->be, NULL, &c), 0);
    fk.held = get_ok(c, at(17, 0), pg(), IBV_ACCESS_LOCAL_WRITE);
    idle = get_ok(c, at(22, 0), pg(), IBV_ACCESS_LOCAL_WRITE);
    fk.idle_id = rid(idle);
    assert_int_equal(drc_put(c, idle), 0);
    fc.free_rc = FAKE_RESULT;
    return c;
}

static void teardown_regions(drc_cache_t *c)
{
    assert_int_equal(drc_put(c, fk.held), 0);
    assert_int_equal(drc_cache_destroy(c), 0);
    assert_int_equal(tb_all_released_once(fk.b), 0);
    tb_free(fk.b);
    fake_cuda_on_free(NULL, NULL);
    drc__cuda_set_driver(NULL);
}

/* The real function (@entry) ran once, on the pointer given, after drc had dropped every region of the allocation. */
static void expect_notified_then_freed(drc__cuptr d, const char *entry)
{
    assert_int_equal(fk.calls, 1);
    assert_true(fk.freed == d);
    assert_string_equal(fk.entry, entry);
    assert_int_equal(fk.held_valid_at_free, 0);
    assert_int_equal(fk.idle_live_at_free, 0);
}

static void test_cuMemFree_notifies_the_whole_allocation_first(void **state)
{
    drc_cache_t *c = setup_regions(PLAIN);

    (void)state;
    /* the pointer names the allocation's base; the regions lie pages further in */
    assert_int_equal(drc_cuMemFree(alloc_base()), FAKE_RESULT);
    expect_notified_then_freed(alloc_base(), "cuMemFree_v2");
    teardown_regions(c);
}

static void test_cuMemFreeAsync_notifies_first(void **state)
{
    drc_cache_t *c = setup_regions(PLAIN);

    (void)state;
    assert_int_equal(drc_cuMemFreeAsync(alloc_base(), NULL), FAKE_RESULT);
    expect_notified_then_freed(alloc_base(), "cuMemFreeAsync");
    teardown_regions(c);
}

static void test_cuMemUnmap_notifies_exactly_the_range(void **state)
{
    drc_cache_t *c = setup_regions(CHUNKS);

    (void)state;
    /* an unmap needs no lookup: the range is given (the double knows no bounds from here on) */
    fc.range_rc = fc.attr_rc = NOT_FOUND;
    /* unmap only the pages of the held region: the idle one, elsewhere, stays */
    assert_int_equal(drc_cuMemUnmap((drc__cuptr)(uintptr_t)at(17, 0), pg()), FAKE_RESULT);
    assert_int_equal(fk.calls, 1);
    assert_string_equal(fk.entry, "cuMemUnmap");
    assert_int_equal(fk.held_valid_at_free, 0);
    assert_int_equal(fk.idle_live_at_free, 1);
    assert_int_equal(fc.unmap_size, pg());
    teardown_regions(c);
}

/* Documented: a handle's memory lives until its last mapping is unmapped, so release notifies nothing. */
static void test_cuMemRelease_passes_through(void **state)
{
    struct drc__cuda_alloc_prop p = { .type = 1, .location = { .type = 1, .id = 0 } };
    drc_cache_t *c = setup_regions(PLAIN);
    unsigned long long h;
    int releases;

    (void)state;
    assert_int_equal(drc__cuda_driver()->cuMemCreate(&h, FC_GRANULARITY, &p, 0), 0);
    releases = fc.releases;
    assert_int_equal(drc_cuMemRelease(h), FAKE_RESULT);
    assert_int_equal(fc.releases, releases + 1);        /* the real function ran, once */
    /* nothing was notified: both regions are as they were, during the call and after */
    assert_int_equal(drc_region_valid(fk.held), 1);
    assert_int_equal(tb_is_live(fk.b, fk.idle_id), 1);
    assert_int_equal(fk.calls, 0);
    teardown_regions(c);
}

static void test_cudaFree_through_the_runtime(void **state)
{
    drc_cache_t *c;

    (void)state;
    c = setup_regions(PLAIN);
    fc_shared_runtime();
    assert_int_equal(drc_cudaFree((void *)(uintptr_t)alloc_base()), FAKE_RESULT);
    expect_notified_then_freed(alloc_base(), "cudaFree");
    assert_int_equal(fc.syncs, 0);      /* the runtime's own cudaFree synchronizes */
    teardown_regions(c);

    c = setup_regions(PLAIN);
    fc_shared_runtime();
    assert_int_equal(drc_cudaFreeAsync((void *)(uintptr_t)alloc_base(), NULL), FAKE_RESULT);
    expect_notified_then_freed(alloc_base(), "cudaFreeAsync");
    teardown_regions(c);
}

/*
 * A static runtime hides cudaFree: the wrapper synchronizes the allocation's
 * own context and frees through the driver, from a thread that never used
 * the runtime (issue 9 item 8: it used to sync the thread's missing context,
 * get CUDA_ERROR_INVALID_CONTEXT, return 999 and free nothing). The double's
 * cuCtxSynchronize fails as the driver's does with no current context.
 */
static void test_cudaFree_without_a_visible_runtime(void **state)
{
    drc_cache_t *c = setup_regions(PLAIN);     /* fc_reset: no runtime visible, no current context */

    (void)state;
    assert_null(fc_current);
    /* FAKE_RESULT is no CUresult the wrapper knows: cudaErrorUnknown, from the free itself */
    assert_int_equal(drc_cudaFree((void *)(uintptr_t)alloc_base()), 999);
    expect_notified_then_freed(alloc_base(), "cuMemFree_v2");
    assert_int_equal(fc.syncs, 1);
    assert_ptr_equal(fc.sync_ctx, FC_CTX0);     /* the allocation's context, made current for the wait */
    assert_null(fc_current);                    /* and the thread's (none) restored */
    assert_int_equal(drc_cudaFree(NULL), 0);    /* the runtime's "initialise" idiom frees nothing */
    assert_int_equal(fk.calls, 1);
    teardown_regions(c);
}

/*
 * Without bounds (the driver does not know the pointer) the first byte is
 * notified. The double's free of a pointer it does not know fails, as the
 * driver's does, and frees nothing: the regions are looked at when the
 * wrapper returns, the double's answer handed back.
 */
static void test_unknown_bounds_notify_the_first_byte(void **state)
{
    drc_cache_t *c = setup_regions(UNKNOWN);

    (void)state;
    assert_int_equal(drc_cuMemFree((drc__cuptr)(uintptr_t)at(17, 8)), 1);  /* CUDA_ERROR_INVALID_VALUE */
    assert_int_equal(fk.calls, 0);
    assert_int_equal(drc_region_valid(fk.held), 0);             /* contains the byte */
    assert_int_equal(tb_is_live(fk.b, fk.idle_id), 1);          /* does not */
    teardown_regions(c);
}

static void test_no_driver_frees_nothing(void **state)
{
    drc_cache_t *c = setup_regions(NO_DRIVER);

    (void)state;
    assert_int_equal(drc_cuMemFree(alloc_base()), 3);       /* CUDA_ERROR_NOT_INITIALIZED */
    assert_int_equal(drc_cuMemFreeAsync(alloc_base(), NULL), 3);
    assert_int_equal(drc_cuMemUnmap(alloc_base(), pg()), 3);
    assert_int_equal(drc_cuMemRelease(1), 3);
    assert_int_equal(drc_cudaFree((void *)(uintptr_t)alloc_base()), 3);    /* cudaErrorInitializationError */
    assert_int_equal(fk.calls, 0);
    assert_int_equal(fc.releases, 0);
    teardown_regions(c);
}

/*
 * A driver that lacks the frees (its table filled from a library with none
 * of them): every driver free of the table is a stub that answers
 * CUDA_ERROR_NOT_INITIALIZED, so drc's callers call them without testing
 * for NULL; an entry that is not a free stays NULL (the control: the
 * library really lacks the driver's symbols). The wrappers then answer
 * NOT_INITIALIZED, or cudaErrorInitializationError through a static
 * runtime's fallback, and nothing reaches the double. Every entry of the
 * list is called, with its own parameters (frees.h).
 */
static void test_missing_frees_are_stubs(void **state)
{
    struct drc__cuda_driver none, d;
    drc__cuptr dptr = alloc_base(), ptr = alloc_base();
    void *lib = dlopen("libm.so.6", RTLD_NOW | RTLD_LOCAL), *stream = NULL, *p = NULL, *ctx = FC_CTX0;
    size_t size = pg();
    int dev = 0;
    drc_cache_t *c = setup_regions(PLAIN);
    unsigned frees = fake_cuda_frees();

    (void)state;
    (void)ptr, (void)stream, (void)p, (void)ctx, (void)size, (void)dev;
    assert_non_null(lib);
    drc__cuda_fill(lib, &d);
    drc__cuda_fill(NULL, &none);
    assert_null(d.cuMemAlloc);         /* not a free: NULL, as the library lacks it */
#define DRIVER_STUB(name, args)                                                         \
    assert_non_null(d.name);                                                            \
    assert_int_equal(d.name args, 3);                                                   \
    assert_ptr_equal(none.name, d.name);                                                \
    assert_ptr_equal(drc__cuda_no_driver.name, d.name);
#define RUNTIME_STUB(name, args)                                                        \
    assert_null(d.name);    /* a runtime is looked for on use, never stubbed */
#define STUB(api, name, versions, since, kind, params, args, fallback) api##_STUB(name, args)
    DRC__CUDA_FREES(STUB)
#undef STUB
    drc__cuda_set_driver(&d);
    assert_int_equal(drc_cuMemFree(alloc_base()), 3);
    assert_int_equal(drc_cuMemFreeAsync(alloc_base(), NULL), 3);
    assert_int_equal(drc_cuMemUnmap(alloc_base(), pg()), 3);
    assert_int_equal(drc_cuMemFreeHost(p), 3);
    assert_int_equal(drc_cuIpcCloseMemHandle(alloc_base()), 3);
    assert_int_equal(drc_cudaFreeAsync((void *)(uintptr_t)alloc_base(), NULL), 3);
    assert_int_equal(drc_cudaIpcCloseMemHandle((void *)(uintptr_t)alloc_base()), 3);
    assert_int_equal(fake_cuda_frees(), frees);
    assert_int_equal(fk.calls, 0);
    fc_reset();
    fake_cuda_on_free(look, NULL);
    assert_true(fc_table_()->cuMemFree != d.cuMemFree);    /* the double's own, where it has them */
    dlclose(lib);
    teardown_regions(c);
}

/* ---- drc_notify_free ------------------------------------------------------- */

static void test_notify_arguments(void **state)
{
    (void)state;
    assert_int_equal(drc_notify_free((void *)UINTPTR_MAX, 2), -EINVAL);
    assert_int_equal(drc_notify_free(at(0, 0), 0), 0);
    assert_int_equal(drc_notify_free(at(0, 0), pg()), 0);   /* no cache at all */
}

static void test_notify_reaches_every_cache(void **state)
{
    struct tb *b1 = tb_new(), *b2 = tb_new();
    drc_cache_t *c1, *c2;
    drc_region_t *r;

    (void)state;
    assert_int_equal(drc_cache_create(&b1->be, NULL, &c1), 0);
    assert_int_equal(drc_cache_create(&b2->be, NULL, &c2), 0);
    assert_int_equal(drc_put(c1, get_ok(c1, at(1, 0), pg(), 1)), 0);
    assert_int_equal(drc_put(c1, get_ok(c1, at(9, 0), pg(), 1)), 0);
    assert_int_equal(drc_put(c2, get_ok(c2, at(2, 0), pg(), 1)), 0);
    r = get_ok(c2, at(30, 0), pg(), 1);
    assert_int_equal(drc_notify_free(at(0, 0), 4 * pg()), 2);  /* one region in each cache */
    assert_int_equal(tb_live(b1), 1);
    assert_int_equal(tb_live(b2), 1);
    assert_int_equal(drc_region_valid(r), 1);
    assert_int_equal(drc_put(c2, r), 0);
    assert_int_equal(drc_cache_destroy(c1), 0);
    /* a destroyed cache is left alone: c1's table slot is empty, c2 still answers */
    assert_int_equal(drc_notify_free(at(0, 0), 64 * pg()), 1);
    assert_int_equal(drc_cache_destroy(c2), 0);
    assert_int_equal(tb_all_released_once(b1), 0);
    assert_int_equal(tb_all_released_once(b2), 0);
    tb_free(b1);
    tb_free(b2);
}

/* A backend whose dereg frees memory, and so calls drc_notify_free again, from inside a notify. */
static int reentrant_dereg(struct tb *b, unsigned long id, void *arg)
{
    int *depth = arg;

    (void)b;
    (void)id;
    if (++*depth == 1) {
        /* the region being deregistered (its range again) and another one of the same cache */
        drc_notify_free(at(1, 0), pg());
        drc_notify_free(at(5, 0), pg());
    }
    --*depth;
    return 0;
}

static void test_notify_reentry_from_dereg(void **state)
{
    struct tb *b = tb_new();
    drc_cache_t *c;
    int depth = 0;

    (void)state;
    b->dereg_hook = reentrant_dereg;
    b->dereg_arg = &depth;
    assert_int_equal(drc_cache_create(&b->be, NULL, &c), 0);
    assert_int_equal(drc_put(c, get_ok(c, at(1, 0), pg(), 1)), 0);
    assert_int_equal(drc_put(c, get_ok(c, at(5, 0), pg(), 1)), 0);
    assert_int_equal(drc_notify_free(at(1, 0), pg()), 1);
    /* the nested notify, from inside the first one's dereg, took the other region */
    assert_int_equal(tb_live(b), 0);
    assert_int_equal(drc_cache_destroy(c), 0);
    assert_int_equal(tb_all_released_once(b), 0);
    tb_free(b);
}

static void test_slots_run_out_and_come_back(void **state)
{
    enum { N = 64 };
    struct tb *b = tb_new();
    drc_cache_t *c[N + 1];
    int i;

    (void)state;
    for (i = 0; i < N; i++)
        assert_int_equal(drc_cache_create(&b->be, NULL, &c[i]), 0);
    assert_int_equal(drc_cache_create(&b->be, NULL, &c[N]), -ENOSPC);
    assert_int_equal(drc_cache_destroy(c[7]), 0);
    assert_int_equal(drc_cache_create(&b->be, NULL, &c[7]), 0);    /* the freed slot is reused */
    assert_int_equal(drc_put(c[7], get_ok(c[7], at(3, 0), pg(), 1)), 0);
    assert_int_equal(drc_notify_free(at(3, 0), 1), 1);
    for (i = 0; i < N; i++)
        assert_int_equal(drc_cache_destroy(c[i]), 0);
    tb_free(b);
}

/* ---- the PyTorch allocator -------------------------------------------------- */

/* The double's allocation that starts at @p, or NULL. */
static const struct fc_alloc *segment(const void *p)
{
    int i;

    for (i = 0; i < fc.n; i++)
        if (fc.a[i].base == (uintptr_t)p)
            return &fc.a[i];
    return NULL;
}

static void test_torch_vmm_segment(void **state)
{
    const struct fc_alloc *a;
    drc_cache_t *c;
    void *p;

    (void)state;
    c = setup_regions(PLAIN);
    fc.free_rc = 0;
    p = drc_torch_malloc((ssize_t)(3 * pg()), 0, NULL);   /* device 0: VMM with RDMA */
    a = segment(p);
    assert_non_null(a);
    assert_int_equal(a->vmm, 1);                /* mapped in the range reserved for it */
    assert_int_equal(fc.reserves, 1);
    assert_int_equal(fc.creates, 1);
    /* exportable for RDMA: pinned device memory of device 0, gpuDirectRDMACapable */
    assert_int_equal(a->gdr, 1);
    assert_int_equal(a->prop_type, 1);
    assert_int_equal(a->device, 0);
    assert_int_equal(a->size, FC_GRANULARITY);  /* rounded up to the granularity */
    assert_int_equal(fc.releases, 1);           /* the mapping alone keeps the memory */
    /* a region inside the segment, held across its free */
    assert_int_equal(drc_put(c, fk.held), 0);
    fk.held = get_ok(c, (const char *)p + pg(), pg(), 1);
    drc_torch_free(p, (ssize_t)(3 * pg()), 0, NULL);
    assert_int_equal(fk.calls, 1);
    assert_string_equal(fk.entry, "cuMemUnmap");
    assert_int_equal(fc.unmap_size, FC_GRANULARITY);
    assert_int_equal(fk.held_valid_at_free, 0); /* invalidated before the unmap */
    assert_int_equal(fc.address_frees, 1);
    assert_int_equal(fc.allocs, 0);             /* no cuMemAlloc, and (calls, entry) no cuMemFree */
    teardown_regions(c);
}

static void test_torch_plain_segment(void **state)
{
    const struct fc_alloc *a;
    drc_cache_t *c;
    void *p;

    (void)state;
    c = setup_regions(PLAIN);
    fc.free_rc = 0;
    fc.no_vmm[1] = 1;
    p = drc_torch_malloc((ssize_t)(ALLOC_PAGES * pg()), 1, NULL);   /* device 1: no VMM RDMA */
    a = segment(p);
    assert_non_null(a);                         /* what cuMemAlloc gave */
    assert_int_equal(a->vmm, 0);
    assert_int_equal(a->device, 1);
    assert_int_equal(fc.allocs, 1);
    assert_int_equal(fc.creates, 0);
    /* a region inside the segment, held across its free */
    assert_int_equal(drc_put(c, fk.held), 0);
    fk.held = get_ok(c, (const char *)p + pg(), pg(), 1);
    drc_torch_free(p, (ssize_t)(ALLOC_PAGES * pg()), 1, NULL);
    assert_int_equal(fk.calls, 1);
    assert_string_equal(fk.entry, "cuMemFree_v2");
    assert_int_equal(fk.held_valid_at_free, 0);
    assert_null(drc_torch_malloc(0, 1, NULL));
    assert_null(drc_torch_malloc(4096, -1, NULL));
    teardown_regions(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cuMemFree_notifies_the_whole_allocation_first),
        cmocka_unit_test(test_cuMemFreeAsync_notifies_first),
        cmocka_unit_test(test_cuMemUnmap_notifies_exactly_the_range),
        cmocka_unit_test(test_cuMemRelease_passes_through),
        cmocka_unit_test(test_cudaFree_through_the_runtime),
        cmocka_unit_test(test_cudaFree_without_a_visible_runtime),
        cmocka_unit_test(test_unknown_bounds_notify_the_first_byte),
        cmocka_unit_test(test_no_driver_frees_nothing),
        cmocka_unit_test(test_missing_frees_are_stubs),
        cmocka_unit_test(test_notify_arguments),
        cmocka_unit_test(test_notify_reaches_every_cache),
        cmocka_unit_test(test_notify_reentry_from_dereg),
        cmocka_unit_test(test_slots_run_out_and_come_back),
        cmocka_unit_test(test_torch_vmm_segment),
        cmocka_unit_test(test_torch_plain_segment),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
