/*
 * One RC queue pair brought up towards a peer, as every engine-shaped program here does it
 * (the tests on the loopback NIC, the end-to-end suite, bench_nics, the demo, the GPU end to end):
 * RESET -> INIT -> RTR -> RTS with the attributes a ConnectX needs too (a GRH, so that RoCE works).
 */
#ifndef DRC_TEST_RCQP_H
#define DRC_TEST_RCQP_H

#include <errno.h>
#include <infiniband/verbs.h>
#include <stdint.h>
#include <string.h>

struct rcqp_peer {
    uint32_t qpn, psn;              /* the remote QP and its send PSN (our receive PSN) */
    uint16_t lid;                   /* 0 on RoCE */
    union ibv_gid gid;              /* zero: the loopback provider needs none */
    uint8_t sgid_index;             /* our GID index */
};

/* A QP of @pd on @cq for up to @wr outstanding work requests of @sge SGEs; NULL with errno set. */
static inline struct ibv_qp *rcqp_create(struct ibv_pd *pd, struct ibv_cq *cq, uint32_t wr, uint32_t sge)
{
    struct ibv_qp_init_attr ia;

    memset(&ia, 0, sizeof(ia));
    ia.send_cq = ia.recv_cq = cq;
    ia.qp_type = IBV_QPT_RC;
    ia.cap.max_send_wr = ia.cap.max_recv_wr = wr;
    ia.cap.max_send_sge = ia.cap.max_recv_sge = sge;
    return ibv_create_qp(pd, &ia);
}

/*
 * Bring @qp (port 1, remote @access allowed) from any state to RTS towards @peer, sending from
 * @psn. Returns 0, or the state it could not reach (IBV_QPS_INIT, _RTR or _RTS) with errno set.
 */
static inline int rcqp_connect(struct ibv_qp *qp, const struct rcqp_peer *peer, unsigned access, uint32_t psn)
{
    struct ibv_qp_attr a;

    memset(&a, 0, sizeof(a));
    a.qp_state = IBV_QPS_RESET;
    ibv_modify_qp(qp, &a, IBV_QP_STATE);
    a.qp_state = IBV_QPS_INIT;
    a.port_num = 1;
    a.qp_access_flags = access;
    if ((errno = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)))
        return IBV_QPS_INIT;
    memset(&a, 0, sizeof(a));
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = IBV_MTU_1024;
    a.dest_qp_num = peer->qpn;
    a.rq_psn = peer->psn;
    a.max_dest_rd_atomic = 4;
    a.min_rnr_timer = 12;
    a.ah_attr.dlid = peer->lid;
    a.ah_attr.port_num = 1;
    a.ah_attr.is_global = 1;
    a.ah_attr.grh.dgid = peer->gid;
    a.ah_attr.grh.sgid_index = peer->sgid_index;
    a.ah_attr.grh.hop_limit = 1;
    if ((errno = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                           IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER)))
        return IBV_QPS_RTR;
    memset(&a, 0, sizeof(a));
    a.qp_state = IBV_QPS_RTS;
    a.timeout = 14;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.sq_psn = psn;
    a.max_rd_atomic = 4;
    if ((errno = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                                           IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC)))
        return IBV_QPS_RTS;
    return 0;
}

#endif
