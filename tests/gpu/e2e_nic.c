/*
 * The NIC side of the PyTorch end-to-end test (test_torch_e2e_gpu.py), for ctypes: one device,
 * one PD, two RC QPs connected to each other (the transfers go from one to the other in this
 * process), and a host staging buffer registered with plain ibv_reg_mr that every transfer reads
 * from (WRITE) or writes into (READ). The remote side is whatever the test registered through
 * drc: the address and rkey of a tensor's region. Run it on the loopback provider
 * (LD_LIBRARY_PATH=build/loopnic, e2e.sh), which moves bytes to and from GPU memory with
 * cuMemcpy and counts stale uses; on a real NIC the counters read -1.
 *
 * Not thread-safe: one test, one thread.
 */
#include <dlfcn.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "loopnic.h"
#include "rcqp.h"

#define ACC (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)

static struct ibv_device **devs;
static struct ibv_context *ctx;
static struct ibv_pd *pd;
static struct ibv_cq *cq;
static struct ibv_qp *qa, *qb;
static void *staging;
static size_t staging_len;
static struct ibv_mr *staging_mr;

static int connect_both(void)
{
    struct rcqp_peer to_b = { .qpn = qb->qp_num }, to_a = { .qpn = qa->qp_num };
    struct ibv_port_attr pa;

    if (ibv_query_port(ctx, 1, &pa) == 0)
        to_a.lid = to_b.lid = pa.lid;
    ibv_query_gid(ctx, 1, 0, &to_b.gid);
    to_a.gid = to_b.gid;
    return rcqp_connect(qa, &to_b, ACC, 0) || rcqp_connect(qb, &to_a, ACC, 0) ? -EIO : 0;
}

int e2e_nic_close(void);

/* Open the first device, make the QP pair and a staging buffer of @len bytes. 0 or -errno. */
int e2e_nic_open(size_t len)
{
    int n = 0;

    if (!(devs = ibv_get_device_list(&n)) || n < 1)
        return -ENODEV;
    if (!(ctx = ibv_open_device(devs[0])) || !(pd = ibv_alloc_pd(ctx)) || !(cq = ibv_create_cq(ctx, 64, NULL, NULL, 0)) ||
        !(qa = rcqp_create(pd, cq, 16, 1)) || !(qb = rcqp_create(pd, cq, 16, 1)))
        goto fail;
    if (connect_both())
        goto fail;
    staging_len = (len + 4095) & ~(size_t)4095;
    if (!(staging = aligned_alloc(4096, staging_len)))
        goto fail;
    memset(staging, 0, staging_len);
    if (!(staging_mr = ibv_reg_mr(pd, staging, staging_len, IBV_ACCESS_LOCAL_WRITE)))
        goto fail;
    return 0;
fail:
    n = errno ? -errno : -EIO;
    e2e_nic_close();
    return n;
}

/* The PD drc registers into (drc_cache_create_verbs), and the staging buffer. */
void *e2e_nic_pd(void) { return pd; }
void *e2e_nic_staging(void) { return staging; }

/*
 * One signalled RDMA WRITE (staging -> @remote) or READ (@remote -> staging) of @n bytes
 * through @rkey. Returns the completion's status (0: IBV_WC_SUCCESS), or -1 if nothing completed
 * within 10 s or the request could not be posted. After an error completion the QPs are brought
 * back up, so the next transfer can run.
 */
int e2e_nic_xfer(int write, uint64_t remote, uint32_t rkey, size_t n)
{
    struct ibv_sge sg = { (uintptr_t)staging, (uint32_t)n, staging_mr ? staging_mr->lkey : 0 };
    struct ibv_send_wr wr, *bad;
    struct ibv_wc wc;
    struct timespec t0, t;
    int got = 0;

    if (!staging_mr || n > staging_len)
        return -1;
    memset(&wr, 0, sizeof(wr));
    wr.opcode = write ? IBV_WR_RDMA_WRITE : IBV_WR_RDMA_READ;
    wr.sg_list = &sg;
    wr.num_sge = 1;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = remote;
    wr.wr.rdma.rkey = rkey;
    if (ibv_post_send(qa, &wr, &bad))
        return -1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    do {
        got = ibv_poll_cq(cq, 1, &wc);
        clock_gettime(CLOCK_MONOTONIC, &t);
    } while (got == 0 && t.tv_sec - t0.tv_sec < 10);
    if (got == 1 && wc.status != IBV_WC_SUCCESS)
        connect_both();
    return got == 1 ? (int)wc.status : -1;
}

/* loopnic's stale uses, live MRs and refused registrations, all devices; -1 each on another provider. */
void e2e_nic_counters(long long *stale, long long *live_mrs, long long *reg_failures)
{
    loopnic_get_counters_fn *get = (loopnic_get_counters_fn *)dlsym(RTLD_DEFAULT, "loopnic_get_counters");
    struct loopnic_counters c;

    *stale = *live_mrs = *reg_failures = -1;
    if (get && get(-1, &c) == 0) {
        *stale = (long long)c.stale_uses;
        *live_mrs = (long long)c.live_mrs;
        *reg_failures = (long long)c.reg_failures;
    }
}

/* Tear everything down; 0, or the number of steps that failed (ibv_dealloc_pd fails while MRs are left). */
int e2e_nic_close(void)
{
    int bad = 0;

    if (staging_mr)
        bad += ibv_dereg_mr(staging_mr) != 0;
    if (qa)
        bad += ibv_destroy_qp(qa) != 0;
    if (qb)
        bad += ibv_destroy_qp(qb) != 0;
    if (cq)
        bad += ibv_destroy_cq(cq) != 0;
    if (pd)
        bad += ibv_dealloc_pd(pd) != 0;
    if (ctx)
        bad += ibv_close_device(ctx) != 0;
    if (devs)
        ibv_free_device_list(devs);
    free(staging);
    staging_mr = NULL;
    qa = qb = NULL;
    cq = NULL;
    pd = NULL;
    ctx = NULL;
    devs = NULL;
    staging = NULL;
    return bad;
}
