/*
 * Tests of src/cuda/free.c (the one begin-free routine) through the wrappers
 * of drc_cuda.h, against the FAKE CUDA DRIVER TABLE (tests/fake_cuda.h).
 * What a user checks: once the memory is gone, no region of it can be
 * returned any more, whatever thread freed it and however it went (a free,
 * a pinned host free or unregister, a context teardown); and that
 * DRC_F_VALIDATE keeps one registration across the chunks of a VMM region.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "backend.h"
#include "drc.h"
#include "drc_cuda.h"
#include "fake_cuda.h"
#include "core/mem.h"

#define MiB (1ul << 20)
#define GPU 0x7f0000000000ul
#define GPU1 0x7f8000000000ul
#define HOSTP 0x7e0000000000ul

static struct tb *b;                /* the recording backend (tests/backend.h) */
static drc_cache_t *cache;

static int setup(void **state)
{
    struct drc_config cfg = { .policy = DRC_DMABUF_THEN_PEERMEM };

    fc_reset();
    b = tb_new();
    cfg.flags = *state ? DRC_F_VALIDATE : 0;
    return drc_cache_create(&b->be, &cfg, &cache);
}

static int teardown(void **state)
{
    int err;

    (void)state;
    err = drc_cache_destroy(cache) || tb_all_released_once(b);
    tb_free(b);
    drc__cuda_set_driver(NULL);
    return err ? -1 : 0;
}

/* Register [p, p+len) and leave it idle in the cache. */
static void reg_idle(uintptr_t p, size_t len)
{
    drc_region_t *r;

    assert_int_equal(drc_get(cache, (void *)p, len, 1, &r), 0);
    assert_int_equal(drc_put(cache, r), 0);
}

/* Issue 9 item 1: a free from a thread with no current context drops the whole allocation. */
static void free_without_a_context_drops_the_whole_allocation(void **state)
{
    (void)state;
    fc_add(GPU, 64 * MiB, 0, 9);
    fc.range_needs_ctx = 1;         /* cuMemGetAddressRange: 201 with no current context */
    fc_current = FC_CTX0;           /* the registering thread has the context */
    reg_idle(GPU + 32 * MiB, 4096);
    fc_current = NULL;              /* the freeing thread has none */
    assert_int_equal(drc_cuMemFree(GPU), 0);
    assert_int_equal(fc.frees, 1);
    assert_int_equal((int)tb_dereg_calls(b), 1);    /* the sub-range at +32 MiB went with it */
    assert_null(fc_current);            /* and the thread still has no context */
    /* the same through the runtime's free (no shared runtime: the driver's) */
    fc_add(GPU, 64 * MiB, 0, 10);
    reg_idle(GPU + 32 * MiB, 4096);
    assert_int_equal(drc_cudaFree((void *)GPU), 0);
    assert_int_equal((int)tb_dereg_calls(b), 2);
}

/* Issue 9 item 3: pinned host memory goes through cuMemFreeHost & co.; its registration goes first. */
static void pinned_host_frees_drop_the_range(void **state)
{
    int (*const fns[])(void *) = { drc_cuMemFreeHost, drc_cuMemHostUnregister, drc_cudaFreeHost,
                                   drc_cudaHostUnregister };
    unsigned i;

    (void)state;
    for (i = 0; i < sizeof(fns) / sizeof(fns[0]); i++) {
        fc_add_host(HOSTP, 8 * MiB, 0);
        reg_idle(HOSTP + 4 * MiB, 4096);
        assert_int_equal(fns[i]((void *)HOSTP), 0);
        assert_int_equal((int)tb_dereg_calls(b), (int)i + 1);
        assert_int_equal(fc.frees, (int)i + 1);
    }
}

/* cuIpcCloseMemHandle unmaps imported memory: its registrations go first. */
static void ipc_close_drops_the_mapping(void **state)
{
    (void)state;
    fc_add(GPU, 32 * MiB, 0, 7);    /* as cuIpcOpenMemHandle maps it */
    reg_idle(GPU + 16 * MiB, 4096);
    assert_int_equal(drc_cuIpcCloseMemHandle(GPU), 0);
    assert_int_equal((int)tb_dereg_calls(b), 1);
    fc_add(GPU, 32 * MiB, 0, 8);
    reg_idle(GPU + 16 * MiB, 4096);
    assert_int_equal(drc_cudaIpcCloseMemHandle((void *)GPU), 0);
    assert_int_equal((int)tb_dereg_calls(b), 2);
}

/* Issue 9 item 2: a teardown frees every allocation of the device without a free call. */
static void teardowns_drop_the_device(void **state)
{
    (void)state;
    fc_add(GPU, 8 * MiB, 0, 1);
    fc_add(GPU + 64 * MiB, 8 * MiB, 0, 2);
    fc_add(GPU1, 8 * MiB, 1, 3);
    reg_idle(GPU + MiB, 4096);
    reg_idle(GPU + 64 * MiB + MiB, 4096);
    reg_idle(GPU1 + MiB, 4096);
    assert_int_equal(drc_cuDevicePrimaryCtxReset(0), 0);
    assert_int_equal(fc.resets, 1);
    assert_int_equal((int)tb_dereg_calls(b), 2);    /* both of device 0, not device 1's */
    /* cuCtxDestroy of device 0's context (the reset freed device 0's memory: allocate again) */
    fc_add(GPU, 8 * MiB, 0, 4);
    reg_idle(GPU + MiB, 4096);
    assert_int_equal(drc_cuCtxDestroy(FC_CTX0), 0);
    assert_int_equal(fc.destroys, 1);
    assert_int_equal((int)tb_dereg_calls(b), 3);
    /* cudaDeviceReset (no shared runtime: the current device's primary context is reset) */
    fc_current = FC_PRIMARY(1);
    assert_int_equal(drc_cudaDeviceReset(), 0);
    assert_int_equal(fc.reset_dev, 1);
    assert_int_equal((int)tb_dereg_calls(b), 4);    /* device 1's */
}

/* The last cuDevicePrimaryCtxRelease resets the context: its memory is invalidated (after the call). */
static void last_primary_release_drops_the_device(void **state)
{
    void *ctx;

    (void)state;
    assert_int_equal(cuDevicePrimaryCtxRetain(&ctx, 1), 0);
    assert_int_equal(cuDevicePrimaryCtxRetain(&ctx, 1), 0);
    fc_add(GPU1, 8 * MiB, 1, 3);
    reg_idle(GPU1 + MiB, 4096);
    assert_int_equal(drc_cuDevicePrimaryCtxRelease(1), 0);
    assert_int_equal((int)tb_dereg_calls(b), 0);    /* a reference is left: nothing went */
    assert_int_equal(drc_cuDevicePrimaryCtxRelease(1), 0);
    assert_int_equal((int)tb_dereg_calls(b), 1);
}

/* Issue 9 item 9: DRC_F_VALIDATE checks each chunk a hit touches against its own recorded id. */
static void validate_per_vmm_chunk(void **state)
{
    const size_t g = 2 * MiB;
    drc_region_t *r;
    int i;

    (void)state;
    fc_add_vmm(GPU, g, 0, 10, 1);
    fc_add_vmm(GPU + g, g, 0, 11, 1);
    fc_add_vmm(GPU + 2 * g, g, 0, 12, 1);
    reg_idle(GPU, 3 * g);
    for (i = 0; i < 100; i++)
        reg_idle(GPU + (size_t)(i % 3) * g + 4096, 4096);
    assert_int_equal((int)tb_nreg(b), 1);      /* 101 gets, one registration */
    /* chunk 1 remapped (a new buffer id at the same VA): hits there register again, once */
    fc.a[1].buffer_id = 21;
    assert_int_equal(drc_get(cache, (void *)(GPU + g + 4096), 4096, 1, &r), 0);
    assert_int_equal(drc_put(cache, r), 0);
    assert_int_equal((int)tb_nreg(b), 2);
    /* the new registration recorded the new id: hits on it stay hits */
    for (i = 0; i < 10; i++)
        reg_idle(GPU + g + 4096, 4096);
    assert_int_equal((int)tb_nreg(b), 2);
}

int main(void)
{
    static int validate = 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(free_without_a_context_drops_the_whole_allocation, setup, teardown),
        cmocka_unit_test_setup_teardown(pinned_host_frees_drop_the_range, setup, teardown),
        cmocka_unit_test_setup_teardown(teardowns_drop_the_device, setup, teardown),
        cmocka_unit_test_setup_teardown(ipc_close_drops_the_mapping, setup, teardown),
        cmocka_unit_test_setup_teardown(last_primary_release_drops_the_device, setup, teardown),
        cmocka_unit_test_prestate_setup_teardown(validate_per_vmm_chunk, setup, teardown, &validate),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
