/*
 * Several GPUs in one process (issue 13), on THE CUDA DOUBLE laid out as two
 * devices (tests/fake_cuda.h) with its contexts checked as the real driver
 * checks them (fc.strict_ctx: the export fails with no context current or
 * with another device's). The same scenarios run on two real GPUs in
 * tests/gpu/test_multi_gpu.c. What a user checks:
 *  - device-1 memory registered from a thread whose current context is
 *    device 0's, or with none: the region is device 1's, the export ran in
 *    the allocation's own context, and the caller's context is unchanged;
 *  - frees of device-1 memory from device 0's context, from no context, and
 *    after the current device changed (cudaFree after cudaSetDevice): the
 *    whole allocation's regions go, the caller's context stays;
 *  - a context reset or destroy of one device (cuDevicePrimaryCtxReset,
 *    cuCtxDestroy, cudaDeviceReset of the current device) drops that
 *    device's regions and leaves the other device's valid;
 *  - peer-mapped VMM memory of device 1 (cuMemSetAccess for both devices)
 *    registered from device 0's context is device 1's;
 *  - the drc pool (drc_torch_malloc) asked for device 1 while device 0's
 *    context is current gives device 1's memory.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "drc.h"
#include "drc_cuda.h"
#include "fake_cuda.h"

#define MiB (1ul << 20)
#define GPU0 0x7f0000000000ul
#define GPU1 0x7f8000000000ul

/* The backend double: what each registration was handed. The cache closes the dmabuf fd itself. */
struct rec {
    int regs, deregs;
    int device[16], type[16], had_fd[16];
};

static int rec_reg(void *ctx, const struct drc_reg_args *a, void **h, uint32_t *lkey, uint32_t *rkey)
{
    struct rec *r = ctx;
    int i = r->regs++;

    if (i < 16) {
        r->device[i] = a->device;
        r->type[i] = a->type;
        r->had_fd[i] = fd_is_open(a->dmabuf_fd);
    }
    *h = (void *)(uintptr_t)r->regs;
    *lkey = *rkey = 1;
    return 0;
}

static int rec_dereg(void *ctx, void *h)
{
    (void)h;
    ((struct rec *)ctx)->deregs++;
    return 0;
}

static struct rec rec;
static drc_cache_t *cache;

static int setup(void **state)
{
    struct drc_backend be = { .reg = rec_reg, .dereg = rec_dereg, .ctx = &rec };
    struct drc_config cfg = { .policy = DRC_DMABUF_THEN_PEERMEM };

    (void)state;
    fc_reset();
    fc.strict_ctx = 1;
    memset(&rec, 0, sizeof(rec));
    return drc_cache_create(&be, &cfg, &cache);
}

static int teardown(void **state)
{
    (void)state;
    drc_cache_destroy(cache);
    assert_int_equal(rec.regs, rec.deregs);
    fc_current = NULL;
    drc__cuda_set_driver(NULL);
    return 0;
}

static void reg_idle(uintptr_t p, size_t len)
{
    drc_region_t *r;

    assert_int_equal(drc_get(cache, (void *)p, len, 1, &r), 0);
    assert_int_equal(drc_put(cache, r), 0);
}

/* The last export: made in @ctx, and the fd reached the backend open. */
static void exported_in(void *ctx)
{
    assert_true(fc.nexports > 0);
    assert_ptr_equal(fc.exports[fc.nexports - 1].ctx, ctx);
    assert_true(fc.exports[fc.nexports - 1].fd >= 0);
    assert_true(rec.had_fd[rec.regs - 1]);
}

/* The control of the double itself: an export from the wrong context fails, as on the real driver. */
static void double_refuses_the_wrong_context(void **state)
{
    int fd = -1;

    (void)state;
    fc_add(GPU1, 64 * MiB, 1, 7);
    fc_current = FC_PRIMARY(0);
    assert_int_equal(cuMemGetHandleForAddressRange(&fd, GPU1, MiB, 1, 0), DRC__CUDA_ERROR_INVALID_CONTEXT);
    fc_current = NULL;
    assert_int_equal(cuMemGetHandleForAddressRange(&fd, GPU1, MiB, 1, 0), DRC__CUDA_ERROR_INVALID_CONTEXT);
    fc_current = FC_PRIMARY(1);
    assert_int_equal(cuMemGetHandleForAddressRange(&fd, GPU1, MiB, 1, 0), 0);
    close(fd);
}

static void register_from_the_other_device_context(void **state)
{
    (void)state;
    fc_add(GPU1, 64 * MiB, 1, 7);
    fc_current = FC_PRIMARY(0);
    reg_idle(GPU1 + 4 * MiB, MiB);
    assert_int_equal(rec.regs, 1);
    assert_int_equal(rec.type[0], DRC_MEM_CUDA);
    assert_int_equal(rec.device[0], 1);
    exported_in(FC_CTX(1));
    assert_ptr_equal(fc_current, FC_PRIMARY(0));    /* the caller's context, restored */
}

static void register_from_no_context(void **state)
{
    (void)state;
    fc_add(GPU1, 64 * MiB, 1, 7);
    fc_current = NULL;
    reg_idle(GPU1 + 4 * MiB, MiB);
    assert_int_equal(rec.regs, 1);
    assert_int_equal(rec.device[0], 1);
    exported_in(FC_CTX(1));
    assert_null(fc_current);
    /* device 0's memory from the same thread: its own context, not the one used last */
    fc_add(GPU0, 64 * MiB, 0, 8);
    reg_idle(GPU0, MiB);
    assert_int_equal(rec.device[1], 0);
    exported_in(FC_CTX(0));
    assert_null(fc_current);
}

/* A free of device-1 memory from device 0's context, then from none: the whole allocation goes. */
static void free_from_the_other_device_context(void **state)
{
    (void)state;
    fc_add(GPU1, 64 * MiB, 1, 7);
    reg_idle(GPU1 + 32 * MiB, MiB);
    fc_current = FC_PRIMARY(0);
    assert_int_equal(drc_cuMemFree(GPU1), 0);
    assert_int_equal(fc.frees, 1);
    assert_int_equal(rec.deregs, 1);        /* the sub-range at +32 MiB went with it */
    assert_ptr_equal(fc_current, FC_PRIMARY(0));
    fc_add(GPU1, 64 * MiB, 1, 9);
    reg_idle(GPU1 + 32 * MiB, MiB);
    fc_current = NULL;
    assert_int_equal(drc_cuMemFree(GPU1), 0);
    assert_int_equal(rec.deregs, 2);
    assert_null(fc_current);
}

/* cudaSetDevice(1); cudaMalloc; cudaSetDevice(0); cudaFree: device 1's memory, freed from device 0. */
static void free_after_the_current_device_changed(void **state)
{
    unsigned long long p, q;
    int (*const frees[])(void *) = { drc_cudaFree, NULL };
    int k;

    (void)state;
    for (k = 0; k < 2; k++) {
        fc_current = FC_PRIMARY(1);
        assert_int_equal(cuMemAlloc_v2(&p, 8 * MiB), 0);
        reg_idle(p + 4 * MiB, MiB);
        assert_int_equal(rec.device[rec.regs - 1], 1);
        fc_current = FC_PRIMARY(0);
        if (frees[k])
            assert_int_equal(frees[k]((void *)(uintptr_t)p), 0);
        else
            assert_int_equal(drc_cuMemFree(p), 0);
        assert_int_equal(rec.deregs, 2 * k + 1);
        assert_ptr_equal(fc_current, FC_PRIMARY(0));
        /* the same VA again on device 1: a new registration, on the new memory */
        fc_current = FC_PRIMARY(1);
        assert_int_equal(cuMemAlloc_v2(&q, 8 * MiB), 0);
        assert_true(q == p);
        reg_idle(p + 4 * MiB, MiB);
        assert_int_equal(rec.regs, 2 * k + 2);
        assert_int_equal(drc_cuMemFree(q), 0);
    }
}

/* Hold a region of each device; @reset tears down one device; the other's stays valid. */
static void teardown_one_device(int (*reset)(void), int gone)
{
    drc_region_t *r0, *r1, *r;

    fc_add(GPU0, 64 * MiB, 0, 1);
    fc_add(GPU1, 64 * MiB, 1, 2);
    assert_int_equal(drc_get(cache, (void *)(GPU0 + MiB), MiB, 1, &r0), 0);
    assert_int_equal(drc_get(cache, (void *)(GPU1 + MiB), MiB, 1, &r1), 0);
    assert_int_equal(reset(), 0);
    assert_int_equal(drc_region_valid(gone ? r1 : r0), 0);
    assert_int_equal(drc_region_valid(gone ? r0 : r1), 1);
    assert_int_equal(drc_put(cache, r0), 0);
    assert_int_equal(drc_put(cache, r1), 0);
    /* a get of the survivor is a hit */
    assert_int_equal(drc_get(cache, (void *)((gone ? GPU0 : GPU1) + MiB), MiB, 1, &r), 0);
    assert_int_equal(rec.regs, 2);
    assert_int_equal(drc_put(cache, r), 0);
}

static int reset_primary_1(void)
{
    return drc_cuDevicePrimaryCtxReset(1);
}

static int destroy_ctx_1(void)
{
    return drc_cuCtxDestroy(FC_CTX(1));
}

static int device_reset_current(void)
{
    return drc_cudaDeviceReset();
}

static void primary_reset_of_one_device(void **state)
{
    (void)state;
    teardown_one_device(reset_primary_1, 1);
    assert_int_equal(fc.reset_dev, 1);
}

static void ctx_destroy_of_one_device(void **state)
{
    (void)state;
    teardown_one_device(destroy_ctx_1, 1);
    assert_int_equal(fc.destroys, 1);
}

/* cudaDeviceReset resets the CURRENT device only: device 0 here, device 1 after cudaSetDevice(1). */
static void device_reset_is_the_current_device(void **state)
{
    (void)state;
    fc_current = FC_PRIMARY(0);
    teardown_one_device(device_reset_current, 0);
    assert_int_equal(fc.reset_dev, 0);
    assert_ptr_equal(fc_current, FC_PRIMARY(0));
}

static void device_reset_after_set_device(void **state)
{
    (void)state;
    fc_current = FC_PRIMARY(1);
    teardown_one_device(device_reset_current, 1);
    assert_int_equal(fc.reset_dev, 1);
}

/* Device 1's VMM memory mapped for both devices, registered from device 0's context. */
static void peer_mapped_vmm_is_its_device(void **state)
{
    const size_t g = 2 * MiB;
    struct drc__cuda_access_desc acc[2] = { { { 1, 0 }, 3 }, { { 1, 1 }, 3 } };

    (void)state;
    fc_add_vmm(GPU1, g, 1, 10, 1);
    fc_add_vmm(GPU1 + g, g, 1, 11, 1);
    fc_current = FC_PRIMARY(0);
    assert_int_equal(cuMemSetAccess(GPU1, 2 * g, acc, 2), 0);
    assert_int_equal(fc.a[0].access & fc.a[1].access, 3);   /* the double recorded both devices */
    reg_idle(GPU1, 2 * g);
    assert_int_equal(rec.regs, 1);
    assert_int_equal(rec.type[0], DRC_MEM_CUDA);
    assert_int_equal(rec.device[0], 1);
    exported_in(FC_PRIMARY(1));     /* VMM memory has no context: its device's primary one */
    assert_true(fc.exports[0].ptr == GPU1 && fc.exports[0].size == 2 * g);
    assert_ptr_equal(fc_current, FC_PRIMARY(0));
    assert_int_equal(drc_cuMemUnmap(GPU1, g), 0);
    assert_int_equal(rec.deregs, 1);
}

/* The drc pool's segment for device 1, asked for while device 0's context is current: device 1's memory. */
static void torch_segment_is_on_its_device(void **state)
{
    void *p;
    int dev = -1;

    (void)state;
    fc_current = FC_PRIMARY(0);
    p = drc_torch_malloc((ssize_t)(8 * MiB), 1, NULL);     /* the double has no VMM: cuMemAlloc */
    assert_non_null(p);
    assert_int_equal(cuPointerGetAttribute(&dev, DRC__CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, (uintptr_t)p), 0);
    assert_int_equal(dev, 1);
    assert_ptr_equal(fc_current, FC_PRIMARY(0));
    reg_idle((uintptr_t)p, MiB);
    assert_int_equal(rec.device[0], 1);
    drc_torch_free(p, (ssize_t)(8 * MiB), 1, NULL);
    assert_int_equal(rec.deregs, 1);
    assert_ptr_equal(fc_current, FC_PRIMARY(0));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(double_refuses_the_wrong_context, setup, teardown),
        cmocka_unit_test_setup_teardown(register_from_the_other_device_context, setup, teardown),
        cmocka_unit_test_setup_teardown(register_from_no_context, setup, teardown),
        cmocka_unit_test_setup_teardown(free_from_the_other_device_context, setup, teardown),
        cmocka_unit_test_setup_teardown(free_after_the_current_device_changed, setup, teardown),
        cmocka_unit_test_setup_teardown(primary_reset_of_one_device, setup, teardown),
        cmocka_unit_test_setup_teardown(ctx_destroy_of_one_device, setup, teardown),
        cmocka_unit_test_setup_teardown(device_reset_is_the_current_device, setup, teardown),
        cmocka_unit_test_setup_teardown(device_reset_after_set_device, setup, teardown),
        cmocka_unit_test_setup_teardown(peer_mapped_vmm_is_its_device, setup, teardown),
        cmocka_unit_test_setup_teardown(torch_segment_is_on_its_device, setup, teardown),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
