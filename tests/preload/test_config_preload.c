/*
 * Configuration through the preload, in front of an unmodified program: a
 * mistake in a DRC_* variable is said once on stderr (DRC_LOG unset), and
 * protection stays on; a preload that does not get the names it serves says
 * so once; DRC_LOG=info's summary comes only from a process that registered.
 *
 * The programs: tests/engine/engine_child.c (its scenarios check, from the
 * loopback provider's record, whether the engine was ever served a stale MR)
 * with the two DOUBLES on LD_LIBRARY_PATH, the loopback provider
 * (build/loopnic) and the CUDA double (build/engine/fakecuda), as
 * tests/preload/test_verbs_preload.c runs them; and /bin/true for a process
 * that registers nothing. build/loopnic/libloopnic.so, the same provider
 * built to be preloaded, is the object that defines ibv_reg_mr ahead of drc.
 *
 * Controls: the same scenarios with the part or hook turned off by a valid
 * setting fail, so a passing scenario shows that protection was on.
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

static char build[PATH_MAX];

static int find_build(void **state)
{
    (void)state;
    return find_build_dir(build, sizeof(build), "engine/engine_child");
}

struct run {
    int status;
    char out[4096];
    char err[4096];
};

/*
 * Run @prog (an engine_child scenario, or a plain program when @scenario is
 * NULL) with LD_PRELOAD=@preload (paths relative to the build folder,
 * separated by spaces) and @extra ("NAME=value" ...; a value may be empty).
 */
static void run_prog(const char *prog, const char *scenario, const char *preload, const char *extra, struct run *r)
{
    char path[PATH_MAX + 32], pre[4 * PATH_MAX], lib[2 * PATH_MAX + 64], vars[512], list[512];
    char *argv[] = { path, (char *)scenario, NULL }, *envp[12], *save = NULL, *v;
    int e = 0;
    size_t used;

    if (prog[0] == '/')
        snprintf(path, sizeof(path), "%s", prog);
    else
        snprintf(path, sizeof(path), "%s/%s", build, prog);
    snprintf(lib, sizeof(lib), "LD_LIBRARY_PATH=%s/loopnic:%s/engine/fakecuda", build, build);
    envp[e++] = "PATH=/usr/bin:/bin";
    envp[e++] = lib;
    if (preload) {
        used = (size_t)snprintf(pre, sizeof(pre), "LD_PRELOAD=");
        snprintf(list, sizeof(list), "%s", preload);
        for (v = strtok_r(list, " ", &save); v; v = strtok_r(NULL, " ", &save))
            used += (size_t)snprintf(pre + used, sizeof(pre) - used, "%s%s/%s", used > 11 ? " " : "", build, v);
        envp[e++] = pre;
    }
    snprintf(vars, sizeof(vars), "%s", extra ? extra : "");
    save = NULL;
    for (v = strtok_r(vars, " ", &save); v && e < 11; v = strtok_r(NULL, " ", &save))
        envp[e++] = v;
    envp[e] = NULL;
    r->status = spawn_capture(path, argv, envp, r->out, sizeof(r->out), r->err, sizeof(r->err));
    assert_int_not_equal(r->status, -1);
    printf("  [%s %s, LD_PRELOAD=%s, %s]\n%s%s", prog, scenario ? scenario : "", preload ? preload : "",
           extra ? extra : "", r->out, r->err);
    assert_true(WIFEXITED(r->status));
    r->status = WEXITSTATUS(r->status);
}

static void run_scenario(const char *scenario, const char *extra, struct run *r)
{
    run_prog("engine/engine_child", scenario, "libdrc_preload.so", extra, r);
}

static int lines(const char *s)
{
    int n = 0;

    for (; *s; s++)
        n += *s == '\n';
    return n;
}

/* @scenario passes under the preload with @extra, and stderr is exactly one line holding @says. */
static void protected_and_said_once(const char *scenario, const char *extra, const char *says)
{
    struct run r;
    char want[64];

    run_scenario(scenario, extra, &r);
    assert_int_equal(r.status, 0);
    snprintf(want, sizeof(want), "ok %s", scenario);
    assert_non_null(strstr(r.out, want));
    assert_int_equal(lines(r.err), 1);
    assert_non_null(strstr(r.err, says));
}

/* ... and the control: with @extra (a valid setting that turns the protection off) it fails. */
static void unprotected(const char *scenario, const char *extra)
{
    struct run r;

    run_scenario(scenario, extra, &r);
    assert_int_equal(r.status, 1);
    assert_non_null(strstr(r.out, "FAIL"));
}

/*
 * DRC_PRELOAD=cuda,verbs,hots used to drop the host part in silence: munmap of registered host memory
 * then left a stale MR in the cache. Now the misspelt part is named and every part stays on.
 */
static void test_misspelt_part_keeps_every_part(void **state)
{
    (void)state;
    protected_and_said_once("host_munmap", "DRC_PRELOAD=cuda,verbs,hots",
                            "drc: DRC_PRELOAD=cuda,verbs,hots: 'hots' is not one of cuda, host, verbs, all, none; "
                            "using the default, all\n");
    protected_and_said_once("gpu_free", "DRC_PRELOAD=cuda,verbs,hots", "'hots'");
    unprotected("host_munmap", "DRC_PRELOAD=cuda,verbs");    /* the host part really off: stale */
}

/* DRC_PRELOAD=banana and an empty DRC_PRELOAD used to turn drc off entirely. */
static void test_unknown_or_empty_parts_keep_every_part(void **state)
{
    (void)state;
    protected_and_said_once("host_munmap", "DRC_PRELOAD=banana", "drc: DRC_PRELOAD=banana: 'banana' is not one of");
    protected_and_said_once("gpu_free", "DRC_PRELOAD=banana", "using the default, all");
    protected_and_said_once("host_munmap", "DRC_PRELOAD=", "drc: DRC_PRELOAD=: empty");
    protected_and_said_once("gpu_free", "DRC_PRELOAD=", "drc: DRC_PRELOAD=: empty");
    unprotected("gpu_free", "DRC_PRELOAD=none");
}

/* A wrong value of a switch that turns protection off is named, and protection stays on. */
static void test_wrong_switches_keep_protection(void **state)
{
    (void)state;
    protected_and_said_once("gpu_dedup", "DRC_VERBS=banana", "drc: DRC_VERBS=banana: not one of");
    unprotected("gpu_dedup", "DRC_VERBS=off");
    protected_and_said_once("host_munmap", "DRC_VERBS_HOST=banana", "drc: DRC_VERBS_HOST=banana: not one of");
    /* the CUDA double frees with munmap: the host part off, so that only the CUDA hooks can see it */
    protected_and_said_once("gpu_free", "DRC_MONITOR=banana DRC_PRELOAD=cuda,verbs",
                            "drc: DRC_MONITOR=banana: not one of");
    unprotected("gpu_free", "DRC_MONITOR=none DRC_PRELOAD=cuda,verbs");
}

/* Other wrong values: named once each (they used to be accepted, or named only under DRC_LOG). */
static void test_wrong_values_said_once(void **state)
{
    (void)state;
    protected_and_said_once("gpu_dedup", "DRC_REG_THREADS=banana", "drc: DRC_REG_THREADS=banana: not a whole number");
    protected_and_said_once("gpu_dedup", "DRC_MAX_REGIONS=-1", "drc: DRC_MAX_REGIONS=-1: not a whole number");
    protected_and_said_once("gpu_dedup", "DRC_POLICY=banana", "drc: DRC_POLICY=banana: not one of");
    protected_and_said_once("widen", "DRC_VERBS_WIDEN=banana", "drc: DRC_VERBS_WIDEN=banana: not one of");
    protected_and_said_once("gpu_dedup", "DRC_VERBS_REVOKE=banana", "drc: DRC_VERBS_REVOKE=banana: not one of");
}

/* An unknown DRC_* name: named once, with the nearest one; the misspelt setting changes nothing. */
static void test_unknown_name_said_once(void **state)
{
    (void)state;
    protected_and_said_once("host_munmap", "DRC_VERBS_HOTS=passthrough",
                            "drc: DRC_VERBS_HOTS is not a drc variable (did you mean DRC_VERBS_HOST?); ignored\n");
}

/* DRC_LOG=0 and DRC_LOG=off used to turn logging on; now they are off, and a wrong level is named. */
static void test_log_off_is_off(void **state)
{
    struct run r;

    (void)state;
    run_scenario("log", "DRC_LOG=0", &r);
    assert_int_equal(r.status, 0);
    assert_string_equal(r.err, "");
    run_scenario("log", "DRC_LOG=off", &r);
    assert_int_equal(r.status, 0);
    assert_string_equal(r.err, "");
    protected_and_said_once("log", "DRC_LOG=loud", "drc: DRC_LOG=loud: not one of off, 0, none, error, warn, info, "
                                                   "debug; using the default, off\n");
    run_scenario("log", "DRC_LOG=info", &r);       /* the control: a level that writes, writes */
    assert_non_null(strstr(r.err, "drc: over the process: 1 PDs"));
}

/* DRC_LOG=info's summary only from a process that registered: each process of a pipeline said "0 PDs". */
static void test_summary_only_from_a_registering_process(void **state)
{
    struct run r;

    (void)state;
    run_prog("/bin/true", NULL, "libdrc_preload.so", "DRC_LOG=info", &r);
    assert_int_equal(r.status, 0);
    assert_string_equal(r.err, "");
}

/*
 * An object preloaded before drc that defines ibv_reg_mr (here the loopback provider's preloadable
 * build, which also defines munmap, madvise and mremap) takes the program's calls: drc says so once,
 * naming the object and the fix. Preloaded after drc, or with the parts it shadows off, it takes
 * nothing from drc: silence.
 */
static void test_shadowed_names_said_once(void **state)
{
    struct run r;

    (void)state;
    run_prog("/bin/true", NULL, "loopnic/libloopnic.so libdrc_preload.so", NULL, &r);
    assert_int_equal(r.status, 0);
    assert_int_equal(lines(r.err), 1);
    assert_non_null(strstr(r.err, "drc: libdrc_preload.so does not see the program's calls to "));
    assert_non_null(strstr(r.err, "ibv_reg_mr"));
    assert_non_null(strstr(r.err, "ibv_dereg_mr"));
    assert_non_null(strstr(r.err, "munmap"));
    assert_non_null(strstr(r.err, "loopnic/libloopnic.so, loaded before it, defines them; put libdrc_preload.so "
                                  "first in LD_PRELOAD\n"));
    run_prog("/bin/true", NULL, "libdrc_preload.so loopnic/libloopnic.so", NULL, &r);
    assert_string_equal(r.err, "");
    run_prog("/bin/true", NULL, "loopnic/libloopnic.so libdrc_preload.so", "DRC_PRELOAD=cuda,host", &r);
    assert_int_equal(lines(r.err), 1);
    assert_null(strstr(r.err, "ibv_"));
    assert_non_null(strstr(r.err, "munmap"));
    run_prog("/bin/true", NULL, "loopnic/libloopnic.so libdrc_preload.so", "DRC_PRELOAD=cuda", &r);
    assert_string_equal(r.err, "");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_misspelt_part_keeps_every_part),
        cmocka_unit_test(test_unknown_or_empty_parts_keep_every_part),
        cmocka_unit_test(test_wrong_switches_keep_protection),
        cmocka_unit_test(test_wrong_values_said_once),
        cmocka_unit_test(test_unknown_name_said_once),
        cmocka_unit_test(test_log_off_is_off),
        cmocka_unit_test(test_summary_only_from_a_registering_process),
        cmocka_unit_test(test_shadowed_names_said_once),
    };

    return cmocka_run_group_tests(tests, find_build, NULL);
}
