/* The hazard the stock-program suite's control runs (tests/loopnic/stock.sh): a program on plain
 * verbs that keeps the keys of an MR after the memory under it was unmapped and mapped again at the
 * same address, then uses them in one work request. A NIC would move the old pages; the model
 * refuses the WR and counts a stale use, which the exit report (LOOPNIC_REPORT) shows.
 *
 *   stale_hazard OPCODE    send | recv | write | read | atomic | none
 *
 * "recv" makes the receive buffer the stale one (the peer's SEND lands in it); "none" is the same
 * program without the remap (no stale use). Exit 0 when the WR completed as a NIC model must
 * complete it: with an error for the stale cases, successfully for "none".
 * Two QPs of one process, connected to each other: the model needs no second process for this.
 */
#include <errno.h>
#include <infiniband/verbs.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "rcqp.h"

enum { LEN = 4096 };

static int wait_wc(struct ibv_cq *cq, struct ibv_wc *wc)
{
    for (long i = 0; i < 100000000; i++) {
        int n = ibv_poll_cq(cq, 1, wc);
        if (n)
            return n < 0 ? -1 : 0;
    }
    return -1;
}

int main(int argc, char **argv)
{
    const char *op = argc > 1 ? argv[1] : "send";
    int stale_recv = !strcmp(op, "recv"), none = !strcmp(op, "none");
    unsigned access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                      IBV_ACCESS_REMOTE_ATOMIC;
    struct ibv_device **devs = ibv_get_device_list(NULL);
    struct ibv_context *ctx;
    struct ibv_pd *pd;
    struct ibv_cq *cq;
    struct ibv_qp *a, *b;
    struct ibv_mr *mra, *mrb;
    struct rcqp_peer pa, pb;
    struct ibv_sge sa, sb;
    struct ibv_send_wr wr, *bad;
    struct ibv_recv_wr rwr, *rbad;
    struct ibv_wc wc;
    char *bufa, *bufb, *stale;

    if (!devs || !devs[0] || !(ctx = ibv_open_device(devs[0])) || !(pd = ibv_alloc_pd(ctx)) ||
        !(cq = ibv_create_cq(ctx, 16, NULL, NULL, 0)) || !(a = rcqp_create(pd, cq, 4, 1)) ||
        !(b = rcqp_create(pd, cq, 4, 1))) {
        perror("stale_hazard: setup");
        return 2;
    }
    bufa = mmap(NULL, LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    bufb = mmap(NULL, LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (bufa == MAP_FAILED || bufb == MAP_FAILED || !(mra = ibv_reg_mr(pd, bufa, LEN, (int)access)) ||
        !(mrb = ibv_reg_mr(pd, bufb, LEN, (int)access))) {
        perror("stale_hazard: memory");
        return 2;
    }
    memset(&pa, 0, sizeof(pa));
    memset(&pb, 0, sizeof(pb));
    pa.qpn = a->qp_num;
    pb.qpn = b->qp_num;
    if (rcqp_connect(a, &pb, access, 0) || rcqp_connect(b, &pa, access, 0)) {
        perror("stale_hazard: connect");
        return 2;
    }
    /* b's receive, for SEND */
    sb.addr = (uintptr_t)bufb;
    sb.length = LEN;
    sb.lkey = mrb->lkey;
    memset(&rwr, 0, sizeof(rwr));
    rwr.wr_id = 2;
    rwr.sg_list = &sb;
    rwr.num_sge = 1;
    if (ibv_post_recv(b, &rwr, &rbad)) {
        perror("stale_hazard: post_recv");
        return 2;
    }
    /* the hazard: the memory goes and comes back at the same address; the keys stay */
    stale = stale_recv ? bufb : bufa;
    if (!none && (munmap(stale, LEN) != 0 ||
                  mmap(stale, LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) != stale)) {
        perror("stale_hazard: remap");
        return 2;
    }
    sa.addr = (uintptr_t)bufa;
    sa.length = !strcmp(op, "atomic") ? 8 : LEN;
    sa.lkey = mra->lkey;
    memset(&wr, 0, sizeof(wr));
    wr.wr_id = 1;
    wr.sg_list = &sa;
    wr.num_sge = 1;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = (uintptr_t)bufb;
    wr.wr.rdma.rkey = mrb->rkey;
    if (!strcmp(op, "write")) {
        wr.opcode = IBV_WR_RDMA_WRITE;
    } else if (!strcmp(op, "read")) {
        wr.opcode = IBV_WR_RDMA_READ;
    } else if (!strcmp(op, "atomic")) {
        wr.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
        wr.wr.atomic.remote_addr = (uintptr_t)bufb;
        wr.wr.atomic.rkey = mrb->rkey;
        wr.wr.atomic.compare_add = 1;
    } else {
        wr.opcode = IBV_WR_SEND;
    }
    if (ibv_post_send(a, &wr, &bad) || wait_wc(cq, &wc)) {
        perror("stale_hazard: post_send");
        return 2;
    }
    if (stale_recv && wc.wr_id == 2) { /* the receive's own completion comes first: skip to the send's */
        if (wait_wc(cq, &wc))
            return 2;
    }
    printf("stale_hazard %s: wr %llu status %s\n", op, (unsigned long long)wc.wr_id, ibv_wc_status_str(wc.status));
    return none ? wc.status != IBV_WC_SUCCESS : wc.status == IBV_WC_SUCCESS;
}
