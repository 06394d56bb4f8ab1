/*
 * drc-demo-engine: the workload `drc demo` runs (src/tools/drc.c), an engine on plain verbs that
 * knows nothing of drc. It sends tensors carved from a few buffers, registering each tensor before
 * its transfer and deregistering it after (what a correct engine without a cache does); between
 * two rounds one buffer is freed and a new one is mapped at the same address. Every transfer is an
 * RDMA WRITE between two QPs of one device, and every byte is checked at its destination.
 *
 * drc demo runs it on the loopback provider (build/loopnic, in place of libibverbs.so.1), straight
 * and with build/libdrc_verbs.so preloaded. It prints "key value" lines: what it asked, what it
 * verified, and the provider's counters (read with dlsym, so that it also runs on a real NIC,
 * where those lines are missing).
 */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include <infiniband/verbs.h>

#include "loopnic.h"   /* src/loopnic: the provider's counters, looked up with dlsym */
#include "rcqp.h"    /* tests/loopnic: one RC QP brought up, as the tests do it */

#define ACC (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)
enum { BUFS = 4, BUF_LEN = 1 << 20, TENSORS = 16, TENSOR = BUF_LEN / TENSORS, ROUNDS = 3, REALLOC_BEFORE = 2 };

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static struct ibv_cq *cq;
static struct ibv_qp *qa, *qb;
static unsigned long asked, wrs, failed_wrs, verified, wrong;

static int die(const char *what)
{
    fprintf(stderr, "drc-demo-engine: %s failed\n", what);
    exit(1);
}

static struct ibv_qp *make_qp(void)
{
    struct ibv_qp_init_attr ia;

    memset(&ia, 0, sizeof(ia));
    ia.send_cq = ia.recv_cq = cq;
    ia.qp_type = IBV_QPT_RC;
    ia.cap.max_send_wr = 16;
    ia.cap.max_send_sge = 1;
    return ibv_create_qp(pd, &ia);
}

static void connect_qp(struct ibv_qp *qp, uint32_t dest)
{
    struct rcqp_peer peer = { .qpn = dest };

    if (rcqp_connect(qp, &peer, ACC, 0))
        die("ibv_modify_qp");
}

/* Send one tensor: register it, WRITE src into it, check it, deregister it. */
static void send_tensor(unsigned char *t, unsigned char *src, struct ibv_mr *src_mr, unsigned seed)
{
    struct ibv_sge sg = { (uintptr_t)src, TENSOR, src_mr->lkey };
    struct ibv_send_wr wr, *bad;
    struct ibv_wc wc;
    struct ibv_mr *mr;
    size_t ok = 0;
    int n;

    for (size_t i = 0; i < TENSOR; i++)
        src[i] = (unsigned char)(seed * 131u + i * 7u + 1u);
    asked++;
    if (!(mr = ibv_reg_mr(pd, t, TENSOR, ACC)))
        die("ibv_reg_mr");
    memset(&wr, 0, sizeof(wr));
    wr.opcode = IBV_WR_RDMA_WRITE;
    wr.sg_list = &sg;
    wr.num_sge = 1;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = (uintptr_t)t;
    wr.wr.rdma.rkey = mr->rkey;
    if (ibv_post_send(qa, &wr, &bad))
        die("ibv_post_send");
    while ((n = ibv_poll_cq(cq, 1, &wc)) == 0) {}
    wrs++;
    if (n < 0 || wc.status != IBV_WC_SUCCESS) {
        failed_wrs++;
        connect_qp(qa, qb->qp_num);   /* an error completion leaves the QPs in error */
        connect_qp(qb, qa->qp_num);
    }
    for (size_t i = 0; i < TENSOR; i++)
        ok += t[i] == src[i];
    if (ok == TENSOR)               /* a tensor is verified when every byte of it arrived */
        verified += TENSOR;
    else
        wrong += TENSOR;
    if (ibv_dereg_mr(mr))
        die("ibv_dereg_mr");
}

int main(void)
{
    loopnic_get_counters_fn *counters = (loopnic_get_counters_fn *)dlsym(RTLD_DEFAULT, "loopnic_get_counters");
    struct ibv_device **devs;
    struct ibv_mr *src_mr;
    unsigned char *buf[BUFS], *src;
    int n = 0;

    if (!(devs = ibv_get_device_list(&n)) || n < 1)
        die("ibv_get_device_list (no RDMA device)");
    if (!(ctx = ibv_open_device(devs[0])) || !(pd = ibv_alloc_pd(ctx)) ||
        !(cq = ibv_create_cq(ctx, 64, NULL, NULL, 0)) || !(qa = make_qp()) || !(qb = make_qp()))
        die("verbs setup");
    connect_qp(qa, qb->qp_num);
    connect_qp(qb, qa->qp_num);
    src = mmap(NULL, TENSOR, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (src == MAP_FAILED || !(src_mr = ibv_reg_mr(pd, src, TENSOR, IBV_ACCESS_LOCAL_WRITE)))
        die("staging buffer");
    asked++;
    for (int b = 0; b < BUFS; b++)
        if ((buf[b] = mmap(NULL, BUF_LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)) == MAP_FAILED)
            die("mmap");
    for (int r = 0; r < ROUNDS; r++) {
        if (r == REALLOC_BEFORE) {   /* the application frees buffer 0; its next buffer gets the same VA */
            if (munmap(buf[0], BUF_LEN) ||
                mmap(buf[0], BUF_LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) != buf[0])
                die("free and reallocate");
        }
        for (int b = 0; b < BUFS; b++)
            for (int t = 0; t < TENSORS; t++)
                send_tensor(buf[b] + (size_t)t * TENSOR, src, src_mr, (unsigned)(r * 1000 + b * 100 + t));
    }
    printf("registrations_asked %lu\nwork_requests %lu\nfailed_work_requests %lu\nbytes_verified %lu\n"
           "bytes_wrong %lu\n", asked, wrs, failed_wrs, verified, wrong);
    if (counters) {
        struct loopnic_counters c;
        counters(-1, &c);
        printf("nic_registrations %llu\nnic_dmabuf_registrations %llu\nnic_live_mrs %llu\nbytes_moved %llu\n"
               "stale_uses %llu\n", (unsigned long long)c.total_regs, (unsigned long long)c.dmabuf_regs,
               (unsigned long long)c.live_mrs, (unsigned long long)c.bytes_moved, (unsigned long long)c.stale_uses);
    }
    ibv_dereg_mr(src_mr);
    for (int b = 0; b < BUFS; b++)
        munmap(buf[b], BUF_LEN);
    munmap(src, TENSOR);
    ibv_destroy_qp(qa);
    ibv_destroy_qp(qb);
    ibv_destroy_cq(cq);
    ibv_dealloc_pd(pd);
    ibv_close_device(ctx);
    ibv_free_device_list(devs);
    return 0;
}
