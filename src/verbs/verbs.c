/*
 * The verbs backend: a cache whose regions are ibv_mr's of one PD.
 *
 * How GPU memory is registered is decided once per CUDA device and PD, on
 * the first registration of that device (or drc_cache_verbs_method()):
 *
 *   policy            NIC+GPU do dmabuf   else, peermem loaded   else
 *   DMABUF_THEN_PEERMEM  dmabuf           ibv_reg_mr on the VA   -EOPNOTSUPP
 *   DMABUF_ONLY          dmabuf           -EOPNOTSUPP            -EOPNOTSUPP
 *   PEERMEM_ONLY         (not asked)      ibv_reg_mr on the VA   -EOPNOTSUPP
 *
 * "NIC does dmabuf" is the buffer-less probe of drc__verbs_probe_dmabuf();
 * "GPU does dmabuf" is CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED (read where the
 * driver answers; an unanswered query is taken as yes and left to the export).
 * Host memory always goes through ibv_reg_mr_iova2 with iova = address.
 *
 * The device's max_mr_size is read once, at creation, and handed to the
 * cache as its largest region: coalescing never grows a region past it and a
 * larger request fails with -E2BIG, never with a silently truncated MR.
 *
 * The dmabuf mapping type is decided per (GPU, NIC) pair, once per cache and
 * CUDA device, on the first export of that device's memory (export_flags,
 * called by the core before each export): drc__verbs_mapping() below. The
 * export itself is shared by every cache (src/cuda/export.c).
 *
 * libibverbs is reached only through the verbs ops table (ops.h). Each cache
 * keeps the table it was created with, so its MRs are always deregistered by
 * the library that made them.
 */
#include "verbs/verbs.h"

#include <errno.h>
#include <infiniband/verbs.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/cache.h"
#include "core/config.h"
#include "cuda/cuda.h"
#include "verbs/ops.h"
#include "verbs/topo.h"

enum { MAX_DEVICES = 64 };

/* The access bits ibv_reg_dmabuf_mr accepts (the kernel refuses any other with EINVAL). */
#define DMABUF_ACCESS                                                                                  \
    (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC | \
     IBV_ACCESS_RELAXED_ORDERING)

struct verbs {
    struct ibv_pd *pd;
    const struct drc__verbs_ops *ops;   /* the table at creation: MRs go back to the library that made them */
    enum drc_policy policy;
    uint64_t max_mr_size;
    pthread_mutex_t lock;           /* serialises decisions */
    int nic_probed, nic_err;        /* lock: the dmabuf probe of this PD, once */
    int method[MAX_DEVICES];        /* atomic: 0 undecided, else a drc_reg_method or a negative errno */
    unsigned map_flags;             /* DRC_F_DMABUF_PCIE / DRC_F_DMABUF_DEFAULT of the configuration */
    int mapping[MAX_DEVICES];       /* atomic: 0 undecided, else 1 + DRC__MAPPING_* */
    const char *reason[MAX_DEVICES];    /* written before method, under lock */
};

static const char *sysfs_root = "";

void drc__verbs_set_sysfs_root(const char *root)
{
    sysfs_root = root ? root : "";
}

static int module_loaded(const char *name)
{
    char path[512];

    snprintf(path, sizeof(path), "%s/sys/module/%s", sysfs_root, name);
    return access(path, F_OK) == 0;
}

int drc__verbs_peermem_loaded(void)
{
    return module_loaded("nvidia_peermem") || module_loaded("nv_peer_mem");
}

int drc__verbs_probe_dmabuf(struct ibv_pd *pd)
{
    const struct drc__verbs_ops *ops = drc__verbs();
    struct ibv_mr *mr;
    int e;

    if (!ops->reg_dmabuf_mr)
        return -EOPNOTSUPP;     /* rdma-core older than 34: no such verb */
    errno = 0;
    mr = ops->reg_dmabuf_mr(pd, 0, 0, 0, -1, 0);
    if (mr) {
        ops->dereg_mr(mr);  /* a provider that took fd -1: it has the verb, so say yes */
        return 0;
    }
    e = errno;
    if (e == EBADF)
        return 0;
    return e ? -e : -EIO;
}

const char *drc__verbs_advice(int err)
{
    switch (-err) {
    case 0:
        return "dmabuf registration is supported";
    case EOPNOTSUPP:
        return "the RDMA provider cannot register dmabuf MRs: it needs rdma-core >= 34 and a NIC driver with "
               "dmabuf support (mlx5, efa, irdma, bnxt_re...) on Linux >= 5.12";
    case EPROTONOSUPPORT:
        return "the kernel's RDMA stack has no dmabuf MR command: Linux < 5.12, or an out-of-tree OFED "
               "without it: upgrade the kernel (or MLNX_OFED >= 5.5)";
    case ENODEV:
        return "no CUDA driver or GPU";
    default:
        return "the dmabuf probe gave an unexpected error; dmabuf will be tried and the registration decides";
    }
}

static const char *const GPU_NO_DMABUF = "the GPU driver cannot export dmabuf (DMA_BUF_SUPPORTED = 0): install "
                                         "the NVIDIA open kernel module (nvidia-open >= 515) with CUDA >= 11.7";
static const char *const NO_PEERMEM = "nvidia-peermem is not loaded: `modprobe nvidia-peermem`, or make dmabuf work";
static const char *const PEERMEM_ONLY = "policy DRC_PEERMEM_ONLY: ibv_reg_mr on the GPU address through nvidia-peermem";
static const char *const VIA_DMABUF = "dmabuf: cuMemGetHandleForAddressRange + ibv_reg_dmabuf_mr";
static const char *const VIA_PEERMEM = "no dmabuf here, nvidia-peermem loaded: ibv_reg_mr on the GPU address";

static const char *method_name(int m)
{
    switch (m) {
    case DRC_METHOD_DMABUF:
        return "dmabuf";
    case DRC_METHOD_PEERMEM:
        return "peermem";
    case DRC_METHOD_HOST:
        return "host";
    default:
        return "none";
    }
}

/* Decide for @device (lock held). */
static int decide_locked(struct verbs *v, int device, const char **reason)
{
    int gpu_ok = 1, val = 0, nic_ok;

    if (v->policy == DRC_PEERMEM_ONLY) {
        *reason = drc__verbs_peermem_loaded() ? PEERMEM_ONLY : NO_PEERMEM;
        return drc__verbs_peermem_loaded() ? DRC_METHOD_PEERMEM : -EOPNOTSUPP;
    }
    if (!v->nic_probed) {
        v->nic_err = drc__verbs_probe_dmabuf(v->pd);
        v->nic_probed = 1;
    }
    nic_ok = v->nic_err != -EOPNOTSUPP && v->nic_err != -EPROTONOSUPPORT;
    if (drc__cuda_device_attr(device, DRC__CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, &val) == 0)
        gpu_ok = val != 0;
    if (nic_ok && gpu_ok) {
        *reason = v->nic_err ? drc__verbs_advice(v->nic_err) : VIA_DMABUF;
        return DRC_METHOD_DMABUF;
    }
    *reason = !nic_ok ? drc__verbs_advice(v->nic_err) : GPU_NO_DMABUF;
    if (v->policy == DRC_DMABUF_THEN_PEERMEM && drc__verbs_peermem_loaded()) {
        *reason = VIA_PEERMEM;
        return DRC_METHOD_PEERMEM;
    }
    return -EOPNOTSUPP;
}

static int decide(struct verbs *v, int device)
{
    const char *reason = NULL;
    int m;

    if (device < 0)
        return DRC_METHOD_HOST;
    if (device >= MAX_DEVICES)
        return -ENODEV;
    m = __atomic_load_n(&v->method[device], __ATOMIC_ACQUIRE);
    if (m)
        return m;
    pthread_mutex_lock(&v->lock);
    m = v->method[device];
    if (!m) {
        m = decide_locked(v, device, &reason);
        v->reason[device] = reason;
        __atomic_store_n(&v->method[device], m, __ATOMIC_RELEASE);
        if (drc__env(DRC__ENV_VERBOSE))
            fprintf(stderr, "drc: GPU %d: %s (%s)\n", device, m < 0 ? "cannot register" : method_name(m),
                    reason);
    }
    pthread_mutex_unlock(&v->lock);
    return m;
}

/*
 * The mapping type for CUDA device @device's memory on the NIC @ibdev, in this
 * order: the environment (DRC_DMABUF_MAPPING=pcie|default; auto or unset:
 * go on; anything else is reported by config.c and taken as auto), the
 * configuration (DRC_F_DMABUF_PCIE forces PCIe, DRC_F_DMABUF_DEFAULT the
 * default), then the topology: PCIe only for a NIC under the GPU's PCIe
 * switch, read from sysfs at DRC_SYSFS_ROOT (default /sys). *path gets the
 * topology's answer (a drc__pci_path or a negative errno; 0 when not read).
 */
int drc__verbs_mapping(int device, const char *ibdev, unsigned cfg_flags, int *path, const char **why)
{
    long long env = drc__env(DRC__ENV_DMABUF_MAPPING);
    const char *root = drc__env_str(DRC__ENV_SYSFS_ROOT);
    char bus[32];

    *path = 0;
    if (env != DRC__MAPPING_ENV_AUTO) {
        *why = "DRC_DMABUF_MAPPING";
        return drc__topo_mapping(0, env == DRC__MAPPING_ENV_PCIE ? "pcie" : "default");
    }
    if (cfg_flags & (DRC_F_DMABUF_PCIE | DRC_F_DMABUF_DEFAULT)) {
        *why = "configuration flag";
        return (cfg_flags & DRC_F_DMABUF_PCIE) ? DRC__MAPPING_PCIE : DRC__MAPPING_DEFAULT;
    }
    *path = drc__cuda_pci_bus_id(device, bus, sizeof(bus));
    if (!*path)
        *path = ibdev ? drc__topo_path(root ? root : "/sys", bus, ibdev) : -ENODEV;
    *why = *path == DRC__PATH_SWITCH ? "NIC under the GPU's PCIe switch"
           : *path == DRC__PATH_HOST ? "NIC reached through the CPU"
                                     : "topology unknown: the default type";
    return drc__topo_mapping(*path, NULL);
}

/* drc__cache_opts.export_flags: the mapping of this (GPU, NIC) pair, decided once. */
static unsigned verbs_export_flags(void *ctx, int device)
{
    struct verbs *v = ctx;
    const char *why, *name;
    int m, path;

    if (device < 0 || device >= MAX_DEVICES)
        return 0;
    m = __atomic_load_n(&v->mapping[device], __ATOMIC_ACQUIRE);
    if (!m) {
        /* two threads may both decide: the same inputs give the same answer */
        name = v->ops->get_device_name && v->pd->context ? v->ops->get_device_name(v->pd->context->device) : NULL;
        m = 1 + drc__verbs_mapping(device, name, v->map_flags, &path, &why);
        __atomic_store_n(&v->mapping[device], m, __ATOMIC_RELEASE);
        if (drc__env(DRC__ENV_VERBOSE))
            fprintf(stderr, "drc: GPU %d, NIC %s: %s mapping (%s)\n", device, name ? name : "?",
                    drc__topo_mapping_name(m - 1), why);
    }
    return m - 1 == DRC__MAPPING_PCIE ? DRC_F_DMABUF_PCIE : 0;
}

static int verbs_reg(void *ctx, const struct drc_reg_args *a, void **handle, uint32_t *lkey, uint32_t *rkey)
{
    struct verbs *v = ctx;
    struct ibv_mr *mr;
    int m = a->type == DRC_MEM_CUDA ? decide(v, a->device) : DRC_METHOD_HOST;

    if (m < 0)
        return m;
    if (a->len > v->max_mr_size)
        return -E2BIG;      /* the cache keeps regions below this; a guard for a direct caller */
    errno = 0;
    if (m == DRC_METHOD_DMABUF) {
        if (a->dmabuf_fd < 0 || !v->ops->reg_dmabuf_mr)
            return -EOPNOTSUPP;     /* the export said no dmabuf for this memory */
        /*
         * MW_BIND: the kernel takes no such bit for a dmabuf MR. Dropping it would leave the cache
         * recording a grant the MR lacks (drc_region_access, and later hits asking MW_BIND): refuse.
         */
        if (a->access & ~DMABUF_ACCESS)
            return -EOPNOTSUPP;
        mr = v->ops->reg_dmabuf_mr(v->pd, a->dmabuf_offset, a->len, a->start, a->dmabuf_fd, (int)a->access);
    } else {
        /* host memory, or GPU memory that nvidia-peermem pins behind ibv_reg_mr */
        mr = v->ops->reg_mr_iova2(v->pd, (void *)a->start, a->len, a->start, a->access);
    }
    if (!mr)
        return errno ? -errno : -EIO;
    *handle = mr;
    *lkey = mr->lkey;
    *rkey = mr->rkey;
    return 0;
}

static int verbs_dereg(void *ctx, void *handle)
{
    struct verbs *v = ctx;
    int ret;

    ret = v->ops->dereg_mr(handle);
    return ret > 0 ? -ret : ret;
}

/* drc__cache_opts.forked: a parent thread may have held the lock at the fork (the cache is inert now). */
static void verbs_forked(void *ctx)
{
    struct verbs *v = ctx;

    pthread_mutex_init(&v->lock, NULL);
}

static void verbs_release(void *ctx)
{
    struct verbs *v = ctx;

    pthread_mutex_destroy(&v->lock);
    free(v);
}

int drc_cache_create_verbs(struct ibv_pd *pd, const struct drc_config *cfg, drc_cache_t **out)
{
    struct drc_backend be = { .reg = verbs_reg, .dereg = verbs_dereg, .ctx = NULL };
    struct drc__cache_opts o = { 0, verbs_release, verbs_export_flags, verbs_forked };
    const struct drc__verbs_ops *ops = drc__verbs();
    struct drc_config core_cfg;
    struct ibv_device_attr attr;
    struct verbs *v;
    int err;

    if (!pd || !out || (cfg && ((unsigned)cfg->policy > DRC_PEERMEM_ONLY ||
                                (cfg->flags & (DRC_F_DMABUF_PCIE | DRC_F_DMABUF_DEFAULT)) ==
                                    (DRC_F_DMABUF_PCIE | DRC_F_DMABUF_DEFAULT))))
        return -EINVAL;
    if (!ops->query_device || !ops->reg_mr_iova2 || !ops->dereg_mr)
        return -ENOSYS;     /* no libibverbs could be loaded */
    memset(&attr, 0, sizeof(attr));
    err = ops->query_device(pd->context, &attr);
    if (err)
        return err > 0 ? -err : err;
    v = calloc(1, sizeof(*v));
    if (!v)
        return -ENOMEM;
    v->pd = pd;
    v->ops = ops;
    v->policy = cfg ? cfg->policy : DRC_DMABUF_THEN_PEERMEM;
    v->max_mr_size = attr.max_mr_size ? attr.max_mr_size : UINT64_MAX;
    v->map_flags = cfg ? cfg->flags & (DRC_F_DMABUF_PCIE | DRC_F_DMABUF_DEFAULT) : 0;
    pthread_mutex_init(&v->lock, NULL);
    be.ctx = v;
    o.max_len = v->max_mr_size > SIZE_MAX ? 0 : (size_t)v->max_mr_size;
    if (cfg) {
        core_cfg = *cfg;
        core_cfg.flags &= ~(DRC_F_WIDEN_REMOTE | DRC_F_NO_WIDEN | DRC_F_DMABUF_DEFAULT);   /* not the core's */
        cfg = &core_cfg;
    }
    err = drc__cache_create(&be, cfg, &o, out);
    if (err)
        goto err_cache;
    return 0;

err_cache:
    pthread_mutex_destroy(&v->lock);
    free(v);
    return err;
}

static struct verbs *verbs_of(const drc_cache_t *c)
{
    const struct drc_backend *be = c ? drc__cache_backend(c) : NULL;

    return be && be->reg == verbs_reg ? be->ctx : NULL;
}

struct ibv_mr *drc_region_mr(const drc_region_t *r)
{
    return r && verbs_of(drc__region_cache(r)) ? drc_region_handle(r) : NULL;
}

int drc_cache_verbs_method(drc_cache_t *c, int device)
{
    struct verbs *v = verbs_of(c);

    return v ? decide(v, device) : -EINVAL;
}

const char *drc__verbs_reason(drc_cache_t *c, int device)
{
    struct verbs *v = verbs_of(c);

    if (!v)
        return "not a verbs cache";
    if (device < 0)
        return "host memory: ibv_reg_mr_iova2";
    if (device >= MAX_DEVICES || !__atomic_load_n(&v->method[device], __ATOMIC_ACQUIRE))
        return "not decided yet";
    return v->reason[device];
}
