/*
 * Tests of build/libdrc_hook.so (src/preload/preload_cuda.c): does LD_PRELOADing it
 * make drc invalidate before a free, however the program reaches the driver?
 *
 * There is no GPU in CI: the driver is build/fakecuda/libcuda.so.1, a DOUBLE
 * (tests/doubles/fake_libcuda.c) whose "device memory" is host memory and which,
 * inside every free, lets the program look at what drc has done. The program
 * is tests/hooks/hook_child.c, run as a child process without sanitizers
 * (this binary may be an ASan build; ASan does not mix with preloading). The
 * child exits 0 when the region it held was invalidated and the idle one
 * deregistered before the memory was freed, 2 when not.
 *
 * Each path is also run without the hook library, where the child must
 * report the stale region (exit 2): the check can fail, and does when no
 * hook is in place.
 */
#include <limits.h>
#include <setjmp.h>
#include <spawn.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "helpers.h"

extern char **environ;

static char build[PATH_MAX];
static const char *variant = "";    /* "" or "O0/": the preload built at -O0 without sibling calls */

enum { NO_HOOK = 0, HOOK = 1, BOTH_NAMES = 2, STANDIN = 3, ALL = 4, HOST_OFF = 5, RACE = 6 };
static const char *const preload_name[] = { "no hook", "preload", "both names", "stand-in verbs front",
                                            "libdrc_preload.so", "libdrc_preload.so, DRC_PRELOAD=cuda,verbs",
                                            "preload with from_drc's windows widened" };

/* The build folder: the one above this binary that holds hooktest/hook_child. */
static int find_build(void **state)
{
    (void)state;
    return find_build_dir(build, sizeof(build), "hooktest/hook_child");
}

/* The same tests against build/O0/libdrc_hook.so. */
static int find_build_O0(void **state)
{
    variant = "O0/";
    return find_build(state);
}

/*
 * Run the child in @mode; @preload: NO_HOOK, HOOK (libdrc_hook.so), BOTH_NAMES
 * (libdrc_hook.so and libdrc_verbs.so), STANDIN (the preload with a stand-in
 * verbs front), ALL (libdrc_preload.so: every part), HOST_OFF (the same with
 * the host part off), RACE (the test build whose from_drc sleeps in its
 * windows); @monitor: DRC_MONITOR or NULL. Its exit status.
 */
static int run_child(const char *mode, int preload, const char *monitor, char *out, size_t outlen)
{
    char child[PATH_MAX + 32], pre[3 * PATH_MAX + 64], mon[64], cupti[PATH_MAX + 48];
    char *argv[] = { child, (char *)mode, NULL };
    char *envp[10];
    int e = 0, fds[2], status;
    posix_spawn_file_actions_t fa;
    ssize_t got, total = 0;
    pid_t pid;

    snprintf(child, sizeof(child), "%s/hooktest/hook_child", build);
    if (preload == BOTH_NAMES)
        snprintf(pre, sizeof(pre), "LD_PRELOAD=%s/libdrc_hook.so:%s/libdrc_verbs.so", build, build);
    else if (preload == STANDIN)
        snprintf(pre, sizeof(pre), "LD_PRELOAD=%s/hooktest/standin/libdrc_preload.so", build);
    else if (preload == ALL || preload == HOST_OFF)
        snprintf(pre, sizeof(pre), "LD_PRELOAD=%s/libdrc_preload.so", build);
    else if (preload == RACE)
        snprintf(pre, sizeof(pre), "LD_PRELOAD=%s/hooktest/race/libdrc_preload.so", build);
    else
        snprintf(pre, sizeof(pre), "LD_PRELOAD=%s/%slibdrc_hook.so", build, variant);
    envp[e++] = "PATH=/usr/bin:/bin";
    if (preload)
        envp[e++] = pre;
    if (preload == HOST_OFF)
        envp[e++] = "DRC_PRELOAD=cuda,verbs";
    if (monitor) {
        snprintf(mon, sizeof(mon), "DRC_MONITOR=%s", monitor);
        envp[e++] = mon;
        /* the CUPTI double (tests/hooks/fake_cupti.c), which the libcuda double reports to */
        snprintf(cupti, sizeof(cupti), "DRC_CUPTI_LIB=%s/fakecuda/libcupti.so", build);
        envp[e++] = cupti;
        envp[e++] = "DRC_HOOK_DEBUG=1";     /* says whether the CUPTI monitor started */
    }
    envp[e] = NULL;
    assert_int_equal(pipe(fds), 0);
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
    posix_spawn_file_actions_adddup2(&fa, fds[1], 2);
    posix_spawn_file_actions_addclose(&fa, fds[0]);
    assert_int_equal(posix_spawn(&pid, child, &fa, NULL, argv, envp), 0);
    posix_spawn_file_actions_destroy(&fa);
    close(fds[1]);
    while (total < (ssize_t)outlen - 1 && (got = read(fds[0], out + total, outlen - 1 - total)) > 0)
        total += got;
    out[total] = 0;
    close(fds[0]);
    assert_int_equal(waitpid(pid, &status, 0), pid);
    printf("  [%s%s%s%s] %s", preload_name[preload], preload == HOOK ? variant : "",
           monitor ? ", DRC_MONITOR=" : "", monitor ? monitor : "", out);
    assert_true(WIFEXITED(status));
    return WEXITSTATUS(status);
}

/* @mode through the CUPTI monitor (DRC_MONITOR=cupti with the CUPTI double) instead of interposition. */
static void caught_by_cupti(const char *mode)
{
    char out[512], want[64];

    snprintf(want, sizeof(want), "%s: notified", mode);
    assert_int_equal(run_child(mode, 1, "cupti", out, sizeof(out)), 0);
    assert_non_null(strstr(out, want));
    assert_non_null(strstr(out, "CUPTI monitor on"));     /* CUPTI told drc, not the interposer */
}

static void caught(const char *mode)
{
    char out[512], want[64];

    snprintf(want, sizeof(want), "%s: notified", mode);
    assert_int_equal(run_child(mode, 1, NULL, out, sizeof(out)), 0);
    assert_non_null(strstr(out, want));
    /* the control: the same program without the hook keeps the stale region */
    snprintf(want, sizeof(want), "%s: NOT notified", mode);
    assert_int_equal(run_child(mode, 0, NULL, out, sizeof(out)), 2);
    assert_non_null(strstr(out, want));
}

/* A program linked with -lcuda calling cuMemFree_v2 itself. */
static void test_direct_cuMemFree_v2(void **state)
{
    (void)state;
    caught("direct");
}

/* A program asking the linked cuGetProcAddress_v2 for "cuMemFree". */
static void test_through_cuGetProcAddress(void **state)
{
    (void)state;
    caught("gpa");
}

/* What the CUDA runtime does: dlsym(libcuda, "cuGetProcAddress_v2") -> "cuGetProcAddress" -> "cuMemFree". */
static void test_through_dlsym_like_the_runtime(void **state)
{
    (void)state;
    caught("runtime");
}

/* The same path for cuMemFreeAsync with the per-thread default stream (the _ptsz entry). */
static void test_free_async_like_the_runtime(void **state)
{
    (void)state;
    caught("runtime-async");
}

/* dlsym(libcuda, "cuMemFree_v2") and dlsym(libcuda, "cuMemUnmap"). */
static void test_dlsym_of_the_free_itself(void **state)
{
    (void)state;
    caught("dlsym");
    caught("unmap");
}

/* The explicit wrapper needs no preload, and is not broken by one. */
static void test_wrapper_with_and_without_preload(void **state)
{
    char out[512];

    (void)state;
    assert_int_equal(run_child("wrapper", 0, NULL, out, sizeof(out)), 0);
    assert_int_equal(run_child("wrapper", 1, NULL, out, sizeof(out)), 0);
}

/* DRC_MONITOR=none turns the library into a pass-through: the stale region stays (and the free works). */
static void test_monitor_none_passes_through(void **state)
{
    char out[512];

    (void)state;
    assert_int_equal(run_child("runtime", 1, "none", out, sizeof(out)), 2);
}

/* Interposing dlsym must keep RTLD_NEXT relative to the program that called it. */
static void test_rtld_next_keeps_its_meaning(void **state)
{
    char out[512];

    (void)state;
    assert_int_equal(run_child("rtld-next", 1, NULL, out, sizeof(out)), 0);
}

/*
 * dlsym(RTLD_DEFAULT) answers in the caller's scope: a library loaded RTLD_LOCAL (ctypes, plugins)
 * finds its own dependency's symbols. The preload forwards the call, which made it the caller:
 * before default_for(), the lookup answered NULL under the preload only. The control is the same
 * program without the preload, which must find it (else the check proves nothing).
 */
static void test_rtld_default_keeps_its_meaning(void **state)
{
    char out[512];

    (void)state;
    assert_int_equal(run_child("rtld-default", NO_HOOK, NULL, out, sizeof(out)), 0);
    assert_int_equal(run_child("rtld-default", 1, NULL, out, sizeof(out)), 0);
    assert_int_equal(run_child("rtld-default", BOTH_NAMES, NULL, out, sizeof(out)), 0);
}

/* A program that never creates a cache: every free path still frees, through the hook. */
static void test_no_cache_every_path_still_frees(void **state)
{
    char out[512];

    (void)state;
    assert_int_equal(run_child("nocache", 1, NULL, out, sizeof(out)), 0);
    assert_non_null(strstr(out, "nocache: 6 frees"));
}

/*
 * Issue 9 item 1: a free from a thread with no current context (the range
 * lookup then fails with 201) drops the whole allocation, not one byte:
 * the regions at +32 MiB are gone before the memory is. Through the preload
 * and through the explicit wrapper.
 */
static void test_free_without_a_context(void **state)
{
    char out[512];

    (void)state;
    caught("noctx");
    caught_by_cupti("noctx");
    assert_int_equal(run_child("noctx-wrapper", NO_HOOK, NULL, out, sizeof(out)), 0);
}

/* The CUPTI monitor sees the frees, pinned host frees and teardowns however they were reached. */
static void test_cupti_monitor(void **state)
{
    char out[512];

    (void)state;
    caught_by_cupti("direct");
    caught_by_cupti("runtime");
    caught_by_cupti("runtime-async");
    caught_by_cupti("unmap");
    caught_by_cupti("freehost");
    caught_by_cupti("reset");
    caught_by_cupti("destroy");
    caught_by_cupti("release");
    /* in CUPTI mode the interposed wrappers pass through: drc is told once, by CUPTI */
    assert_int_equal(run_child("nocache", 1, "cupti", out, sizeof(out)), 0);
}

/* Issue 9 item 3: pinned host memory, freed or unregistered through the driver the runtime's way. */
static void test_pinned_host(void **state)
{
    (void)state;
    caught("freehost");
    caught("unregister");
}

/* The close of imported IPC memory unmaps it: taken as a free of the mapping. */
static void test_ipc_close(void **state)
{
    (void)state;
    caught("ipcclose");
    caught_by_cupti("ipcclose");
}

/*
 * Issue 9 item 2: a context reset or destroy frees everything without a free
 * call; so does the last cuDevicePrimaryCtxRelease (caught after the call).
 */
static void test_teardowns(void **state)
{
    (void)state;
    caught("reset");
    caught("destroy");
    caught("release");
}

/* Both old names preloaded at once: one library, loaded once, and it works. */
static void test_both_names_preloaded(void **state)
{
    char out[512];

    (void)state;
    assert_int_equal(run_child("runtime", BOTH_NAMES, NULL, out, sizeof(out)), 0);
    assert_non_null(strstr(out, "runtime: notified"));
}

/*
 * Issue 9 item 4: dlsym/dlvsym of an ibv_* name the verbs front serves, on
 * a handle of libibverbs the program opened itself, answers drc's
 * definition (here a stand-in for the front); without a front, libibverbs's.
 */
static void test_ibv_dlsym_on_any_handle(void **state)
{
    char out[1024];

    (void)state;
    assert_int_equal(run_child("ibv-dlsym", STANDIN, NULL, out, sizeof(out)), 0);
    assert_non_null(strstr(out, "served by drc"));
    assert_int_equal(run_child("ibv-dlsym", NO_HOOK, NULL, out, sizeof(out)), 2);
}

/*
 * Issue 23 item 1: a libc call that puts new pages over registered host
 * memory without munmap is a free of the range it replaces. Through the
 * preload (every part on), the region on the old pages is invalid, its idle
 * neighbour deregistered and the next registration a miss once the call
 * returned; the control, the same program with the host part off, keeps all
 * three: the stale hit a NIC would write through.
 */
static void replaced(const char *mode)
{
    char out[512], want[64];

    snprintf(want, sizeof(want), "%s: invalidated", mode);
    assert_int_equal(run_child(mode, ALL, NULL, out, sizeof(out)), 0);
    assert_non_null(strstr(out, want));
    snprintf(want, sizeof(want), "%s: kept", mode);
    assert_int_equal(run_child(mode, HOST_OFF, NULL, out, sizeof(out)), 2);
    assert_non_null(strstr(out, want));
}

static void test_mmap_fixed_over_host_memory(void **state)
{
    (void)state;
    replaced("host-mmap");
    replaced("host-mmap64");
}

/* MAP_FIXED_NOREPLACE replaces nothing: failing with EEXIST over live memory, it leaves the regions alone. */
static void test_mmap_fixed_noreplace_keeps(void **state)
{
    char out[512];

    (void)state;
    assert_int_equal(run_child("host-noreplace", ALL, NULL, out, sizeof(out)), 0);
    assert_non_null(strstr(out, "host-noreplace: kept"));
}

static void test_shmat_remap_over_host_memory(void **state)
{
    (void)state;
    replaced("host-shmat");
}

static void test_mremap_fixed_onto_host_memory(void **state)
{
    (void)state;
    replaced("host-mremap");
}

static void test_remap_file_pages_over_host_memory(void **state)
{
    (void)state;
    replaced("host-remap-file");
}

/* mremap shrinking in place frees the whole pages past the new end, and nothing before them. */
static void test_mremap_shrink_frees_the_tail_only(void **state)
{
    char out[512];

    (void)state;
    assert_int_equal(run_child("host-mremap-shrink", ALL, NULL, out, sizeof(out)), 0);
}

/*
 * Issue 23 item 6: the preload answers dlsym by its caller (drc's own lookups
 * get the real function, a program's the wrapper), with a small cache of
 * answers per object. 8 threads call dlsym from 8 objects (4 drc-like) at
 * once, and every answer must be the one for its caller. Run against the
 * product, and against a test build that sleeps inside from_drc's windows:
 * there, a cache whose entry is two words (base, answer) pairs one object
 * with another's answer within the first few hundred calls.
 */
static void test_dlsym_answers_per_caller_under_threads(void **state)
{
    char out[512];

    (void)state;
    assert_int_equal(run_child("dlsym-race", ALL, NULL, out, sizeof(out)), 0);
    assert_non_null(strstr(out, "dlsym-race: 0 wrong answers of 3200"));
    assert_int_equal(run_child("dlsym-race", RACE, NULL, out, sizeof(out)), 0);
    assert_non_null(strstr(out, "dlsym-race: 0 wrong answers of 3200"));
}

int main(void)
{
    const struct CMUnitTest O0[] = {
        cmocka_unit_test(test_direct_cuMemFree_v2),
        cmocka_unit_test(test_through_dlsym_like_the_runtime),
        cmocka_unit_test(test_dlsym_of_the_free_itself),
        cmocka_unit_test(test_rtld_next_keeps_its_meaning),
        cmocka_unit_test(test_rtld_default_keeps_its_meaning),
        cmocka_unit_test(test_no_cache_every_path_still_frees),
        cmocka_unit_test(test_free_without_a_context),
    };
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mmap_fixed_over_host_memory),
        cmocka_unit_test(test_mmap_fixed_noreplace_keeps),
        cmocka_unit_test(test_shmat_remap_over_host_memory),
        cmocka_unit_test(test_mremap_fixed_onto_host_memory),
        cmocka_unit_test(test_remap_file_pages_over_host_memory),
        cmocka_unit_test(test_mremap_shrink_frees_the_tail_only),
        cmocka_unit_test(test_dlsym_answers_per_caller_under_threads),
        cmocka_unit_test(test_free_without_a_context),
        cmocka_unit_test(test_pinned_host),
        cmocka_unit_test(test_teardowns),
        cmocka_unit_test(test_both_names_preloaded),
        cmocka_unit_test(test_cupti_monitor),
        cmocka_unit_test(test_ipc_close),
        cmocka_unit_test(test_ibv_dlsym_on_any_handle),
        cmocka_unit_test(test_direct_cuMemFree_v2),
        cmocka_unit_test(test_through_cuGetProcAddress),
        cmocka_unit_test(test_through_dlsym_like_the_runtime),
        cmocka_unit_test(test_free_async_like_the_runtime),
        cmocka_unit_test(test_dlsym_of_the_free_itself),
        cmocka_unit_test(test_wrapper_with_and_without_preload),
        cmocka_unit_test(test_monitor_none_passes_through),
        cmocka_unit_test(test_rtld_next_keeps_its_meaning),
        cmocka_unit_test(test_rtld_default_keeps_its_meaning),
        cmocka_unit_test(test_no_cache_every_path_still_frees),
    };

    int failed = cmocka_run_group_tests(tests, find_build, NULL);

    /* RTLD_NEXT and the rest must not depend on the compiler's tail calls (issue 9, portability) */
    return failed + cmocka_run_group_tests_name("preload built at -O0", O0, find_build_O0, NULL);
}
