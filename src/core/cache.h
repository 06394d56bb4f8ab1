/*
 * What the other files of src/ may ask of a cache beyond the public API.
 */
#ifndef DRC_CACHE_H
#define DRC_CACHE_H

#include <stddef.h>

#include "drc.h"

struct drc__cache_opts {
    size_t max_len;               /* largest region the backend accepts (verbs: max_mr_size); 0 = no limit */
    void (*release)(void *ctx);   /* called by drc_cache_destroy once every region is deregistered */
    /*
     * The drc__mem_export() flags for CUDA memory of @device on this backend
     * (DRC_F_DMABUF_PCIE for the PCIe mapping type, else 0), asked on each
     * miss before the export, with no lock held; the verbs backend decides
     * per (GPU, NIC) pair. NULL: the cache's own DRC_F_DMABUF_PCIE flag.
     */
    unsigned (*export_flags)(void *ctx, int device);
    /*
     * In a fork() child, when the cache is made inert (drc__cache_forked):
     * make the backend context's own locks anew; only this thread exists.
     * NULL: the backend has none.
     */
    void (*forked)(void *ctx);
};

/*
 * drc_get(), but a miss on CUDA memory registers the whole allocation around
 * [addr, addr+len) (core/mem.h's alloc_lo/alloc_hi, found by the miss's
 * classification), unless that is larger than the backend allows; a hit is
 * drc_get's, looked up by the range asked. drc_reg_mr's widening: whether a
 * registration may be widened is its rule (src/verbs/regmr.c).
 */
int drc__get_widened(drc_cache_t *c, const void *addr, size_t len, unsigned access, drc_region_t **out);

/*
 * drc_invalidate() without releasing the device layer's exports (drc_notify_free() does that once),
 * and with no look at the hint slot first (a free event's slot is cold: cache.c, cache_invalidate).
 */
int drc__cache_invalidate(drc_cache_t *c, const void *addr, size_t len);

/* drc_cache_create with backend limits; @o may be NULL. */
int drc__cache_create(const struct drc_backend *be, const struct drc_config *cfg,
                      const struct drc__cache_opts *o, drc_cache_t **out);

/* The backend a cache was created with (its ctx identifies e.g. a verbs cache). */
const struct drc_backend *drc__cache_backend(const drc_cache_t *c);

/* notify.c's fork child handler: make an inherited cache inert (see cache.c). */
void drc__cache_forked(drc_cache_t *c);

/* The cache a region belongs to. */
drc_cache_t *drc__region_cache(const drc_region_t *r);

/*
 * drc_reg_mr's hit (src/verbs/regmr.c), one call each way. drc__get_view:
 * drc__get_widened() unless @access shares a bit with @no_widen (bit 31,
 * never in an access: never widen), else drc_get(); the region in v->region, and
 * on success what the caller's ibv_mr copies from it: the backend's handle
 * as drc_region_handle() gives it (NULL once revoked), the keys, the memory
 * type. drc__region_put: drc_put() on the region's own cache.
 */
struct drc__region_view {
    drc_region_t *region;
    void *handle;
    uint32_t lkey, rkey;
    enum drc_mem_type type;
};
#define DRC__NO_WIDEN_EVER (1u << 31)
int drc__get_view(drc_cache_t *c, const void *addr, size_t len, unsigned access, unsigned no_widen,
                  struct drc__region_view *v);
int drc__region_put(drc_region_t *r);

/*
 * Debug assertions (DRC_DEBUG builds: the sanitizer, fuzz and test builds).
 * DRC_ASSERT aborts with the line whatever NDEBUG says. drc__lock_depth
 * counts the cache locks this thread holds: a call out of drc (backend,
 * CUDA, allocator) or into a cache from outside asserts it is 0, which is
 * the rule "nothing allocates, frees or calls out with c->lock held".
 */
#ifdef DRC_DEBUG
void drc__assert_fail(const char *what, const char *file, int line) __attribute__((noreturn));
extern __thread int drc__lock_depth;
#define DRC_ASSERT(x) ((x) ? (void)0 : drc__assert_fail(#x, __FILE__, __LINE__))
#else
#define DRC_ASSERT(x) ((void)0)
#endif
#define DRC_ASSERT_NO_LOCK() DRC_ASSERT(drc__lock_depth == 0)

#endif
