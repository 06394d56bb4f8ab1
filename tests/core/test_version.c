/*
 * Tests of src/core/version.c: drc_version() reports the library's version, the one drc.h's
 * DRC_VERSION_* macros name for this build, as parts and as "MAJOR.MINOR.PATCH".
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <cmocka.h>

#include "drc.h"

static void version_matches_header(void **state)
{
    unsigned major = 99, minor = 99, patch = 99;
    char want[32];

    (void)state;
    snprintf(want, sizeof(want), "%d.%d.%d", DRC_VERSION_MAJOR, DRC_VERSION_MINOR, DRC_VERSION_PATCH);
    assert_string_equal(drc_version(&major, &minor, &patch), want);
    assert_int_equal(major, DRC_VERSION_MAJOR);
    assert_int_equal(minor, DRC_VERSION_MINOR);
    assert_int_equal(patch, DRC_VERSION_PATCH);
    assert_string_equal(drc_version(NULL, NULL, NULL), want);   /* every part is optional */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(version_matches_header),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
