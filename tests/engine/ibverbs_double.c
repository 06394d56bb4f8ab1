/* The recording libibverbs DOUBLE: see ibverbs_double.h. */
#include "loopnic_record.h"

#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>

enum { MAX_CALLS = 1 << 16 };

struct dmr {
    struct ibv_mr mr;       /* first: the MR handed out */
    int kind;               /* IBVD_REG_VA or IBVD_REG_DMABUF */
    uintptr_t start;        /* what it covers in the address space (iova for dmabuf) */
    size_t len;
    struct dmr *next;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct ibvd_call calls[MAX_CALLS];
static size_t ncalls;
static struct dmr *mrs;
static size_t nlive;
static uint32_t next_key = 0x100;
static uintptr_t probe;
static size_t counts[IBVD_NOPS];   /* per op, not capped like the record */
static unsigned long long reg_bytes;
static int fail_reg, probe_errno = EBADF, dereg_ret, query_ret;    /* controls, under lock */
static unsigned long long query_max_mr;


static struct ibv_device device;
static struct ibv_device *device_list[2] = { &device, NULL };

static void record(const struct ibvd_call *c)
{
    counts[c->op]++;
    if (c->op == IBVD_REG_VA || c->op == IBVD_REG_DMABUF)
        reg_bytes += c->len;
    if (ncalls < MAX_CALLS)
        calls[ncalls++] = *c;
}

size_t ibvd_ncalls(void)
{
    size_t n;

    pthread_mutex_lock(&lock);
    n = ncalls;
    pthread_mutex_unlock(&lock);
    return n;
}

int ibvd_call(size_t i, struct ibvd_call *out)
{
    int ok;

    pthread_mutex_lock(&lock);
    ok = i < ncalls;
    if (ok)
        *out = calls[i];
    pthread_mutex_unlock(&lock);
    return ok;
}

void ibvd_reset(void)
{
    pthread_mutex_lock(&lock);
    ncalls = 0;
    memset(counts, 0, sizeof(counts));
    reg_bytes = 0;
    fail_reg = 0;
    probe_errno = EBADF;
    dereg_ret = 0;
    query_ret = 0;
    query_max_mr = 0;
    pthread_mutex_unlock(&lock);
}

void ibvd_fail_next_reg(int err)
{
    pthread_mutex_lock(&lock);
    fail_reg = err;
    pthread_mutex_unlock(&lock);
}

void ibvd_set_probe_errno(int err)
{
    pthread_mutex_lock(&lock);
    probe_errno = err;
    pthread_mutex_unlock(&lock);
}

void ibvd_set_dereg_ret(int ret)
{
    pthread_mutex_lock(&lock);
    dereg_ret = ret;
    pthread_mutex_unlock(&lock);
}

void ibvd_set_query(int ret, unsigned long long max_mr_size)
{
    pthread_mutex_lock(&lock);
    query_ret = ret;
    query_max_mr = max_mr_size;
    pthread_mutex_unlock(&lock);
}

size_t ibvd_live(void)
{
    size_t n;

    pthread_mutex_lock(&lock);
    n = nlive;
    pthread_mutex_unlock(&lock);
    return n;
}

int ibvd_lkey_live(uint32_t lkey)
{
    struct dmr *m;
    int live = 0;

    pthread_mutex_lock(&lock);
    for (m = mrs; m; m = m->next)
        live |= m->mr.lkey == lkey;
    pthread_mutex_unlock(&lock);
    return live;
}

void ibvd_probe(const void *addr)
{
    __atomic_store_n(&probe, (uintptr_t)addr, __ATOMIC_RELAXED);
}

size_t ibvd_count(enum ibvd_op op)
{
    size_t n;

    pthread_mutex_lock(&lock);
    n = op >= 1 && op < IBVD_NOPS ? counts[op] : 0;
    pthread_mutex_unlock(&lock);
    return n;
}

unsigned long long ibvd_reg_bytes(void)
{
    unsigned long long n;

    pthread_mutex_lock(&lock);
    n = reg_bytes;
    pthread_mutex_unlock(&lock);
    return n;
}

struct ibv_device **ibv_get_device_list(int *num)
{
    snprintf(device.name, sizeof(device.name), "drc_double0");
    snprintf(device.dev_name, sizeof(device.dev_name), "uverbs0");
    device.node_type = IBV_NODE_CA;
    device.transport_type = IBV_TRANSPORT_IB;
    if (num)
        *num = 1;
    return device_list;
}

void ibv_free_device_list(struct ibv_device **list)
{
    (void)list;
}

const char *ibv_get_device_name(struct ibv_device *dev)
{
    return dev ? dev->name : NULL;
}

struct ibv_context *ibv_open_device(struct ibv_device *dev)
{
    struct ibv_context *ctx = calloc(1, sizeof(*ctx));

    if (ctx)
        ctx->device = dev;
    return ctx;
}

int ibv_close_device(struct ibv_context *ctx)
{
    free(ctx);
    return 0;
}

int ibv_query_device(struct ibv_context *ctx, struct ibv_device_attr *attr)
{
    const char *max = getenv("IBVD_MAX_MR_SIZE");
    struct ibvd_call c = { .op = IBVD_QUERY, .ctx = ctx, .fd = -1 };
    int ret;

    pthread_mutex_lock(&lock);
    ret = c.ret = query_ret;
    record(&c);
    if (!ret) {
        memset(attr, 0, sizeof(*attr));
        snprintf(attr->fw_ver, sizeof(attr->fw_ver), "double");
        attr->max_mr_size = query_max_mr ? query_max_mr : max ? strtoull(max, NULL, 0) : 1ull << 40;
        attr->max_mr = 1 << 24;
        attr->max_pd = 1 << 16;
    }
    pthread_mutex_unlock(&lock);
    return ret;
}

struct ibv_pd *ibv_alloc_pd(struct ibv_context *ctx)
{
    static uint32_t handles;
    struct ibv_pd *pd = calloc(1, sizeof(*pd));

    if (!pd) {
        errno = ENOMEM;
        return NULL;
    }
    pd->context = ctx;
    pd->handle = __atomic_add_fetch(&handles, 1, __ATOMIC_RELAXED);
    return pd;
}

int ibv_dealloc_pd(struct ibv_pd *pd)
{
    struct ibvd_call c = { .op = IBVD_DEALLOC_PD, .pd = pd, .fd = -1 };
    struct dmr *m;
    int busy = 0;

    pthread_mutex_lock(&lock);
    for (m = mrs; m; m = m->next)
        busy |= m->mr.pd == pd;
    c.ret = busy ? EBUSY : 0;
    record(&c);
    pthread_mutex_unlock(&lock);
    if (busy)
        return EBUSY;
    free(pd);
    return 0;
}

static struct ibv_mr *make_mr(struct ibvd_call *c, struct ibv_pd *pd, void *addr, size_t len, uintptr_t start)
{
    struct dmr *m;

    if (!pd || !len) {
        errno = EINVAL;
        return NULL;
    }
    pthread_mutex_lock(&lock);
    if (fail_reg) {
        errno = fail_reg;
        fail_reg = 0;
        pthread_mutex_unlock(&lock);
        return NULL;
    }
    pthread_mutex_unlock(&lock);
    m = calloc(1, sizeof(*m));
    if (!m) {
        errno = ENOMEM;
        return NULL;
    }
    m->kind = c->op;
    m->start = start;
    m->len = len;
    m->mr.context = pd->context;
    m->mr.pd = pd;
    m->mr.addr = addr;
    m->mr.length = len;
    pthread_mutex_lock(&lock);
    m->mr.handle = next_key;
    m->mr.lkey = next_key;
    m->mr.rkey = next_key | 0x800000u;
    next_key++;
    m->next = mrs;
    mrs = m;
    nlive++;
    c->mr = &m->mr;
    c->lkey = m->mr.lkey;
    c->rkey = m->mr.rkey;
    record(c);
    pthread_mutex_unlock(&lock);
    return &m->mr;
}

struct ibv_mr *ibv_reg_mr_iova2(struct ibv_pd *pd, void *addr, size_t length, uint64_t iova, unsigned int access)
{
    struct ibvd_call c = { .op = IBVD_REG_VA, .pd = pd, .addr = (uintptr_t)addr, .len = length, .iova = iova,
                           .access = access, .fd = -1 };

    return make_mr(&c, pd, addr, length, (uintptr_t)addr);
}

/* As in rdma-core: the exported entry points go through the PLT to ibv_reg_mr_iova2. */
#undef ibv_reg_mr
struct ibv_mr *ibv_reg_mr(struct ibv_pd *pd, void *addr, size_t length, int access)
{
    return ibv_reg_mr_iova2(pd, addr, length, (uintptr_t)addr, (unsigned)access);
}

#undef ibv_reg_mr_iova
struct ibv_mr *ibv_reg_mr_iova(struct ibv_pd *pd, void *addr, size_t length, uint64_t iova, int access)
{
    return ibv_reg_mr_iova2(pd, addr, length, iova, (unsigned)access);
}

struct ibv_mr *ibv_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset, size_t length, uint64_t iova, int fd,
                                 int access)
{
    struct ibvd_call c = { .op = IBVD_REG_DMABUF, .pd = pd, .addr = (uintptr_t)iova, .len = length, .iova = iova,
                           .offset = offset, .fd = fd, .access = (unsigned)access };
    char path[64];
    ssize_t n;

    if (fd == -1 && offset == 0 && length == 0 && iova == 0 && access == 0) {
        pthread_mutex_lock(&lock);
        c.op = IBVD_PROBE;
        c.ret = probe_errno;
        record(&c);
        pthread_mutex_unlock(&lock);
        errno = c.ret;
        return NULL;
    }
    if (fd < 0 || fcntl(fd, F_GETFD) < 0) {
        errno = EBADF;
        return NULL;
    }
    snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
    n = readlink(path, c.fd_link, sizeof(c.fd_link) - 1);
    c.fd_link[n > 0 ? n : 0] = 0;
    c.fd_size = (long long)lseek(fd, 0, SEEK_END);
    if (c.fd_size > 0 && offset + length > (unsigned long long)c.fd_size) {    /* 0: /dev/null, no size */
        errno = EINVAL;     /* the kernel refuses a range past the end of the dmabuf */
        return NULL;
    }
    return make_mr(&c, pd, (void *)(uintptr_t)offset, length, (uintptr_t)iova);
}

/* Still mapped, every page? (mincore fails with ENOMEM on an unmapped page.) */
static int mapped(uintptr_t start, size_t len)
{
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), p;
    unsigned char v;

    for (p = start & ~(page - 1); p < start + len; p += page)
        if (mincore((void *)p, page, &v) != 0)
            return 0;
    return 1;
}

int ibv_dereg_mr(struct ibv_mr *mr)
{
    struct ibvd_call c = { .op = IBVD_DEREG, .mr = mr, .fd = -1, .first_byte = -1 };
    struct dmr **pp, *m = NULL;

    pthread_mutex_lock(&lock);
    for (pp = &mrs; *pp; pp = &(*pp)->next)
        if (&(*pp)->mr == mr) {
            m = *pp;
            *pp = m->next;
            nlive--;
            break;
        }
    if (!m) {
        c.op = IBVD_DEREG_UNKNOWN;
        record(&c);
        pthread_mutex_unlock(&lock);
        return EINVAL;
    }
    c.pd = m->mr.pd;
    c.addr = m->start;
    c.len = m->len;
    c.lkey = m->mr.lkey;
    c.rkey = m->mr.rkey;
    c.kind = m->kind;
    if (m->kind == IBVD_REG_VA) {
        uintptr_t at = __atomic_load_n(&probe, __ATOMIC_RELAXED);

        c.mapped = mapped(m->start, m->len);
        /* read only what is mapped and readable: the test's host buffers */
        if (at < m->start || at - m->start >= m->len)
            at = m->start;
        if (c.mapped && getenv("IBVD_READ_AT_DEREG")) {
            /* through the kernel: PROT_NONE memory (the libcuda double's "GPU") reads as EFAULT, not SIGSEGV */
            unsigned char b;
            struct iovec local = { &b, 1 }, remote = { (void *)at, 1 };

            if (process_vm_readv(getpid(), &local, 1, &remote, 1, 0) == 1)
                c.first_byte = b;
        }
    }
    c.ret = dereg_ret;
    record(&c);
    pthread_mutex_unlock(&lock);
    free(m);
    return c.ret;
}

int ibv_rereg_mr(struct ibv_mr *mr, int flags, struct ibv_pd *pd, void *addr, size_t length, int access)
{
    struct ibvd_call c = { .op = IBVD_REREG, .mr = mr, .pd = pd, .addr = (uintptr_t)addr, .len = length,
                           .access = (unsigned)access, .fd = -1, .kind = flags };
    struct dmr *m;

    pthread_mutex_lock(&lock);
    for (m = mrs; m && &m->mr != mr; m = m->next)
        ;
    c.ret = m && flags == IBV_REREG_MR_CHANGE_ACCESS ? 0 : IBV_REREG_MR_ERR_INPUT;
    record(&c);
    pthread_mutex_unlock(&lock);
    if (c.ret)
        errno = EINVAL;
    return c.ret;
}
