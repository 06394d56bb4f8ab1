/*
 * The DRC_* environment variables: the table and its parser (config.h).
 *
 * Adding a variable is one row in vars[] and one name in enum drc__env; its
 * reader calls drc__env(); README.md's table is printed from the row
 * (tests/core/test_config.c checks the README against it).
 *
 * Everything is parsed at the first call, at once, under parse_lock: each
 * variable, then every DRC_* name of the environment against the table. So
 * each mistake is reported exactly once per copy of drc in the process, at
 * the first read, which for the preload library is its constructor. A
 * report is one line on stderr, written whatever DRC_LOG says: a setting that
 * was meant to change protection and silently did not is the failure this
 * file exists to prevent. The process goes on with the variable's default.
 *
 * Names beginning with DRC_TEST_ are the test suite's own: never read here,
 * never reported.
 */
#include "core/config.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "drc.h"

enum kind { K_CHOICE, K_LIST, K_BOOL, K_NUMBER, K_PATH };

struct word {
    const char *w;
    int v;
};

struct var {
    const char *name;
    enum kind kind;
    const struct word *words;   /* K_CHOICE, K_LIST: ends with { NULL } */
    long long def;              /* the value when unset or wrong */
    long long min, max;         /* K_NUMBER */
    const char *def_text;       /* the README's Default column; NULL: the default's word */
    const char *what;           /* the README's "What it does" column */
};

static const struct word bools[] = {
    { "1", 1 }, { "on", 1 }, { "yes", 1 }, { "true", 1 },
    { "0", 0 }, { "off", 0 }, { "no", 0 }, { "false", 0 }, { NULL, 0 },
};
/* DRC__PRELOAD_CUDA, _HOST, _VERBS of preload/preload.h */
static const struct word parts[] = {
    { "cuda", 1 }, { "host", 2 }, { "verbs", 4 }, { "all", 7 }, { "none", 0 }, { NULL, 0 },
};
static const struct word monitors[] = {
    { "hook", DRC__MONITOR_HOOK }, { "cupti", DRC__MONITOR_CUPTI }, { "none", DRC__MONITOR_NONE },
    { "off", DRC__MONITOR_NONE }, { NULL, 0 },
};
static const struct word verbs_host[] = { { "cache", 0 }, { "passthrough", 1 }, { NULL, 0 } };
static const struct word widen[] = {
    { "local", DRC__WIDEN_LOCAL }, { "always", DRC__WIDEN_ALWAYS }, { "never", DRC__WIDEN_NEVER }, { NULL, 0 },
};
static const struct word policies[] = {
    { "dmabuf_then_peermem", DRC_DMABUF_THEN_PEERMEM }, { "dmabuf", DRC_DMABUF_ONLY },
    { "dmabuf_only", DRC_DMABUF_ONLY }, { "peermem", DRC_PEERMEM_ONLY }, { "peermem_only", DRC_PEERMEM_ONLY },
    { NULL, 0 },
};
static const struct word logs[] = {
    { "off", DRC__LOG_OFF }, { "0", DRC__LOG_OFF }, { "none", DRC__LOG_OFF }, { "error", DRC__LOG_ERROR },
    { "warn", DRC__LOG_WARN }, { "info", DRC__LOG_INFO }, { "debug", DRC__LOG_DEBUG }, { NULL, 0 },
};
static const struct word mappings[] = {
    { "auto", DRC__MAPPING_ENV_AUTO }, { "pcie", DRC__MAPPING_ENV_PCIE }, { "default", DRC__MAPPING_ENV_DEFAULT },
    { NULL, 0 },
};

#define CHOICE(words, def) K_CHOICE, words, def, 0, 0
#define BOOL(def) K_BOOL, bools, def, 0, 0

static const struct var vars[DRC__ENV_COUNT] = {
    [DRC__ENV_PRELOAD] = { "DRC_PRELOAD", K_LIST, parts, 7, 0, 0,
        "the name preloaded: `libdrc_preload.so` and `libdrc_verbs.so` all, `libdrc_hook.so` `cuda`",
        "The preload's parts, a comma list: `cuda` (the CUDA frees), `host` (the libc unmaps), `verbs` "
        "(the `ibv_reg_mr` front). A wrong part or an empty value turns all three on." },
    [DRC__ENV_MONITOR] = { "DRC_MONITOR", CHOICE(monitors, DRC__MONITOR_HOOK), NULL,
        "How the `cuda` part hears of frees: `hook` interposes the CUDA calls, `cupti` subscribes to CUPTI "
        "callbacks instead (falling back to `hook` if it cannot), `none` passes everything through." },
    [DRC__ENV_CUPTI_LIB] = { "DRC_CUPTI_LIB", K_PATH, NULL, 0, 0, 0, "`libcupti.so` in the usual places",
        "The libcupti that `DRC_MONITOR=cupti` loads." },
    [DRC__ENV_HOOK_DEBUG] = { "DRC_HOOK_DEBUG", BOOL(0), NULL,
        "The preload says on stderr which drcs it attached to, how the CUPTI monitor started, and when a "
        "CUDA entry point cannot be caught." },
    [DRC__ENV_VERBS] = { "DRC_VERBS", BOOL(1), NULL,
        "`off`: the `verbs` part forwards every `ibv_*` call untouched." },
    [DRC__ENV_VERBS_HOST] = { "DRC_VERBS_HOST", CHOICE(verbs_host, 0), NULL,
        "`passthrough`: the preload hands host-memory registrations to libibverbs as asked and caches GPU "
        "memory only." },
    [DRC__ENV_VERBS_WIDEN] = { "DRC_VERBS_WIDEN", CHOICE(widen, DRC__WIDEN_LOCAL), NULL,
        "Which GPU registrations of the preload are widened to their whole allocation: `local` those that "
        "ask no remote access, `always` all, `never` none." },
    [DRC__ENV_VERBS_REVOKE] = { "DRC_VERBS_REVOKE", BOOL(0), NULL,
        "`1`: a free deregisters the NIC MR at once even while the engine holds it (`DRC_F_REVOKE`)." },
    [DRC__ENV_POLICY] = { "DRC_POLICY", CHOICE(policies, DRC_DMABUF_THEN_PEERMEM), NULL,
        "How the preload's caches register GPU memory (`cfg.policy`)." },
    [DRC__ENV_MAX_REGIONS] = { "DRC_MAX_REGIONS", K_NUMBER, NULL, 0, 0, LLONG_MAX, "`0` (no limit)",
        "Idle cached MRs the preload keeps per PD." },
    [DRC__ENV_LOG] = { "DRC_LOG", CHOICE(logs, DRC__LOG_OFF), NULL,
        "What drc writes on stderr: `error` and `warn` its failures that no call returns, `info` also one "
        "summary line at exit (from a process that registered memory), `debug` also a line per verbs call. "
        "Mistakes in these variables are written at every level." },
    [DRC__ENV_VERBOSE] = { "DRC_VERBOSE", BOOL(0), NULL,
        "Each GPU's registration method and each (GPU, NIC) pair's dmabuf mapping, with the reason, on "
        "stderr." },
    [DRC__ENV_DMABUF_MAPPING] = { "DRC_DMABUF_MAPPING", CHOICE(mappings, DRC__MAPPING_ENV_AUTO), NULL,
        "The dmabuf mapping type of GPU memory: `auto` from the PCIe topology, `pcie` or `default` for "
        "every (GPU, NIC) pair." },
    [DRC__ENV_SYSFS_ROOT] = { "DRC_SYSFS_ROOT", K_PATH, NULL, 0, 0, 0, "`/sys`",
        "Where the PCIe topology is read." },
    [DRC__ENV_REG_THREADS] = { "DRC_REG_THREADS", K_NUMBER, NULL, 8, 1, 8, NULL,
        "Threads `drc_reg_mr_multi` registers with (`1`: the caller alone)." },
    [DRC__ENV_TORCH_VMM] = { "DRC_TORCH_VMM", BOOL(1), NULL,
        "`0`: PyTorch pool segments are plain `cuMemAlloc`, never VMM allocations." },
    [DRC__ENV_LIB] = { "DRC_LIB", K_PATH, NULL, 0, 0, 0, "pkg-config's libdir, the source tree's `build/`, then the soname",
        "The `libdrc.so` the `drc_torch` Python package loads." },
};

#undef CHOICE
#undef BOOL

static const char test_prefix[] = "DRC_TEST_";

static struct {
    long long value;
    const char *str;
    int state;
} got[DRC__ENV_COUNT];
static int parsed;                      /* atomic: got[] is filled */
static pthread_mutex_t parse_lock = PTHREAD_MUTEX_INITIALIZER;

/* ---- reporting ----------------------------------------------------------- */

/* One line on stderr, in one write. */
static void say(const char *line)
{
    size_t n = strlen(line);

    if (write(2, line, n) < 0)
        return;     /* nowhere to report that stderr is gone */
}

/* @out gets the words of @w, each once per spelling, comma-separated. */
static void words_text(const struct word *w, char *out, size_t len)
{
    size_t used = 0;

    out[0] = 0;
    for (; w->w && used < len; w++)
        used += (size_t)snprintf(out + used, len - used, "%s%s", used ? ", " : "", w->w);
}

/* The first word of @w whose value is @v: how a value is named in messages. */
static const char *word_of(const struct word *w, long long v)
{
    for (; w->w; w++)
        if (w->v == v)
            return w->w;
    return "?";
}

static void default_text(const struct var *d, char *out, size_t len)
{
    if (d->kind == K_NUMBER)
        snprintf(out, len, "%lld", d->def);
    else if (d->kind == K_PATH)
        snprintf(out, len, "unset");
    else
        snprintf(out, len, "%s", word_of(d->words, d->def));
}

static void report_wrong(const struct var *d, const char *value, const char *why)
{
    char line[768], def[64];

    default_text(d, def, sizeof(def));
    snprintf(line, sizeof(line), "drc: %s=%s: %s; using the default, %s\n", d->name, value, why, def);
    say(line);
}

/* ---- parsing --------------------------------------------------------------- */

static int find_word(const struct word *w, const char *s, size_t n, long long *v)
{
    for (; w->w; w++)
        if (strlen(w->w) == n && !strncmp(w->w, s, n)) {
            *v = w->v;
            return 0;
        }
    return -EINVAL;
}

/* A whole number in [min, max], digits only (no sign, no space, no suffix). */
static int parse_number(const char *s, long long min, long long max, long long *v)
{
    unsigned long long x = 0;

    if (!*s)
        return -EINVAL;
    for (; *s; s++) {
        if (*s < '0' || *s > '9' || x > (ULLONG_MAX - 9) / 10)
            return -EINVAL;
        x = x * 10 + (unsigned)(*s - '0');
    }
    if (x > (unsigned long long)max || (long long)x < min)
        return -EINVAL;
    *v = (long long)x;
    return 0;
}

static void parse_one(int i)
{
    const struct var *d = &vars[i];
    const char *s = getenv(d->name), *p;
    char why[512], list[256];
    long long v = 0, part;
    size_t n;

    got[i].value = d->def;
    got[i].state = DRC__ENV_UNSET;
    if (!s)
        return;
    if (d->kind == K_PATH) {
        got[i].str = *s ? s : NULL;
        got[i].state = DRC__ENV_VALID;
        return;
    }
    got[i].state = DRC__ENV_WRONG;
    switch (d->kind) {
    case K_CHOICE:
    case K_BOOL:
        if (!find_word(d->words, s, strlen(s), &v))
            goto valid;
        words_text(d->words, list, sizeof(list));
        snprintf(why, sizeof(why), "%s one of %s", *s ? "not" : "empty, not", list);
        break;
    case K_LIST:
        words_text(d->words, list, sizeof(list));
        if (!*s) {
            snprintf(why, sizeof(why), "empty, not a comma list of %s", list);
            break;
        }
        for (p = s;; p += n + 1) {
            n = strcspn(p, ",");
            if (find_word(d->words, p, n, &part)) {
                snprintf(why, sizeof(why), "'%.*s' is not one of %s", (int)(n < 64 ? n : 64), p, list);
                break;
            }
            v |= part;
            if (!p[n])
                goto valid;
        }
        break;
    case K_NUMBER:
        if (!parse_number(s, d->min, d->max, &v))
            goto valid;
        if (d->max == LLONG_MAX)
            snprintf(why, sizeof(why), "not a whole number from %lld", d->min);
        else
            snprintf(why, sizeof(why), "not a whole number from %lld to %lld", d->min, d->max);
        break;
    case K_PATH:
        break;
    }
    report_wrong(d, s, why);
    return;
valid:
    got[i].value = v;
    got[i].state = DRC__ENV_VALID;
}

/* Edit distance of @a and @b, capped at 3 (enough to say "did you mean"). */
static int distance(const char *a, size_t la, const char *b)
{
    size_t lb = strlen(b), i, j;
    int row[64], prev, cur;

    if (la >= 64 || lb >= 64)
        return 3;
    for (j = 0; j <= lb; j++)
        row[j] = (int)j;
    for (i = 1; i <= la; i++) {
        prev = row[0];
        row[0] = (int)i;
        for (j = 1; j <= lb; j++) {
            cur = row[j];
            row[j] = prev + (a[i - 1] != b[j - 1]);
            if (row[j] > row[j - 1] + 1)
                row[j] = row[j - 1] + 1;
            if (row[j] > cur + 1)
                row[j] = cur + 1;
            prev = cur;
        }
    }
    return row[lb] < 3 ? row[lb] : 3;
}

/* Every DRC_* name of the environment that the table does not know: reported, ignored. */
static void check_names(void)
{
    extern char **environ;
    char **e, line[256];
    const char *best;
    size_t n;
    int i, d, bestd;

    for (e = environ; e && *e; e++) {
        if (strncmp(*e, "DRC_", 4) || !strncmp(*e, test_prefix, sizeof(test_prefix) - 1))
            continue;
        n = strcspn(*e, "=");
        best = NULL;
        bestd = n >= 10 ? 3 : 2;    /* a suggestion within 2 edits, 1 for a short name */
        for (i = 0; i < DRC__ENV_COUNT; i++) {
            if (strlen(vars[i].name) == n && !strncmp(vars[i].name, *e, n))
                break;
            d = distance(*e, n, vars[i].name);
            if (d < bestd) {
                bestd = d;
                best = vars[i].name;
            }
        }
        if (i < DRC__ENV_COUNT)
            continue;
        snprintf(line, sizeof(line), "drc: %.*s is not a drc variable%s%s%s; ignored\n", (int)(n < 64 ? n : 64),
                 *e, best ? " (did you mean " : "", best ? best : "", best ? "?)" : "");
        say(line);
    }
}

static void parse_all(void)
{
    int i;

    for (i = 0; i < DRC__ENV_COUNT; i++)
        parse_one(i);
    check_names();
}

/* ---- the calls --------------------------------------------------------------- */

static void parse_once(void)
{
    if (__atomic_load_n(&parsed, __ATOMIC_ACQUIRE))
        return;
    pthread_mutex_lock(&parse_lock);
    if (!parsed) {
        parse_all();
        __atomic_store_n(&parsed, 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&parse_lock);
}

void drc__env_reset(void)
{
    pthread_mutex_lock(&parse_lock);
    __atomic_store_n(&parsed, 0, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&parse_lock);
}

long long drc__env(enum drc__env v)
{
    parse_once();
    return (unsigned)v < DRC__ENV_COUNT ? got[v].value : 0;
}

const char *drc__env_str(enum drc__env v)
{
    parse_once();
    return (unsigned)v < DRC__ENV_COUNT ? got[v].str : NULL;
}

int drc__env_state(enum drc__env v)
{
    parse_once();
    return (unsigned)v < DRC__ENV_COUNT ? got[v].state : DRC__ENV_UNSET;
}

const char *drc__env_name(int i)
{
    return i >= 0 && i < DRC__ENV_COUNT ? vars[i].name : NULL;
}

void drc__env_print_table(FILE *out)
{
    const struct word *w;
    char def[128];
    int i;

    fprintf(out, "| Variable | Values | Default | What it does |\n| --- | --- | --- | --- |\n");
    for (i = 0; i < DRC__ENV_COUNT; i++) {
        const struct var *d = &vars[i];

        fprintf(out, "| `%s` | ", d->name);
        switch (d->kind) {
        case K_CHOICE:
        case K_LIST:
            /* aliases (a word whose value an earlier word has) follow it in parentheses */
            for (w = d->words; w->w; w++) {
                const struct word *a;

                if (w != d->words && w[-1].v == w->v)
                    continue;
                fprintf(out, "%s`%s`", w == d->words ? "" : ", ", w->w);
                for (a = w + 1; a->w && a->v == w->v; a++)
                    fprintf(out, "%s`%s`", a == w + 1 ? " (or " : ", ", a->w);
                if (a != w + 1)
                    fprintf(out, ")");
            }
            if (d->kind == K_LIST)
                fprintf(out, ", comma-separated");
            break;
        case K_BOOL:
            fprintf(out, "`1`, `0` (or `on`/`off`, `yes`/`no`, `true`/`false`)");
            break;
        case K_NUMBER:
            if (d->max == LLONG_MAX)
                fprintf(out, "a whole number from `%lld`", d->min);
            else
                fprintf(out, "`%lld` to `%lld`", d->min, d->max);
            break;
        case K_PATH:
            fprintf(out, "a path");
            break;
        }
        if (d->def_text)
            snprintf(def, sizeof(def), "%s", d->def_text);
        else if (d->kind == K_BOOL)
            snprintf(def, sizeof(def), "`%d`", (int)d->def);
        else {
            default_text(d, def + 1, sizeof(def) - 2);
            def[0] = '`';
            strcat(def, "`");
        }
        fprintf(out, " | %s | %s |\n", def, d->what);
    }
    fprintf(out, "| `%s*` | | | Reserved for drc's own tests: never read by drc, never reported. |\n", test_prefix);
}
