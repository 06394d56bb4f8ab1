/*
 * `drc doctor`: can this machine register GPU memory for RDMA, and how?
 * Each line is one fact, read from the kernel, the NVIDIA driver, libibverbs
 * and CUDA; the last line is the verdict with what to install. It runs on a
 * machine with no GPU and no NIC too, and says so. Exit status 0; with
 * --check, 1 when GPU memory cannot be registered.
 */
#include <dlfcn.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#include "core/config.h"
#include "cuda/cuda.h"
#include "tools/doctor.h"
#include "drc.h"
#include "drc_verbs.h"
#include "core/mem.h"
#include "verbs/ops.h"
#include "verbs/topo.h"
#include "verbs/verbs.h"

enum { TEST_BYTES = 64 << 20 };

struct findings {
    int kernel_ok;      /* >= 5.12 */
    int open_module;    /* 1 open, 0 proprietary, -1 no NVIDIA driver */
    int peermem;
    int nics, nic_dmabuf;
    int gpus, gpu_dmabuf;
    int export_ok;      /* -1 not tried */
    int reg_method;     /* -1 not tried, else drc_reg_method or negative errno */
};

static double now_us(void)
{
    struct timespec t;

    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static void kernel(struct findings *f)
{
    struct utsname u;
    int maj = 0, min = 0;

    if (uname(&u) == 0)
        sscanf(u.release, "%d.%d", &maj, &min);
    f->kernel_ok = maj > 5 || (maj == 5 && min >= 12);
    printf("kernel          %s: %s\n", uname(&u) == 0 ? u.release : "?",
           f->kernel_ok ? "dmabuf MRs possible (>= 5.12)" : "too old for dmabuf MRs (needs >= 5.12)");
}

static void nvidia_driver(struct findings *f)
{
    char line[256] = "";
    FILE *fp = fopen("/proc/driver/nvidia/version", "r");

    f->open_module = -1;
    if (fp) {
        if (fgets(line, sizeof(line), fp))
            line[strcspn(line, "\n")] = 0;
        fclose(fp);
        f->open_module = strstr(line, "Open Kernel Module") != NULL;
    }
    if (f->open_module < 0)
        printf("nvidia driver   none (/proc/driver/nvidia/version missing)\n");
    else
        printf("nvidia driver   %s\n                %s\n", line,
               f->open_module ? "open kernel module: exports dmabuf"
                              : "proprietary kernel module: no dmabuf export (install nvidia-open)");
    f->peermem = drc__verbs_peermem_loaded();
    printf("nvidia-peermem  %s\n", f->peermem ? "loaded" : "not loaded");
}

static int find_verbs(struct dl_phdr_info *info, size_t size, void *arg)
{
    (void)size;
    if (strstr(info->dlpi_name, "libibverbs.so"))
        snprintf(arg, 256, "%s", info->dlpi_name);
    return 0;
}

static void rdma(struct findings *f, struct ibv_pd **pd_out, struct ibv_context **ctx_out)
{
    const struct drc__verbs_ops *ops = drc__verbs();   /* loads libibverbs.so.1 */
    char lib[256] = "", real[4096];
    struct ibv_device **list;
    int i, n = 0;
    const char *v;

    if (!ops->get_device_list || !ops->open_device || !ops->alloc_pd || !ops->get_device_name ||
        !ops->free_device_list || !ops->dealloc_pd || !ops->close_device) {
        printf("rdma-core       libibverbs.so.1 not found or incomplete (install ibverbs-providers/rdma-core)\n");
        return;
    }
    dl_iterate_phdr(find_verbs, lib);
    v = lib[0] && realpath(lib, real) ? strrchr(real, '/') + 1 : "libibverbs (path unknown)";
    /* rdma-core names its library libibverbs.so.1.<abi>.<rdma-core version>.0 */
    printf("rdma-core       %s\n", v);
    list = ops->get_device_list(&n);
    f->nics = n;
    if (!list || n == 0) {
        printf("rdma devices    none\n");
        if (list)
            ops->free_device_list(list);
        return;
    }
    for (i = 0; i < n; i++) {
        struct ibv_context *ctx = ops->open_device(list[i]);
        struct ibv_pd *pd = ctx ? ops->alloc_pd(ctx) : NULL;
        int e = pd ? drc__verbs_probe_dmabuf(pd) : -ENODEV;

        printf("rdma device     %s: dmabuf %s%s%s\n", ops->get_device_name(list[i]),
               e == 0 ? "supported" : "NOT supported", e ? ": " : "", e ? drc__verbs_advice(e) : "");
        if (e == 0 || (e != -EOPNOTSUPP && e != -EPROTONOSUPPORT))
            f->nic_dmabuf++;
        if (pd && !*pd_out) {
            *pd_out = pd;       /* the first device is used for the registration test */
            *ctx_out = ctx;
            continue;
        }
        if (pd)
            ops->dealloc_pd(pd);
        if (ctx)
            ops->close_device(ctx);
    }
    ops->free_device_list(list);
}

static int attr(int dev, int a)
{
    int v = -1;

    return drc__cuda_device_attr(dev, a, &v) == 0 ? v : -1;
}

static void try_gpu(struct findings *f, struct ibv_pd *pd)
{
    const struct drc__cuda_driver *d = drc__cuda_driver();
    struct drc_config cfg = { .flags = 0, .policy = DRC_DMABUF_THEN_PEERMEM };
    unsigned long long p = 0;
    struct drc__mem m;
    drc_cache_t *c = NULL;
    drc_region_t *r;
    void *ctx = NULL, *old = NULL;
    uint64_t off;
    double t0, t1;
    int fd, e;

    if (!d->cuDevicePrimaryCtxRetain || !d->cuMemAlloc || d->cuDevicePrimaryCtxRetain(&ctx, 0) ||
        d->cuCtxGetCurrent(&old) || d->cuCtxSetCurrent(ctx) || d->cuMemAlloc(&p, TEST_BYTES)) {
        printf("test            could not allocate %d MiB on GPU 0\n", TEST_BYTES >> 20);
        return;
    }
    e = drc__mem_classify((uintptr_t)p, TEST_BYTES, &m);
    t0 = now_us();
    if (!e)
        e = drc__mem_export(&m, (uintptr_t)p, TEST_BYTES, NULL, &fd, &off);
    t1 = now_us();
    f->export_ok = e == 0;
    if (e)
        printf("test            export of %d MiB: FAILED: %s\n", TEST_BYTES >> 20, drc_strerror(e));
    else {
        printf("test            export of %d MiB: dmabuf fd ok in %.0f us\n", TEST_BYTES >> 20, t1 - t0);
        close(fd);
    }
    if (pd && drc_cache_create_verbs(pd, &cfg, &c) == 0) {
        t0 = now_us();
        e = drc_get(c, (void *)(uintptr_t)p, TEST_BYTES, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ |
                                                          IBV_ACCESS_REMOTE_WRITE, &r);
        t1 = now_us();
        f->reg_method = drc_cache_verbs_method(c, 0);
        if (e)
            printf("test            registration through the cache FAILED: %s (%s)\n", drc_strerror(e),
                   drc__verbs_reason(c, 0));
        else {
            printf("test            registered through the cache via %s in %.0f us (%s)\n",
                   f->reg_method == DRC_METHOD_DMABUF ? "dmabuf" : "peermem", t1 - t0, drc__verbs_reason(c, 0));
            t0 = now_us();
            drc_put(c, r);
            drc_get(c, (void *)(uintptr_t)p, TEST_BYTES, IBV_ACCESS_LOCAL_WRITE, &r);
            t1 = now_us();
            printf("test            a hit on it: %.2f us\n", t1 - t0);
            drc_put(c, r);
        }
        if (e)
            f->reg_method = e;
        drc_notify_free((void *)(uintptr_t)p, TEST_BYTES);
        drc_cache_destroy(c);
    }
    d->cuMemFree(p);
    d->cuCtxSetCurrent(old);
}

static void gpus(struct findings *f, struct ibv_pd *pd)
{
    const struct drc__cuda_driver *d = drc__cuda_driver();
    int i, n = 0, ver = 0, rc;
    char name[128];

    if (!d) {
        printf("cuda            no usable libcuda.so.1 (not installed, or older than CUDA 11.7)\n");
        return;
    }
    if (d->cuInit && (rc = d->cuInit(0)) != 0) {
        printf("cuda            cuInit failed: CUresult %d (%s)\n", rc, drc_strerror(drc__cuda_errno(rc)));
        return;
    }
    if (d->cuDriverGetVersion && d->cuDriverGetVersion(&ver) == 0)
        printf("cuda            driver API %d.%d\n", ver / 1000, ver % 1000 / 10);
    if (!d->cuDeviceGetCount || d->cuDeviceGetCount(&n) != 0)
        n = 0;
    f->gpus = n;
    for (i = 0; i < n; i++) {
        int dev = i, dmabuf = attr(i, DRC__CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED);

        if (!d->cuDeviceGet || d->cuDeviceGet(&dev, i) || !d->cuDeviceGetName ||
            d->cuDeviceGetName(name, sizeof(name), dev))
            snprintf(name, sizeof(name), "?");
        printf("gpu %-11d %s: DMA_BUF_SUPPORTED %d, GPU_DIRECT_RDMA_SUPPORTED %d, "
               "GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED %d\n",
               i, name, dmabuf, attr(i, DRC__CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED),
               attr(i, DRC__CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED));
        f->gpu_dmabuf += dmabuf == 1;
    }
    if (n == 0)
        printf("gpus            none\n");
    else
        try_gpu(f, pd);
}

/* The dmabuf mapping type of each (GPU, NIC) pair, as a verbs cache decides it (drc_verbs.h). */
static void mappings(const struct findings *f)
{
    const struct drc__verbs_ops *ops = drc__verbs();
    long long env = drc__env(DRC__ENV_DMABUF_MAPPING);
    const char *why, *name;
    struct ibv_device **list;
    char bus[32];
    int g, i, n = 0, path;

    if (!f->gpus || !ops->get_device_list || !ops->get_device_name || !ops->free_device_list)
        return;
    list = ops->get_device_list(&n);
    for (g = 0; list && g < f->gpus; g++) {
        if (drc__cuda_pci_bus_id(g, bus, sizeof(bus)))
            snprintf(bus, sizeof(bus), "?");
        for (i = 0; i < n; i++) {
            name = ops->get_device_name(list[i]);
            int m = drc__verbs_mapping(g, name, 0, &path, &why);

            printf("mapping         gpu %d (%s) - %s: %s (%s)\n", g, bus, name, drc__topo_mapping_name(m), why);
        }
    }
    if (list)
        ops->free_device_list(list);
    if (drc__env_state(DRC__ENV_DMABUF_MAPPING) == DRC__ENV_VALID)
        printf("mapping         DRC_DMABUF_MAPPING=%s\n", env == DRC__MAPPING_ENV_PCIE      ? "pcie"
                                                        : env == DRC__MAPPING_ENV_DEFAULT ? "default"
                                                                                          : "auto");
}

static void verdict(const struct findings *f)
{
    printf("verdict         ");
    if (f->reg_method == DRC_METHOD_DMABUF)
        printf("GPU memory can be registered: via dmabuf\n");
    else if (f->reg_method == DRC_METHOD_PEERMEM)
        printf("GPU memory can be registered: via nvidia-peermem (ibv_reg_mr); dmabuf is not available\n");
    else if (f->gpus == 0 && f->nics == 0)
        printf("GPU memory cannot be registered: no GPU and no RDMA device here\n");
    else if (f->gpus == 0)
        printf("GPU memory cannot be registered: no CUDA GPU (install the NVIDIA open kernel module and CUDA)\n");
    else if (f->nics == 0)
        printf("GPU memory cannot be registered: no RDMA device (install rdma-core and the NIC driver)%s\n",
               f->export_ok == 1 ? "; the GPU side works: dmabuf export succeeded" : "");
    else if (!f->kernel_ok)
        printf("GPU memory cannot be registered: the kernel is older than 5.12 and %s\n",
               f->peermem ? "peermem registration failed" : "nvidia-peermem is not loaded");
    else if (f->export_ok == 0 || !f->gpu_dmabuf)
        printf("GPU memory cannot be registered: the GPU driver does not export dmabuf (install nvidia-open) "
               "and %s\n", f->peermem ? "peermem registration failed" : "nvidia-peermem is not loaded");
    else if (!f->nic_dmabuf)
        printf("GPU memory cannot be registered: the NIC has no dmabuf support (update rdma-core and the NIC "
               "driver) and %s\n", f->peermem ? "peermem registration failed" : "nvidia-peermem is not loaded");
    else
        printf("GPU memory cannot be registered: %s\n", drc_strerror(f->reg_method));
}

int drc__doctor(int argc, char **argv)
{
    struct findings f = { 0, -1, 0, 0, 0, 0, 0, -1, -1 };
    struct ibv_context *ctx = NULL;
    struct ibv_pd *pd = NULL;

    int check = argc >= 2 && !strcmp(argv[1], "--check");

    printf("drc doctor: can this machine register GPU memory for RDMA?\n");
    kernel(&f);
    nvidia_driver(&f);
    rdma(&f, &pd, &ctx);
    gpus(&f, pd);
    mappings(&f);
    if (pd)
        drc__verbs()->dealloc_pd(pd);     /* both set only where rdma() found the table complete */
    if (ctx)
        drc__verbs()->close_device(ctx);
    verdict(&f);
    /* The diagnosis itself succeeded; --check makes "cannot register" an exit status for scripts. */
    return check && f.reg_method != DRC_METHOD_DMABUF && f.reg_method != DRC_METHOD_PEERMEM;
}
