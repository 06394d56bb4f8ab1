/*
 * The counts behind the interposer's exit summary (drc__regmr_totals,
 * src/verbs/regmr.c) under threads, run plainly, under ASan and under TSan.
 * libibverbs is the loopback provider (verbs_double.h), the one verbs
 * double; the memory is host memory.
 *
 * A registration and a deregistration bump no shared word: each thread
 * counts the MRs it handed out and those it took back (whichever thread
 * handed them out), an exiting thread's counts are folded into the
 * process's, and the number held is the difference of the sums. The most
 * held at once is the slab's slots made: an upper bound, exact with one
 * thread at a time (regmr.c says by how much it may be over with several).
 *
 * What a user checks, the summary's "N MRs handed out", "N still held" and
 * "at most N held at once" against what the program did:
 *   1. one thread registers 100, deregisters 60, registers 30, deregisters
 *      70 and exits: 130 handed out, 0 held, at most 100 at once (not 130,
 *      the MRs handed out, nor 70, the second high: the check tells them
 *      apart);
 *   2. producers, one after another, each register K and exit, holding
 *      them: P * K held, at most P * K at once;
 *   3. consumers, at once, each deregister D of one producer's MRs (which
 *      that thread, gone, registered: each takes back more than it hands
 *      out) and register R, and wait: held counted across live threads and the
 *      exited ones' fold; then the main thread deregisters the producers'
 *      other MRs while the consumers still wait;
 *   4. a fork() child of that process: the parent's other threads folded
 *      into the child's counts, no count lost or doubled, the child's own
 *      dereg counted, and so are threads the child starts and ends, whose
 *      memory was the parent's threads' (not under TSan, which starts no
 *      thread in such a child);
 *   5. the consumers exit (their counts folded), the main thread
 *      deregisters what they registered: 0 held.
 * The control: a thread whose fold is dropped (its exit handling taken
 * away, as a version that lost an exiting thread's counts would do)
 * registers MRs the main thread holds: the totals then disagree with what
 * the program did, so checks 1-5 would catch a lost fold. Every step above
 * leaves counts in the exited threads' fold that differ from what is held
 * (producers hand out K and take back none, consumers take back D and hand
 * out R, which each consumer asserts of its own counts), so a fold that lost
 * or doubled one could not pass.
 *
 * This file includes regmr.c to reach the thread's count and exit handling
 * for the control; it must be the first to register in its process (the
 * peaks are the process's).
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
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "verbs/regmr.c"
#include "verbs_double.h"
#include "helpers.h"

#define LW IBV_ACCESS_LOCAL_WRITE
enum {
    ONE = 100,              /* 1: the one thread's first high */
    P = 4, K = 200,         /* 2: producers, MRs each */
    C = P, D = 150, R = 50, /* 3: consumers (one per producer), MRs each deregisters, registers */
    DROPPED = 10,           /* the control's MRs */
};

static char hbuf[16][4096] __attribute__((aligned(4096)));
static struct ibv_mr *made[P][K];       /* written by producer p, read after its join */
static struct ibv_mr *theirs[C][R];     /* written by consumer c, read after the barrier */
static uint64_t own_back[C], own_host[C];  /* consumer c's own counts at the barrier */
static int bad;                         /* atomic */
static pthread_barrier_t parked, go;

static struct ibv_mr *get_mr(int i)
{
    struct ibv_mr *mr = drc_reg_mr(vd.pd[0], hbuf[i % 16] + 64, 1000, LW);

    if (!mr)
        __atomic_fetch_add(&bad, 1, __ATOMIC_RELAXED);
    return mr;
}

static void put_mr(struct ibv_mr *mr)
{
    if (!mr || drc_dereg_mr(mr))
        __atomic_fetch_add(&bad, 1, __ATOMIC_RELAXED);
}

static void totals(struct drc__regmr_totals *t)
{
    drc__regmr_totals(t);
    printf("  handed out %llu, held %llu, at most %llu at once\n", (unsigned long long)t->mrs_host,
           (unsigned long long)t->live, (unsigned long long)t->peak);
}

static void *one_thread(void *arg)
{
    struct ibv_mr *mrs[ONE];
    int i;

    (void)arg;
    for (i = 0; i < ONE; i++)
        mrs[i] = get_mr(i);
    for (i = 0; i < 60; i++)
        put_mr(mrs[i]);
    for (i = 0; i < 30; i++)
        mrs[i] = get_mr(i);
    for (i = 0; i < 30; i++)
        put_mr(mrs[i]);
    for (i = 60; i < ONE; i++)
        put_mr(mrs[i]);
    return NULL;
}

static void *producer(void *arg)
{
    uintptr_t p = (uintptr_t)arg;

    for (int i = 0; i < K; i++)
        made[p][i] = get_mr(i);
    return NULL;
}

static void *consumer(void *arg)
{
    uintptr_t c = (uintptr_t)arg;

    for (int i = 0; i < D; i++)
        put_mr(made[c][i]);      /* registered on producer c, gone */
    for (int i = 0; i < R; i++)
        theirs[c][i] = get_mr(i);
    own_back[c] = __atomic_load_n(&tls.n_back, __ATOMIC_RELAXED);
    own_host[c] = __atomic_load_n(&tls.n_host, __ATOMIC_RELAXED);
    pthread_barrier_wait(&parked);
    pthread_barrier_wait(&go);  /* the main thread checks, deregisters, forks */
    return NULL;
}

/* Off `counted` with no fold and no exit handling: what fold_counts does, less the fold. */
static void drop_own_fold(void)
{
    pthread_setspecific(slab_key, NULL);    /* slab_thread_exit will not run */
    pthread_mutex_lock(&counts_lock);
    if (tls.next)
        tls.next->pprev = tls.pprev;
    *tls.pprev = tls.next;
    pthread_mutex_unlock(&counts_lock);
    tls.exit_set = 0;
    tls.room = 0;
}

static struct ibv_mr *dropped[DROPPED];

static void *dropping(void *arg)
{
    (void)arg;
    for (int i = 0; i < DROPPED; i++)
        dropped[i] = get_mr(i);
    drop_own_fold();
    return NULL;
}

static void counts_across_threads_exits_and_fork(void **state)
{
    struct drc__regmr_totals t;
    pthread_t th[P];
    uint64_t handed;
    pid_t pid;
    int st;

    (void)state;
    totals(&t);
    assert_int_equal(t.mrs_host, 0);    /* the first registration of this process is below */
    assert_int_equal(t.peak, 0);

    /* 1: one thread */
    assert_int_equal(pthread_create(&th[0], NULL, one_thread, NULL), 0);
    pthread_join(th[0], NULL);
    totals(&t);
    assert_int_equal(bad, 0);
    assert_int_equal(t.mrs_host, ONE + 30);
    assert_int_equal(t.live, 0);
    assert_int_equal(t.peak, ONE);      /* exact: one thread */

    /* 2: producers one after another, each gone before the next: every slot made is held */
    for (uintptr_t p = 0; p < P; p++) {
        assert_int_equal(pthread_create(&th[p], NULL, producer, (void *)p), 0);
        pthread_join(th[p], NULL);
    }
    totals(&t);
    assert_int_equal(bad, 0);
    handed = ONE + 30 + P * K;
    assert_int_equal(t.mrs_host, handed);
    assert_int_equal(t.live, P * K);    /* all in the exited producers' fold */
    assert_int_equal(t.peak, P * K);

    /* 3: consumers at once, deregistering what the producers registered */
    assert_int_equal(pthread_barrier_init(&parked, NULL, C + 1), 0);
    assert_int_equal(pthread_barrier_init(&go, NULL, C + 1), 0);
    for (uintptr_t c = 0; c < C; c++)
        assert_int_equal(pthread_create(&th[c], NULL, consumer, (void *)c), 0);
    pthread_barrier_wait(&parked);
    assert_int_equal(bad, 0);
    for (int c = 0; c < C; c++) {
        assert_int_equal(own_back[c], D);       /* more taken back than handed out: the point */
        assert_int_equal(own_host[c], R);
    }
    handed += C * R;
    totals(&t);
    assert_int_equal(t.mrs_host, handed);
    assert_int_equal(t.live, P * K - C * D + C * R);
    /*
     * Held never went above P * K here (each consumer deregisters before it registers): the bound
     * is P * K, over by at most the other consumers' free lists should one have made a slot.
     */
    assert_true(t.peak >= P * K);
    assert_true(t.peak <= P * K + (C - 1) * (2 * LOCAL_MAX + 1));
    for (int p = 0; p < P; p++)
        for (int i = D; i < K; i++)
            put_mr(made[p][i]);
    assert_int_equal(bad, 0);
    totals(&t);
    assert_int_equal(t.mrs_host, handed);
    assert_int_equal(t.live, C * R);    /* the fold's P*K out, the consumers' C*R out and C*D back, this thread's P*(K-D) back */

    /* 4: a fork child, the consumers parked in the parent: their counts folded into the child's */
    fflush(stdout);
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        alarm(60);      /* a hang, not a time limit */
        drc__regmr_totals(&t);
        CHILD_CHECK(10, t.mrs_host == handed && t.live == C * R);
        CHILD_CHECK(11, drc_dereg_mr(theirs[0][0]) == 0);
        drc__regmr_totals(&t);
        CHILD_CHECK(12, t.mrs_host == handed && t.live == C * R - 1);
#if !defined(__SANITIZE_THREAD__)   /* TSan does not start threads after a fork of a threaded process */
        /* a thread of the child's, on memory that was a parent thread's (glibc reuses their stacks) */
        for (int i = 0; i < C; i++) {
            CHILD_CHECK(13, pthread_create(&th[0], NULL, one_thread, NULL) == 0);
            pthread_join(th[0], NULL);
        }
        drc__regmr_totals(&t);
        CHILD_CHECK(14, !bad && t.mrs_host == handed + C * (ONE + 30) && t.live == C * R - 1);
#endif
        _exit(0);
    }
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);

    /* 5: the consumers exit (their counts folded); this thread deregisters what they registered */
    pthread_barrier_wait(&go);
    for (int c = 0; c < C; c++)
        pthread_join(th[c], NULL);
    totals(&t);
    assert_int_equal(t.mrs_host, handed);
    assert_int_equal(t.live, C * R);    /* the parent's theirs[0][0] is still held */
    for (int c = 0; c < C; c++)
        for (int i = 0; i < R; i++)
            put_mr(theirs[c][i]);
    assert_int_equal(bad, 0);
    totals(&t);
    assert_int_equal(t.mrs_host, handed);
    assert_int_equal(t.live, 0);
    assert_true(t.peak >= P * K && t.peak <= P * K + (C - 1) * (2 * LOCAL_MAX + 1));
    pthread_barrier_destroy(&parked);
    pthread_barrier_destroy(&go);

    /*
     * Control: a thread registers DROPPED MRs, which this thread holds, and exits with its fold
     * dropped. The totals must then be wrong, by exactly what that thread counted: checks 1-5 see a
     * lost fold. (Last: the counts of this process are wrong from here on.)
     */
    assert_int_equal(pthread_create(&th[0], NULL, dropping, NULL), 0);
    pthread_join(th[0], NULL);
    assert_int_equal(bad, 0);
    totals(&t);
    assert_int_equal(t.mrs_host, handed);               /* DROPPED more were handed out */
    assert_int_equal(t.live, 0);                        /* DROPPED are held */
    for (int i = 0; i < DROPPED; i++)
        put_mr(dropped[i]);
    assert_int_equal(bad, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(counts_across_threads_exits_and_fork),
    };

    return cmocka_run_group_tests(tests, vd_load, NULL);
}
