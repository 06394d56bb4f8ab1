/*
 * drc's environment: every DRC_* variable, one table (config.c) and one
 * parser, used by every layer (libdrc, the preload library, the drc program).
 * README.md's "Configuration" table is printed from the same table
 * (drc__env_print_table), and tests/core/test_config.c fails when the two
 * differ or when src/ names a DRC_* variable the table lacks.
 *
 * The rule a user can count on: a value the table does not accept, or a
 * DRC_* name it does not know, is reported once on stderr, whatever DRC_LOG
 * says, and the variable's default applies. The defaults are chosen so that
 * a mistake never leaves less protection than setting nothing: every part of
 * the preload on, the hooks on, registrations cached and widened only as by
 * default.
 *
 * The environment is read once, at the first call of any function here
 * (libc's getenv; later setenv calls are not seen). Thread-safe; no call
 * allocates.
 */
#ifndef DRC_CORE_CONFIG_H
#define DRC_CORE_CONFIG_H

#include <stdio.h>

#include "drc.h"   /* DRC_API: libdrc_preload.so reads the table through libdrc.so (drc.map, DRC_PRIVATE_0.1) */

enum drc__env {
    DRC__ENV_PRELOAD,           /* bits: DRC__PRELOAD_* (preload/preload.h) */
    DRC__ENV_MONITOR,           /* enum drc__monitor */
    DRC__ENV_CUPTI_LIB,         /* path */
    DRC__ENV_HOOK_DEBUG,        /* bool */
    DRC__ENV_VERBS,             /* bool */
    DRC__ENV_VERBS_HOST,        /* 0 cache, 1 passthrough */
    DRC__ENV_VERBS_WIDEN,       /* enum drc__widen */
    DRC__ENV_VERBS_REVOKE,      /* bool */
    DRC__ENV_POLICY,            /* enum drc_policy (drc.h) */
    DRC__ENV_MAX_REGIONS,       /* number, 0: no limit */
    DRC__ENV_LOG,               /* enum drc__log */
    DRC__ENV_VERBOSE,           /* bool */
    DRC__ENV_DMABUF_MAPPING,    /* enum drc__mapping_env */
    DRC__ENV_SYSFS_ROOT,        /* path */
    DRC__ENV_REG_THREADS,       /* number */
    DRC__ENV_TORCH_VMM,         /* bool */
    DRC__ENV_LIB,               /* path, read by the Python package only */
    DRC__ENV_COUNT
};

enum drc__log { DRC__LOG_OFF, DRC__LOG_ERROR, DRC__LOG_WARN, DRC__LOG_INFO, DRC__LOG_DEBUG };
enum drc__monitor { DRC__MONITOR_HOOK, DRC__MONITOR_CUPTI, DRC__MONITOR_NONE };
enum drc__widen { DRC__WIDEN_LOCAL, DRC__WIDEN_ALWAYS, DRC__WIDEN_NEVER };
enum drc__mapping_env { DRC__MAPPING_ENV_AUTO, DRC__MAPPING_ENV_PCIE, DRC__MAPPING_ENV_DEFAULT };

/* How a variable was found: unset, set to a value the table accepts, or set to one it does not. */
enum drc__env_state { DRC__ENV_UNSET, DRC__ENV_VALID, DRC__ENV_WRONG };

/*
 * The value of @v: what it was set to, else (unset or wrong) its default.
 * Numbers, bools (0/1), the enums above, DRC_PRELOAD's bits; 0 for a path.
 */
DRC_API long long drc__env(enum drc__env v);

/* A path variable's value; NULL when unset or empty. */
DRC_API const char *drc__env_str(enum drc__env v);

/* enum drc__env_state of @v (DRC_PRELOAD's default depends on it: preload.c). */
DRC_API int drc__env_state(enum drc__env v);

/*
 * The table as README.md shows it (a Markdown table, one row per variable),
 * to @out. tests/core/test_config.c compares it with the README.
 */
void drc__env_print_table(FILE *out);

/*
 * Read the environment again at the next call (and report its mistakes
 * again): for tests that change a variable inside one process. Not for use
 * while another thread reads the table.
 */
void drc__env_reset(void);

/* The name of table entry @i (0..DRC__ENV_COUNT-1), for tests. */
const char *drc__env_name(int i);

#endif
