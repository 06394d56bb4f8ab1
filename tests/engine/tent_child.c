/*
 * A program shaped like Mooncake's TENT engine (and NCCL's IB transport): it
 * does not link libibverbs. It opens it with dlopen(RTLD_LOCAL) and takes every
 * verbs call it makes by dlsym from that handle, so libibverbs is never in the
 * global scope and RTLD_NEXT from the preload cannot see it. test_verbs_preload
 * runs it with build/libdrc_verbs.so preloaded over the loopback provider
 * (build/loopnic/libibverbs.so.1, found through LD_LIBRARY_PATH), and without
 * it as a control.
 *
 * ibv_reg_mr from the handle is libibverbs's own, which reaches the preload's
 * ibv_reg_mr_iova2 through its PLT; drc must then find the real
 * ibv_reg_mr_iova2 in the privately loaded library. ibv_dereg_mr,
 * ibv_dealloc_pd and ibv_rereg_mr are taken as the preload's dlsym interposer
 * will answer them (drc's definitions: what dlsym(RTLD_DEFAULT) gives while
 * the preload is loaded; with DRC_TEST_DLSYM_SEAM=1, dlsym(handle) must give
 * them too). Host memory only: no CUDA needed. Exit 0 after "ok tent_dlopen".
 */
#include <dlfcn.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "loopnic_record.h"

#define ACCESS (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)
#define MiB (1ull << 20)

#define CHECK(cond, ...)                                                                                \
    do {                                                                                                \
        if (!(cond)) {                                                                                  \
            printf("FAIL %d: ", __LINE__);                                                              \
            printf(__VA_ARGS__);                                                                        \
            printf("\n");                                                                               \
            exit(1);                                                                                    \
        }                                                                                               \
    } while (0)

static void *lib;

/* What the engine gets for @name: the preload's answer (drc's definition) if it has one, else the library's. */
static void *engine_sym(const char *name)
{
    void *drc = dlsym(RTLD_DEFAULT, name), *own = dlsym(lib, name);

    CHECK(own, "libibverbs has no %s", name);
    if (getenv("DRC_TEST_DLSYM_SEAM"))
        CHECK(!drc || own == drc, "dlsym(handle, \"%s\") is libibverbs's own, not drc's", name);
    return drc ? drc : own;
}

static void *lib_sym(const char *name)
{
    void *p = dlsym(lib, name);

    CHECK(p, "no %s in the double", name);
    return p;
}

int main(void)
{
    struct ibv_device **(*get_list)(int *);
    struct ibv_context *(*open_dev)(struct ibv_device *);
    struct ibv_pd *(*alloc_pd)(struct ibv_context *);
    struct ibv_mr *(*reg)(struct ibv_pd *, void *, size_t, int);
    int (*dereg)(struct ibv_mr *), (*dealloc)(struct ibv_pd *);
    int (*rereg)(struct ibv_mr *, int, struct ibv_pd *, void *, size_t, int);
    size_t (*count)(enum ibvd_op), (*live)(void);
    int (*lkey_live)(uint32_t);
    struct ibv_device **list;
    struct ibv_pd *pd;
    struct ibv_mr *a, *b, *own;
    char *h;
    uint32_t key;
    int rc;

    lib = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL);
    CHECK(lib, "dlopen libibverbs.so.1: %s", dlerror());
    *(void **)&get_list = lib_sym("ibv_get_device_list");
    *(void **)&open_dev = lib_sym("ibv_open_device");
    *(void **)&alloc_pd = lib_sym("ibv_alloc_pd");
    *(void **)&count = lib_sym("ibvd_count");
    *(void **)&live = lib_sym("ibvd_live");
    *(void **)&lkey_live = lib_sym("ibvd_lkey_live");
    *(void **)&reg = lib_sym("ibv_reg_mr");     /* libibverbs's own: it calls ibv_reg_mr_iova2 through its PLT */
    *(void **)&dereg = engine_sym("ibv_dereg_mr");
    *(void **)&dealloc = engine_sym("ibv_dealloc_pd");
    *(void **)&rereg = engine_sym("ibv_rereg_mr");
    CHECK(dlsym(RTLD_DEFAULT, "ibvd_count") == NULL, "libibverbs is in the global scope: not TENT's shape");
    list = get_list(NULL);
    CHECK(list && list[0], "no device");
    pd = alloc_pd(open_dev(list[0]));
    CHECK(pd, "ibv_alloc_pd");
    h = mmap(NULL, 4 * MiB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(h != MAP_FAILED, "mmap");

    a = reg(pd, h, 4 * MiB, ACCESS);
    b = reg(pd, h + 4096, 8192, ACCESS);
    CHECK(a && b, "ibv_reg_mr failed: %s", strerror(errno));
    CHECK(a->addr == h && a->length == 4 * MiB && b->addr == h + 4096 && b->length == 8192, "caller MRs");
    CHECK(count(IBVD_REG_VA) == 1 && a->lkey == b->lkey, "%zu registrations for two nested ones: not served by drc",
          count(IBVD_REG_VA));
    key = a->lkey;
    errno = 0;
    rc = rereg(a, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0, IBV_ACCESS_LOCAL_WRITE);
    CHECK(count(IBVD_REREG) == 0, "ibv_rereg_mr of an MR of drc reached the provider");
    CHECK(rc == IBV_REREG_MR_ERR_INPUT && errno == EINVAL, "ibv_rereg_mr gave %d, errno %d", rc, errno);
    own = reg(pd, h, 1 * MiB, ACCESS | IBV_ACCESS_ON_DEMAND);   /* drc passes it through */
    CHECK(own && rereg(own, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0, ACCESS) == 0 && count(IBVD_REREG) == 1,
          "ibv_rereg_mr of the engine's own MR was not passed on");
    CHECK(dereg(a) == 0 && dereg(b) == 0 && dereg(own) == 0, "ibv_dereg_mr");
    CHECK(count(IBVD_DEREG_UNKNOWN) == 0, "an MR of drc reached the provider's ibv_dereg_mr");
    CHECK(lkey_live(key), "the idle MR should stay cached");
    CHECK(dealloc(pd) == 0, "ibv_dealloc_pd failed: drc's cached MR was left (EBUSY)");
    CHECK(!lkey_live(key) && live() == 0, "MRs left after ibv_dealloc_pd");
    printf("ok tent_dlopen\n");
    return 0;
}
