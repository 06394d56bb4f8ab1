/*
 * fork() (issue 9 item 6): in a child every inherited cache is inert.
 *
 * What a user checks: a child that frees or unmaps memory the parent
 * registered, or calls drc_get/drc_put/drc_invalidate/drc_cache_destroy on
 * an inherited cache, makes no backend call (it would deregister the
 * parent's MRs on the inherited verbs context) and never hangs on a lock a
 * parent thread held at the fork. The child reports through its exit status;
 * it reads the backend's counters in its own copy of the recording double.
 */
#include <infiniband/verbs.h>
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>

#include "cachetest.h"
#include "helpers.h"

#define LW IBV_ACCESS_LOCAL_WRITE

static unsigned long calls(struct tb *b)
{
    return __atomic_load_n(&b->reg_calls, __ATOMIC_SEQ_CST) + __atomic_load_n(&b->dereg_calls, __ATOMIC_SEQ_CST);
}

/* Exit status of a child: 0 all good, 2 hung (SIGALRM), else the number of the failed check. */
static int wait_child(pid_t pid)
{
    int st;

    assert_int_equal(waitpid(pid, &st, 0), pid);
    if (WIFSIGNALED(st))
        return WTERMSIG(st) == SIGALRM ? 2 : 100 + WTERMSIG(st);
    return WEXITSTATUS(st);
}

static void child_makes_no_backend_call(void **state)
{
    struct tb *b = tb_new(), *b2;
    drc_cache_t *c = mk(b, NULL), *c2;
    drc_region_t *held, *idle, *r = NULL;
    struct drc_stats st;
    pid_t pid;

    (void)state;
    held = get_ok(c, at(0, 0), pg(), LW);
    idle = get_ok(c, at(4, 0), pg(), LW);
    assert_int_equal(drc_put(c, idle), 0);
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        unsigned long before = calls(b);

        alarm(10);
        /* the child unmaps what the parent registered, through the hooks' path and directly */
        CHILD_CHECK(10, drc_notify_free(at(0, 0), 8 * pg()) == 0);
        CHILD_CHECK(11, drc_invalidate(c, at(4, 0), pg()) == 0);
        CHILD_CHECK(12, drc_get(c, at(0, 0), 1, LW, &r) == -ESTALE && r == NULL);
        CHILD_CHECK(13, drc_get(c, at(9, 0), 1, LW, &r) == -ESTALE);   /* a miss: no reg either */
        CHILD_CHECK(14, drc_put(c, held) == 0);
        drc_cache_stats(c, &st);
        CHILD_CHECK(15, drc_cache_destroy(c) == 0);                      /* even with a region held */
        CHILD_CHECK(16, calls(b) == before);
        /* a cache made in the child works as usual */
        b2 = tb_new();
        CHILD_CHECK(17, drc_cache_create(&b2->be, NULL, &c2) == 0);
        CHILD_CHECK(18, drc_get(c2, at(0, 0), 1, LW, &r) == 0 && tb_nreg(b2) == 1);
        CHILD_CHECK(19, drc_put(c2, r) == 0);
        CHILD_CHECK(20, drc_notify_free(at(0, 0), pg()) == 1 && tb_live(b2) == 0);
        CHILD_CHECK(21, drc_cache_destroy(c2) == 0);
        CHILD_CHECK(22, calls(b) == before);
        _exit(0);
    }
    assert_int_equal(wait_child(pid), 0);
    /* the parent's cache is untouched */
    r = get_ok(c, at(4, 0), 1, LW);
    assert_ptr_equal(r, idle);
    assert_int_equal(drc_region_valid(held), 1);
    assert_int_equal(tb_live(b), 2);
    assert_int_equal(drc_put(c, r), 0);
    assert_int_equal(drc_put(c, held), 0);
    done(b, c);
}

/* A thread that keeps c->lock busy: misses and invalidations of its own pages. */
struct hammer {
    drc_cache_t *c;
    int stop;
};

static void *hammer_thread(void *p)
{
    struct hammer *h = p;
    drc_region_t *r;
    size_t k = 0;

    while (!__atomic_load_n(&h->stop, __ATOMIC_SEQ_CST)) {
        if (drc_get(h->c, at(100 + k % 64, 0), 1, LW, &r) == 0)
            drc_put(h->c, r);
        drc_invalidate(h->c, at(100 + (k * 7) % 64, 0), pg());
        k++;
    }
    return NULL;
}

static void fork_while_another_thread_uses_the_cache(void **state)
{
    struct tb *b = tb_new();
    struct hammer h = { .c = mk(b, NULL) };
    pthread_t th;
    drc_region_t *r;
    pid_t pid;
    int i, bad = 0;

    (void)state;
    r = get_ok(h.c, at(0, 0), pg(), LW);
    assert_int_equal(drc_put(h.c, r), 0);
    pthread_create(&th, NULL, hammer_thread, &h);
    for (i = 0; i < 40; i++) {
        pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
            unsigned long before = calls(b);

            alarm(5);
            /* the hammer's lock may have been held at the fork: none of these may wait for it */
            CHILD_CHECK(10, drc_notify_free(at(0, 0), 200 * pg()) == 0);
            CHILD_CHECK(11, drc_invalidate(h.c, at(100, 0), 64 * pg()) == 0);
            CHILD_CHECK(12, drc_get(h.c, at(0, 0), 1, LW, &r) == -ESTALE);
            CHILD_CHECK(13, drc_cache_destroy(h.c) == 0);
            CHILD_CHECK(14, calls(b) == before);
            _exit(0);
        }
        if (wait_child(pid) != 0)
            bad++;
    }
    __atomic_store_n(&h.stop, 1, __ATOMIC_SEQ_CST);
    pthread_join(th, NULL);
    assert_int_equal(bad, 0);
    done(b, h.c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(child_makes_no_backend_call, setup_alarm),
        cmocka_unit_test_setup(fork_while_another_thread_uses_the_cache, setup_alarm),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
