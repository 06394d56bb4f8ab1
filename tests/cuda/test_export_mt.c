/*
 * The shared export table (src/cuda/export.c) under threads, with the CUDA
 * double: run plainly, under ASan and under TSan.
 *
 * What a user would check: registrations of one allocation from many
 * threads (many NICs at once) make one export, each gets a working fd of its
 * own; frees racing them never leave an fd of freed memory in the table, and
 * once everything is freed no fd is left open.
 */
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "drc.h"
#include "fake_cuda.h"
#include "helpers.h"
#include "core/mem.h"

enum { THREADS = 4, ITERS = 500 };
#define GPU ((uintptr_t)0x7f0000000000ull)
#define SIZE ((size_t)64 << 20)

static int racing_frees;
static int errors;      /* atomic */

static void *registrar(void *arg)
{
    uintptr_t at = GPU + ((uintptr_t)arg % 16) * (1 << 20);
    struct drc__mem m;
    struct stat st;
    uint64_t off;
    int fd;

    for (int i = 0; i < ITERS; i++) {
        if (drc__mem_classify(at, 4096, &m) || drc__mem_export(&m, at, 4096, NULL, &fd, &off) ||
            off != at - GPU || fstat(fd, &st) || st.st_size != (off_t)SIZE)
            __atomic_fetch_add(&errors, 1, __ATOMIC_RELAXED);
        else
            close(fd);
        if (racing_frees && (uintptr_t)arg == 0 && i % 10 == 0)
            drc_notify_free((void *)GPU, SIZE);     /* a free as the program announces it */
    }
    return NULL;
}

static void run(int frees)
{
    pthread_t t[THREADS];
    int base = fds_open();
    unsigned before = fakecu_exports();

    fc_reset();
    fc_add(GPU, SIZE, 0, 5);
    racing_frees = frees;
    errors = 0;
    for (uintptr_t i = 0; i < THREADS; i++)
        assert_int_equal(pthread_create(&t[i], NULL, registrar, (void *)i), 0);
    for (int i = 0; i < THREADS; i++)
        pthread_join(t[i], NULL);
    assert_int_equal(errors, 0);
    if (!frees) {
        assert_int_equal(fakecu_exports() - before, 1);     /* one export for every thread */
        assert_int_equal(drc__cuda_exports_live(), 1);
    }
    assert_true(drc__cuda_exports_live() <= 1);
    drc_notify_free((void *)GPU, SIZE);
    assert_int_equal(drc__cuda_exports_live(), 0);
    assert_int_equal(fds_open(), base);
}

static void threads_share_one_export(void **state)
{
    (void)state;
    run(0);
}

static void frees_racing_exports_leave_no_fd(void **state)
{
    (void)state;
    run(1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(threads_share_one_export),
        cmocka_unit_test(frees_racing_exports_leave_no_fd),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
