/*
 * A double of libcupti for the CUPTI monitor's test (DRC_MONITOR=cupti,
 * DRC_CUPTI_LIB=build/fakecuda/libcupti.so): there is no GPU in CI. It keeps
 * the one subscriber's callback and the callbacks enabled, names the driver
 * entry points the libcuda double (tests/doubles/fake_libcuda.c) reports, and hands the
 * double a function to report them with: the double calls it on entry to
 * and on exit from each of its frees, unmaps and teardowns, whichever way
 * the program reached them, as the driver does.
 */
#include <dlfcn.h>
#include <stdint.h>
#include <string.h>

typedef void cupti_callback(void *userdata, int domain, uint32_t cbid, const void *cbdata);

/* CUpti_CallbackData */
struct cbdata {
    int site;
    const char *function_name;
    const void *params;
    void *return_value;
    const char *symbol_name;
    void *context;
    uint32_t context_uid;
    uint64_t *correlation_data;
    uint32_t correlation_id;
};

enum { DOMAIN_DRIVER = 1, NOT_FOUND = 1, MULTIPLE_SUBSCRIBERS = 39 };

static const char *const names[] = { NULL, "cuMemFree_v2", "cuMemFreeAsync", "cuMemFreeAsync_ptsz", "cuMemUnmap",
                                     "cuMemFreeHost", "cuMemHostUnregister", "cuDevicePrimaryCtxReset_v2",
                                     "cuCtxDestroy_v2", "cuIpcCloseMemHandle",
                                     "cuDevicePrimaryCtxRelease_v2" };
enum { NAMES = sizeof(names) / sizeof(names[0]) };

static cupti_callback *callback;
static void *user;
static int enabled[NAMES];

int cuptiGetCallbackName(int domain, uint32_t cbid, const char **name);
int cuptiGetCallbackName(int domain, uint32_t cbid, const char **name)
{
    if (domain != DOMAIN_DRIVER || !cbid || cbid >= NAMES)
        return NOT_FOUND;
    *name = names[cbid];
    return 0;
}

int cuptiEnableCallback(uint32_t enable, void *sub, int domain, uint32_t cbid);
int cuptiEnableCallback(uint32_t enable, void *sub, int domain, uint32_t cbid)
{
    (void)sub;
    if (domain == DOMAIN_DRIVER && cbid < NAMES)
        enabled[cbid] = (int)enable;
    return 0;
}

int cuptiEnableDomain(uint32_t enable, void *sub, int domain);
int cuptiEnableDomain(uint32_t enable, void *sub, int domain)
{
    uint32_t i;

    for (i = 1; i < NAMES; i++)
        cuptiEnableCallback(enable, sub, domain, i);
    return 0;
}

/* What the libcuda double calls: @site 0 on entry, 1 on exit; @corr the call's scratch word. */
static void fire(const char *fn, int site, const void *params, uint64_t *corr)
{
    struct cbdata d = { site, fn, params, NULL, NULL, NULL, 0, corr, 0 };
    uint32_t i;

    for (i = 1; i < NAMES; i++)
        if (!strcmp(names[i], fn) && enabled[i] && callback)
            callback(user, DOMAIN_DRIVER, i, &d);
}

int cuptiSubscribe(void **sub, cupti_callback *cb, void *userdata);
int cuptiSubscribe(void **sub, cupti_callback *cb, void *userdata)
{
    void (*attach)(void (*)(const char *, int, const void *, uint64_t *));

    if (callback)
        return MULTIPLE_SUBSCRIBERS;
    callback = cb;
    user = userdata;
    *sub = &callback;
    *(void **)&attach = dlsym(RTLD_DEFAULT, "fake_cuda_set_cupti");
    if (attach)
        attach(fire);
    return 0;
}
