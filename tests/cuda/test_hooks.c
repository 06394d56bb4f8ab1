/*
 * Tests of src/hooks.c (the explicit free wrappers), src/notify.c
 * (drc_notify_free) and src/torch.c (the PyTorch allocator entry points).
 *
 * The CUDA driver is a DOUBLE: a table of fake functions installed with
 * drc__cuda_set_driver(). Its "allocations" are fake page ranges (the cache
 * never touches the memory). Each fake free looks, at the moment it is
 * called, at what drc did: a user checks that no region of the allocation
 * could still be returned once the memory is gone, so the fake records
 * whether the region a test holds was already invalid and whether the idle
 * one was already deregistered.
 */
#include <infiniband/verbs.h>

#include "cachetest.h"
#include "drc_cuda.h"
#include "cuda/cuda.h"

enum { ALLOC_PAGES = 8, FAKE_RESULT = 77 };

static struct {
    struct tb *b;
    drc_region_t *held;         /* a region the test holds across the free */
    unsigned long idle_id;      /* the backend id of an idle region of the allocation */
    int calls, held_valid_at_free, idle_live_at_free, syncs;
    drc__cuptr freed;
    size_t unmapped;
    int known;                  /* mem_get_address_range knows the allocation */
} fk;

static drc__cuptr alloc_base(void)
{
    return (drc__cuptr)(uintptr_t)at(16, 0);
}

static int fake_range(drc__cuptr *base, size_t *size, drc__cuptr d)
{
    drc__cuptr b = alloc_base();

    if (!fk.known || d < b || d >= b + ALLOC_PAGES * pg())
        return 500;     /* CUDA_ERROR_NOT_FOUND */
    *base = b;
    *size = ALLOC_PAGES * pg();
    return 0;
}

static void look(drc__cuptr d)
{
    fk.calls++;
    fk.freed = d;
    fk.held_valid_at_free = drc_region_valid(fk.held);
    fk.idle_live_at_free = tb_is_live(fk.b, fk.idle_id);
}

static int fake_free(drc__cuptr d) { look(d); return FAKE_RESULT; }
static int fake_free_async(drc__cuptr d, void *s) { (void)s; look(d); return FAKE_RESULT; }
static int fake_unmap(drc__cuptr p, size_t n) { look(p); fk.unmapped = n; return FAKE_RESULT; }
static int fake_release(unsigned long long h) { (void)h; look(0); return FAKE_RESULT; }
static int fake_sync(void) { fk.syncs++; return 0; }
static int fake_rt_free(void *p) { look((drc__cuptr)(uintptr_t)p); return FAKE_RESULT; }
static int fake_rt_free_async(void *p, void *s) { (void)s; look((drc__cuptr)(uintptr_t)p); return FAKE_RESULT; }

static struct drc__cuda_driver fake_driver(void)
{
    return (struct drc__cuda_driver){
        .cuMemGetAddressRange = fake_range, .cuMemFree = fake_free, .cuMemFreeAsync = fake_free_async,
        .cuMemUnmap = fake_unmap, .cuMemRelease = fake_release, .cuCtxSynchronize = fake_sync,
    };
}

/* A cache with two regions inside the fake allocation: one held, one idle. */
static drc_cache_t *setup_regions(struct drc__cuda_driver *d)
{
    drc_cache_t *c;
    drc_region_t *idle;

    memset(&fk, 0, sizeof(fk));
    fk.b = tb_new();
    fk.known = 1;
    drc__cuda_set_driver(d);
    assert_int_equal(drc_cache_create(&fk.b->be, NULL, &c), 0);
    fk.held = get_ok(c, at(17, 0), pg(), IBV_ACCESS_LOCAL_WRITE);
    idle = get_ok(c, at(22, 0), pg(), IBV_ACCESS_LOCAL_WRITE);
    fk.idle_id = rid(idle);
    assert_int_equal(drc_put(c, idle), 0);
    return c;
}

static void teardown_regions(drc_cache_t *c)
{
    assert_int_equal(drc_put(c, fk.held), 0);
    assert_int_equal(drc_cache_destroy(c), 0);
    assert_int_equal(tb_all_released_once(fk.b), 0);
    tb_free(fk.b);
    drc__cuda_set_driver(NULL);
}

/* The real function ran once, on the pointer given, after drc had dropped every region of the allocation. */
static void expect_notified_then_freed(drc__cuptr d)
{
    assert_int_equal(fk.calls, 1);
    assert_true(fk.freed == d);
    assert_int_equal(fk.held_valid_at_free, 0);
    assert_int_equal(fk.idle_live_at_free, 0);
}

static void test_cuMemFree_notifies_the_whole_allocation_first(void **state)
{
    struct drc__cuda_driver d = fake_driver();
    drc_cache_t *c = setup_regions(&d);

    (void)state;
    /* the pointer names the allocation's base; the regions lie pages further in */
    assert_int_equal(drc_cuMemFree(alloc_base()), FAKE_RESULT);
    expect_notified_then_freed(alloc_base());
    teardown_regions(c);
}

static void test_cuMemFreeAsync_notifies_first(void **state)
{
    struct drc__cuda_driver d = fake_driver();
    drc_cache_t *c = setup_regions(&d);

    (void)state;
    assert_int_equal(drc_cuMemFreeAsync(alloc_base(), NULL), FAKE_RESULT);
    expect_notified_then_freed(alloc_base());
    teardown_regions(c);
}

static void test_cuMemUnmap_notifies_exactly_the_range(void **state)
{
    struct drc__cuda_driver d = fake_driver();
    drc_cache_t *c = setup_regions(&d);

    (void)state;
    fk.known = 0;   /* an unmap needs no lookup: the range is given */
    /* unmap only the pages of the held region: the idle one, elsewhere, stays */
    assert_int_equal(drc_cuMemUnmap((drc__cuptr)(uintptr_t)at(17, 0), pg()), FAKE_RESULT);
    assert_int_equal(fk.calls, 1);
    assert_int_equal(fk.held_valid_at_free, 0);
    assert_int_equal(fk.idle_live_at_free, 1);
    assert_int_equal(fk.unmapped, pg());
    teardown_regions(c);
}

/* Documented: a handle's memory lives until its last mapping is unmapped, so release notifies nothing. */
static void test_cuMemRelease_passes_through(void **state)
{
    struct drc__cuda_driver d = fake_driver();
    drc_cache_t *c = setup_regions(&d);

    (void)state;
    assert_int_equal(drc_cuMemRelease(42), FAKE_RESULT);
    assert_int_equal(fk.calls, 1);
    assert_int_equal(fk.held_valid_at_free, 1);
    assert_int_equal(fk.idle_live_at_free, 1);
    teardown_regions(c);
}

static void test_cudaFree_through_the_runtime(void **state)
{
    struct drc__cuda_driver d = fake_driver();
    drc_cache_t *c;

    (void)state;
    d.cudaFree = fake_rt_free;
    d.cudaFreeAsync = fake_rt_free_async;
    c = setup_regions(&d);
    assert_int_equal(drc_cudaFree((void *)(uintptr_t)alloc_base()), FAKE_RESULT);
    expect_notified_then_freed(alloc_base());
    assert_int_equal(fk.syncs, 0);      /* the runtime's own cudaFree synchronizes */
    teardown_regions(c);

    c = setup_regions(&d);
    assert_int_equal(drc_cudaFreeAsync((void *)(uintptr_t)alloc_base(), NULL), FAKE_RESULT);
    expect_notified_then_freed(alloc_base());
    teardown_regions(c);
}

/* The fake's contexts: the allocation's, and what the calling thread has current (none at first). */
#define ALLOC_CTX ((void *)0xc7)
static void *current_ctx;
static void *synced_in;
static int fake_get_current(void **ctx) { *ctx = current_ctx; return 0; }
static int fake_set_current(void *ctx) { current_ctx = ctx; return 0; }
/* as the driver: with no current context, CUDA_ERROR_INVALID_CONTEXT */
static int fake_sync_needs_ctx(void) { fk.syncs++; synced_in = current_ctx; return current_ctx ? 0 : 201; }
static int fake_ctx_attr(unsigned n, const int *attrs, void **data, drc__cuptr p)
{
    unsigned i;

    for (i = 0; i < n; i++) {
        if (attrs[i] != DRC__CU_POINTER_ATTRIBUTE_CONTEXT)
            return 1;
        *(void **)data[i] = fk.known && p >= alloc_base() && p < alloc_base() + ALLOC_PAGES * pg() ? ALLOC_CTX : NULL;
    }
    return 0;
}

/*
 * A static runtime hides cudaFree: the wrapper synchronizes the allocation's
 * own context and frees through the driver, from a thread that never used
 * the runtime (issue 9 item 8: it used to sync the thread's missing context,
 * get CUDA_ERROR_INVALID_CONTEXT, return 999 and free nothing).
 */
static void test_cudaFree_without_a_visible_runtime(void **state)
{
    struct drc__cuda_driver d = fake_driver();
    drc_cache_t *c;

    (void)state;
    d.cuCtxSynchronize = fake_sync_needs_ctx;
    d.cuCtxGetCurrent = fake_get_current;
    d.cuCtxSetCurrent = fake_set_current;
    d.cuPointerGetAttributes = fake_ctx_attr;
    current_ctx = NULL;
    c = setup_regions(&d);
    /* FAKE_RESULT is no CUresult the wrapper knows: cudaErrorUnknown, from the free itself */
    assert_int_equal(drc_cudaFree((void *)(uintptr_t)alloc_base()), 999);
    expect_notified_then_freed(alloc_base());
    assert_int_equal(fk.syncs, 1);
    assert_ptr_equal(synced_in, ALLOC_CTX);     /* the allocation's context, made current for the wait */
    assert_null(current_ctx);                   /* and the thread's (none) restored */
    assert_int_equal(drc_cudaFree(NULL), 0);    /* the runtime's "initialise" idiom frees nothing */
    assert_int_equal(fk.calls, 1);
    teardown_regions(c);
}

/* Without bounds (the driver does not know the pointer) the first byte is notified. */
static void test_unknown_bounds_notify_the_first_byte(void **state)
{
    struct drc__cuda_driver d = fake_driver();
    drc_cache_t *c = setup_regions(&d);

    (void)state;
    fk.known = 0;
    assert_int_equal(drc_cuMemFree((drc__cuptr)(uintptr_t)at(17, 8)), FAKE_RESULT);
    assert_int_equal(fk.held_valid_at_free, 0);     /* contains the byte */
    assert_int_equal(fk.idle_live_at_free, 1);      /* does not */
    teardown_regions(c);
}

static void test_no_driver_frees_nothing(void **state)
{
    struct drc__cuda_driver none = { 0 };
    drc_cache_t *c = setup_regions(&none);

    (void)state;
    assert_int_equal(drc_cuMemFree(alloc_base()), 3);       /* CUDA_ERROR_NOT_INITIALIZED */
    assert_int_equal(drc_cuMemFreeAsync(alloc_base(), NULL), 3);
    assert_int_equal(drc_cuMemUnmap(alloc_base(), pg()), 3);
    assert_int_equal(drc_cuMemRelease(1), 3);
    assert_int_equal(drc_cudaFree((void *)(uintptr_t)alloc_base()), 3);    /* cudaErrorInitializationError */
    assert_int_equal(fk.calls, 0);
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

static struct {
    int vmm_attr, created, mapped, unmapped, reserved_freed, released, allocs, frees;
    int rdma_flag;
    size_t len;
    int held_valid_at_free;
} tk;

static int t_get_current(void **ctx) { *ctx = (void *)1; return 0; }
static int t_set_current(void *ctx) { (void)ctx; return 0; }
static int t_device_get(int *dev, int ord) { *dev = ord; return 0; }
static int t_attr(int *v, int attr, int dev)
{
    (void)attr;
    *v = dev == 0 ? tk.vmm_attr : 0;    /* device 0 has VMM with RDMA, device 1 has not */
    return 0;
}
static int t_gran(size_t *g, const struct drc__cuda_alloc_prop *p, int opt)
{
    (void)p;
    (void)opt;
    *g = 2 * pg();
    return 0;
}
static int t_create(unsigned long long *h, size_t size, const struct drc__cuda_alloc_prop *p, unsigned long long f)
{
    (void)f;
    tk.created++;
    tk.rdma_flag = p->gpu_direct_rdma_capable && p->location.type == 1 && p->type == 1;
    tk.len = size;
    *h = 7;
    return 0;
}
static int t_reserve(drc__cuptr *p, size_t size, size_t align, drc__cuptr addr, unsigned long long f)
{
    (void)size; (void)align; (void)addr; (void)f;
    *p = (drc__cuptr)(uintptr_t)at(40, 0);
    return 0;
}
static int t_addr_free(drc__cuptr p, size_t size) { (void)p; (void)size; tk.reserved_freed++; return 0; }
static int t_map(drc__cuptr p, size_t s, size_t o, unsigned long long h, unsigned long long f)
{
    (void)p; (void)s; (void)o; (void)h; (void)f;
    tk.mapped++;
    return 0;
}
static int t_access(drc__cuptr p, size_t s, const struct drc__cuda_access_desc *d, size_t n)
{
    (void)p; (void)s; (void)d; (void)n;
    return 0;
}
static int t_unmap(drc__cuptr p, size_t s)
{
    (void)p;
    tk.unmapped++;
    tk.len = s;
    tk.held_valid_at_free = drc_region_valid(fk.held);
    return 0;
}
static int t_release(unsigned long long h) { (void)h; tk.released++; return 0; }
static int t_retain(unsigned long long *h, void *addr)
{
    *h = 7;
    return addr == at(40, 0) ? 0 : 1;   /* only the VMM segment has a handle */
}
static int t_alloc(drc__cuptr *d, size_t s) { (void)s; tk.allocs++; *d = alloc_base(); return 0; }
static int t_free(drc__cuptr d)
{
    (void)d;
    tk.frees++;
    tk.held_valid_at_free = drc_region_valid(fk.held);
    return 0;
}

static struct drc__cuda_driver torch_driver(void)
{
    return (struct drc__cuda_driver){
        .cuMemGetAddressRange = fake_range, .cuCtxSynchronize = fake_sync, .cuCtxGetCurrent = t_get_current,
        .cuCtxSetCurrent = t_set_current, .cuDeviceGet = t_device_get, .cuDeviceGetAttribute = t_attr,
        .cuDevicePrimaryCtxRetain = NULL, .cuMemAlloc = t_alloc, .cuMemFree = t_free, .cuMemGetAllocationGranularity = t_gran,
        .cuMemCreate = t_create, .cuMemAddressReserve = t_reserve, .cuMemAddressFree = t_addr_free,
        .cuMemMap = t_map, .cuMemSetAccess = t_access, .cuMemUnmap = t_unmap, .cuMemRelease = t_release,
        .cuMemRetainAllocationHandle = t_retain,
    };
}

static void test_torch_vmm_segment(void **state)
{
    struct drc__cuda_driver d = torch_driver();
    drc_cache_t *c;
    void *p;

    (void)state;
    memset(&tk, 0, sizeof(tk));
    tk.vmm_attr = 1;
    c = setup_regions(&d);
    p = drc_torch_malloc((ssize_t)(3 * pg()), 0, NULL);
    assert_ptr_equal(p, at(40, 0));
    assert_int_equal(tk.created, 1);
    assert_int_equal(tk.rdma_flag, 1);          /* exportable for RDMA */
    assert_int_equal(tk.len, 4 * pg());         /* rounded up to the granularity */
    assert_int_equal(tk.released, 1);           /* the mapping alone keeps the memory */
    /* a region inside the segment, held across its free */
    assert_int_equal(drc_put(c, fk.held), 0);
    fk.held = get_ok(c, at(41, 0), pg(), 1);
    drc_torch_free(p, (ssize_t)(3 * pg()), 0, NULL);
    assert_int_equal(tk.unmapped, 1);
    assert_int_equal(tk.len, 4 * pg());
    assert_int_equal(tk.held_valid_at_free, 0); /* invalidated before the unmap */
    assert_int_equal(tk.reserved_freed, 1);
    assert_int_equal(tk.allocs + tk.frees, 0);
    teardown_regions(c);
}

static void test_torch_plain_segment(void **state)
{
    struct drc__cuda_driver d = torch_driver();
    drc_cache_t *c;
    void *p;

    (void)state;
    memset(&tk, 0, sizeof(tk));
    c = setup_regions(&d);
    p = drc_torch_malloc((ssize_t)(ALLOC_PAGES * pg()), 1, NULL);   /* device 1: no VMM RDMA */
    assert_ptr_equal(p, (void *)(uintptr_t)alloc_base());
    assert_int_equal(tk.allocs, 1);
    assert_int_equal(tk.created, 0);
    drc_torch_free(p, (ssize_t)(ALLOC_PAGES * pg()), 1, NULL);
    assert_int_equal(tk.frees, 1);
    assert_int_equal(tk.held_valid_at_free, 0);
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
        cmocka_unit_test(test_notify_arguments),
        cmocka_unit_test(test_notify_reaches_every_cache),
        cmocka_unit_test(test_notify_reentry_from_dereg),
        cmocka_unit_test(test_slots_run_out_and_come_back),
        cmocka_unit_test(test_torch_vmm_segment),
        cmocka_unit_test(test_torch_plain_segment),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
