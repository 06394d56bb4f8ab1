/* The verbs ops table: see ops.h for the contract. */
#include "verbs/ops.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stddef.h>

static struct drc__verbs_ops default_ops;       /* filled once, from libibverbs.so.1 */
static pthread_once_t default_once = PTHREAD_ONCE_INIT;
static struct drc__verbs_ops installed_ops;     /* drc__verbs_install's copy */
static const struct drc__verbs_ops *current;    /* atomic: NULL means default_ops */

int drc__verbs_ops_fill(struct drc__verbs_ops *ops, drc__verbs_lookup_fn *lookup, void *arg)
{
#define GET(field, name, version) (*(void **)&ops->field = lookup(arg, name, version));
    DRC__VERBS_OPS(GET)
#undef GET
    return ops->query_device && ops->reg_mr_iova2 && ops->dereg_mr && ops->dealloc_pd ? 0 : -ENOSYS;
}

/* A library's own definition: its versioned one, else an unversioned one (a test double may have no nodes). */
static void *handle_lookup(void *handle, const char *name, const char *version)
{
    void *p = dlvsym(handle, name, version);

    return p ? p : dlsym(handle, name);
}

int drc__verbs_ops_dlopen(const char *path, struct drc__verbs_ops *ops, void **handle)
{
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);

    *handle = h;
    if (!h) {
        *ops = (struct drc__verbs_ops){ 0 };
        return -ENOENT;
    }
    return drc__verbs_ops_fill(ops, handle_lookup, h);
}

static void fill_default(void)
{
    void *h;

    drc__verbs_ops_dlopen("libibverbs.so.1", &default_ops, &h);     /* kept open: the table points into it */
}

const struct drc__verbs_ops *drc__verbs(void)
{
    const struct drc__verbs_ops *p = __atomic_load_n(&current, __ATOMIC_ACQUIRE);

    if (p)
        return p;
    pthread_once(&default_once, fill_default);
    return &default_ops;
}

void drc__verbs_install(const struct drc__verbs_ops *ops)
{
    if (!ops) {
        __atomic_store_n(&current, NULL, __ATOMIC_RELEASE);
        return;
    }
    installed_ops = *ops;
    __atomic_store_n(&current, &installed_ops, __ATOMIC_RELEASE);
}
