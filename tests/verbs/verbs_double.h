/*
 * The in-process tests' way to the ONE verbs double, the loopback provider
 * (src/loopnic/, built as <build>/loopnic/libibverbs.so.1): dlopen it by path,
 * fill drc's verbs ops table from it and install that table, open two of its
 * devices with a PD each (vd.pd[0], vd.pd[1]: drc's registrations need real
 * PDs), and reach its record (loopnic_record.h) and controls through the same
 * handle.
 */
#ifndef DRC_TEST_VERBS_DOUBLE_H
#define DRC_TEST_VERBS_DOUBLE_H

#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>

#include "helpers.h"
#include "loopnic/loopnic_record.h"
#include "verbs/ops.h"

static struct {
    void *handle;
    struct drc__verbs_ops ops;
    size_t (*ncalls)(void);
    int (*call)(size_t i, struct ibvd_call *out);
    void (*reset)(void);
    size_t (*live)(void);
    int (*lkey_live)(uint32_t lkey);
    size_t (*count)(enum ibvd_op op);
    void (*fail_next_reg)(int err);
    void (*set_probe_errno)(int err);
    void (*set_dereg_ret)(int ret);
    void (*set_query)(int ret, unsigned long long max_mr_size);
    int (*add_device_memory)(uint64_t start, uint64_t len);
    struct ibv_device **devs;
    struct ibv_context *ctx[2];   /* loop0 and loop1 */
    struct ibv_pd *pd[2];         /* one PD on each */
} vd;

/* Load the library at @path into drc's table; 0 or -1 (with a message). */
static inline int vd_load_path(const char *path)
{
    if (drc__verbs_ops_dlopen(path, &vd.ops, &vd.handle)) {
        fprintf(stderr, "cannot use %s as libibverbs: %s\n", path, vd.handle ? "entry points missing" : dlerror());
        return -1;
    }
    drc__verbs_install(&vd.ops);
#define VD_SYM(field, name) (*(void **)&vd.field = dlsym(vd.handle, name))
    VD_SYM(ncalls, "ibvd_ncalls");
    VD_SYM(call, "ibvd_call");
    VD_SYM(reset, "ibvd_reset");
    VD_SYM(live, "ibvd_live");
    VD_SYM(lkey_live, "ibvd_lkey_live");
    VD_SYM(count, "ibvd_count");
    VD_SYM(fail_next_reg, "ibvd_fail_next_reg");
    VD_SYM(set_probe_errno, "ibvd_set_probe_errno");
    VD_SYM(set_dereg_ret, "ibvd_set_dereg_ret");
    VD_SYM(set_query, "ibvd_set_query");
    VD_SYM(add_device_memory, "loopnic_add_device_memory");
#undef VD_SYM
    return 0;
}

/* Two devices of the provider, a PD on each; 0 or -1. */
static inline int vd_open_pds(void)
{
    struct ibv_device **(*get_list)(int *);
    struct ibv_context *(*open_dev)(struct ibv_device *);
    struct ibv_pd *(*alloc_pd)(struct ibv_context *);
    int n = 0;

    *(void **)&get_list = dlsym(vd.handle, "ibv_get_device_list");
    *(void **)&open_dev = dlsym(vd.handle, "ibv_open_device");
    *(void **)&alloc_pd = dlsym(vd.handle, "ibv_alloc_pd");
    if (!get_list || !open_dev || !alloc_pd || !(vd.devs = get_list(&n)) || n < 2)
        return -1;
    for (int i = 0; i < 2; i++)
        if (!(vd.ctx[i] = open_dev(vd.devs[i])) || !(vd.pd[i] = alloc_pd(vd.ctx[i])))
            return -1;
    return 0;
}

/* The provider of this build, with its record, and two PDs (a cmocka group setup). */
static inline int vd_load(void **state)
{
    char build[PATH_MAX], path[PATH_MAX + 32];

    (void)state;
    if (find_build_dir(build, sizeof(build), "loopnic/libibverbs.so.1")) {
        fprintf(stderr, "no loopnic/libibverbs.so.1 above this test: build it with make\n");
        return -1;
    }
    snprintf(path, sizeof(path), "%s/loopnic/libibverbs.so.1", build);
    if (vd_load_path(path))
        return -1;
    if (!vd.call || !vd.fail_next_reg || !vd.add_device_memory || vd_open_pds()) {
        fprintf(stderr, "%s is not the loopback provider with its record\n", path);
        return -1;
    }
    return 0;
}

/* The @n-th call of kind @op recorded since the last reset (0 if there is none). */
static inline int vd_nth(enum ibvd_op op, int n, struct ibvd_call *out)
{
    size_t i;

    for (i = 0; vd.call(i, out); i++)
        if (out->op == op && n-- == 0)
            return 1;
    return 0;
}

/* Registrations (VA and dmabuf) in order: the @n-th since the last reset. */
static inline int vd_reg(int n, struct ibvd_call *out)
{
    size_t i;

    for (i = 0; vd.call(i, out); i++)
        if ((out->op == IBVD_REG_VA || out->op == IBVD_REG_DMABUF) && n-- == 0)
            return 1;
    return 0;
}

#endif
