/*
 * The verbs backend (verbs.c): what the doctor and the tests may ask beyond
 * drc_cache_create_verbs(), drc_region_mr() and drc_cache_verbs_method().
 */
#ifndef DRC_VERBS_LAYER_H
#define DRC_VERBS_LAYER_H

#include "drc_verbs.h"

/*
 * Does the NIC of @pd register dmabuf MRs? Probed without a buffer:
 * ibv_reg_dmabuf_mr(pd, 0, 0, 0, -1, 0) fails with EBADF where it does (the
 * fd is looked at after the provider and kernel accepted the call) and with
 * EOPNOTSUPP or EPROTONOSUPPORT where it does not. Returns 0 (supported),
 * -EOPNOTSUPP / -EPROTONOSUPPORT (not), or another negative errno the probe
 * gave (unexpected: drc then tries dmabuf and lets the registration decide).
 */
int drc__verbs_probe_dmabuf(struct ibv_pd *pd);

/* 1 if nvidia-peermem (or the older nv_peer_mem) is loaded, as /sys/module shows. */
int drc__verbs_peermem_loaded(void);

/* Tests: read /sys/module under @root instead of "/" (NULL restores "/"). Not thread-safe. */
void drc__verbs_set_sysfs_root(const char *root);

/* What to do about a failed dmabuf probe or fallback decision @err (a negative errno). */
const char *drc__verbs_advice(int err);

/*
 * Why a verbs cache registers CUDA device @device as it does (after
 * drc_cache_verbs_method() decided): a sentence, static or owned by the cache.
 */
const char *drc__verbs_reason(drc_cache_t *c, int device);

/*
 * The dmabuf mapping type (DRC__MAPPING_*) of CUDA device @device's memory
 * on the RDMA device @ibdev, as a verbs cache with DRC_F_* @cfg_flags decides
 * it; *path: the topology's answer (0: not read), *why: a phrase. For the
 * doctor and the tests; see verbs.c.
 */
int drc__verbs_mapping(int device, const char *ibdev, unsigned cfg_flags, int *path, const char **why);

#endif
