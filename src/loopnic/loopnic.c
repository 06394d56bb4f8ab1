/* loopnic: a loopback verbs provider that behaves like an RDMA NIC, for tests. See README.md.
 *
 * One source, two libraries: build/loopnic/libibverbs.so.1 (in place of rdma-core's, through
 * LD_LIBRARY_PATH or an rpath) and build/loopnic/libloopnic.so (LD_PRELOAD over the real one).
 * Exported symbols carry rdma-core's version nodes (loopnic.map).
 *
 * Work requests execute synchronously inside ibv_post_send(): checked against the MRs like a NIC
 * checks them, data copied with process_vm_readv/writev (in and across processes) or cuMemcpy
 * (GPU memory, in process), the completion queued on the send CQ.
 *
 * MRs and QPs live in one table: a private anonymous mapping, or with LOOPNIC_REGISTRY=<file> a
 * shared file that several processes map, so that rkeys and QP numbers resolve across processes.
 * Every access to it holds g_lock and, when shared, flock() on the file.
 */
#include <infiniband/verbs.h>
#undef ibv_reg_mr
#undef ibv_reg_mr_iova
#undef ibv_query_port

#include "loopnic.h"
#include "loopnic_record.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#define API __attribute__((visibility("default")))

enum { MAXDEV = 16, NMR = 1 << 15, NQP = 1 << 12, NSTALE = 4, NEV = 64, MAX_SGE = 30 };
enum { MAX_QP_WR = 16384, MAX_CQE = 1 << 22 };
enum { F_GPU = 1, F_DMABUF = 2, F_STALE_ALL = 4 };
#define TABLE_MAGIC 0x4c4f4f504e494331ull /* "LOOPNIC1" */
#define TABLE_VERSION 2u

/* ---- the table of MRs and QPs (process-private or shared through LOOPNIC_REGISTRY) ---- */
struct sh_mr {
    uint32_t key, in_use;
    int32_t pid, dev;
    uint64_t pd_id, iova, len;
    uint64_t addr;          /* where the memory is in the owner's address space (dmabuf: iova) */
    uint64_t buffer_id;     /* CUDA buffer id at registration (F_GPU) */
    uint32_t access, flags, nstale, pad;
    uint64_t stale[NSTALE][2]; /* [start, end) of addr space freed or remapped since registration */
};
struct sh_qp {
    uint32_t qp_num, in_use;
    int32_t pid, dev;
    uint64_t pd_id;
    uint32_t state, dest_qp, access, rnr_timer;
    /* where the owner keeps its receive queue (struct lrq: the QP's own or its SRQ's) and its
     * receive CQ (struct lcq), in the owner's address space: a sender reads and writes them with
     * process_vm_readv/writev while it holds the table's lock, which the owner holds too whenever it
     * touches them */
    uint64_t rq, rcq;
};
struct table {
    uint64_t magic;
    uint32_t version, mr_hint, qp_hint, pad;
    uint64_t next_pd_id;
    struct sh_mr mr[NMR];
    struct sh_qp qp[NQP];
};

/* ---- process-local objects ---- */
struct lctx {
    int dev, async_w;
    pthread_mutex_t evlock;
    struct ibv_async_event ev[NEV];
    unsigned evh, evn;
    struct verbs_context vctx; /* vctx.context is what callers get */
};
#define LCTX(c) ((struct lctx *)(void *)((char *)(c) - offsetof(struct lctx, vctx.context)))

struct lpd { struct ibv_pd pd; uint64_t id; int dev; int nmr, nqp; };
/* dmabuf_fd: a dmabuf MR holds its dmabuf, as the kernel's does (dma_buf_get at registration, put at
 * deregistration): the exporter's memory (a freed cudaMalloc) stays allocated while the MR lives. -1 else. */
struct lmr { struct ibv_mr mr; uint32_t slot; struct lpd *pd; int dmabuf_fd; };
struct cqe {
    struct ibv_wc wc;
    uint32_t slot, retire;  /* send queue slots of QP slot this completion frees when polled */
};
/* Completions that a peer process delivers to this CQ (receives its SENDs consumed): written by the
 * peer under the table's lock; moved to the ring by this process's poll (or its progress thread). */
struct inbox {
    uint64_t ring;          /* struct ibv_wc[cap] */
    uint32_t cap, head, n, over;
};
struct lcq {
    struct ibv_cq cq;
    pthread_mutex_t lock;
    struct cqe *ring;
    int cap, head, n, armed, nqp;
    struct inbox in;
    struct lcq *next;       /* this process's CQs, under g_lock */
};
/* A receive queue, the QP's own or an SRQ's: a ring of receive WQEs of stride bytes each. A peer's
 * SEND reads the WQE at head and advances it (under the table's lock). */
struct rwqe {
    uint64_t wr_id;
    uint32_t num_sge, pad;
    struct ibv_sge sge[];
};
struct lrq {
    uint64_t ring;
    uint32_t cap, head, n, max_sge, stride, limit;
};
struct lsrq {
    struct ibv_srq srq;
    struct lrq rq;
    struct lpd *pd;
    int nqp;
};
/* A send WR that found no receive posted at its responder (RNR NAK): it and every WR posted after it
 * on the QP wait in order, retried by poll_cq, post_send and the progress thread. Its gather list and
 * inline data are copied, as a NIC has fetched them once the WR is posted. */
struct pend {
    struct ibv_send_wr wr;
    struct ibv_sge sge[MAX_SGE];
    uint64_t since_ns;
    uint8_t inl[256];
};
struct lchan {
    struct ibv_comp_channel ch;
    int wfd;
    pthread_mutex_t lock;
    struct ibv_cq **q;
    unsigned qh, qn, qcap;
    int ncq;
};
struct lqp {
    struct ibv_qp qp;
    uint32_t slot;
    struct lpd *pd;
    struct lcq *scq, *rcq;
    int dev, sig_all;
    uint8_t port;
    uint32_t access;
    struct ibv_qp_cap cap;
    struct lrq own;       /* the receive queue, unless the QP takes its receives from an SRQ */
    struct lrq *rq;       /* &own or the SRQ's */
    struct lsrq *srq;
    uint8_t rnr_retry;    /* 7: retry for ever */
    struct pend *pend;    /* send WRs waiting for a receive at the responder (RNR) */
    unsigned ph, pn;
    uint32_t outstanding; /* send WRs whose slot is not yet freed by a polled completion */
    uint32_t unsignaled;  /* of which executed since the last completion generated */
};

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static __thread int t_in;           /* >0 while this thread is inside the provider */
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static struct table *g_tab;
static int g_regfd = -1;
static char g_regpath[PATH_MAX];
static int g_ndev = 2;
static int g_eth;                   /* link layer Ethernet (RoCE) instead of InfiniBand */
static uint64_t g_max_mr_size = UINT64_MAX;
static struct ibv_device g_dev[MAXDEV];
static struct loopnic_counters g_cnt[MAXDEV];
static struct lqp *g_qp_local[NQP];
static struct lcq *g_cqs;           /* this process's CQs */
static atomic_uint g_npend;         /* QPs with send WRs waiting for a receive (RNR) */
static struct lmr *g_mr_local[NMR]; /* this process's MR objects, to refuse foreign ones */
/* Nothing allocates or frees memory while holding g_lock: a thread inside the allocator (jemalloc
 * purging with its locks held) may be waiting for g_lock in an interposer. Hence fixed arrays. */
static uint32_t g_own[NMR];         /* table slots of this process's MRs */
static size_t g_nown;
static _Atomic uint64_t g_host_lo = UINT64_MAX, g_host_hi; /* span of this process's host MRs (widen only) */
static atomic_size_t g_nown_host;   /* fast path of the libc interposers */
static unsigned long g_reg_calls, g_fail_reg_at, g_dmabuf_calls, g_fail_dmabuf_at, g_wr_calls, g_fail_wr_at;
static int g_fail_reg_err, g_fail_dmabuf_err, g_fail_wr_status;
struct inode_seen { uint64_t dev, ino, devmask; };
enum { MAX_INODES = 4096 };
static struct inode_seen g_inodes[MAX_INODES];
static size_t g_ninodes;
static long g_page = 4096;
/* LOOPNIC_PAGEMAP=1: the page frames of each host MR, read from /proc/self/pagemap at registration
 * (after faulting the pages in, as pinning does) and compared at WR time. Process-local. */
struct pfns { uint64_t *pfn; uint64_t first_page, npages; };
static struct pfns g_pfns[NMR];
static int g_pagemap_fd = -1;

/* ---- the record (loopnic_record.h): what the exact-argument tests read. Under g_lock. ---- */
enum { MAX_CALLS = 1 << 16 };
static struct ibvd_call g_calls[MAX_CALLS];
static size_t g_ncalls;
static size_t g_opcount[IBVD_NOPS];  /* per op, not capped like the record */
static unsigned long long g_reg_bytes;
static int g_fail_next, g_probe_errno = EBADF, g_dereg_ret, g_query_ret;
static unsigned long long g_query_max;
static _Atomic uintptr_t g_probe_addr;

static void rec(const struct ibvd_call *c)
{
    g_opcount[c->op]++;
    if (c->op == IBVD_REG_VA || c->op == IBVD_REG_DMABUF)
        g_reg_bytes += c->len;
    if (g_ncalls < MAX_CALLS)
        g_calls[g_ncalls++] = *c;
}

static void lock(void)
{
    pthread_mutex_lock(&g_lock);
    t_in++;
    if (g_regfd >= 0)
        while (flock(g_regfd, LOCK_EX) != 0 && errno == EINTR) {}
}

static void unlock(void)
{
    if (g_regfd >= 0)
        flock(g_regfd, LOCK_UN);
    t_in--;
    pthread_mutex_unlock(&g_lock);
}

static int pid_alive(int pid)
{
    return pid == getpid() || kill(pid, 0) == 0 || errno == EPERM;
}

static unsigned long env_ul(const char *name, unsigned long dflt)
{
    const char *s = getenv(name);
    char *end;
    unsigned long v;

    if (!s || !*s)
        return dflt;
    errno = 0;
    v = strtoul(s, &end, 0);
    if (errno || *end) {
        fprintf(stderr, "loopnic: ignoring %s=%s\n", name, s);
        return dflt;
    }
    return v;
}

/* ---- libc functions we interpose, resolved to the next definition ---- */
typedef void *mmap_fn(void *, size_t, int, int, int, off_t);
typedef int munmap_fn(void *, size_t);
typedef void *mremap_fn(void *, size_t, size_t, int, ...);
typedef int madvise_fn(void *, size_t, int);
static mmap_fn *real_mmap;
static munmap_fn *real_munmap;
static mremap_fn *real_mremap;
static madvise_fn *real_madvise;

__attribute__((constructor)) static void loopnic_ctor(void)
{
    t_in++;
    real_mmap = (mmap_fn *)dlsym(RTLD_NEXT, "mmap");
    real_munmap = (munmap_fn *)dlsym(RTLD_NEXT, "munmap");
    real_mremap = (mremap_fn *)dlsym(RTLD_NEXT, "mremap");
    real_madvise = (madvise_fn *)dlsym(RTLD_NEXT, "madvise");
    t_in--;
}

static void *table_private(void)
{
    void *p = mmap(NULL, sizeof(struct table), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

static struct table *table_shared(const char *path)
{
    struct stat st;
    struct table *t;
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);

    if (fd < 0) {
        fprintf(stderr, "loopnic: LOOPNIC_REGISTRY %s: %s\n", path, strerror(errno));
        return NULL;
    }
    flock(fd, LOCK_EX);
    if (fstat(fd, &st) != 0 || ((size_t)st.st_size < sizeof(*t) && ftruncate(fd, sizeof(*t)) != 0)) {
        fprintf(stderr, "loopnic: LOOPNIC_REGISTRY %s: %s\n", path, strerror(errno));
        close(fd);
        return NULL;
    }
    t = mmap(NULL, sizeof(*t), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (t == MAP_FAILED) {
        close(fd);
        return NULL;
    }
    if (t->magic != TABLE_MAGIC) {
        t->magic = TABLE_MAGIC;
        t->version = TABLE_VERSION;
        t->next_pd_id = 1;
    } else if (t->version != TABLE_VERSION) {
        fprintf(stderr, "loopnic: LOOPNIC_REGISTRY %s has another layout\n", path);
        munmap(t, sizeof(*t));
        close(fd);
        return NULL;
    }
    /* entries of processes gone without cleaning up */
    for (size_t i = 0; i < NMR; i++)
        if (t->mr[i].in_use && !pid_alive(t->mr[i].pid))
            t->mr[i].in_use = 0;
    for (size_t i = 0; i < NQP; i++)
        if (t->qp[i].in_use && !pid_alive(t->qp[i].pid))
            t->qp[i].in_use = 0;
    flock(fd, LOCK_UN);
    g_regfd = fd;
    snprintf(g_regpath, sizeof(g_regpath), "%s", path);
    /* Yama (ptrace_scope 1) would refuse process_vm_writev from a peer that is not our parent. */
    prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
    return t;
}

/* fork(): no other thread holds g_lock in the child, and the child gets an open file description
 * of its own for the registry (flock() locks belong to the description, shared across fork). */
static void atfork_prepare(void)
{
    pthread_mutex_lock(&g_lock);
}

static void atfork_parent(void)
{
    pthread_mutex_unlock(&g_lock);
}

static void atfork_child(void)
{
    if (g_regfd >= 0) {
        int fd = open(g_regpath, O_RDWR | O_CLOEXEC);
        if (fd >= 0) {
            dup3(fd, g_regfd, O_CLOEXEC);
            close(fd);
        }
    }
    pthread_mutex_unlock(&g_lock);
}

/* Preloaded over rdma-core (libloopnic.so), the provider answers every verbs call: a library that
 * wraps ibv_reg_mr (a registration cache, a tracer) and is preloaded after it is never called,
 * because the program's references bind to the first definition in LD_PRELOAD order. Nothing here
 * can hand the call to such a library and get it back (its "next" definition is rdma-core's, which
 * cannot serve the model's objects), so say which order works. */
static void check_preload_order(void)
{
    void *p = dlsym(RTLD_NEXT, "ibv_reg_mr");
    const char *base;
    Dl_info info;

    if (!p || !dladdr(p, &info) || !info.dli_fname)
        return;
    base = strrchr(info.dli_fname, '/');
    base = base ? base + 1 : info.dli_fname;
    if (strncmp(base, "libibverbs.so", 13) == 0)
        return;
    fprintf(stderr,
            "loopnic: WARNING: %s defines ibv_reg_mr but is preloaded after libloopnic.so: the program's verbs\n"
            "loopnic: calls stop at libloopnic.so and never reach it. Preload it first: LD_PRELOAD=\"%s libloopnic.so\"\n",
            info.dli_fname, base);
}

static void init_once(void)
{
    const char *s;

    t_in++;
    g_page = sysconf(_SC_PAGESIZE);
    g_ndev = (int)env_ul("LOOPNIC_DEVICES", 2);
    if (g_ndev < 0 || g_ndev > MAXDEV)
        g_ndev = g_ndev < 0 ? 0 : MAXDEV;
    s = getenv("LOOPNIC_LINK_LAYER");
    g_eth = s && (!strcasecmp(s, "eth") || !strcasecmp(s, "ethernet") || !strcasecmp(s, "roce"));
    g_max_mr_size = env_ul("LOOPNIC_MAX_MR_SIZE", UINT64_MAX);
    g_fail_reg_at = env_ul("LOOPNIC_FAIL_REG", 0);
    g_fail_dmabuf_at = env_ul("LOOPNIC_FAIL_DMABUF_REG", 0);
    g_fail_wr_at = env_ul("LOOPNIC_FAIL_WR", 0);
    g_fail_reg_err = g_fail_dmabuf_err = ENOMEM;
    g_fail_wr_status = IBV_WC_RETRY_EXC_ERR;
    for (int i = 0; i < g_ndev; i++) {
        struct ibv_device *d = &g_dev[i];
        d->node_type = IBV_NODE_CA;
        d->transport_type = IBV_TRANSPORT_IB;
        snprintf(d->name, sizeof(d->name), "loop%d", i);
        snprintf(d->dev_name, sizeof(d->dev_name), "uverbs%d", i);
        snprintf(d->dev_path, sizeof(d->dev_path), "/sys/class/infiniband_verbs/uverbs%d", i);
        snprintf(d->ibdev_path, sizeof(d->ibdev_path), "/sys/class/infiniband/loop%d", i);
    }
    s = getenv("LOOPNIC_REGISTRY");
    if (s && *s)
        g_tab = table_shared(s);
    if (!g_tab && (g_tab = table_private()) != NULL) {
        /* private: start each process's keys and QP numbers elsewhere, so that a peer's numbers
         * used without LOOPNIC_REGISTRY do not happen to name objects of this process */
        uint32_t salt = (uint32_t)getpid();
        for (size_t i = 0; i < NMR; i++)
            g_tab->mr[i].key = (salt & 0x1ffff) << 15;
        for (size_t i = 0; i < NQP; i++)
            g_tab->qp[i].qp_num = (salt & 0xfff) << 12;
    }
    pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
    check_preload_order();
    if (!g_tab)
        fprintf(stderr, "loopnic: cannot map the MR table\n");
    else if (g_tab->next_pd_id == 0)
        g_tab->next_pd_id = 1;
    t_in--;
}

static int init(void)
{
    pthread_once(&g_once, init_once);
    return g_tab != NULL;
}

static int dev_index(struct ibv_device *d)
{
    if (d < g_dev || d >= g_dev + g_ndev)
        return -1;
    return (int)(d - g_dev);
}

static uint64_t dev_guid(int i)
{
    return 0x4c4f4f5000000000ull | (uint64_t)(i + 1); /* "LOOP" */
}

/* ---- CUDA, loaded only if the process already loaded it ---- */
typedef int cu_attr_fn(void *data, int attribute, unsigned long long ptr);
typedef int cu_memcpy_fn(unsigned long long dst, unsigned long long src, size_t n);
typedef int cu_ctx_get_fn(void **ctx);
typedef int cu_ctx_push_fn(void *ctx);
typedef int cu_ctx_pop_fn(void **ctx);
static struct {
    void *h;
    cu_attr_fn *attr;
    cu_memcpy_fn *memcpy_;
    cu_ctx_get_fn *ctx_get;
    cu_ctx_push_fn *ctx_push;
    cu_ctx_pop_fn *ctx_pop;
} cu;
enum { CU_ATTR_CONTEXT = 1, CU_ATTR_MEMORY_TYPE = 2, CU_ATTR_BUFFER_ID = 7, CU_MEMTYPE_DEVICE = 2 };

static int cuda_loaded(void)
{
    if (!cu.h) {
        void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
        if (!h)
            return 0;
        cu.attr = (cu_attr_fn *)dlsym(h, "cuPointerGetAttribute");
        cu.memcpy_ = (cu_memcpy_fn *)dlsym(h, "cuMemcpy");
        cu.ctx_get = (cu_ctx_get_fn *)dlsym(h, "cuCtxGetCurrent");
        cu.ctx_push = (cu_ctx_push_fn *)dlsym(h, "cuCtxPushCurrent_v2");
        cu.ctx_pop = (cu_ctx_pop_fn *)dlsym(h, "cuCtxPopCurrent_v2");
        cu.h = h;
    }
    return cu.attr != NULL;
}

/* Ranges a CUDA double that is no libcuda.so.1 (drc's fake driver table in an in-process test)
 * declared device memory: loopnic_add_device_memory. Written before the registrations that use them. */
enum { MAX_DEVMEM = 16 };
static struct { uint64_t start, len; } g_devmem[MAX_DEVMEM];
static _Atomic int g_ndevmem;

static int is_gpu(uint64_t addr)
{
    unsigned int mt = 0;

    for (int i = 0; i < atomic_load(&g_ndevmem); i++)
        if (addr - g_devmem[i].start < g_devmem[i].len)
            return 1;
    if (!cuda_loaded())
        return 0;
    return cu.attr(&mt, CU_ATTR_MEMORY_TYPE, addr) == 0 && mt == CU_MEMTYPE_DEVICE;
}

static int gpu_buffer_id(uint64_t addr, uint64_t *id)
{
    unsigned long long v = 0;

    if (!cuda_loaded() || cu.attr(&v, CU_ATTR_BUFFER_ID, addr) != 0)
        return -1;
    *id = v;
    return 0;
}

/* A CUDA double's answer to "where is the memory behind dmabuf fd": 1 and *base, or 0 (the real
 * driver has no such function). */
static int dmabuf_base(int fd, uint64_t *base)
{
    typedef int base_fn(int fd, unsigned long long *base);
    base_fn *f;
    unsigned long long b;

    if (!cuda_loaded() || !(f = (base_fn *)dlsym(cu.h, "fakecu_dmabuf_base")) || f(fd, &b) != 0)
        return 0;
    *base = b;
    return 1;
}

/* Copy n bytes between two addresses of this process, one of them GPU memory. */
static int gpu_copy(uint64_t dst, uint64_t src, size_t n, uint64_t gpu_addr)
{
    void *cur = NULL, *ctx = NULL, *popped;
    int pushed = 0, rc;

    if (!cuda_loaded())
        return -1;
    if (!cu.memcpy_) { /* a CUDA double without cuMemcpy: its "device memory" is host memory */
        memmove((void *)(uintptr_t)dst, (void *)(uintptr_t)src, n);
        return 0;
    }
    if (cu.ctx_get && cu.ctx_push && cu.ctx_pop && cu.ctx_get(&cur) == 0 && !cur &&
        cu.attr(&ctx, CU_ATTR_CONTEXT, gpu_addr) == 0 && ctx && cu.ctx_push(ctx) == 0)
        pushed = 1;
    rc = cu.memcpy_(dst, src, n);
    if (pushed)
        cu.ctx_pop(&popped);
    return rc == 0 ? 0 : -1;
}

/* ---- host memory ---- */
static int host_mapped(uint64_t a, uint64_t n)
{
    unsigned char vec[1024];
    uint64_t s, e;

    if (!n)
        return 1;
    if (a + n < a)
        return 0;
    s = a & ~(uint64_t)(g_page - 1);
    e = (a + n + (uint64_t)g_page - 1) & ~(uint64_t)(g_page - 1);
    while (s < e) {
        uint64_t chunk = e - s;
        if (chunk > sizeof(vec) * (uint64_t)g_page)
            chunk = sizeof(vec) * (uint64_t)g_page;
        if (mincore((void *)(uintptr_t)s, chunk, vec) != 0)
            return 0;
        s += chunk;
    }
    return 1;
}

/* ---- page identity (LOOPNIC_PAGEMAP=1) ---- */
static int pagemap_on(void)
{
    const char *s = getenv("LOOPNIC_PAGEMAP"); /* read each time: tests flip it */
    return s && *s && strcmp(s, "0");
}

/* The page frame numbers of pages [first, first+n) of this process (0 where not present), or -1
 * if pagemap cannot be read. Without CAP_SYS_ADMIN the kernel reports every PFN as 0. */
static int read_pfns(uint64_t first, uint64_t n, uint64_t *out)
{
    size_t want = n * sizeof(*out), got = 0;

    if (g_pagemap_fd < 0)
        g_pagemap_fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
    if (g_pagemap_fd < 0)
        return -1;
    while (got < want) {
        ssize_t r = pread(g_pagemap_fd, (char *)out + got, want - got, (off_t)(first * sizeof(*out) + got));
        if (r <= 0)
            return -1;
        got += (size_t)r;
    }
    for (uint64_t i = 0; i < n; i++)
        out[i] = (out[i] >> 63) ? out[i] & ((1ull << 55) - 1) : 0;
    return 0;
}

/* Fault [a, a+n) in writable (as pinning for the NIC does) and read its frames. NULL if the
 * frames are not visible. */
static uint64_t *pin_pfns(uint64_t a, uint64_t n, uint64_t *first, uint64_t *npages)
{
    uint64_t s = a & ~(uint64_t)(g_page - 1), e = (a + n + (uint64_t)g_page - 1) & ~(uint64_t)(g_page - 1);
    uint64_t *pfn, nz = 0;

    if (madvise((void *)(uintptr_t)s, e - s, MADV_POPULATE_WRITE) != 0)
        madvise((void *)(uintptr_t)s, e - s, MADV_POPULATE_READ);
    *first = s / (uint64_t)g_page;
    *npages = (e - s) / (uint64_t)g_page;
    pfn = malloc(*npages * sizeof(*pfn));
    if (pfn && read_pfns(*first, *npages, pfn) == 0)
        for (uint64_t i = 0; i < *npages; i++)
            nz |= pfn[i];
    if (!nz) {
        free(pfn);
        return NULL;
    }
    return pfn;
}

/* Do the pages of [a, a+n) still have the frames they had at registration? */
static int pfns_changed(const struct pfns *p, uint64_t a, uint64_t n)
{
    uint64_t first = a / (uint64_t)g_page, last = (a + n - 1) / (uint64_t)g_page, cur[64];

    if (!p->pfn || !n)
        return 0;
    for (uint64_t pg = first; pg <= last; pg += 64) {
        uint64_t k = last - pg + 1 < 64 ? last - pg + 1 : 64;
        if (read_pfns(pg, k, cur) != 0)
            return 1;
        for (uint64_t i = 0; i < k; i++)
            if (pg + i >= p->first_page && pg + i < p->first_page + p->npages &&
                cur[i] != p->pfn[pg + i - p->first_page])
                return 1;
    }
    return 0;
}

/* ---- stale tracking ---- */
static void add_stale(struct sh_mr *m, uint64_t lo, uint64_t hi)
{
    for (uint32_t i = 0; i < m->nstale; i++)
        if (lo <= m->stale[i][1] && hi >= m->stale[i][0]) { /* touching: merge */
            if (lo < m->stale[i][0]) m->stale[i][0] = lo;
            if (hi > m->stale[i][1]) m->stale[i][1] = hi;
            return;
        }
    if (m->nstale < NSTALE) {
        m->stale[m->nstale][0] = lo;
        m->stale[m->nstale][1] = hi;
        m->nstale++;
    } else {
        m->flags |= F_STALE_ALL;
    }
}

/* [a, a+n) of the address space was unmapped, replaced or discarded. */
static void note_unmap(uint64_t a, uint64_t n)
{
    uint64_t e;
    int pid;

    if (!g_tab || atomic_load(&g_nown_host) == 0 || !n || t_in)
        return;
    e = a + ((n + (uint64_t)g_page - 1) & ~(uint64_t)(g_page - 1));
    if (e <= atomic_load(&g_host_lo) || a >= atomic_load(&g_host_hi))
        return; /* nowhere near a registered range: no lock */
    pid = getpid();
    lock();
    for (size_t i = 0; i < g_nown; i++) {
        struct sh_mr *m = &g_tab->mr[g_own[i]];
        uint64_t lo, hi;
        if (!m->in_use || m->pid != pid || (m->flags & F_GPU))
            continue;
        lo = a > m->addr ? a : m->addr;
        hi = e < m->addr + m->len ? e : m->addr + m->len;
        if (lo < hi)
            add_stale(m, lo, hi);
    }
    unlock();
}

/* Was [a, a+n) of MR m's address space freed or remapped since registration? */
static int mr_stale(struct sh_mr *m, uint64_t a, uint64_t n)
{
    if (m->flags & F_STALE_ALL)
        return 1;
    for (uint32_t i = 0; i < m->nstale; i++)
        if (a < m->stale[i][1] && a + n > m->stale[i][0])
            return 1;
    if (!(m->flags & F_GPU) && m->pid == getpid() && pfns_changed(&g_pfns[m - g_tab->mr], a, n))
        return 1;
    if ((m->flags & F_GPU) && m->pid == getpid()) {
        uint64_t id;
        if (gpu_buffer_id(m->addr, &id) != 0 || id != m->buffer_id)
            return 1;
    }
    return 0;
}

API void *mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
    void *r = real_mmap ? real_mmap(addr, len, prot, flags, fd, off)
                        : (void *)syscall(SYS_mmap, addr, len, prot, flags, fd, off);
    if (r != MAP_FAILED && (flags & MAP_FIXED))
        note_unmap((uintptr_t)addr, len);
    return r;
}

API void *mmap64(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
    return mmap(addr, len, prot, flags, fd, off);
}

API int munmap(void *addr, size_t len)
{
    int r = real_munmap ? real_munmap(addr, len) : (int)syscall(SYS_munmap, addr, len);
    if (r == 0)
        note_unmap((uintptr_t)addr, len);
    return r;
}

API void *mremap(void *old, size_t old_size, size_t new_size, int flags, ...)
{
    void *r, *new_addr = NULL;

    if (flags & MREMAP_FIXED) {
        va_list ap;
        va_start(ap, flags);
        new_addr = va_arg(ap, void *);
        va_end(ap);
    }
    r = real_mremap ? real_mremap(old, old_size, new_size, flags, new_addr)
                    : (void *)syscall(SYS_mremap, old, old_size, new_size, flags, new_addr);
    if (r == MAP_FAILED)
        return r;
    if (r != old)
        note_unmap((uintptr_t)old, old_size);     /* moved: the old range no longer holds it */
    else if (new_size < old_size)
        note_unmap((uintptr_t)old + new_size, old_size - new_size);
    if (flags & MREMAP_FIXED)
        note_unmap((uintptr_t)r, new_size);       /* whatever was mapped there before is gone */
    return r;
}

API int madvise(void *addr, size_t len, int advice)
{
    int r = real_madvise ? real_madvise(addr, len, advice) : (int)syscall(SYS_madvise, addr, len, advice);
    if (r == 0 && (advice == MADV_DONTNEED || advice == MADV_REMOVE || advice == MADV_FREE
#ifdef MADV_DONTNEED_LOCKED
                   || advice == MADV_DONTNEED_LOCKED
#endif
                   ))
        note_unmap((uintptr_t)addr, len);
    return r;
}

/* ---- async events ---- */
static int push_async(struct lctx *lc, const struct ibv_async_event *ev)
{
    char b = 1;
    int full;

    pthread_mutex_lock(&lc->evlock);
    full = lc->evn == NEV;
    if (!full) {
        lc->ev[(lc->evh + lc->evn) % NEV] = *ev;
        lc->evn++;
    }
    pthread_mutex_unlock(&lc->evlock);
    if (full)
        return ENOSPC;
    if (write(lc->async_w, &b, 1) != 1)
        return errno;
    return 0;
}

API int loopnic_raise_async_event(struct ibv_context *ctx, enum ibv_event_type type, void *element)
{
    struct ibv_async_event ev;

    if (!ctx)
        return EINVAL;
    memset(&ev, 0, sizeof(ev));
    ev.event_type = type;
    switch ((int)type) {
    case IBV_EVENT_PORT_ACTIVE: case IBV_EVENT_PORT_ERR: case IBV_EVENT_LID_CHANGE:
    case IBV_EVENT_PKEY_CHANGE: case IBV_EVENT_SM_CHANGE: case IBV_EVENT_CLIENT_REREGISTER:
    case IBV_EVENT_GID_CHANGE: case IBV_EVENT_DEVICE_FATAL:
        ev.element.port_num = (int)(uintptr_t)element;
        break;
    case IBV_EVENT_CQ_ERR:
        ev.element.cq = element;
        break;
    case IBV_EVENT_SRQ_ERR: case IBV_EVENT_SRQ_LIMIT_REACHED:
        ev.element.srq = element;
        break;
    default:
        ev.element.qp = element;
        break;
    }
    return push_async(LCTX(ctx), &ev);
}

API int ibv_get_async_event(struct ibv_context *ctx, struct ibv_async_event *event)
{
    struct lctx *lc = LCTX(ctx);
    char b;
    int ok;

    if (read(ctx->async_fd, &b, 1) != 1)
        return -1;
    pthread_mutex_lock(&lc->evlock);
    ok = lc->evn > 0;
    if (ok) {
        *event = lc->ev[lc->evh];
        lc->evh = (lc->evh + 1) % NEV;
        lc->evn--;
    }
    pthread_mutex_unlock(&lc->evlock);
    if (!ok) {
        errno = EAGAIN;
        return -1;
    }
    return 0;
}

API void ibv_ack_async_event(struct ibv_async_event *event)
{
    (void)event;
}

/* ---- devices ---- */
API struct ibv_device **ibv_get_device_list(int *num_devices)
{
    struct ibv_device **l;

    init();
    l = calloc((size_t)g_ndev + 1, sizeof(*l));
    if (!l) {
        errno = ENOMEM;
        return NULL;
    }
    for (int i = 0; i < g_ndev; i++)
        l[i] = &g_dev[i];
    if (num_devices)
        *num_devices = g_ndev;
    return l;
}

API void ibv_free_device_list(struct ibv_device **list)
{
    free(list);
}

API const char *ibv_get_device_name(struct ibv_device *device)
{
    return device ? device->name : NULL;
}

API __be64 ibv_get_device_guid(struct ibv_device *device)
{
    int i = dev_index(device);
    return i < 0 ? 0 : htobe64(dev_guid(i));
}

API int ibv_get_device_index(struct ibv_device *device)
{
    return dev_index(device);
}

static int lq_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad_wr);
static int lq_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr);
static int lq_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc);
static int lq_req_notify_cq(struct ibv_cq *cq, int solicited_only);
static int lq_query_port(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *attr, size_t len);
static int lq_query_device_ex(struct ibv_context *ctx, const struct ibv_query_device_ex_input *input,
                              struct ibv_device_attr_ex *attr, size_t attr_size);

static int lq_post_srq_recv(struct ibv_srq *srq, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr);

static int lq_bind_mw(struct ibv_qp *qp, struct ibv_mw *mw, struct ibv_mw_bind *bind)
{
    (void)qp; (void)mw; (void)bind;
    return EOPNOTSUPP;
}

static int lq_dealloc_mw(struct ibv_mw *mw)
{
    (void)mw;
    return EOPNOTSUPP;
}

API struct ibv_context *ibv_open_device(struct ibv_device *device)
{
    struct lctx *lc;
    struct ibv_context *c;
    int i, p[2];

    if (!init() || (i = dev_index(device)) < 0) {
        errno = ENODEV;
        return NULL;
    }
    lc = calloc(1, sizeof(*lc));
    if (!lc) {
        errno = ENOMEM;
        return NULL;
    }
    if (pipe2(p, O_CLOEXEC) != 0) {
        free(lc);
        return NULL;
    }
    lc->dev = i;
    lc->async_w = p[1];
    pthread_mutex_init(&lc->evlock, NULL);
    lc->vctx.sz = sizeof(lc->vctx);
    lc->vctx.query_port = lq_query_port;
    lc->vctx.query_device_ex = lq_query_device_ex;
    c = &lc->vctx.context;
    c->device = device;
    c->async_fd = p[0];
    c->cmd_fd = eventfd(0, EFD_CLOEXEC);
    c->num_comp_vectors = 1;
    c->abi_compat = __VERBS_ABI_IS_EXTENDED;
    pthread_mutex_init(&c->mutex, NULL);
    c->ops.post_send = lq_post_send;
    c->ops.post_recv = lq_post_recv;
    c->ops.poll_cq = lq_poll_cq;
    c->ops.req_notify_cq = lq_req_notify_cq;
    c->ops.post_srq_recv = lq_post_srq_recv;
    c->ops.bind_mw = lq_bind_mw;
    c->ops.dealloc_mw = lq_dealloc_mw;
    return c;
}

API int ibv_close_device(struct ibv_context *ctx)
{
    struct lctx *lc = LCTX(ctx);

    close(ctx->async_fd);
    close(lc->async_w);
    if (ctx->cmd_fd >= 0)
        close(ctx->cmd_fd);
    pthread_mutex_destroy(&lc->evlock);
    free(lc);
    return 0;
}

API int ibv_query_device(struct ibv_context *ctx, struct ibv_device_attr *a)
{
    struct ibvd_call c = { .op = IBVD_QUERY, .ctx = ctx, .fd = -1 };
    int i = LCTX(ctx)->dev, ret;
    unsigned long long max;

    lock();
    ret = c.ret = g_query_ret;
    max = g_query_max;
    rec(&c);
    unlock();
    if (ret)
        return ret;
    memset(a, 0, sizeof(*a));
    snprintf(a->fw_ver, sizeof(a->fw_ver), "loopnic-1");
    a->node_guid = htobe64(dev_guid(i));
    a->sys_image_guid = htobe64(dev_guid(i));
    a->max_mr_size = max ? max : g_max_mr_size;
    a->page_size_cap = ~(uint64_t)(g_page - 1);
    a->vendor_id = 0;
    a->vendor_part_id = 0;
    a->hw_ver = 1;
    a->max_qp = NQP - 2;
    a->max_qp_wr = MAX_QP_WR;
    a->device_cap_flags = IBV_DEVICE_RC_RNR_NAK_GEN | IBV_DEVICE_PORT_ACTIVE_EVENT;
    a->max_sge = MAX_SGE;
    a->max_sge_rd = MAX_SGE;
    a->max_cq = 1 << 16;
    a->max_cqe = MAX_CQE;
    a->max_mr = NMR;
    a->max_pd = 1 << 24;
    a->max_qp_rd_atom = 16;
    a->max_ee_rd_atom = 0;
    a->max_res_rd_atom = 1 << 20;
    a->max_qp_init_rd_atom = 16;
    a->atomic_cap = IBV_ATOMIC_HCA; /* atomic with the model's other atomics, not with the CPU */
    a->max_srq = 1 << 16;
    a->max_srq_wr = MAX_QP_WR;
    a->max_srq_sge = MAX_SGE;
    a->max_pkeys = 1;
    a->local_ca_ack_delay = 16;
    a->phys_port_cnt = 1;
    return 0;
}

/* The extended query: the same device, nothing of the extensions (no ODP, TSO, RSS, DM, ...). */
static int lq_query_device_ex(struct ibv_context *ctx, const struct ibv_query_device_ex_input *input,
                              struct ibv_device_attr_ex *attr, size_t attr_size)
{
    struct ibv_device_attr_ex a;
    int rc;

    if (input && input->comp_mask)
        return EINVAL;
    if (attr_size < sizeof(a.orig_attr))
        return EINVAL;
    memset(&a, 0, sizeof(a));
    rc = ibv_query_device(ctx, &a.orig_attr);
    if (rc)
        return rc;
    a.max_dm_size = 0;
    a.phys_port_cnt_ex = 1;
    memcpy(attr, &a, attr_size < sizeof(a) ? attr_size : sizeof(a));
    return 0;
}

static void fill_port(int dev, struct ibv_port_attr *a)
{
    memset(a, 0, sizeof(*a));
    a->state = IBV_PORT_ACTIVE;
    a->max_mtu = IBV_MTU_4096;
    a->active_mtu = g_eth ? IBV_MTU_1024 : IBV_MTU_4096;
    a->gid_tbl_len = 1;
    a->port_cap_flags = 0;
    a->max_msg_sz = 1u << 31;
    a->pkey_tbl_len = 1;
    a->lid = g_eth ? 0 : (uint16_t)(dev + 1);
    a->sm_lid = g_eth ? 0 : 1;
    a->max_vl_num = 1;
    a->subnet_timeout = 18;
    a->active_width = 2;   /* 4x */
    a->active_speed = 32;  /* EDR */
    a->phys_state = 5;     /* LinkUp */
    a->link_layer = g_eth ? IBV_LINK_LAYER_ETHERNET : IBV_LINK_LAYER_INFINIBAND;
}

static int lq_query_port(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *attr, size_t len)
{
    struct ibv_port_attr a;

    if (port != 1)
        return EINVAL;
    fill_port(LCTX(ctx)->dev, &a);
    memcpy(attr, &a, len < sizeof(a) ? len : sizeof(a));
    return 0;
}

/* The IBVERBS_1.1 entry point: the old, shorter structure (it ends with link_layer). */
API int ibv_query_port(struct ibv_context *ctx, uint8_t port, struct _compat_ibv_port_attr *attr)
{
    return lq_query_port(ctx, port, (struct ibv_port_attr *)(void *)attr,
                         offsetof(struct ibv_port_attr, flags));
}

static void fill_gid(int dev, union ibv_gid *gid)
{
    memset(gid, 0, sizeof(*gid));
    if (g_eth) { /* RoCE v2, IPv4-mapped 10.76.0.<dev+1> */
        gid->raw[10] = 0xff;
        gid->raw[11] = 0xff;
        gid->raw[12] = 10;
        gid->raw[13] = 76;
        gid->raw[15] = (uint8_t)(dev + 1);
    } else {
        gid->global.subnet_prefix = htobe64(0xfe80000000000000ull);
        gid->global.interface_id = htobe64(dev_guid(dev));
    }
}

API int ibv_query_gid(struct ibv_context *ctx, uint8_t port, int index, union ibv_gid *gid)
{
    if (port != 1 || index != 0)
        return -1;
    fill_gid(LCTX(ctx)->dev, gid);
    return 0;
}

/* libibverbs' private entry point (ibv_devinfo -v prints each GID's type with it). */
enum { GID_TYPE_SYSFS_IB_ROCE_V1, GID_TYPE_SYSFS_ROCE_V2 };
API int ibv_query_gid_type(struct ibv_context *ctx, uint8_t port, unsigned int index, int *type)
{
    (void)ctx;
    if (port != 1 || index != 0) {
        errno = EINVAL;
        return -1;
    }
    *type = g_eth ? GID_TYPE_SYSFS_ROCE_V2 : GID_TYPE_SYSFS_IB_ROCE_V1;
    return 0;
}

static void fill_gid_entry(int dev, struct ibv_gid_entry *e)
{
    memset(e, 0, sizeof(*e));
    fill_gid(dev, &e->gid);
    e->gid_index = 0;
    e->port_num = 1;
    e->gid_type = g_eth ? IBV_GID_TYPE_ROCE_V2 : IBV_GID_TYPE_IB;
    e->ndev_ifindex = 0;
}

API int _ibv_query_gid_ex(struct ibv_context *ctx, uint32_t port, uint32_t index,
                          struct ibv_gid_entry *entry, uint32_t flags, size_t entry_size)
{
    struct ibv_gid_entry e;

    if (flags || entry_size < sizeof(e) || port != 1)
        return EINVAL;
    if (index != 0)
        return ENODATA;
    fill_gid_entry(LCTX(ctx)->dev, &e);
    memcpy(entry, &e, sizeof(e));
    return 0;
}

API ssize_t _ibv_query_gid_table(struct ibv_context *ctx, struct ibv_gid_entry *entries,
                                 size_t max_entries, uint32_t flags, size_t entry_size)
{
    if (flags || entry_size < sizeof(*entries))
        return -EINVAL;
    if (max_entries < 1)
        return -EINVAL;
    fill_gid_entry(LCTX(ctx)->dev, entries);
    return 1;
}

API int ibv_query_pkey(struct ibv_context *ctx, uint8_t port, int index, __be16 *pkey)
{
    (void)ctx;
    if (port != 1 || index != 0)
        return -1;
    *pkey = htobe16(0xffff);
    return 0;
}

API int ibv_get_pkey_index(struct ibv_context *ctx, uint8_t port, __be16 pkey)
{
    (void)ctx;
    return port == 1 && pkey == htobe16(0xffff) ? 0 : -1;
}

API int ibv_fork_init(void)
{
    return 0;
}

API enum ibv_fork_status ibv_is_fork_initialized(void)
{
    return IBV_FORK_UNNEEDED;
}

API int ibv_dontfork_range(void *base, size_t size)
{
    (void)base; (void)size;
    return 0;
}

API int ibv_dofork_range(void *base, size_t size)
{
    (void)base; (void)size;
    return 0;
}

/* ---- PDs ---- */
API struct ibv_pd *ibv_alloc_pd(struct ibv_context *ctx)
{
    struct lpd *p = calloc(1, sizeof(*p));

    if (!p) {
        errno = ENOMEM;
        return NULL;
    }
    p->pd.context = ctx;
    p->dev = LCTX(ctx)->dev;
    lock();
    p->id = g_tab->next_pd_id++;
    unlock();
    p->pd.handle = (uint32_t)p->id;
    return &p->pd;
}

API int ibv_dealloc_pd(struct ibv_pd *pd)
{
    struct lpd *p = (struct lpd *)pd;
    int busy;

    struct ibvd_call c = { .op = IBVD_DEALLOC_PD, .pd = pd, .fd = -1 };

    lock();
    busy = p->nmr > 0 || p->nqp > 0;
    c.ret = busy ? EBUSY : 0;
    rec(&c);
    unlock();
    if (busy)
        return EBUSY;
    free(p);
    return 0;
}

/* ---- MRs ---- */
static void count_inode(int dev, const struct stat *st)
{
    for (size_t i = 0; i < g_ninodes; i++)
        if (g_inodes[i].dev == (uint64_t)st->st_dev && g_inodes[i].ino == (uint64_t)st->st_ino) {
            g_inodes[i].devmask |= 1ull << dev;
            return;
        }
    if (g_ninodes == MAX_INODES)
        return; /* documented: distinct inodes are counted up to MAX_INODES */
    g_inodes[g_ninodes].dev = (uint64_t)st->st_dev;
    g_inodes[g_ninodes].ino = (uint64_t)st->st_ino;
    g_inodes[g_ninodes].devmask = 1ull << dev;
    g_ninodes++;
}

static int own_add(uint32_t slot)
{
    if (g_nown == NMR)
        return -1;
    g_own[g_nown++] = slot;
    return 0;
}

static void own_del(uint32_t slot)
{
    for (size_t i = 0; i < g_nown; i++)
        if (g_own[i] == slot) {
            g_own[i] = g_own[--g_nown];
            return;
        }
}

enum reg_kind { REG_VA, REG_DMABUF };

static struct ibv_mr *reg_common(struct ibv_pd *pd, void *addr, size_t length, uint64_t iova,
                                 int access, enum reg_kind kind, uint64_t offset, int fd)
{
    struct lpd *p = (struct lpd *)pd;
    struct lmr *lm;
    struct stat st;
    struct sh_mr *m = NULL;
    uint64_t a = (uintptr_t)addr, buffer_id = 0;
    uint32_t flags = 0, slot = 0;
    struct pfns pin = { NULL, 0, 0 };
    int err = 0, dev;
    struct ibvd_call c = { .op = kind == REG_VA ? IBVD_REG_VA : IBVD_REG_DMABUF, .pd = pd,
                           .addr = kind == REG_VA ? (uintptr_t)addr : iova, .len = length, .iova = iova,
                           .offset = kind == REG_VA ? 0 : offset, .fd = kind == REG_VA ? -1 : fd,
                           .access = (unsigned)access, .fd_size = -1 };

    if (!pd || !init()) {
        errno = EINVAL;
        return NULL;
    }
    dev = p->dev;
    lock();
    if (g_fail_next) {   /* ibvd_fail_next_reg */
        err = g_fail_next;
        g_fail_next = 0;
    } else if (kind == REG_VA) {
        g_reg_calls++;
        if (g_fail_reg_at && g_reg_calls == g_fail_reg_at)
            err = g_fail_reg_err;
    } else {
        g_dmabuf_calls++;
        if (g_fail_dmabuf_at && g_dmabuf_calls == g_fail_dmabuf_at)
            err = g_fail_dmabuf_err;
    }
    unlock();
    if (err)
        goto fail;
    if (length == 0 || length > g_max_mr_size || iova + length < iova ||
        ((access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) && !(access & IBV_ACCESS_LOCAL_WRITE))) {
        err = EINVAL;
        goto fail;
    }
    if (kind == REG_DMABUF) {
        uint64_t size;
        if (fstat(fd, &st) != 0) {
            err = EBADF;
            goto fail;
        }
        {
            char path[64];
            ssize_t n;
            snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
            n = readlink(path, c.fd_link, sizeof(c.fd_link) - 1);
            c.fd_link[n > 0 ? n : 0] = 0;
        }
        size = (uint64_t)st.st_size;
        if (size == 0) { /* real dmabufs tell their size through lseek */
            off_t cur = lseek(fd, 0, SEEK_CUR), end = lseek(fd, 0, SEEK_END);
            if (end > 0)
                size = (uint64_t)end;
            if (cur >= 0)
                lseek(fd, cur, SEEK_SET);
        }
        c.fd_size = (long long)size;
        if (offset > size || length > size - offset) {
            err = EINVAL;
            goto fail;
        }
        /* Where the dmabuf's memory is: a CUDA double may say (fakecu_dmabuf_base, the start of the
         * exported range), so that a wrong offset reaches the wrong memory as on a real NIC; else
         * assume iova = the buffer's address, as drc and Mooncake pass it. */
        if (dmabuf_base(fd, &a))
            a += offset;
        else
            a = iova;
        flags |= F_DMABUF;
        if (is_gpu(a)) {
            flags |= F_GPU;
            gpu_buffer_id(a, &buffer_id);
        }
    } else if (is_gpu(a)) {
        const char *pm = getenv("LOOPNIC_PEERMEM"); /* read each time: tests flip it */
        if (!pm || !*pm || !strcmp(pm, "0")) { /* no nvidia-peermem: the kernel cannot pin GPU pages */
            err = EFAULT;
            goto fail;
        }
        flags |= F_GPU;
        gpu_buffer_id(a, &buffer_id);
    } else if (!host_mapped(a, length)) {
        err = EFAULT;
        goto fail;
    }
    if (!(flags & F_GPU) && kind == REG_VA && pagemap_on())
        pin.pfn = pin_pfns(a, length, &pin.first_page, &pin.npages);
    lm = calloc(1, sizeof(*lm));
    if (!lm) {
        free(pin.pfn);
        err = ENOMEM;
        goto fail;
    }
    lm->dmabuf_fd = kind == REG_DMABUF ? fcntl(fd, F_DUPFD_CLOEXEC, 0) : -1;   /* the MR's hold on the dmabuf */
    lock();
    for (uint32_t n = 0; n < NMR; n++) {
        uint32_t s = (g_tab->mr_hint + n) % NMR;
        if (!g_tab->mr[s].in_use) {
            slot = s;
            m = &g_tab->mr[s];
            break;
        }
    }
    if (!m || own_add(slot) != 0) {
        unlock();
        free(pin.pfn);
        if (lm->dmabuf_fd >= 0)
            close(lm->dmabuf_fd);
        free(lm);
        err = ENOMEM;
        goto fail;
    }
    g_tab->mr_hint = (slot + 1) % NMR;
    {
        uint32_t gen = (m->key >> 15) + 1;
        if ((gen << 15) == 0)
            gen = 1;
        m->key = (gen << 15) | slot;
    }
    m->in_use = 1;
    m->pid = getpid();
    m->dev = dev;
    m->pd_id = p->id;
    m->iova = iova;
    m->len = length;
    m->addr = a;
    m->buffer_id = buffer_id;
    m->access = (uint32_t)access;
    m->flags = flags;
    m->nstale = 0;
    g_pfns[slot] = pin; /* its previous array was freed by ibv_dereg_mr */
    p->nmr++;
    if (!(flags & F_GPU)) {
        atomic_fetch_add(&g_nown_host, 1);
        if (a < atomic_load(&g_host_lo))
            atomic_store(&g_host_lo, a);
        if (a + length > atomic_load(&g_host_hi))
            atomic_store(&g_host_hi, a + length);
    }
    g_cnt[dev].live_mrs++;
    g_cnt[dev].dmabuf_held += lm->dmabuf_fd >= 0;
    g_cnt[dev].total_regs++;
    if (kind == REG_DMABUF) {
        g_cnt[dev].dmabuf_regs++;
        count_inode(dev, &st);
    }
    lm->slot = slot;
    g_mr_local[slot] = lm;
    lm->pd = p;
    lm->mr.context = pd->context;
    lm->mr.pd = pd;
    lm->mr.addr = kind == REG_DMABUF ? (void *)(uintptr_t)offset : addr; /* as rdma-core sets it */
    lm->mr.length = length;
    lm->mr.handle = slot;
    lm->mr.lkey = lm->mr.rkey = m->key;
    c.mr = &lm->mr;
    c.lkey = c.rkey = m->key;
    rec(&c);
    unlock();
    return &lm->mr;
fail:
    lock();
    g_cnt[dev].reg_failures++;
    unlock();
    errno = err;
    return NULL;
}

API struct ibv_mr *ibv_reg_mr_iova2(struct ibv_pd *pd, void *addr, size_t length, uint64_t iova,
                                    unsigned int access)
{
    return reg_common(pd, addr, length, iova, (int)access, REG_VA, 0, -1);
}

/* As in rdma-core, ibv_reg_mr and ibv_reg_mr_iova call ibv_reg_mr_iova2 through the PLT, so an
 * interposer of ibv_reg_mr_iova2 (libdrc_verbs.so) sees them even from a dlopen()ed handle. */
API struct ibv_mr *ibv_reg_mr(struct ibv_pd *pd, void *addr, size_t length, int access)
{
    return ibv_reg_mr_iova2(pd, addr, length, (uintptr_t)addr, (unsigned int)access);
}

API struct ibv_mr *ibv_reg_mr_iova(struct ibv_pd *pd, void *addr, size_t length, uint64_t iova, int access)
{
    return ibv_reg_mr_iova2(pd, addr, length, iova, (unsigned int)access);
}

API struct ibv_mr *ibv_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset, size_t length, uint64_t iova,
                                     int fd, int access)
{
    if (fd == -1 && offset == 0 && length == 0 && iova == 0 && access == 0) {
        /* drc's buffer-less probe: a NIC that does dmabuf answers EBADF (loopnic_record.h) */
        struct ibvd_call c = { .op = IBVD_PROBE, .pd = pd, .fd = -1 };
        init();
        lock();
        c.ret = g_probe_errno;
        rec(&c);
        unlock();
        errno = c.ret;
        return NULL;
    }
    return reg_common(pd, NULL, length, iova, access, REG_DMABUF, offset, fd);
}

API int ibv_dereg_mr(struct ibv_mr *mr)
{
    struct lmr *lm = (struct lmr *)mr;
    struct sh_mr *m;
    uint64_t *old_pfn;
    int foreign = 0, dmabuf_fd;
    static int warned;

    struct ibvd_call c = { .op = IBVD_DEREG, .mr = mr, .fd = -1, .first_byte = -1 };
    int ret;

    if (!mr)
        return EINVAL;
    lock();
    if (g_mr_local[mr->lkey & (NMR - 1)] != lm) {
        c.op = IBVD_DEREG_UNKNOWN;
        rec(&c);
        /* Not an ibv_mr this provider handed out. If it is a copy naming one of ours (a cache's
         * caller MR: same handle and keys), do what the kernel does with rdma-core: deregister
         * the MR by its handle. rdma-core would then free() the foreign pointer; we leave both
         * objects alone, count it, and later calls with the owner's pointer get EINVAL. */
        struct lmr *owner = g_mr_local[mr->lkey & (NMR - 1)];
        if (!owner || owner->mr.lkey != mr->lkey || owner->mr.handle != mr->handle) {
            unlock();
            return EINVAL;
        }
        lm = owner;
        foreign = 1;
        g_cnt[lm->pd->dev].foreign_deregs++;
    }
    m = &g_tab->mr[lm->slot];
    if (!foreign) {
        c.pd = lm->mr.pd;
        c.addr = (m->flags & F_DMABUF) ? m->iova : m->addr;
        c.len = m->len;
        c.lkey = lm->mr.lkey;
        c.rkey = lm->mr.rkey;
        c.kind = (m->flags & F_DMABUF) ? IBVD_REG_DMABUF : IBVD_REG_VA;
        if (!(m->flags & F_DMABUF)) {
            uintptr_t at = atomic_load(&g_probe_addr);
            c.mapped = host_mapped(m->addr, m->len);
            if (at < m->addr || at - m->addr >= m->len)
                at = m->addr;
            if (c.mapped && getenv("IBVD_READ_AT_DEREG")) {
                /* through the kernel: PROT_NONE memory reads as EFAULT, not SIGSEGV */
                unsigned char b;
                struct iovec liov = { &b, 1 }, riov = { (void *)at, 1 };
                if (process_vm_readv(getpid(), &liov, 1, &riov, 1, 0) == 1)
                    c.first_byte = b;
            }
        }
        ret = c.ret = g_dereg_ret;
        rec(&c);
    } else {
        ret = 0;
    }
    g_mr_local[lm->slot] = NULL;
    m->in_use = 0;
    old_pfn = g_pfns[lm->slot].pfn;
    g_pfns[lm->slot].pfn = NULL;
    if (!(m->flags & F_GPU))
        atomic_fetch_sub(&g_nown_host, 1);
    own_del(lm->slot);
    lm->pd->nmr--;
    g_cnt[lm->pd->dev].live_mrs--;
    g_cnt[lm->pd->dev].dmabuf_held -= lm->dmabuf_fd >= 0;
    g_cnt[lm->pd->dev].deregs++;
    dmabuf_fd = lm->dmabuf_fd;
    lm->dmabuf_fd = -1;
    unlock();
    free(old_pfn);
    if (dmabuf_fd >= 0)
        close(dmabuf_fd);       /* the dmabuf (and a freed GPU buffer behind it) goes with the MR */
    if (!foreign)
        free(lm);
    else if (!warned++)
        fprintf(stderr, "loopnic: ibv_dereg_mr of an ibv_mr it did not allocate (a copy of MR handle %u): "
                        "deregistered by handle, as the kernel would; rdma-core would also free() it\n",
                mr->handle);
    return ret;
}

/* Only IBV_REREG_MR_CHANGE_ACCESS of one of our MRs (recorded); anything else IBV_REREG_MR_ERR_INPUT. */
API int ibv_rereg_mr(struct ibv_mr *mr, int flags, struct ibv_pd *pd, void *addr, size_t length, int access)
{
    struct ibvd_call c = { .op = IBVD_REREG, .mr = mr, .pd = pd, .addr = (uintptr_t)addr, .len = length,
                           .access = (unsigned)access, .fd = -1, .kind = flags };
    struct lmr *lm = (struct lmr *)mr;

    init();
    lock();
    c.ret = IBV_REREG_MR_ERR_INPUT;
    if (mr && g_mr_local[mr->lkey & (NMR - 1)] == lm && flags == IBV_REREG_MR_CHANGE_ACCESS &&
        !((access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) && !(access & IBV_ACCESS_LOCAL_WRITE))) {
        g_tab->mr[lm->slot].access = (uint32_t)access;
        c.ret = 0;
    }
    rec(&c);
    unlock();
    if (c.ret)
        errno = EINVAL;
    return c.ret;
}

API int loopnic_mr_is_stale(struct ibv_mr *mr)
{
    struct lmr *lm = (struct lmr *)mr;
    struct sh_mr *m;
    int r = 0;

    lock();
    if (mr && g_mr_local[mr->lkey & (NMR - 1)] == lm) {
        m = &g_tab->mr[lm->slot];
        r = mr_stale(m, m->addr, m->len);
    }
    unlock();
    return r;
}

/* ---- completion channels and CQs ---- */
API struct ibv_comp_channel *ibv_create_comp_channel(struct ibv_context *ctx)
{
    struct lchan *c = calloc(1, sizeof(*c));
    int p[2];

    if (!c) {
        errno = ENOMEM;
        return NULL;
    }
    if (pipe2(p, O_CLOEXEC) != 0) {
        free(c);
        return NULL;
    }
    c->ch.context = ctx;
    c->ch.fd = p[0];
    c->ch.refcnt = 0;
    c->wfd = p[1];
    pthread_mutex_init(&c->lock, NULL);
    return &c->ch;
}

API int ibv_destroy_comp_channel(struct ibv_comp_channel *ch)
{
    struct lchan *c = (struct lchan *)ch;

    if (c->ncq > 0)
        return EBUSY;
    close(c->ch.fd);
    close(c->wfd);
    pthread_mutex_destroy(&c->lock);
    free(c->q);
    free(c);
    return 0;
}

/* Room for the events of every CQ of the channel, sized when a CQ joins it (chan_push runs
 * under g_lock, where nothing may allocate). c->lock held. */
static int chan_grow(struct lchan *c, unsigned cap)
{
    struct ibv_cq **n;

    if (cap <= c->qcap)
        return 0;
    n = malloc(cap * sizeof(*n));
    if (!n)
        return -1;
    for (unsigned i = 0; i < c->qn; i++)
        n[i] = c->q[(c->qh + i) % c->qcap];
    free(c->q);
    c->q = n;
    c->qh = 0;
    c->qcap = cap;
    return 0;
}

static void chan_push(struct lchan *c, struct ibv_cq *cq)
{
    char b = 1;
    int ok;

    pthread_mutex_lock(&c->lock);
    ok = c->qn < c->qcap; /* else dropped: a CQ re-armed many times without its events read */
    if (ok) {
        c->q[(c->qh + c->qn) % c->qcap] = cq;
        c->qn++;
    }
    pthread_mutex_unlock(&c->lock);
    if (ok && write(c->wfd, &b, 1) != 1)
        fprintf(stderr, "loopnic: completion channel write: %s\n", strerror(errno));
}

API int ibv_get_cq_event(struct ibv_comp_channel *ch, struct ibv_cq **cq, void **cq_context)
{
    struct lchan *c = (struct lchan *)ch;
    struct ibv_cq *q = NULL;
    char b;

    if (read(ch->fd, &b, 1) != 1)
        return -1;
    pthread_mutex_lock(&c->lock);
    if (c->qn > 0) {
        q = c->q[c->qh];
        c->qh = (c->qh + 1) % c->qcap;
        c->qn--;
    }
    pthread_mutex_unlock(&c->lock);
    if (!q) {
        errno = EAGAIN;
        return -1;
    }
    *cq = q;
    *cq_context = q->cq_context;
    return 0;
}

API void ibv_ack_cq_events(struct ibv_cq *cq, unsigned int nevents)
{
    pthread_mutex_lock(&cq->mutex);
    cq->comp_events_completed += nevents;
    pthread_mutex_unlock(&cq->mutex);
}

static void progress_start(void);

API struct ibv_cq *ibv_create_cq(struct ibv_context *ctx, int cqe, void *cq_context,
                                 struct ibv_comp_channel *channel, int comp_vector)
{
    struct lcq *c;
    void *inbox;

    if (cqe < 1 || cqe > MAX_CQE || comp_vector < 0 || comp_vector >= ctx->num_comp_vectors) {
        errno = EINVAL;
        return NULL;
    }
    c = calloc(1, sizeof(*c));
    inbox = calloc((size_t)cqe, sizeof(struct ibv_wc));
    if (!c || !inbox || !(c->ring = calloc((size_t)cqe, sizeof(*c->ring)))) {
        free(inbox);
        free(c);
        errno = ENOMEM;
        return NULL;
    }
    c->cap = cqe;
    c->in.ring = (uintptr_t)inbox;
    c->in.cap = (uint32_t)cqe;
    c->cq.context = ctx;
    c->cq.channel = channel;
    c->cq.cq_context = cq_context;
    c->cq.cqe = cqe;
    pthread_mutex_init(&c->cq.mutex, NULL);
    pthread_cond_init(&c->cq.cond, NULL);
    pthread_mutex_init(&c->lock, NULL);
    if (channel) {
        struct lchan *ch = (struct lchan *)channel;
        int rc;
        pthread_mutex_lock(&ch->lock);
        rc = chan_grow(ch, 16 + 4 * ((unsigned)ch->ncq + 1));
        if (rc == 0) {
            ch->ncq++;
            ch->ch.refcnt++;
        }
        pthread_mutex_unlock(&ch->lock);
        if (rc) {
            pthread_mutex_destroy(&c->lock);
            free(c->ring);
            free(inbox);
            free(c);
            errno = ENOMEM;
            return NULL;
        }
    }
    lock();
    c->next = g_cqs;
    g_cqs = c;
    unlock();
    return &c->cq;
}

API int ibv_destroy_cq(struct ibv_cq *cq)
{
    struct lcq *c = (struct lcq *)cq;
    int busy;

    lock();
    busy = c->nqp > 0;
    if (!busy)
        for (struct lcq **pp = &g_cqs; *pp; pp = &(*pp)->next)
            if (*pp == c) {
                *pp = c->next;
                break;
            }
    unlock();
    if (busy)
        return EBUSY;
    if (cq->channel) {
        struct lchan *ch = (struct lchan *)cq->channel;
        pthread_mutex_lock(&ch->lock);
        ch->ncq--;
        ch->ch.refcnt--;
        /* drop pending events of this CQ */
        for (unsigned i = 0; i < ch->qn; i++)
            if (ch->q[(ch->qh + i) % ch->qcap] == cq)
                ch->q[(ch->qh + i) % ch->qcap] = NULL;
        pthread_mutex_unlock(&ch->lock);
    }
    pthread_mutex_destroy(&c->lock);
    pthread_mutex_destroy(&cq->mutex);
    pthread_cond_destroy(&cq->cond);
    free((void *)(uintptr_t)c->in.ring);
    free(c->ring);
    free(c);
    return 0;
}

API int ibv_resize_cq(struct ibv_cq *cq, int cqe)
{
    (void)cq; (void)cqe;
    return EOPNOTSUPP;
}

static void cq_overrun(struct lcq *c)
{
    struct ibv_async_event ev;

    memset(&ev, 0, sizeof(ev));
    ev.event_type = IBV_EVENT_CQ_ERR;
    ev.element.cq = &c->cq;
    push_async(LCTX(c->cq.context), &ev);
}

static void cq_push(struct lcq *c, const struct ibv_wc *wc, uint32_t slot, uint32_t retire)
{
    int notify = 0, overflow = 0;

    pthread_mutex_lock(&c->lock);
    if (c->n == c->cap) {
        overflow = 1;
    } else {
        struct cqe *e = &c->ring[(c->head + c->n) % c->cap];
        e->wc = *wc;
        e->slot = slot;
        e->retire = retire;
        c->n++;
        if (c->armed) {
            c->armed = 0;
            notify = 1;
        }
    }
    pthread_mutex_unlock(&c->lock);
    if (overflow) /* as hardware: the CQ overruns, an async CQ_ERR event */
        cq_overrun(c);
    if (notify && c->cq.channel)
        chan_push((struct lchan *)c->cq.channel, &c->cq);
}

/* Move what peers delivered to c's inbox into its ring. Lock held. */
static void drain_inbox(struct lcq *c)
{
    const struct ibv_wc *ring = (const struct ibv_wc *)(uintptr_t)c->in.ring;

    while (c->in.n > 0) {
        cq_push(c, &ring[c->in.head], 0, 0);
        c->in.head = (c->in.head + 1) % c->in.cap;
        c->in.n--;
    }
    if (c->in.over) {
        c->in.over = 0;
        cq_overrun(c);
    }
}

static void progress_all(void);

static int lq_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc)
{
    struct lcq *c = (struct lcq *)cq;
    int k = 0;

    if (n < 0)
        return -1;
    if (atomic_load(&g_npend))
        progress_all();
    if (__atomic_load_n(&c->in.n, __ATOMIC_ACQUIRE) || __atomic_load_n(&c->in.over, __ATOMIC_ACQUIRE)) {
        lock();
        drain_inbox(c);
        unlock();
    }
    while (k < n) {
        struct cqe e;
        pthread_mutex_lock(&c->lock);
        if (c->n == 0) {
            pthread_mutex_unlock(&c->lock);
            break;
        }
        e = c->ring[c->head];
        c->head = (c->head + 1) % c->cap;
        c->n--;
        pthread_mutex_unlock(&c->lock);
        wc[k++] = e.wc;
        if (e.retire) { /* polling a send completion frees its WR's send queue slots, and those of
                         * the unsignalled WRs before it (g_lock after c->lock is released) */
            struct lqp *q;
            lock();
            q = g_qp_local[e.slot];
            if (q && q->qp.qp_num == e.wc.qp_num)
                q->outstanding -= e.retire < q->outstanding ? e.retire : q->outstanding;
            unlock();
        }
    }
    return k;
}

static int lq_req_notify_cq(struct ibv_cq *cq, int solicited_only)
{
    struct lcq *c = (struct lcq *)cq;

    (void)solicited_only;
    if (!cq->channel)
        return EINVAL;
    pthread_mutex_lock(&c->lock);
    c->armed = 1;
    pthread_mutex_unlock(&c->lock);
    if (g_regfd >= 0) /* a peer process may deliver to this CQ: someone must notice it */
        progress_start();
    return 0;
}

/* ---- receive queues ---- */
static int lrq_init(struct lrq *r, uint32_t max_wr, uint32_t max_sge)
{
    void *ring;

    if (max_sge == 0)
        max_sge = 1;
    r->cap = max_wr + 1;
    r->max_sge = max_sge;
    r->stride = (uint32_t)(sizeof(struct rwqe) + max_sge * sizeof(struct ibv_sge));
    ring = calloc(r->cap, r->stride);
    if (!ring)
        return ENOMEM;
    r->ring = (uintptr_t)ring;
    r->head = r->n = 0;
    return 0;
}

/* Post receive WRs to r. Lock held. */
static int lrq_post(struct lrq *r, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr)
{
    for (; wr; wr = wr->next) {
        struct rwqe *e;
        if (r->n + 1 >= r->cap || wr->num_sge < 0 || (uint32_t)wr->num_sge > r->max_sge ||
            (wr->num_sge && !wr->sg_list)) {
            *bad_wr = wr;
            return r->n + 1 >= r->cap ? ENOMEM : EINVAL;
        }
        e = (struct rwqe *)(uintptr_t)(r->ring + (uint64_t)((r->head + r->n) % r->cap) * r->stride);
        e->wr_id = wr->wr_id;
        e->num_sge = (uint32_t)wr->num_sge;
        if (wr->num_sge)
            memcpy(e->sge, wr->sg_list, (size_t)wr->num_sge * sizeof(struct ibv_sge));
        r->n++;
    }
    return 0;
}

/* ---- SRQs ---- */
API struct ibv_srq *ibv_create_srq(struct ibv_pd *pd, struct ibv_srq_init_attr *attr)
{
    struct lsrq *s;

    if (!attr || attr->attr.max_wr == 0 || attr->attr.max_wr > MAX_QP_WR || attr->attr.max_sge > MAX_SGE) {
        errno = EINVAL;
        return NULL;
    }
    if (attr->attr.srq_limit) { /* the limit event is not modelled: refused, not ignored */
        errno = EOPNOTSUPP;
        return NULL;
    }
    s = calloc(1, sizeof(*s));
    if (!s || lrq_init(&s->rq, attr->attr.max_wr, attr->attr.max_sge) != 0) {
        free(s);
        errno = ENOMEM;
        return NULL;
    }
    s->pd = (struct lpd *)pd;
    s->srq.context = pd->context;
    s->srq.srq_context = attr->srq_context;
    s->srq.pd = pd;
    pthread_mutex_init(&s->srq.mutex, NULL);
    pthread_cond_init(&s->srq.cond, NULL);
    lock();
    s->pd->nqp++; /* a PD with an SRQ is busy */
    unlock();
    attr->attr.max_sge = s->rq.max_sge;
    return &s->srq;
}

API int ibv_destroy_srq(struct ibv_srq *srq)
{
    struct lsrq *s = (struct lsrq *)srq;

    lock();
    if (s->nqp > 0) {
        unlock();
        return EBUSY;
    }
    s->pd->nqp--;
    unlock();
    pthread_mutex_destroy(&srq->mutex);
    pthread_cond_destroy(&srq->cond);
    free((void *)(uintptr_t)s->rq.ring);
    free(s);
    return 0;
}

API int ibv_modify_srq(struct ibv_srq *srq, struct ibv_srq_attr *attr, int mask)
{
    (void)srq;
    if (mask & IBV_SRQ_MAX_WR) /* resizing is not modelled (not every NIC has it either) */
        return EOPNOTSUPP;
    if (mask & IBV_SRQ_LIMIT)
        return attr->srq_limit ? EOPNOTSUPP : 0;
    return mask ? EINVAL : 0;
}

API int ibv_query_srq(struct ibv_srq *srq, struct ibv_srq_attr *attr)
{
    struct lsrq *s = (struct lsrq *)srq;

    attr->max_wr = s->rq.cap - 1;
    attr->max_sge = s->rq.max_sge;
    attr->srq_limit = 0;
    return 0;
}

static int lq_post_srq_recv(struct ibv_srq *srq, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr)
{
    int rc;

    lock();
    rc = lrq_post(&((struct lsrq *)srq)->rq, wr, bad_wr);
    unlock();
    return rc;
}

/* ---- QPs ---- */
API struct ibv_qp *ibv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *attr)
{
    struct lpd *p = (struct lpd *)pd;
    struct lsrq *srq = (struct lsrq *)attr->srq;
    struct lqp *q;
    struct sh_qp *s = NULL;
    uint32_t slot = 0;

    if (attr->qp_type != IBV_QPT_RC) {
        errno = EOPNOTSUPP;
        return NULL;
    }
    if (!attr->send_cq || !attr->recv_cq || attr->cap.max_send_wr > MAX_QP_WR ||
        (!srq && attr->cap.max_recv_wr > MAX_QP_WR) || attr->cap.max_send_sge > MAX_SGE ||
        (!srq && attr->cap.max_recv_sge > MAX_SGE) || attr->cap.max_inline_data > 256 ||
        attr->send_cq->context != pd->context || attr->recv_cq->context != pd->context ||
        (srq && srq->srq.context != pd->context)) {
        errno = EINVAL;
        return NULL;
    }
    q = calloc(1, sizeof(*q));
    if (!q || !(q->pend = calloc((size_t)attr->cap.max_send_wr + 1, sizeof(*q->pend))) ||
        (!srq && lrq_init(&q->own, attr->cap.max_recv_wr, attr->cap.max_recv_sge) != 0)) {
        if (q)
            free(q->pend);
        free(q);
        errno = ENOMEM;
        return NULL;
    }
    lock();
    for (uint32_t n = 0; n < NQP - 2; n++) {
        uint32_t k = 2 + (g_tab->qp_hint + n) % (NQP - 2);
        if (!g_tab->qp[k].in_use) {
            slot = k;
            s = &g_tab->qp[k];
            break;
        }
    }
    if (!s) {
        unlock();
        free((void *)(uintptr_t)q->own.ring);
        free(q->pend);
        free(q);
        errno = ENOMEM;
        return NULL;
    }
    g_tab->qp_hint = slot - 1;
    {
        uint32_t gen = ((s->qp_num >> 12) + 1) & 0xfff;
        if (!gen)
            gen = 1;
        s->qp_num = (gen << 12) | slot;
    }
    q->srq = srq;
    q->rq = srq ? &srq->rq : &q->own;
    q->scq = (struct lcq *)attr->send_cq;
    q->rcq = (struct lcq *)attr->recv_cq;
    s->in_use = 1;
    s->pid = getpid();
    s->dev = p->dev;
    s->pd_id = p->id;
    s->state = IBV_QPS_RESET;
    s->dest_qp = 0;
    s->access = 0;
    s->rnr_timer = 0;
    s->rq = (uintptr_t)q->rq;
    s->rcq = (uintptr_t)q->rcq;
    p->nqp++;
    if (srq)
        srq->nqp++;
    q->scq->nqp++;
    q->rcq->nqp++;
    g_qp_local[slot] = q;
    q->slot = slot;
    q->pd = p;
    q->dev = p->dev;
    q->sig_all = attr->sq_sig_all;
    q->cap = attr->cap;
    if (q->cap.max_send_sge == 0)
        q->cap.max_send_sge = 1;
    if (srq)
        q->cap.max_recv_wr = q->cap.max_recv_sge = 0;
    else
        q->cap.max_recv_sge = q->own.max_sge;
    attr->cap = q->cap;
    q->qp.context = pd->context;
    q->qp.qp_context = attr->qp_context;
    q->qp.pd = pd;
    q->qp.send_cq = attr->send_cq;
    q->qp.recv_cq = attr->recv_cq;
    q->qp.srq = attr->srq;
    q->qp.handle = slot;
    q->qp.qp_num = s->qp_num;
    q->qp.state = IBV_QPS_RESET;
    q->qp.qp_type = IBV_QPT_RC;
    pthread_mutex_init(&q->qp.mutex, NULL);
    pthread_cond_init(&q->qp.cond, NULL);
    unlock();
    return &q->qp;
}

API int ibv_destroy_qp(struct ibv_qp *qp)
{
    struct lqp *q = (struct lqp *)qp;

    lock();
    g_tab->qp[q->slot].in_use = 0;
    g_qp_local[q->slot] = NULL;
    if (q->pn)
        atomic_fetch_sub(&g_npend, 1);
    q->pn = 0;
    q->pd->nqp--;
    if (q->srq)
        q->srq->nqp--;
    q->scq->nqp--;
    q->rcq->nqp--;
    unlock();
    pthread_mutex_destroy(&qp->mutex);
    pthread_cond_destroy(&qp->cond);
    free((void *)(uintptr_t)q->own.ring);
    free(q->pend);
    free(q);
    return 0;
}

/* The QP's state: a peer's WR may have moved it to the error state (the table is the truth). */
static enum ibv_qp_state qp_state(struct lqp *q)
{
    q->qp.state = (enum ibv_qp_state)g_tab->qp[q->slot].state;
    return q->qp.state;
}

static void set_state(struct lqp *q, enum ibv_qp_state s)
{
    q->qp.state = s;
    g_tab->qp[q->slot].state = (uint32_t)s;
}

/* A QP entering the error state flushes its posted receives (not an SRQ's). Lock held. */
static void flush_recvs(struct lqp *q)
{
    struct lrq *r = &q->own;

    if (q->srq)
        return;
    while (r->n > 0) {
        const struct rwqe *e = (const struct rwqe *)(uintptr_t)(r->ring + (uint64_t)r->head * r->stride);
        struct ibv_wc wc;
        memset(&wc, 0, sizeof(wc));
        wc.wr_id = e->wr_id;
        wc.status = IBV_WC_WR_FLUSH_ERR;
        wc.opcode = IBV_WC_RECV;
        wc.qp_num = q->qp.qp_num;
        wc.vendor_err = 0x4c;
        cq_push(q->rcq, &wc, 0, 0);
        r->head = (r->head + 1) % r->cap;
        r->n--;
    }
}

/* Called with lock held. The transitions and required attributes of an RC QP (IB spec, kernel's
 * ib_modify_qp_is_ok); optional attributes are not policed. */
static int modify_locked(struct lqp *q, struct ibv_qp_attr *a, int mask)
{
    int cur = (int)qp_state(q);
    int nxt = (mask & IBV_QP_STATE) ? (int)a->qp_state : cur;
    int req = 0;

    if (nxt == IBV_QPS_RESET || nxt == IBV_QPS_ERR)
        req = 0;
    else if (cur == IBV_QPS_RESET && nxt == IBV_QPS_INIT)
        req = IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
    else if (cur == IBV_QPS_INIT && nxt == IBV_QPS_INIT)
        req = 0;
    else if (cur == IBV_QPS_INIT && nxt == IBV_QPS_RTR)
        req = IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
              IBV_QP_MIN_RNR_TIMER;
    else if (cur == IBV_QPS_RTR && nxt == IBV_QPS_RTS)
        req = IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_TIMEOUT;
    else if (cur == IBV_QPS_RTS && nxt == IBV_QPS_RTS)
        req = 0;
    else
        return EINVAL;
    if ((mask & req) != req)
        return EINVAL;
    if ((mask & IBV_QP_PORT) && a->port_num != 1)
        return EINVAL;
    if ((mask & IBV_QP_PKEY_INDEX) && a->pkey_index != 0)
        return EINVAL;
    if (nxt == IBV_QPS_RTR && cur == IBV_QPS_INIT) {
        if (g_eth && !a->ah_attr.is_global) /* RoCE needs a GRH */
            return EINVAL;
        if (a->dest_qp_num == 0 || a->dest_qp_num > 0xffffff || a->max_dest_rd_atomic > 16)
            return EINVAL;
        if (a->min_rnr_timer > 31)
            return EINVAL;
    }
    if ((mask & IBV_QP_MAX_QP_RD_ATOMIC) && a->max_rd_atomic > 16)
        return EINVAL;
    if ((mask & IBV_QP_RNR_RETRY) && a->rnr_retry > 7)
        return EINVAL;
    if (mask & IBV_QP_PORT)
        q->port = a->port_num;
    if (mask & IBV_QP_ACCESS_FLAGS) {
        q->access = a->qp_access_flags;
        g_tab->qp[q->slot].access = a->qp_access_flags;
    }
    if (mask & IBV_QP_DEST_QPN)
        g_tab->qp[q->slot].dest_qp = a->dest_qp_num;
    if (mask & IBV_QP_MIN_RNR_TIMER)
        g_tab->qp[q->slot].rnr_timer = a->min_rnr_timer;
    if (mask & IBV_QP_RNR_RETRY)
        q->rnr_retry = a->rnr_retry;
    if (nxt == IBV_QPS_RESET) {
        g_tab->qp[q->slot].dest_qp = 0;
        if (!q->srq)
            q->own.head = q->own.n = 0;
        if (q->pn)
            atomic_fetch_sub(&g_npend, 1);
        q->pn = 0;
        q->outstanding = q->unsignaled = 0;
    }
    set_state(q, (enum ibv_qp_state)nxt);
    if (nxt == IBV_QPS_ERR)
        flush_recvs(q);
    return 0;
}

API int ibv_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int attr_mask)
{
    int rc;

    lock();
    rc = modify_locked((struct lqp *)qp, attr, attr_mask);
    unlock();
    return rc;
}

API int ibv_query_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int attr_mask, struct ibv_qp_init_attr *init)
{
    struct lqp *q = (struct lqp *)qp;

    (void)attr_mask;
    memset(attr, 0, sizeof(*attr));
    memset(init, 0, sizeof(*init));
    lock();
    attr->qp_state = attr->cur_qp_state = qp_state(q);
    attr->dest_qp_num = g_tab->qp[q->slot].dest_qp;
    attr->qp_access_flags = q->access;
    attr->port_num = q->port;
    attr->path_mtu = IBV_MTU_4096;
    attr->min_rnr_timer = (uint8_t)g_tab->qp[q->slot].rnr_timer;
    attr->rnr_retry = q->rnr_retry;
    attr->cap = q->cap;
    unlock();
    init->qp_context = qp->qp_context;
    init->send_cq = qp->send_cq;
    init->recv_cq = qp->recv_cq;
    init->srq = qp->srq;
    init->cap = q->cap;
    init->qp_type = qp->qp_type;
    init->sq_sig_all = q->sig_all;
    return 0;
}

API int ibv_query_qp_data_in_order(struct ibv_qp *qp, enum ibv_wr_opcode op, uint32_t flags)
{
    (void)qp; (void)op; (void)flags;
    return 0;
}

/* The extended QP (ibv_wr_* post API) is not modelled: QPs come from ibv_create_qp. */
API struct ibv_qp_ex *ibv_qp_to_qp_ex(struct ibv_qp *qp)
{
    (void)qp;
    return NULL;
}

static int lq_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr)
{
    struct lqp *q = (struct lqp *)qp;
    int rc;

    lock();
    if (q->srq || qp_state(q) == IBV_QPS_RESET) { /* a QP on an SRQ has no receive queue of its own */
        rc = EINVAL;
        *bad_wr = wr;
    } else if (qp_state(q) == IBV_QPS_ERR) { /* accepted and flushed at once, as hardware does */
        rc = lrq_post(&q->own, wr, bad_wr);
        flush_recvs(q);
    } else {
        rc = lrq_post(&q->own, wr, bad_wr);
    }
    unlock();
    return rc;
}

/* ---- executing work requests ---- */
static struct sh_mr *find_mr(uint32_t key, int pid)
{
    struct sh_mr *m = &g_tab->mr[key & (NMR - 1)];

    if (!m->in_use || m->key != key || m->pid != pid)
        return NULL;
    return m;
}

static int in_mr(const struct sh_mr *m, uint64_t iova, uint64_t len)
{
    return iova >= m->iova && iova + len >= iova && iova + len <= m->iova + m->len;
}

/* Read or write n bytes at addr in process pid (this one: memcpy). 0, or -1 with errno. */
static int peer_rw(int pid, int write, void *buf, uint64_t addr, size_t n)
{
    struct iovec l = { buf, n }, r = { (void *)(uintptr_t)addr, n };
    ssize_t done;

    if (pid == getpid()) {
        if (write)
            memcpy((void *)(uintptr_t)addr, buf, n);
        else
            memcpy(buf, (void *)(uintptr_t)addr, n);
        return 0;
    }
    done = write ? process_vm_writev(pid, &l, 1, &r, 1, 0) : process_vm_readv(pid, &l, 1, &r, 1, 0);
    if (done == (ssize_t)n)
        return 0;
    if (done >= 0)
        errno = EFAULT;
    return -1;
}

/* Deliver a receive completion to the CQ at rcq in process pid. Lock held. */
static void deliver(int pid, uint64_t rcq, const struct ibv_wc *wc)
{
    struct inbox in;
    uint64_t at = rcq + offsetof(struct lcq, in);

    if (pid == getpid()) {
        cq_push((struct lcq *)(uintptr_t)rcq, wc, 0, 0);
        return;
    }
    if (peer_rw(pid, 0, &in, at, sizeof(in)) != 0)
        return;
    if (in.n == in.cap) {
        in.over = 1;
    } else {
        uint64_t e = in.ring + (uint64_t)((in.head + in.n) % in.cap) * sizeof(*wc);
        if (peer_rw(pid, 1, (void *)wc, e, sizeof(*wc)) != 0)
            return;
        in.n++;
    }
    peer_rw(pid, 1, &in, at, sizeof(in));
}

struct seg { uint64_t addr; uint64_t len; int gpu; };

/* Copy between local segments (this process) and remote segments (process pid): the total of
 * both lists is the same. GPU memory only within one process. 0, or an errno. */
static int copy_segs(const struct seg *l, int nl, int pid, const struct seg *r, int nr, int write)
{
    struct iovec liov[MAX_SGE], riov[MAX_SGE];
    int gpu = 0, n = 0, m = 0;
    uint64_t total = 0;
    ssize_t done;

    for (int i = 0; i < nl; i++)
        gpu |= l[i].gpu;
    for (int i = 0; i < nr; i++)
        gpu |= r[i].gpu;
    if (gpu) {
        int i = 0, j = 0;
        uint64_t li = 0, rj = 0;
        if (pid != getpid())
            return EREMOTEIO;
        while (i < nl && j < nr) {
            uint64_t k = l[i].len - li < r[j].len - rj ? l[i].len - li : r[j].len - rj;
            uint64_t la = l[i].addr + li, ra = r[j].addr + rj;
            if (k && gpu_copy(write ? ra : la, write ? la : ra, k, l[i].gpu ? la : ra) != 0)
                return EFAULT;
            li += k;
            rj += k;
            if (li == l[i].len) { i++; li = 0; }
            if (j < nr && rj == r[j].len) { j++; rj = 0; }
        }
        return 0;
    }
    for (int i = 0; i < nl; i++)
        if (l[i].len) {
            liov[n].iov_base = (void *)(uintptr_t)l[i].addr;
            liov[n++].iov_len = l[i].len;
            total += l[i].len;
        }
    for (int i = 0; i < nr; i++)
        if (r[i].len) {
            riov[m].iov_base = (void *)(uintptr_t)r[i].addr;
            riov[m++].iov_len = r[i].len;
        }
    if (total == 0)
        return 0;
    done = write ? process_vm_writev(pid, liov, (unsigned long)n, riov, (unsigned long)m, 0)
                 : process_vm_readv(pid, liov, (unsigned long)n, riov, (unsigned long)m, 0);
    if (done == (ssize_t)total)
        return 0;
    return done < 0 ? errno : EFAULT;
}

enum { ST_RNR = -1 }; /* internal: the responder has no receive posted */

static int is_atomic(enum ibv_wr_opcode op)
{
    return op == IBV_WR_ATOMIC_CMP_AND_SWP || op == IBV_WR_ATOMIC_FETCH_AND_ADD;
}

/* Check a responder's receive WQE against its MRs and turn it into segments; the status the
 * responder's completion gets. Lock held. */
static enum ibv_wc_status recv_segs(const struct rwqe *e, const struct sh_qp *rq, uint64_t total,
                                    struct seg *r, int *nr, struct loopnic_counters *cnt)
{
    uint64_t room = 0, left = total;

    *nr = 0;
    for (uint32_t i = 0; i < e->num_sge && left > 0; i++) {
        const struct ibv_sge *sg = &e->sge[i];
        uint64_t take = sg->length < left ? sg->length : left;
        struct sh_mr *m;
        room += sg->length;
        if (!take)
            continue;
        m = find_mr(sg->lkey, rq->pid);
        if (!m || m->pd_id != rq->pd_id || !in_mr(m, sg->addr, sg->length) || !(m->access & IBV_ACCESS_LOCAL_WRITE))
            return IBV_WC_LOC_PROT_ERR;
        r[*nr].addr = m->addr + (sg->addr - m->iova);
        r[*nr].len = take;
        r[*nr].gpu = !!(m->flags & F_GPU);
        if (mr_stale(m, r[*nr].addr, take) || (!r[*nr].gpu && rq->pid == getpid() && !host_mapped(r[*nr].addr, take))) {
            cnt->stale_uses++;
            return IBV_WC_LOC_PROT_ERR;
        }
        left -= take;
        (*nr)++;
    }
    (void)room;
    return left ? IBV_WC_LOC_LEN_ERR : IBV_WC_SUCCESS;
}

/* Execute one send WR on RTS QP q: RDMA WRITE (with immediate), READ, SEND (with immediate),
 * atomics. Returns a completion status, or ST_RNR (nothing done) when the WR needs a receive at the
 * responder and none is posted. Lock held. */
static int exec_wr(struct lqp *q, const struct ibv_send_wr *wr, uint32_t *byte_len)
{
    struct loopnic_counters *cnt = &g_cnt[q->dev];
    enum ibv_wr_opcode op = wr->opcode;
    int self = getpid(), atomic = is_atomic(op), nr = 0;
    int needs_recv = op == IBV_WR_SEND || op == IBV_WR_SEND_WITH_IMM || op == IBV_WR_RDMA_WRITE_WITH_IMM;
    int to_remote = op != IBV_WR_RDMA_READ && !atomic; /* data flows requester -> responder */
    struct seg x[MAX_SGE], r[MAX_SGE];
    struct sh_qp *rq;
    struct lrq hdr;
    uint64_t total = 0, wqe_at = 0;
    union { struct rwqe e; char b[sizeof(struct rwqe) + MAX_SGE * sizeof(struct ibv_sge)]; } wqe;

    *byte_len = 0;
    for (int i = 0; i < wr->num_sge; i++) {
        const struct ibv_sge *sg = &wr->sg_list[i];
        struct sh_mr *m;
        total += sg->length;
        x[i].len = sg->length;
        x[i].gpu = 0;
        x[i].addr = sg->addr;
        if (sg->length == 0)
            continue;
        if (to_remote && (wr->send_flags & IBV_SEND_INLINE))
            continue; /* inline data is copied from the address, no lkey */
        m = find_mr(sg->lkey, self);
        if (!m || m->pd_id != q->pd->id || !in_mr(m, sg->addr, sg->length) ||
            (!to_remote && !(m->access & IBV_ACCESS_LOCAL_WRITE)))
            return IBV_WC_LOC_PROT_ERR;
        x[i].addr = m->addr + (sg->addr - m->iova);
        x[i].gpu = !!(m->flags & F_GPU);
        if (mr_stale(m, x[i].addr, sg->length)) {
            cnt->stale_uses++;
            return IBV_WC_LOC_PROT_ERR;
        }
        if (!x[i].gpu && !host_mapped(x[i].addr, sg->length)) { /* freed behind our back */
            cnt->stale_uses++;
            return IBV_WC_LOC_PROT_ERR;
        }
    }
    if (total > (1ull << 31) || (atomic && total != 8))
        return IBV_WC_LOC_LEN_ERR;
    rq = &g_tab->qp[g_tab->qp[q->slot].dest_qp & (NQP - 1)];
    if (!rq->in_use || rq->qp_num != g_tab->qp[q->slot].dest_qp || !pid_alive(rq->pid) ||
        (rq->state != IBV_QPS_RTR && rq->state != IBV_QPS_RTS) || rq->dest_qp != q->qp.qp_num)
        return IBV_WC_RETRY_EXC_ERR; /* nobody answers: transport retries exhausted */
    if (needs_recv) { /* the responder's receive queue: RNR NAK when empty */
        if (peer_rw(rq->pid, 0, &hdr, rq->rq, sizeof(hdr)) != 0)
            return IBV_WC_RETRY_EXC_ERR;
        if (hdr.n == 0) {
            cnt->rnr_naks++;
            return ST_RNR;
        }
        wqe_at = hdr.ring + (uint64_t)hdr.head * hdr.stride;
        if (hdr.stride > sizeof(wqe) || peer_rw(rq->pid, 0, &wqe, wqe_at, hdr.stride) != 0)
            return IBV_WC_RETRY_EXC_ERR;
    }
    if (op == IBV_WR_SEND || op == IBV_WR_SEND_WITH_IMM) {
        enum ibv_wc_status rst = recv_segs(&wqe.e, rq, total, r, &nr, cnt);
        if (rst != IBV_WC_SUCCESS) { /* the responder's WQE fails: both sides see it */
            struct ibv_wc rwc;
            memset(&rwc, 0, sizeof(rwc));
            rwc.wr_id = wqe.e.wr_id;
            rwc.status = rst;
            rwc.opcode = IBV_WC_RECV;
            rwc.qp_num = rq->qp_num;
            rwc.vendor_err = 0x4c;
            hdr.head = (hdr.head + 1) % hdr.cap;
            hdr.n--;
            peer_rw(rq->pid, 1, &hdr, rq->rq, sizeof(hdr));
            deliver(rq->pid, rq->rcq, &rwc);
            rq->state = IBV_QPS_ERR;
            if (rst == IBV_WC_LOC_PROT_ERR)
                cnt->prot_errors++;
            return rst == IBV_WC_LOC_LEN_ERR ? IBV_WC_REM_INV_REQ_ERR : IBV_WC_REM_OP_ERR;
        }
    } else if (total > 0 || atomic) {
        uint32_t need = atomic ? IBV_ACCESS_REMOTE_ATOMIC : to_remote ? IBV_ACCESS_REMOTE_WRITE : IBV_ACCESS_REMOTE_READ;
        struct sh_mr *rm = find_mr(atomic ? wr->wr.atomic.rkey : wr->wr.rdma.rkey, rq->pid);
        uint64_t raddr = atomic ? wr->wr.atomic.remote_addr : wr->wr.rdma.remote_addr;
        if (atomic && (raddr & 7))
            return IBV_WC_REM_INV_REQ_ERR; /* misaligned: the responder NAKs the request */
        if (!rm || rm->pd_id != rq->pd_id || !in_mr(rm, raddr, total) || !(rm->access & need) || !(rq->access & need))
            return IBV_WC_REM_ACCESS_ERR;
        r[0].addr = rm->addr + (raddr - rm->iova);
        r[0].len = total;
        r[0].gpu = !!(rm->flags & F_GPU);
        nr = 1;
        if (mr_stale(rm, r[0].addr, total) || (!r[0].gpu && rq->pid == self && !host_mapped(r[0].addr, total))) {
            cnt->stale_uses++;
            return IBV_WC_REM_ACCESS_ERR;
        }
    }
    if (atomic) { /* serialised with every other atomic of the model by the table's lock */
        uint64_t old, val;
        if (r[0].gpu || x[0].gpu)
            return IBV_WC_REM_OP_ERR;
        if (peer_rw(rq->pid, 0, &old, r[0].addr, 8) != 0) {
            cnt->stale_uses++;
            return IBV_WC_REM_ACCESS_ERR;
        }
        if (op == IBV_WR_ATOMIC_FETCH_AND_ADD)
            val = old + wr->wr.atomic.compare_add;
        else
            val = old == wr->wr.atomic.compare_add ? wr->wr.atomic.swap : old;
        if (val != old && peer_rw(rq->pid, 1, &val, r[0].addr, 8) != 0)
            return IBV_WC_REM_ACCESS_ERR;
        memcpy((void *)(uintptr_t)x[0].addr, &old, 8);
        cnt->atomics++;
    } else if (total > 0) {
        int err;
        if ((x[0].gpu || (nr && r[0].gpu)) && rq->pid != self)
            return IBV_WC_REM_OP_ERR; /* GPU memory across processes: not supported */
        err = copy_segs(x, wr->num_sge, rq->pid, r, nr, to_remote);
        if (err == ESRCH)
            return IBV_WC_RETRY_EXC_ERR;
        if (err == EPERM) {
            fprintf(stderr, "loopnic: process_vm_%sv to pid %d: %s\n", to_remote ? "write" : "read",
                    rq->pid, strerror(err));
            return IBV_WC_GENERAL_ERR;
        }
        if (err) {
            cnt->stale_uses++; /* the remote memory is not mapped any more */
            return to_remote ? IBV_WC_REM_ACCESS_ERR : IBV_WC_LOC_PROT_ERR;
        }
    }
    cnt->bytes_moved += atomic ? 8 : total;
    *byte_len = (uint32_t)(atomic ? 8 : total);
    if (needs_recv) {
        struct ibv_wc rwc;
        memset(&rwc, 0, sizeof(rwc));
        rwc.wr_id = wqe.e.wr_id;
        rwc.status = IBV_WC_SUCCESS;
        rwc.opcode = op == IBV_WR_RDMA_WRITE_WITH_IMM ? IBV_WC_RECV_RDMA_WITH_IMM : IBV_WC_RECV;
        rwc.byte_len = (uint32_t)total;
        if (op != IBV_WR_SEND) {
            rwc.imm_data = wr->imm_data;
            rwc.wc_flags = IBV_WC_WITH_IMM;
        }
        rwc.qp_num = rq->qp_num;
        rwc.src_qp = q->qp.qp_num;
        rwc.slid = g_eth ? 0 : (uint16_t)(q->dev + 1);
        hdr.head = (hdr.head + 1) % hdr.cap;
        hdr.n--;
        peer_rw(rq->pid, 1, &hdr, rq->rq, sizeof(hdr));
        deliver(rq->pid, rq->rcq, &rwc);
        cnt->recvs++;
    }
    return IBV_WC_SUCCESS;
}

static enum ibv_wc_opcode wc_opcode(enum ibv_wr_opcode op)
{
    if (op == IBV_WR_RDMA_READ)
        return IBV_WC_RDMA_READ;
    if (op == IBV_WR_SEND || op == IBV_WR_SEND_WITH_IMM)
        return IBV_WC_SEND;
    if (op == IBV_WR_ATOMIC_CMP_AND_SWP)
        return IBV_WC_COMP_SWAP;
    if (op == IBV_WR_ATOMIC_FETCH_AND_ADD)
        return IBV_WC_FETCH_ADD;
    return IBV_WC_RDMA_WRITE;
}

/* A send WR done (st): the completion if signalled or failed; an error moves the QP to the error
 * state. Lock held. */
static void complete(struct lqp *q, const struct ibv_send_wr *wr, enum ibv_wc_status st, uint32_t byte_len)
{
    struct loopnic_counters *cnt = &g_cnt[q->dev];
    struct ibv_wc wc;

    cnt->wrs++;
    q->unsignaled++;
    if (st != IBV_WC_SUCCESS) {
        cnt->wr_errors++;
        if (st == IBV_WC_LOC_PROT_ERR || st == IBV_WC_REM_ACCESS_ERR)
            cnt->prot_errors++;
        if (qp_state(q) != IBV_QPS_ERR) {
            set_state(q, IBV_QPS_ERR);
            flush_recvs(q);
        }
    }
    if (st != IBV_WC_SUCCESS || q->sig_all || (wr->send_flags & IBV_SEND_SIGNALED)) {
        memset(&wc, 0, sizeof(wc));
        wc.wr_id = wr->wr_id;
        wc.status = st;
        wc.opcode = wc_opcode(wr->opcode);
        wc.byte_len = byte_len;
        wc.qp_num = q->qp.qp_num;
        wc.vendor_err = st == IBV_WC_SUCCESS ? 0 : 0x4c;
        cq_push(q->scq, &wc, q->slot, q->unsignaled);
        q->unsignaled = 0;
    }
}

static uint64_t now_ns(void)
{
    struct timespec t;

    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

/* The RNR NAK timer of the IB spec (min_rnr_timer's encoding), in microseconds. */
static uint64_t rnr_timer_us(uint32_t t)
{
    static const uint32_t tenth_ms[32] = { 6554, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 5, 6, 10, 13, 19, 26, 38,
                                           51, 77, 102, 154, 205, 307, 410, 614, 819, 1229, 1638, 2458,
                                           3277, 4915 };
    return (uint64_t)tenth_ms[t & 31] * 100;
}

/* Retry q's waiting WRs in order; stop at one that still finds no receive. Lock held. */
static void progress_qp(struct lqp *q)
{
    unsigned cap = q->cap.max_send_wr + 1;

    while (q->pn > 0) {
        struct pend *p = &q->pend[q->ph];
        uint32_t byte_len = 0;
        int st = qp_state(q) == IBV_QPS_ERR ? IBV_WC_WR_FLUSH_ERR : exec_wr(q, &p->wr, &byte_len);
        if (st == ST_RNR) {
            const struct sh_qp *rq = &g_tab->qp[g_tab->qp[q->slot].dest_qp & (NQP - 1)];
            if (q->rnr_retry == 7 || now_ns() - p->since_ns < q->rnr_retry * rnr_timer_us(rq->rnr_timer) * 1000)
                return;
            st = IBV_WC_RNR_RETRY_EXC_ERR;
        }
        complete(q, &p->wr, (enum ibv_wc_status)st, byte_len);
        q->ph = (q->ph + 1) % cap;
        if (--q->pn == 0)
            atomic_fetch_sub(&g_npend, 1);
    }
}

static void progress_all(void)
{
    lock();
    for (size_t i = 0; i < NQP && atomic_load(&g_npend); i++)
        if (g_qp_local[i] && g_qp_local[i]->pn)
            progress_qp(g_qp_local[i]);
    unlock();
}

/* The progress thread: retries waiting WRs and moves peers' completions into armed CQs, so that a
 * program asleep in ibv_get_cq_event wakes. Started on the first need; one per process. */
static pid_t g_prog_pid;

static void *progress_main(void *arg)
{
    (void)arg;
    for (;;) {
        struct timespec ts = { 0, 1000000 };
        nanosleep(&ts, NULL);
        if (atomic_load(&g_npend))
            progress_all();
        lock();
        for (struct lcq *c = g_cqs; c; c = c->next)
            if (c->in.n || c->in.over)
                drain_inbox(c);
        unlock();
    }
    return NULL;
}

static void progress_start(void)
{
    pthread_t t;
    pthread_attr_t a;
    pid_t self = getpid();

    if (__atomic_exchange_n(&g_prog_pid, self, __ATOMIC_ACQ_REL) == self)
        return;
    pthread_attr_init(&a);
    pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
    if (pthread_create(&t, &a, progress_main, NULL) != 0)
        g_prog_pid = 0;
    pthread_attr_destroy(&a);
}

static int lq_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad_wr)
{
    struct lqp *q = (struct lqp *)qp;
    int rc = 0, queued = 0;

    lock();
    if (q->pn)
        progress_qp(q);
    for (; wr; wr = wr->next) {
        enum ibv_qp_state state = qp_state(q);
        enum ibv_wr_opcode op = wr->opcode;
        uint32_t byte_len = 0;
        uint64_t len = 0;
        int st;

        if (state != IBV_QPS_RTS && state != IBV_QPS_ERR) {
            rc = EINVAL;
            break;
        }
        if (op != IBV_WR_RDMA_WRITE && op != IBV_WR_RDMA_WRITE_WITH_IMM && op != IBV_WR_RDMA_READ &&
            op != IBV_WR_SEND && op != IBV_WR_SEND_WITH_IMM && !is_atomic(op)) {
            rc = EOPNOTSUPP; /* SEND_WITH_INV, LOCAL_INV, BIND_MW, TSO, DRIVER1: not modelled */
            break;
        }
        if (wr->num_sge < 0 || wr->num_sge > (int)q->cap.max_send_sge || (wr->num_sge && !wr->sg_list) ||
            (is_atomic(op) && wr->num_sge != 1)) {
            rc = EINVAL;
            break;
        }
        if (q->outstanding >= q->cap.max_send_wr) { /* the send queue is full */
            rc = ENOMEM;
            break;
        }
        for (int i = 0; i < wr->num_sge; i++)
            len += wr->sg_list[i].length;
        if ((wr->send_flags & IBV_SEND_INLINE) &&
            (op == IBV_WR_RDMA_READ || is_atomic(op) || len > q->cap.max_inline_data)) {
            rc = EINVAL;
            break;
        }
        q->outstanding++;
        if (state == IBV_QPS_ERR) {
            st = IBV_WC_WR_FLUSH_ERR;
        } else if (q->pn) {
            st = ST_RNR; /* behind a waiting WR: in order */
        } else {
            g_wr_calls++;
            if (g_fail_wr_at && g_wr_calls == g_fail_wr_at)
                st = g_fail_wr_status;
            else
                st = exec_wr(q, wr, &byte_len);
            if (st == ST_RNR && q->rnr_retry == 0)
                st = IBV_WC_RNR_RETRY_EXC_ERR;
        }
        if (st == ST_RNR) { /* the WR waits, copied as the NIC has fetched it */
            struct pend *p = &q->pend[(q->ph + q->pn) % (q->cap.max_send_wr + 1)];
            p->wr = *wr;
            p->wr.next = NULL;
            p->wr.sg_list = p->sge;
            memcpy(p->sge, wr->sg_list, (size_t)wr->num_sge * sizeof(*p->sge));
            if (wr->send_flags & IBV_SEND_INLINE) {
                uint64_t off = 0;
                for (int i = 0; i < wr->num_sge; off += p->sge[i].length, i++) {
                    memcpy(p->inl + off, (void *)(uintptr_t)p->sge[i].addr, p->sge[i].length);
                    p->sge[i].addr = (uintptr_t)(p->inl + off);
                }
            }
            p->since_ns = now_ns();
            if (q->pn++ == 0)
                atomic_fetch_add(&g_npend, 1);
            queued = 1;
            continue;
        }
        complete(q, wr, (enum ibv_wc_status)st, byte_len);
    }
    if (rc)
        *bad_wr = wr;
    unlock();
    if (queued)
        progress_start();
    return rc;
}

/* ---- address handles: only UD QPs use them, and the model has RC QPs only ---- */
API struct ibv_ah *ibv_create_ah(struct ibv_pd *pd, struct ibv_ah_attr *attr)
{
    (void)pd; (void)attr;
    errno = EOPNOTSUPP;
    return NULL;
}

API int ibv_destroy_ah(struct ibv_ah *ah)
{
    (void)ah;
    return EOPNOTSUPP;
}

API int ibv_init_ah_from_wc(struct ibv_context *context, uint8_t port_num, struct ibv_wc *wc,
                            struct ibv_grh *grh, struct ibv_ah_attr *ah_attr)
{
    (void)context; (void)port_num; (void)wc; (void)grh; (void)ah_attr;
    return EOPNOTSUPP;
}

API struct ibv_ah *ibv_create_ah_from_wc(struct ibv_pd *pd, struct ibv_wc *wc, struct ibv_grh *grh,
                                         uint8_t port_num)
{
    (void)pd; (void)wc; (void)grh; (void)port_num;
    errno = EOPNOTSUPP;
    return NULL;
}

/* ---- strings and rates ---- */
API const char *ibv_wc_status_str(enum ibv_wc_status status)
{
    static const char *const s[] = {
        "success", "local length error", "local QP operation error", "local EE context operation error",
        "local protection error", "Work Request Flushed Error", "memory management operation error",
        "bad response error", "local access error", "remote invalid request error", "remote access error",
        "remote operation error", "transport retry counter exceeded", "RNR retry counter exceeded",
        "local RDD violation error", "remote invalid RD request", "aborted error", "invalid EE context number",
        "invalid EE context state", "fatal error", "response timeout error", "general error",
        "TM error", "TM rendezvous incomplete",
    };
    unsigned i = (unsigned)status;
    return i < sizeof(s) / sizeof(s[0]) ? s[i] : "unknown";
}

API const char *ibv_port_state_str(enum ibv_port_state state)
{
    static const char *const s[] = { "PORT_NOP", "PORT_DOWN", "PORT_INIT", "PORT_ARMED", "PORT_ACTIVE",
                                     "PORT_ACTIVE_DEFER" };
    unsigned i = (unsigned)state;
    return i < sizeof(s) / sizeof(s[0]) ? s[i] : "unknown";
}

API const char *ibv_node_type_str(enum ibv_node_type t)
{
    return (int)t == IBV_NODE_CA ? "InfiniBand channel adapter" : "unknown";
}

API const char *ibv_event_type_str(enum ibv_event_type e)
{
    static const char *const s[] = {
        "CQ error", "local work queue catastrophic error", "invalid request local work queue error",
        "local access violation work queue error", "communication established", "send queue drained",
        "path migrated", "path migration request error", "local catastrophic error", "port active",
        "port error", "LID change", "P_Key change", "SM change", "SRQ catastrophic error",
        "SRQ limit reached", "last WQE reached", "client reregistration", "GID table change",
        "WQ fatal",
    };
    unsigned i = (unsigned)e;
    return i < sizeof(s) / sizeof(s[0]) ? s[i] : "unknown";
}

static const int rate_mult[] = { 0, 1, 4, 12, 2, 8, 16, 24, 32, 48 }; /* IBV_RATE_MAX .. IBV_RATE_120_GBPS */

API int ibv_rate_to_mult(enum ibv_rate rate)
{
    unsigned i = (unsigned)rate;
    return i < sizeof(rate_mult) / sizeof(rate_mult[0]) ? rate_mult[i] : -1;
}

API enum ibv_rate mult_to_ibv_rate(int mult)
{
    for (unsigned i = 1; i < sizeof(rate_mult) / sizeof(rate_mult[0]); i++)
        if (rate_mult[i] == mult)
            return (enum ibv_rate)i;
    return IBV_RATE_MAX;
}

API int ibv_rate_to_mbps(enum ibv_rate rate)
{
    int m = ibv_rate_to_mult(rate);
    return m > 0 ? m * 2500 : -1;
}

API enum ibv_rate mbps_to_ibv_rate(int mbps)
{
    return mbps % 2500 ? IBV_RATE_MAX : mult_to_ibv_rate(mbps / 2500);
}

/* ---- control API ---- */
API int loopnic_num_devices(void)
{
    init();
    return g_ndev;
}

API int loopnic_get_counters(int dev, struct loopnic_counters *out)
{
    init();
    if (dev < -1 || dev >= g_ndev)
        return -1;
    memset(out, 0, sizeof(*out));
    lock();
    for (int i = 0; i < g_ndev; i++) {
        const struct loopnic_counters *c = &g_cnt[i];
        if (dev != -1 && dev != i)
            continue;
        out->live_mrs += c->live_mrs;
        out->total_regs += c->total_regs;
        out->dmabuf_regs += c->dmabuf_regs;
        out->deregs += c->deregs;
        out->reg_failures += c->reg_failures;
        out->wrs += c->wrs;
        out->wr_errors += c->wr_errors;
        out->prot_errors += c->prot_errors;
        out->stale_uses += c->stale_uses;
        out->bytes_moved += c->bytes_moved;
        out->foreign_deregs += c->foreign_deregs;
        out->dmabuf_held += c->dmabuf_held;
        out->recvs += c->recvs;
        out->atomics += c->atomics;
        out->rnr_naks += c->rnr_naks;
    }
    for (size_t i = 0; i < g_ninodes; i++)
        if (dev == -1 || (g_inodes[i].devmask & (1ull << dev)))
            out->dmabuf_inodes++;
    unlock();
    return 0;
}

API void loopnic_reset_counters(void)
{
    init();
    lock();
    for (int i = 0; i < MAXDEV; i++) {
        uint64_t live = g_cnt[i].live_mrs, held = g_cnt[i].dmabuf_held;
        memset(&g_cnt[i], 0, sizeof(g_cnt[i]));
        g_cnt[i].live_mrs = live;
        g_cnt[i].dmabuf_held = held;
    }
    g_ninodes = 0;
    unlock();
}

API void loopnic_fail_reg(unsigned long n, int err)
{
    init();
    lock();
    g_fail_reg_at = n ? g_reg_calls + n : 0;
    g_fail_reg_err = err ? err : ENOMEM;
    unlock();
}

API void loopnic_fail_dmabuf_reg(unsigned long n, int err)
{
    init();
    lock();
    g_fail_dmabuf_at = n ? g_dmabuf_calls + n : 0;
    g_fail_dmabuf_err = err ? err : ENOMEM;
    unlock();
}

API void loopnic_fail_wr(unsigned long n, int status)
{
    init();
    lock();
    g_fail_wr_at = n ? g_wr_calls + n : 0;
    g_fail_wr_status = status ? status : IBV_WC_RETRY_EXC_ERR;
    unlock();
}

API void loopnic_set_max_mr_size(uint64_t size)
{
    init();
    g_max_mr_size = size;
}

/* ---- the record's API (loopnic_record.h) ---- */
API size_t ibvd_ncalls(void)
{
    size_t n;

    init();
    lock();
    n = g_ncalls;
    unlock();
    return n;
}

API int ibvd_call(size_t i, struct ibvd_call *out)
{
    int ok;

    init();
    lock();
    ok = i < g_ncalls;
    if (ok)
        *out = g_calls[i];
    unlock();
    return ok;
}

API void ibvd_reset(void)
{
    init();
    lock();
    g_ncalls = 0;
    memset(g_opcount, 0, sizeof(g_opcount));
    g_reg_bytes = 0;
    g_fail_next = 0;
    g_probe_errno = EBADF;
    g_dereg_ret = 0;
    g_query_ret = 0;
    g_query_max = 0;
    unlock();
}

API void ibvd_fail_next_reg(int err)
{
    init();
    lock();
    g_fail_next = err;
    unlock();
}

API void ibvd_set_probe_errno(int err)
{
    init();
    lock();
    g_probe_errno = err;
    unlock();
}

API void ibvd_set_dereg_ret(int ret)
{
    init();
    lock();
    g_dereg_ret = ret;
    unlock();
}

API void ibvd_set_query(int ret, unsigned long long max_mr_size)
{
    init();
    lock();
    g_query_ret = ret;
    g_query_max = max_mr_size;
    unlock();
}

API size_t ibvd_live(void)
{
    size_t n = 0;

    init();
    lock();
    for (int i = 0; i < MAXDEV; i++)
        n += g_cnt[i].live_mrs;
    unlock();
    return n;
}

API int ibvd_lkey_live(uint32_t lkey)
{
    int live;

    init();
    lock();
    live = g_mr_local[lkey & (NMR - 1)] && g_mr_local[lkey & (NMR - 1)]->mr.lkey == lkey;
    unlock();
    return live;
}

API void ibvd_probe(const void *addr)
{
    atomic_store(&g_probe_addr, (uintptr_t)addr);
}

API size_t ibvd_count(enum ibvd_op op)
{
    size_t n;

    init();
    lock();
    n = op >= 1 && op < IBVD_NOPS ? g_opcount[op] : 0;
    unlock();
    return n;
}

API unsigned long long ibvd_reg_bytes(void)
{
    unsigned long long n;

    init();
    lock();
    n = g_reg_bytes;
    unlock();
    return n;
}

API int loopnic_add_device_memory(uint64_t start, uint64_t len)
{
    int n = atomic_load(&g_ndevmem);

    if (len == 0) {          /* forget them all */
        atomic_store(&g_ndevmem, 0);
        return 0;
    }
    if (n == MAX_DEVMEM)
        return ENOMEM;
    g_devmem[n].start = start;
    g_devmem[n].len = len;
    atomic_store(&g_ndevmem, n + 1);
    return 0;
}

/* ---- the exit report (LOOPNIC_REPORT): the counters of a program that cannot read them ----
 * LOOPNIC_REPORT=1 writes one line to stderr when the process exits; any other value is a file the
 * line is appended to (one write, O_APPEND: the lines of several processes do not mix). Read without
 * the lock: another thread may hold it at exit, and the numbers are final. */
__attribute__((destructor)) static void loopnic_report(void)
{
    const char *dst = getenv("LOOPNIC_REPORT");
    struct loopnic_counters t;
    char line[1024];
    int n, fd;

    if (!dst || !*dst || !strcmp(dst, "0"))
        return;
    memset(&t, 0, sizeof(t));
    for (int i = 0; i < MAXDEV; i++) {
        const struct loopnic_counters *c = &g_cnt[i];
        t.live_mrs += c->live_mrs;
        t.total_regs += c->total_regs;
        t.deregs += c->deregs;
        t.reg_failures += c->reg_failures;
        t.wrs += c->wrs;
        t.wr_errors += c->wr_errors;
        t.prot_errors += c->prot_errors;
        t.stale_uses += c->stale_uses;
        t.bytes_moved += c->bytes_moved;
        t.recvs += c->recvs;
        t.atomics += c->atomics;
        t.rnr_naks += c->rnr_naks;
    }
    n = snprintf(line, sizeof(line),
                 "loopnic: pid=%d wrs=%llu wr_errors=%llu prot_errors=%llu stale_uses=%llu bytes_moved=%llu "
                 "recvs=%llu atomics=%llu rnr_naks=%llu regs=%llu deregs=%llu live_mrs=%llu reg_failures=%llu\n",
                 (int)getpid(), (unsigned long long)t.wrs, (unsigned long long)t.wr_errors,
                 (unsigned long long)t.prot_errors, (unsigned long long)t.stale_uses,
                 (unsigned long long)t.bytes_moved, (unsigned long long)t.recvs, (unsigned long long)t.atomics,
                 (unsigned long long)t.rnr_naks, (unsigned long long)t.total_regs, (unsigned long long)t.deregs,
                 (unsigned long long)t.live_mrs, (unsigned long long)t.reg_failures);
    if (n <= 0)
        return;
    if (!strcmp(dst, "1")) {
        fd = 2;
    } else {
        fd = open(dst, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
        if (fd < 0)
            return;
    }
    if (write(fd, line, (size_t)n) != n) {
        /* nothing to do at exit */
    }
    if (fd != 2)
        close(fd);
}
