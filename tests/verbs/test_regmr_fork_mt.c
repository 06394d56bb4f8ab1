/*
 * fork() while parent threads are inside every lock of libdrc (core/fork.h):
 * drc_reg_mr/drc_dereg_mr/drc_pd_release (regmr.c's pds_lock, its slab of caller MRs,
 * the verbs cache's), the dmabuf export table (export.c), the CUDA tracking
 * record (memory.c), run plainly, under ASan and under TSan. libibverbs is
 * the loopback provider (verbs_double.h), CUDA the double of fake_cuda.h;
 * both doubles keep their own locks whole across a fork.
 *
 * What a user checks: each child, forked at a random moment of the parent's
 * threads, finishes its calls into drc: it deregisters a parent MR (drc's:
 * never handed to the provider), registers on the parent's PDs (a cache of
 * its own: the parent's are inert) and releases them, exports and tracks GPU
 * memory. A child that hangs is killed by its own
 * alarm (a generous one: it only tells a hang from a finish) and counted by
 * the parent. Before the registry, children hung in about a third of the
 * forks (in drc_reg_mr / drc_dereg_mr, on mrs_lock or pds_lock).
 */
#include <errno.h>
#include <infiniband/verbs.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>

#include <cmocka.h>

#include "drc.h"
#include "drc_verbs.h"
#include "fake_cuda.h"
#include "verbs_double.h"
#include "core/mem.h"
#include "helpers.h"

#define MiB (1ul << 20)
#define GPU 0x7f0000000000ul
#define LW IBV_ACCESS_LOCAL_WRITE
enum { FORKS = 60, HANG_S = 60 };

static char host[4][1 << 16] __attribute__((aligned(4096)));
static int stop;        /* atomic */
static unsigned long rounds[4]; /* atomic: loops done by each thread */

/* drc_reg_mr / drc_dereg_mr on PD 0: pds_lock (read), the slab's free lists, the cache, the verbs cache's lock. */
static void *reg_dereg(void *arg)
{
    (void)arg;
    while (!__atomic_load_n(&stop, __ATOMIC_RELAXED)) {
        struct ibv_mr *mr = drc_reg_mr(vd.pd[0], host[0] + 100, 5000, LW);
        struct ibv_mr *gpu = drc_reg_mr(vd.pd[0], (void *)(GPU + 3 * MiB), MiB, LW);

        if (mr)
            drc_dereg_mr(mr);
        if (gpu)
            drc_dereg_mr(gpu);
        drc_notify_free((void *)(GPU + 3 * MiB), MiB);     /* the next round registers and exports again */
        __atomic_fetch_add(&rounds[0], 1, __ATOMIC_RELAXED);
    }
    return NULL;
}

/* A PD's cache made, used and released: pds_lock written, held across drc_cache_destroy. */
static void *pd_cycle(void *arg)
{
    (void)arg;
    while (!__atomic_load_n(&stop, __ATOMIC_RELAXED)) {
        struct ibv_mr *mr = drc_reg_mr(vd.pd[1], host[1], 4096, LW);

        if (mr)
            drc_dereg_mr(mr);
        drc_pd_release(vd.pd[1]);
        __atomic_fetch_add(&rounds[1], 1, __ATOMIC_RELAXED);
    }
    return NULL;
}

/* The export table: export_lock across the driver's export, the table's lock; a drop each time. */
static void *exporter(void *arg)
{
    struct drc__mem m;
    uint64_t off;
    int fd;

    (void)arg;
    while (!__atomic_load_n(&stop, __ATOMIC_RELAXED)) {
        if (drc__mem_classify(GPU + 8 * MiB, 4096, &m) == 0 && drc__mem_export(&m, GPU + 8 * MiB, 4096, NULL, &fd, &off) == 0)
            close(fd);
        drc__cuda_exports_drop(-1, GPU, GPU + 64 * MiB);
        __atomic_fetch_add(&rounds[2], 1, __ATOMIC_RELAXED);
    }
    return NULL;
}

/* The CUDA tracking record (track_lock). */
static void *tracker(void *arg)
{
    uintptr_t lo, hi;

    (void)arg;
    while (!__atomic_load_n(&stop, __ATOMIC_RELAXED)) {
        drc__cuda_track(0, GPU + 16 * MiB, GPU + 17 * MiB);
        drc__cuda_tracked_hull(0, &lo, &hi);
        drc__cuda_untrack(0, GPU + 16 * MiB, GPU + 17 * MiB);
        __atomic_fetch_add(&rounds[3], 1, __ATOMIC_RELAXED);
    }
    return NULL;
}

/* What the child does: every call returns (a hang is the alarm's SIGALRM); a wrong answer exits non-zero. */
static void child(struct ibv_mr *parent_mr)
{
    size_t provider_deregs = vd.count(IBVD_DEREG) + vd.count(IBVD_DEREG_UNKNOWN), parent_live = vd.live();
    struct ibv_mr *mr;
    struct drc__mem m;
    uintptr_t lo, hi;
    uint64_t off;
    int fd;

    alarm(HANG_S);
    /* the parent's MR is drc's: released, and never handed to the provider */
    CHILD_CHECK(10, drc_dereg_mr(parent_mr) == 0);
    CHILD_CHECK(11, vd.count(IBVD_DEREG) + vd.count(IBVD_DEREG_UNKNOWN) == provider_deregs);
    /* the PD table is the child's own: a registration on an inherited PD makes a cache of the child's */
    mr = drc_reg_mr(vd.pd[0], host[2], 4096, LW);
    CHILD_CHECK(12, mr != NULL && vd.lkey_live(mr->lkey));
    CHILD_CHECK(13, drc_dereg_mr(mr) == 0);
    CHILD_CHECK(14, drc_pd_release(vd.pd[0]) == 0 && vd.live() == parent_live);
    mr = drc_reg_mr(vd.pd[1], host[3], 4096, LW);
    CHILD_CHECK(15, mr != NULL);
    CHILD_CHECK(16, drc_dereg_mr(mr) == 0);
    /* the export table and the tracking record */
    CHILD_CHECK(17, drc__cuda_exports_live() == 0);      /* the parent's exports closed */
    CHILD_CHECK(18, drc__mem_classify(GPU + 9 * MiB, 4096, &m) == 0);
    CHILD_CHECK(19, drc__mem_export(&m, GPU + 9 * MiB, 4096, NULL, &fd, &off) == 0);
    close(fd);
    drc__cuda_exports_drop(-1, GPU, GPU + 64 * MiB);
    drc__cuda_track(0, GPU + 20 * MiB, GPU + 21 * MiB);
    CHILD_CHECK(20, drc__cuda_tracked_hull(0, &lo, &hi) == 0);
    CHILD_CHECK(21, drc_pd_release(vd.pd[0]) == 0 && drc_pd_release(vd.pd[1]) == 0);
    _exit(0);
}

static void forks_while_threads_hold_each_lock(void **state)
{
    pthread_t t[4];
    void *(*fn[4])(void *) = { reg_dereg, pd_cycle, exporter, tracker };
    struct ibv_mr *held;
    pid_t pid[FORKS];
    unsigned long seen[4];
    int i, k, st, hung = 0, wrong = 0, status[FORKS];

    (void)state;
    vd.reset();
    fc_reset();
    fc_add(GPU, 64 * MiB, 0, 1);
    held = drc_reg_mr(vd.pd[0], host[3], 4096, LW);
    assert_non_null(held);
    for (k = 0; k < 4; k++)
        assert_int_equal(pthread_create(&t[k], NULL, fn[k], NULL), 0);
    for (i = 0; i < FORKS; i++) {
        /* each thread has looped since the last fork: the forks land anywhere in their loops */
        for (k = 0; k < 4; k++)
            seen[k] = __atomic_load_n(&rounds[k], __ATOMIC_RELAXED);
        for (k = 0; k < 4; k++)
            while (__atomic_load_n(&rounds[k], __ATOMIC_RELAXED) < seen[k] + 1 + (unsigned long)(rand() % 3))
                sched_yield();
        pid[i] = fork();
        assert_true(pid[i] >= 0);
        if (pid[i] == 0)
            child(held);
    }
    __atomic_store_n(&stop, 1, __ATOMIC_RELAXED);
    for (k = 0; k < 4; k++)
        pthread_join(t[k], NULL);
    for (i = 0; i < FORKS; i++) {
        assert_int_equal(waitpid(pid[i], &st, 0), pid[i]);
        status[i] = WIFSIGNALED(st) ? (WTERMSIG(st) == SIGALRM ? -1 : 100 + WTERMSIG(st)) : WEXITSTATUS(st);
        hung += status[i] == -1;
        wrong += status[i] > 0;
        if (status[i])
            fprintf(stderr, "child %d: %s %d\n", i, status[i] == -1 ? "hung" : "exit", status[i]);
    }
    fprintf(stderr, "%d forks: %d children hung, %d failed a check\n", FORKS, hung, wrong);
    assert_int_equal(hung, 0);
    assert_int_equal(wrong, 0);
    /* the parent is untouched: its MR still its own */
    assert_int_equal(drc_dereg_mr(held), 0);
    assert_int_equal(drc_pd_release(vd.pd[0]), 0);
    assert_int_equal(drc_pd_release(vd.pd[1]), 0);
    assert_int_equal(vd.live(), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(forks_while_threads_hold_each_lock),
    };

    return cmocka_run_group_tests(tests, vd_load, NULL);
}
