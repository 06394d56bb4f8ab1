/*
 * drc over libibverbs: caches whose regions are ibv_mr's of one PD, GPU memory
 * registered through DMA-BUF, and drc_reg_mr(), the drop-in ibv_reg_mr for a
 * transfer engine. Link with -ldrc -libverbs.
 */
#ifndef DRC_VERBS_H
#define DRC_VERBS_H

#include <drc.h>

struct ibv_pd;
struct ibv_mr;

#ifdef __cplusplus
extern "C" {
#endif

/*
 * A cache whose backend registers with libibverbs on @pd: GPU memory through
 * ibv_reg_dmabuf_mr (or, per cfg->policy, ibv_reg_mr with nvidia-peermem),
 * host memory through ibv_reg_mr_iova2. The method is decided once per GPU
 * and reported by drc_cache_verbs_method(). Regions never exceed the device's
 * max_mr_size. Returns 0, -EINVAL (NULL pd/out, an unknown policy, flag or
 * comp_mask bit: see drc.h's ABI rule), -ENOMEM or the error of ibv_query_device.
 */
DRC_API int drc_cache_create_verbs(struct ibv_pd *pd, const struct drc_config *cfg, drc_cache_t **out);

/* The ibv_mr of a region of a verbs cache (NULL for other caches). Thread-safe. */
DRC_API struct ibv_mr *drc_region_mr(const drc_region_t *r);

enum drc_reg_method { DRC_METHOD_NONE = 0, DRC_METHOD_DMABUF = 1, DRC_METHOD_PEERMEM = 2, DRC_METHOD_HOST = 3 };

/*
 * How the verbs cache @c registers memory of CUDA device @device (-1: host
 * memory), deciding it now if no registration has yet. Returns a
 * drc_reg_method value, or a negative errno saying what is missing
 * (-EOPNOTSUPP: the NIC or kernel has no dmabuf and peermem is not allowed or
 * not loaded). Thread-safe.
 */
DRC_API int drc_cache_verbs_method(drc_cache_t *c, int device);

/*
 * The two-line patch for a transfer engine: a drop-in ibv_reg_mr that goes
 * through a per-PD drc cache. The returned ibv_mr is the caller's own (addr
 * and length as asked, keys of the cached MR); release it with drc_dereg_mr().
 * drc_reg_mr returns NULL with errno set on failure. Thread-safe.
 */
DRC_API struct ibv_mr *drc_reg_mr(struct ibv_pd *pd, void *addr, size_t len, int access);
DRC_API int drc_dereg_mr(struct ibv_mr *mr);
/*
 * drc_dereg_mr returns 0 or a negative errno; an MR that drc_reg_mr did not
 * hand out (including ones it passed straight to ibv_reg_mr because of access
 * bits outside DRC_ACCESS_MASK) is passed to ibv_dereg_mr.
 *
 * drc_pd_release: deregister the cached MRs of @pd and drop its cache; call it
 * before ibv_dealloc_pd (which fails with EBUSY while cached MRs exist).
 * Returns 0 (also when @pd has no cache), -EINVAL for NULL, or -EBUSY while an
 * MR from drc_reg_mr on @pd is not yet deregistered. Must not race
 * drc_reg_mr on the same @pd.
 */
DRC_API int drc_pd_release(struct ibv_pd *pd);

#ifdef __cplusplus
}
#endif
#endif /* DRC_VERBS_H */
