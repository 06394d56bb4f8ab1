/*
 * The program test_verbs_preload runs with build/libdrc_verbs.so preloaded
 * over the one libibverbs DOUBLE, the loopback provider (build/loopnic/libibverbs.so.1), and
 * with CUDA from the libcuda DOUBLE in CI or the real driver on a GPU
 * machine (the same program, the same checks). It registers the way a
 * transfer engine does — ibv_reg_mr on GPU and host buffers, ibv_dereg_mr
 * when done — and checks what the engine and the NIC would see, by reading
 * the provider's record of calls (src/loopnic/loopnic_record.h). argv[1] names the scenario; exit 0 and a
 * last line "ok <scenario>" when every check held, else 1 after a line
 * "FAIL <line>: <what>".
 */
#include <dlfcn.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <jemalloc/jemalloc.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "../doubles/fake_libcuda.h"    /* the CUDA double's record (struct fake_cuda), reached by dlsym */
#include "loopnic_record.h"
#include "rcqp.h"

#define ACCESS (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)
#define MiB (1ull << 20)

static int fails;

static void check_at(int ok, int line, const char *fmt, ...)
{
    va_list ap;

    if (ok)
        return;
    printf("FAIL %d: ", line);
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    fflush(stdout);
    fails++;
    exit(1);
}
#define CHECK(cond, ...) check_at(!!(cond), __LINE__, __VA_ARGS__)

/* ---- CUDA, real or the double, through dlopen as an engine's runtime would ---- */
static int (*cu_alloc)(unsigned long long *, size_t);
static int (*cu_free)(unsigned long long);
static int fake_cuda;

static void cuda_open(void)
{
    int (*init)(unsigned), (*dev_get)(int *, int), (*retain)(void **, int), (*set)(void *);
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    void *ctx = NULL;
    int dev = 0;

    CHECK(h, "no libcuda.so.1: %s", dlerror());
    *(void **)&init = dlsym(h, "cuInit");
    *(void **)&dev_get = dlsym(h, "cuDeviceGet");
    *(void **)&retain = dlsym(h, "cuDevicePrimaryCtxRetain");
    *(void **)&set = dlsym(h, "cuCtxSetCurrent");
    *(void **)&cu_alloc = dlsym(h, "cuMemAlloc_v2");
    *(void **)&cu_free = dlsym(h, "cuMemFree_v2");
    fake_cuda = dlsym(h, "fakecu_exports") != NULL;
    CHECK(init && dev_get && retain && set && cu_alloc && cu_free, "libcuda lacks an entry point");
    CHECK(init(0) == 0 && dev_get(&dev, 0) == 0 && retain(&ctx, dev) == 0 && set(ctx) == 0, "no CUDA context");
}

static void *gpu_alloc(size_t len)
{
    unsigned long long p = 0;

    CHECK(cu_alloc(&p, len) == 0 && p, "cuMemAlloc of %zu", len);
    return (void *)(uintptr_t)p;
}

/* ---- verbs ---- */
static struct ibv_pd *open_pd(void)
{
    struct ibv_device **list = ibv_get_device_list(NULL);
    struct ibv_context *ctx;
    struct ibv_pd *pd;

    CHECK(list && list[0], "no RDMA device (is the double on LD_LIBRARY_PATH?)");
    CHECK(!strcmp(ibv_get_device_name(list[0]), "loop0"), "not loopnic: %s", ibv_get_device_name(list[0]));
    ctx = ibv_open_device(list[0]);
    ibv_free_device_list(list);
    CHECK(ctx, "ibv_open_device");
    pd = ibv_alloc_pd(ctx);
    CHECK(pd, "ibv_alloc_pd");
    return pd;
}

/* Calls of @op recorded since index @from. */
static size_t since(size_t from, enum ibvd_op op)
{
    struct ibvd_call c;
    size_t n = 0;

    for (; ibvd_call(from, &c); from++)
        n += c.op == op;
    return n;
}

/* The last recorded call of @op, 1 if there is one. */
static int last(enum ibvd_op op, struct ibvd_call *out)
{
    struct ibvd_call c;
    size_t i;
    int found = 0;

    for (i = 0; ibvd_call(i, &c); i++)
        if (c.op == op) {
            *out = c;
            found = 1;
        }
    return found;
}

/* The @n-th call of @op recorded since index @from, 1 if there is one. */
static int nth_reg(size_t from, enum ibvd_op op, int n, struct ibvd_call *out)
{
    struct ibvd_call c;

    for (; ibvd_call(from, &c); from++)
        if (c.op == op && n-- == 0) {
            *out = c;
            return 1;
        }
    return 0;
}

static unsigned registered_access(uint32_t lkey);

/* The recorded deregistration of the MR with @lkey, 1 if there is one. */
static int dereg_of(uint32_t lkey, struct ibvd_call *out)
{
    struct ibvd_call c;
    size_t i;

    for (i = 0; ibvd_call(i, &c); i++)
        if (c.op == IBVD_DEREG && c.lkey == lkey) {
            *out = c;
            return 1;
        }
    return 0;
}

/* Engine-style registration with run-time flags: verbs.h sends it to ibv_reg_mr_iova2. */
static struct ibv_mr *reg_runtime(struct ibv_pd *pd, void *addr, size_t len, int access)
{
    return ibv_reg_mr(pd, addr, len, access);
}

/* The caller's own MR: its fields as ibv_reg_mr would have made them, keys of a live MR. */
static void check_caller_mr(const struct ibv_mr *mr, struct ibv_pd *pd, void *addr, size_t len)
{
    CHECK(mr, "registration of %p+%zu failed: %s", addr, len, strerror(errno));
    CHECK(mr->addr == addr && mr->length == len, "caller MR reads %p+%zu, asked %p+%zu", mr->addr, mr->length,
          addr, len);
    CHECK(mr->pd == pd && mr->context == pd->context, "caller MR has another pd/context");
    CHECK(ibvd_lkey_live(mr->lkey), "caller MR's lkey 0x%x is no registered MR", mr->lkey);
}

static void gpu_dedup(void)
{
    struct ibv_pd *pd = open_pd();
    char *g = gpu_alloc(64 * MiB);
    struct ibv_mr *whole, *part, *tiny, *ro;
    struct ibvd_call d;
    size_t from = ibvd_ncalls();

    whole = ibv_reg_mr(pd, g, 64 * MiB, ACCESS);
    check_caller_mr(whole, pd, g, 64 * MiB);
    part = ibv_reg_mr(pd, g + 4096 + 100, 1 * MiB, ACCESS);
    check_caller_mr(part, pd, g + 4096 + 100, 1 * MiB);
    tiny = reg_runtime(pd, g + 8 * MiB + 17, 64, IBV_ACCESS_LOCAL_WRITE);
    check_caller_mr(tiny, pd, g + 8 * MiB + 17, 64);
    CHECK(since(from, IBVD_REG_DMABUF) == 2, "%zu dmabuf registrations for 3 nested ones (one local-only), want 2",
          since(from, IBVD_REG_DMABUF));
    CHECK(since(from, IBVD_REG_VA) == 0, "GPU memory reached ibv_reg_mr (peermem path) %zu times",
          since(from, IBVD_REG_VA));
    CHECK(nth_reg(from, IBVD_REG_DMABUF, 0, &d), "no dmabuf registration recorded");
    CHECK(d.iova == (uintptr_t)g && d.len == 64 * MiB, "dmabuf MR covers 0x%llx+%zu, want %p+%llu",
          (unsigned long long)d.iova, d.len, (void *)g, 64 * MiB);
    CHECK(d.offset + d.len <= (unsigned long long)d.fd_size, "dmabuf range past the end of the fd");
    if (fake_cuda)
        CHECK(!strncmp(d.fd_link, "/memfd:fake-dmabuf", 18), "fd is %s", d.fd_link);
    else
        CHECK(strstr(d.fd_link, "dmabuf") != NULL, "the fd registered is no dmabuf: %s", d.fd_link);
    CHECK(whole->lkey == d.lkey && whole->rkey == d.rkey && part->lkey == d.lkey && part->rkey == d.rkey,
          "caller keys differ from the cached MR's");
    /* the local-only one: an MR of its own (widened to the allocation), whose rkey allows no remote access */
    CHECK(tiny->rkey != d.rkey && registered_access(tiny->lkey) == IBV_ACCESS_LOCAL_WRITE,
          "the LOCAL_WRITE registration shares an MR with access 0x%x", registered_access(tiny->lkey));
    CHECK(whole->handle == d.mr->handle, "handle not the cached MR's");
    CHECK(whole != d.mr && part != whole, "callers share an ibv_mr");
    CHECK(d.mr->addr == (void *)(uintptr_t)d.offset, "the double did not leave the offset in mr->addr");
    ro = reg_runtime(pd, g, 2 * MiB, ACCESS | IBV_ACCESS_RELAXED_ORDERING);
    check_caller_mr(ro, pd, g, 2 * MiB);
    CHECK(ibv_dereg_mr(ro) == 0 && ibv_dereg_mr(tiny) == 0 && ibv_dereg_mr(part) == 0 && ibv_dereg_mr(whole) == 0,
          "ibv_dereg_mr of a caller MR failed");
    CHECK(since(from, IBVD_DEREG_UNKNOWN) == 0, "a caller MR reached the real ibv_dereg_mr");
    CHECK(ibv_dealloc_pd(pd) == 0, "ibv_dealloc_pd after every dereg");
    CHECK(ibvd_live() == 0, "%zu MRs left registered after ibv_dealloc_pd", ibvd_live());
}

static void overlap(void)
{
    struct ibv_pd *pd = open_pd();
    char *g = gpu_alloc(8 * MiB);
    struct ibv_mr *a, *b;

    a = ibv_reg_mr(pd, g, 2 * MiB, ACCESS);
    b = ibv_reg_mr(pd, g + 1 * MiB, 2 * MiB, ACCESS);   /* overlaps a: Mooncake refuses this itself */
    check_caller_mr(a, pd, g, 2 * MiB);
    check_caller_mr(b, pd, g + 1 * MiB, 2 * MiB);
    CHECK(ibv_dereg_mr(a) == 0, "dereg a");
    CHECK(ibvd_lkey_live(b->lkey), "b's MR went with a");
    CHECK(ibv_dereg_mr(b) == 0, "dereg b");
    CHECK(ibvd_count(IBVD_DEREG_UNKNOWN) == 0, "a caller MR reached the real ibv_dereg_mr");
    CHECK(ibv_dealloc_pd(pd) == 0 && ibvd_live() == 0, "MRs left after ibv_dealloc_pd");
}

static void refcount(void)
{
    struct ibv_pd *pd = open_pd();
    char *g = gpu_alloc(4 * MiB);
    struct ibv_mr *a, *b;
    size_t from = ibvd_ncalls();
    uint32_t key;

    a = ibv_reg_mr(pd, g, 4 * MiB, ACCESS);
    b = ibv_reg_mr(pd, g, 4 * MiB, ACCESS);
    check_caller_mr(a, pd, g, 4 * MiB);
    check_caller_mr(b, pd, g, 4 * MiB);
    CHECK(a != b && a->lkey == b->lkey, "two registrations of one range: %s",
          a == b ? "same ibv_mr" : "different MRs");
    key = a->lkey;
    CHECK(ibv_dereg_mr(a) == 0, "dereg a");
    CHECK(ibvd_lkey_live(key) && ibvd_count(IBVD_DEREG) == 0, "the MR went while b still holds it");
    CHECK(ibv_dealloc_pd(pd) == EBUSY, "ibv_dealloc_pd with b registered did not say EBUSY");
    CHECK(ibvd_lkey_live(key), "the MR went while b still holds it");
    CHECK(ibv_dereg_mr(b) == 0, "dereg b");
    CHECK(ibvd_lkey_live(key), "an idle MR should stay cached");
    CHECK(ibv_dealloc_pd(pd) == 0, "ibv_dealloc_pd");
    CHECK(since(from, IBVD_DEREG) == 1 && !ibvd_lkey_live(key), "the cached MR was not deregistered once");
}

static void passthrough(void)
{
    struct ibv_pd *pd = open_pd();
    char *h = mmap(NULL, 2 * MiB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    struct ibv_mr *iova, *odp, *dma;
    struct ibvd_call c;
    int fd = memfd_create("app-dmabuf", 0);

    CHECK(h != MAP_FAILED && fd >= 0 && ftruncate(fd, 2 * MiB) == 0, "setup");
    iova = ibv_reg_mr_iova(pd, h, 1 * MiB, 0x10000, ACCESS);     /* another iova: drc cannot share it */
    CHECK(iova && last(IBVD_REG_VA, &c) && c.mr == iova && c.iova == 0x10000, "iova registration not passed on");
    odp = ibv_reg_mr(pd, h, 1 * MiB, ACCESS | IBV_ACCESS_ON_DEMAND);
    CHECK(odp && last(IBVD_REG_VA, &c) && c.mr == odp, "ON_DEMAND registration not passed on");
    dma = ibv_reg_dmabuf_mr(pd, 0, 1 * MiB, 0, fd, ACCESS);
    CHECK(dma && last(IBVD_REG_DMABUF, &c) && c.mr == dma, "the engine's own dmabuf MR not passed on");
    CHECK(ibv_dereg_mr(iova) == 0 && ibv_dereg_mr(odp) == 0 && ibv_dereg_mr(dma) == 0,
          "dereg of MRs drc did not make");
    CHECK(ibvd_count(IBVD_DEREG) == 3 && ibvd_count(IBVD_DEREG_UNKNOWN) == 0, "unknown MRs not deregistered as they are");
    CHECK(ibv_dealloc_pd(pd) == 0 && ibvd_live() == 0, "MRs left");
}

static char *host_buffer(size_t len, int fill)
{
    char *h = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

    CHECK(h != MAP_FAILED, "mmap");
    memset(h, fill, len);
    return h;
}

/*
 * A second ibv_dereg_mr of an MR already deregistered (the engine's bug) is refused with EINVAL and
 * reaches no provider: the cached MR another registration still holds keeps its keys. (The provider,
 * handed a copy naming one of its MRs, deregisters that MR by its handle, as the kernel would.) A
 * registration that reuses the freed MR's memory reads as its own.
 */
static void stale_dereg(void)
{
    struct ibv_pd *pd = open_pd();
    char *h = host_buffer(1 * MiB, 1);
    struct ibv_mr *whole, *a, *b;
    uint32_t key;

    whole = ibv_reg_mr(pd, h, 1 * MiB, ACCESS);
    a = ibv_reg_mr(pd, h + 4096, 4096, ACCESS);
    check_caller_mr(whole, pd, h, 1 * MiB);
    check_caller_mr(a, pd, h + 4096, 4096);
    key = whole->lkey;
    CHECK(ibv_dereg_mr(a) == 0, "dereg a");
    CHECK(ibv_dereg_mr(a) == EINVAL, "a second dereg of a freed MR was not refused");
    CHECK(ibvd_count(IBVD_DEREG_UNKNOWN) == 0, "a freed MR reached the provider");
    CHECK(ibvd_lkey_live(key) && ibvd_count(IBVD_DEREG) == 0, "the MR still held went with the stale dereg");
    b = ibv_reg_mr(pd, h + 8192, 4096, ACCESS);
    check_caller_mr(b, pd, h + 8192, 4096);
    CHECK(ibv_dereg_mr(b) == 0 && ibv_dereg_mr(whole) == 0, "dereg b, whole");
    CHECK(ibv_dealloc_pd(pd) == 0 && ibvd_live() == 0, "MRs left");
}

/*
 * Threads register and deregister sub-ranges of one registered buffer on one PD, handing MRs to each
 * other to deregister, while another thread allocates PDs, registers on them and deallocates them
 * (each dealloc drops that PD's cache). Every MR reads as asked and is a hit (the provider registers
 * the buffer once, and each cycled PD's range once), every dereg and dealloc succeeds, nothing is
 * left registered at the end.
 */
enum { T_WORKERS = 4, T_ITERS = 3000, T_CYCLES = 200 };

static struct {
    struct ibv_pd *pd;
    char *buf, *other;
    struct ibv_mr *mailbox[T_WORKERS];  /* atomic: an MR for the next worker to deregister */
    int stop;                           /* atomic */
} tp;

static void *tp_worker(void *arg)
{
    int w = (int)(intptr_t)arg, i;

    for (i = 0; i < T_ITERS; i++) {
        size_t off = (size_t)((w * T_ITERS + i) % 255) * 4096 + 64;
        struct ibv_mr *mr = ibv_reg_mr(tp.pd, tp.buf + off, 1000, ACCESS), *theirs;

        check_caller_mr(mr, tp.pd, tp.buf + off, 1000);
        theirs = __atomic_exchange_n(&tp.mailbox[(w + 1) % T_WORKERS], mr, __ATOMIC_ACQ_REL);
        CHECK(!theirs || ibv_dereg_mr(theirs) == 0, "dereg of another thread's MR");
    }
    return NULL;
}

static void *tp_pd_cycler(void *arg)
{
    struct ibv_context *ctx = arg;
    int n = 0;

    while (!__atomic_load_n(&tp.stop, __ATOMIC_ACQUIRE) || n < 2) {
        struct ibv_pd *pd = ibv_alloc_pd(ctx);
        struct ibv_mr *mr;

        CHECK(pd, "ibv_alloc_pd");
        mr = ibv_reg_mr(pd, tp.other, 1 * MiB, ACCESS);
        check_caller_mr(mr, pd, tp.other, 1 * MiB);
        CHECK(ibv_dereg_mr(mr) == 0, "dereg on a cycled PD");
        CHECK(ibv_dealloc_pd(pd) == 0, "ibv_dealloc_pd of a cycled PD");
        if (++n >= T_CYCLES)
            break;
    }
    return (void *)(intptr_t)n;
}

static void threads_pds(void)
{
    pthread_t t[T_WORKERS], cycler;
    struct ibv_mr *whole;
    void *cycles;
    size_t regs;
    int i;

    tp.pd = open_pd();
    tp.buf = host_buffer(1 * MiB, 1);
    tp.other = host_buffer(1 * MiB, 2);
    whole = ibv_reg_mr(tp.pd, tp.buf, 1 * MiB, ACCESS);
    check_caller_mr(whole, tp.pd, tp.buf, 1 * MiB);
    CHECK(pthread_create(&cycler, NULL, tp_pd_cycler, tp.pd->context) == 0, "pthread_create");
    for (i = 0; i < T_WORKERS; i++)
        CHECK(pthread_create(&t[i], NULL, tp_worker, (void *)(intptr_t)i) == 0, "pthread_create");
    for (i = 0; i < T_WORKERS; i++)
        pthread_join(t[i], NULL);
    __atomic_store_n(&tp.stop, 1, __ATOMIC_RELEASE);
    pthread_join(cycler, &cycles);
    for (i = 0; i < T_WORKERS; i++)
        CHECK(!tp.mailbox[i] || ibv_dereg_mr(tp.mailbox[i]) == 0, "dereg of the last MRs");
    regs = ibvd_count(IBVD_REG_VA);
    CHECK(regs == 1 + (size_t)(intptr_t)cycles, "%zu registrations reached the provider for %d on the buffer "
          "and %d on cycled PDs: not served by the PDs' caches", regs, T_WORKERS * T_ITERS + 1,
          (int)(intptr_t)cycles);
    CHECK(ibv_dereg_mr(whole) == 0, "dereg whole");
    CHECK(ibv_dealloc_pd(tp.pd) == 0 && ibvd_live() == 0, "MRs left");
}

/* Host memory that goes back to the OS is invalidated first: munmap. */
static void host_munmap(void)
{
    struct ibv_pd *pd = open_pd();
    char *h = host_buffer(1 * MiB, 0xa5), *again;
    struct ibv_mr *mr, *held, *fresh;
    struct ibvd_call c;
    uint32_t key;
    size_t from;

    mr = ibv_reg_mr(pd, h, 1 * MiB, ACCESS);
    check_caller_mr(mr, pd, h, 1 * MiB);
    key = mr->lkey;
    CHECK(ibv_dereg_mr(mr) == 0 && ibvd_lkey_live(key), "idle host MR not cached");
    CHECK(munmap(h, 1 * MiB) == 0, "munmap");
    CHECK(dereg_of(key, &c), "munmap did not deregister the cached MR");
    CHECK(c.mapped && c.first_byte == 0xa5, "the MR was deregistered after the memory went (mapped %d, byte %d)",
          c.mapped, c.first_byte);

    /* held across the munmap: a new mapping at the same address must not hit the old MR */
    h = host_buffer(1 * MiB, 0x11);
    held = ibv_reg_mr(pd, h, 1 * MiB, ACCESS);
    check_caller_mr(held, pd, h, 1 * MiB);
    key = held->lkey;
    CHECK(munmap(h, 1 * MiB) == 0, "munmap");
    CHECK(ibvd_lkey_live(key), "an MR still held by the engine was deregistered under it");
    again = mmap(h, 1 * MiB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    CHECK(again == h, "could not map the same address again");
    from = ibvd_ncalls();
    fresh = ibv_reg_mr(pd, again, 1 * MiB, ACCESS);
    check_caller_mr(fresh, pd, again, 1 * MiB);
    CHECK(since(from, IBVD_REG_VA) == 1 && fresh->lkey != key, "the new mapping was served the stale MR");
    CHECK(ibv_dereg_mr(held) == 0 && !ibvd_lkey_live(key), "the stale MR outlived its last dereg");
    CHECK(ibv_dereg_mr(fresh) == 0 && munmap(again, 1 * MiB) == 0, "cleanup");
    CHECK(ibv_dealloc_pd(pd) == 0 && ibvd_live() == 0, "MRs left");
}

static void host_madvise(void)
{
    struct ibv_pd *pd = open_pd();
    char *h = host_buffer(2 * MiB, 0x5a);
    struct ibv_mr *mr;
    struct ibvd_call c;
    uint32_t key;
    size_t from;

    mr = ibv_reg_mr(pd, h, 2 * MiB, ACCESS);
    check_caller_mr(mr, pd, h, 2 * MiB);
    key = mr->lkey;
    CHECK(ibv_dereg_mr(mr) == 0, "dereg");
    CHECK(madvise(h + 1 * MiB, 4096, MADV_DONTNEED) == 0, "madvise");
    CHECK(dereg_of(key, &c), "madvise(DONTNEED) did not deregister the MR");
    CHECK(c.first_byte == 0x5a, "the MR was deregistered after the pages went");
    CHECK(h[1 * MiB] == 0, "MADV_DONTNEED did not drop the page");
    from = ibvd_ncalls();
    mr = ibv_reg_mr(pd, h, 2 * MiB, ACCESS);
    check_caller_mr(mr, pd, h, 2 * MiB);
    CHECK(since(from, IBVD_REG_VA) == 1, "registration after madvise hit the old MR");
    key = mr->lkey;
    CHECK(ibv_dereg_mr(mr) == 0 && madvise(h, 2 * MiB, MADV_WILLNEED) == 0 && ibvd_lkey_live(key),
          "MADV_WILLNEED must not invalidate");
    CHECK(ibv_dealloc_pd(pd) == 0 && ibvd_live() == 0, "MRs left");
}

/* drc_host_alloc memory: invalidated when jemalloc purges it, not before. */
static void host_jemalloc(void)
{
    void *(*host_alloc)(size_t);
    void (*host_free)(void *);
    struct ibv_pd *pd = open_pd();
    struct ibv_mr *mr;
    struct ibvd_call c;
    uint32_t key;
    char *p;

    /* libdrc_host lies beside the libdrc.so the preload brought; this program links jemalloc, so
     * loading it now is fine (the preload itself never brings jemalloc) */
    if (!dlsym(RTLD_DEFAULT, "drc_host_alloc")) {
        Dl_info where;
        char path[4096], *slash;
        void *version = dlsym(RTLD_DEFAULT, "drc_version");

        if (version && dladdr(version, &where) && where.dli_fname) {
            snprintf(path, sizeof(path), "%s", where.dli_fname);
            slash = strrchr(path, '/');
            snprintf(slash ? slash + 1 : path, sizeof(path) - (size_t)(slash ? slash + 1 - path : 0),
                     "libdrc_host.so.0");
            void *host = dlopen(path, RTLD_NOW | RTLD_GLOBAL);

            CHECK(host, "dlopen %s: %s", path, host ? "" : dlerror());
        } else {
            CHECK(0, "libdrc.so is not loaded");
        }
    }
    *(void **)&host_alloc = dlsym(RTLD_DEFAULT, "drc_host_alloc");
    *(void **)&host_free = dlsym(RTLD_DEFAULT, "drc_host_free");
    CHECK(host_alloc && host_free, "drc_host_alloc is not exported by libdrc_host");
    p = host_alloc(4 * MiB);
    CHECK(p, "drc_host_alloc");
    memset(p, 0xc3, 4 * MiB);
    ibvd_probe(p);
    mr = ibv_reg_mr(pd, p, 4 * MiB, ACCESS);
    check_caller_mr(mr, pd, p, 4 * MiB);
    key = mr->lkey;
    CHECK(ibv_dereg_mr(mr) == 0, "dereg");
    host_free(p);
    CHECK(ibvd_lkey_live(key), "freed but not yet given back: the MR should stay (the pages are the same)");
    CHECK(mallctl("arena.4096.purge", NULL, NULL, NULL, 0) == 0, "purge");
    CHECK(dereg_of(key, &c), "jemalloc's purge did not deregister the MR");
    CHECK(c.mapped && c.first_byte == 0xc3, "deregistered after the pages went (byte %d)", c.first_byte);
    CHECK(ibv_dealloc_pd(pd) == 0 && ibvd_live() == 0, "MRs left");
}

/* DRC_VERBS_HOST=passthrough: host registrations straight to the library, GPU ones cached. */
static void host_passthrough(void)
{
    struct ibv_pd *pd = open_pd();
    char *h = host_buffer(1 * MiB, 1), *g = gpu_alloc(2 * MiB);
    struct ibv_mr *a, *b, *x, *y;
    struct ibvd_call c;
    size_t from = ibvd_ncalls();

    a = ibv_reg_mr(pd, h, 1 * MiB, ACCESS);
    CHECK(a && last(IBVD_REG_VA, &c) && c.mr == a, "host registration was not passed through");
    b = ibv_reg_mr(pd, h, 1 * MiB, ACCESS);
    CHECK(b && b != a && since(from, IBVD_REG_VA) == 2, "host registrations were cached");
    x = ibv_reg_mr(pd, g, 2 * MiB, ACCESS);
    y = ibv_reg_mr(pd, g, 1 * MiB, ACCESS);
    check_caller_mr(x, pd, g, 2 * MiB);
    check_caller_mr(y, pd, g, 1 * MiB);
    CHECK(since(from, IBVD_REG_DMABUF) == 1, "GPU registrations not cached");
    CHECK(ibv_dereg_mr(a) == 0 && ibv_dereg_mr(b) == 0 && ibv_dereg_mr(x) == 0 && ibv_dereg_mr(y) == 0, "dereg");
    CHECK(ibv_dealloc_pd(pd) == 0 && ibvd_live() == 0 && ibvd_count(IBVD_DEREG_UNKNOWN) == 0, "MRs left");
}

/* cuMemFree of registered memory, then the same VA again: never the stale MR. */
static void gpu_free(void)
{
    struct ibv_pd *pd = open_pd();
    char *g = gpu_alloc(4 * MiB), *g2;
    struct ibv_mr *mr, *held;
    uint32_t key;
    size_t from;

    mr = ibv_reg_mr(pd, g, 4 * MiB, ACCESS);
    check_caller_mr(mr, pd, g, 4 * MiB);
    key = mr->lkey;
    CHECK(ibv_dereg_mr(mr) == 0 && ibvd_lkey_live(key), "idle GPU MR not cached");
    CHECK(cu_free((uintptr_t)g) == 0, "cuMemFree");
    CHECK(!ibvd_lkey_live(key), "cuMemFree did not deregister the cached MR");
    g = gpu_alloc(4 * MiB);
    held = ibv_reg_mr(pd, g, 4 * MiB, ACCESS);
    check_caller_mr(held, pd, g, 4 * MiB);
    key = held->lkey;
    CHECK(cu_free((uintptr_t)g) == 0, "cuMemFree");
    CHECK(ibvd_lkey_live(key), "an MR still held was deregistered under the engine");
    g2 = gpu_alloc(4 * MiB);
    from = ibvd_ncalls();
    mr = ibv_reg_mr(pd, g2, 4 * MiB, ACCESS);
    check_caller_mr(mr, pd, g2, 4 * MiB);
    CHECK(since(from, IBVD_REG_DMABUF) == 1 && mr->lkey != key, "%s memory was served the stale MR",
          g2 == g ? "reallocated (same VA)" : "new");
    CHECK(ibv_dereg_mr(held) == 0 && !ibvd_lkey_live(key), "the stale MR outlived its last dereg");
    CHECK(ibv_dereg_mr(mr) == 0 && ibv_dealloc_pd(pd) == 0 && ibvd_live() == 0, "MRs left");
}

/* An engine that opens libibverbs itself and calls ibv_reg_mr through dlsym. */
static void private_dlopen(void)
{
    struct ibv_mr *(*reg)(struct ibv_pd *, void *, size_t, int);
    void *lib = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL);
    struct ibv_pd *pd = open_pd();
    char *g = gpu_alloc(2 * MiB);
    struct ibv_mr *mr;
    size_t from = ibvd_ncalls();

    CHECK(lib, "dlopen libibverbs.so.1");
    *(void **)&reg = dlsym(lib, "ibv_reg_mr");
    CHECK(reg, "dlsym ibv_reg_mr");
    mr = reg(pd, g + 4096, 8192, ACCESS);
    check_caller_mr(mr, pd, g + 4096, 8192);
    CHECK(since(from, IBVD_REG_DMABUF) == 1 && since(from, IBVD_REG_VA) == 0,
          "ibv_reg_mr reached through dlsym was not served by drc");
    CHECK(ibv_dereg_mr(mr) == 0 && ibv_dealloc_pd(pd) == 0 && ibvd_live() == 0, "MRs left");
}

/*
 * Shaped like Mooncake's TENT engine and NCCL's IB transport: libibverbs opened with dlopen RTLD_LOCAL,
 * and ibv_reg_mr, ibv_reg_mr_iova2, ibv_dereg_mr, ibv_dealloc_pd (and ibv_rereg_mr) taken by dlsym.
 * The preload's dlsym interposer answers those names with drc's definitions (the same ones the
 * preload exports: what dlsym(RTLD_DEFAULT) gives here); until it is wired, dlsym(handle) still
 * gives libibverbs's own, which is only checked with DRC_TEST_DLSYM_SEAM=1. Checked: an MR of drc
 * never reaches the provider's dereg or rereg, and dealloc_pd releases drc's cached MRs first.
 */
static void tent(void)
{
    static const char *const names[] = { "ibv_reg_mr", "ibv_reg_mr_iova2", "ibv_dereg_mr", "ibv_dealloc_pd",
                                         "ibv_rereg_mr" };
    void *lib = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL);
    void *fn[5];
    struct ibv_mr *(*reg)(struct ibv_pd *, void *, size_t, int);
    struct ibv_mr *(*reg2)(struct ibv_pd *, void *, size_t, uint64_t, unsigned);
    int (*dereg)(struct ibv_mr *), (*dealloc)(struct ibv_pd *);
    int (*rereg)(struct ibv_mr *, int, struct ibv_pd *, void *, size_t, int);
    struct ibv_pd *pd = open_pd();
    char *g = gpu_alloc(4 * MiB), *h = host_buffer(1 * MiB, 7);
    struct ibv_mr *a, *b, *own;
    size_t from = ibvd_ncalls(), i;
    uint32_t key;
    int rc;

    CHECK(lib, "dlopen libibverbs.so.1: %s", dlerror());
    for (i = 0; i < 5; i++) {
        void *mine = dlsym(lib, names[i]);

        fn[i] = dlsym(RTLD_DEFAULT, names[i]);      /* what the preload's dlsym interposer answers */
        CHECK(fn[i] && mine, "no %s", names[i]);
        if (getenv("DRC_TEST_DLSYM_SEAM"))
            CHECK(mine == fn[i], "dlsym(handle, \"%s\") is libibverbs's own, not drc's", names[i]);
    }
    *(void **)&reg = fn[0];
    *(void **)&reg2 = fn[1];
    *(void **)&dereg = fn[2];
    *(void **)&dealloc = fn[3];
    *(void **)&rereg = fn[4];
    a = reg(pd, g, 4 * MiB, ACCESS | IBV_ACCESS_RELAXED_ORDERING);    /* as Mooncake asks where iova2 exists */
    check_caller_mr(a, pd, g, 4 * MiB);
    b = reg2(pd, g + 4096, 8192, (uintptr_t)(g + 4096), ACCESS | IBV_ACCESS_RELAXED_ORDERING);
    check_caller_mr(b, pd, g + 4096, 8192);
    CHECK(since(from, IBVD_REG_DMABUF) == 1 && since(from, IBVD_REG_VA) == 0, "not served by drc");
    key = a->lkey;
    /* rereg of an MR of drc: refused, the MR unchanged, the provider never sees it */
    errno = 0;
    rc = rereg(a, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0, IBV_ACCESS_LOCAL_WRITE);
    CHECK(rc == IBV_REREG_MR_ERR_INPUT && errno == EINVAL, "ibv_rereg_mr of an MR of drc gave %d, errno %d", rc,
          errno);
    CHECK(since(from, IBVD_REREG) == 0, "ibv_rereg_mr of an MR of drc reached the provider");
    CHECK(ibvd_lkey_live(key) && a->lkey == key, "the MR changed");
    /* rereg of the engine's own MR (ON_DEMAND: drc passes it through) still reaches the provider */
    own = reg(pd, h, 1 * MiB, ACCESS | IBV_ACCESS_ON_DEMAND);
    CHECK(own, "ON_DEMAND registration");
    CHECK(rereg(own, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0, ACCESS) == 0 && since(from, IBVD_REREG) == 1,
          "ibv_rereg_mr of the engine's own MR was not passed on");
    /* dereg of an MR of drc: never the provider's */
    CHECK(dereg(b) == 0 && dereg(a) == 0 && dereg(own) == 0, "ibv_dereg_mr");
    CHECK(since(from, IBVD_DEREG_UNKNOWN) == 0, "an MR of drc reached the provider's ibv_dereg_mr");
    CHECK(ibvd_lkey_live(key), "the idle MR should stay cached");
    /* dealloc_pd with drc's idle MR cached: released first, no EBUSY */
    CHECK(dealloc(pd) == 0, "ibv_dealloc_pd failed (EBUSY: drc's cached MR was left)");
    CHECK(!ibvd_lkey_live(key) && ibvd_live() == 0, "MRs left after ibv_dealloc_pd");
}

/*
 * Widening through the interposer: a remote-access registration of 4 KiB in a 2 MiB allocation
 * covers its page by default, the whole allocation with DRC_VERBS_WIDEN=always; a local-only one is
 * widened by default and not with DRC_VERBS_WIDEN=never. The parent sets the variable.
 */
static void widen(void)
{
    const char *mode = getenv("DRC_VERBS_WIDEN");
    int always = mode && !strcmp(mode, "always"), never = mode && !strcmp(mode, "never");
    struct ibv_pd *pd = open_pd();
    char *g = gpu_alloc(2 * MiB);
    struct ibv_mr *remote, *local;
    struct ibvd_call d;

    remote = ibv_reg_mr(pd, g + 8192, 4096, ACCESS);
    check_caller_mr(remote, pd, g + 8192, 4096);
    CHECK(last(IBVD_REG_DMABUF, &d), "no dmabuf registration");
    CHECK(always ? d.iova == (uintptr_t)g && d.len == 2 * MiB : d.iova == (uintptr_t)(g + 8192) && d.len == 4096,
          "remote-access registration covers 0x%llx+%zu (DRC_VERBS_WIDEN=%s)", (unsigned long long)d.iova, d.len,
          mode ? mode : "");
    local = ibv_reg_mr(pd, g + 65536, 4096, IBV_ACCESS_LOCAL_WRITE);
    check_caller_mr(local, pd, g + 65536, 4096);
    if (!always) {      /* (always: a hit on the widened MR) */
        CHECK(last(IBVD_REG_DMABUF, &d), "no dmabuf registration");
        CHECK(never ? d.len == 4096 : d.iova == (uintptr_t)g && d.len == 2 * MiB,
              "local registration covers 0x%llx+%zu (DRC_VERBS_WIDEN=%s)", (unsigned long long)d.iova, d.len,
              mode ? mode : "");
    }
    CHECK(ibv_dereg_mr(remote) == 0 && ibv_dereg_mr(local) == 0 && ibv_dealloc_pd(pd) == 0 && ibvd_live() == 0,
          "MRs left");
}

/*
 * A hit through the interposer asks the CUDA driver nothing. The first ibv_reg_mr of a GPU allocation
 * (local-only: widened to it) and of a host buffer are misses, which classify their memory: the
 * control, they ask the driver. Then 100 ibv_reg_mr + ibv_dereg_mr of sub-ranges of each, local-only
 * and remote-access, are hits on those MRs and leave the double's count of memory queries
 * (pointer attributes, address ranges, VMM handles) where it was.
 */
static void hit_calls(void)
{
    struct fake_cuda *fcp = dlsym(RTLD_DEFAULT, "fc");
    struct ibv_pd *pd = open_pd();
    char *g = gpu_alloc(8 * MiB), *h = host_buffer(1 * MiB, 0);
    struct ibv_mr *first[3], *mr;
    size_t from = ibvd_ncalls();
    int before, i;

    CHECK(fake_cuda && fcp, "needs the CUDA double (its count of driver calls)");
    before = fcp->mem_queries;
    first[0] = ibv_reg_mr(pd, g + 4096 + 17, 1000, IBV_ACCESS_LOCAL_WRITE);
    first[1] = ibv_reg_mr(pd, g + 4 * MiB, 1 * MiB, ACCESS);
    first[2] = reg_runtime(pd, h, 1 * MiB, IBV_ACCESS_LOCAL_WRITE);
    check_caller_mr(first[0], pd, g + 4096 + 17, 1000);
    check_caller_mr(first[1], pd, g + 4 * MiB, 1 * MiB);
    check_caller_mr(first[2], pd, h, 1 * MiB);
    CHECK(fcp->mem_queries > before, "control: the first registrations asked the driver nothing");
    before = fcp->mem_queries;
    for (i = 0; i < 100; i++) {
        char *local = g + (size_t)i * 80 * 1024 + 100, *remote = g + 4 * MiB + (size_t)i * 8192,
             *host = h + (size_t)i * 8192 + 5;

        mr = ibv_reg_mr(pd, local, 4096, IBV_ACCESS_LOCAL_WRITE);
        check_caller_mr(mr, pd, local, 4096);
        CHECK(mr->lkey == first[0]->lkey && ibv_dereg_mr(mr) == 0, "GPU local %d: not a hit on the widened MR", i);
        mr = ibv_reg_mr(pd, remote, 4096, ACCESS);
        check_caller_mr(mr, pd, remote, 4096);
        CHECK(mr->lkey == first[1]->lkey && ibv_dereg_mr(mr) == 0, "GPU remote %d: not a hit", i);
        mr = reg_runtime(pd, host, 4000, IBV_ACCESS_LOCAL_WRITE);
        check_caller_mr(mr, pd, host, 4000);
        CHECK(mr->lkey == first[2]->lkey && ibv_dereg_mr(mr) == 0, "host %d: not a hit", i);
    }
    CHECK(fcp->mem_queries == before, "300 hits asked the CUDA driver about memory %d times",
          fcp->mem_queries - before);
    CHECK(since(from, IBVD_REG_DMABUF) == 2 && since(from, IBVD_REG_VA) == 1,
          "%zu dmabuf and %zu host registrations, want 2 and 1", since(from, IBVD_REG_DMABUF),
          since(from, IBVD_REG_VA));
    for (i = 0; i < 3; i++)
        CHECK(ibv_dereg_mr(first[i]) == 0, "dereg %d", i);
    CHECK(ibv_dealloc_pd(pd) == 0 && ibvd_live() == 0, "MRs left");
}

/* DRC_VERBS=off: the front forwards everything untouched. */
static void verbs_off(void)
{
    struct ibv_pd *pd = open_pd();
    char *g = gpu_alloc(2 * MiB);
    struct ibv_mr *a;
    size_t from = ibvd_ncalls();

    a = ibv_reg_mr(pd, g, 4096, ACCESS);
    CHECK(a && since(from, IBVD_REG_VA) == 1 && since(from, IBVD_REG_DMABUF) == 0, "not passed through");
    CHECK(ibv_dereg_mr(a) == 0 && since(from, IBVD_DEREG) == 1, "dereg not passed through");
    CHECK(ibv_dealloc_pd(pd) == 0 && ibvd_live() == 0, "MRs left");
}

/*
 * For the DRC_LOG test, shaped like an upstream transfer engine's life: 12 MRs on one PD (a buffer, then
 * 11 tensors inside it), all deregistered, the PD deallocated, then exit. The parent reads stderr.
 */
static void log_run(void)
{
    struct ibv_pd *pd = open_pd();
    char *g = gpu_alloc(2 * MiB);
    struct ibv_mr *mr[12];
    int i;

    mr[0] = ibv_reg_mr(pd, g, 1 * MiB, ACCESS);
    check_caller_mr(mr[0], pd, g, 1 * MiB);
    for (i = 1; i < 12; i++) {
        mr[i] = ibv_reg_mr(pd, g + (size_t)i * 65536, 4096, ACCESS);
        check_caller_mr(mr[i], pd, g + (size_t)i * 65536, 4096);
    }
    for (i = 0; i < 12; i++)
        CHECK(ibv_dereg_mr(mr[i]) == 0, "dereg %d", i);
    CHECK(ibv_dealloc_pd(pd) == 0 && ibvd_live() == 0, "MRs left after ibv_dealloc_pd");
}

/* The access the provider registered the MR with @lkey (the last registration with it), or ~0u. */
static unsigned registered_access(uint32_t lkey)
{
    struct ibvd_call c;
    unsigned access = ~0u;
    size_t i;

    for (i = 0; ibvd_call(i, &c); i++)
        if ((c.op == IBVD_REG_VA || c.op == IBVD_REG_DMABUF) && c.lkey == lkey)
            access = c.access;
    return access;
}

/* Two RC QPs of @pd connected to each other (loopback), from any state. */
static void qp_pair(struct ibv_qp *qp[2])
{
    struct rcqp_peer peer[2] = { { .qpn = qp[1]->qp_num }, { .qpn = qp[0]->qp_num } };

    for (int i = 0; i < 2; i++)
        CHECK(rcqp_connect(qp[i], &peer[i], ACCESS, 0) == 0, "QP %d: %s", i, strerror(errno));
}

/* RDMA WRITE of 4 KiB from @src (lkey @lkey) to @remote with @rkey, as a peer would; the completion status. */
static int rdma_write(struct ibv_qp *qp, struct ibv_cq *cq, const void *src, uint32_t lkey, void *remote,
                      uint32_t rkey)
{
    struct ibv_sge sge = { (uintptr_t)src, 4096, lkey };
    struct ibv_send_wr wr, *bad;
    struct ibv_wc wc;
    int got = 0;

    memset(&wr, 0, sizeof(wr));
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_RDMA_WRITE;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = (uintptr_t)remote;
    wr.wr.rdma.rkey = rkey;
    CHECK(ibv_post_send(qp, &wr, &bad) == 0, "ibv_post_send");
    for (int i = 0; i < 1000 && !got; i++)
        got = ibv_poll_cq(cq, 1, &wc);
    CHECK(got == 1, "no completion");
    return wc.status;
}

/*
 * What an rkey allows is what its registration asked, whoever else registered the memory. Another
 * component registers a buffer for remote writes; the engine registers the same buffer LOCAL_WRITE only,
 * and publishes that MR's rkey, as engines do. A peer's WRITE with it must fail with a remote access
 * error and change nothing; the control, the same WRITE with the other component's rkey, lands. The
 * same for host and GPU memory (a local-only GPU registration is also widened to its allocation). And
 * RELAXED_ORDERING: a registration without it never gets an MR that has it. Every MR the provider made
 * here has no bit its request did not ask.
 */
static void rkey_scope(void)
{
    struct ibv_pd *pd = open_pd();
    struct ibv_cq *cq = ibv_create_cq(pd->context, 16, NULL, NULL, 0);
    struct ibv_qp *qp[2] = { cq ? rcqp_create(pd, cq, 16, 1) : NULL, cq ? rcqp_create(pd, cq, 16, 1) : NULL };
    char *src = host_buffer(4096, 0x5c), *buf[2] = { host_buffer(1 * MiB, 0), gpu_alloc(2 * MiB) };
    struct ibv_mr *src_mr, *other, *mine, *ro, *plain;
    int st;

    CHECK(cq && qp[0] && qp[1], "CQ/QPs");
    qp_pair(qp);
    src_mr = ibv_reg_mr(pd, src, 4096, IBV_ACCESS_LOCAL_WRITE);
    CHECK(src_mr, "source MR");
    for (int k = 0; k < 2; k++) {
        char *b = buf[k] + 8192;

        other = ibv_reg_mr(pd, b, 65536, ACCESS);       /* another component: remote writes wanted */
        mine = ibv_reg_mr(pd, b, 65536, IBV_ACCESS_LOCAL_WRITE);
        check_caller_mr(other, pd, b, 65536);
        check_caller_mr(mine, pd, b, 65536);
        st = rdma_write(qp[0], cq, src, src_mr->lkey, b, mine->rkey);
        CHECK(st == IBV_WC_REM_ACCESS_ERR, "%s: a remote WRITE with the rkey of a LOCAL_WRITE registration "
              "completed with %s", k ? "GPU" : "host", ibv_wc_status_str((enum ibv_wc_status)st));
        CHECK(b[0] == 0, "%s: the refused WRITE changed the memory", k ? "GPU" : "host");
        CHECK(!(registered_access(mine->lkey) & ~(unsigned)IBV_ACCESS_LOCAL_WRITE),
              "%s: a LOCAL_WRITE registration got an MR with access 0x%x", k ? "GPU" : "host",
              registered_access(mine->lkey));
        qp_pair(qp);                                    /* the error moved the QP to the error state */
        st = rdma_write(qp[0], cq, src, src_mr->lkey, b, other->rkey);
        CHECK(st == IBV_WC_SUCCESS && b[0] == 0x5c && b[4095] == 0x5c,
              "%s: control: a WRITE with the remote-write rkey did not land (%s)", k ? "GPU" : "host",
              ibv_wc_status_str((enum ibv_wc_status)st));
        CHECK(ibv_dereg_mr(mine) == 0 && ibv_dereg_mr(other) == 0, "dereg");
    }
    ro = ibv_reg_mr(pd, buf[1], 4096, ACCESS | IBV_ACCESS_RELAXED_ORDERING);
    plain = ibv_reg_mr(pd, buf[1], 4096, ACCESS);
    check_caller_mr(ro, pd, buf[1], 4096);
    check_caller_mr(plain, pd, buf[1], 4096);
    CHECK(registered_access(plain->lkey) == ACCESS, "a registration without RELAXED_ORDERING got access 0x%x",
          registered_access(plain->lkey));
    CHECK(registered_access(ro->lkey) == (ACCESS | IBV_ACCESS_RELAXED_ORDERING), "the relaxed one: 0x%x",
          registered_access(ro->lkey));
    CHECK(ibv_dereg_mr(plain) == 0 && ibv_dereg_mr(ro) == 0 && ibv_dereg_mr(src_mr) == 0, "dereg");
    CHECK(ibv_destroy_qp(qp[0]) == 0 && ibv_destroy_qp(qp[1]) == 0 && ibv_destroy_cq(cq) == 0, "teardown");
    CHECK(ibv_dealloc_pd(pd) == 0 && ibvd_live() == 0, "MRs left");
}

/*
 * The per-NIC decisions, made the same through the interposer and through the C API. The same program
 * registers one new GPU allocation on every device: under the preload with ibv_reg_mr, without it with
 * drc_reg_mr of libdrc.so (loaded here). It prints one line: for each device how the memory was
 * registered (dmabuf, va, or refused: the provider's record) and the dmabuf mapping type of its export
 * (the CUDA double's record). The parent runs both and compares the lines. ENGINE_PROBE_ERRNO sets the
 * provider's answer to drc's dmabuf probe (EOPNOTSUPP: a NIC without dmabuf).
 */
static void decisions(void)
{
    struct ibv_mr *(*reg)(struct ibv_pd *, void *, size_t, int) = NULL;
    int (*dereg)(struct ibv_mr *) = NULL, (*release)(struct ibv_pd *) = NULL;
    struct fake_cuda *fcp = dlsym(RTLD_DEFAULT, "fc");
    struct ibv_device **list;
    const char *probe = getenv("ENGINE_PROBE_ERRNO");
    int preloaded = dlsym(RTLD_DEFAULT, "drc_reg_mr") != NULL, n = 0;
    char line[512] = "decisions:";

    CHECK(fake_cuda && fcp, "needs the CUDA double (its record of exports)");
    fcp->pcie_unsupported = 0;      /* a driver with the PCIe mapping type */
    if (probe)
        ibvd_set_probe_errno(atoi(probe));
    if (preloaded) {
        *(void **)&reg = dlsym(RTLD_DEFAULT, "ibv_reg_mr");
        *(void **)&dereg = dlsym(RTLD_DEFAULT, "ibv_dereg_mr");
    } else {
        char path[4096], *slash;
        ssize_t got = readlink("/proc/self/exe", path, sizeof(path) - 32);
        void *drc;

        CHECK(got > 0, "readlink");
        path[got] = 0;
        slash = strrchr(path, '/');
        CHECK(slash, "no folder");
        strcpy(slash, "/../libdrc.so.0");
        drc = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
        CHECK(drc, "dlopen %s: %s", path, dlerror());
        *(void **)&reg = dlsym(drc, "drc_reg_mr");
        *(void **)&dereg = dlsym(drc, "drc_dereg_mr");
        *(void **)&release = dlsym(drc, "drc_pd_release");
    }
    CHECK(reg && dereg && (preloaded || release), "no registration entry points");
    list = ibv_get_device_list(&n);
    CHECK(list && n > 0, "no devices");
    for (int i = 0; i < n; i++) {
        struct ibv_context *ctx = ibv_open_device(list[i]);
        struct ibv_pd *pd = ctx ? ibv_alloc_pd(ctx) : NULL;
        char *g = gpu_alloc(2 * MiB);
        int exports = fcp->nexports;
        size_t from = ibvd_ncalls();
        struct ibv_mr *mr;
        const char *how;

        CHECK(pd, "PD on %s", ibv_get_device_name(list[i]));
        mr = reg(pd, g, 1 * MiB, ACCESS);
        how = !mr ? "refused" : since(from, IBVD_REG_DMABUF) ? "dmabuf" : since(from, IBVD_REG_VA) ? "va" : "?";
        snprintf(line + strlen(line), sizeof(line) - strlen(line), " %s %s %s", ibv_get_device_name(list[i]), how,
                 fcp->nexports == exports ? "-"
                 : fcp->exports[fcp->nexports - 1].flags & 1     /* CU_MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE */
                     ? "pcie"
                     : "default");
        CHECK(!mr || dereg(mr) == 0, "dereg");
        CHECK(!release || release(pd) == 0, "drc_pd_release");
        CHECK(ibv_dealloc_pd(pd) == 0 && ibv_close_device(ctx) == 0, "teardown");
        CHECK(cu_free((uintptr_t)g) == 0, "cuMemFree");
    }
    ibv_free_device_list(list);
    CHECK(ibvd_live() == 0, "MRs left");
    printf("%s (%s)\n", line, preloaded ? "ibv_reg_mr under the preload" : "drc_reg_mr");
}

int main(int argc, char **argv)
{
    static const struct {
        const char *name;
        void (*run)(void);
        int gpu;
    } scenarios[] = {
        { "gpu_dedup", gpu_dedup, 1 },   { "overlap", overlap, 1 },         { "refcount", refcount, 1 },
        { "passthrough", passthrough, 0 }, { "host_munmap", host_munmap, 0 }, { "host_madvise", host_madvise, 0 },
        { "host_jemalloc", host_jemalloc, 0 }, { "host_passthrough", host_passthrough, 1 },
        { "gpu_free", gpu_free, 1 },     { "private_dlopen", private_dlopen, 1 }, { "log", log_run, 1 },
        { "tent", tent, 1 },             { "verbs_off", verbs_off, 1 },     { "widen", widen, 1 },
        { "rkey_scope", rkey_scope, 1 }, { "decisions", decisions, 1 },  { "hit_calls", hit_calls, 1 },
        { "stale_dereg", stale_dereg, 0 }, { "threads_pds", threads_pds, 0 },
    };
    size_t i;

    setenv("IBVD_READ_AT_DEREG", "1", 1);   /* the double may read host MRs' first byte at dereg */
    for (i = 0; i < sizeof(scenarios) / sizeof(scenarios[0]); i++) {
        if (argc < 2 || strcmp(argv[1], scenarios[i].name))
            continue;
        if (scenarios[i].gpu)
            cuda_open();
        scenarios[i].run();
        printf("ok %s%s\n", argv[1], scenarios[i].gpu ? (fake_cuda ? " (libcuda double)" : " (real GPU)") : "");
        return fails != 0;
    }
    fprintf(stderr, "usage: %s SCENARIO\n", argv[0]);
    return 2;
}
