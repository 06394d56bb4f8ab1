/*
 * drc — a registration cache for RDMA that registers GPU memory through DMA-BUF.
 *
 * One header is the whole API. Every call that returns int returns 0 (or a
 * count, where documented) on success and a negative errno on failure;
 * drc_strerror() turns such a value into a sentence with advice.
 *
 * Handles are opaque. A drc_region_t returned by drc_get() stays valid memory
 * until the matching drc_put(), even if the range it covers is invalidated in
 * the meantime: invalidation only stops later lookups from returning it
 * (drc_region_valid() then reads 0) and defers its deregistration to the last
 * drc_put().
 *
 * Unless a function says otherwise it is thread-safe: any thread may call it
 * on any cache at any time, except that drc_cache_destroy() must not race
 * other calls on the same cache.
 *
 * fork(): the registrations belong to the parent. In a child every cache
 * inherited from the parent is inert: drc_notify_free() and the hooks ignore
 * it, drc_get() fails with -ESTALE, drc_put() and drc_invalidate() do nothing
 * and return 0, drc_cache_destroy() frees drc's own memory only; no backend
 * call is ever made for it (a child must not deregister the parent's MRs),
 * and its locks are made anew (another parent thread may have held them at
 * the fork). Caches created in the child work as usual.
 */
#ifndef DRC_H
#define DRC_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DRC_API __attribute__((visibility("default")))

struct ibv_pd;
struct ibv_mr;

typedef struct drc_cache  drc_cache_t;   /* opaque */
typedef struct drc_region drc_region_t;  /* opaque: one registered range */

enum drc_mem_type { DRC_MEM_HOST = 0, DRC_MEM_CUDA = 1 };

/*
 * Access bits are the IBV_ACCESS_* values of <infiniband/verbs.h>; drc accepts
 * LOCAL_WRITE, REMOTE_WRITE, REMOTE_READ, REMOTE_ATOMIC, MW_BIND and
 * RELAXED_ORDERING. Any other bit (ZERO_BASED, ON_DEMAND, HUGETLB, unknown
 * bits) makes drc_get() fail with -EINVAL: those change what a registration
 * means, so one cached region could not serve them all.
 */
#define DRC_ACCESS_MASK 0x0010001fu

/*
 * An rkey grants only what was asked. The remote bits (REMOTE_WRITE,
 * REMOTE_READ, REMOTE_ATOMIC) decide what a peer holding the rkey may do, so
 * a request with any remote bit gets only a region whose remote bits are
 * exactly those asked, and a miss joins only regions with the same remote
 * bits: a region's rkey never allows more, anywhere in it, than was asked by
 * the requests it was registered for. A request with no remote bit (it has
 * use only for the lkey) may share a region with remote bits; its rkey must
 * not be given to a peer. The local bits (LOCAL_WRITE, MW_BIND,
 * RELAXED_ORDERING) may be more than asked, and a merge takes their union.
 */
#define DRC_ACCESS_REMOTE 0x0000000eu

/* What a backend is asked to register. */
struct drc_reg_args {
    uintptr_t start;           /* page-aligned start of the region */
    size_t    len;             /* page-aligned length */
    enum drc_mem_type type;
    int       device;          /* CUDA ordinal, -1 for host memory */
    int       dmabuf_fd;       /* -1 unless the memory was exported as a dmabuf */
    uint64_t  dmabuf_offset;   /* start - export base, page offset kept */
    unsigned  access;          /* IBV_ACCESS_* bits */
};

/*
 * A registration backend. reg() registers one region and returns an opaque
 * handle plus its keys; dereg() releases a handle that reg() returned. Both
 * return 0 or a negative errno. They are never called with a cache lock held,
 * so they may block, and they may call drc_invalidate() or drc_notify_free()
 * (on any range) without deadlock. The dmabuf fd in the arguments belongs to
 * the cache: the backend must not close it, and must dup() it if it keeps it
 * past reg()'s return (an ibv_mr does not need it to stay open).
 */
struct drc_backend {
    int  (*reg)(void *ctx, const struct drc_reg_args *a, void **handle, uint32_t *lkey, uint32_t *rkey);
    int  (*dereg)(void *ctx, void *handle);   /* both return 0 or a negative errno */
    void *ctx;
};

/* drc_config.flags */
#define DRC_F_NO_MERGE    (1u << 0)  /* never coalesce overlapping registrations */
#define DRC_F_VALIDATE    (1u << 1)  /* re-check the CUDA buffer id on every CUDA hit */
#define DRC_F_DMABUF_PCIE (1u << 2)  /* ask for the PCIe dmabuf mapping type, falling back to the default */

/* How a verbs cache registers GPU memory; see drc_cache_create_verbs(). */
enum drc_policy {
    DRC_DMABUF_THEN_PEERMEM = 0,  /* default: dmabuf, else ibv_reg_mr if nvidia-peermem is loaded */
    DRC_DMABUF_ONLY         = 1,
    DRC_PEERMEM_ONLY        = 2,
};

struct drc_config {            /* NULL means defaults; zero-initialise what you do not set */
    size_t   max_regions;      /* idle regions beyond this are evicted, least recently used first; 0 = no limit */
    size_t   max_bytes;        /* likewise for registered bytes; 0 = no limit */
    unsigned flags;            /* DRC_F_* */
    enum drc_policy policy;    /* verbs caches only */
};

/*
 * Create a cache in front of a registration backend.
 * @be   copied; its functions are called from whichever thread misses or frees.
 * @cfg  NULL for defaults (no limits, coalescing on).
 * Returns 0, -EINVAL (NULL be/out, missing reg/dereg, unknown flags) or -ENOMEM.
 * The cache subscribes to drc_notify_free(). Thread-safe.
 */
DRC_API int  drc_cache_create(const struct drc_backend *be, const struct drc_config *cfg, drc_cache_t **out);

/*
 * Deregister every idle region and free the cache.
 * Returns 0, -EINVAL for NULL, or -EBUSY (and frees nothing) while any region
 * is referenced or a registration is in flight. Must not race other calls on
 * the same cache.
 */
DRC_API int  drc_cache_destroy(drc_cache_t *c);

/*
 * Find or register a region covering [addr, addr+len) with at least the
 * IBV_ACCESS_* bits in @access (and exactly its DRC_ACCESS_REMOTE bits, if it
 * has any), and take a reference on it.
 * A hit takes no lock. A miss registers [addr rounded down to the host page,
 * addr+len rounded up), coalesced with every overlapping valid region of the
 * same memory and the same remote bits (unless DRC_F_NO_MERGE, or unless the
 * union would be more than twice the request's own page range: then the
 * request is registered alone, overlapping its neighbours, so that buffers
 * packed side by side never re-register a growing union), through the
 * backend, without a lock
 * held. Never returns a region that an invalidation begun before the lookup
 * removed, nor one whose registration raced an invalidation of its range.
 * Returns 0 and *out, or -EINVAL (NULL cache, address or out, len 0, a range
 * that overflows or whose page-rounded form is the whole address space,
 * access bits outside DRC_ACCESS_MASK: the backend is not called), -ENOMEM, -E2BIG (larger than the backend allows), or the
 * backend's error (nothing is cached then). Thread-safe.
 */
DRC_API int  drc_get(drc_cache_t *c, const void *addr, size_t len, unsigned access, drc_region_t **out);

/*
 * Drop a reference taken by drc_get(). The region stays cached while valid;
 * an invalidated or superseded region is deregistered here on its last put.
 * Returns 0, -EINVAL for NULL or for a region with no reference left (the
 * cache is unchanged then), or the backend's dereg error (the region is gone
 * all the same). Thread-safe.
 */
DRC_API int  drc_put(drc_cache_t *c, drc_region_t *r);

/*
 * Invalidate [addr, addr+len): when this returns, no drc_get() in any thread
 * returns a region overlapping it; idle ones are deregistered before it
 * returns, referenced ones (superseded ones too) on their last drc_put().
 * Call it before the memory is freed. Does not allocate. Where nothing is
 * registered in the range it takes no lock. Where another thread holds the
 * cache's lock, the range is handed to that thread instead of waiting for
 * it: the guarantee above holds all the same, but the idle regions are then
 * deregistered by that thread as it releases the lock, and 0 is returned.
 * Returns the number of valid regions it invalidated (>= 0), or -EINVAL
 * (NULL cache, overflow; len 0 invalidates nothing). Thread-safe, and safe to
 * call from a backend's reg() or dereg().
 */
DRC_API int  drc_invalidate(drc_cache_t *c, const void *addr, size_t len);

/*
 * Invalidate the region @r, which the caller holds (a reference from
 * drc_get() not yet put): when this returns no drc_get() in any thread
 * returns it, and it is deregistered on its last drc_put() (the caller's,
 * or another holder's). The cheap way to drop a registration one knows:
 * no range search. Other regions over the same memory are left alone.
 * Returns 1 if @r was valid, 0 if it was already invalid, or -EINVAL (NULL,
 * @r not of @c, or @r not held). Does not allocate. Thread-safe, and safe to
 * call from a backend's reg() or dereg().
 */
DRC_API int  drc_region_invalidate(drc_cache_t *c, drc_region_t *r);

/* 1 while the region may still be returned by drc_get(), 0 once invalidated. Thread-safe. */
DRC_API int  drc_region_valid(const drc_region_t *r);

/* The page-aligned range the region registered. Thread-safe. */
DRC_API void drc_region_bounds(const drc_region_t *r, uintptr_t *start, size_t *len);

DRC_API uint32_t drc_region_lkey(const drc_region_t *r);      /* the backend's keys and handle */
DRC_API uint32_t drc_region_rkey(const drc_region_t *r);
DRC_API void    *drc_region_handle(const drc_region_t *r);
DRC_API enum drc_mem_type drc_region_type(const drc_region_t *r);
DRC_API unsigned drc_region_access(const drc_region_t *r);    /* the IBV_ACCESS_* bits registered */

struct drc_stats {
    uint64_t hits, misses, merges, invalidated, evicted, regs, deregs;  /* events since create */
    uint64_t regions, bytes, in_use;  /* now: regions a lookup can find, their bytes, regions referenced */
};
/*
 * A snapshot of the counters: O(1), takes no lock. Each counter is exact
 * and the set is not one instant; in_use is exact at rest and may be off
 * by the threads in the middle of a get or put. @c NULL zeroes @s.
 * Thread-safe.
 */
DRC_API void drc_cache_stats(drc_cache_t *c, struct drc_stats *s);

/*
 * A sentence for a negative errno returned by drc, with advice where drc
 * knows some (-EIO may come from CUDA or from the backend: it names both).
 * The text is constant static storage, never NULL. Thread-safe (it never
 * calls strerror()).
 */
DRC_API const char *drc_strerror(int err);

/* ---- Verbs ------------------------------------------------------------- */

/*
 * A cache whose backend registers with libibverbs on @pd: GPU memory through
 * ibv_reg_dmabuf_mr (or, per cfg->policy, ibv_reg_mr with nvidia-peermem),
 * host memory through ibv_reg_mr_iova2. The method is decided once per GPU
 * and reported by drc_cache_verbs_method(). Regions never exceed the device's
 * max_mr_size. Returns 0, -EINVAL, -ENOMEM or the error of ibv_query_device.
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

/* ---- Invalidation from the allocator ----------------------------------- */

/*
 * Invalidate [addr, addr+len) in every live cache of the process. Call it
 * before the memory is really freed. Cheap when nothing is registered there,
 * never allocates, takes no lock an allocator could hold, and may be
 * re-entered from a backend's own frees. Returns the number of regions
 * invalidated, or -EINVAL for overflow.
 */
DRC_API int drc_notify_free(const void *addr, size_t len);

/*
 * Wrappers for the CUDA frees: each looks up the whole allocation, calls
 * drc_notify_free() on it, then calls the real function and returns its
 * result (a CUresult, or a cudaError_t for the runtime ones).
 */
DRC_API int drc_cuMemFree(unsigned long long dptr);
DRC_API int drc_cuMemFreeAsync(unsigned long long dptr, void *stream);
DRC_API int drc_cuMemUnmap(unsigned long long ptr, size_t size);
DRC_API int drc_cuMemRelease(unsigned long long handle);
DRC_API int drc_cudaFree(void *ptr);
DRC_API int drc_cudaFreeAsync(void *ptr, void *stream);

/* PyTorch CUDAPluggableAllocator entry points (stream is a cudaStream_t). */
DRC_API void *drc_torch_malloc(ssize_t size, int device, void *stream);
DRC_API void  drc_torch_free(void *ptr, ssize_t size, int device, void *stream);

/*
 * Host buffers meant for registration, from a jemalloc arena of drc's own:
 * memory this arena gives back to the OS is invalidated first.
 */
DRC_API void *drc_host_alloc(size_t size);
DRC_API void  drc_host_free(void *ptr);

#ifdef __cplusplus
}
#endif
#endif /* DRC_H */
