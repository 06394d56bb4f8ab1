/*
 * Tests of src/core/error.c: drc_strerror gives a sentence for every value a user
 * may pass it, and for drc's own errors one that says what to do.
 */
#include <errno.h>
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "drc.h"

static void success_and_non_errors(void **state)
{
    (void)state;
    assert_string_equal(drc_strerror(0), "success");
    /* drc returns negative values: a positive one is a caller's mistake, said so */
    assert_non_null(strstr(drc_strerror(EINVAL), "negative"));
    assert_non_null(strstr(drc_strerror(1), "negative"));
    assert_non_null(drc_strerror(INT_MAX));
}

/* The errors drc's API documents, each with its own message that names the remedy. */
static void documented_errors_have_advice(void **state)
{
    static const struct {
        int err;
        const char *hint;
    } want[] = {
        { -EINVAL, "DRC_ACCESS_MASK" },
        { -EBUSY, "drc_put" },
        { -E2BIG, "max_mr_size" },
        { -EAGAIN, "freed" },
        { -ENOSPC, "64" },
        { -EOPNOTSUPP, "dmabuf" },
        { -EPERM, "ulimit -l" },
        { -EACCES, "gpuDirectRDMACapable" },
        { -ENOMEM, "memory" },
    };
    size_t i, j;

    (void)state;
    for (i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
        const char *m = drc_strerror(want[i].err);

        assert_non_null(m);
        assert_non_null(strstr(m, want[i].hint));
        for (j = 0; j < i; j++)
            assert_string_not_equal(m, drc_strerror(want[j].err));
    }
}

/* Any other errno: the C library's text, never NULL, even at the ends of int. */
static void other_errors_fall_back_to_strerror(void **state)
{
    (void)state;
    assert_string_equal(drc_strerror(-ETIMEDOUT), strerror(ETIMEDOUT));
    assert_string_equal(drc_strerror(-ECONNREFUSED), strerror(ECONNREFUSED));
    assert_non_null(drc_strerror(-4095));
    assert_non_null(drc_strerror(-100000));
    assert_non_null(drc_strerror(INT_MIN));     /* -INT_MIN does not exist: must not be computed */
    assert_non_null(drc_strerror(INT_MIN + 1));
}

/*
 * Thread-safe: every text is constant, also for values the C library does
 * not know (strerror writes those into one shared buffer, so a later call
 * changed the text an earlier caller still held).
 */
static void texts_are_constant(void **state)
{
    const char *a = drc_strerror(-4095), *b;
    char copy[128];

    (void)state;
    snprintf(copy, sizeof(copy), "%s", a);
    b = drc_strerror(-4094);
    assert_string_equal(a, copy);
    assert_ptr_equal(drc_strerror(-4095), a);
    (void)b;
}

/* -EIO comes from the CUDA layer or from the backend: the advice must not blame only one. */
static void eio_advice_names_both_sources(void **state)
{
    const char *m = drc_strerror(-EIO);

    (void)state;
    assert_non_null(strstr(m, "CUDA"));
    assert_non_null(strstr(m, "RDMA"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(success_and_non_errors),
        cmocka_unit_test(documented_errors_have_advice),
        cmocka_unit_test(other_errors_fall_back_to_strerror),
        cmocka_unit_test(texts_are_constant),
        cmocka_unit_test(eio_advice_names_both_sources),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
