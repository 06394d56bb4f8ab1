/*
 * drc — a registration cache for RDMA that registers GPU memory through DMA-BUF.
 *
 * This header is the core: caches in front of any registration backend,
 * lookups, invalidation, statistics and errors. The other products have a
 * header each, which includes this one:
 *   <drc_verbs.h>  caches whose backend is libibverbs, and drc_reg_mr()
 *   <drc_cuda.h>   the CUDA free wrappers and the PyTorch allocator entry points
 *   <drc_host.h>   host buffers from drc's own jemalloc arena (libdrc_host)
 *
 * Every call that returns int returns 0 (or a
 * count, where documented) on success and a negative errno on failure;
 * drc_strerror() turns such a value into a sentence with advice.
 *
 * Handles are opaque. A drc_region_t returned by drc_get() stays valid memory
 * until the matching drc_put(), even if the range it covers is invalidated in
 * the meantime: invalidation only stops later lookups from returning it
 * (drc_region_valid() then reads 0) and defers its deregistration to the last
 * drc_put() (unless the cache revokes: DRC_F_REVOKE).
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
 *
 * The ABI rule (from 0.1.0 on). The soname stays libdrc.so.0: calls are only
 * added, never changed or removed, each release's new names under a symbol
 * version node of their own (DRC_0.1, DRC_0.2, ...). The structs that cross
 * the boundary (drc_config, drc_backend, drc_reg_args, drc_stats) grow only
 * at their end, behind a comp_mask, as rdma-core's extended structs do:
 *   - the fields before comp_mask are the 0.1 fields and are always used;
 *   - each field after it has a bit DRC_<STRUCT>_<FIELD> and is used only when
 *     that bit is set in comp_mask, so a program built with an older header
 *     (whose struct ends earlier) is never read or written past its end;
 *   - inputs (drc_config, drc_backend): zero-initialise, set the bit of each
 *     later field you fill; a library older than your header answers a bit it
 *     does not know with -EINVAL;
 *   - outputs (drc_stats): set comp_mask to the bits of the fields your struct
 *     has (DRC_STATS_ALL); the library fills the 0.1 fields and each asked one
 *     it knows, and sets comp_mask to the bits it filled;
 *   - drc_reg_args, handed to a backend: drc sets comp_mask to the later fields
 *     it filled; a backend reads one only when its bit is set.
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

/*
 * The version of this header. The library's soname is libdrc.so.0 for every
 * 0.x release; each release's new names get their own symbol version node
 * (DRC_0.1, ...), and drc_version() says which library is actually loaded.
 */
#define DRC_VERSION_MAJOR 0
#define DRC_VERSION_MINOR 1
#define DRC_VERSION_PATCH 0

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
 * An rkey grants only what was asked. By default a region serves a request
 * only if its access bits are exactly those asked, and a miss joins only
 * regions with the same bits: whatever else registered the memory, a key
 * never allows more than its own request asked (a LOCAL_WRITE-only request
 * gets a region whose rkey refuses every remote access; one without
 * RELAXED_ORDERING never gets a relaxed-ordering MR), so every rkey may be
 * given to a peer. Requests for the same memory with different bits get
 * regions of their own, which may overlap.
 *
 * DRC_F_ACCESS_SUPERSET (opt-in, drc_config.flags) relaxes this: a region
 * serves a request if it has every bit asked and, when any remote bit
 * (DRC_ACCESS_REMOTE: REMOTE_WRITE, REMOTE_READ, REMOTE_ATOMIC) is asked,
 * exactly the remote bits asked; a miss joins regions with the same remote
 * bits and takes the union of the local ones (LOCAL_WRITE, MW_BIND,
 * RELAXED_ORDERING). A request with no remote bit may then share a region
 * with remote bits: its rkey must not be given to a peer.
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
    uint32_t  comp_mask;       /* set by drc: the later fields it filled (none yet) */
    /* fields added after 0.1 go here, each with a bit (see the ABI rule at the top) */
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
    uint32_t comp_mask;        /* 0: no later field is set (none exist yet); see the ABI rule */
};

/* drc_config.flags */
#define DRC_F_NO_MERGE    (1u << 0)  /* never coalesce overlapping registrations */
#define DRC_F_VALIDATE    (1u << 1)  /* re-check the CUDA buffer id on every CUDA hit */
#define DRC_F_DMABUF_PCIE (1u << 2)  /* force the PCIe dmabuf mapping type for every GPU registration (the default
                                      * type only where the driver's export refuses the flag); without it a verbs
                                      * cache decides per (GPU, NIC) pair from the topology (drc_verbs.h), any
                                      * other cache uses the default type */
#define DRC_F_REVOKE      (1u << 3)  /* an invalidation deregisters held regions at once: see below */
#define DRC_F_ACCESS_SUPERSET (1u << 4)  /* a hit may have more access bits than asked (the relaxed rule: see
                                          * DRC_ACCESS_REMOTE); never for keys a peer may be given */

/*
 * DRC_F_REVOKE: a held registration dies with its memory.
 *
 * By default an invalidation (drc_invalidate, drc_notify_free, the CUDA free
 * hooks and wrappers, drc_region_invalidate) only stops lookups from
 * returning a region that a user still holds; the backend keeps it
 * registered until the last drc_put(). A user that keeps using its keys after
 * the free then reaches memory the program no longer owns (on a real NIC,
 * orphaned pages that also stay allocated: a GPU's freed memory is not given
 * back while an MR pins it).
 *
 * With DRC_F_REVOKE, an invalidation calls the backend's dereg() for every
 * region it invalidates, held or not, before it returns (never with a cache
 * lock held). A held region is then revoked:
 *   - drc_region_valid() reads 0, and drc_region_handle() returns NULL (the
 *     backend released the handle; drc_region_mr() likewise);
 *   - drc_region_lkey()/rkey() still return the old keys, which are dead: a
 *     transfer through them fails with a protection error on the NIC;
 *   - the region stays valid memory until its last drc_put(), which frees
 *     only drc's own memory: the backend is never asked to dereg it twice
 *     (that put returns 0).
 * Exactly one dereg() per region, whoever drops the last reference. Two
 * invalidations of one range racing each other: the first deregisters, and
 * the second may return while the first is still inside dereg().
 * The cost: an invalidation waits for the deregistration of the held regions
 * too (a verbs dereg is tens of microseconds; a GPU MR's can be more), and a
 * holder must expect its keys to die whenever the memory is freed. Nothing
 * changes for lookups, hits and idle regions.
 */

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
    uint32_t comp_mask;        /* 0: no later field is set (none exist yet); see the ABI rule */
};

/*
 * Create a cache in front of a registration backend.
 * @be   copied; its functions are called from whichever thread misses or frees.
 * @cfg  NULL for defaults (no limits, coalescing on).
 * Returns 0, -EINVAL (NULL be/out, missing reg/dereg, unknown flags, a
 * comp_mask bit of @be or @cfg this library does not know) or -ENOMEM.
 * The cache subscribes to drc_notify_free(). The first cache a process
 * creates also loads the CUDA driver (libcuda.so.1, dlopen'ed once per
 * process; none: every pointer is host memory), which each miss asks what
 * memory it is given, so that no miss pays for the search. Thread-safe.
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
 * Find or register a region covering [addr, addr+len) with exactly the
 * IBV_ACCESS_* bits in @access (with DRC_F_ACCESS_SUPERSET: at least them,
 * and exactly their DRC_ACCESS_REMOTE bits if any: see there), and take a
 * reference on it.
 * A hit takes no lock. A miss registers [addr rounded down to the host page,
 * addr+len rounded up), coalesced with every overlapping valid region of the
 * same memory and the same access bits (unless DRC_F_NO_MERGE, or unless the
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
 * an invalidated or superseded region is deregistered here on its last put
 * (a revoked one, DRC_F_REVOKE, was deregistered already: only drc's memory
 * is freed).
 * Returns 0, -EINVAL for NULL or for a region with no reference left (the
 * cache is unchanged then), or the backend's dereg error (the region is gone
 * all the same). Thread-safe.
 */
DRC_API int  drc_put(drc_cache_t *c, drc_region_t *r);

/*
 * Invalidate [addr, addr+len): when this returns, no drc_get() in any thread
 * returns a region overlapping it; idle ones are deregistered before it
 * returns, referenced ones (superseded ones too) on their last drc_put(), or
 * before it returns too with DRC_F_REVOKE. drc's shared dmabuf export of
 * that memory, if any, is closed too (an open dmabuf keeps freed GPU memory
 * taken); other caches re-export on their next miss there.
 * Call it before the memory is freed. Does not allocate. Where nothing is
 * registered in the range it takes no lock. Where another thread holds the
 * cache's lock (and the cache is not DRC_F_REVOKE), the range is handed to
 * that thread instead of waiting for it: the guarantee above holds all the
 * same, but the idle regions are then deregistered by that thread as it
 * releases the lock, and 0 is returned.
 * Returns the number of valid regions it invalidated (>= 0), or -EINVAL
 * (NULL cache, overflow; len 0 invalidates nothing). Thread-safe, and safe to
 * call from a backend's reg() or dereg().
 */
DRC_API int  drc_invalidate(drc_cache_t *c, const void *addr, size_t len);

/*
 * Invalidate the region @r, which the caller holds (a reference from
 * drc_get() not yet put): when this returns no drc_get() in any thread
 * returns it, and it is deregistered on its last drc_put() (the caller's,
 * or another holder's), or before this returns with DRC_F_REVOKE (then the
 * caller's keys die now). The cheap way to drop a registration one knows:
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

/*
 * The backend's keys and handle. Once a region is revoked (DRC_F_REVOKE) the
 * keys are the dead ones it had, and the handle is NULL: the backend released
 * it. Read the handle only where its memory cannot be freed meanwhile.
 */
DRC_API uint32_t drc_region_lkey(const drc_region_t *r);
DRC_API uint32_t drc_region_rkey(const drc_region_t *r);
DRC_API void    *drc_region_handle(const drc_region_t *r);
DRC_API enum drc_mem_type drc_region_type(const drc_region_t *r);
DRC_API unsigned drc_region_access(const drc_region_t *r);    /* the IBV_ACCESS_* bits registered */

struct drc_stats {
    uint64_t hits, misses, merges, invalidated, evicted, regs, deregs;  /* events since create */
    uint64_t regions, bytes, in_use;  /* now: regions a lookup can find, their bytes, regions referenced */
    uint32_t comp_mask;        /* in: the DRC_STATS_* fields your struct has; out: those filled */
    uint64_t detached;         /* DRC_STATS_DETACHED: invalidated or superseded regions still referenced */
    /*
     * DRC_STATS_DMABUF_DOWNGRADED: registrations of GPU memory that asked for
     * the PCIe dmabuf mapping type (DRC_F_DMABUF_PCIE, or the verbs backend's
     * topology) and were given the default type, because the driver has none
     * for that GPU. Under DRC_LOG a line on stderr says why, once per GPU.
     */
    uint64_t dmabuf_downgraded;
};
#define DRC_STATS_DETACHED          (1u << 0)
#define DRC_STATS_DMABUF_DOWNGRADED (1u << 1)
#define DRC_STATS_ALL               (DRC_STATS_DETACHED | DRC_STATS_DMABUF_DOWNGRADED)   /* every later field this header has */
/*
 * A snapshot of the counters: O(1), takes no lock (but for DRC_STATS_DETACHED,
 * which takes it briefly). Each counter is exact and the set is not one
 * instant. in_use is exact at rest; while other threads take and drop
 * references it counts each thread's references as they were at one instant
 * during the call (not the same instant for every thread), a reference whose
 * get or put is in progress either way: it never counts a thread as holding
 * more regions than that thread held at once. @c NULL zeroes @s. Set
 * s->comp_mask first (DRC_STATS_ALL, or 0 for the 0.1 fields only): the
 * library writes nothing your struct does not have. Thread-safe.
 */
DRC_API void drc_cache_stats(drc_cache_t *c, struct drc_stats *s);

/*
 * A sentence for a negative errno returned by drc, with advice where drc
 * knows some (-EIO may come from CUDA or from the backend: it names both).
 * The text is constant static storage, never NULL. Thread-safe (it never
 * calls strerror()).
 */
DRC_API const char *drc_strerror(int err);

/*
 * The version of the loaded library (which may be newer than the header a
 * program was built with): stores its parts in each non-NULL argument and
 * returns them as "MAJOR.MINOR.PATCH" (static storage). Thread-safe.
 */
DRC_API const char *drc_version(unsigned *major, unsigned *minor, unsigned *patch);

/* ---- Invalidation from the allocator ------------------------------------ */

/*
 * Invalidate [addr, addr+len) in every live cache of the process. Call it
 * before the memory is really freed. Cheap when nothing is registered there,
 * never allocates, takes no lock an allocator could hold, and may be
 * re-entered from a backend's own frees. Returns the number of regions
 * invalidated, or -EINVAL for overflow.
 */
DRC_API int drc_notify_free(const void *addr, size_t len);

#ifdef __cplusplus
}
#endif
#endif /* DRC_H */
