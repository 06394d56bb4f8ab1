/*
 * The verbs ops table: every libibverbs entry point drc calls, and nothing else.
 *
 * Contract:
 *  - All drc code (the backend, drc_reg_mr, the doctor, the interposer's
 *    forwarding) reaches libibverbs only through drc__verbs(). No file of
 *    drc names an ibv_* function as a call.
 *  - An entry has exactly the prototype and the meaning of the libibverbs
 *    function of the same name (rdma-core 44; reg_mr_iova2 is
 *    ibv_reg_mr_iova2@IBVERBS_1.8, reg_dmabuf_mr ibv_reg_dmabuf_mr@IBVERBS_1.12,
 *    the others @IBVERBS_1.1). An entry may be NULL where the library lacks
 *    the function (an old rdma-core has no reg_dmabuf_mr): callers treat
 *    NULL as "not supported" (-EOPNOTSUPP for dmabuf, -ENOSYS otherwise).
 *  - The table is filled, once, from one of:
 *      libibverbs itself: dlopen("libibverbs.so.1") and a versioned lookup
 *        (the default, on first use: libdrc needs no link-time libibverbs);
 *      the next definitions, inside the preload (preload_verbs.c installs
 *        functions that forward to the definitions after its own), so that
 *        drc's own registrations never re-enter the ibv_reg_mr interposer;
 *      a double in tests: drc__verbs_ops_dlopen() of any library path (the
 *        one double, the loopback provider build/loopnic/libibverbs.so.1 with
 *        its record: src/loopnic/), then drc__verbs_install().
 *  - drc__verbs_install() must happen before any verbs call of drc (the
 *    preload's constructor, a test's setup); it is not meant to race calls.
 *    Reading the table is lock-free and thread-safe.
 *  - Nothing here calls back into drc.
 */
#ifndef DRC_VERBS_OPS_H
#define DRC_VERBS_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "drc.h"   /* DRC_API: the few names libdrc_preload.so needs are exported under DRC_PRIVATE (drc.map) */

struct ibv_context;
struct ibv_device;
struct ibv_device_attr;
struct ibv_mr;
struct ibv_pd;

struct drc__verbs_ops {
    /* the backend and drc_reg_mr */
    int (*query_device)(struct ibv_context *ctx, struct ibv_device_attr *attr);
    struct ibv_mr *(*reg_mr_iova2)(struct ibv_pd *pd, void *addr, size_t length, uint64_t iova, unsigned int access);
    struct ibv_mr *(*reg_dmabuf_mr)(struct ibv_pd *pd, uint64_t offset, size_t length, uint64_t iova, int fd,
                                    int access);
    int (*dereg_mr)(struct ibv_mr *mr);
    /* the interposer forwards these */
    int (*dealloc_pd)(struct ibv_pd *pd);
    int (*rereg_mr)(struct ibv_mr *mr, int flags, struct ibv_pd *pd, void *addr, size_t length, int access);
    /* the doctor; get_device_name also for the dmabuf mapping type of each (GPU, NIC) pair */
    struct ibv_device **(*get_device_list)(int *num);
    void (*free_device_list)(struct ibv_device **list);
    const char *(*get_device_name)(struct ibv_device *dev);
    struct ibv_context *(*open_device)(struct ibv_device *dev);
    int (*close_device)(struct ibv_context *ctx);
    struct ibv_pd *(*alloc_pd)(struct ibv_context *ctx);
};

/*
 * Every entry, once: X(field, name, version). The fill below and the
 * preload's forwarding table are made from it, so that no entry is left out
 * of either (the preload once lacked get_device_name, and every (GPU, NIC)
 * pair got the default dmabuf mapping type under it).
 */
#define DRC__VERBS_OPS(X)                                                                              \
    X(query_device, "ibv_query_device", "IBVERBS_1.1")                                                 \
    X(reg_mr_iova2, "ibv_reg_mr_iova2", "IBVERBS_1.8")                                                 \
    X(reg_dmabuf_mr, "ibv_reg_dmabuf_mr", "IBVERBS_1.12")                                              \
    X(dereg_mr, "ibv_dereg_mr", "IBVERBS_1.1")                                                         \
    X(dealloc_pd, "ibv_dealloc_pd", "IBVERBS_1.1")                                                     \
    X(rereg_mr, "ibv_rereg_mr", "IBVERBS_1.1")                                                         \
    X(get_device_list, "ibv_get_device_list", "IBVERBS_1.1")                                           \
    X(free_device_list, "ibv_free_device_list", "IBVERBS_1.1")                                         \
    X(get_device_name, "ibv_get_device_name", "IBVERBS_1.1")                                           \
    X(open_device, "ibv_open_device", "IBVERBS_1.1")                                                   \
    X(close_device, "ibv_close_device", "IBVERBS_1.1")                                                 \
    X(alloc_pd, "ibv_alloc_pd", "IBVERBS_1.1")

/* The table in use (never NULL; entries may be NULL when no libibverbs could be loaded). */
const struct drc__verbs_ops *drc__verbs(void);

/* Use @ops (copied) from now on; NULL goes back to the default (libibverbs.so.1, filled on next use). */
DRC_API void drc__verbs_install(const struct drc__verbs_ops *ops);

/*
 * Fill @ops with @lookup(arg, name, version) for each entry (rdma-core's
 * version first, so that a versioned lookup never lands on an unversioned
 * definition; @lookup tries the plain name itself if it wants to). Returns 0
 * when the four registration entries (query_device, reg_mr_iova2, dereg_mr,
 * dealloc_pd) were found, else -ENOSYS (the table is filled all the same).
 */
typedef void *drc__verbs_lookup_fn(void *arg, const char *name, const char *version);
DRC_API int drc__verbs_ops_fill(struct drc__verbs_ops *ops, drc__verbs_lookup_fn *lookup, void *arg);

/*
 * Fill @ops from the library at @path (dlopen RTLD_NOW | RTLD_LOCAL; a name
 * without '/' is searched as dlopen does). *@handle gets the handle (for
 * dlclose, or to look up a double's own controls). Returns 0, -ENOENT (the
 * library does not load: dlerror() says why) or -ENOSYS as drc__verbs_ops_fill.
 */
int drc__verbs_ops_dlopen(const char *path, struct drc__verbs_ops *ops, void **handle);

#endif
