/*
 * The CUPTI monitor of the preload library's CUDA part (DRC_MONITOR=cupti):
 * the frees reported by the CUDA profiling interface instead of interposed
 * symbols.
 *
 * libcupti is loaded with dlopen (DRC_CUPTI_LIB names it, else the usual
 * places), a callback subscriber is registered, and the enter callbacks of
 * the frees (every symbol of each entry of src/cuda/frees.h: cuMemFree_v2,
 * cudaFree, cuDevicePrimaryCtxReset(_v2) ...) are enabled: each enter begins
 * the free in drc (the whole allocation, or every allocation of the device
 * for a teardown) and the matching exit ends it.
 * cuDevicePrimaryCtxRelease(_v2) is looked at on exit: if it dropped the
 * last reference, the device's allocations are invalidated then. The driver
 * runs these callbacks however the program reached the entry point, runtime
 * included.
 *
 * The limit: CUPTI allows one callback subscriber per process, so this
 * monitor and a profiler (Nsight Systems, Kineto/torch.profiler, ...) exclude
 * each other; whichever subscribes second fails. The start says so.
 *
 * Callback ids differ between CUDA releases, so none is hard-coded: they are
 * found by name with cuptiGetCallbackName. A CUPTI without it gets whole
 * domains enabled and the callback filters by function name (slower: every
 * API call then enters the callback).
 *
 * The CUPTI types are spelled out so that drc builds without the toolkit.
 */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/config.h"
#include "cuda/cuda.h"      /* the list of the frees (frees.h) */
#include "preload/preload.h"

enum { DOMAIN_DRIVER = 1, DOMAIN_RUNTIME = 2, SITE_ENTER = 0, MAX_CBID = 4096 };

/* CUpti_CallbackData */
struct cupti_cbdata {
    int site;
    const char *function_name;
    const void *params;         /* the call's arguments, in order, as a struct */
    void *return_value;
    const char *symbol_name;
    void *context;
    uint32_t context_uid;
    uint64_t *correlation_data;
    uint32_t correlation_id;
};

typedef void cupti_callback(void *userdata, int domain, uint32_t cbid, const void *cbdata);
typedef int subscribe_fn(void **subscriber, cupti_callback *cb, void *userdata);
typedef int enable_fn(uint32_t enable, void *subscriber, int domain, uint32_t cbid);
typedef int enable_domain_fn(uint32_t enable, void *subscriber, int domain);
typedef int name_fn(int domain, uint32_t cbid, const char **name);
typedef int result_string_fn(int result, const char **str);

enum what { NONE = 0, FREE = 1, UNMAP = 2, TEARDOWN = 3, DESTROY = 4, DEVICE_RESET = 5, RELEASE = 6 };

/* written before the subscriber is enabled, read-only after */
static unsigned char driver_what[MAX_CBID], runtime_what[MAX_CBID];
static int by_name;     /* no cuptiGetCallbackName: match cbdata->function_name */

/* "cudaFree_v3020" -> "cudaFree": CUPTI appends the version that introduced a runtime entry. */
static size_t base_len(const char *name)
{
    size_t n = strlen(name), i = n;

    while (i > 0 && name[i - 1] >= '0' && name[i - 1] <= '9')
        i--;
    if (n - i >= 3 && i >= 2 && name[i - 1] == 'v' && name[i - 2] == '_')
        return i - 2;
    return n;
}

/* The frees of the one list (frees.h), by domain, with what each takes. */
static const struct {
    int domain;
    const char *name, *suffix;
    int since;
    enum what w;
} frees[] = {
#define ROW(api, name, versions, since, kind, params, args, fallback) \
    { DOMAIN_##api, #name, DRC__CUDA_SUFFIX(versions), since, kind },
    DRC__CUDA_FREES(ROW)
#undef ROW
};

static enum what classify(int domain, const char *name)
{
    char base[128];
    size_t i, n;

    if (!name)
        return NONE;
    if (domain == DOMAIN_RUNTIME) {
        if ((n = base_len(name)) >= sizeof(base))
            return NONE;
        memcpy(base, name, n);
        base[n] = 0;
        name = base;
    }
    /* a callback is named by its symbol: the plain name only where it is the list's ABI (since 0) */
    for (i = 0; i < sizeof(frees) / sizeof(frees[0]); i++)
        if (frees[i].domain == domain && drc__cuda_names(name, 0, frees[i].name, frees[i].since, frees[i].suffix))
            return frees[i].w;
    return NONE;
}

static void on_callback(void *userdata, int domain, uint32_t cbid, const void *data)
{
    const struct cupti_cbdata *cb = data;
    enum what w = NONE;
    int t = -1;

    (void)userdata;
    if (!cb)
        return;
    if (by_name)
        w = classify(domain, cb->function_name);
    else if (cbid < MAX_CBID)
        w = domain == DOMAIN_DRIVER ? driver_what[cbid] : domain == DOMAIN_RUNTIME ? runtime_what[cbid] : NONE;
    if (w == NONE || (!cb->params && w != DEVICE_RESET))
        return;
    if (w == RELEASE) {
        /* whether it dropped the last reference is known only once it returned */
        if (cb->site != SITE_ENTER)
            drc__preload_primary_released(*(const int *)cb->params);
        return;
    }
    if (cb->site != SITE_ENTER) {
        /* the exit callback: the memory is gone, end what the enter began (its tickets + 1) */
        if (cb->correlation_data && *cb->correlation_data)
            drc__preload_end((int)(*cb->correlation_data - 1));
        return;
    }
    /* each takes the pointer (device, context) first; cuMemUnmap's size follows it */
    switch (w) {
    case FREE:
        t = drc__preload_begin_free(*(const unsigned long long *)cb->params);
        break;
    case UNMAP: {
        const struct { unsigned long long ptr; size_t size; } *p = cb->params;

        t = drc__preload_begin_unmap(p->ptr, p->size);
        break;
    }
    case TEARDOWN:
        t = drc__preload_begin_teardown(*(const int *)cb->params);
        break;
    case DESTROY:
        t = drc__preload_begin_teardown(drc__preload_ctx_device(*(void *const *)cb->params));
        break;
    case DEVICE_RESET:
        t = drc__preload_begin_teardown(-1);
        break;
    case RELEASE:
    case NONE:
        return;
    }
    if (cb->correlation_data)
        *cb->correlation_data = t >= 0 ? (uint64_t)t + 1 : 0;  /* CUPTI's scratch word from enter to exit */
    else
        drc__preload_end(t);
}

static void *open_cupti(void)
{
    static const char *const names[] = {
        "libcupti.so", "libcupti.so.13", "libcupti.so.12",
        "/usr/local/cuda/lib64/libcupti.so", "/usr/local/cuda/extras/CUPTI/lib64/libcupti.so",
        "/usr/local/cuda/targets/x86_64-linux/lib/libcupti.so",
    };
    const char *env = drc__env_str(DRC__ENV_CUPTI_LIB);
    void *h;
    size_t i;

    if (env && env[0])
        return dlopen(env, RTLD_NOW | RTLD_LOCAL);
    for (i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if ((h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL)))
            return h;
    return NULL;
}

int drc__preload_cupti_start(void)
{
    subscribe_fn *subscribe;
    enable_fn *enable;
    enable_domain_fn *enable_domain;
    name_fn *get_name;
    result_string_fn *result_string;
    const char *name, *why = "";
    void *h = open_cupti(), *sub = NULL;
    int domain, err, found = 0;
    uint32_t id;

    if (!h) {
        fprintf(stderr, "drc hook: DRC_MONITOR=cupti but libcupti cannot be loaded (%s); set DRC_CUPTI_LIB. "
                        "Falling back to symbol interposition.\n", dlerror());
        return -1;
    }
    *(void **)&subscribe = drc__preload_real_dlsym(h, "cuptiSubscribe");
    *(void **)&enable = drc__preload_real_dlsym(h, "cuptiEnableCallback");
    *(void **)&enable_domain = drc__preload_real_dlsym(h, "cuptiEnableDomain");
    *(void **)&get_name = drc__preload_real_dlsym(h, "cuptiGetCallbackName");
    *(void **)&result_string = drc__preload_real_dlsym(h, "cuptiGetResultString");
    if (!subscribe || !enable || !enable_domain) {
        fprintf(stderr, "drc hook: libcupti lacks cuptiSubscribe/cuptiEnableCallback. "
                        "Falling back to symbol interposition.\n");
        return -1;
    }
    /* the tables first: callbacks may fire as soon as they are enabled */
    if (get_name) {
        for (domain = DOMAIN_DRIVER; domain <= DOMAIN_RUNTIME; domain++) {
            for (id = 1; id < MAX_CBID; id++) {
                enum what w;

                if (get_name(domain, id, &name) || !(w = classify(domain, name)))
                    continue;
                (domain == DOMAIN_DRIVER ? driver_what : runtime_what)[id] = (unsigned char)w;
                found++;
            }
        }
    }
    by_name = !found;
    err = subscribe(&sub, on_callback, NULL);
    if (err) {
        if (result_string)
            result_string(err, &why);
        /* CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED (39): a profiler holds the one subscriber slot */
        fprintf(stderr, "drc hook: cuptiSubscribe failed (%d: %s)%s. Falling back to symbol interposition.\n", err,
                why, err == 39 ? ": another CUPTI subscriber (a profiler?) holds the one a process may have" : "");
        return -1;
    }
    for (domain = DOMAIN_DRIVER; domain <= DOMAIN_RUNTIME; domain++) {
        if (by_name) {
            enable_domain(1, sub, domain);
            continue;
        }
        for (id = 1; id < MAX_CBID; id++)
            if ((domain == DOMAIN_DRIVER ? driver_what : runtime_what)[id])
                enable(1, sub, domain, id);
    }
    if (drc__env(DRC__ENV_HOOK_DEBUG))
        fprintf(stderr, "drc hook: CUPTI monitor on (%d callbacks%s)\n", found, by_name ? ", by name" : "");
    return 0;   /* libcupti stays loaded: the subscriber lives as long as the process */
}
