/* End to end: an engine that calls plain verbs, with drc put in front by LD_PRELOAD of
 * build/libdrc_verbs.so (the ibv_reg_mr interposer plus drc's free hooks), on the loopnic provider
 * in place of libibverbs.so.1. Run by the wrapper build/loopnic/test_e2e_drc_verbs_run.
 *
 * What a NIC would see: registrations of one range are served by one cached MR; an munmap reaches
 * drc's hook, which deregisters the cached MR before the memory goes, so a registration at the
 * same VA after mmap(MAP_FIXED) gets a new MR and the transfer lands in the new memory with no
 * stale use. An engine that keeps using the keys it had before the free (Mooncake publishes rkeys
 * once) is caught by the provider.
 */
#include <dlfcn.h>
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmocka.h>
#include <infiniband/verbs.h>

#include "loopnic.h"
#include "rcqp.h"

#define ALL_ACCESS (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)
enum { L = 8 * 4096 };

static loopnic_get_counters_fn *p_counters;

struct env {
    struct ibv_device **devs;
    struct ibv_context *ctx;
    struct ibv_pd *pd;
    struct ibv_cq *cq;
    struct ibv_qp *qa, *qb;  /* qa writes to qb's side; one device, one PD */
    unsigned char *src;
    struct ibv_mr *src_mr;
};

static void connect_qp(struct ibv_qp *qp, uint32_t dest)
{
    struct rcqp_peer peer = { .qpn = dest };

    assert_int_equal(rcqp_connect(qp, &peer, ALL_ACCESS, 0), 0);
}

static struct ibv_qp *make_qp(struct env *e)
{
    struct ibv_qp_init_attr ia;

    memset(&ia, 0, sizeof(ia));
    ia.send_cq = ia.recv_cq = e->cq;
    ia.qp_type = IBV_QPT_RC;
    ia.cap.max_send_wr = 16;
    ia.cap.max_send_sge = 1;
    return ibv_create_qp(e->pd, &ia);
}

static void reconnect(struct env *e)
{
    connect_qp(e->qa, e->qb->qp_num);
    connect_qp(e->qb, e->qa->qp_num);
}

static int setup(void **state)
{
    struct env *e = calloc(1, sizeof(*e));
    int n = 0;

    if (!e || !(e->devs = ibv_get_device_list(&n)) || n < 1)
        return -1;
    e->ctx = ibv_open_device(e->devs[0]);
    e->pd = e->ctx ? ibv_alloc_pd(e->ctx) : NULL;
    e->cq = e->pd ? ibv_create_cq(e->ctx, 64, NULL, NULL, 0) : NULL;
    if (!e->cq || !(e->qa = make_qp(e)) || !(e->qb = make_qp(e)))
        return -1;
    reconnect(e);
    e->src = mmap(NULL, L, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (e->src == MAP_FAILED || !(e->src_mr = ibv_reg_mr(e->pd, e->src, L, IBV_ACCESS_LOCAL_WRITE)))
        return -1;
    *state = e;
    return 0;
}

static int teardown(void **state)
{
    struct env *e = *state;

    ibv_dereg_mr(e->src_mr);
    munmap(e->src, L);
    ibv_destroy_qp(e->qa);
    ibv_destroy_qp(e->qb);
    ibv_destroy_cq(e->cq);
    assert_int_equal(ibv_dealloc_pd(e->pd), 0);
    ibv_close_device(e->ctx);
    ibv_free_device_list(e->devs);
    free(e);
    return 0;
}

static struct loopnic_counters counters(void)
{
    struct loopnic_counters c;
    assert_int_equal(p_counters(-1, &c), 0);
    return c;
}

static enum ibv_wc_status write_to(struct env *e, void *dst, uint32_t rkey, unsigned char seed)
{
    struct ibv_sge sg = { (uintptr_t)e->src, L, e->src_mr->lkey };
    struct ibv_send_wr wr, *bad;
    struct ibv_wc wc;
    int n = 0;

    memset(e->src, seed, L);
    memset(&wr, 0, sizeof(wr));
    wr.opcode = IBV_WR_RDMA_WRITE;
    wr.sg_list = &sg;
    wr.num_sge = 1;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = (uintptr_t)dst;
    wr.wr.rdma.rkey = rkey;
    assert_int_equal(ibv_post_send(e->qa, &wr, &bad), 0);
    for (int i = 0; i < 1000 && n == 0; i++)
        n = ibv_poll_cq(e->cq, 1, &wc);
    assert_int_equal(n, 1);
    return wc.status;
}

static int all(const unsigned char *p, size_t n, unsigned char v)
{
    for (size_t i = 0; i < n; i++)
        if (p[i] != v)
            return 0;
    return 1;
}

static unsigned char *remap_same_va(unsigned char *buf)
{
    assert_int_equal(munmap(buf, L), 0);       /* drc's hook sees it first, then loopnic's */
    assert_ptr_equal(mmap(buf, L, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0), buf);
    memset(buf, 0, L);
    return buf;
}

static void test_registrations_are_served_by_one_mr(void **state)
{
    struct env *e = *state;
    unsigned char *buf = mmap(NULL, L, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    struct loopnic_counters c0 = counters(), c1;
    struct ibv_mr *m1, *m2;

    m1 = ibv_reg_mr(e->pd, buf, L, ALL_ACCESS);
    m2 = ibv_reg_mr(e->pd, buf + 4096, 4096, ALL_ACCESS);
    assert_true(m1 && m2);
    assert_int_equal(m1->rkey, m2->rkey);         /* one cached MR under both */
    c1 = counters();
    assert_int_equal(c1.total_regs - c0.total_regs, 1);
    assert_int_equal(write_to(e, buf, m2->rkey, 0x31), IBV_WC_SUCCESS);
    assert_true(all(buf, L, 0x31));
    assert_int_equal(ibv_dereg_mr(m1), 0);
    assert_int_equal(ibv_dereg_mr(m2), 0);
    assert_int_equal(munmap(buf, L), 0);
    assert_int_equal(counters().live_mrs, c0.live_mrs);  /* the hook deregistered the cached MR */
}

static void test_free_and_remap_then_register_again(void **state)
{
    struct env *e = *state;
    unsigned char *buf = mmap(NULL, L, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    struct loopnic_counters c0 = counters();
    struct ibv_mr *m1, *m2;
    uint32_t old_rkey;

    m1 = ibv_reg_mr(e->pd, buf, L, ALL_ACCESS);
    assert_non_null(m1);
    old_rkey = m1->rkey;
    assert_int_equal(write_to(e, buf, m1->rkey, 0x41), IBV_WC_SUCCESS);
    assert_int_equal(ibv_dereg_mr(m1), 0);        /* the engine deregisters; drc keeps it cached */
    remap_same_va(buf);
    m2 = ibv_reg_mr(e->pd, buf, L, ALL_ACCESS);
    assert_non_null(m2);
    assert_true(m2->rkey != old_rkey);            /* not the region of the freed memory */
    assert_int_equal(write_to(e, buf, m2->rkey, 0x42), IBV_WC_SUCCESS);
    assert_true(all(buf, L, 0x42));
    assert_int_equal(counters().stale_uses - c0.stale_uses, 0);
    assert_int_equal(ibv_dereg_mr(m2), 0);
    munmap(buf, L);
}

/* Mooncake's TENT engine and NCCL dlopen libibverbs.so.1 and dlsym ibv_reg_mr from that handle.
 * As in rdma-core, the provider's ibv_reg_mr reaches ibv_reg_mr_iova2 through the PLT, so drc
 * still serves the registration: the same cached MR as a registration made the usual way. */
static void test_registration_through_a_dlopen_handle_reaches_drc(void **state)
{
    typedef struct ibv_mr *reg_fn(struct ibv_pd *, void *, size_t, int);
    struct env *e = *state;
    unsigned char *buf = mmap(NULL, L, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    struct loopnic_counters c0 = counters();
    void *h = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL);
    reg_fn *reg;
    struct ibv_mr *m1, *m2;

    assert_non_null(h);
    reg = (reg_fn *)dlsym(h, "ibv_reg_mr");
    assert_non_null(reg);
    m1 = ibv_reg_mr(e->pd, buf, L, ALL_ACCESS);
    m2 = reg(e->pd, buf, L, ALL_ACCESS);
    assert_true(m1 && m2 && m1 != m2);
    assert_int_equal(m2->rkey, m1->rkey);
    assert_int_equal(counters().total_regs - c0.total_regs, 1);
    assert_int_equal(ibv_dereg_mr(m2), 0);        /* drc's ibv_dereg_mr, found globally */
    assert_int_equal(ibv_dereg_mr(m1), 0);
    munmap(buf, L);
    dlclose(h);
}

/* Mooncake's way: no deregistration at free, the published rkey kept. drc cannot fix the keys an
 * engine already handed out; the provider shows what a NIC would do with them. */
static void test_engine_keeping_old_keys_is_caught(void **state)
{
    struct env *e = *state;
    unsigned char *buf = mmap(NULL, L, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    struct loopnic_counters c0 = counters();
    struct ibv_mr *m1, *m2;

    m1 = ibv_reg_mr(e->pd, buf, L, ALL_ACCESS);
    assert_non_null(m1);
    remap_same_va(buf);
    m2 = ibv_reg_mr(e->pd, buf, L, ALL_ACCESS);   /* drc: a fresh registration */
    assert_non_null(m2);
    assert_true(m2->rkey != m1->rkey);
    assert_int_equal(write_to(e, buf, m2->rkey, 0x51), IBV_WC_SUCCESS);
    assert_true(all(buf, L, 0x51));
    memset(buf, 0, L);
    assert_int_equal(write_to(e, buf, m1->rkey, 0x52), IBV_WC_REM_ACCESS_ERR); /* the old key */
    assert_true(all(buf, L, 0));
    /* m1 still holds its cached region, so the MR is still registered over the freed pages */
    assert_int_equal(counters().stale_uses - c0.stale_uses, 1);
    reconnect(e);
    assert_int_equal(ibv_dereg_mr(m2), 0);
    ibv_dereg_mr(m1);
    munmap(buf, L);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_registrations_are_served_by_one_mr),
        cmocka_unit_test(test_free_and_remap_then_register_again),
        cmocka_unit_test(test_registration_through_a_dlopen_handle_reaches_drc),
        cmocka_unit_test(test_engine_keeping_old_keys_is_caught),
    };

    p_counters = (loopnic_get_counters_fn *)dlsym(RTLD_DEFAULT, "loopnic_get_counters");
    if (!p_counters || !dlsym(RTLD_DEFAULT, "drc_notify_free")) {
        fprintf(stderr, "test_e2e_drc_verbs: needs libdrc_verbs.so preloaded and loopnic as libibverbs.so.1\n");
        return 1;
    }
    return cmocka_run_group_tests_name("e2e_drc_verbs", tests, setup, teardown);
}
