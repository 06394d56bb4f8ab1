/*
 * The CUDA layer: the driver loaded with dlopen, pointer classification,
 * dmabuf export, buffer-id validation (the functions of mem.h and cuda.h).
 *
 * Nothing here links against libcuda. The first call that needs the driver
 * opens libcuda.so.1 and resolves the table once (pthread_once), through
 * cuGetProcAddress_v2 where the driver has it, so that each entry is the
 * version this code was written for whatever the driver's default is. With no
 * driver every pointer is host memory: drc__mem_classify() then costs one
 * load of a pointer.
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
 *    it. For VMM memory it returns one mapped chunk only, so the contiguous
 *    mapped chunks around it are walked, and joined only while they share
 *    device, allocation type and GPUDirect capability.
 *  - VMM memory made without gpuDirectRDMACapable cannot be reached by the
 *    NIC: it is refused with -EACCES rather than registered uselessly.
 */
#include "cuda/cuda.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <string.h>
#include <unistd.h>

#include "core/mem.h"

enum {
    MAX_DEVICES = 64,
    WALK_EXTRA = 16,            /* VMM chunks looked at beyond the request, each way, for coalescing */
    PROC_VERSION = 12000,       /* the CUDA version whose entry points the table holds */
};

static const struct drc__cuda_driver *active;   /* atomic: NULL = no driver */
static int ready;                               /* atomic: active is final */
static int overridden;                          /* drc__cuda_set_driver was called */
static pthread_once_t once = PTHREAD_ONCE_INIT;
static struct drc__cuda_driver real;

static int pcie_unsupported[MAX_DEVICES];       /* atomic: the PCIe mapping type gave NOT_SUPPORTED */
static void *primary[MAX_DEVICES];              /* atomic, set under primary_lock: retained primary contexts */
static pthread_mutex_t primary_lock = PTHREAD_MUTEX_INITIALIZER;

typedef int (*get_proc_fn)(const char *symbol, void **pfn, int version, unsigned long long flags, int *status);

static void *resolve(void *lib, get_proc_fn gpa, const char *name, const char *exported)
{
    void *p = NULL;
    int status = 0;

    if (gpa && gpa(name, &p, PROC_VERSION, 0, &status) == 0 && p)
        return p;
    return dlsym(lib, exported ? exported : name);
}

static void load(void)
{
    struct drc__cuda_driver *d = &real;
    get_proc_fn gpa;
    void *lib;

    if (__atomic_load_n(&overridden, __ATOMIC_ACQUIRE))
        return;
    lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib)
        goto done;
    gpa = (get_proc_fn)dlsym(lib, "cuGetProcAddress_v2");
#define R(field, exported) *(void **)&d->field = resolve(lib, gpa, #field, exported)
    R(cuPointerGetAttributes, NULL);
    R(cuMemGetAddressRange, "cuMemGetAddressRange_v2");
    R(cuMemGetHandleForAddressRange, NULL);
    R(cuCtxGetCurrent, NULL);
    R(cuCtxSetCurrent, NULL);
    R(cuMemRetainAllocationHandle, NULL);
    R(cuMemGetAllocationPropertiesFromHandle, NULL);
    R(cuMemRelease, NULL);
    R(cuInit, NULL);
    R(cuDriverGetVersion, NULL);
    R(cuDeviceGetCount, NULL);
    R(cuDeviceGet, NULL);
    R(cuDeviceGetName, NULL);
    R(cuDeviceGetAttribute, NULL);
    R(cuDevicePrimaryCtxRetain, NULL);
    R(cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2");
    R(cuMemAlloc, "cuMemAlloc_v2");
    R(cuMemFree, "cuMemFree_v2");
    R(cuMemFreeAsync, NULL);
    R(cuMemUnmap, NULL);
#undef R
    if (d->cuPointerGetAttributes && d->cuMemGetAddressRange && d->cuMemGetHandleForAddressRange &&
        d->cuCtxGetCurrent && d->cuCtxSetCurrent)
        __atomic_store_n(&active, d, __ATOMIC_RELEASE);
    /* else: a driver too old for dmabuf export is no driver for drc; the library stays loaded */
done:
    __atomic_store_n(&ready, 1, __ATOMIC_RELEASE);
}

const struct drc__cuda_driver *drc__cuda_driver(void)
{
    if (!__atomic_load_n(&ready, __ATOMIC_ACQUIRE))
        pthread_once(&once, load);
    return __atomic_load_n(&active, __ATOMIC_ACQUIRE);
}

void drc__cuda_set_driver(const struct drc__cuda_driver *fake)
{
    __atomic_store_n(&overridden, 1, __ATOMIC_RELEASE);
    memset(pcie_unsupported, 0, sizeof(pcie_unsupported));
    memset(primary, 0, sizeof(primary));    /* a fake's contexts are not the driver's to release */
    __atomic_store_n(&active, fake, __ATOMIC_RELEASE);
    __atomic_store_n(&ready, 1, __ATOMIC_RELEASE);
}

int drc__cuda_errno(int cuda_result)
{
    switch (cuda_result) {
    case DRC__CUDA_SUCCESS:
        return 0;
    case DRC__CUDA_ERROR_INVALID_VALUE:
        return -EINVAL;
    case DRC__CUDA_ERROR_OUT_OF_MEMORY:
        return -ENOMEM;
    case DRC__CUDA_ERROR_NOT_SUPPORTED:
        return -EOPNOTSUPP;
    case DRC__CUDA_ERROR_NOT_PERMITTED:
        return -EPERM;
    case DRC__CUDA_ERROR_NO_DEVICE:
    case DRC__CUDA_ERROR_STUB_LIBRARY:
        return -ENODEV;
    default:
        return -EIO;
    }
}

/* The driver does not know any memory yet (never initialised in this process, or no GPU). */
static int driver_idle(int rc)
{
    return rc == DRC__CUDA_ERROR_NOT_INITIALIZED || rc == DRC__CUDA_ERROR_DEINITIALIZED ||
           rc == DRC__CUDA_ERROR_STUB_LIBRARY || rc == DRC__CUDA_ERROR_NO_DEVICE;
}

/*
 * The device's primary context, retained once and kept for the life of the
 * process: VMM memory belongs to no context, yet the export needs one current.
 */
static void *primary_ctx(const struct drc__cuda_driver *d, int device)
{
    void *ctx;
    int dev;

    if (device < 0 || device >= MAX_DEVICES || !d->cuDevicePrimaryCtxRetain)
        return NULL;
    ctx = __atomic_load_n(&primary[device], __ATOMIC_ACQUIRE);
    if (ctx)
        return ctx;
    pthread_mutex_lock(&primary_lock);
    ctx = primary[device];
    if (!ctx && (!d->cuDeviceGet || d->cuDeviceGet(&dev, device) == 0) &&
        d->cuDevicePrimaryCtxRetain(&ctx, d->cuDeviceGet ? dev : device) == 0)
        __atomic_store_n(&primary[device], ctx, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&primary_lock);
    return ctx;
}

/* Make @ctx current; *saved gets what to restore with ctx_pop. */
static int ctx_push(const struct drc__cuda_driver *d, void *ctx, void **saved, int *switched)
{
    int rc;

    *switched = 0;
    *saved = NULL;
    if (!ctx)
        return 0;
    rc = d->cuCtxGetCurrent(saved);
    if (rc)
        return drc__cuda_errno(rc);
    if (*saved == ctx)
        return 0;
    rc = d->cuCtxSetCurrent(ctx);
    if (rc)
        return drc__cuda_errno(rc);
    *switched = 1;
    return 0;
}

static void ctx_pop(const struct drc__cuda_driver *d, void *saved, int switched)
{
    if (switched)
        d->cuCtxSetCurrent(saved);
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

/*
 * [*lo, *hi): the run of contiguous compatible chunks around @first that
 * covers [addr, end) if it can, plus up to WALK_EXTRA chunks each way.
 * Returns 0, or -EFAULT if the request runs past the run.
 */
static int vmm_walk(const struct drc__cuda_driver *d, const struct chunk_info *first, uintptr_t end,
                    uintptr_t *lo, uintptr_t *hi)
{
    struct chunk_info c, prev = *first;
    int extra;

    *lo = first->base;
    *hi = first->end;
    for (extra = 0; extra < WALK_EXTRA && *lo > 0; extra++) {
        if (!vmm_chunk(d, *lo - 1, &c) || c.end != *lo || !same_kind(&c, first))
            break;
        *lo = c.base;
    }
    for (extra = 0; extra < WALK_EXTRA && *hi != 0;) {
        if (!vmm_chunk(d, *hi, &c) || c.base != *hi || !same_kind(&c, &prev))
            break;
        *hi = c.end;
        prev = c;
        if (*hi >= end)
            extra++;    /* past the request: only coalescing headroom from here on */
    }
    return end <= *hi ? 0 : -EFAULT;
}

static int cuda_classify(uintptr_t addr, size_t len, struct drc__mem *m)
{
    const struct drc__cuda_driver *d = drc__cuda_driver();
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

    *m = (struct drc__mem){ .type = DRC_MEM_HOST, .device = -1, .lo = 0, .hi = UINTPTR_MAX };
    if (!d)
        return 0;
    rc = d->cuPointerGetAttributes(sizeof(attrs) / sizeof(attrs[0]), attrs, data, addr);
    if (rc)
        return driver_idle(rc) ? 0 : drc__cuda_errno(rc);
    if (type != DRC__CU_MEMORYTYPE_DEVICE || managed)
        return 0;       /* pinned host or managed memory: registered through its host mapping */
    if (!ctx)
        ctx = primary_ctx(d, ordinal);
    err = ctx_push(d, ctx, &saved, &switched);
    if (err)
        return err;
    if (vmm_chunk(d, addr, &chunk)) {
        if (!gdr || !chunk.prop.gpu_direct_rdma_capable) {
            err = -EACCES;  /* cuMemCreate without gpuDirectRDMACapable: the NIC cannot use it */
            goto out;
        }
        err = vmm_walk(d, &chunk, end, &m->lo, &m->hi);
        if (err)
            goto out;
        rc = buffer_id(d, end - 1, &m->buffer_id_end);
        if (rc) {
            err = drc__cuda_errno(rc);
            goto out;
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
        m->buffer_id_end = id;  /* one allocation, one buffer id */
    }
    m->type = DRC_MEM_CUDA;
    m->device = ordinal;
    m->buffer_id = id;
    m->ctx = ctx;
out:
    ctx_pop(d, saved, switched);
    if (err)
        *m = (struct drc__mem){ .type = DRC_MEM_HOST, .device = -1, .lo = 0, .hi = UINTPTR_MAX };
    return err;
}

static int cuda_export(const struct drc__mem *m, uintptr_t start, size_t len, unsigned flags, int *fd,
                       uint64_t *offset)
{
    const struct drc__cuda_driver *d = drc__cuda_driver();
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), base, end;
    int rc = DRC__CUDA_ERROR_NOT_SUPPORTED, err, switched, out = -1;
    int dev = m ? m->device : -1;
    int pcie = (flags & DRC_F_DMABUF_PCIE) && dev >= 0 && dev < MAX_DEVICES &&
               !__atomic_load_n(&pcie_unsupported[dev], __ATOMIC_RELAXED);
    void *saved;

    *fd = -1;
    *offset = 0;
    if (!m || m->type != DRC_MEM_CUDA || !len || start + len < start)
        return -EINVAL;
    if (!d)
        return -EOPNOTSUPP;
    /* The export must be host-page aligned at both ends (else CUDA_ERROR_INVALID_VALUE). */
    base = start & ~(page - 1);
    end = (start + len + page - 1) & ~(page - 1);
    err = ctx_push(d, m->ctx, &saved, &switched);
    if (err)
        return err;
    if (pcie) {
        rc = d->cuMemGetHandleForAddressRange(&out, base, end - base, DRC__CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD,
                                              DRC__CU_MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE);
        if (rc == DRC__CUDA_ERROR_NOT_SUPPORTED)
            __atomic_store_n(&pcie_unsupported[dev], 1, __ATOMIC_RELAXED);   /* not worth asking again */
    }
    if (!pcie || rc == DRC__CUDA_ERROR_NOT_SUPPORTED) {
        out = -1;
        rc = d->cuMemGetHandleForAddressRange(&out, base, end - base, DRC__CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
    }
    ctx_pop(d, saved, switched);
    if (rc)
        return drc__cuda_errno(rc);
    *fd = out;
    *offset = start - base;
    return 0;
}

static int cuda_unchanged(const struct drc__mem *m, uintptr_t addr, size_t len)
{
    const struct drc__cuda_driver *d = drc__cuda_driver();
    uint64_t first, last;

    if (!d || m->type != DRC_MEM_CUDA)
        return 1;
    if (buffer_id(d, addr, &first) || buffer_id(d, addr + len - 1, &last))
        return 0;   /* the driver no longer knows the range: treat it as freed */
    if (m->buffer_id == m->buffer_id_end)
        return first == m->buffer_id && last == m->buffer_id;
    /*
     * A region across VMM chunks, whose buffer ids differ: the ids recorded are
     * those of the chunks at the ends of the registering request, so a hit on
     * other chunks of the region fails this check and re-registers (correct,
     * but not free). A remapped chunk strictly inside the range is not seen.
     */
    return (first == m->buffer_id || first == m->buffer_id_end) &&
           (last == m->buffer_id || last == m->buffer_id_end);
}

/* The core sees CUDA memory through these (core/mem.h); installed when the library loads. */
static const struct drc__mem_ops cuda_mem_ops = {
    .classify = cuda_classify, .export_range = cuda_export, .unchanged = cuda_unchanged,
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

    if (!d)
        return -ENOENT;
    rc = d->cuMemGetAddressRange(&b, &s, addr);
    if (rc == DRC__CUDA_ERROR_INVALID_CONTEXT && d->cuPointerGetAttributes(1, &attr, &data, addr) == 0 && ctx &&
        ctx_push(d, ctx, &saved, &switched) == 0) {
        rc = d->cuMemGetAddressRange(&b, &s, addr);   /* a thread with no context of its own */
        ctx_pop(d, saved, switched);
    }
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
