/*
 * Two small libraries for the preload test's "rtld-default" mode (hook_child.c), built from this
 * file: with -DRTLD_LOCAL_DEP, librtld_dep.so, which defines a variable (version node DRC_TEST_1,
 * rtld_dep.map); without, librtld_user.so,
 * which needs librtld_dep.so and looks the variable up with dlsym(RTLD_DEFAULT, ...). hook_child
 * loads librtld_user.so RTLD_LOCAL, as ctypes and most plugin loaders do: the variable is then in
 * the user's local scope only, which libc searches for RTLD_DEFAULT because the user is the caller.
 */
#ifdef RTLD_LOCAL_DEP
int drc_test_rtld_dep_value = 42;
#else
#include <dlfcn.h>

extern int drc_test_rtld_dep_value;

int drc_test_rtld_default_lookup(void);
int drc_test_rtld_default_lookup(void)
{
    int *p = dlsym(RTLD_DEFAULT, "drc_test_rtld_dep_value");
    int *q = dlvsym(RTLD_DEFAULT, "drc_test_rtld_dep_value", "DRC_TEST_1");     /* rtld_dep.map's node */

    /* 0: both found it; 1: dlsym did not; 2: dlvsym did not; 3: neither */
    return (p != &drc_test_rtld_dep_value) | (q != &drc_test_rtld_dep_value) << 1;
}
#endif
