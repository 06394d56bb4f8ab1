/*
 * drc_reg_mr_multi under threads (src/verbs/regmr.c), run plainly, under
 * ASan and under TSan: several callers at once, each registering GPU ranges
 * on 8 PDs, whose own worker threads share the per-PD caches and the export
 * table. libibverbs is the recording double (verbs_double.h), CUDA the double
 * of fake_cuda.h.
 *
 * What a user would check: every call gets 8 MRs with the keys of its PD,
 * one export serves the allocation for all of them, a failure hands out nothing,
 * and after drc_pd_release no MR is live.
 *
 * And drc_reg_mr / drc_dereg_mr from many threads (the slab's per-thread free
 * lists and shared stack, each thread's last PD): threads in waves (an
 * exiting thread's free slots go to the next) register sub-ranges of a
 * registered buffer on one PD and deregister each other's MRs, while another
 * thread registers on a second PD and releases it again and again. Every MR
 * reads as asked with the keys of the buffer's MR, every call succeeds, the
 * interposer's summary counts every MR once (the exited threads' too), and
 * at the end no reference is left.
 */
#include <errno.h>
#include <infiniband/verbs.h>
#include <pthread.h>
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
enum { PDS = 8, CALLERS = 4, ITERS = 40 };

static struct ibv_context ctx[PDS];
static struct ibv_pd pd[PDS];
static struct ibv_pd *pds[PDS];
static int bad;     /* atomic */

static void *caller(void *arg)
{
    struct ibv_mr *mrs[PDS];

    for (int i = 0; i < ITERS; i++) {
        char *at = (char *)(GPU + ((uintptr_t)arg * ITERS + (uintptr_t)i) % 32 * MiB);

        if (drc_reg_mr_multi(pds, PDS, at, MiB, RW, mrs)) {
            __atomic_fetch_add(&bad, 1, __ATOMIC_RELAXED);
            continue;
        }
        for (int p = 0; p < PDS; p++) {
            if (!mrs[p] || mrs[p]->pd != pds[p] || mrs[p]->addr != at || mrs[p]->length != MiB)
                __atomic_fetch_add(&bad, 1, __ATOMIC_RELAXED);
            if (mrs[p] && drc_dereg_mr(mrs[p]))
                __atomic_fetch_add(&bad, 1, __ATOMIC_RELAXED);
        }
    }
    return NULL;
}

static void callers_at_once(void **state)
{
    pthread_t t[CALLERS];
    struct ibv_mr *mrs[PDS];
    unsigned exports;

    (void)state;
    vd.reset();
    fc_reset();
    fc_add(GPU, 64 * MiB, 0, 1);
    for (int p = 0; p < PDS; p++) {
        pd[p].context = &ctx[p];
        pds[p] = &pd[p];
    }
    exports = fakecu_exports();
    for (uintptr_t i = 0; i < CALLERS; i++)
        assert_int_equal(pthread_create(&t[i], NULL, caller, (void *)i), 0);
    for (int i = 0; i < CALLERS; i++)
        pthread_join(t[i], NULL);
    assert_int_equal(bad, 0);
    assert_int_equal(fakecu_exports() - exports, 1);      /* one export for 8 PDs and 4 callers */
    assert_int_equal(drc__cuda_exports_live(), 1);

    /*
     * A failure in one PD: every MR of the call released (no reference left: drc_pd_release succeeds);
     * the NIC MRs it registered on the other 7 stay cached, idle, until then.
     */
    for (int p = 0; p < PDS; p++)
        assert_int_equal(drc_pd_release(pds[p]), 0);
    assert_int_equal(vd.live(), 0);
    vd.fail_next_reg(ENOMEM);
    assert_int_equal(drc_reg_mr_multi(pds, PDS, (void *)(GPU + 40 * MiB), MiB, RW, mrs), -ENOMEM);
    for (int p = 0; p < PDS; p++)
        assert_null(mrs[p]);
    assert_int_equal(vd.live(), PDS - 1);
    for (int p = 0; p < PDS; p++)
        assert_int_equal(drc_pd_release(pds[p]), 0);
    assert_int_equal(vd.live(), 0);
    drc_notify_free((void *)GPU, 64 * MiB);
    assert_int_equal(drc__cuda_exports_live(), 0);
}

enum { WORKERS = 4, WAVES = 3, W_ITERS = 1500, CYCLES = 150 };

static char hbuf[1 << 20] __attribute__((aligned(4096)));
static char hother[1 << 16] __attribute__((aligned(4096)));
static struct ibv_mr *mailbox[WORKERS];    /* atomic: an MR for the next worker to deregister */
static uint32_t whole_lkey;

static void *worker(void *arg)
{
    uintptr_t w = (uintptr_t)arg;

    for (int i = 0; i < W_ITERS; i++) {
        char *at = hbuf + ((w * W_ITERS + (uintptr_t)i) % 255) * 4096 + 64;
        struct ibv_mr *mr = drc_reg_mr(vd.pd[0], at, 1000, RW), *theirs;

        if (!mr || mr->addr != at || mr->length != 1000 || mr->pd != vd.pd[0] || mr->lkey != whole_lkey) {
            __atomic_fetch_add(&bad, 1, __ATOMIC_RELAXED);
            continue;
        }
        theirs = __atomic_exchange_n(&mailbox[(w + 1) % WORKERS], mr, __ATOMIC_ACQ_REL);
        if (theirs && drc_dereg_mr(theirs))
            __atomic_fetch_add(&bad, 1, __ATOMIC_RELAXED);
    }
    return NULL;
}

static void *pd_cycler(void *arg)
{
    (void)arg;
    for (int i = 0; i < CYCLES; i++) {
        struct ibv_mr *mr = drc_reg_mr(vd.pd[1], hother, sizeof(hother), RW);

        if (!mr || mr->pd != vd.pd[1] || !vd.lkey_live(mr->lkey) || drc_dereg_mr(mr) ||
            drc_pd_release(vd.pd[1]))
            __atomic_fetch_add(&bad, 1, __ATOMIC_RELAXED);
    }
    return NULL;
}

static void threads_register_while_a_pd_is_released(void **state)
{
    struct drc__regmr_totals t;
    pthread_t th[WORKERS], cycler;
    struct ibv_mr *whole;
    uint64_t before;

    (void)state;
    vd.reset();
    drc__regmr_totals(&t);
    before = t.mrs_host;
    whole = drc_reg_mr(vd.pd[0], hbuf, sizeof(hbuf), RW);
    assert_non_null(whole);
    whole_lkey = whole->lkey;
    assert_int_equal(pthread_create(&cycler, NULL, pd_cycler, NULL), 0);
    for (int wave = 0; wave < WAVES; wave++) {
        for (uintptr_t i = 0; i < WORKERS; i++)
            assert_int_equal(pthread_create(&th[i], NULL, worker, (void *)i), 0);
        for (int i = 0; i < WORKERS; i++)
            pthread_join(th[i], NULL);
    }
    pthread_join(cycler, NULL);
    for (int i = 0; i < WORKERS; i++)
        if (mailbox[i])
            assert_int_equal(drc_dereg_mr(mailbox[i]), 0);
    assert_int_equal(bad, 0);
    assert_int_equal(vd.count(IBVD_REG_VA), 1 + CYCLES);   /* the buffer once; the second PD's range once a cycle */
    drc__regmr_totals(&t);
    assert_int_equal(t.live, 1);
    /* every MR counted once, those of the threads gone (counted per thread) too */
    assert_int_equal(t.mrs_host - before, 1 + WAVES * WORKERS * W_ITERS + CYCLES);
    assert_int_equal(drc_pd_release(vd.pd[0]), -EBUSY);    /* control: a reference held is seen */
    assert_int_equal(drc_dereg_mr(whole), 0);
    assert_int_equal(drc_pd_release(vd.pd[0]), 0);
    assert_int_equal(vd.live(), 0);
    drc__regmr_totals(&t);
    assert_int_equal(t.live, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(callers_at_once),
        cmocka_unit_test(threads_register_while_a_pd_is_released),
    };

    return cmocka_run_group_tests(tests, vd_load, NULL);
}
