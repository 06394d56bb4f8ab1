/* Tests of the loopnic provider (src/loopnic/loopnic.c): does it behave like a NIC?
 *
 * This program is linked against the system libibverbs and run twice by make test-loopnic:
 * LOOPNIC_TEST_MODE=inplace with build/loopnic on LD_LIBRARY_PATH (the provider is
 * libibverbs.so.1), and LOOPNIC_TEST_MODE=preload with build/loopnic/libloopnic.so in LD_PRELOAD
 * over the real library. The control API is looked up with dlsym(RTLD_DEFAULT): without it (a
 * real NIC) the tests that need it skip.
 *
 * Every error case has a control next to it that shows the same transfer with the fault removed
 * does move the data. "--child FD" runs the peer of the two-process test.
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <link.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "loopnic.h"

static loopnic_get_counters_fn *p_counters;
static loopnic_reset_counters_fn *p_reset;
static loopnic_fail_fn *p_fail_reg, *p_fail_dmabuf, *p_fail_wr;
static loopnic_raise_async_event_fn *p_raise;
static loopnic_set_max_mr_size_fn *p_set_max_mr;
static loopnic_mr_is_stale_fn *p_is_stale;
static char registry[PATH_MAX];
static const char *mode;
static long page;

#define NEED_LOOPNIC() do { if (!p_counters) { skip(); } } while (0)
#define ALL_ACCESS (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)

static struct ibv_device **devs;
static int ndevs;

static struct loopnic_counters counters(int dev)
{
    struct loopnic_counters c;

    memset(&c, 0, sizeof(c));
    if (p_counters)
        assert_int_equal(p_counters(dev, &c), 0);
    return c;
}

/* One side of a connection: a device context, a PD, a CQ and an RC QP. */
struct side {
    struct ibv_context *ctx;
    struct ibv_pd *pd;
    struct ibv_cq *cq;
    struct ibv_qp *qp;
};

static void side_open(struct side *s, int dev)
{
    struct ibv_qp_init_attr ia;

    memset(s, 0, sizeof(*s));
    assert_true(dev < ndevs);
    s->ctx = ibv_open_device(devs[dev]);
    assert_non_null(s->ctx);
    s->pd = ibv_alloc_pd(s->ctx);
    assert_non_null(s->pd);
    s->cq = ibv_create_cq(s->ctx, 64, s, NULL, 0);
    assert_non_null(s->cq);
    memset(&ia, 0, sizeof(ia));
    ia.send_cq = ia.recv_cq = s->cq;
    ia.qp_type = IBV_QPT_RC;
    ia.cap.max_send_wr = ia.cap.max_recv_wr = 32;
    ia.cap.max_send_sge = ia.cap.max_recv_sge = 4;
    ia.cap.max_inline_data = 64;
    s->qp = ibv_create_qp(s->pd, &ia);
    assert_non_null(s->qp);
}

static void side_close(struct side *s)
{
    assert_int_equal(ibv_destroy_qp(s->qp), 0);
    assert_int_equal(ibv_destroy_cq(s->cq), 0);
    assert_int_equal(ibv_dealloc_pd(s->pd), 0);
    assert_int_equal(ibv_close_device(s->ctx), 0);
}

static int to_init(struct ibv_qp *qp, int access)
{
    struct ibv_qp_attr a;

    memset(&a, 0, sizeof(a));
    a.qp_state = IBV_QPS_INIT;
    a.pkey_index = 0;
    a.port_num = 1;
    a.qp_access_flags = (unsigned)access;
    return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
}

static int to_rtr(struct ibv_qp *qp, uint32_t dest, int mask_off)
{
    struct ibv_qp_attr a;

    memset(&a, 0, sizeof(a));
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = IBV_MTU_4096;
    a.dest_qp_num = dest;
    a.rq_psn = 0;
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 12;
    a.ah_attr.is_global = 1;      /* RoCE needs it; harmless on IB */
    a.ah_attr.grh.hop_limit = 1;
    a.ah_attr.dlid = 1;
    a.ah_attr.port_num = 1;
    return ibv_modify_qp(qp, &a, (IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                  IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER) & ~mask_off);
}

static int to_rts_rnr(struct ibv_qp *qp, uint8_t rnr_retry)
{
    struct ibv_qp_attr a;

    memset(&a, 0, sizeof(a));
    a.qp_state = IBV_QPS_RTS;
    a.timeout = 14;
    a.retry_cnt = 7;
    a.rnr_retry = rnr_retry;
    a.sq_psn = 0;
    a.max_rd_atomic = 1;
    return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                                     IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
}

static int to_rts(struct ibv_qp *qp)
{
    return to_rts_rnr(qp, 7);
}

static void connect_qp(struct ibv_qp *qp, uint32_t dest, int access)
{
    assert_int_equal(to_init(qp, access), 0);
    assert_int_equal(to_rtr(qp, dest, 0), 0);
    assert_int_equal(to_rts(qp), 0);
}

/* Both QPs back to RESET and connected again (after an error). */
static void reconnect(struct side *a, struct side *b)
{
    struct ibv_qp_attr qa;

    memset(&qa, 0, sizeof(qa));
    qa.qp_state = IBV_QPS_RESET;
    assert_int_equal(ibv_modify_qp(a->qp, &qa, IBV_QP_STATE), 0);
    assert_int_equal(ibv_modify_qp(b->qp, &qa, IBV_QP_STATE), 0);
    connect_qp(a->qp, b->qp->qp_num, ALL_ACCESS);
    connect_qp(b->qp, a->qp->qp_num, ALL_ACCESS);
}

static void reconnect_to(struct ibv_qp *qp, uint32_t dest)
{
    struct ibv_qp_attr qa;

    memset(&qa, 0, sizeof(qa));
    qa.qp_state = IBV_QPS_RESET;
    assert_int_equal(ibv_modify_qp(qp, &qa, IBV_QP_STATE), 0);
    connect_qp(qp, dest, ALL_ACCESS);
}

/* a on loop0, b on loop1 (or loop0 again with one device), connected. */
static void pair_open(struct side *a, struct side *b)
{
    side_open(a, 0);
    side_open(b, ndevs > 1 ? 1 : 0);
    connect_qp(a->qp, b->qp->qp_num, ALL_ACCESS);
    connect_qp(b->qp, a->qp->qp_num, ALL_ACCESS);
}

static int post(struct ibv_qp *qp, enum ibv_wr_opcode op, struct ibv_sge *sg, int n, uint64_t raddr,
                uint32_t rkey, unsigned flags, uint64_t id)
{
    struct ibv_send_wr wr, *bad = NULL;

    memset(&wr, 0, sizeof(wr));
    wr.wr_id = id;
    wr.opcode = op;
    wr.sg_list = sg;
    wr.num_sge = n;
    wr.send_flags = flags;
    wr.wr.rdma.remote_addr = raddr;
    wr.wr.rdma.rkey = rkey;
    return ibv_post_send(qp, &wr, &bad);
}

static struct ibv_wc poll1(struct ibv_cq *cq)
{
    struct ibv_wc wc;
    int n = 0;

    memset(&wc, 0, sizeof(wc));
    for (int tries = 0; tries < 1000 && n == 0; tries++)
        n = ibv_poll_cq(cq, 1, &wc);
    assert_int_equal(n, 1);
    return wc;
}

static void assert_cq_empty(struct ibv_cq *cq)
{
    struct ibv_wc wc;
    assert_int_equal(ibv_poll_cq(cq, 1, &wc), 0);
}

static struct ibv_sge sge(struct ibv_mr *mr, const void *p, uint32_t len)
{
    struct ibv_sge s;
    s.addr = (uintptr_t)p;
    s.length = len;
    s.lkey = mr->lkey;
    return s;
}

static void fill(void *p, size_t n, unsigned seed)
{
    unsigned char *c = p;
    for (size_t i = 0; i < n; i++)
        c[i] = (unsigned char)(seed + i * 7 + (i >> 8));
}

static int check(const void *p, size_t n, unsigned seed)
{
    const unsigned char *c = p;
    for (size_t i = 0; i < n; i++)
        if (c[i] != (unsigned char)(seed + i * 7 + (i >> 8)))
            return 0;
    return 1;
}

static int all(const void *p, size_t n, unsigned char v)
{
    const unsigned char *c = p;
    for (size_t i = 0; i < n; i++)
        if (c[i] != v)
            return 0;
    return 1;
}

static void *map_anon(size_t n)
{
    void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(p != MAP_FAILED);
    return p;
}

/* ---------------------------------------------------------------------------------------------- */

static void test_startup_sequence(void **state)
{
    struct ibv_device_attr da;
    struct ibv_port_attr pa;
    union ibv_gid gid;
    struct ibv_gid_entry ge;
    struct ibv_context *ctx;
    struct ibv_pd *pd;
    struct ibv_comp_channel *ch;
    struct ibv_cq *cq;
    struct ibv_qp *qp;
    struct ibv_qp_init_attr ia, qia;
    struct ibv_qp_attr qa;
    struct epoll_event ev;
    int ep;
    int tag;

    (void)state;
    NEED_LOOPNIC();
    assert_int_equal(ndevs, 2); /* LOOPNIC_DEVICES unset: two devices */
    assert_string_equal(ibv_get_device_name(devs[0]), "loop0");
    assert_string_equal(ibv_get_device_name(devs[1]), "loop1");
    assert_true(ibv_get_device_guid(devs[0]) != 0);
    assert_true(ibv_get_device_guid(devs[0]) != ibv_get_device_guid(devs[1]));
    assert_int_equal(ibv_fork_init(), 0);

    ctx = ibv_open_device(devs[0]);
    assert_non_null(ctx);
    assert_true(fcntl(ctx->async_fd, F_GETFD) >= 0);
    p_set_max_mr(1u << 20);
    assert_int_equal(ibv_query_device(ctx, &da), 0);
    assert_int_equal(da.max_mr_size, 1u << 20);
    assert_true(da.max_qp > 0 && da.max_cq > 0 && da.max_qp_wr > 0 && da.max_sge > 0 && da.max_cqe > 0);
    assert_int_equal(da.phys_port_cnt, 1);
    assert_int_equal(ibv_query_port(ctx, 1, &pa), 0);
    assert_int_equal(pa.state, IBV_PORT_ACTIVE);
    assert_true(pa.link_layer == IBV_LINK_LAYER_INFINIBAND || pa.link_layer == IBV_LINK_LAYER_ETHERNET);
    {   /* the IBVERBS_1.1 entry point fills the old, shorter structure only */
        typedef int query_port_fn(struct ibv_context *, uint8_t, struct ibv_port_attr *);
        query_port_fn *qp_old = (query_port_fn *)dlvsym(RTLD_DEFAULT, "ibv_query_port", "IBVERBS_1.1");
        struct ibv_port_attr old;
        assert_non_null(qp_old);
        memset(&old, 0xff, sizeof(old));
        assert_int_equal(qp_old(ctx, 1, &old), 0);
        assert_int_equal(old.state, IBV_PORT_ACTIVE);
        assert_int_equal(old.link_layer, pa.link_layer);
        assert_int_equal(old.flags, 0xff);
        assert_int_equal(old.port_cap_flags2, 0xffff);
        assert_int_equal(qp_old(ctx, 2, &old), EINVAL);
    }
    assert_int_equal(ibv_query_gid(ctx, 1, 0, &gid), 0);
    assert_int_equal(ibv_query_gid_ex(ctx, 1, 0, &ge, 0), 0);
    assert_memory_equal(&ge.gid, &gid, sizeof(gid));
    assert_true(ibv_query_gid_ex(ctx, 1, 5, &ge, 0) != 0);

    pd = ibv_alloc_pd(ctx);
    assert_non_null(pd);
    {   /* max_mr_size is enforced */
        void *big = map_anon(2u << 20);
        errno = 0;
        assert_null(ibv_reg_mr(pd, big, 2u << 20, ALL_ACCESS));
        assert_int_equal(errno, EINVAL);
        p_set_max_mr(UINT64_MAX);
        struct ibv_mr *mr = ibv_reg_mr(pd, big, 2u << 20, ALL_ACCESS);
        assert_non_null(mr);
        assert_int_equal(ibv_dereg_mr(mr), 0);
        munmap(big, 2u << 20);
    }

    /* the channel's fd and the async fd are real fds an engine can epoll */
    ch = ibv_create_comp_channel(ctx);
    assert_non_null(ch);
    assert_int_equal(fcntl(ch->fd, F_SETFL, fcntl(ch->fd, F_GETFL) | O_NONBLOCK), 0);
    assert_int_equal(fcntl(ctx->async_fd, F_SETFL, fcntl(ctx->async_fd, F_GETFL) | O_NONBLOCK), 0);
    ep = epoll_create1(0);
    memset(&ev, 0, sizeof(ev));
    ev.events = EPOLLIN;
    assert_int_equal(epoll_ctl(ep, EPOLL_CTL_ADD, ch->fd, &ev), 0);
    assert_int_equal(epoll_ctl(ep, EPOLL_CTL_ADD, ctx->async_fd, &ev), 0);
    assert_int_equal(epoll_wait(ep, &ev, 1, 0), 0);
    close(ep);

    cq = ibv_create_cq(ctx, 16, &tag, ch, 0);
    assert_non_null(cq);
    assert_ptr_equal(cq->cq_context, &tag);
    assert_ptr_equal(cq->channel, ch);
    assert_true(cq->cqe >= 16);

    memset(&ia, 0, sizeof(ia));
    ia.send_cq = ia.recv_cq = cq;
    ia.qp_type = IBV_QPT_RC;
    ia.cap.max_send_wr = 8;
    ia.cap.max_send_sge = 1;
    qp = ibv_create_qp(pd, &ia);
    assert_non_null(qp);
    assert_int_equal(qp->state, IBV_QPS_RESET);
    assert_true(qp->qp_num > 1);
    assert_int_equal(ibv_destroy_cq(cq), EBUSY); /* a QP uses it */

    /* the state machine: illegal transitions and missing attributes are EINVAL */
    assert_int_equal(to_rtr(qp, qp->qp_num, 0), EINVAL);          /* RESET -> RTR */
    assert_int_equal(to_rts(qp), EINVAL);                          /* RESET -> RTS */
    memset(&qa, 0, sizeof(qa));
    qa.qp_state = IBV_QPS_INIT;
    assert_int_equal(ibv_modify_qp(qp, &qa, IBV_QP_STATE | IBV_QP_PORT | IBV_QP_PKEY_INDEX), EINVAL);
    assert_int_equal(to_init(qp, ALL_ACCESS), 0);
    assert_int_equal(to_rts(qp), EINVAL);                          /* INIT -> RTS */
    assert_int_equal(to_rtr(qp, qp->qp_num, IBV_QP_DEST_QPN), EINVAL); /* RTR needs dest_qp_num */
    assert_int_equal(to_rtr(qp, qp->qp_num, 0), 0);
    assert_int_equal(to_init(qp, ALL_ACCESS), EINVAL);             /* RTR -> INIT */
    assert_int_equal(to_rts(qp), 0);
    assert_int_equal(qp->state, IBV_QPS_RTS);
    assert_int_equal(ibv_query_qp(qp, &qa, IBV_QP_STATE | IBV_QP_DEST_QPN, &qia), 0);
    assert_int_equal(qa.qp_state, IBV_QPS_RTS);
    assert_int_equal(qa.dest_qp_num, qp->qp_num);
    assert_ptr_equal(qia.send_cq, cq);
    memset(&qa, 0, sizeof(qa));
    qa.qp_state = IBV_QPS_ERR;
    assert_int_equal(ibv_modify_qp(qp, &qa, IBV_QP_STATE), 0);
    assert_int_equal(to_rts(qp), EINVAL);                          /* ERR -> RTS */
    qa.qp_state = IBV_QPS_RESET;
    assert_int_equal(ibv_modify_qp(qp, &qa, IBV_QP_STATE), 0);
    assert_int_equal(to_init(qp, ALL_ACCESS), 0);

    assert_int_equal(ibv_destroy_qp(qp), 0);
    assert_int_equal(ibv_destroy_comp_channel(ch), EBUSY);         /* the CQ uses it */
    assert_int_equal(ibv_destroy_cq(cq), 0);
    assert_int_equal(ibv_destroy_comp_channel(ch), 0);
    assert_int_equal(ibv_dealloc_pd(pd), 0);
    assert_int_equal(ibv_close_device(ctx), 0);
}

static void test_write_and_read_move_every_byte(void **state)
{
    enum { N = 3 * 4096 + 123 };
    struct side a, b;
    struct ibv_mr *ms1, *ms2, *md, *mr;
    struct ibv_sge sg[3];
    struct ibv_wc wc;
    struct loopnic_counters c0, c1, c0d0 = counters(0);
    unsigned char *s1 = map_anon(2 * 4096), *s2 = map_anon(3 * 4096), *d = map_anon(4 * 4096);
    unsigned char *r = map_anon(4 * 4096), *expect = malloc(N);

    (void)state;
    NEED_LOOPNIC();
    pair_open(&a, &b);
    c0 = counters(-1);
    ms1 = ibv_reg_mr(a.pd, s1, 2 * 4096, IBV_ACCESS_LOCAL_WRITE);
    ms2 = ibv_reg_mr(a.pd, s2, 3 * 4096, IBV_ACCESS_LOCAL_WRITE);
    md = ibv_reg_mr(b.pd, d, 4 * 4096, ALL_ACCESS);
    mr = ibv_reg_mr(a.pd, r, 4 * 4096, IBV_ACCESS_LOCAL_WRITE);
    assert_true(ms1 && ms2 && md && mr);
    fill(s1, 2 * 4096, 1);
    fill(s2, 3 * 4096, 2);
    memset(d, 0xee, 4 * 4096);
    memset(r, 0xdd, 4 * 4096);

    /* WRITE gathering three SGEs from two MRs into one remote range at an offset */
    sg[0] = sge(ms1, s1 + 100, 4096);
    sg[1] = sge(ms2, s2 + 7, 2 * 4096);
    sg[2] = sge(ms1, s1 + 5000, 123);
    memcpy(expect, s1 + 100, 4096);
    memcpy(expect + 4096, s2 + 7, 2 * 4096);
    memcpy(expect + 3 * 4096, s1 + 5000, 123);
    /* unsignalled first: no completion of its own */
    assert_int_equal(post(a.qp, IBV_WR_RDMA_WRITE, sg, 1, (uintptr_t)d + 64, md->rkey, 0, 1), 0);
    assert_cq_empty(a.cq);
    assert_int_equal(post(a.qp, IBV_WR_RDMA_WRITE, sg, 3, (uintptr_t)d + 64, md->rkey, IBV_SEND_SIGNALED, 2), 0);
    wc = poll1(a.cq);
    assert_int_equal(wc.status, IBV_WC_SUCCESS);
    assert_int_equal(wc.wr_id, 2);
    assert_int_equal(wc.opcode, IBV_WC_RDMA_WRITE);
    assert_int_equal(wc.qp_num, a.qp->qp_num);
    assert_cq_empty(a.cq);
    assert_true(all(d, 64, 0xee));
    assert_memory_equal(d + 64, expect, N);
    assert_true(all(d + 64 + N, 4 * 4096 - 64 - N, 0xee));

    /* READ scattering the remote range into two local SGEs */
    sg[0] = sge(mr, r + 10, 5000);
    sg[1] = sge(mr, r + 8192, N - 5000);
    assert_int_equal(post(a.qp, IBV_WR_RDMA_READ, sg, 2, (uintptr_t)d + 64, md->rkey, IBV_SEND_SIGNALED, 3), 0);
    wc = poll1(a.cq);
    assert_int_equal(wc.status, IBV_WC_SUCCESS);
    assert_int_equal(wc.opcode, IBV_WC_RDMA_READ);
    assert_int_equal(wc.byte_len, N);
    assert_memory_equal(r + 10, expect, 5000);
    assert_memory_equal(r + 8192, expect + 5000, N - 5000);
    assert_true(all(r, 10, 0xdd) && all(r + 5010, 8192 - 5010, 0xdd));
    assert_true(all(r + 8192 + N - 5000, 4 * 4096 - 8192 - (N - 5000), 0xdd));

    /* the other direction, b -> a, with iova-based keys: a's MR registered at iova 0x1000000 */
    {
        struct ibv_mr *mi = ibv_reg_mr_iova2(a.pd, r, 4 * 4096, 0x1000000, ALL_ACCESS);
        struct ibv_mr *mb = ibv_reg_mr(b.pd, d, 4 * 4096, IBV_ACCESS_LOCAL_WRITE);
        assert_true(mi && mb);
        fill(d, 4096, 9);
        sg[0] = sge(mb, d, 4096);
        assert_int_equal(post(b.qp, IBV_WR_RDMA_WRITE, sg, 1, 0x1000000 + 3 * 4096, mi->rkey,
                              IBV_SEND_SIGNALED, 4), 0);
        assert_int_equal(poll1(b.cq).status, IBV_WC_SUCCESS);
        assert_true(check(r + 3 * 4096, 4096, 9));
        /* the VA is not the iova: as an rkey address it is out of the MR */
        assert_int_equal(post(b.qp, IBV_WR_RDMA_WRITE, sg, 1, (uintptr_t)r, mi->rkey, IBV_SEND_SIGNALED, 5), 0);
        assert_int_equal(poll1(b.cq).status, IBV_WC_REM_ACCESS_ERR);
        assert_int_equal(ibv_dereg_mr(mi), 0);
        assert_int_equal(ibv_dereg_mr(mb), 0);
    }

    c1 = counters(-1);
    assert_int_equal(c1.bytes_moved - c0.bytes_moved, 4096 + N + N + 4096);
    assert_int_equal(c1.total_regs - c0.total_regs, 6);
    assert_int_equal(c1.live_mrs - c0.live_mrs, 4);
    assert_int_equal(counters(0).bytes_moved - c0d0.bytes_moved, 4096 + N + N);  /* per device */
    assert_int_equal(ibv_dereg_mr(ms1) | ibv_dereg_mr(ms2) | ibv_dereg_mr(md) | ibv_dereg_mr(mr), 0);
    assert_int_equal(counters(-1).live_mrs, c0.live_mrs);
    side_close(&a);
    side_close(&b);
    munmap(s1, 2 * 4096); munmap(s2, 3 * 4096); munmap(d, 4 * 4096); munmap(r, 4 * 4096);
    free(expect);
}

/* One faulty WRITE or READ against a fresh pair; returns its completion status after checking
 * that nothing moved and the QP is in error, with later WRs flushed. */
struct fault {
    int local_access, remote_access, remote_qp_access;
    int remote_other_pd, local_other_pd;
    int bad_lkey, bad_rkey;
    int64_t local_off, remote_off;  /* shift of the addresses (out of bounds) */
    uint32_t len;
    int read;
};

static enum ibv_wc_status run_fault(const struct fault *f)
{
    enum { L = 4096 };
    struct side a, b;
    struct ibv_pd *opd_a, *opd_b;
    struct ibv_mr *ml, *mr;
    struct ibv_sge sg;
    struct ibv_wc wc;
    enum ibv_wc_status st;
    unsigned char *lb = map_anon(2 * L), *rb = map_anon(2 * L);
    int moved;

    side_open(&a, 0);
    side_open(&b, ndevs > 1 ? 1 : 0);
    connect_qp(a.qp, b.qp->qp_num, ALL_ACCESS);
    connect_qp(b.qp, a.qp->qp_num, f->remote_qp_access ? f->remote_qp_access : ALL_ACCESS);
    opd_a = ibv_alloc_pd(a.ctx);
    opd_b = ibv_alloc_pd(b.ctx);
    ml = ibv_reg_mr(f->local_other_pd ? opd_a : a.pd, lb, L, f->local_access);
    mr = ibv_reg_mr(f->remote_other_pd ? opd_b : b.pd, rb, L, f->remote_access);
    assert_true(ml && mr);
    fill(lb, 2 * L, 3);
    fill(rb, 2 * L, 4);
    sg = sge(ml, lb + f->local_off, f->len);
    if (f->bad_lkey)
        sg.lkey ^= 0x5a5a00;
    assert_int_equal(post(a.qp, f->read ? IBV_WR_RDMA_READ : IBV_WR_RDMA_WRITE, &sg, 1,
                          (uintptr_t)rb + (uint64_t)f->remote_off, f->bad_rkey ? mr->rkey ^ 0x5a5a00 : mr->rkey,
                          IBV_SEND_SIGNALED, 7), 0);
    wc = poll1(a.cq);
    st = wc.status;
    assert_int_equal(wc.wr_id, 7);
    if (f->read)
        moved = !check(lb, 2 * L, 3);
    else
        moved = !check(rb, 2 * L, 4);
    if (st == IBV_WC_SUCCESS) {
        assert_true(moved); /* the control moved data */
        if (f->read)
            assert_memory_equal(lb + f->local_off, rb + f->remote_off, f->len);
        else
            assert_memory_equal(rb + f->remote_off, lb + f->local_off, f->len);
    } else {
        struct ibv_qp_attr qa;
        struct ibv_qp_init_attr qia;
        assert_false(moved);
        assert_int_equal(ibv_query_qp(a.qp, &qa, IBV_QP_STATE, &qia), 0);
        assert_int_equal(qa.qp_state, IBV_QPS_ERR);
        /* later WRs are flushed, even unsignalled ones */
        sg = sge(ml, lb, 16);
        assert_int_equal(post(a.qp, IBV_WR_RDMA_WRITE, &sg, 1, (uintptr_t)rb, mr->rkey, 0, 8), 0);
        wc = poll1(a.cq);
        assert_int_equal(wc.status, IBV_WC_WR_FLUSH_ERR);
        assert_int_equal(wc.wr_id, 8);
        assert_true(check(rb, 2 * L, 4));
    }
    assert_cq_empty(a.cq);
    assert_int_equal(ibv_dereg_mr(ml), 0);
    assert_int_equal(ibv_dereg_mr(mr), 0);
    assert_int_equal(ibv_dealloc_pd(opd_a), 0);
    assert_int_equal(ibv_dealloc_pd(opd_b), 0);
    side_close(&a);
    side_close(&b);
    munmap(lb, 2 * L);
    munmap(rb, 2 * L);
    return st;
}

static const struct fault good_write = { .local_access = IBV_ACCESS_LOCAL_WRITE, .remote_access = ALL_ACCESS,
                                         .len = 4096 };

static void test_bad_keys(void **state)
{
    struct fault f = good_write;
    struct loopnic_counters c0 = counters(-1);

    (void)state;
    NEED_LOOPNIC();
    assert_int_equal(run_fault(&f), IBV_WC_SUCCESS);
    f.bad_lkey = 1;
    assert_int_equal(run_fault(&f), IBV_WC_LOC_PROT_ERR);
    f = good_write;
    f.bad_rkey = 1;
    assert_int_equal(run_fault(&f), IBV_WC_REM_ACCESS_ERR);
    f.read = 1;
    assert_int_equal(run_fault(&f), IBV_WC_REM_ACCESS_ERR);
    assert_int_equal(counters(-1).prot_errors - c0.prot_errors, 3);
}

static void test_out_of_bounds(void **state)
{
    struct fault f = good_write;

    (void)state;
    NEED_LOOPNIC();
    f.len = 4000;
    f.local_off = 96;
    f.remote_off = 96;
    assert_int_equal(run_fault(&f), IBV_WC_SUCCESS);   /* control: ends on the last byte */
    f.local_off = 97;
    assert_int_equal(run_fault(&f), IBV_WC_LOC_PROT_ERR);
    f.local_off = 96;
    f.remote_off = 97;
    assert_int_equal(run_fault(&f), IBV_WC_REM_ACCESS_ERR);
    f.remote_off = -1;
    assert_int_equal(run_fault(&f), IBV_WC_REM_ACCESS_ERR);
    f.read = 1;
    f.remote_off = 97;
    assert_int_equal(run_fault(&f), IBV_WC_REM_ACCESS_ERR);
}

static void test_missing_access(void **state)
{
    struct fault f = good_write;

    (void)state;
    NEED_LOOPNIC();
    /* WRITE needs REMOTE_WRITE on the remote MR and on the remote QP */
    f.remote_access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ;
    assert_int_equal(run_fault(&f), IBV_WC_REM_ACCESS_ERR);
    f.remote_access = ALL_ACCESS;
    f.remote_qp_access = IBV_ACCESS_REMOTE_READ;
    assert_int_equal(run_fault(&f), IBV_WC_REM_ACCESS_ERR);
    /* READ needs REMOTE_READ remotely and LOCAL_WRITE on its destination */
    f = good_write;
    f.read = 1;
    f.local_access = IBV_ACCESS_LOCAL_WRITE;
    f.remote_access = IBV_ACCESS_REMOTE_READ;
    assert_int_equal(run_fault(&f), IBV_WC_SUCCESS);   /* control */
    f.remote_access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
    assert_int_equal(run_fault(&f), IBV_WC_REM_ACCESS_ERR);
    f.remote_access = IBV_ACCESS_REMOTE_READ;
    f.local_access = 0;
    assert_int_equal(run_fault(&f), IBV_WC_LOC_PROT_ERR);
    /* a WRITE's source needs no access bit */
    f = good_write;
    f.local_access = 0;
    assert_int_equal(run_fault(&f), IBV_WC_SUCCESS);
    /* REMOTE_WRITE without LOCAL_WRITE is refused at registration, as by the kernel */
    {
        struct side a;
        void *p = map_anon(4096);
        side_open(&a, 0);
        errno = 0;
        assert_null(ibv_reg_mr(a.pd, p, 4096, IBV_ACCESS_REMOTE_WRITE));
        assert_int_equal(errno, EINVAL);
        side_close(&a);
        munmap(p, 4096);
    }
}

static void test_wrong_pd(void **state)
{
    struct fault f = good_write;

    (void)state;
    NEED_LOOPNIC();
    f.remote_other_pd = 1;
    assert_int_equal(run_fault(&f), IBV_WC_REM_ACCESS_ERR);
    f = good_write;
    f.local_other_pd = 1;
    assert_int_equal(run_fault(&f), IBV_WC_LOC_PROT_ERR);
}

static void test_reg_unmapped_is_efault(void **state)
{
    struct side a;
    void *p = map_anon(3 * 4096);

    (void)state;
    NEED_LOOPNIC();
    side_open(&a, 0);
    munmap((char *)p + 4096, 4096);
    errno = 0;
    assert_null(ibv_reg_mr(a.pd, p, 3 * 4096, ALL_ACCESS));
    assert_int_equal(errno, EFAULT);
    errno = 0;
    assert_null(ibv_reg_mr(a.pd, p, 0, ALL_ACCESS));
    assert_int_equal(errno, EINVAL);
    side_close(&a);
    munmap(p, 3 * 4096);
}

/* Open fds of this process that are the memfd called @name. */
static int fds_of(const char *name)
{
    char path[64], link[256], want[128];
    int n = 0;

    snprintf(want, sizeof(want), "/memfd:%s (deleted)", name);
    for (int fd = 0; fd < 1024; fd++) {
        ssize_t l;
        snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
        l = readlink(path, link, sizeof(link) - 1);
        if (l <= 0)
            continue;
        link[l] = 0;
        n += !strcmp(link, want);
    }
    return n;
}

/* A dmabuf MR holds its dmabuf, as the kernel's does: the exporter's memory outlives the
 * caller's fd until the MR is deregistered (what keeps a freed GPU buffer allocated). */
static void test_dmabuf_mr_holds_its_dmabuf(void **state)
{
    struct side a, b;
    struct ibv_mr *m;
    int fd = memfd_create("loopnic-hold", MFD_CLOEXEC);
    unsigned char *buf;

    (void)state;
    NEED_LOOPNIC();
    assert_int_equal(ftruncate(fd, 4096), 0);
    buf = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    assert_true(buf != MAP_FAILED);
    pair_open(&a, &b);
    assert_int_equal(fds_of("loopnic-hold"), 1);
    m = ibv_reg_dmabuf_mr(a.pd, 0, 4096, (uintptr_t)buf, fd, ALL_ACCESS);
    assert_non_null(m);
    assert_int_equal(fds_of("loopnic-hold"), 2);
    close(fd);                                      /* the exporter's fd goes (drc closes its own) */
    assert_int_equal(fds_of("loopnic-hold"), 1);    /* the MR still holds the dmabuf */
    assert_int_equal(ibv_dereg_mr(m), 0);
    assert_int_equal(fds_of("loopnic-hold"), 0);    /* released with the MR */
    side_close(&a);
    side_close(&b);
    munmap(buf, 4096);
}

static void test_dmabuf(void **state)
{
    enum { SZ = 16 * 4096 };
    struct side a, b;
    struct ibv_mr *m0, *m1, *m2, *ms;
    struct ibv_sge sg;
    struct loopnic_counters c0 = counters(-1), c0d1 = counters(1), c;
    int fd = memfd_create("loopnic-dmabuf", MFD_CLOEXEC), fd2 = memfd_create("loopnic-dmabuf2", MFD_CLOEXEC);
    unsigned char *buf, *src = map_anon(4096);

    (void)state;
    NEED_LOOPNIC();
    assert_int_equal(ftruncate(fd, SZ), 0);
    assert_int_equal(ftruncate(fd2, SZ), 0);
    buf = mmap(NULL, SZ, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    assert_true(buf != MAP_FAILED);
    pair_open(&a, &b);

    /* offset + length past the dmabuf's size: EINVAL */
    errno = 0;
    assert_null(ibv_reg_dmabuf_mr(b.pd, 4096, SZ, (uintptr_t)buf + 4096, fd, ALL_ACCESS));
    assert_int_equal(errno, EINVAL);
    errno = 0;
    assert_null(ibv_reg_dmabuf_mr(b.pd, SZ + 4096, 4096, (uintptr_t)buf, fd, ALL_ACCESS));
    assert_int_equal(errno, EINVAL);
    errno = 0;
    assert_null(ibv_reg_dmabuf_mr(b.pd, 0, 4096, (uintptr_t)buf, -1, ALL_ACCESS));
    assert_true(errno == EBADF || errno == EINVAL);
    /* exactly to the end: fine; iova is the buffer's address, as drc passes it */
    m0 = ibv_reg_dmabuf_mr(b.pd, 4096, SZ - 4096, (uintptr_t)buf + 4096, fd, ALL_ACCESS);
    assert_non_null(m0);
    /* the same export on the other NIC, and a second export */
    m1 = ibv_reg_dmabuf_mr(a.pd, 0, SZ, (uintptr_t)buf, fd, ALL_ACCESS);
    assert_non_null(m1);
    m2 = ibv_reg_dmabuf_mr(a.pd, 0, SZ, (uintptr_t)buf, fd2, ALL_ACCESS);
    assert_non_null(m2);
    c = counters(-1);
    assert_int_equal(c.dmabuf_regs - c0.dmabuf_regs, 3);
    assert_int_equal(c.dmabuf_inodes - c0.dmabuf_inodes, 2);
    assert_int_equal(counters(1).dmabuf_regs - c0d1.dmabuf_regs, 1);

    /* data lands in the memory behind the dmabuf */
    ms = ibv_reg_mr(a.pd, src, 4096, IBV_ACCESS_LOCAL_WRITE);
    fill(src, 4096, 5);
    memset(buf, 0, SZ);
    sg = sge(ms, src, 4096);
    assert_int_equal(post(a.qp, IBV_WR_RDMA_WRITE, &sg, 1, (uintptr_t)buf + 8192 + 3, m0->rkey,
                          IBV_SEND_SIGNALED, 1), 0);
    assert_int_equal(poll1(a.cq).status, IBV_WC_SUCCESS);
    assert_true(check(buf + 8192 + 3, 4096, 5));
    assert_true(all(buf, 8192 + 3, 0));
    /* below the dmabuf MR's iova: out of bounds */
    assert_int_equal(post(a.qp, IBV_WR_RDMA_WRITE, &sg, 1, (uintptr_t)buf, m0->rkey, IBV_SEND_SIGNALED, 2), 0);
    assert_int_equal(poll1(a.cq).status, IBV_WC_REM_ACCESS_ERR);
    assert_true(all(buf, 4096, 0));

    assert_int_equal(ibv_dereg_mr(m0) | ibv_dereg_mr(m1) | ibv_dereg_mr(m2) | ibv_dereg_mr(ms), 0);
    side_close(&a);
    side_close(&b);
    munmap(buf, SZ);
    munmap(src, 4096);
    close(fd);
    close(fd2);
}

/* ibv_dereg_mr of an ibv_mr the provider did not hand out: a copy naming a live MR deregisters it
 * by handle (as the kernel would under rdma-core); anything else is EINVAL. */
static void test_dereg_foreign_mr(void **state)
{
    struct side a, b;
    struct ibv_mr *ml, *mr, copy, bogus;
    struct ibv_sge sg;
    struct loopnic_counters c0;
    unsigned char *p = map_anon(2 * 4096);

    (void)state;
    NEED_LOOPNIC();
    pair_open(&a, &b);
    ml = ibv_reg_mr(a.pd, p, 4096, ALL_ACCESS);
    mr = ibv_reg_mr(b.pd, p + 4096, 4096, ALL_ACCESS);
    sg = sge(ml, p, 4096);
    assert_int_equal(post(a.qp, IBV_WR_RDMA_WRITE, &sg, 1, (uintptr_t)p + 4096, mr->rkey, IBV_SEND_SIGNALED, 1), 0);
    assert_int_equal(poll1(a.cq).status, IBV_WC_SUCCESS);   /* control */
    c0 = counters(-1);
    bogus = *mr;
    bogus.lkey ^= 0x100000;
    assert_int_equal(ibv_dereg_mr(&bogus), EINVAL);
    copy = *mr;
    assert_int_equal(ibv_dereg_mr(&copy), 0);
    assert_int_equal(counters(-1).foreign_deregs - c0.foreign_deregs, 1);
    assert_int_equal(c0.live_mrs - counters(-1).live_mrs, 1);
    assert_int_equal(post(a.qp, IBV_WR_RDMA_WRITE, &sg, 1, (uintptr_t)p + 4096, mr->rkey, IBV_SEND_SIGNALED, 2), 0);
    assert_int_equal(poll1(a.cq).status, IBV_WC_REM_ACCESS_ERR); /* the key is gone */
    assert_int_equal(ibv_dereg_mr(mr), EINVAL);             /* the owner's pointer is dead now */
    assert_int_equal(ibv_dereg_mr(ml), 0);
    side_close(&a);
    side_close(&b);
    munmap(p, 2 * 4096);
}

static void test_dealloc_pd_busy(void **state)
{
    struct ibv_context *ctx;
    struct ibv_pd *pd;
    struct ibv_mr *mr;
    void *p = map_anon(4096);

    (void)state;
    NEED_LOOPNIC();
    ctx = ibv_open_device(devs[0]);
    pd = ibv_alloc_pd(ctx);
    mr = ibv_reg_mr(pd, p, 4096, ALL_ACCESS);
    assert_non_null(mr);
    assert_int_equal(ibv_dealloc_pd(pd), EBUSY);
    assert_int_equal(ibv_dereg_mr(mr), 0);
    assert_int_equal(ibv_dealloc_pd(pd), 0);
    assert_int_equal(ibv_close_device(ctx), 0);
    munmap(p, 4096);
}

/* Stale use: the MR's memory is freed and something else mapped at the same VA. */
static void test_stale_after_munmap_and_map_fixed(void **state)
{
    enum { L = 2 * 4096 };
    struct side a, b;
    struct ibv_mr *ml, *mr;
    struct ibv_sge sg;
    struct loopnic_counters c0;
    unsigned char *lb = map_anon(L), *rb = map_anon(L), *p;

    (void)state;
    NEED_LOOPNIC();
    pair_open(&a, &b);
    ml = ibv_reg_mr(a.pd, lb, L, ALL_ACCESS);
    mr = ibv_reg_mr(b.pd, rb, L, ALL_ACCESS);
    fill(lb, L, 6);
    sg = sge(ml, lb, L);
    /* control: before the munmap the WRITE lands */
    assert_int_equal(post(a.qp, IBV_WR_RDMA_WRITE, &sg, 1, (uintptr_t)rb, mr->rkey, IBV_SEND_SIGNALED, 1), 0);
    assert_int_equal(poll1(a.cq).status, IBV_WC_SUCCESS);
    assert_true(check(rb, L, 6));
    assert_int_equal(p_is_stale(mr), 0);

    c0 = counters(-1);
    assert_int_equal(munmap(rb, L), 0);
    p = mmap(rb, L, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    assert_ptr_equal(p, rb);
    memset(p, 0x5a, L);
    assert_int_equal(p_is_stale(mr), 1);
    assert_int_equal(post(a.qp, IBV_WR_RDMA_WRITE, &sg, 1, (uintptr_t)rb, mr->rkey, IBV_SEND_SIGNALED, 2), 0);
    assert_int_equal(poll1(a.cq).status, IBV_WC_REM_ACCESS_ERR);
    assert_true(all(p, L, 0x5a));        /* the new mapping is untouched */
    assert_int_equal(counters(-1).stale_uses - c0.stale_uses, 1);
    assert_int_equal(ibv_dereg_mr(mr), 0);
    assert_int_equal(ibv_dereg_mr(ml), 0);
    side_close(&a);
    side_close(&b);

    /* the local side: a WRITE's source remapped by mmap(MAP_FIXED) over it */
    pair_open(&a, &b);
    ml = ibv_reg_mr(a.pd, lb, L, ALL_ACCESS);
    mr = ibv_reg_mr(b.pd, rb, L, ALL_ACCESS);
    memset(rb, 0, L);
    assert_true(mmap(lb, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) == lb);
    sg = sge(ml, lb + 4096, 4096);         /* the page not remapped still works */
    fill(lb + 4096, 4096, 8);
    assert_int_equal(post(a.qp, IBV_WR_RDMA_WRITE, &sg, 1, (uintptr_t)rb, mr->rkey, IBV_SEND_SIGNALED, 3), 0);
    assert_int_equal(poll1(a.cq).status, IBV_WC_SUCCESS);
    assert_true(check(rb, 4096, 8));
    memset(rb, 0, L);
    sg = sge(ml, lb, L);
    assert_int_equal(post(a.qp, IBV_WR_RDMA_WRITE, &sg, 1, (uintptr_t)rb, mr->rkey, IBV_SEND_SIGNALED, 4), 0);
    assert_int_equal(poll1(a.cq).status, IBV_WC_LOC_PROT_ERR);
    assert_true(all(rb, L, 0));
    assert_int_equal(counters(-1).stale_uses - c0.stale_uses, 2);
    assert_int_equal(ibv_dereg_mr(mr) | ibv_dereg_mr(ml), 0);
    side_close(&a);
    side_close(&b);
    munmap(lb, L);
    munmap(rb, L);
}

static void test_stale_after_madvise_mremap_and_raw_munmap(void **state)
{
    enum { L = 4096 };
    struct side a, b;
    struct ibv_mr *ml, *m1, *m2, *m3;
    struct ibv_sge sg;
    struct loopnic_counters c0;
    unsigned char *src = map_anon(L), *r1 = map_anon(L), *r2 = map_anon(L), *r3 = map_anon(L), *moved;

    (void)state;
    NEED_LOOPNIC();
    pair_open(&a, &b);
    ml = ibv_reg_mr(a.pd, src, L, ALL_ACCESS);
    m1 = ibv_reg_mr(b.pd, r1, L, ALL_ACCESS);
    m2 = ibv_reg_mr(b.pd, r2, L, ALL_ACCESS);
    m3 = ibv_reg_mr(b.pd, r3, L, ALL_ACCESS);
    fill(src, L, 11);
    sg = sge(ml, src, L);
    c0 = counters(-1);

    assert_int_equal(madvise(r1, L, MADV_DONTNEED), 0);        /* pages discarded */
    assert_int_equal(post(a.qp, IBV_WR_RDMA_WRITE, &sg, 1, (uintptr_t)r1, m1->rkey, IBV_SEND_SIGNALED, 1), 0);
    assert_int_equal(poll1(a.cq).status, IBV_WC_REM_ACCESS_ERR);
    assert_true(all(r1, L, 0));

    reconnect(&a, &b);
    moved = mremap(r2, L, L, MREMAP_MAYMOVE | MREMAP_FIXED, r1);  /* r2's pages move to r1 */
    assert_ptr_equal(moved, r1);
    assert_int_equal(post(a.qp, IBV_WR_RDMA_WRITE, &sg, 1, (uintptr_t)r2, m2->rkey, IBV_SEND_SIGNALED, 2), 0);
    assert_int_equal(poll1(a.cq).status, IBV_WC_REM_ACCESS_ERR);
    assert_true(all(r1, L, 0));

    /* a munmap the provider does not see (a raw syscall, as glibc's free() makes internally):
     * the range is found unmapped at WR time */
    reconnect(&a, &b);
    assert_int_equal(syscall(SYS_munmap, r3, L), 0);
    assert_int_equal(post(a.qp, IBV_WR_RDMA_WRITE, &sg, 1, (uintptr_t)r3, m3->rkey, IBV_SEND_SIGNALED, 3), 0);
    assert_int_equal(poll1(a.cq).status, IBV_WC_REM_ACCESS_ERR);
    assert_int_equal(counters(-1).stale_uses - c0.stale_uses, 3);
    /* control: a fresh QP pair and an MR untouched by all this still work */
    reconnect(&a, &b);
    assert_int_equal(post(a.qp, IBV_WR_RDMA_WRITE, &sg, 1, (uintptr_t)src, ml->rkey, IBV_SEND_SIGNALED, 4), 0);
    assert_int_equal(poll1(a.cq).status, IBV_WC_REM_ACCESS_ERR); /* ml is a's, not b's: wrong PD */
    reconnect(&a, &b);
    {
        struct ibv_mr *m4 = ibv_reg_mr(b.pd, r1, L, ALL_ACCESS);
        assert_int_equal(post(a.qp, IBV_WR_RDMA_WRITE, &sg, 1, (uintptr_t)r1, m4->rkey, IBV_SEND_SIGNALED, 5), 0);
        assert_int_equal(poll1(a.cq).status, IBV_WC_SUCCESS);
        assert_true(check(r1, L, 11));
        assert_int_equal(ibv_dereg_mr(m4), 0);
    }
    assert_int_equal(ibv_dereg_mr(ml) | ibv_dereg_mr(m1) | ibv_dereg_mr(m2) | ibv_dereg_mr(m3), 0);
    side_close(&a);
    side_close(&b);
    munmap(src, L);
    munmap(r1, L);
}

/* LOOPNIC_PAGEMAP=1: a remap at the same VA that no interposer sees (raw syscalls) is caught by
 * the page frames. Needs the frames to be visible in /proc/self/pagemap (CAP_SYS_ADMIN). */
static int pfns_visible(void)
{
    volatile unsigned char *p = map_anon(4096);
    uint64_t e = 0;
    int fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);

    p[0] = 1;
    if (fd >= 0 && pread(fd, &e, sizeof(e), (off_t)((uintptr_t)p / 4096 * 8)) != (ssize_t)sizeof(e))
        e = 0;
    if (fd >= 0)
        close(fd);
    munmap((void *)p, 4096);
    return (e >> 63) && (e & ((1ull << 55) - 1));
}

static void raw_remap(void *p, size_t n, unsigned char v)
{
    assert_int_equal(syscall(SYS_munmap, p, n), 0);
    assert_true((void *)syscall(SYS_mmap, p, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED,
                                -1, 0) == p);
    memset(p, v, n);
}

static void test_stale_unseen_remap_with_pagemap(void **state)
{
    enum { L = 2 * 4096 };
    struct side a, b;
    struct ibv_mr *ml, *mr;
    struct ibv_sge sg;
    struct loopnic_counters c0;
    unsigned char *src = map_anon(L), *r = map_anon(L);

    (void)state;
    NEED_LOOPNIC();
    if (!pfns_visible())
        skip();
    pair_open(&a, &b);
    fill(src, L, 15);
    /* control, without LOOPNIC_PAGEMAP: the unseen remap goes unnoticed and the WRITE lands in
     * the new mapping (the limit the page-frame check lifts) */
    unsetenv("LOOPNIC_PAGEMAP");
    ml = ibv_reg_mr(a.pd, src, L, ALL_ACCESS);
    mr = ibv_reg_mr(b.pd, r, L, ALL_ACCESS);
    sg = sge(ml, src, L);
    raw_remap(r, L, 0x5a);
    c0 = counters(-1);
    assert_int_equal(post(a.qp, IBV_WR_RDMA_WRITE, &sg, 1, (uintptr_t)r, mr->rkey, IBV_SEND_SIGNALED, 1), 0);
    assert_int_equal(poll1(a.cq).status, IBV_WC_SUCCESS);
    assert_true(check(r, L, 15));
    assert_int_equal(ibv_dereg_mr(mr) | ibv_dereg_mr(ml), 0);

    setenv("LOOPNIC_PAGEMAP", "1", 1);
    ml = ibv_reg_mr(a.pd, src, L, ALL_ACCESS);
    mr = ibv_reg_mr(b.pd, r, L, ALL_ACCESS);
    sg = sge(ml, src, L);
    memset(r, 0, L);
    assert_int_equal(post(a.qp, IBV_WR_RDMA_WRITE, &sg, 1, (uintptr_t)r, mr->rkey, IBV_SEND_SIGNALED, 2), 0);
    assert_int_equal(poll1(a.cq).status, IBV_WC_SUCCESS);    /* control: same pages, it lands */
    assert_true(check(r, L, 15));
    raw_remap(r, L, 0x5a);
    assert_int_equal(post(a.qp, IBV_WR_RDMA_WRITE, &sg, 1, (uintptr_t)r, mr->rkey, IBV_SEND_SIGNALED, 3), 0);
    assert_int_equal(poll1(a.cq).status, IBV_WC_REM_ACCESS_ERR);
    assert_true(all(r, L, 0x5a));
    assert_int_equal(counters(-1).stale_uses - c0.stale_uses, 1);
    assert_int_equal(ibv_dereg_mr(mr), 0);
    /* the local side */
    reconnect(&a, &b);
    mr = ibv_reg_mr(b.pd, r, L, ALL_ACCESS);
    raw_remap(src, L, 0x77);
    assert_int_equal(post(a.qp, IBV_WR_RDMA_WRITE, &sg, 1, (uintptr_t)r, mr->rkey, IBV_SEND_SIGNALED, 4), 0);
    assert_int_equal(poll1(a.cq).status, IBV_WC_LOC_PROT_ERR);
    assert_true(all(r, L, 0x5a));
    assert_int_equal(counters(-1).stale_uses - c0.stale_uses, 2);
    unsetenv("LOOPNIC_PAGEMAP");
    assert_int_equal(ibv_dereg_mr(mr) | ibv_dereg_mr(ml), 0);
    side_close(&a);
    side_close(&b);
    munmap(src, L);
    munmap(r, L);
}

static void test_failure_injection(void **state)
{
    struct side a, b;
    struct ibv_mr *m[3], *ms, *md;
    struct ibv_sge sg;
    struct loopnic_counters c0 = counters(-1);
    unsigned char *p = map_anon(4 * 4096);
    int fd = memfd_create("loopnic-fail", MFD_CLOEXEC);

    (void)state;
    NEED_LOOPNIC();
    assert_int_equal(ftruncate(fd, 4096), 0);
    pair_open(&a, &b);
    p_fail_reg(2, 0);                  /* the second ibv_reg_mr* from now */
    m[0] = ibv_reg_mr(a.pd, p, 4096, ALL_ACCESS);
    errno = 0;
    m[1] = ibv_reg_mr_iova2(a.pd, p, 4096, (uintptr_t)p, ALL_ACCESS);
    assert_null(m[1]);
    assert_int_equal(errno, ENOMEM);
    m[2] = ibv_reg_mr(a.pd, p, 4096, ALL_ACCESS);
    assert_true(m[0] && m[2]);
    p_fail_dmabuf(1, EFAULT);
    errno = 0;
    assert_null(ibv_reg_dmabuf_mr(a.pd, 0, 4096, (uintptr_t)p, fd, ALL_ACCESS));
    assert_int_equal(errno, EFAULT);
    m[1] = ibv_reg_dmabuf_mr(a.pd, 0, 4096, (uintptr_t)p, fd, ALL_ACCESS);
    assert_non_null(m[1]);
    assert_int_equal(counters(-1).reg_failures - c0.reg_failures, 2);

    ms = ibv_reg_mr(a.pd, p + 4096, 4096, ALL_ACCESS);
    md = ibv_reg_mr(b.pd, p + 8192, 8192, ALL_ACCESS);
    fill(p + 4096, 4096, 12);
    memset(p + 8192, 0, 8192);
    sg = sge(ms, p + 4096, 4096);
    p_fail_wr(2, IBV_WC_REM_OP_ERR);   /* the second WR from now */
    assert_int_equal(post(a.qp, IBV_WR_RDMA_WRITE, &sg, 1, (uintptr_t)p + 8192, md->rkey, IBV_SEND_SIGNALED, 1), 0);
    assert_int_equal(poll1(a.cq).status, IBV_WC_SUCCESS);
    assert_true(check(p + 8192, 4096, 12));
    assert_int_equal(post(a.qp, IBV_WR_RDMA_WRITE, &sg, 1, (uintptr_t)p + 12288, md->rkey, IBV_SEND_SIGNALED, 2), 0);
    assert_int_equal(poll1(a.cq).status, IBV_WC_REM_OP_ERR);
    assert_true(all(p + 12288, 4096, 0));
    assert_int_equal(a.qp->state, IBV_QPS_ERR);
    {   /* reset: everything but the live MRs back to zero */
        struct loopnic_counters c;
        uint64_t live = counters(-1).live_mrs;
        p_reset();
        c = counters(-1);
        assert_int_equal(c.live_mrs, live);
        assert_int_equal(c.total_regs + c.dmabuf_regs + c.dmabuf_inodes + c.reg_failures + c.wrs + c.wr_errors +
                         c.bytes_moved + c.stale_uses + c.prot_errors + c.deregs, 0);
    }
    for (int i = 0; i < 3; i++)
        assert_int_equal(ibv_dereg_mr(m[i]), 0);
    assert_int_equal(ibv_dereg_mr(ms) | ibv_dereg_mr(md), 0);
    side_close(&a);
    side_close(&b);
    munmap(p, 4 * 4096);
    close(fd);
}

static void test_completion_channel_events(void **state)
{
    struct side a, b;
    struct ibv_comp_channel *ch;
    struct ibv_cq *cq, *ev_cq = NULL;
    struct ibv_qp *qp;
    struct ibv_qp_init_attr ia;
    struct ibv_mr *ml, *mr;
    struct ibv_sge sg;
    struct pollfd pf;
    void *ev_ctx = NULL;
    int tag;
    unsigned char *p = map_anon(2 * 4096);

    (void)state;
    NEED_LOOPNIC();
    pair_open(&a, &b);
    ch = ibv_create_comp_channel(a.ctx);
    cq = ibv_create_cq(a.ctx, 4, &tag, ch, 0);
    memset(&ia, 0, sizeof(ia));
    ia.send_cq = ia.recv_cq = cq;
    ia.qp_type = IBV_QPT_RC;
    ia.cap.max_send_wr = 4;
    ia.cap.max_send_sge = 1;
    qp = ibv_create_qp(a.pd, &ia);
    assert_non_null(qp);
    /* re-point b's QP at this one */
    {
        struct ibv_qp_attr qa;
        memset(&qa, 0, sizeof(qa));
        qa.qp_state = IBV_QPS_RESET;
        assert_int_equal(ibv_modify_qp(b.qp, &qa, IBV_QP_STATE), 0);
        connect_qp(b.qp, qp->qp_num, ALL_ACCESS);
        connect_qp(qp, b.qp->qp_num, ALL_ACCESS);
    }
    ml = ibv_reg_mr(a.pd, p, 4096, ALL_ACCESS);
    mr = ibv_reg_mr(b.pd, p + 4096, 4096, ALL_ACCESS);
    sg = sge(ml, p, 64);
    assert_int_equal(ibv_req_notify_cq(cq, 0), 0);
    pf.fd = ch->fd;
    pf.events = POLLIN;
    assert_int_equal(poll(&pf, 1, 0), 0);
    assert_int_equal(post(qp, IBV_WR_RDMA_WRITE, &sg, 1, (uintptr_t)p + 4096, mr->rkey, IBV_SEND_SIGNALED, 1), 0);
    assert_int_equal(poll(&pf, 1, 1000), 1);
    assert_int_equal(ibv_get_cq_event(ch, &ev_cq, &ev_ctx), 0);
    assert_ptr_equal(ev_cq, cq);
    assert_ptr_equal(ev_ctx, &tag);
    ibv_ack_cq_events(ev_cq, 1);
    assert_int_equal(poll(&pf, 1, 0), 0);
    assert_int_equal(poll1(cq).status, IBV_WC_SUCCESS);
    /* not armed again: the next completion raises no event */
    assert_int_equal(post(qp, IBV_WR_RDMA_WRITE, &sg, 1, (uintptr_t)p + 4096, mr->rkey, IBV_SEND_SIGNALED, 2), 0);
    assert_int_equal(poll(&pf, 1, 0), 0);
    assert_int_equal(poll1(cq).status, IBV_WC_SUCCESS);
    assert_int_equal(ibv_dereg_mr(ml) | ibv_dereg_mr(mr), 0);
    assert_int_equal(ibv_destroy_qp(qp), 0);
    assert_int_equal(ibv_destroy_cq(cq), 0);
    assert_int_equal(ibv_destroy_comp_channel(ch), 0);
    side_close(&a);
    side_close(&b);
    munmap(p, 2 * 4096);
}

static void test_async_events(void **state)
{
    struct side a;
    struct ibv_async_event ev;
    struct pollfd pf;

    (void)state;
    NEED_LOOPNIC();
    side_open(&a, 0);
    pf.fd = a.ctx->async_fd;
    pf.events = POLLIN;
    assert_int_equal(poll(&pf, 1, 0), 0);
    assert_int_equal(p_raise(a.ctx, IBV_EVENT_PORT_ACTIVE, (void *)(uintptr_t)1), 0);
    assert_int_equal(p_raise(a.ctx, IBV_EVENT_QP_FATAL, a.qp), 0);
    assert_int_equal(poll(&pf, 1, 1000), 1);
    assert_int_equal(ibv_get_async_event(a.ctx, &ev), 0);
    assert_int_equal(ev.event_type, IBV_EVENT_PORT_ACTIVE);
    assert_int_equal(ev.element.port_num, 1);
    ibv_ack_async_event(&ev);
    assert_int_equal(ibv_get_async_event(a.ctx, &ev), 0);
    assert_int_equal(ev.event_type, IBV_EVENT_QP_FATAL);
    assert_ptr_equal(ev.element.qp, a.qp);
    ibv_ack_async_event(&ev);
    assert_int_equal(poll(&pf, 1, 0), 0);
    side_close(&a);
}

static void test_write_with_imm(void **state)
{
    struct side a, b;
    struct ibv_mr *ml, *mr;
    struct ibv_sge sg;
    struct ibv_recv_wr rwr, *bad;
    struct ibv_send_wr wr, *sbad;
    struct ibv_wc wc;
    unsigned char *p = map_anon(2 * 4096);

    (void)state;
    NEED_LOOPNIC();
    pair_open(&a, &b);
    ml = ibv_reg_mr(a.pd, p, 4096, ALL_ACCESS);
    mr = ibv_reg_mr(b.pd, p + 4096, 4096, ALL_ACCESS);
    fill(p, 4096, 13);
    memset(&rwr, 0, sizeof(rwr));
    rwr.wr_id = 77;
    assert_int_equal(ibv_post_recv(b.qp, &rwr, &bad), 0);
    sg = sge(ml, p, 100);
    memset(&wr, 0, sizeof(wr));
    wr.wr_id = 5;
    wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
    wr.sg_list = &sg;
    wr.num_sge = 1;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.imm_data = htobe32(0xabcd);
    wr.wr.rdma.remote_addr = (uintptr_t)p + 4096;
    wr.wr.rdma.rkey = mr->rkey;
    assert_int_equal(ibv_post_send(a.qp, &wr, &sbad), 0);
    assert_int_equal(poll1(a.cq).status, IBV_WC_SUCCESS);
    wc = poll1(b.cq);
    assert_int_equal(wc.status, IBV_WC_SUCCESS);
    assert_int_equal(wc.opcode, IBV_WC_RECV_RDMA_WITH_IMM);
    assert_int_equal(wc.wr_id, 77);
    assert_int_equal(be32toh(wc.imm_data), 0xabcd);
    assert_int_equal(wc.byte_len, 100);
    assert_memory_equal(p + 4096, p, 100);
    /* no receive posted, rnr_retry 7: the responder NAKs and the requester retries for ever... */
    assert_int_equal(ibv_post_send(a.qp, &wr, &sbad), 0);
    assert_cq_empty(a.cq);
    assert_cq_empty(b.cq);
    /* ... until a receive is posted: then the WR completes, on both sides */
    rwr.wr_id = 78;
    assert_int_equal(ibv_post_recv(b.qp, &rwr, &bad), 0);
    assert_int_equal(poll1(a.cq).status, IBV_WC_SUCCESS);
    wc = poll1(b.cq);
    assert_int_equal(wc.status, IBV_WC_SUCCESS);
    assert_int_equal(wc.wr_id, 78);
    /* rnr_retry 0: the first RNR NAK fails the WR */
    {
        struct ibv_qp_attr qa;
        memset(&qa, 0, sizeof(qa));
        qa.qp_state = IBV_QPS_RESET;
        assert_int_equal(ibv_modify_qp(a.qp, &qa, IBV_QP_STATE), 0);
        assert_int_equal(to_init(a.qp, ALL_ACCESS), 0);
        assert_int_equal(to_rtr(a.qp, b.qp->qp_num, 0), 0);
        assert_int_equal(to_rts_rnr(a.qp, 0), 0);
    }
    assert_int_equal(ibv_post_send(a.qp, &wr, &sbad), 0);
    assert_int_equal(poll1(a.cq).status, IBV_WC_RNR_RETRY_EXC_ERR);
    assert_int_equal(ibv_dereg_mr(ml) | ibv_dereg_mr(mr), 0);
    side_close(&a);
    side_close(&b);
    munmap(p, 2 * 4096);
}

static int post_recv1(struct ibv_qp *qp, struct ibv_sge *sg, int n, uint64_t id)
{
    struct ibv_recv_wr wr, *bad = NULL;

    memset(&wr, 0, sizeof(wr));
    wr.wr_id = id;
    wr.sg_list = sg;
    wr.num_sge = n;
    return ibv_post_recv(qp, &wr, &bad);
}

/* SEND and SEND_WITH_IMM land in the posted receive, scattered over its SGEs; the receive
 * completion carries what a NIC gives: byte_len, imm_data and IBV_WC_WITH_IMM, the QP numbers. */
static void test_send_into_posted_receive(void **state)
{
    struct side a, b;
    struct ibv_mr *ml, *mr;
    struct ibv_sge sg, rsg[2];
    struct ibv_send_wr wr, *bad;
    struct ibv_wc wc;
    unsigned char *p = map_anon(2 * 4096);

    (void)state;
    NEED_LOOPNIC();
    pair_open(&a, &b);
    ml = ibv_reg_mr(a.pd, p, 4096, ALL_ACCESS);
    mr = ibv_reg_mr(b.pd, p + 4096, 4096, IBV_ACCESS_LOCAL_WRITE);
    fill(p, 4096, 21);
    rsg[0] = sge(mr, p + 4096, 100);
    rsg[1] = sge(mr, p + 8192 - 1000, 1000);
    assert_int_equal(post_recv1(b.qp, rsg, 2, 41), 0);
    sg = sge(ml, p, 300);
    assert_int_equal(post(a.qp, IBV_WR_SEND, &sg, 1, 0, 0, IBV_SEND_SIGNALED, 1), 0);
    wc = poll1(a.cq);
    assert_int_equal(wc.status, IBV_WC_SUCCESS);
    assert_int_equal(wc.opcode, IBV_WC_SEND);
    wc = poll1(b.cq);
    assert_int_equal(wc.status, IBV_WC_SUCCESS);
    assert_int_equal(wc.opcode, IBV_WC_RECV);
    assert_int_equal(wc.wr_id, 41);
    assert_int_equal(wc.byte_len, 300);
    assert_int_equal(wc.wc_flags & IBV_WC_WITH_IMM, 0);
    assert_int_equal(wc.qp_num, b.qp->qp_num);
    assert_int_equal(wc.src_qp, a.qp->qp_num);
    assert_memory_equal(p + 4096, p, 100);
    assert_memory_equal(p + 8192 - 1000, p + 100, 200);
    /* with immediate; inline (no lkey needed) */
    assert_int_equal(post_recv1(b.qp, rsg, 1, 42), 0);
    {
        struct ibv_sge isg = { (uintptr_t)p + 500, 64, 0 };
        memset(&wr, 0, sizeof(wr));
        wr.wr_id = 2;
        wr.opcode = IBV_WR_SEND_WITH_IMM;
        wr.sg_list = &isg;
        wr.num_sge = 1;
        wr.send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
        wr.imm_data = htobe32(0x1234);
        assert_int_equal(ibv_post_send(a.qp, &wr, &bad), 0);
    }
    assert_int_equal(poll1(a.cq).status, IBV_WC_SUCCESS);
    wc = poll1(b.cq);
    assert_int_equal(wc.status, IBV_WC_SUCCESS);
    assert_int_equal(wc.wr_id, 42);
    assert_int_equal(wc.byte_len, 64);
    assert_true(wc.wc_flags & IBV_WC_WITH_IMM);
    assert_int_equal(be32toh(wc.imm_data), 0x1234);
    assert_memory_equal(p + 4096, p + 500, 64);
    /* a receive too small: the responder's completion says so, the requester's says it was refused */
    assert_int_equal(post_recv1(b.qp, rsg, 1, 43), 0);
    sg = sge(ml, p, 101);
    assert_int_equal(post(a.qp, IBV_WR_SEND, &sg, 1, 0, 0, IBV_SEND_SIGNALED, 3), 0);
    assert_int_equal(poll1(a.cq).status, IBV_WC_REM_INV_REQ_ERR);
    wc = poll1(b.cq);
    assert_int_equal(wc.status, IBV_WC_LOC_LEN_ERR);
    assert_int_equal(wc.wr_id, 43);
    /* a receive without LOCAL_WRITE on its MR: a protection error at the responder */
    reconnect(&a, &b);
    {
        struct ibv_mr *ro = ibv_reg_mr(b.pd, p + 4096, 4096, 0);
        struct ibv_sge rosg = sge(ro, p + 4096, 4096);
        assert_non_null(ro);
        assert_int_equal(post_recv1(b.qp, &rosg, 1, 44), 0);
        sg = sge(ml, p, 10);
        assert_int_equal(post(a.qp, IBV_WR_SEND, &sg, 1, 0, 0, IBV_SEND_SIGNALED, 4), 0);
        assert_int_equal(poll1(a.cq).status, IBV_WC_REM_OP_ERR);
        assert_int_equal(poll1(b.cq).status, IBV_WC_LOC_PROT_ERR);
        assert_int_equal(ibv_dereg_mr(ro), 0);
    }
    /* the QP in error flushes what is posted to it */
    assert_int_equal(post_recv1(b.qp, rsg, 1, 45), 0);
    wc = poll1(b.cq);
    assert_int_equal(wc.status, IBV_WC_WR_FLUSH_ERR);
    assert_int_equal(wc.wr_id, 45);
    assert_int_equal(ibv_dereg_mr(ml) | ibv_dereg_mr(mr), 0);
    side_close(&a);
    side_close(&b);
    munmap(p, 2 * 4096);
}

/* Two QPs take their receives from one SRQ; a QP on an SRQ has no receive queue of its own. */
static void test_srq(void **state)
{
    struct side a, b;
    struct ibv_srq_init_attr sia;
    struct ibv_qp_init_attr ia;
    struct ibv_srq *srq;
    struct ibv_qp *b1, *b2, *a1, *a2;
    struct ibv_mr *ml, *mr;
    struct ibv_sge sg, rsg;
    struct ibv_recv_wr rwr, *rbad;
    struct ibv_wc wc;
    unsigned char *p = map_anon(2 * 4096);

    (void)state;
    NEED_LOOPNIC();
    side_open(&a, 0);
    side_open(&b, ndevs > 1 ? 1 : 0);
    memset(&sia, 0, sizeof(sia));
    sia.attr.max_wr = 4;
    sia.attr.max_sge = 1;
    srq = ibv_create_srq(b.pd, &sia);
    assert_non_null(srq);
    memset(&ia, 0, sizeof(ia));
    ia.send_cq = ia.recv_cq = b.cq;
    ia.srq = srq;
    ia.qp_type = IBV_QPT_RC;
    ia.cap.max_send_wr = 4;
    ia.cap.max_send_sge = 1;
    b1 = ibv_create_qp(b.pd, &ia);
    b2 = ibv_create_qp(b.pd, &ia);
    memset(&ia, 0, sizeof(ia));
    ia.send_cq = ia.recv_cq = a.cq;
    ia.qp_type = IBV_QPT_RC;
    ia.cap.max_send_wr = ia.cap.max_recv_wr = 4;
    ia.cap.max_send_sge = ia.cap.max_recv_sge = 1;
    a1 = ibv_create_qp(a.pd, &ia);
    a2 = ibv_create_qp(a.pd, &ia);
    assert_non_null(a1);
    assert_non_null(b1);
    assert_non_null(b2);
    assert_non_null(a2);
    connect_qp(a1, b1->qp_num, ALL_ACCESS);
    connect_qp(b1, a1->qp_num, ALL_ACCESS);
    connect_qp(a2, b2->qp_num, ALL_ACCESS);
    connect_qp(b2, a2->qp_num, ALL_ACCESS);
    ml = ibv_reg_mr(a.pd, p, 4096, ALL_ACCESS);
    mr = ibv_reg_mr(b.pd, p + 4096, 4096, ALL_ACCESS);
    fill(p, 4096, 5);
    rsg = sge(mr, p + 4096, 64);
    assert_int_equal(post_recv1(b1, &rsg, 1, 9), EINVAL); /* no RQ of its own */
    memset(&rwr, 0, sizeof(rwr));
    rwr.wr_id = 90;
    rwr.sg_list = &rsg;
    rwr.num_sge = 1;
    assert_int_equal(ibv_post_srq_recv(srq, &rwr, &rbad), 0);
    rwr.wr_id = 91;
    assert_int_equal(ibv_post_srq_recv(srq, &rwr, &rbad), 0);
    sg = sge(ml, p, 64);
    assert_int_equal(post(a2, IBV_WR_SEND, &sg, 1, 0, 0, IBV_SEND_SIGNALED, 1), 0);
    assert_int_equal(poll1(a.cq).status, IBV_WC_SUCCESS);
    wc = poll1(b.cq);
    assert_int_equal(wc.status, IBV_WC_SUCCESS);
    assert_int_equal(wc.wr_id, 90);
    assert_int_equal(wc.qp_num, b2->qp_num); /* the QP the message came in on */
    assert_int_equal(post(a1, IBV_WR_SEND, &sg, 1, 0, 0, IBV_SEND_SIGNALED, 2), 0);
    assert_int_equal(poll1(a.cq).status, IBV_WC_SUCCESS);
    wc = poll1(b.cq);
    assert_int_equal(wc.wr_id, 91);
    assert_int_equal(wc.qp_num, b1->qp_num);
    assert_memory_equal(p + 4096, p, 64);
    assert_int_equal(ibv_destroy_srq(srq), EBUSY); /* QPs still on it */
    assert_int_equal(ibv_destroy_qp(b1) | ibv_destroy_qp(b2) | ibv_destroy_qp(a1) | ibv_destroy_qp(a2), 0);
    assert_int_equal(ibv_destroy_srq(srq), 0);
    assert_int_equal(ibv_dereg_mr(ml) | ibv_dereg_mr(mr), 0);
    side_close(&a);
    side_close(&b);
    munmap(p, 2 * 4096);
}

/* FETCH_AND_ADD and CMP_AND_SWP: 8 bytes, 8-aligned, REMOTE_ATOMIC on the MR and the QP; the old
 * value lands in the local buffer. */
static void test_atomics(void **state)
{
    struct side a, b;
    struct ibv_mr *ml, *mr, *mr_noatomic;
    struct ibv_sge sg;
    struct ibv_send_wr wr, *bad;
    struct ibv_wc wc;
    int access = ALL_ACCESS | IBV_ACCESS_REMOTE_ATOMIC;
    uint64_t *p = map_anon(2 * 4096), *remote = p + 512;

    (void)state;
    NEED_LOOPNIC();
    side_open(&a, 0);
    side_open(&b, ndevs > 1 ? 1 : 0);
    connect_qp(a.qp, b.qp->qp_num, access);
    connect_qp(b.qp, a.qp->qp_num, access);
    ml = ibv_reg_mr(a.pd, p, 4096, access);
    mr = ibv_reg_mr(b.pd, remote, 4096, access);
    mr_noatomic = ibv_reg_mr(b.pd, remote, 4096, ALL_ACCESS);
    remote[0] = 40;
    p[0] = 0;
    sg = sge(ml, p, 8);
    memset(&wr, 0, sizeof(wr));
    wr.wr_id = 1;
    wr.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
    wr.sg_list = &sg;
    wr.num_sge = 1;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.atomic.remote_addr = (uintptr_t)remote;
    wr.wr.atomic.rkey = mr->rkey;
    wr.wr.atomic.compare_add = 2;
    assert_int_equal(ibv_post_send(a.qp, &wr, &bad), 0);
    wc = poll1(a.cq);
    assert_int_equal(wc.status, IBV_WC_SUCCESS);
    assert_int_equal(wc.opcode, IBV_WC_FETCH_ADD);
    assert_int_equal(wc.byte_len, 8);
    assert_int_equal(p[0], 40);
    assert_int_equal(remote[0], 42);
    /* compare and swap: equal swaps, different does not; the old value comes back either way */
    wr.opcode = IBV_WR_ATOMIC_CMP_AND_SWP;
    wr.wr.atomic.compare_add = 42;
    wr.wr.atomic.swap = 7;
    assert_int_equal(ibv_post_send(a.qp, &wr, &bad), 0);
    assert_int_equal(poll1(a.cq).opcode, IBV_WC_COMP_SWAP);
    assert_int_equal(p[0], 42);
    assert_int_equal(remote[0], 7);
    assert_int_equal(ibv_post_send(a.qp, &wr, &bad), 0);
    assert_int_equal(poll1(a.cq).status, IBV_WC_SUCCESS);
    assert_int_equal(p[0], 7);
    assert_int_equal(remote[0], 7);
    /* misaligned: the responder refuses the request */
    wr.wr.atomic.remote_addr = (uintptr_t)remote + 4;
    assert_int_equal(ibv_post_send(a.qp, &wr, &bad), 0);
    assert_int_equal(poll1(a.cq).status, IBV_WC_REM_INV_REQ_ERR);
    {
        struct ibv_qp_attr qa;
        memset(&qa, 0, sizeof(qa));
        qa.qp_state = IBV_QPS_RESET;
        assert_int_equal(ibv_modify_qp(a.qp, &qa, IBV_QP_STATE), 0);
        connect_qp(a.qp, b.qp->qp_num, access);
    }
    /* an MR without REMOTE_ATOMIC */
    wr.wr.atomic.remote_addr = (uintptr_t)remote;
    wr.wr.atomic.rkey = mr_noatomic->rkey;
    assert_int_equal(ibv_post_send(a.qp, &wr, &bad), 0);
    assert_int_equal(poll1(a.cq).status, IBV_WC_REM_ACCESS_ERR);
    assert_int_equal(remote[0], 7);
    assert_int_equal(ibv_dereg_mr(ml) | ibv_dereg_mr(mr) | ibv_dereg_mr(mr_noatomic), 0);
    side_close(&a);
    side_close(&b);
    munmap(p, 2 * 4096);
}

static void test_cq_overrun_raises_cq_err(void **state)
{
    struct side a, b;
    struct ibv_cq *small;
    struct ibv_qp *qp;
    struct ibv_qp_init_attr ia;
    struct ibv_mr *ml, *mr;
    struct ibv_sge sg;
    struct ibv_async_event ev;
    struct ibv_wc wc[4];
    unsigned char *p = map_anon(2 * 4096);

    (void)state;
    NEED_LOOPNIC();
    pair_open(&a, &b);
    small = ibv_create_cq(a.ctx, 2, NULL, NULL, 0);
    memset(&ia, 0, sizeof(ia));
    ia.send_cq = ia.recv_cq = small;
    ia.qp_type = IBV_QPT_RC;
    ia.cap.max_send_wr = 8;
    ia.cap.max_send_sge = 1;
    qp = ibv_create_qp(a.pd, &ia);
    assert_non_null(qp);
    {
        struct ibv_qp_attr qa;
        memset(&qa, 0, sizeof(qa));
        qa.qp_state = IBV_QPS_RESET;
        assert_int_equal(ibv_modify_qp(b.qp, &qa, IBV_QP_STATE), 0);
        connect_qp(b.qp, qp->qp_num, ALL_ACCESS);
        connect_qp(qp, b.qp->qp_num, ALL_ACCESS);
    }
    ml = ibv_reg_mr(a.pd, p, 4096, ALL_ACCESS);
    mr = ibv_reg_mr(b.pd, p + 4096, 4096, ALL_ACCESS);
    sg = sge(ml, p, 8);
    for (int i = 0; i < 3; i++)
        assert_int_equal(post(qp, IBV_WR_RDMA_WRITE, &sg, 1, (uintptr_t)p + 4096, mr->rkey, IBV_SEND_SIGNALED,
                              (uint64_t)i), 0);
    assert_int_equal(ibv_poll_cq(small, 4, wc), 2);  /* the third did not fit */
    assert_int_equal(ibv_get_async_event(a.ctx, &ev), 0);
    assert_int_equal(ev.event_type, IBV_EVENT_CQ_ERR);
    assert_ptr_equal(ev.element.cq, small);
    ibv_ack_async_event(&ev);
    assert_int_equal(ibv_dereg_mr(ml) | ibv_dereg_mr(mr), 0);
    assert_int_equal(ibv_destroy_qp(qp), 0);
    assert_int_equal(ibv_destroy_cq(small), 0);
    side_close(&a);
    side_close(&b);
    munmap(p, 2 * 4096);
}

/* Threads posting on their own QPs while another maps, unmaps and discards memory (the
 * interposers) and registers and deregisters: every byte arrives, nothing deadlocks. */
enum { THREADS = 3, ROUNDS = 300 };
static atomic_int churn_stop;

static void *churn(void *arg)
{
    struct side *s = arg;
    while (!atomic_load(&churn_stop)) {
        void *p = mmap(NULL, 8 * 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        struct ibv_mr *mr;
        memset(p, 1, 8 * 4096);
        mr = ibv_reg_mr(s->pd, p, 8 * 4096, ALL_ACCESS);
        madvise(p, 4096, MADV_DONTNEED);
        if (mr)
            ibv_dereg_mr(mr);
        munmap(p, 8 * 4096);
        free(malloc(1 << 20));
    }
    return NULL;
}

static void *poster(void *arg)
{
    struct side a, b;
    struct ibv_mr *ml, *mr;
    struct ibv_sge sg;
    unsigned char *src = malloc(4096), *dst = malloc(4096);
    uintptr_t bad = 0;

    (void)arg;
    pair_open(&a, &b);
    ml = ibv_reg_mr(a.pd, src, 4096, ALL_ACCESS);
    mr = ibv_reg_mr(b.pd, dst, 4096, ALL_ACCESS);
    for (int i = 0; i < ROUNDS && !bad; i++) {
        struct ibv_wc wc;
        memset(src, i & 0xff, 4096);
        sg = sge(ml, src, 4096);
        if (post(a.qp, IBV_WR_RDMA_WRITE, &sg, 1, (uintptr_t)dst, mr->rkey, IBV_SEND_SIGNALED, (uint64_t)i) ||
            ibv_poll_cq(a.cq, 1, &wc) != 1 || wc.status != IBV_WC_SUCCESS || !all(dst, 4096, (unsigned char)i))
            bad = 1;
    }
    ibv_dereg_mr(ml);
    ibv_dereg_mr(mr);
    side_close(&a);
    side_close(&b);
    free(src);
    free(dst);
    return (void *)bad;
}

static void test_threads(void **state)
{
    pthread_t t[THREADS], c;
    struct side s;
    void *ret;

    (void)state;
    NEED_LOOPNIC();
    side_open(&s, 0);
    atomic_store(&churn_stop, 0);
    assert_int_equal(pthread_create(&c, NULL, churn, &s), 0);
    for (int i = 0; i < THREADS; i++)
        assert_int_equal(pthread_create(&t[i], NULL, poster, NULL), 0);
    for (int i = 0; i < THREADS; i++) {
        assert_int_equal(pthread_join(t[i], &ret), 0);
        assert_null(ret);
    }
    atomic_store(&churn_stop, 1);
    assert_int_equal(pthread_join(c, NULL), 0);
    side_close(&s);
}

/* The send queue holds max_send_wr WRs; a slot is freed when a completion at or after its WR is
 * polled, so unsignalled WRs hold theirs until a later signalled one is polled. */
static void test_send_queue_depth(void **state)
{
    struct side a, b;
    struct ibv_cq *cq;
    struct ibv_qp *qp;
    struct ibv_qp_init_attr ia;
    struct ibv_mr *ml, *mr;
    struct ibv_sge sg;
    unsigned char *p = map_anon(2 * 4096);

    (void)state;
    NEED_LOOPNIC();
    pair_open(&a, &b);
    cq = ibv_create_cq(a.ctx, 16, NULL, NULL, 0);
    memset(&ia, 0, sizeof(ia));
    ia.send_cq = ia.recv_cq = cq;
    ia.qp_type = IBV_QPT_RC;
    ia.cap.max_send_wr = 4;
    ia.cap.max_send_sge = 1;
    qp = ibv_create_qp(a.pd, &ia);
    assert_non_null(qp);
    reconnect_to(b.qp, qp->qp_num);
    connect_qp(qp, b.qp->qp_num, ALL_ACCESS);
    ml = ibv_reg_mr(a.pd, p, 4096, ALL_ACCESS);
    mr = ibv_reg_mr(b.pd, p + 4096, 4096, ALL_ACCESS);
    sg = sge(ml, p, 16);
    for (int i = 0; i < 3; i++)
        assert_int_equal(post(qp, IBV_WR_RDMA_WRITE, &sg, 1, (uintptr_t)p + 4096, mr->rkey, 0, (uint64_t)i), 0);
    assert_int_equal(post(qp, IBV_WR_RDMA_WRITE, &sg, 1, (uintptr_t)p + 4096, mr->rkey, IBV_SEND_SIGNALED, 3), 0);
    assert_int_equal(post(qp, IBV_WR_RDMA_WRITE, &sg, 1, (uintptr_t)p + 4096, mr->rkey, IBV_SEND_SIGNALED, 4),
                     ENOMEM);                               /* full until the completion is polled */
    assert_int_equal(poll1(cq).wr_id, 3);
    for (int i = 0; i < 4; i++)
        assert_int_equal(post(qp, IBV_WR_RDMA_WRITE, &sg, 1, (uintptr_t)p + 4096, mr->rkey, IBV_SEND_SIGNALED,
                              (uint64_t)(10 + i)), 0);
    for (int i = 0; i < 4; i++)
        assert_int_equal(poll1(cq).wr_id, (uint64_t)(10 + i));
    assert_int_equal(ibv_dereg_mr(ml) | ibv_dereg_mr(mr), 0);
    assert_int_equal(ibv_destroy_qp(qp), 0);
    assert_int_equal(ibv_destroy_cq(cq), 0);
    side_close(&a);
    side_close(&b);
    munmap(p, 2 * 4096);
}

static void test_inline_write(void **state)
{
    struct side a, b;
    struct ibv_mr *mr;
    struct ibv_sge sg;
    unsigned char src[100], *dst = map_anon(4096);

    (void)state;
    NEED_LOOPNIC();
    pair_open(&a, &b);
    mr = ibv_reg_mr(b.pd, dst, 4096, ALL_ACCESS);
    fill(src, sizeof(src), 16);
    sg.addr = (uintptr_t)src;   /* not registered: inline data needs no lkey */
    sg.length = 64;
    sg.lkey = 0;
    assert_int_equal(post(a.qp, IBV_WR_RDMA_WRITE, &sg, 1, (uintptr_t)dst, mr->rkey,
                          IBV_SEND_SIGNALED | IBV_SEND_INLINE, 1), 0);
    assert_int_equal(poll1(a.cq).status, IBV_WC_SUCCESS);
    assert_true(check(dst, 64, 16));
    assert_true(all(dst + 64, 4096 - 64, 0));
    sg.length = 65;             /* more than max_inline_data */
    assert_int_equal(post(a.qp, IBV_WR_RDMA_WRITE, &sg, 1, (uintptr_t)dst, mr->rkey,
                          IBV_SEND_SIGNALED | IBV_SEND_INLINE, 2), EINVAL);
    assert_cq_empty(a.cq);
    assert_int_equal(ibv_dereg_mr(mr), 0);
    side_close(&a);
    side_close(&b);
    munmap(dst, 4096);
}

/* ---- GPU memory, with the CUDA double build/loopnic/fakecuda/libcuda.so.1 ---- */
typedef int cu_alloc_fn(unsigned long long *, size_t);
typedef int cu_free_fn(unsigned long long);

static void *fake_cuda(void)
{
    char exe[PATH_MAX], path[PATH_MAX + 32];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    char *slash;

    if (n <= 0)
        return NULL;
    exe[n] = 0;
    slash = strrchr(exe, '/');
    if (!slash)
        return NULL;
    *slash = 0;
    snprintf(path, sizeof(path), "%s/fakecuda/libcuda.so.1", exe);
    return dlopen(path, RTLD_NOW | RTLD_GLOBAL);
}

static void test_gpu_memory(void **state)
{
    enum { L = 64 * 1024 };
    struct side a, b;
    struct ibv_mr *mh, *mg;
    struct ibv_sge sg;
    struct loopnic_counters c0;
    unsigned long long d = 0, d2 = 0;
    unsigned char *h = map_anon(L);
    void *cuda;
    cu_alloc_fn *alloc;
    cu_free_fn *cfree;
    int fd = memfd_create("loopnic-gpu-dmabuf", MFD_CLOEXEC);

    (void)state;
    NEED_LOOPNIC();
    if (dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD))
        skip(); /* a real driver is loaded: this test is for the double */
    cuda = fake_cuda();
    if (!cuda)
        skip();
    alloc = (cu_alloc_fn *)dlsym(cuda, "cuMemAlloc_v2");
    cfree = (cu_free_fn *)dlsym(cuda, "cuMemFree_v2");
    assert_int_equal(alloc(&d, L), 0);
    assert_int_equal(ftruncate(fd, L), 0);
    pair_open(&a, &b);

    /* ibv_reg_mr on GPU memory: EFAULT without nvidia-peermem */
    unsetenv("LOOPNIC_PEERMEM");
    errno = 0;
    assert_null(ibv_reg_mr(b.pd, (void *)(uintptr_t)d, L, ALL_ACCESS));
    assert_int_equal(errno, EFAULT);
    setenv("LOOPNIC_PEERMEM", "1", 1);
    mg = ibv_reg_mr(b.pd, (void *)(uintptr_t)d, L, ALL_ACCESS);
    assert_non_null(mg);
    unsetenv("LOOPNIC_PEERMEM");
    assert_int_equal(ibv_dereg_mr(mg), 0);

    /* a dmabuf MR on it: host -> GPU and GPU -> host move the data (cuMemcpy) */
    mg = ibv_reg_dmabuf_mr(b.pd, 0, L, d, fd, ALL_ACCESS);
    assert_non_null(mg);
    mh = ibv_reg_mr(a.pd, h, L, ALL_ACCESS);
    fill(h, L, 14);
    sg = sge(mh, h, L);
    assert_int_equal(post(a.qp, IBV_WR_RDMA_WRITE, &sg, 1, d, mg->rkey, IBV_SEND_SIGNALED, 1), 0);
    assert_int_equal(poll1(a.cq).status, IBV_WC_SUCCESS);
    assert_true(check((void *)(uintptr_t)d, L, 14));
    memset(h, 0, L);
    assert_int_equal(post(a.qp, IBV_WR_RDMA_READ, &sg, 1, d, mg->rkey, IBV_SEND_SIGNALED, 2), 0);
    assert_int_equal(poll1(a.cq).status, IBV_WC_SUCCESS);
    assert_true(check(h, L, 14));

    /* cuMemFree + cuMemAlloc gives the same VA with a new buffer id: stale */
    c0 = counters(-1);
    assert_int_equal(cfree(d), 0);
    assert_int_equal(alloc(&d2, L), 0);
    assert_true(d2 == d);
    assert_int_equal(post(a.qp, IBV_WR_RDMA_WRITE, &sg, 1, d, mg->rkey, IBV_SEND_SIGNALED, 3), 0);
    assert_int_equal(poll1(a.cq).status, IBV_WC_REM_ACCESS_ERR);
    assert_true(all((void *)(uintptr_t)d2, L, 0));
    assert_int_equal(counters(-1).stale_uses - c0.stale_uses, 1);

    assert_int_equal(ibv_dereg_mr(mg) | ibv_dereg_mr(mh), 0);
    cfree(d2);
    side_close(&a);
    side_close(&b);
    munmap(h, L);
    close(fd);
}

/* ---- the provider is found by versioned lookups, in both modes ---- */
struct objs { int ibverbs, loopnic; };

static int count_objs(struct dl_phdr_info *info, size_t size, void *data)
{
    struct objs *o = data;
    const char *slash = strrchr(info->dlpi_name, '/');
    const char *base = slash ? slash + 1 : info->dlpi_name;

    (void)size;
    if (!strcmp(base, "libibverbs.so.1"))
        o->ibverbs++;
    if (!strcmp(base, "libloopnic.so"))
        o->loopnic++;
    return 0;
}

static void test_versioned_lookup_finds_provider(void **state)
{
    static const char *const sv[][2] = {
        { "ibv_reg_mr_iova2", "IBVERBS_1.8" }, { "ibv_reg_dmabuf_mr", "IBVERBS_1.12" },
        { "ibv_reg_mr", "IBVERBS_1.1" }, { "ibv_dereg_mr", "IBVERBS_1.1" }, { "ibv_get_device_list", "IBVERBS_1.1" },
        { "_ibv_query_gid_ex", "IBVERBS_1.11" }, { "ibv_reg_mr_iova", "IBVERBS_1.7" },
        { "ibv_create_comp_channel", "IBVERBS_1.0" }, { "ibv_dealloc_pd", "IBVERBS_1.1" },
    };
    Dl_info ref, info;
    struct objs o = { 0, 0 };

    (void)state;
    if (!mode)
        skip();
    assert_non_null(p_counters);
    assert_true(dladdr((void *)p_counters, &ref) != 0);
    for (size_t i = 0; i < sizeof(sv) / sizeof(sv[0]); i++) {
        void *next = dlvsym(RTLD_NEXT, sv[i][0], sv[i][1]);
        void *dflt = dlvsym(RTLD_DEFAULT, sv[i][0], sv[i][1]);
        if (!next || !dflt)
            fail_msg("dlvsym(%s, %s) found nothing", sv[i][0], sv[i][1]);
        assert_ptr_equal(next, dflt);
        assert_true(dladdr(next, &info) != 0);
        if (info.dli_fbase != ref.dli_fbase)
            fail_msg("%s@%s is in %s, not in the provider %s", sv[i][0], sv[i][1], info.dli_fname, ref.dli_fname);
    }
    /* what the TENT engine and NCCL do: dlopen libibverbs.so.1 and dlsym from that handle */
    {
        void *h = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL);
        void *s;
        assert_non_null(h);
        s = dlsym(h, "ibv_reg_mr");
        assert_non_null(s);
        assert_true(dladdr(s, &info) != 0);
        if (!strcmp(mode, "inplace"))
            assert_ptr_equal(info.dli_fbase, ref.dli_fbase);
        dlclose(h);
    }
    dl_iterate_phdr(count_objs, &o);
    if (!strcmp(mode, "inplace")) {
        assert_int_equal(o.ibverbs, 1);   /* the provider is the only libibverbs.so.1 */
        assert_int_equal(o.loopnic, 0);
        assert_non_null(strstr(ref.dli_fname, "libibverbs.so.1"));
    } else {
        assert_int_equal(o.ibverbs, 1);   /* the real one is loaded too, and loses */
        assert_int_equal(o.loopnic, 1);
        assert_non_null(strstr(ref.dli_fname, "libloopnic.so"));
    }
}

/* ---- two processes ---- */
struct peer_info { uint32_t qp_num, rkey; uint64_t addr; };
enum { PEER_LEN = 16 * 4096 };

static int xfer_all(int fd, void *p, size_t n, int wr)
{
    char *c = p;
    while (n) {
        ssize_t k = wr ? write(fd, c, n) : read(fd, c, n);
        if (k <= 0)
            return -1;
        c += k;
        n -= (size_t)k;
    }
    return 0;
}

/* The peer: loop1, a buffer with pattern 21 in its first half; it writes its first 4 KiB into the
 * parent's buffer at 0, then checks what the parent wrote into its second half. */
static int child_main(int sock)
{
    struct ibv_device **l;
    struct ibv_context *ctx;
    struct ibv_pd *pd;
    struct ibv_cq *cq;
    struct ibv_qp *qp;
    struct ibv_qp_init_attr ia;
    struct ibv_mr *mr;
    struct ibv_sge sg;
    struct ibv_send_wr wr, *bad;
    struct ibv_wc wc;
    struct peer_info me, them;
    unsigned char *buf = mmap(NULL, PEER_LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    char cmd, res;
    int n = 0;

    l = ibv_get_device_list(&n);
    if (!l || n < 1 || buf == MAP_FAILED)
        return 10;
    ctx = ibv_open_device(l[n > 1 ? 1 : 0]);
    pd = ctx ? ibv_alloc_pd(ctx) : NULL;
    cq = ctx ? ibv_create_cq(ctx, 16, NULL, NULL, 0) : NULL;
    if (!pd || !cq)
        return 11;
    memset(&ia, 0, sizeof(ia));
    ia.send_cq = ia.recv_cq = cq;
    ia.qp_type = IBV_QPT_RC;
    ia.cap.max_send_wr = 8;
    ia.cap.max_send_sge = 1;
    qp = ibv_create_qp(pd, &ia);
    fill(buf, PEER_LEN / 2, 21);
    memset(buf + PEER_LEN / 2, 0, PEER_LEN / 2);
    mr = ibv_reg_mr(pd, buf, PEER_LEN, ALL_ACCESS);
    if (!qp || !mr)
        return 12;
    me.qp_num = qp->qp_num;
    me.rkey = mr->rkey;
    me.addr = (uintptr_t)buf;
    if (xfer_all(sock, &me, sizeof(me), 1) || xfer_all(sock, &them, sizeof(them), 0))
        return 13;
    if (to_init(qp, ALL_ACCESS) || to_rtr(qp, them.qp_num, 0) || to_rts(qp))
        return 14;
    cmd = 'R';
    if (xfer_all(sock, &cmd, 1, 1) || xfer_all(sock, &cmd, 1, 0) || cmd != 'R')
        return 15;
    sg.addr = (uintptr_t)buf;
    sg.length = 4096;
    sg.lkey = mr->lkey;
    memset(&wr, 0, sizeof(wr));
    wr.opcode = IBV_WR_RDMA_WRITE;
    wr.sg_list = &sg;
    wr.num_sge = 1;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = them.addr;
    wr.wr.rdma.rkey = them.rkey;
    if (ibv_post_send(qp, &wr, &bad))
        return 16;
    while (ibv_poll_cq(cq, 1, &wc) == 0) {}
    res = (char)wc.status;
    if (xfer_all(sock, &res, 1, 1))
        return 17;
    if (xfer_all(sock, &cmd, 1, 0) || cmd != 'V') /* the parent wrote into our second half */
        return 18;
    res = check(buf + PEER_LEN / 2, 4096, 22) ? 0 : 1;
    if (xfer_all(sock, &res, 1, 1) || xfer_all(sock, &cmd, 1, 0) || cmd != 'M')
        return 19;
    /* free the parent's target and map something else at the same VA */
    if (munmap(buf + PEER_LEN / 2, 4096) ||
        mmap(buf + PEER_LEN / 2, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) !=
            buf + PEER_LEN / 2)
        return 20;
    memset(buf + PEER_LEN / 2, 0x5a, 4096);
    res = 0;
    if (xfer_all(sock, &res, 1, 1) || xfer_all(sock, &cmd, 1, 0) || cmd != 'C')
        return 21;
    res = all(buf + PEER_LEN / 2, 4096, 0x5a) ? 0 : 1;   /* the parent's stale WRITE did not land */
    if (xfer_all(sock, &res, 1, 1) || xfer_all(sock, &cmd, 1, 0) || cmd != 'Q')
        return 22;
    ibv_dereg_mr(mr);
    ibv_destroy_qp(qp);
    ibv_destroy_cq(cq);
    ibv_dealloc_pd(pd);
    ibv_close_device(ctx);
    ibv_free_device_list(l);
    return 0;
}

static void test_two_processes(void **state)
{
    struct side a;
    struct ibv_mr *mr;
    struct ibv_sge sg;
    struct peer_info me, them;
    struct loopnic_counters c0 = counters(-1);
    unsigned char *buf = map_anon(PEER_LEN);
    int sv[2], status;
    char cmd, res, fdarg[16];
    pid_t pid;

    (void)state;
    NEED_LOOPNIC();
    if (!getenv("LOOPNIC_REGISTRY"))
        skip();
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(sv[0]);
        snprintf(fdarg, sizeof(fdarg), "%d", sv[1]);
        execl("/proc/self/exe", "test_loopnic", "--child", fdarg, (char *)NULL);
        _exit(127);
    }
    close(sv[1]);
    side_open(&a, 0);
    memset(buf, 0, PEER_LEN);
    fill(buf + PEER_LEN / 2, 4096, 22);
    mr = ibv_reg_mr(a.pd, buf, PEER_LEN, ALL_ACCESS);
    assert_non_null(mr);
    me.qp_num = a.qp->qp_num;
    me.rkey = mr->rkey;
    me.addr = (uintptr_t)buf;
    assert_int_equal(xfer_all(sv[0], &them, sizeof(them), 0), 0);
    assert_int_equal(xfer_all(sv[0], &me, sizeof(me), 1), 0);
    connect_qp(a.qp, them.qp_num, ALL_ACCESS);
    cmd = 'R';
    assert_int_equal(xfer_all(sv[0], &cmd, 1, 1), 0);
    assert_int_equal(xfer_all(sv[0], &cmd, 1, 0), 0);
    assert_int_equal(cmd, 'R');
    /* the child wrote its first 4 KiB into ours (process_vm_writev into this process) */
    assert_int_equal(xfer_all(sv[0], &res, 1, 0), 0);
    assert_int_equal(res, IBV_WC_SUCCESS);
    assert_true(check(buf, 4096, 21));
    assert_true(all(buf + 4096, PEER_LEN / 2 - 4096, 0));
    /* we write into its second half and read its first half back */
    sg = sge(mr, buf + PEER_LEN / 2, 4096);
    assert_int_equal(post(a.qp, IBV_WR_RDMA_WRITE, &sg, 1, them.addr + PEER_LEN / 2, them.rkey,
                          IBV_SEND_SIGNALED, 1), 0);
    assert_int_equal(poll1(a.cq).status, IBV_WC_SUCCESS);
    sg = sge(mr, buf + 8192, 8192);
    assert_int_equal(post(a.qp, IBV_WR_RDMA_READ, &sg, 1, them.addr, them.rkey, IBV_SEND_SIGNALED, 2), 0);
    assert_int_equal(poll1(a.cq).status, IBV_WC_SUCCESS);
    assert_true(check(buf + 8192, 8192, 21));
    cmd = 'V';
    assert_int_equal(xfer_all(sv[0], &cmd, 1, 1), 0);
    assert_int_equal(xfer_all(sv[0], &res, 1, 0), 0);
    assert_int_equal(res, 0);
    /* its rkey with a range past its MR: remote access error, across processes too */
    sg = sge(mr, buf, 4096);
    assert_int_equal(post(a.qp, IBV_WR_RDMA_WRITE, &sg, 1, them.addr + PEER_LEN - 100, them.rkey,
                          IBV_SEND_SIGNALED, 3), 0);
    assert_int_equal(poll1(a.cq).status, IBV_WC_REM_ACCESS_ERR);
    /* the peer frees the target and maps something else there: a stale use, seen across processes */
    reconnect_to(a.qp, them.qp_num);
    cmd = 'M';
    assert_int_equal(xfer_all(sv[0], &cmd, 1, 1), 0);
    assert_int_equal(xfer_all(sv[0], &res, 1, 0), 0);
    assert_int_equal(res, 0);
    sg = sge(mr, buf, 4096);
    assert_int_equal(post(a.qp, IBV_WR_RDMA_WRITE, &sg, 1, them.addr + PEER_LEN / 2, them.rkey,
                          IBV_SEND_SIGNALED, 4), 0);
    assert_int_equal(poll1(a.cq).status, IBV_WC_REM_ACCESS_ERR);
    assert_int_equal(counters(-1).stale_uses - c0.stale_uses, 1);
    cmd = 'C';
    assert_int_equal(xfer_all(sv[0], &cmd, 1, 1), 0);
    assert_int_equal(xfer_all(sv[0], &res, 1, 0), 0);
    assert_int_equal(res, 0);
    cmd = 'Q';
    assert_int_equal(xfer_all(sv[0], &cmd, 1, 1), 0);
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    assert_int_equal(counters(-1).bytes_moved - c0.bytes_moved, 4096 + 8192);
    /* the peer is gone: nobody answers */
    reconnect_to(a.qp, them.qp_num);
    assert_int_equal(post(a.qp, IBV_WR_RDMA_WRITE, &sg, 1, them.addr, them.rkey, IBV_SEND_SIGNALED, 5), 0);
    assert_int_equal(poll1(a.cq).status, IBV_WC_RETRY_EXC_ERR);
    close(sv[0]);
    assert_int_equal(ibv_dereg_mr(mr), 0);
    side_close(&a);
    munmap(buf, PEER_LEN);
}

/* ---- the environment variables, read at start-up: checked in a child started with them ---- */
#define CHILD_CHECK(cond, code) do { if (!(cond)) { fprintf(stderr, "env child: %s\n", #cond); return code; } } while (0)

static int env_child_main(void)
{
    struct ibv_device **l;
    struct ibv_device_attr da;
    struct ibv_port_attr pa;
    struct ibv_gid_entry ge;
    struct ibv_qp_attr qa;
    struct ibv_mr *m1, *m2, *m3;
    struct ibv_sge sg;
    struct ibv_wc wc;
    struct side a, b;
    unsigned char *p = mmap(NULL, 4 * 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    int n = 0, fd = memfd_create("loopnic-env", MFD_CLOEXEC);

    l = ibv_get_device_list(&n);
    CHILD_CHECK(l && n == 3, 20);
    CHILD_CHECK(!strcmp(ibv_get_device_name(l[2]), "loop2"), 21);
    devs = l;
    ndevs = n;
    side_open(&a, 0);
    side_open(&b, 2);
    CHILD_CHECK(ibv_query_device(a.ctx, &da) == 0 && da.max_mr_size == 65536, 22);
    CHILD_CHECK(ibv_query_port(a.ctx, 1, &pa) == 0 && pa.link_layer == IBV_LINK_LAYER_ETHERNET, 23);
    CHILD_CHECK(ibv_query_gid_ex(a.ctx, 1, 0, &ge, 0) == 0 && ge.gid_type == IBV_GID_TYPE_ROCE_V2, 24);
    /* RoCE: RTR without a GRH is refused */
    CHILD_CHECK(to_init(a.qp, ALL_ACCESS) == 0, 25);
    memset(&qa, 0, sizeof(qa));
    qa.qp_state = IBV_QPS_RTR;
    qa.path_mtu = IBV_MTU_1024;
    qa.dest_qp_num = b.qp->qp_num;
    qa.max_dest_rd_atomic = 1;
    CHILD_CHECK(ibv_modify_qp(a.qp, &qa, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                             IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER) == EINVAL, 26);
    CHILD_CHECK(to_rtr(a.qp, b.qp->qp_num, 0) == 0 && to_rts(a.qp) == 0, 27);
    connect_qp(b.qp, a.qp->qp_num, ALL_ACCESS);
    /* LOOPNIC_FAIL_REG=2, LOOPNIC_FAIL_DMABUF_REG=1, LOOPNIC_FAIL_WR=1 */
    m1 = ibv_reg_mr(a.pd, p, 4096, ALL_ACCESS);
    m2 = ibv_reg_mr(a.pd, p, 4096, ALL_ACCESS);
    CHILD_CHECK(m1 && !m2 && errno == ENOMEM, 28);
    m3 = ibv_reg_mr(b.pd, p + 4096, 4096, ALL_ACCESS);
    CHILD_CHECK(m3, 29);
    CHILD_CHECK(fd >= 0 && ftruncate(fd, 4096) == 0, 30);
    CHILD_CHECK(!ibv_reg_dmabuf_mr(a.pd, 0, 4096, (uintptr_t)p, fd, ALL_ACCESS), 31);
    sg = sge(m1, p, 4096);
    memset(p, 1, 4096);
    CHILD_CHECK(post(a.qp, IBV_WR_RDMA_WRITE, &sg, 1, (uintptr_t)p + 4096, m3->rkey, IBV_SEND_SIGNALED, 1) == 0, 32);
    CHILD_CHECK(ibv_poll_cq(a.cq, 1, &wc) == 1 && wc.status == IBV_WC_RETRY_EXC_ERR, 33);
    CHILD_CHECK(all(p + 4096, 4096, 0), 34);
    return 0;
}

static void test_environment_variables(void **state)
{
    char fdless[8];
    int status;
    pid_t pid;

    (void)state;
    NEED_LOOPNIC();
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        setenv("LOOPNIC_DEVICES", "3", 1);
        setenv("LOOPNIC_LINK_LAYER", "eth", 1);
        setenv("LOOPNIC_MAX_MR_SIZE", "65536", 1);
        setenv("LOOPNIC_FAIL_REG", "2", 1);
        setenv("LOOPNIC_FAIL_DMABUF_REG", "1", 1);
        setenv("LOOPNIC_FAIL_WR", "1", 1);
        snprintf(fdless, sizeof(fdless), "-");
        execl("/proc/self/exe", "test_loopnic", "--env-child", fdless, (char *)NULL);
        _exit(127);
    }
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
}

static int group_setup(void **state)
{
    (void)state;
    devs = ibv_get_device_list(&ndevs);  /* a real libibverbs without devices may return NULL */
    if (!devs)
        ndevs = 0;
    return devs || !p_counters ? 0 : -1;
}

static int group_teardown(void **state)
{
    (void)state;
    if (devs)
        ibv_free_device_list(devs);
    return 0;
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_versioned_lookup_finds_provider),
        cmocka_unit_test(test_startup_sequence),
        cmocka_unit_test(test_write_and_read_move_every_byte),
        cmocka_unit_test(test_bad_keys),
        cmocka_unit_test(test_out_of_bounds),
        cmocka_unit_test(test_missing_access),
        cmocka_unit_test(test_wrong_pd),
        cmocka_unit_test(test_reg_unmapped_is_efault),
        cmocka_unit_test(test_dmabuf),
        cmocka_unit_test(test_dmabuf_mr_holds_its_dmabuf),
        cmocka_unit_test(test_dealloc_pd_busy),
        cmocka_unit_test(test_dereg_foreign_mr),
        cmocka_unit_test(test_stale_after_munmap_and_map_fixed),
        cmocka_unit_test(test_stale_after_madvise_mremap_and_raw_munmap),
        cmocka_unit_test(test_stale_unseen_remap_with_pagemap),
        cmocka_unit_test(test_failure_injection),
        cmocka_unit_test(test_completion_channel_events),
        cmocka_unit_test(test_async_events),
        cmocka_unit_test(test_write_with_imm),
        cmocka_unit_test(test_send_into_posted_receive),
        cmocka_unit_test(test_srq),
        cmocka_unit_test(test_atomics),
        cmocka_unit_test(test_inline_write),
        cmocka_unit_test(test_send_queue_depth),
        cmocka_unit_test(test_cq_overrun_raises_cq_err),
        cmocka_unit_test(test_threads),
        cmocka_unit_test(test_two_processes),
        cmocka_unit_test(test_environment_variables),
        cmocka_unit_test(test_gpu_memory),   /* last: it loads a CUDA double into the process */
    };
    int rc, own_registry = 0;

    page = sysconf(_SC_PAGESIZE);
    if (argc == 3 && !strcmp(argv[1], "--child"))
        return child_main(atoi(argv[2]));
    if (argc == 3 && !strcmp(argv[1], "--env-child"))
        return env_child_main();
    mode = getenv("LOOPNIC_TEST_MODE");
    if (!getenv("LOOPNIC_REGISTRY")) { /* set before the first verbs call: the provider reads it then */
        snprintf(registry, sizeof(registry), "/dev/shm/loopnic-test-%d", (int)getpid());
        setenv("LOOPNIC_REGISTRY", registry, 1);
        own_registry = 1;
    }
    p_counters = (loopnic_get_counters_fn *)dlsym(RTLD_DEFAULT, "loopnic_get_counters");
    p_reset = (loopnic_reset_counters_fn *)dlsym(RTLD_DEFAULT, "loopnic_reset_counters");
    p_fail_reg = (loopnic_fail_fn *)dlsym(RTLD_DEFAULT, "loopnic_fail_reg");
    p_fail_dmabuf = (loopnic_fail_fn *)dlsym(RTLD_DEFAULT, "loopnic_fail_dmabuf_reg");
    p_fail_wr = (loopnic_fail_fn *)dlsym(RTLD_DEFAULT, "loopnic_fail_wr");
    p_raise = (loopnic_raise_async_event_fn *)dlsym(RTLD_DEFAULT, "loopnic_raise_async_event");
    p_set_max_mr = (loopnic_set_max_mr_size_fn *)dlsym(RTLD_DEFAULT, "loopnic_set_max_mr_size");
    p_is_stale = (loopnic_mr_is_stale_fn *)dlsym(RTLD_DEFAULT, "loopnic_mr_is_stale");
    if (mode && !p_counters) {
        fprintf(stderr, "LOOPNIC_TEST_MODE=%s but the provider is not loaded\n", mode);
        return 1;
    }
    rc = cmocka_run_group_tests_name(mode ? mode : "loopnic", tests, group_setup, group_teardown);
    if (own_registry)
        unlink(registry);
    return rc;
}
