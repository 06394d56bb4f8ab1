/*
 * Tests of src/core/config.c: the DRC_* table and its parser.
 *
 * What a user checks: a value the table lists is taken; a wrong value or an
 * unknown DRC_* name gives one line on stderr, whatever DRC_LOG says, and
 * the default (never less protection); DRC_LOG=0 turns logging off. And what
 * a reader of the README checks: the table between the README's
 * <!-- config-table --> markers is the one the code parses, and every DRC_*
 * name that src/ reads is in it.
 *
 * The environment is read once per process, so each case runs in a child
 * with an environment of its own (only the variables the case sets).
 */
#include <ftw.h>
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "helpers.h"
#include "core/config.h"
#include "drc.h"

struct outcome {
    long long value;
    int state;
    char str[64];           /* drc__env_str, "(null)" for NULL */
    char err[2048];         /* what the child wrote on stderr */
};

/* In a child whose environment is exactly @env (NULL-terminated "NAME=value"), read variable @v. */
static void run(const char *const *env, enum drc__env v, struct outcome *o)
{
    int res[2], err[2], status;
    pid_t pid;

    memset(o, 0, sizeof(*o));
    assert_int_equal(pipe(res), 0);
    assert_int_equal(pipe(err), 0);
    fflush(NULL);
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        struct outcome mine;
        const char *s;

        clearenv();
        for (; *env; env++)
            putenv((char *)*env);
        dup2(err[1], 2);
        memset(&mine, 0, sizeof(mine));
        mine.value = drc__env(v);
        mine.state = drc__env_state(v);
        s = drc__env_str(v);
        snprintf(mine.str, sizeof(mine.str), "%s", s ? s : "(null)");
        drc__env(v);        /* a second read reports nothing again */
        if (write(res[1], &mine, sizeof(mine)) != (ssize_t)sizeof(mine))
            _exit(1);
        _exit(0);
    }
    close(res[1]);
    close(err[1]);
    assert_int_equal(read(res[0], o, sizeof(*o)), (ssize_t)sizeof(*o));
    drain_fd(err[0], o->err, sizeof(o->err));
    close(res[0]);
    close(err[0]);
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    printf("  {%s%s} -> %lld (%s) %s", env[0] ? env[0] : "", env[0] && env[1] ? " ..." : "", o->value,
           o->state == DRC__ENV_VALID ? "valid" : o->state == DRC__ENV_WRONG ? "wrong" : "unset", o->err);
    if (!o->err[0])
        printf("\n");
}

static int count(const char *hay, const char *needle)
{
    int n = 0;

    while ((hay = strstr(hay, needle))) {
        n++;
        hay += strlen(needle);
    }
    return n;
}

/* One assignment, valid: @want, and nothing on stderr. */
static void takes(enum drc__env v, const char *assignment, long long want)
{
    const char *env[] = { assignment, NULL };
    struct outcome o;

    run(env, v, &o);
    assert_int_equal(o.state, DRC__ENV_VALID);
    assert_int_equal(o.value, want);
    assert_string_equal(o.err, "");
}

/* One assignment, wrong: the default @def, and exactly one line on stderr containing @says. */
static void refuses(enum drc__env v, const char *assignment, long long def, const char *says)
{
    const char *env[] = { assignment, NULL };
    struct outcome o;

    run(env, v, &o);
    assert_int_equal(o.state, DRC__ENV_WRONG);
    assert_int_equal(o.value, def);
    assert_int_equal(count(o.err, "\n"), 1);
    assert_non_null(strstr(o.err, says));
}

/* Unset: the default, silence. */
static void test_unset_is_the_default(void **state)
{
    const char *env[] = { "PATH=/bin", NULL };
    struct outcome o;

    (void)state;
    run(env, DRC__ENV_PRELOAD, &o);
    assert_int_equal(o.state, DRC__ENV_UNSET);
    assert_int_equal(o.value, 7);
    assert_string_equal(o.err, "");
    run(env, DRC__ENV_VERBS, &o);
    assert_int_equal(o.value, 1);
    run(env, DRC__ENV_REG_THREADS, &o);
    assert_int_equal(o.value, 8);
    run(env, DRC__ENV_SYSFS_ROOT, &o);
    assert_string_equal(o.str, "(null)");
}

/* DRC_LOG: off/0/none are off (0 and off used to turn logging on), the levels in order, anything else the default. */
static void test_log_levels(void **state)
{
    (void)state;
    takes(DRC__ENV_LOG, "DRC_LOG=0", DRC__LOG_OFF);
    takes(DRC__ENV_LOG, "DRC_LOG=off", DRC__LOG_OFF);
    takes(DRC__ENV_LOG, "DRC_LOG=none", DRC__LOG_OFF);
    takes(DRC__ENV_LOG, "DRC_LOG=error", DRC__LOG_ERROR);
    takes(DRC__ENV_LOG, "DRC_LOG=warn", DRC__LOG_WARN);
    takes(DRC__ENV_LOG, "DRC_LOG=info", DRC__LOG_INFO);
    takes(DRC__ENV_LOG, "DRC_LOG=debug", DRC__LOG_DEBUG);
    refuses(DRC__ENV_LOG, "DRC_LOG=1", DRC__LOG_OFF, "drc: DRC_LOG=1: not one of off, 0, none, error, warn, info, debug");
    refuses(DRC__ENV_LOG, "DRC_LOG=INFO", DRC__LOG_OFF, "using the default, off");
}

/* DRC_PRELOAD: a comma list; a misspelt part or an empty value turns every part on, never fewer. */
static void test_preload_parts(void **state)
{
    (void)state;
    takes(DRC__ENV_PRELOAD, "DRC_PRELOAD=cuda", 1);
    takes(DRC__ENV_PRELOAD, "DRC_PRELOAD=cuda,verbs", 5);
    takes(DRC__ENV_PRELOAD, "DRC_PRELOAD=host,verbs,cuda", 7);
    takes(DRC__ENV_PRELOAD, "DRC_PRELOAD=all", 7);
    takes(DRC__ENV_PRELOAD, "DRC_PRELOAD=none", 0);
    refuses(DRC__ENV_PRELOAD, "DRC_PRELOAD=cuda,verbs,hots", 7, "'hots' is not one of cuda, host, verbs, all, none");
    refuses(DRC__ENV_PRELOAD, "DRC_PRELOAD=banana", 7, "using the default, all");
    refuses(DRC__ENV_PRELOAD, "DRC_PRELOAD=", 7, "DRC_PRELOAD=: empty");
    refuses(DRC__ENV_PRELOAD, "DRC_PRELOAD=cuda,", 7, "'' is not one of");
}

/* Numbers: digits only, in range; -1 no longer wraps to "no limit", nor does an overflow. */
static void test_numbers(void **state)
{
    (void)state;
    takes(DRC__ENV_MAX_REGIONS, "DRC_MAX_REGIONS=0", 0);
    takes(DRC__ENV_MAX_REGIONS, "DRC_MAX_REGIONS=1000", 1000);
    takes(DRC__ENV_MAX_REGIONS, "DRC_MAX_REGIONS=9223372036854775807", 9223372036854775807LL);
    refuses(DRC__ENV_MAX_REGIONS, "DRC_MAX_REGIONS=-1", 0, "not a whole number from 0");
    refuses(DRC__ENV_MAX_REGIONS, "DRC_MAX_REGIONS=9223372036854775808", 0, "not a whole number");
    refuses(DRC__ENV_MAX_REGIONS, "DRC_MAX_REGIONS=99999999999999999999999", 0, "not a whole number");
    refuses(DRC__ENV_MAX_REGIONS, "DRC_MAX_REGIONS=10k", 0, "not a whole number");
    refuses(DRC__ENV_MAX_REGIONS, "DRC_MAX_REGIONS= 5", 0, "not a whole number");
    takes(DRC__ENV_REG_THREADS, "DRC_REG_THREADS=1", 1);
    takes(DRC__ENV_REG_THREADS, "DRC_REG_THREADS=8", 8);
    refuses(DRC__ENV_REG_THREADS, "DRC_REG_THREADS=banana", 8, "not a whole number from 1 to 8");
    refuses(DRC__ENV_REG_THREADS, "DRC_REG_THREADS=0", 8, "using the default, 8");
    refuses(DRC__ENV_REG_THREADS, "DRC_REG_THREADS=9", 8, "using the default, 8");
}

/* Booleans and choices: only the listed words; anything else the default, which keeps protection on. */
static void test_words(void **state)
{
    static const char *const yes[] = { "1", "on", "yes", "true" }, *const no[] = { "0", "off", "no", "false" };
    char a[64];
    size_t i;

    (void)state;
    for (i = 0; i < 4; i++) {
        snprintf(a, sizeof(a), "DRC_VERBS_REVOKE=%s", yes[i]);
        takes(DRC__ENV_VERBS_REVOKE, a, 1);
        snprintf(a, sizeof(a), "DRC_VERBS=%s", no[i]);
        takes(DRC__ENV_VERBS, a, 0);
    }
    refuses(DRC__ENV_VERBS, "DRC_VERBS=banana", 1, "drc: DRC_VERBS=banana: not one of 1, on, yes, true, 0, off");
    refuses(DRC__ENV_VERBS, "DRC_VERBS=", 1, "empty");
    refuses(DRC__ENV_TORCH_VMM, "DRC_TORCH_VMM=nope", 1, "using the default, 1");
    takes(DRC__ENV_VERBS_HOST, "DRC_VERBS_HOST=passthrough", 1);
    refuses(DRC__ENV_VERBS_HOST, "DRC_VERBS_HOST=banana", 0, "using the default, cache");
    takes(DRC__ENV_MONITOR, "DRC_MONITOR=cupti", DRC__MONITOR_CUPTI);
    takes(DRC__ENV_MONITOR, "DRC_MONITOR=off", DRC__MONITOR_NONE);
    refuses(DRC__ENV_MONITOR, "DRC_MONITOR=banana", DRC__MONITOR_HOOK, "using the default, hook");
    takes(DRC__ENV_VERBS_WIDEN, "DRC_VERBS_WIDEN=never", DRC__WIDEN_NEVER);
    refuses(DRC__ENV_VERBS_WIDEN, "DRC_VERBS_WIDEN=all", DRC__WIDEN_LOCAL, "using the default, local");
    takes(DRC__ENV_POLICY, "DRC_POLICY=peermem_only", DRC_PEERMEM_ONLY);
    refuses(DRC__ENV_POLICY, "DRC_POLICY=dma", DRC_DMABUF_THEN_PEERMEM, "using the default, dmabuf_then_peermem");
    takes(DRC__ENV_DMABUF_MAPPING, "DRC_DMABUF_MAPPING=pcie", DRC__MAPPING_ENV_PCIE);
    refuses(DRC__ENV_DMABUF_MAPPING, "DRC_DMABUF_MAPPING=PCIe", DRC__MAPPING_ENV_AUTO, "using the default, auto");
}

/* Paths are taken as given; empty is unset. */
static void test_paths(void **state)
{
    const char *env[] = { "DRC_SYSFS_ROOT=/tmp/fake", NULL }, *empty[] = { "DRC_CUPTI_LIB=", NULL };
    struct outcome o;

    (void)state;
    run(env, DRC__ENV_SYSFS_ROOT, &o);
    assert_string_equal(o.str, "/tmp/fake");
    assert_string_equal(o.err, "");
    run(empty, DRC__ENV_CUPTI_LIB, &o);
    assert_string_equal(o.str, "(null)");
    assert_string_equal(o.err, "");
}

/*
 * Every mistake of the environment is reported at the first read, once, whichever variable is read
 * and whatever DRC_LOG says; unknown DRC_* names too (with the nearest name when one is close);
 * DRC_TEST_* is the test suite's and never reported; other prefixes are not drc's business.
 */
static void test_each_mistake_reported_once(void **state)
{
    const char *env[] = { "DRC_LOG=off", "DRC_VERBS_HOTS=passthrough", "DRC_MONITR=cupti", "DRC_FOO=1",
                          "DRC_TEST_ANYTHING=1", "DRCX=1", "XDRC_LOG=9", "DRC_POLICY=x", NULL };
    struct outcome o;

    (void)state;
    run(env, DRC__ENV_VERBS, &o);
    assert_int_equal(count(o.err, "\n"), 4);
    assert_int_equal(count(o.err, "drc: DRC_VERBS_HOTS is not a drc variable (did you mean DRC_VERBS_HOST?); "
                                  "ignored\n"), 1);
    assert_int_equal(count(o.err, "drc: DRC_MONITR is not a drc variable (did you mean DRC_MONITOR?)"), 1);
    assert_int_equal(count(o.err, "drc: DRC_FOO is not a drc variable; ignored\n"), 1);
    assert_int_equal(count(o.err, "drc: DRC_POLICY=x: "), 1);
    assert_null(strstr(o.err, "TEST"));
}

/* ---- the table against the README and the sources ------------------------------------------ */

static char top[PATH_MAX];

/* The source tree: the nearest folder above this binary that holds src/core/config.c. */
static int find_top(void **state)
{
    char probe[PATH_MAX + 32];
    ssize_t n = readlink("/proc/self/exe", top, sizeof(top) - 1);
    char *slash;

    (void)state;
    if (n <= 0)
        return -1;
    top[n] = 0;
    while ((slash = strrchr(top, '/'))) {
        *slash = 0;
        snprintf(probe, sizeof(probe), "%s/src/core/config.c", top);
        if (access(probe, R_OK) == 0)
            return 0;
    }
    return -1;
}

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "r");
    char *buf;
    long n;

    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    n = ftell(f);
    fseek(f, 0, SEEK_SET);
    buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    if (buf)
        buf[n] = 0;
    fclose(f);
    return buf;
}

/* README.md between <!-- config-table --> and <!-- /config-table --> is what drc__env_print_table prints. */
static void test_readme_table_is_the_table(void **state)
{
    static const char open_mark[] = "<!-- config-table -->\n", close_mark[] = "<!-- /config-table -->";
    char path[PATH_MAX + 32], *readme, *from, *to, *want = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&want, &len);

    (void)state;
    assert_non_null(m);
    drc__env_print_table(m);
    fclose(m);
    snprintf(path, sizeof(path), "%s/README.md", top);
    readme = slurp(path);
    assert_non_null(readme);
    from = strstr(readme, open_mark);
    to = from ? strstr(from, close_mark) : NULL;
    if (!from || !to || strlen(want) != (size_t)(to - from - (ptrdiff_t)strlen(open_mark)) ||
        strncmp(from + strlen(open_mark), want, strlen(want))) {
        printf("README.md must hold, between %.*s and %s, exactly:\n%s", (int)strlen(open_mark) - 1, open_mark,
               close_mark, want);
        fail_msg("the README's configuration table differs from src/core/config.c's");
    }
    free(readme);
    free(want);
}

static int known(const char *name, size_t n)
{
    int i;

    if (n >= 9 && !strncmp(name, "DRC_TEST_", 9))
        return 1;
    for (i = 0; i < DRC__ENV_COUNT; i++)
        if (strlen(drc__env_name(i)) == n && !strncmp(drc__env_name(i), name, n))
            return 1;
    return 0;
}

static int unknown_names;
static int stray_getenv;

/* Each string literal of a source that opens with DRC_ must name a variable of the table. */
static int scan(const char *path, const struct stat *st, int type, struct FTW *ftw)
{
    const char *dot = strrchr(path, '.'), *p;
    char *text;

    (void)st;
    (void)ftw;
    if (type != FTW_F || !dot || (strcmp(dot, ".c") && strcmp(dot, ".h") && strcmp(dot, ".py")))
        return 0;
    text = slurp(path);
    if (!text)
        return 0;
    for (p = text; (p = strstr(p, "DRC_")); p += 4) {
        size_t n = strspn(p, "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_");

        if (p == text || (p[-1] != '"' && p[-1] != '\'') || n == 4 || known(p, n))   /* "DRC_": the prefix itself */
            continue;
        printf("  %s: \"%.*s\" is not in src/core/config.c's table\n", path, (int)n, p);
        unknown_names++;
    }
    /* one parser: nothing but config.c reads a DRC_* variable itself */
    if (!strstr(path, "src/core/config.c") && strstr(text, "getenv(\"DRC_")) {
        printf("  %s reads a DRC_* variable with getenv: use drc__env (src/core/config.h)\n", path);
        stray_getenv++;
    }
    free(text);
    return 0;
}

static void test_every_name_in_src_is_in_the_table(void **state)
{
    char src[PATH_MAX + 8];

    (void)state;
    snprintf(src, sizeof(src), "%s/src", top);
    assert_int_equal(nftw(src, scan, 16, FTW_PHYS), 0);
    assert_int_equal(unknown_names, 0);
    assert_int_equal(stray_getenv, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_unset_is_the_default),
        cmocka_unit_test(test_log_levels),
        cmocka_unit_test(test_preload_parts),
        cmocka_unit_test(test_numbers),
        cmocka_unit_test(test_words),
        cmocka_unit_test(test_paths),
        cmocka_unit_test(test_each_mistake_reported_once),
        cmocka_unit_test(test_readme_table_is_the_table),
        cmocka_unit_test(test_every_name_in_src_is_in_the_table),
    };

    return cmocka_run_group_tests(tests, find_top, NULL);
}
