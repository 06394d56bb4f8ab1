/*
 * CUDA memory as the core sees it (core/mem.h): pointer classification,
 * dmabuf export, buffer-id validation, and the bounds of an allocation.
 *
 * With no driver every pointer is host memory: drc__mem_classify() then
 * costs one load of a pointer.
 *
 * Why each step of a classification exists:
 *  - cuPointerGetAttributes gives type, managedness, device, buffer id,
 *    context and GPUDirect capability in one driver call (a miss makes one).
 *    Managed and pinned host memory (cuMemAllocHost: it does not export) take
 *    the host path: ibv_reg_mr of their host mapping is what works for them.
 *  - The registering thread may have no current context (a progress thread of
 *    a transfer engine): the allocation's context, or for VMM memory, which
 *    has none, the device's primary context, is made current for the driver
 *    calls, and the caller's context is restored after.
 *  - cuMemGetAddressRange bounds the region: a coalesced region must not
 *    cross into a neighbouring allocation, whose free would not invalidate
 *    it. Its answer is also what a widened registration covers (alloc_lo,
 *    alloc_hi: drc_reg_mr's local-only GPU registrations), so the miss that
 *    classifies is the only one that asks. For VMM memory it returns one
 *    mapped chunk only, so the contiguous
 *    mapped chunks around it are walked, and joined only while they share
 *    device, allocation type and GPUDirect capability. The walk stops at
 *    DRC__MEM_CHUNKS chunks (unless the request itself needs more), and the
 *    buffer id of each chunk is recorded: DRC_F_VALIDATE checks the chunks a
 *    lookup touches against them (a remap of one chunk changes its id only).
 *  - VMM memory made without gpuDirectRDMACapable cannot be reached by the
 *    NIC: it is refused with -EACCES rather than registered uselessly.
 *  - The bounds of every CUDA classification are recorded per device
 *    (drc__cuda_track), so that a context teardown, which frees everything
 *    without a free call, can invalidate them (free.c).
 */
#include "cuda/cuda.h"

#include <errno.h>
#include <pthread.h>
#include <string.h>
#include <unistd.h>

#include "core/fork.h"
#include "core/mem.h"

enum {
    WALK_EXTRA = 16,            /* VMM chunks looked at beyond the request, each way, for coalescing */
    TRACKED = 256,              /* allocation bounds recorded for teardowns */
};

/*
 * The allocations classified, for teardowns. A small table under a mutex:
 * classification runs before the cache lock and a teardown in a wrapper or
 * hook, never inside an allocator, so a mutex is allowed here; nothing is
 * allocated. When it is full, `overflow` makes a teardown invalidate the
 * whole address space instead (over-invalidation only costs misses).
 */
static struct tracked {
    uintptr_t lo, hi;           /* hi == 0: free entry */
    int device;
} tracked[TRACKED];
static int overflow;
static pthread_mutex_t track_lock = PTHREAD_MUTEX_INITIALIZER;

void drc__cuda_forget(void);
void drc__cuda_exports_forget(void);

void drc__cuda_forget(void)
{
    drc__cuda_exports_forget();
    pthread_mutex_lock(&track_lock);
    memset(tracked, 0, sizeof(tracked));
    overflow = 0;
    pthread_mutex_unlock(&track_lock);
}

/*
 * fork() (core/fork.h): only this thread exists. The record may be half written by a parent
 * thread that held the lock; it is the parent's memory anyway (the child's caches are inert, and
 * CUDA does not work in a child): dropped, the lock made anew.
 */
static void track_child(void)
{
    pthread_mutex_init(&track_lock, NULL);
    memset(tracked, 0, sizeof(tracked));
    overflow = 0;
}

__attribute__((constructor)) static void track_fork_init(void)
{
    drc__fork_register(DRC__FORK_TRACK, NULL, NULL, track_child);
}

void drc__cuda_track(int device, uintptr_t lo, uintptr_t hi)
{
    int i, free_slot = -1;

    if (lo >= hi)
        return;
    pthread_mutex_lock(&track_lock);
    for (i = 0; i < TRACKED; i++) {
        if (tracked[i].hi && tracked[i].device == device && tracked[i].lo <= lo && hi <= tracked[i].hi)
            break;      /* known already */
        if (!tracked[i].hi && free_slot < 0)
            free_slot = i;
    }
    if (i == TRACKED) {
        if (free_slot >= 0)
            tracked[free_slot] = (struct tracked){ lo, hi, device };
        else
            overflow = 1;
    }
    pthread_mutex_unlock(&track_lock);
}

void drc__cuda_untrack(int device, uintptr_t lo, uintptr_t hi)
{
    int i;

    pthread_mutex_lock(&track_lock);
    if (lo == 0 && hi == UINTPTR_MAX && device < 0)
        overflow = 0;   /* everything was invalidated */
    for (i = 0; i < TRACKED; i++)
        if (tracked[i].hi && (device < 0 || tracked[i].device == device) && lo <= tracked[i].lo &&
            tracked[i].hi <= hi)
            tracked[i].hi = 0;
    pthread_mutex_unlock(&track_lock);
}

int drc__cuda_tracked_hull(int device, uintptr_t *lo, uintptr_t *hi)
{
    int i, found = 0;

    *lo = UINTPTR_MAX;
    *hi = 0;
    pthread_mutex_lock(&track_lock);
    if (overflow) {
        *lo = 0;
        *hi = UINTPTR_MAX;
        found = 1;
    }
    for (i = 0; i < TRACKED && !overflow; i++) {
        if (!tracked[i].hi || (device >= 0 && tracked[i].device != device))
            continue;
        if (tracked[i].lo < *lo)
            *lo = tracked[i].lo;
        if (tracked[i].hi > *hi)
            *hi = tracked[i].hi;
        found = 1;
    }
    pthread_mutex_unlock(&track_lock);
    return found ? 0 : -ENOENT;
}

/* The driver does not know any memory yet (never initialised in this process, or no GPU). */
static int driver_idle(int rc)
{
    return rc == DRC__CUDA_ERROR_NOT_INITIALIZED || rc == DRC__CUDA_ERROR_DEINITIALIZED ||
           rc == DRC__CUDA_ERROR_STUB_LIBRARY || rc == DRC__CUDA_ERROR_NO_DEVICE;
}

static int buffer_id(const struct drc__cuda_driver *d, uintptr_t p, uint64_t *id)
{
    const int attr = DRC__CU_POINTER_ATTRIBUTE_BUFFER_ID;
    unsigned long long v = 0;
    void *data = &v;
    int rc = d->cuPointerGetAttributes(1, &attr, &data, p);

    *id = v;
    return rc;
}

struct chunk_info {
    uintptr_t base, end;
    struct drc__cuda_alloc_prop prop;
};

/* The mapped VMM chunk containing @p: 1 and *c, or 0 if @p is in none (or not VMM memory). */
static int vmm_chunk(const struct drc__cuda_driver *d, uintptr_t p, struct chunk_info *c)
{
    unsigned long long h, base = 0;
    size_t size = 0;
    int ok;

    if (!d->cuMemRetainAllocationHandle || !d->cuMemGetAllocationPropertiesFromHandle || !d->cuMemRelease)
        return 0;
    if (d->cuMemRetainAllocationHandle(&h, (void *)p) != 0)
        return 0;
    memset(&c->prop, 0, sizeof(c->prop));
    ok = d->cuMemGetAllocationPropertiesFromHandle(&c->prop, h) == 0 &&
         d->cuMemGetAddressRange(&base, &size, p) == 0 && size;
    d->cuMemRelease(h);     /* drops only the reference the retain took */
    c->base = (uintptr_t)base;
    c->end = (uintptr_t)base + size;
    return ok;
}

static int same_kind(const struct chunk_info *a, const struct chunk_info *b)
{
    return a->prop.type == b->prop.type && a->prop.location.type == b->prop.location.type &&
           a->prop.location.id == b->prop.location.id &&
           a->prop.gpu_direct_rdma_capable == b->prop.gpu_direct_rdma_capable;
}

/* Record chunk [base, end) with its buffer id in m (sorted by address, at most DRC__MEM_CHUNKS). */
static int record(const struct drc__cuda_driver *d, struct drc__mem *m, uintptr_t base, uintptr_t end)
{
    uint64_t id;
    unsigned i;

    if (m->nchunks == DRC__MEM_CHUNKS || buffer_id(d, base, &id))
        return 0;
    for (i = m->nchunks; i > 0 && m->chunk[i - 1].base > base; i--)
        m->chunk[i] = m->chunk[i - 1];
    m->chunk[i] = (struct drc__mem_chunk){ base, end, id };
    m->nchunks++;
    return 1;
}

/*
 * [m->lo, m->hi): the run of contiguous compatible chunks from @first that
 * covers [first->base, end), then up to WALK_EXTRA chunks each way while
 * fewer than DRC__MEM_CHUNKS are recorded. Each chunk of the run is
 * recorded with its buffer id (the first DRC__MEM_CHUNKS of a request that
 * needs more). Returns 0, or -EFAULT if the request runs past the run.
 */
static int vmm_walk(const struct drc__cuda_driver *d, const struct chunk_info *first, uintptr_t end,
                    struct drc__mem *m)
{
    struct chunk_info c, prev = *first;
    int extra;

    m->lo = first->base;
    m->hi = first->end;
    m->nchunks = 0;
    record(d, m, first->base, first->end);
    while (m->hi < end) {
        if (!vmm_chunk(d, m->hi, &c) || c.base != m->hi || !same_kind(&c, &prev))
            return -EFAULT;
        record(d, m, c.base, c.end);
        m->hi = c.end;
        prev = c;
    }
    for (extra = 0; extra < WALK_EXTRA && m->lo > 0 && m->nchunks < DRC__MEM_CHUNKS; extra++) {
        if (!vmm_chunk(d, m->lo - 1, &c) || c.end != m->lo || !same_kind(&c, first) ||
            !record(d, m, c.base, c.end))
            break;
        m->lo = c.base;
    }
    for (extra = 0; extra < WALK_EXTRA && m->hi != 0 && m->nchunks < DRC__MEM_CHUNKS; extra++) {
        if (!vmm_chunk(d, m->hi, &c) || c.base != m->hi || !same_kind(&c, &prev) ||
            !record(d, m, c.base, c.end))
            break;
        m->hi = c.end;
        prev = c;
    }
    return 0;
}

/*
 * Host memory: every field but chunk[], which is read only below nchunks. Not
 * a memset of the whole struct: its 240 bytes went to `rep stos`, whose start
 * was about a tenth of a host miss's time (perf, bench_cache's fresh fills).
 */
static void host_mem(struct drc__mem *m)
{
    m->type = DRC_MEM_HOST;
    m->device = -1;
    m->lo = 0;
    m->hi = UINTPTR_MAX;
    m->alloc_lo = m->alloc_hi = 0;
    m->buffer_id = 0;
    m->ctx = NULL;
    m->nchunks = 0;
}

/* cuda_classify with a driver that can export: what the driver says of [addr, addr + len). */
static __attribute__((noinline)) int classify_driver(const struct drc__cuda_driver *d, uintptr_t addr, size_t len,
                                                     struct drc__mem *m)
{
    const int attrs[] = {
        DRC__CU_POINTER_ATTRIBUTE_MEMORY_TYPE, DRC__CU_POINTER_ATTRIBUTE_IS_MANAGED,
        DRC__CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, DRC__CU_POINTER_ATTRIBUTE_BUFFER_ID,
        DRC__CU_POINTER_ATTRIBUTE_CONTEXT, DRC__CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE,
    };
    unsigned type = 0, managed = 0, gdr = 0;
    int ordinal = -1, rc, err, switched;
    unsigned long long id = 0, base = 0;
    void *ctx = NULL, *saved;
    void *data[] = { &type, &managed, &ordinal, &id, &ctx, &gdr };
    uintptr_t end = addr + len;
    struct chunk_info chunk;
    size_t size = 0;

    rc = d->cuPointerGetAttributes(sizeof(attrs) / sizeof(attrs[0]), attrs, data, addr);
    if (rc)
        return driver_idle(rc) ? 0 : drc__cuda_errno(rc);
    if (type != DRC__CU_MEMORYTYPE_DEVICE || managed)
        return 0;       /* pinned host or managed memory: registered through its host mapping */
    if (!ctx)
        ctx = drc__cuda_primary_ctx(d, ordinal);
    err = drc__cuda_ctx_push(d, ctx, &saved, &switched);
    if (err)
        return err;
    if (vmm_chunk(d, addr, &chunk)) {
        if (!gdr || !chunk.prop.gpu_direct_rdma_capable) {
            err = -EACCES;  /* cuMemCreate without gpuDirectRDMACapable: the NIC cannot use it */
            goto out;
        }
        err = vmm_walk(d, &chunk, end, m);
        if (err)
            goto out;
        if (end <= chunk.end) {
            m->alloc_lo = chunk.base;       /* what cuMemGetAddressRange gives for VMM memory */
            m->alloc_hi = chunk.end;
        }
    } else {
        rc = d->cuMemGetAddressRange(&base, &size, addr);
        if (rc) {
            err = drc__cuda_errno(rc);
            goto out;
        }
        m->lo = (uintptr_t)base;
        m->hi = (uintptr_t)base + size;
        if (end > m->hi) {
            err = -EFAULT;  /* the request runs out of its allocation */
            goto out;
        }
        m->alloc_lo = m->lo;
        m->alloc_hi = m->hi;
    }
    m->type = DRC_MEM_CUDA;
    m->device = ordinal;
    m->buffer_id = id;
    m->ctx = ctx;
    drc__cuda_track(ordinal, m->lo, m->hi);
out:
    drc__cuda_ctx_pop(d, saved, switched);
    if (err)
        host_mem(m);
    return err;
}

/*
 * Host memory unless a driver that can export says otherwise. Without one
 * (no GPU, no libcuda) a miss pays the check only: the driver's query and
 * its locals are apart (classify_driver).
 */
static int cuda_classify(uintptr_t addr, size_t len, struct drc__mem *m)
{
    const struct drc__cuda_driver *d = drc__cuda_driver();

    host_mem(m);
    if (!drc__cuda_can_export(d))
        return 0;
    return classify_driver(d, addr, len, m);
}

/* The core's export (core/mem.h): through the process-wide table (export.c). */
static int cuda_export(const struct drc__mem *m, uintptr_t start, size_t len, unsigned *flags, int *fd,
                       uint64_t *offset)
{
    int pcie = (*flags & DRC_F_DMABUF_PCIE) != 0, err = drc__cuda_export(m, start, len, &pcie, fd, offset);

    if (!err && !pcie)
        *flags &= ~DRC_F_DMABUF_PCIE;   /* the default type was given */
    return err;
}

/* The buffer id recorded for the chunk containing @p, or 0 if it was not recorded. */
static uint64_t recorded_id(const struct drc__mem *m, uintptr_t p)
{
    unsigned i;

    for (i = 0; i < m->nchunks; i++)
        if (m->chunk[i].base <= p && p < m->chunk[i].end)
            return m->chunk[i].id;
    return 0;
}

/*
 * Per chunk: the chunk at each end of [addr, addr+len) must still have the
 * buffer id recorded for it at classification. A plain allocation is one
 * chunk with one id. A chunk strictly inside the range, remapped, is not
 * seen (the check costs two driver calls whatever the length); a chunk that
 * was not recorded (a request of more than DRC__MEM_CHUNKS chunks) fails the
 * check, so the region is registered again: correct, not free.
 */
static int cuda_unchanged(const struct drc__mem *m, uintptr_t addr, size_t len)
{
    const struct drc__cuda_driver *d = drc__cuda_driver();
    uint64_t first, last;

    if (!d || m->type != DRC_MEM_CUDA)
        return 1;
    if (buffer_id(d, addr, &first) || buffer_id(d, addr + len - 1, &last))
        return 0;   /* the driver no longer knows the range: treat it as freed */
    if (!m->nchunks)
        return first == m->buffer_id && last == m->buffer_id;
    return first && first == recorded_id(m, addr) && last == recorded_id(m, addr + len - 1);
}

/* The core sees CUDA memory through these (core/mem.h); installed when the library loads. */
/* drc_notify_free (mem.h): the shared exports of the range go before the memory does. */
static void cuda_released(uintptr_t addr, size_t len)
{
    uintptr_t end = addr + len;

    if (drc__cuda_exports_busy())
        drc__cuda_exports_drop(-1, addr, end < addr ? UINTPTR_MAX : end);
}

/*
 * A cache is being created: the driver looked for now (once per process),
 * not in its first miss. Where there is no libcuda, searching the loader's
 * path for it takes longer than a first cache's thousand misses.
 */
static void cuda_prepare(void)
{
    (void)drc__cuda_driver();
}

static const struct drc__mem_ops cuda_mem_ops = {
    .classify = cuda_classify, .export_range = cuda_export, .unchanged = cuda_unchanged,
    .released = cuda_released, .prepare = cuda_prepare,
};

__attribute__((constructor)) static void install_mem_ops(void)
{
    drc__mem_set_ops(&cuda_mem_ops);
}

int drc__cuda_alloc_range(uintptr_t addr, uintptr_t *base, size_t *len)
{
    const struct drc__cuda_driver *d = drc__cuda_driver();
    const int attr = DRC__CU_POINTER_ATTRIBUTE_CONTEXT;
    unsigned long long b = 0;
    void *ctx = NULL, *saved, *data = &ctx;
    size_t s = 0;
    int rc, switched;

    if (!d || !d->cuMemGetAddressRange)
        return -ENOENT;
    rc = d->cuMemGetAddressRange(&b, &s, addr);
    if (rc == DRC__CUDA_ERROR_INVALID_CONTEXT && d->cuPointerGetAttributes &&
        d->cuPointerGetAttributes(1, &attr, &data, addr) == 0 && ctx &&
        drc__cuda_ctx_push(d, ctx, &saved, &switched) == 0) {
        rc = d->cuMemGetAddressRange(&b, &s, addr);   /* a thread with no context of its own */
        drc__cuda_ctx_pop(d, saved, switched);
    }
    if (rc && d->cuPointerGetAttribute &&
        d->cuPointerGetAttribute(&b, DRC__CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, addr) == 0 &&
        d->cuPointerGetAttribute(&s, DRC__CU_POINTER_ATTRIBUTE_RANGE_SIZE, addr) == 0)
        rc = 0;     /* VMM memory has no context to push; these need none */
    if (rc || !s)
        return -ENOENT;
    *base = (uintptr_t)b;
    *len = s;
    return 0;
}

int drc__cuda_device_attr(int device, int attr, int *value)
{
    const struct drc__cuda_driver *d = drc__cuda_driver();
    int dev = device, rc;

    if (!d || !d->cuDeviceGetAttribute || device < 0)
        return -ENODEV;
    if (d->cuDeviceGet && (rc = d->cuDeviceGet(&dev, device)) != 0)
        return driver_idle(rc) ? -ENODEV : drc__cuda_errno(rc);
    rc = d->cuDeviceGetAttribute(value, attr, dev);
    return rc ? drc__cuda_errno(rc) : 0;
}

int drc__cuda_pci_bus_id(int device, char *buf, int len)
{
    const struct drc__cuda_driver *d = drc__cuda_driver();
    int dev = device, rc;

    if (!d || !d->cuDeviceGetPCIBusId || device < 0 || len < 1)
        return -ENODEV;
    if (d->cuDeviceGet && (rc = d->cuDeviceGet(&dev, device)) != 0)
        return driver_idle(rc) ? -ENODEV : drc__cuda_errno(rc);
    rc = d->cuDeviceGetPCIBusId(buf, len, dev);
    if (rc)
        return driver_idle(rc) ? -ENODEV : drc__cuda_errno(rc);
    buf[len - 1] = 0;
    return 0;
}
