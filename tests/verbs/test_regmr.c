/*
 * Tests of drc_reg_mr / drc_dereg_mr / drc_pd_release (src/verbs/regmr.c):
 * the two-line patch a transfer engine applies, checked the way the engine
 * would see it. libibverbs is the ONE verbs double (the loopback provider
 * build/loopnic/libibverbs.so.1 and its record, dlopen'ed and installed as
 * drc's verbs ops table: tests/verbs/verbs_double.h; there is no NIC in CI); CUDA is the
 * fake driver table of fake_cuda.h (no GPU in CI).
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
#include "verbs_double.h"
#include "verbs/regmr.h"

#define MiB (1ul << 20)
#define GPU 0x7f0000000000ul
#define RW (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)

/* Two PDs of the provider on two devices (verbs_double.h: vd.pd[0] on loop0, vd.pd[1] on loop1) */
#define PD_A (vd.pd[0])
#define PD_B (vd.pd[1])

/* The last MR the double made, or released (NULL if none). */
static struct ibv_mr *last_of(enum ibvd_op a, enum ibvd_op b)
{
    struct ibvd_call c;
    struct ibv_mr *mr = NULL;
    size_t i;

    for (i = 0; vd.call(i, &c); i++)
        if (c.op == a || c.op == b)
            mr = (struct ibv_mr *)c.mr;
    return mr;
}
#define LAST_MR() last_of(IBVD_REG_VA, IBVD_REG_DMABUF)
#define LAST_DEREGGED() last_of(IBVD_DEREG, IBVD_DEREG)

static int setup(void **state)
{
    (void)state;
    vd.reset();
    fc_reset();
    fc_add(GPU, 64 * MiB, 0, 1);
    vd.add_device_memory(0, 0);
    vd.add_device_memory(GPU, 64 * MiB);    /* the provider knows it is GPU memory, as libcuda would say */
    return 0;
}

/* Every test leaves no cache behind: this also checks drc_pd_release frees what it holds (ASan). */
static int teardown(void **state)
{
    (void)state;
    assert_int_equal(drc_pd_release(PD_A), 0);
    assert_int_equal(drc_pd_release(PD_B), 0);
    assert_int_equal(drc_reg_mr_configure(NULL), 0);
    assert_int_equal(vd.live(), 0);
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
    whole = drc_reg_mr(PD_A, (void *)GPU, 64 * MiB, RW);
    cached = LAST_MR();
    part = drc_reg_mr(PD_A, (void *)(GPU + 4096 + 7), 100, RW);
    check_caller_mr(whole, PD_A, GPU, 64 * MiB);
    check_caller_mr(part, PD_A, GPU + 4096 + 7, 100);
    assert_int_equal(vd.count(IBVD_REG_DMABUF), 1);
    assert_int_equal(vd.count(IBVD_REG_VA), 0);
    assert_ptr_not_equal(whole, cached);
    assert_ptr_not_equal(part, whole);
    assert_int_equal(whole->lkey, cached->lkey);
    assert_int_equal(part->rkey, cached->rkey);
    assert_int_equal(part->handle, cached->handle);
    assert_int_equal(drc_dereg_mr(part), 0);
    assert_int_equal(drc_dereg_mr(whole), 0);
    assert_int_equal(vd.count(IBVD_DEREG), 0);      /* idle, cached */
}

/* Each drc_dereg_mr drops one reference; drc_pd_release refuses while one is held. */
static void test_dereg_is_refcounted_and_pd_release_waits(void **state)
{
    struct ibv_mr *a, *b;

    (void)state;
    a = drc_reg_mr(PD_A, (void *)GPU, 2 * MiB, RW);
    b = drc_reg_mr(PD_A, (void *)GPU, 2 * MiB, RW);
    assert_non_null(a);
    assert_non_null(b);
    assert_int_equal(vd.count(IBVD_REG_DMABUF), 1);
    assert_int_equal(drc_dereg_mr(a), 0);
    assert_int_equal(drc_pd_release(PD_A), -EBUSY);
    assert_int_equal(vd.live(), 1);
    assert_int_equal(drc_dereg_mr(b), 0);
    assert_int_equal(drc_pd_release(PD_A), 0);
    assert_int_equal(vd.count(IBVD_DEREG), 1);
}

/*
 * A second drc_dereg_mr of a deregistered MR is refused (-EINVAL) and reaches no provider: the
 * provider, handed a copy naming one of its MRs, would deregister the cached MR by its handle. A
 * registration that then reuses the freed MR's memory (this thread's last freed slot: the same
 * pointer) reads as its own, on its own PD, and drops its own reference when deregistered.
 */
static void test_a_stale_mr_is_refused_and_its_slot_reused(void **state)
{
    static char buf[4 * 4096] __attribute__((aligned(4096)));
    struct ibv_mr *a, *b;

    (void)state;
    a = drc_reg_mr(PD_A, buf, 4096, RW);
    check_caller_mr(a, PD_A, (uintptr_t)buf, 4096);
    assert_int_equal(drc_dereg_mr(a), 0);
    assert_int_equal(drc_dereg_mr(a), -EINVAL);
    assert_int_equal(vd.count(IBVD_DEREG_UNKNOWN), 0);
    assert_int_equal(vd.count(IBVD_DEREG), 0);          /* the cached MR stays, idle */
    b = drc_reg_mr(PD_B, buf + 8192, 4096, RW);
    assert_ptr_equal(b, a);                             /* the slot reused: the stale pointer is b now */
    check_caller_mr(b, PD_B, (uintptr_t)(buf + 8192), 4096);
    assert_int_equal(b->lkey, LAST_MR()->lkey);         /* PD_B's registration, not PD_A's */
    assert_int_equal(drc_pd_release(PD_A), 0);          /* a's one reference was dropped once */
    assert_int_equal(drc_pd_release(PD_B), -EBUSY);     /* control: b's is held */
    assert_int_equal(drc_dereg_mr(b), 0);
}

/*
 * A PD released and registered on again (the same pointer: a provider may hand a freed PD's
 * address to the next one) gets a new cache: the registration reaches the provider, with live keys,
 * though this thread's last registration was on that PD.
 */
static void test_a_released_pd_gets_a_new_cache(void **state)
{
    static char buf[4096] __attribute__((aligned(4096)));
    struct ibv_mr *a;

    (void)state;
    a = drc_reg_mr(PD_A, buf, sizeof(buf), RW);
    assert_non_null(a);
    assert_int_equal(drc_dereg_mr(a), 0);
    a = drc_reg_mr(PD_A, buf, sizeof(buf), RW);        /* control: a hit, nothing released between */
    assert_int_equal(vd.count(IBVD_REG_VA), 1);
    assert_int_equal(drc_dereg_mr(a), 0);
    assert_int_equal(drc_pd_release(PD_A), 0);
    assert_int_equal(vd.count(IBVD_DEREG), 1);
    a = drc_reg_mr(PD_A, buf, sizeof(buf), RW);
    check_caller_mr(a, PD_A, (uintptr_t)buf, sizeof(buf));
    assert_int_equal(vd.count(IBVD_REG_VA), 2);
    assert_int_equal(a->lkey, LAST_MR()->lkey);
    assert_true(vd.lkey_live(a->lkey));
    assert_int_equal(drc_dereg_mr(a), 0);
}

/*
 * With every slot of caller MRs taken, a registration goes to the provider as asked (an MR of its
 * own, deregistered by the provider), and the ones drc serves still work.
 */
static void test_a_full_slab_registers_with_the_provider(void **state)
{
    enum { N = 2000 };
    static char buf[2 * N * 64 + 4096] __attribute__((aligned(4096)));
    static struct ibv_mr *mrs[2 * N];
    struct ibv_mr *whole;
    size_t own;
    int i, n, round;

    (void)state;
    whole = drc_reg_mr(PD_A, buf, sizeof(buf), RW);
    assert_non_null(whole);
    for (round = 0; round < 2; round++) {
        /*
         * Round 0, the control: N registrations, the slab grows, every one a hit. Round 1: no slot
         * made beyond those, 2N registrations: the slots round 0 freed serve about N of them.
         */
        drc__regmr_slab_cap(round ? 0 : UINT32_MAX);
        n = round ? 2 * N : N;
        for (i = 0; i < n; i++) {
            mrs[i] = drc_reg_mr(PD_A, buf + i * 64, 64, RW);
            check_caller_mr(mrs[i], PD_A, (uintptr_t)(buf + i * 64), 64);
            assert_true(vd.lkey_live(mrs[i]->lkey));
        }
        own = vd.count(IBVD_REG_VA) - 1;
        assert_true(round ? own > 0 && own < (size_t)n : own == 0);
        for (i = 0; i < n; i++)
            assert_int_equal(drc_dereg_mr(mrs[i]), 0);
        assert_int_equal(vd.count(IBVD_DEREG), own);   /* the provider's own MRs, and only them */
    }
    drc__regmr_slab_cap(UINT32_MAX);
    assert_int_equal(drc_dereg_mr(whole), 0);
}

/* Access bits drc cannot share go to ibv_reg_mr as asked, and drc_dereg_mr hands them back to ibv_dereg_mr. */
static void test_uncacheable_access_passes_through(void **state)
{
    static char buf[8192];
    struct ibv_mr *mr;

    (void)state;
    mr = drc_reg_mr(PD_A, buf, sizeof(buf), RW | IBV_ACCESS_ON_DEMAND);
    assert_non_null(mr);
    assert_ptr_equal(mr, LAST_MR());   /* the library's own MR */
    assert_int_equal(drc_dereg_mr(mr), 0);
    assert_ptr_equal(LAST_DEREGGED(), mr);
    assert_int_equal(vd.count(IBVD_DEREG), 1);
}

static void test_bad_arguments_and_failures_set_errno(void **state)
{
    (void)state;
    errno = 0;
    assert_null(drc_reg_mr(NULL, (void *)GPU, 4096, RW));
    assert_int_equal(errno, EINVAL);
    errno = 0;
    assert_null(drc_reg_mr(PD_A, (void *)GPU, 0, RW));
    assert_int_equal(errno, EINVAL);
    vd.fail_next_reg(ENOMEM);
    errno = 0;
    assert_null(drc_reg_mr(PD_A, (void *)GPU, 4096, RW));
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
    held = drc_reg_mr(PD_A, (void *)GPU, 4 * MiB, RW);
    assert_non_null(held);
    old = held->lkey;
    assert_int_equal(drc_notify_free((void *)GPU, 64 * MiB), 1);
    assert_int_equal(vd.live(), 1);
    fresh = drc_reg_mr(PD_A, (void *)GPU, 4 * MiB, RW);
    assert_non_null(fresh);
    assert_int_not_equal(fresh->lkey, old);
    assert_int_equal(vd.count(IBVD_REG_DMABUF), 2);
    assert_int_equal(drc_dereg_mr(held), 0);
    assert_int_equal(vd.live(), 1);        /* the stale one went at its last dereg */
    assert_int_equal(drc_dereg_mr(fresh), 0);
}

/*
 * The same with DRC_F_REVOKE (the control is test_invalidated_while_held): the free deregisters the
 * held NIC MR at once; the caller's ibv_mr stays its own, with the dead keys, and its drc_dereg_mr
 * succeeds without a second deregistration.
 */
static void test_revoked_while_held(void **state)
{
    struct drc_config cfg = { .flags = DRC_F_REVOKE };
    struct ibv_mr *held, *held2, *fresh;
    uint32_t old;

    (void)state;
    assert_int_equal(drc_reg_mr_configure(&cfg), 0);
    held = drc_reg_mr(PD_A, (void *)GPU, 4 * MiB, RW);
    held2 = drc_reg_mr(PD_A, (void *)(GPU + MiB), MiB, RW);     /* a second holder of the same MR */
    assert_non_null(held);
    assert_non_null(held2);
    old = held->lkey;
    assert_int_equal(held2->lkey, old);
    assert_int_equal(drc_notify_free((void *)GPU, 64 * MiB), 1);
    assert_int_equal(vd.live(), 0);                    /* off the NIC before the free goes on */
    assert_int_equal(vd.lkey_live(old), 0);
    assert_int_equal(vd.count(IBVD_DEREG), 1);
    assert_int_equal(held->lkey, old);                 /* the caller's ibv_mr: readable, keys dead */
    fresh = drc_reg_mr(PD_A, (void *)GPU, 4 * MiB, RW);
    assert_non_null(fresh);
    assert_int_not_equal(fresh->lkey, old);
    assert_int_equal(drc_dereg_mr(held), 0);
    assert_int_equal(drc_dereg_mr(held2), 0);          /* the last: nothing more to deregister */
    assert_int_equal(vd.count(IBVD_DEREG), 1);
    assert_int_equal(vd.count(IBVD_DEREG_UNKNOWN), 0);
    assert_int_equal(vd.live(), 1);                    /* fresh */
    assert_int_equal(drc_dereg_mr(fresh), 0);
}

/* Host memory goes through the cache too (through ibv_reg_mr_iova2); PDs do not share MRs. */
static void test_host_memory_and_two_pds(void **state)
{
    static char buf[4 * 4096] __attribute__((aligned(4096)));
    struct ibv_mr *a1, *a2, *b1;

    (void)state;
    a1 = drc_reg_mr(PD_A, buf, sizeof(buf), RW);
    a2 = drc_reg_mr(PD_A, buf + 100, 50, RW);
    b1 = drc_reg_mr(PD_B, buf, sizeof(buf), RW);
    check_caller_mr(a1, PD_A, (uintptr_t)buf, sizeof(buf));
    check_caller_mr(a2, PD_A, (uintptr_t)buf + 100, 50);
    check_caller_mr(b1, PD_B, (uintptr_t)buf, sizeof(buf));
    assert_int_equal(vd.count(IBVD_REG_VA), 2);    /* one per PD */
    assert_int_equal(a1->lkey, a2->lkey);
    assert_int_not_equal(a1->lkey, b1->lkey);
    assert_int_equal(drc_dereg_mr(a1), 0);
    assert_int_equal(drc_dereg_mr(a2), 0);
    assert_int_equal(drc_dereg_mr(b1), 0);
}

/* A small local-only GPU registration registers its whole allocation: later tensors of it are hits. */
static void test_gpu_registration_covers_the_allocation(void **state)
{
    struct ibv_mr *a, *b;

    (void)state;
    a = drc_reg_mr(PD_A, (void *)(GPU + 5 * MiB + 3), 1000, IBV_ACCESS_LOCAL_WRITE);
    check_caller_mr(a, PD_A, GPU + 5 * MiB + 3, 1000);
    assert_int_equal(LAST_MR()->length, 64 * MiB);
    b = drc_reg_mr(PD_A, (void *)(GPU + 40 * MiB), 3 * MiB, IBV_ACCESS_LOCAL_WRITE);
    check_caller_mr(b, PD_A, GPU + 40 * MiB, 3 * MiB);
    assert_int_equal(vd.count(IBVD_REG_DMABUF), 1);
    assert_int_equal(drc_dereg_mr(a), 0);
    assert_int_equal(drc_dereg_mr(b), 0);
}

/*
 * An rkey grants only what was asked: a GPU registration asking remote access is not widened to its
 * allocation (a peer holding a read-only rkey for a 4 KiB tensor used to be able to reach all 64 MiB),
 * unless the user opts in with DRC_F_WIDEN_REMOTE; DRC_F_NO_WIDEN stops widening of local ones too.
 */
static void test_remote_access_is_not_widened_unless_asked(void **state)
{
    struct drc_config cfg = { 0 };
    struct ibvd_call c;
    struct ibv_mr *a;

    (void)state;
    a = drc_reg_mr(PD_A, (void *)(GPU + 5 * MiB + 3), 1000, IBV_ACCESS_REMOTE_READ);
    check_caller_mr(a, PD_A, GPU + 5 * MiB + 3, 1000);
    assert_true(vd_reg(0, &c));
    assert_true(c.iova == GPU + 5 * MiB && c.len == 4096);     /* the page of the range asked */
    assert_int_equal(c.access, IBV_ACCESS_REMOTE_READ);
    assert_int_equal(drc_dereg_mr(a), 0);
    assert_int_equal(drc_pd_release(PD_A), 0);
    /* opted in: widened */
    cfg.flags = DRC_F_WIDEN_REMOTE;
    assert_int_equal(drc_reg_mr_configure(&cfg), 0);
    a = drc_reg_mr(PD_A, (void *)(GPU + 5 * MiB + 3), 1000, RW);
    check_caller_mr(a, PD_A, GPU + 5 * MiB + 3, 1000);
    assert_true(vd_reg(1, &c));
    assert_true(c.iova == GPU && c.len == 64 * MiB);
    assert_int_equal(drc_dereg_mr(a), 0);
    assert_int_equal(drc_pd_release(PD_A), 0);
    /* never: not even a local-only registration */
    cfg.flags = DRC_F_NO_WIDEN;
    assert_int_equal(drc_reg_mr_configure(&cfg), 0);
    a = drc_reg_mr(PD_A, (void *)(GPU + 5 * MiB + 3), 1000, IBV_ACCESS_LOCAL_WRITE);
    check_caller_mr(a, PD_A, GPU + 5 * MiB + 3, 1000);
    assert_true(vd_reg(2, &c));
    assert_true(c.iova == GPU + 5 * MiB && c.len == 4096);
    assert_int_equal(drc_dereg_mr(a), 0);
    /* both at once is a contradiction */
    cfg.flags = DRC_F_NO_WIDEN | DRC_F_WIDEN_REMOTE;
    assert_int_equal(drc_reg_mr_configure(&cfg), -EINVAL);
}

/*
 * drc_reg_mr's keys grant what their caller asked, by default: a LOCAL_WRITE-only registration of memory
 * another caller registered for remote access gets an MR of its own, registered LOCAL_WRITE (its rkey
 * refuses peers); one without RELAXED_ORDERING never shares one with it. The relaxed rule is an opt-in
 * (DRC_F_ACCESS_SUPERSET): then the local registration shares the remote one's MR and keys (the control).
 */
static void test_keys_grant_only_what_was_asked(void **state)
{
    struct drc_config cfg = { .flags = DRC_F_NO_WIDEN };  /* the range as asked: inside the remote one */
    struct ibv_mr *remote, *local, *ro, *plain;
    struct ibvd_call c;

    (void)state;
    assert_int_equal(drc_reg_mr_configure(&cfg), 0);
    remote = drc_reg_mr(PD_A, (void *)GPU, 2 * MiB, RW);
    local = drc_reg_mr(PD_A, (void *)(GPU + 4096), 4096, IBV_ACCESS_LOCAL_WRITE);
    check_caller_mr(local, PD_A, GPU + 4096, 4096);
    assert_int_equal(vd.count(IBVD_REG_DMABUF), 2);
    assert_true(vd_reg(1, &c));
    assert_int_equal(c.access, IBV_ACCESS_LOCAL_WRITE);
    assert_int_equal(local->rkey, c.rkey);
    assert_int_not_equal(local->rkey, remote->rkey);
    ro = drc_reg_mr(PD_A, (void *)(GPU + 8 * MiB), 4096, RW | IBV_ACCESS_RELAXED_ORDERING);
    plain = drc_reg_mr(PD_A, (void *)(GPU + 8 * MiB), 4096, RW);
    assert_int_equal(vd.count(IBVD_REG_DMABUF), 4);
    assert_true(vd_reg(3, &c));
    assert_int_equal(c.access, RW);
    assert_int_equal(plain->rkey, c.rkey);
    assert_int_equal(drc_dereg_mr(plain), 0);
    assert_int_equal(drc_dereg_mr(ro), 0);
    assert_int_equal(drc_dereg_mr(local), 0);
    assert_int_equal(drc_dereg_mr(remote), 0);
    assert_int_equal(drc_pd_release(PD_A), 0);
    /* opted in: the local registration shares the remote-access MR, and its rkey allows remote writes */
    cfg.flags |= DRC_F_ACCESS_SUPERSET;
    assert_int_equal(drc_reg_mr_configure(&cfg), 0);
    remote = drc_reg_mr(PD_A, (void *)GPU, 2 * MiB, RW);
    local = drc_reg_mr(PD_A, (void *)(GPU + 4096), 4096, IBV_ACCESS_LOCAL_WRITE);
    check_caller_mr(local, PD_A, GPU + 4096, 4096);
    assert_int_equal(vd.count(IBVD_REG_DMABUF), 5);
    assert_int_equal(local->rkey, remote->rkey);
    assert_int_equal(drc_dereg_mr(local), 0);
    assert_int_equal(drc_dereg_mr(remote), 0);
}

/* An allocation larger than max_mr_size: the range as asked is registered. */
static void test_allocation_too_large_for_the_device(void **state)
{
    struct ibv_mr *a;

    (void)state;
    vd.set_query(0, 16 * MiB);
    a = drc_reg_mr(PD_A, (void *)(GPU + 4096), 8192, IBV_ACCESS_LOCAL_WRITE);   /* would be widened */
    check_caller_mr(a, PD_A, GPU + 4096, 8192);
    assert_int_equal(vd.count(IBVD_REG_DMABUF), 1);
    assert_int_equal(LAST_MR()->length, 8192);
    assert_int_equal(drc_dereg_mr(a), 0);
}

/*
 * A hit asks the CUDA driver nothing (the CUDA double counts every memory query: pointer attributes,
 * address ranges, VMM handles). After the first registration of a GPU allocation (a miss: widened to
 * the allocation) and of a host buffer, registrations of sub-ranges of them, local-only and
 * remote-access, and their deregistrations are hits that leave the count where it was (the host ones
 * asked local access only, which is what may be widened, so the question was asked of host memory
 * too). The control:
 * each first registration, a miss, does ask the driver (it classifies the memory).
 */
static void test_hits_ask_the_driver_nothing(void **state)
{
    static char host[16 * 4096] __attribute__((aligned(4096)));
    struct ibv_mr *first[3], *mr;
    int before, i;

    (void)state;
    before = fc.mem_queries;
    first[0] = drc_reg_mr(PD_A, (void *)(GPU + 5 * MiB + 3), 1000, IBV_ACCESS_LOCAL_WRITE);   /* widened */
    check_caller_mr(first[0], PD_A, GPU + 5 * MiB + 3, 1000);
    assert_int_equal(LAST_MR()->length, 64 * MiB);
    first[1] = drc_reg_mr(PD_A, (void *)(GPU + 8 * MiB), 2 * MiB, RW);     /* remote: as asked */
    check_caller_mr(first[1], PD_A, GPU + 8 * MiB, 2 * MiB);
    first[2] = drc_reg_mr(PD_A, host, sizeof(host), IBV_ACCESS_LOCAL_WRITE);
    check_caller_mr(first[2], PD_A, (uintptr_t)host, sizeof(host));
    assert_true(fc.mem_queries > before);   /* the control: a miss classifies its memory */
    assert_int_equal(vd.count(IBVD_REG_DMABUF), 2);
    assert_int_equal(vd.count(IBVD_REG_VA), 1);
    before = fc.mem_queries;
    for (i = 0; i < 100; i++) {
        uintptr_t gpu_local = GPU + (uintptr_t)i * 600 * 1024 + 17, gpu_remote = GPU + 8 * MiB + (uintptr_t)i * 4096;

        mr = drc_reg_mr(PD_A, (void *)gpu_local, 1000, IBV_ACCESS_LOCAL_WRITE);
        check_caller_mr(mr, PD_A, gpu_local, 1000);
        assert_int_equal(mr->lkey, first[0]->lkey);
        assert_int_equal(drc_dereg_mr(mr), 0);
        mr = drc_reg_mr(PD_A, (void *)gpu_remote, 4096, RW);
        check_caller_mr(mr, PD_A, gpu_remote, 4096);
        assert_int_equal(mr->rkey, first[1]->rkey);
        assert_int_equal(drc_dereg_mr(mr), 0);
        mr = drc_reg_mr(PD_A, host + (i % 16) * 4096, 100, IBV_ACCESS_LOCAL_WRITE);
        check_caller_mr(mr, PD_A, (uintptr_t)host + (uintptr_t)(i % 16) * 4096, 100);
        assert_int_equal(mr->lkey, first[2]->lkey);
        assert_int_equal(drc_dereg_mr(mr), 0);
    }
    assert_int_equal(fc.mem_queries - before, 0);
    assert_int_equal(vd.count(IBVD_REG_DMABUF), 2);
    assert_int_equal(vd.count(IBVD_REG_VA), 1);
    for (i = 0; i < 3; i++)
        assert_int_equal(drc_dereg_mr(first[i]), 0);
}

/*
 * Widening is for GPU memory: pinned host memory (cuMemAllocHost), which drc registers as host memory,
 * is registered as asked, as any host buffer, whatever bounds the driver knows for it.
 */
static void test_pinned_host_memory_is_not_widened(void **state)
{
    void *p = NULL;
    struct ibv_mr *a;

    (void)state;
    assert_int_equal(cuMemAllocHost_v2(&p, 2 * MiB), 0);
    a = drc_reg_mr(PD_A, (char *)p + 8192, 4096, IBV_ACCESS_LOCAL_WRITE);
    check_caller_mr(a, PD_A, (uintptr_t)p + 8192, 4096);
    assert_int_equal(vd.count(IBVD_REG_VA), 1);
    assert_int_equal(LAST_MR()->length, 4096);
    assert_int_equal(drc_dereg_mr(a), 0);
    assert_int_equal(drc_pd_release(PD_A), 0);
    assert_int_equal(cuMemFreeHost(p), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_nested_gpu_registrations_share_one_mr, setup, teardown),
        cmocka_unit_test_setup_teardown(test_dereg_is_refcounted_and_pd_release_waits, setup, teardown),
        cmocka_unit_test_setup_teardown(test_a_stale_mr_is_refused_and_its_slot_reused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_a_released_pd_gets_a_new_cache, setup, teardown),
        cmocka_unit_test_setup_teardown(test_a_full_slab_registers_with_the_provider, setup, teardown),
        cmocka_unit_test_setup_teardown(test_uncacheable_access_passes_through, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_arguments_and_failures_set_errno, setup, teardown),
        cmocka_unit_test_setup_teardown(test_invalidated_while_held, setup, teardown),
        cmocka_unit_test_setup_teardown(test_revoked_while_held, setup, teardown),
        cmocka_unit_test_setup_teardown(test_host_memory_and_two_pds, setup, teardown),
        cmocka_unit_test_setup_teardown(test_gpu_registration_covers_the_allocation, setup, teardown),
        cmocka_unit_test_setup_teardown(test_remote_access_is_not_widened_unless_asked, setup, teardown),
        cmocka_unit_test_setup_teardown(test_allocation_too_large_for_the_device, setup, teardown),
        cmocka_unit_test_setup_teardown(test_keys_grant_only_what_was_asked, setup, teardown),
        cmocka_unit_test_setup_teardown(test_hits_ask_the_driver_nothing, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pinned_host_memory_is_not_widened, setup, teardown),
    };

    return cmocka_run_group_tests(tests, vd_load, NULL);
}
