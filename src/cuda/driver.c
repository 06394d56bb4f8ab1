/*
 * The one CUDA driver table (cuda.h states its contract): the only dlopen of
 * libcuda.so.1 in drc, and the only place a fake is installed.
 *
 * The first call that needs the driver opens libcuda.so.1 and resolves every
 * entry once (pthread_once), through cuGetProcAddress_v2 where the driver has
 * it, so that each entry is the version this code was written for whatever
 * the driver's default is; a missing entry stays NULL, or for a free
 * (frees.h) is a stub that answers CUDA_ERROR_NOT_INITIALIZED. The handle is kept:
 * the driver stays loaded for the life of the process.
 *
 * Under the preload library (src/preload/), whose dlsym interposer hands out
 * wrappers for the frees, these lookups still get the real functions: the
 * interposer recognises drc's own callers (preload_cuda.c, from_drc).
 */
#include "cuda/cuda.h"

#include "core/fork.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <string.h>

enum { PROC_VERSION = 12000 };  /* the CUDA version whose entry points the table holds */

static const struct drc__cuda_driver *active;   /* atomic: NULL = no driver */
static int ready;                               /* atomic: active is final */
static int overridden;                          /* drc__cuda_set_driver was called */
static pthread_once_t once = PTHREAD_ONCE_INIT;
static struct drc__cuda_driver real;

static void *primary[DRC__CUDA_MAX_DEVICES];    /* atomic, set under primary_lock: retained primary contexts */
static pthread_mutex_t primary_lock = PTHREAD_MUTEX_INITIALIZER;

void drc__cuda_forget(void);   /* memory.c: what it learnt per device */

/*
 * fork() (core/fork.h): primary_lock is held across cuDevicePrimaryCtxRetain, so the fork does not
 * wait for it (the driver's own fork handling may hold what that call needs); the child makes it
 * anew. The contexts retained are atomic, whole in the child.
 */
static void driver_child(void)
{
    pthread_mutex_init(&primary_lock, NULL);
}

__attribute__((constructor)) static void driver_fork_init(void)
{
    drc__fork_register(DRC__FORK_DRIVER, NULL, NULL, driver_child);
}

typedef int (*get_proc_fn)(const char *symbol, void **pfn, int version, unsigned long long flags, int *status);

static void *resolve(void *lib, get_proc_fn gpa, const char *name, const char *exported)
{
    void *p = NULL;
    int status = 0;

    if (gpa && gpa(name, &p, PROC_VERSION, 0, &status) == 0 && p)
        return p;
    return dlsym(lib, exported ? exported : name);
}

/*
 * What stands in for a driver free the driver lacks (or, in
 * drc__cuda_no_driver, for every one): the answer of a driver that is not
 * there. Callers call the frees without testing them.
 */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-parameter"
#define STUB_DRIVER(name, params) \
    static int stub_##name params { return DRC__CUDA_ERROR_NOT_INITIALIZED; }
#define STUB_RUNTIME(name, params)
#define STUB(api, name, versions, since, kind, params, args, fallback) STUB_##api(name, params)
DRC__CUDA_FREES(STUB)
#undef STUB
#undef STUB_RUNTIME
#undef STUB_DRIVER
#pragma GCC diagnostic pop

const struct drc__cuda_driver drc__cuda_no_driver = {
#define NO_DRIVER_DRIVER(name) .name = stub_##name,
#define NO_DRIVER_RUNTIME(name)
#define NO_DRIVER(api, name, versions, since, kind, params, args, fallback) NO_DRIVER_##api(name)
    DRC__CUDA_FREES(NO_DRIVER)
#undef NO_DRIVER
#undef NO_DRIVER_RUNTIME
#undef NO_DRIVER_DRIVER
};

void drc__cuda_fill(void *lib, struct drc__cuda_driver *d)
{
    get_proc_fn gpa;
    void *p;

    *d = drc__cuda_no_driver;
    if (!lib)
        return;
    gpa = (get_proc_fn)dlsym(lib, "cuGetProcAddress_v2");
#define R(field, exported) *(void **)&d->field = resolve(lib, gpa, #field, exported)
    R(cuPointerGetAttributes, NULL);
    R(cuMemGetAddressRange, "cuMemGetAddressRange_v2");
    R(cuMemGetHandleForAddressRange, NULL);
    R(cuCtxGetCurrent, NULL);
    R(cuCtxSetCurrent, NULL);
    R(cuPointerGetAttribute, NULL);
    R(cuMemRetainAllocationHandle, NULL);
    R(cuMemGetAllocationPropertiesFromHandle, NULL);
    R(cuMemRelease, NULL);
    R(cuMemGetAllocationGranularity, NULL);
    R(cuMemCreate, NULL);
    R(cuMemAddressReserve, NULL);
    R(cuMemAddressFree, NULL);
    R(cuMemMap, NULL);
    R(cuMemSetAccess, NULL);
    R(cuInit, NULL);
    R(cuDriverGetVersion, NULL);
    R(cuDeviceGetCount, NULL);
    R(cuDeviceGet, NULL);
    R(cuDeviceGetName, NULL);
    R(cuDeviceGetPCIBusId, NULL);
    R(cuDeviceGetAttribute, NULL);
    R(cuDevicePrimaryCtxRetain, NULL);
    R(cuDevicePrimaryCtxGetState, NULL);
    R(cuCtxGetDevice, NULL);
    R(cuCtxSynchronize, NULL);
    R(cuStreamSynchronize, NULL);
    R(cuMemAlloc, "cuMemAlloc_v2");
#undef R
    /* the frees: the symbol of the table's version, the stub where there is none; the runtime's on use */
#define FREE_DRIVER(name, versions)                                                     \
    if ((p = resolve(lib, gpa, #name, DRC__CUDA_TABLE_SYM(versions, name))))              \
        *(void **)&d->name = p;
#define FREE_RUNTIME(name, versions)
#define FREE(api, name, versions, since, kind, params, args, fallback) FREE_##api(name, versions)
    DRC__CUDA_FREES(FREE)
#undef FREE
#undef FREE_RUNTIME
#undef FREE_DRIVER
}

static void load(void)
{
    void *lib;

    if (__atomic_load_n(&overridden, __ATOMIC_ACQUIRE))
        return;
    lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib) {
        drc__cuda_fill(lib, &real);
        __atomic_store_n(&active, &real, __ATOMIC_RELEASE);
    }
    __atomic_store_n(&ready, 1, __ATOMIC_RELEASE);
}

const struct drc__cuda_driver *drc__cuda_driver(void)
{
    if (!__atomic_load_n(&ready, __ATOMIC_ACQUIRE))
        pthread_once(&once, load);
    return __atomic_load_n(&active, __ATOMIC_ACQUIRE);
}

int drc__cuda_can_export(const struct drc__cuda_driver *d)
{
    return d && d->cuPointerGetAttributes && d->cuMemGetAddressRange && d->cuMemGetHandleForAddressRange &&
           d->cuCtxGetCurrent && d->cuCtxSetCurrent;
}

void drc__cuda_set_driver(const struct drc__cuda_driver *fake)
{
    __atomic_store_n(&overridden, 1, __ATOMIC_RELEASE);
    memset(primary, 0, sizeof(primary));    /* a fake's contexts are not the driver's to release */
    drc__cuda_forget();
    __atomic_store_n(&active, fake, __ATOMIC_RELEASE);
    __atomic_store_n(&ready, 1, __ATOMIC_RELEASE);
}

void *drc__cuda_runtime(const struct drc__cuda_driver *d, void *const *field, const char *name)
{
    void *f = __atomic_load_n(field, __ATOMIC_ACQUIRE);

    if (f || d != &real)
        return f;
    /* the real table: a shared libcudart, if the dynamic linker sees one (a static runtime hides it) */
    if ((f = dlsym(RTLD_DEFAULT, name)))
        __atomic_store_n((void **)field, f, __ATOMIC_RELEASE);
    return f;
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

int drc__cuda_rt_error(int cu)
{
    switch (cu) {
    case DRC__CUDA_SUCCESS:
        return DRC__CUDART_SUCCESS;
    case DRC__CUDA_ERROR_INVALID_VALUE:
        return DRC__CUDART_INVALID_VALUE;
    case DRC__CUDA_ERROR_NOT_INITIALIZED:
        return DRC__CUDART_INITIALIZATION_ERROR;
    case DRC__CUDA_ERROR_DEINITIALIZED:
        return DRC__CUDART_UNLOADING;
    default:
        return DRC__CUDART_UNKNOWN;
    }
}

int drc__cuda_ctx_push(const struct drc__cuda_driver *d, void *ctx, void **saved, int *switched)
{
    int rc;

    *switched = 0;
    *saved = NULL;
    if (!ctx)
        return 0;
    if (!d->cuCtxGetCurrent || !d->cuCtxSetCurrent)
        return -EOPNOTSUPP;
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

void drc__cuda_ctx_pop(const struct drc__cuda_driver *d, void *saved, int switched)
{
    if (switched)
        d->cuCtxSetCurrent(saved);
}

/*
 * The device's primary context, retained once and kept for the life of the
 * process: VMM memory belongs to no context, yet the export needs one current.
 */
void *drc__cuda_primary_ctx(const struct drc__cuda_driver *d, int device)
{
    void *ctx;
    int dev;

    if (device < 0 || device >= DRC__CUDA_MAX_DEVICES || !d->cuDevicePrimaryCtxRetain)
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
