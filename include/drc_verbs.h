/*
 * drc over libibverbs: caches whose regions are ibv_mr's of one PD, GPU memory
 * registered through DMA-BUF, and drc_reg_mr(), the drop-in ibv_reg_mr for a
 * transfer engine. Link with -ldrc; drc loads libibverbs.so.1 itself (dlopen)
 * on the first verbs call, so the process uses the same libibverbs as the
 * caller that made the PD.
 *
 * Errors follow drc.h: int calls return 0 or a negative errno, drc_reg_mr
 * returns NULL and sets errno. Everything here is thread-safe unless its
 * comment says otherwise.
 *
 * fork(): whatever the parent's threads were doing at the fork, no call here
 * waits in the child for a lock they held. In the child, drc_dereg_mr of an
 * MR the parent got from drc_reg_mr releases it with no provider call (the
 * registration is the parent's, as drc.h says of every inherited cache);
 * drc_reg_mr on any PD, the parent's included, uses a cache of the child's
 * own, and asks the provider what ibv_reg_mr would.
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
 * drc_config.flags bits of the verbs layer (bits 16 and up; the core's are
 * below). The widening bits only change drc_reg_mr (see drc_reg_mr_configure);
 * a verbs cache of drc_cache_create_verbs ignores them.
 *
 * Widening: drc_reg_mr registers a GPU range as its whole allocation (the
 * range cuMemGetAddressRange gives), so that thousands of tensors carved
 * from one allocation cost one NIC registration. A peer that holds the rkey
 * can then reach the whole allocation, with every access bit of the MR. So
 * by default only registrations asking no remote access (none of
 * REMOTE_READ, REMOTE_WRITE, REMOTE_ATOMIC, MW_BIND) are widened: their keys
 * never leave the process. A registration asking remote access covers the
 * pages of the range asked (merged only with overlapping registrations of
 * the same memory, as the core allows).
 */
#define DRC_F_WIDEN_REMOTE (1u << 16)  /* widen remote-access GPU registrations too (opt-in: see above) */
#define DRC_F_NO_WIDEN     (1u << 17)  /* never widen, not even local-only registrations */

/*
 * The dmabuf mapping type of GPU memory, per (GPU, NIC) pair (verbs caches
 * and drc_reg_mr). A CUDA dmabuf encodes one DMA path: a NIC under the GPU's
 * PCIe switch needs the PCIe type, a NIC reached through the CPU the default
 * one, and the wrong one registers fine and fails at transfer time. By
 * default drc decides from the PCI topology in sysfs (the GPU's bus id from
 * cuDeviceGetPCIBusId, the NIC's /sys/class/infiniband/<dev>/device): PCIe
 * only for a NIC under the same switch. DRC_F_DMABUF_PCIE (drc.h) forces the
 * PCIe type for every pair, DRC_F_DMABUF_DEFAULT the default type. The
 * environment DRC_DMABUF_MAPPING=pcie|default|auto overrides both. Where the
 * driver answers the PCIe type with NOT_SUPPORTED or INVALID_VALUE (a driver
 * older than the flag), the export (never the registration) is retried with
 * the default type. `drc doctor` prints the
 * decision per pair.
 */
#define DRC_F_DMABUF_DEFAULT (1u << 18)  /* force the default dmabuf mapping type (see above) */

/*
 * A cache whose backend registers with libibverbs on @pd: GPU memory through
 * ibv_reg_dmabuf_mr (or, per cfg->policy, ibv_reg_mr with nvidia-peermem),
 * host memory through ibv_reg_mr_iova2. The method is decided once per GPU
 * and reported by drc_cache_verbs_method(). Regions never exceed the device's
 * max_mr_size.
 *
 * Access: a dmabuf MR cannot be bound to a memory window (the kernel takes
 * no MW_BIND for it), so a drc_get() asking IBV_ACCESS_MW_BIND on GPU memory
 * that registers through dmabuf fails with -EOPNOTSUPP instead of returning
 * a region that lacks it; drc_region_access() is what the MR allows.
 *
 * Returns 0, -EINVAL (NULL @pd or @out, an unknown policy, flag or comp_mask
 * bit: see drc.h's ABI rule; both DRC_F_DMABUF_PCIE and DRC_F_DMABUF_DEFAULT), -ENOMEM, -ENOSYS
 * (no libibverbs.so.1 could be loaded) or the error of ibv_query_device.
 * Thread-safe.
 */
DRC_API int drc_cache_create_verbs(struct ibv_pd *pd, const struct drc_config *cfg, drc_cache_t **out);

/*
 * The ibv_mr of a region of a verbs cache (NULL for NULL or a region of
 * another cache). NULL too once the region is revoked (DRC_F_REVOKE): the
 * provider freed that ibv_mr in ibv_dereg_mr; drc_region_lkey()/rkey() still
 * give its (dead) keys. Thread-safe.
 */
DRC_API struct ibv_mr *drc_region_mr(const drc_region_t *r);

enum drc_reg_method { DRC_METHOD_NONE = 0, DRC_METHOD_DMABUF = 1, DRC_METHOD_PEERMEM = 2, DRC_METHOD_HOST = 3 };

/*
 * How the verbs cache @c registers memory of CUDA device @device (-1: host
 * memory), deciding it now if no registration has yet. Returns a
 * drc_reg_method value, or a negative errno: -EINVAL (@c is no verbs cache),
 * -ENODEV (@device out of range), -EOPNOTSUPP (the NIC or kernel has no
 * dmabuf and peermem is not allowed or not loaded). Thread-safe.
 */
DRC_API int drc_cache_verbs_method(drc_cache_t *c, int device);

/*
 * drc_reg_mr: the two-line patch for a transfer engine, a drop-in
 * ibv_reg_mr that goes through a per-PD drc cache (made on the PD's first
 * registration). The returned ibv_mr is the caller's own: addr and length as
 * asked; context, pd, handle, lkey and rkey of the cached MR, which covers at
 * least the range. Overlapping and repeated registrations of the same memory
 * share one NIC MR when they ask the same access bits; a registration asking
 * other bits gets an MR of its own, so that its keys allow exactly what it
 * asked (a LOCAL_WRITE-only MR's rkey refuses every remote access, whoever
 * else registered the memory for remote writes) and may be given to a peer
 * like any ibv_reg_mr key. DRC_F_ACCESS_SUPERSET in drc_reg_mr_configure()
 * opts into sharing across bits (drc.h, DRC_ACCESS_REMOTE): fewer NIC MRs
 * where one program registers the same memory with several access sets,
 * but then a local-only registration's rkey must never leave the process.
 * GPU memory may be widened to its allocation (see
 * DRC_F_WIDEN_REMOTE). Access bits outside DRC_ACCESS_MASK (ON_DEMAND,
 * ZERO_BASED...) go straight to ibv_reg_mr_iova2, uncached.
 * Returns the MR, or NULL with errno: EINVAL (NULL @pd, @len 0), ENOMEM,
 * E2BIG (larger than max_mr_size), EOPNOTSUPP (GPU memory this machine
 * cannot register) or the registration's own error. Thread-safe.
 *
 * drc_dereg_mr: release an MR of drc_reg_mr (one reference; the NIC MR stays
 * cached while its memory lives). With DRC_F_REVOKE in the configuration, a
 * free of the memory deregisters the NIC MR at once even while callers hold
 * it: their ibv_mr stays valid for drc_dereg_mr/ibv_dereg_mr, its keys are
 * dead (a later transfer fails with a protection error). An MR that drc_reg_mr did not hand out
 * (including ones it passed through) goes to ibv_dereg_mr. Returns 0, -EINVAL
 * for NULL, or the deregistration's error. Thread-safe; each MR once.
 *
 * Never give an MR of drc_reg_mr to ibv_rereg_mr or ibv_dereg_mr: it is not
 * the provider's (the ibv_reg_mr interposer refuses the first and routes the
 * second here).
 */
DRC_API struct ibv_mr *drc_reg_mr(struct ibv_pd *pd, void *addr, size_t len, int access);
DRC_API int drc_dereg_mr(struct ibv_mr *mr);

/*
 * drc_reg_mr_multi: register [addr, addr+len) on each of the @n PDs @pds (one
 * per NIC) at once: mrs[i] = drc_reg_mr(pds[i], addr, len, access), made in
 * parallel by up to 8 threads (the caller's and up to 7 it starts and joins
 * before returning; where no thread can be started, serially; the
 * environment DRC_REG_THREADS=1..7 lowers the bound, 1 for a provider
 * that serialises registrations anyway). GPU memory is
 * exported once for all of them (one dmabuf per allocation and mapping type,
 * shared by every PD). All or nothing: on any failure every MR already made
 * is released (drc_dereg_mr: one reference each, nothing else), every mrs[i]
 * is NULL, and the first failing PD's error (in @pds order) is returned.
 * Other callers' MRs of the same memory, which some of these registrations
 * may have hit, and the shared export are left as they were; the NIC MRs
 * this call registered stay cached, idle, until the memory is freed or
 * drc_pd_release.
 * Returns 0, -EINVAL (NULL @pds or @mrs, a NULL PD, @n outside 1..1024,
 * @len 0), -ENOMEM, or a registration's error as drc_reg_mr gives it in
 * errno (negated). Release each MR with drc_dereg_mr. Thread-safe; the same
 * PD may appear twice (two MRs of one cached registration).
 */
DRC_API int drc_reg_mr_multi(struct ibv_pd **pds, int n, void *addr, size_t len, int access, struct ibv_mr **mrs);

/*
 * drc_pd_release: deregister the cached MRs of @pd and drop its cache; call it
 * before ibv_dealloc_pd (which fails with EBUSY while cached MRs exist).
 * Returns 0 (also when @pd has no cache), -EINVAL for NULL, or -EBUSY while an
 * MR from drc_reg_mr on @pd is not yet deregistered. Must not race
 * drc_reg_mr on the same @pd.
 */
DRC_API int drc_pd_release(struct ibv_pd *pd);

/*
 * The configuration of the per-PD caches drc_reg_mr makes from now on
 * (policy, limits, core flags, and DRC_F_WIDEN_REMOTE / DRC_F_NO_WIDEN, which
 * apply at once). NULL restores the defaults. Returns 0, or -EINVAL (unknown
 * policy, both widening flags, both mapping flags). Not thread-safe against drc_reg_mr: call it
 * before the first registration.
 */
DRC_API int drc_reg_mr_configure(const struct drc_config *cfg);

#ifdef __cplusplus
}
#endif
#endif /* DRC_VERBS_H */
