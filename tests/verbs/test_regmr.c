/*
 * Tests of drc_reg_mr / drc_dereg_mr / drc_pd_release (src/regmr.c): the
 * two-line patch a transfer engine applies, checked the way the engine would
 * see it. libibverbs is a DOUBLE here (-Wl,--wrap of ibv_reg_mr_iova2,
 * ibv_reg_dmabuf_mr, ibv_dereg_mr, ibv_query_device: there is no NIC in
 * CI) that records each registration; CUDA is the fake driver table of
 * fake_cuda.h (no GPU in CI).
 */
#include <errno.h>
#include <infiniband/verbs.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <cmocka.h>

#include "drc.h"
#include "drc_verbs.h"
#include "fake_cuda.h"

#define MiB (1ul << 20)
#define GPU 0x7f0000000000ul
#define RW (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)

/* ---- the libibverbs double ---- */
enum { DMABUF = 1, VA = 2 };

static struct {
    int regs[3];                /* by kind */
    int deregs, live;
    int reg_errno;              /* next registration fails with this */
    struct ibv_mr *last;        /* the last MR made */
    struct ibv_mr *deregged;    /* the last MR released */
    uint64_t max_mr_size;       /* what ibv_query_device reports; 0: 1 TiB */
} v;

static struct ibv_context ctx_a, ctx_b;
static struct ibv_pd pd_a = { .context = &ctx_a }, pd_b = { .context = &ctx_b };
static uint32_t next_key = 0x100;

static struct ibv_mr *new_mr(struct ibv_pd *pd, int kind, void *addr, size_t len)
{
    struct ibv_mr *mr;

    if (v.reg_errno) {
        errno = v.reg_errno;
        v.reg_errno = 0;
        return NULL;
    }
    mr = calloc(1, sizeof(*mr));
    assert_non_null(mr);
    *mr = (struct ibv_mr){ .context = pd->context, .pd = pd, .addr = addr, .length = len,
                           .handle = next_key, .lkey = next_key, .rkey = next_key + 0x10000 };
    next_key++;
    v.regs[kind]++;
    v.live++;
    v.last = mr;
    return mr;
}

struct ibv_mr *__wrap_ibv_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset, size_t length, uint64_t iova, int fd,
                                        int access);
struct ibv_mr *__wrap_ibv_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset, size_t length, uint64_t iova, int fd,
                                        int access)
{
    (void)iova;
    (void)access;
    if (fd == -1) {
        errno = EBADF;      /* the buffer-less probe: a NIC that does dmabuf */
        return NULL;
    }
    return new_mr(pd, DMABUF, (void *)(uintptr_t)offset, length);  /* rdma-core leaves the offset in addr */
}

struct ibv_mr *__wrap_ibv_reg_mr_iova2(struct ibv_pd *pd, void *addr, size_t length, uint64_t iova,
                                       unsigned access);
struct ibv_mr *__wrap_ibv_reg_mr_iova2(struct ibv_pd *pd, void *addr, size_t length, uint64_t iova,
                                       unsigned access)
{
    (void)iova;
    (void)access;
    return new_mr(pd, VA, addr, length);
}

int __wrap_ibv_dereg_mr(struct ibv_mr *mr);
int __wrap_ibv_dereg_mr(struct ibv_mr *mr)
{
    v.deregs++;
    v.live--;
    v.deregged = mr;
    free(mr);
    return 0;
}

int __wrap_ibv_query_device(struct ibv_context *ctx, struct ibv_device_attr *attr);
int __wrap_ibv_query_device(struct ibv_context *ctx, struct ibv_device_attr *attr)
{
    (void)ctx;
    memset(attr, 0, sizeof(*attr));
    attr->max_mr_size = v.max_mr_size ? v.max_mr_size : 1ull << 40;
    return 0;
}

static int setup(void **state)
{
    (void)state;
    memset(&v, 0, sizeof(v));
    fc_reset();
    fc_add(GPU, 64 * MiB, 0, 1);
    return 0;
}

/* Every test leaves no cache behind: this also checks drc_pd_release frees what it holds (ASan). */
static int teardown(void **state)
{
    (void)state;
    assert_int_equal(drc_pd_release(&pd_a), 0);
    assert_int_equal(drc_pd_release(&pd_b), 0);
    assert_int_equal(v.live, 0);
    return 0;
}

static void check_caller_mr(const struct ibv_mr *mr, struct ibv_pd *pd, uintptr_t addr, size_t len)
{
    assert_non_null(mr);
    assert_ptr_equal(mr->addr, (void *)addr);
    assert_int_equal(mr->length, len);
    assert_ptr_equal(mr->pd, pd);
    assert_ptr_equal(mr->context, pd->context);
}

/* Nested GPU registrations: one dmabuf MR; each caller gets its own ibv_mr with its keys. */
static void test_nested_gpu_registrations_share_one_mr(void **state)
{
    struct ibv_mr *whole, *part, *cached;

    (void)state;
    whole = drc_reg_mr(&pd_a, (void *)GPU, 64 * MiB, RW);
    cached = v.last;
    part = drc_reg_mr(&pd_a, (void *)(GPU + 4096 + 7), 100, RW);
    check_caller_mr(whole, &pd_a, GPU, 64 * MiB);
    check_caller_mr(part, &pd_a, GPU + 4096 + 7, 100);
    assert_int_equal(v.regs[DMABUF], 1);
    assert_int_equal(v.regs[VA], 0);
    assert_ptr_not_equal(whole, cached);
    assert_ptr_not_equal(part, whole);
    assert_int_equal(whole->lkey, cached->lkey);
    assert_int_equal(part->rkey, cached->rkey);
    assert_int_equal(part->handle, cached->handle);
    assert_int_equal(drc_dereg_mr(part), 0);
    assert_int_equal(drc_dereg_mr(whole), 0);
    assert_int_equal(v.deregs, 0);      /* idle, cached */
}

/* Each drc_dereg_mr drops one reference; drc_pd_release refuses while one is held. */
static void test_dereg_is_refcounted_and_pd_release_waits(void **state)
{
    struct ibv_mr *a, *b;

    (void)state;
    a = drc_reg_mr(&pd_a, (void *)GPU, 2 * MiB, RW);
    b = drc_reg_mr(&pd_a, (void *)GPU, 2 * MiB, RW);
    assert_non_null(a);
    assert_non_null(b);
    assert_int_equal(v.regs[DMABUF], 1);
    assert_int_equal(drc_dereg_mr(a), 0);
    assert_int_equal(drc_pd_release(&pd_a), -EBUSY);
    assert_int_equal(v.live, 1);
    assert_int_equal(drc_dereg_mr(b), 0);
    assert_int_equal(drc_pd_release(&pd_a), 0);
    assert_int_equal(v.deregs, 1);
}

/* Access bits drc cannot share go to ibv_reg_mr as asked, and drc_dereg_mr hands them back to ibv_dereg_mr. */
static void test_uncacheable_access_passes_through(void **state)
{
    static char buf[8192];
    struct ibv_mr *mr;

    (void)state;
    mr = drc_reg_mr(&pd_a, buf, sizeof(buf), RW | IBV_ACCESS_ON_DEMAND);
    assert_non_null(mr);
    assert_ptr_equal(mr, v.last);   /* the library's own MR */
    assert_int_equal(drc_dereg_mr(mr), 0);
    assert_ptr_equal(v.deregged, mr);
    assert_int_equal(v.deregs, 1);
}

static void test_bad_arguments_and_failures_set_errno(void **state)
{
    (void)state;
    errno = 0;
    assert_null(drc_reg_mr(NULL, (void *)GPU, 4096, RW));
    assert_int_equal(errno, EINVAL);
    errno = 0;
    assert_null(drc_reg_mr(&pd_a, (void *)GPU, 0, RW));
    assert_int_equal(errno, EINVAL);
    v.reg_errno = ENOMEM;
    errno = 0;
    assert_null(drc_reg_mr(&pd_a, (void *)GPU, 4096, RW));
    assert_int_equal(errno, ENOMEM);
    assert_int_equal(drc_dereg_mr(NULL), -EINVAL);
    assert_int_equal(drc_pd_release(NULL), -EINVAL);
}

/* Freed while held: the MR stays until the caller's dereg, and the next registration is a new one. */
static void test_invalidated_while_held(void **state)
{
    struct ibv_mr *held, *fresh;
    uint32_t old;

    (void)state;
    held = drc_reg_mr(&pd_a, (void *)GPU, 4 * MiB, RW);
    assert_non_null(held);
    old = held->lkey;
    assert_int_equal(drc_notify_free((void *)GPU, 64 * MiB), 1);
    assert_int_equal(v.live, 1);
    fresh = drc_reg_mr(&pd_a, (void *)GPU, 4 * MiB, RW);
    assert_non_null(fresh);
    assert_int_not_equal(fresh->lkey, old);
    assert_int_equal(v.regs[DMABUF], 2);
    assert_int_equal(drc_dereg_mr(held), 0);
    assert_int_equal(v.live, 1);        /* the stale one went at its last dereg */
    assert_int_equal(drc_dereg_mr(fresh), 0);
}

/* Host memory goes through the cache too (through ibv_reg_mr_iova2); PDs do not share MRs. */
static void test_host_memory_and_two_pds(void **state)
{
    static char buf[4 * 4096] __attribute__((aligned(4096)));
    struct ibv_mr *a1, *a2, *b1;

    (void)state;
    a1 = drc_reg_mr(&pd_a, buf, sizeof(buf), RW);
    a2 = drc_reg_mr(&pd_a, buf + 100, 50, RW);
    b1 = drc_reg_mr(&pd_b, buf, sizeof(buf), RW);
    check_caller_mr(a1, &pd_a, (uintptr_t)buf, sizeof(buf));
    check_caller_mr(a2, &pd_a, (uintptr_t)buf + 100, 50);
    check_caller_mr(b1, &pd_b, (uintptr_t)buf, sizeof(buf));
    assert_int_equal(v.regs[VA], 2);    /* one per PD */
    assert_int_equal(a1->lkey, a2->lkey);
    assert_int_not_equal(a1->lkey, b1->lkey);
    assert_int_equal(drc_dereg_mr(a1), 0);
    assert_int_equal(drc_dereg_mr(a2), 0);
    assert_int_equal(drc_dereg_mr(b1), 0);
}

/* A small GPU registration registers its whole allocation: later tensors of it are hits. */
static void test_gpu_registration_covers_the_allocation(void **state)
{
    struct ibv_mr *a, *b;

    (void)state;
    a = drc_reg_mr(&pd_a, (void *)(GPU + 5 * MiB + 3), 1000, RW);
    check_caller_mr(a, &pd_a, GPU + 5 * MiB + 3, 1000);
    assert_int_equal(v.last->length, 64 * MiB);
    b = drc_reg_mr(&pd_a, (void *)(GPU + 40 * MiB), 3 * MiB, RW);
    check_caller_mr(b, &pd_a, GPU + 40 * MiB, 3 * MiB);
    assert_int_equal(v.regs[DMABUF], 1);
    assert_int_equal(drc_dereg_mr(a), 0);
    assert_int_equal(drc_dereg_mr(b), 0);
}

/* An allocation larger than max_mr_size: the range as asked is registered. */
static void test_allocation_too_large_for_the_device(void **state)
{
    struct ibv_mr *a;

    (void)state;
    v.max_mr_size = 16 * MiB;
    a = drc_reg_mr(&pd_a, (void *)(GPU + 4096), 8192, RW);
    check_caller_mr(a, &pd_a, GPU + 4096, 8192);
    assert_int_equal(v.regs[DMABUF], 1);
    assert_int_equal(v.last->length, 8192);
    assert_int_equal(drc_dereg_mr(a), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_nested_gpu_registrations_share_one_mr, setup, teardown),
        cmocka_unit_test_setup_teardown(test_dereg_is_refcounted_and_pd_release_waits, setup, teardown),
        cmocka_unit_test_setup_teardown(test_uncacheable_access_passes_through, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_arguments_and_failures_set_errno, setup, teardown),
        cmocka_unit_test_setup_teardown(test_invalidated_while_held, setup, teardown),
        cmocka_unit_test_setup_teardown(test_host_memory_and_two_pds, setup, teardown),
        cmocka_unit_test_setup_teardown(test_gpu_registration_covers_the_allocation, setup, teardown),
        cmocka_unit_test_setup_teardown(test_allocation_too_large_for_the_device, setup, teardown),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
